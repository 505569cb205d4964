"""The fixed cast every test builds on: an owner, a member of the owner's organization, and a
stranger, each with a live API key and a client that sends it."""

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from rest_framework.test import APIClient

from recoup.accounts.models import Account, Membership, Organization
from recoup.accounts.services import account_get_or_create, api_key_issue, organization_join
from tests.support.origin import Origins
from tests.support.s3 import MotoServer
from tests.support.worker import Worker


@dataclass
class Actor:
    account: Account
    raw_key: str
    client: APIClient


def _actor(email: str) -> Actor:
    account = account_get_or_create(email=email)
    raw_key = api_key_issue(account=account, label="test").raw_key
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=raw_key)
    return Actor(account=account, raw_key=raw_key, client=client)


@pytest.fixture
def org(db) -> Organization:
    return Organization.objects.create(slug="acme", name="Acme")


@pytest.fixture
def owner(db, org) -> Actor:
    actor = _actor("owner@example.com")
    organization_join(account=actor.account, slug=org.slug, role=Membership.Role.OWNER)
    return actor


@pytest.fixture
def member(db, org) -> Actor:
    actor = _actor("member@example.com")
    organization_join(account=actor.account, slug=org.slug)
    return actor


@pytest.fixture
def stranger(db) -> Actor:
    return _actor("stranger@example.com")


@pytest.fixture
def anon() -> APIClient:
    return APIClient()


# --- live sandboxes: real git origins, the local provider, a real Celery worker -------------


@pytest.fixture
def origins(tmp_path, settings) -> Iterator[Origins]:
    """Local git origins for this test. Afterwards every sandbox the test's database knows is
    destroyed, so no sandbox process outlives its test."""
    from sandboxes_app.models import Sandbox
    from sandboxes_app.providers.base import get_provider

    found = Origins(tmp_path / "origins")
    settings.SANDBOX_GIT_BASE_URL = found.base_url
    yield found
    with contextlib.suppress(Exception):  # a test without database access made none
        names = list(Sandbox.objects.values_list("name", flat=True).distinct())
        for name in names:
            get_provider().destroy(name=name)


REPO_FILES = {
    "README.md": "# app\n",
    "src/main.py": "print('hello')\n",
    "scripts/run.sh": "#!/bin/sh\necho run\n",
}


@pytest.fixture
def repo_url(origins) -> str:
    """https://github.com/acme/app, served by a local origin with a few files."""
    origins.create("acme", "app", REPO_FILES)
    return "https://github.com/acme/app"


@pytest.fixture
def worker(tmp_path, settings, origins) -> Iterator[Worker]:
    """A started Celery worker on this test's database and its own queue."""
    started = Worker(
        env={
            "SANDBOX_GIT_BASE_URL": settings.SANDBOX_GIT_BASE_URL,
            "RECOUP_DATA_DIR": str(settings.DATA_DIR),
            "SANDBOX_ROOT": str(settings.SANDBOX_ROOT),
            "SNAPSHOT_STORAGE_ROOT": str(settings.SNAPSHOT_STORAGE_ROOT),
        },
        log_path=tmp_path / "worker.log",
    ).start()
    yield started
    started.stop()
    started.release_queue()


@pytest.fixture
def pool(tmp_path, settings, origins, monkeypatch, moto_server):
    """Two started sandbox hosts (`manage.py sandbox_host`) on this machine, with this test
    process as the pool's web (SANDBOX_PROVIDER=pool); a host is down 3 s after its last beat.
    Snapshots go to a fresh bucket of a real S3 API (moto's server), which every process uses
    as SNAPSHOT_STORAGE=s3 configures it."""
    from recoup.env import s3_snapshot_storage
    from tests.support.hosts import Pool
    from tests.support.s3 import CREDENTIALS

    bucket = moto_server.new_bucket()
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    s3 = {
        "SNAPSHOT_STORAGE": "s3",
        "SNAPSHOT_S3_BUCKET": bucket,
        "SNAPSHOT_S3_ENDPOINT_URL": moto_server.endpoint_url,
        "SNAPSHOT_S3_REGION": "us-east-1",
        "SNAPSHOT_S3_PREFIX": "pool",
    }
    settings.STORAGES = {
        **settings.STORAGES,
        "snapshots": s3_snapshot_storage(
            bucket=bucket, endpoint_url=moto_server.endpoint_url, region="us-east-1", prefix="pool"
        ),
    }
    settings.SANDBOX_PROVIDER = "pool"
    settings.SANDBOX_HOST_DOWN_AFTER = 3
    started = Pool(tmp_path, 2, env={**CREDENTIALS, **s3}).start()
    yield started
    started.close()


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory) -> Iterator[MotoServer]:
    """A real S3 API (moto's server) for this test process; each test takes its own bucket."""
    server = MotoServer(log_path=tmp_path_factory.mktemp("moto") / "moto.log").start()
    yield server
    server.stop()


@pytest.fixture(scope="session", autouse=True)
def _drop_stray_connections(django_db_setup, django_db_blocker) -> Iterator[None]:
    """Before the test database is dropped, end connections that worker processes the tests
    started (or killed) may still hold, so the drop never finds it in use."""
    yield
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
