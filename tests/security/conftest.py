"""Fixtures for the attacks: sandboxes on a SANDBOX_ROOT whose parents any host user may
traverse (as on a real host's /var/lib), so only the service's own choices keep a host user
out, and a host-only marker path that no sandbox can see."""

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandboxes_app.providers.local import LocalProvider
from tests.sandboxes_app.conftest import make_provider, source  # noqa: F401  (fixtures)


@pytest.fixture
def sandbox_root(tmp_path, settings) -> Iterator[Path]:
    """SANDBOX_ROOT under a world-traversable dir (pytest's own tmp dirs are 0700)."""
    top = Path(tempfile.mkdtemp(prefix="recoup-sec-"))
    top.chmod(0o755)
    settings.SANDBOX_ROOT = top / "sandboxes"
    settings.GITHUB_TOKEN = ""
    settings.STORAGES = {
        **settings.STORAGES,
        "snapshots": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "snapshots")},
        },
    }
    yield settings.SANDBOX_ROOT
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def provider(make_provider) -> LocalProvider:  # noqa: F811
    return make_provider()


@pytest.fixture
def sandbox(provider, source, new_name) -> str:  # noqa: F811
    name = new_name()
    provider.create(name=name, source=source)
    return name


@pytest.fixture
def new_name() -> Callable[[], str]:
    import uuid

    return lambda: f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def host_marker(tmp_path) -> Path:
    """A host path outside every sandbox: if it ever exists, code ran on the host."""
    return tmp_path / "host-marker"
