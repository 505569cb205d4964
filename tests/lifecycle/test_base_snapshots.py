"""The per-organization base snapshot builder, with real clones and a real worker."""

import os
import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone
from rest_framework.test import APIClient

from lifecycle.models import BaseSnapshotBuild, LifecycleEvent
from sandboxes_app.models import Sandbox, Snapshot, session_sandbox_name
from tests.sandboxes_app.conftest import host_upper
from tests.support.api import new_session, run, start_sandbox
from tests.support.worker import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
BIG = 4 * 1024 * 1024


def disk_bytes(path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                total += os.lstat(full).st_blocks * 512
    return total


@pytest.fixture
def big_repo(origins) -> str:
    origins.create("acme", "big", {"blob.bin": os.urandom(BIG), "README.md": "big\n"})
    return "https://github.com/acme/big"


def test_concurrent_first_requests_queue_one_build(owner, org, big_repo):
    sessions = [new_session(owner, organizationId=str(org.id)) for _ in range(5)]
    codes: list[int] = []

    def post(session_id: str) -> None:
        client = APIClient()
        client.credentials(HTTP_X_API_KEY=owner.raw_key)
        try:
            codes.append(
                client.post(
                    "/api/sandbox", {"repoUrl": big_repo, "sessionId": session_id}, format="json"
                ).status_code
            )
        finally:
            connections.close_all()

    threads = [threading.Thread(target=post, args=(s,)) for s in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert codes == [200] * 5
    assert BaseSnapshotBuild.objects.filter(scope=f"org:{org.id}").count() == 1
    assert not LifecycleEvent.objects.filter(reason="ready_base").exists()


def test_later_sandboxes_boot_from_the_base_without_cloning(
    owner, member, org, origins, big_repo, worker, settings
):
    first = new_session(owner, organizationId=str(org.id))
    start_sandbox(owner, first, big_repo)
    build = wait_for(
        lambda: BaseSnapshotBuild.objects.filter(status="succeeded").first(),
        timeout=60,
        message=worker.log()[-3000:],
    )
    assert build.duration_ms is not None and build.snapshot.kind == "base"
    origins.commit("acme", "big", {"NEW.md": "after the base\n"})

    second = new_session(member, organizationId=str(org.id))
    start_sandbox(member, second, big_repo)

    sandbox = Sandbox.objects.get(session_id=second)
    assert sandbox.boot == "base" and sandbox.base_snapshot_id == build.snapshot_id
    assert LifecycleEvent.objects.filter(session_id=second, reason="ready_base").exists()
    # Copy-on-write: the new workspace wrote a small fraction of the repository's bytes.
    with host_upper(settings.SANDBOX_ROOT, session_sandbox_name(second)) as upper:
        assert (upper / "NEW.md").exists() and disk_bytes(upper) < BIG / 4
    # ...and it was fast-forwarded to the origin's current branch.
    assert run(member, second, "cat", "NEW.md").json()["stdout"] == "after the base\n"
    assert run(member, second, "wc", "-c", "blob.bin").json()["stdout"].startswith(str(BIG))


def test_a_broken_base_falls_back_to_a_plain_clone(owner, org, big_repo):
    Snapshot.objects.create(
        kind="base",
        storage_key="bases/missing.tar.zst",
        size_bytes=10,
        sha256="0" * 64,
        created_at=timezone.now(),
        account=owner.account,
        organization=org,
        repo_full_name="acme/big",
    )
    session_id = new_session(owner, organizationId=str(org.id))

    start_sandbox(owner, session_id, big_repo)

    assert Sandbox.objects.get(session_id=session_id).boot == "clone"
    assert Snapshot.objects.get(storage_key="bases/missing.tar.zst").deleted_at is not None


def test_a_stale_base_is_rebuilt_in_the_background(owner, org, big_repo, settings):
    settings.BASE_SNAPSHOT_MAX_AGE = 60
    first = new_session(owner, organizationId=str(org.id))
    start_sandbox(owner, first, big_repo)
    from lifecycle.bases import base_build_run

    base_build_run(build_id=BaseSnapshotBuild.objects.get().id)
    Snapshot.objects.filter(kind="base").update(created_at=timezone.now() - timedelta(hours=1))

    second = new_session(owner, organizationId=str(org.id))
    start_sandbox(owner, second, big_repo)

    assert Sandbox.objects.get(session_id=second).boot == "base"  # the stale one still serves
    assert BaseSnapshotBuild.objects.filter(reason="stale", status="queued").count() == 1
