"""Fixtures for the local provider's tests: a private SANDBOX_ROOT and snapshot storage per
test, real git origins (tests.support.origin), and a provider that destroys whatever the test
left running, so no sandbox process outlives its test."""

import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.core.files.storage import storages

from recoup.env import s3_snapshot_storage
from sandboxes_app.providers.base import GitSource
from sandboxes_app.providers.local import LocalProvider
from sandboxes_app.providers.local_volume import mounted
from tests.support.s3 import CREDENTIALS, MotoServer


@pytest.fixture
def sandbox_root(tmp_path, settings) -> Path:
    """SANDBOX_ROOT and the "snapshots" storage under this test's tmp_path."""
    settings.SANDBOX_ROOT = tmp_path / "sandboxes"
    settings.GITHUB_TOKEN = ""
    settings.STORAGES = {
        **settings.STORAGES,
        "snapshots": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "snapshots")},
        },
    }
    assert storages["snapshots"].location == str(tmp_path / "snapshots")
    return settings.SANDBOX_ROOT


@dataclass
class S3Bucket:
    client: object  # a boto3 S3 client, for looking at the objects from outside
    name: str
    prefix: str

    def key(self, storage_key: str) -> str:
        return f"{self.prefix}/{storage_key}"

    def keys(self) -> set[str]:
        listed = self.client.list_objects_v2(Bucket=self.name)
        return {entry["Key"] for entry in listed.get("Contents", [])}


@pytest.fixture
def s3_bucket(sandbox_root, settings, monkeypatch, moto_server: MotoServer) -> S3Bucket:
    """The "snapshots" storage in a fresh bucket of the moto server, configured as
    SNAPSHOT_STORAGE=s3 configures it, with a key prefix; credentials from the environment."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    bucket = S3Bucket(client=moto_server.client(), name=moto_server.new_bucket(), prefix="recoup")
    settings.STORAGES = {
        **settings.STORAGES,
        "snapshots": s3_snapshot_storage(
            bucket=bucket.name,
            endpoint_url=moto_server.endpoint_url,
            region="us-east-1",
            prefix=bucket.prefix,
        ),
    }
    assert storages["snapshots"].bucket_name == bucket.name
    return bucket


@pytest.fixture
def make_provider(sandbox_root) -> Iterator[Callable[[], LocalProvider]]:
    """Builds providers from the current settings; destroys every sandbox of the root after."""
    made: list[LocalProvider] = []

    def make() -> LocalProvider:
        made.append(LocalProvider.from_settings())
        return made[-1]

    yield make
    if made and sandbox_root.exists():
        for path in sandbox_root.iterdir():
            if not path.name.startswith("_"):
                made[0].destroy(name=path.name)


@pytest.fixture
def provider(make_provider) -> LocalProvider:
    return make_provider()


@pytest.fixture
def source(origins) -> GitSource:
    """acme/app with a small tree: a README, an executable script and a nested file."""
    origins.create(
        "acme",
        "app",
        {
            "README.md": "# app\n",
            "scripts/run.sh": "#!/bin/sh\necho run\n",
            "src/pkg/main.py": "print('hello')\n",
        },
    )
    return GitSource(clone_url=f"{origins.base_url}/acme/app.git")


@pytest.fixture
def new_name() -> Callable[[], str]:
    return lambda: f"t-{uuid.uuid4().hex[:12]}"


@contextlib.contextmanager
def host_upper(root: Path, name: str) -> Iterator[Path]:
    """The workspace (the overlay's upper layer) of `name` as a host path while the block runs:
    on the sandbox's own disk, mounted detached for the block, or in its dir when it has none."""
    image = root / name / "disk.img"
    if not image.exists():
        yield root / name / "upper"
        return
    with mounted(image) as layers:
        yield layers / "upper"
