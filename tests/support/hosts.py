"""Sandbox hosts for tests: real `manage.py sandbox_host` processes on this machine, each with
its own SANDBOX_ROOT and id pool, on the test database, the test's broker and snapshot storage."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.test import override_settings

from sandboxes_app.models import HostPlacement, SandboxHost
from sandboxes_app.providers.local import LocalProvider
from tests.support.worker import (
    ROOT,
    kill_process,
    stop_process,
    test_database_url,
    wait_for,
)

# Far above the suite's own pool (0x70000000 + 1024 slots): hosts on one kernel need disjoint
# id ranges, as the README says for a real pool.
_ID_POOL_BASE = 0xC0000000
_SLOTS = 64


@dataclass
class Host:
    name: str
    root: Path
    id_pool_start: int
    log_path: Path
    env: dict[str, str]
    process: subprocess.Popen | None = None

    def start(self) -> Host:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "sandbox_host", "--name", self.name],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        return self

    def wait_live(self, timeout: float = 30) -> SandboxHost:
        from sandboxes_app.hosts.services import hosts_live

        return wait_for(
            lambda: hosts_live().filter(name=self.name).first(),
            timeout=timeout,
            message=f"host {self.name} never came up\n{self.log()[-3000:]}",
        )

    def kill(self) -> None:
        kill_process(self.process)

    def stop(self) -> None:
        stop_process(self.process)

    def local_provider_for_test(self) -> LocalProvider:
        """The host's own provider, as `sandbox_host` builds it (settings read at start-up)."""
        with override_settings(
            SANDBOX_ROOT=self.root,
            SANDBOX_ID_POOL_START=self.id_pool_start,
            SANDBOX_ID_POOL_SLOTS=_SLOTS,
        ):
            return LocalProvider.from_settings()

    def destroy_all(self) -> None:
        """Whatever is on the host's disk, as the host itself would destroy it (a killed host's
        sandboxes keep running)."""
        if not self.root.exists():
            return
        with override_settings(
            SANDBOX_ROOT=self.root,
            SANDBOX_ID_POOL_START=self.id_pool_start,
            SANDBOX_ID_POOL_SLOTS=_SLOTS,
        ):
            provider = LocalProvider.from_settings()
            for path in self.root.iterdir():
                if not path.name.startswith("_"):
                    provider.destroy(name=path.name)

    def holds(self, name: str) -> bool:
        return (self.root / name / "meta.json").exists()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class Pool:
    def __init__(self, tmp_path: Path, count: int, env: dict[str, str]) -> None:
        tag = uuid.uuid4().hex[:8]
        # Each xdist worker's hosts get ranges of their own too: they share this kernel.
        worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
        self.hosts = [
            Host(
                name=f"t{tag}-{chr(ord('a') + i)}",
                root=tmp_path / f"host-{i}",
                id_pool_start=_ID_POOL_BASE + (worker * 4 + i) * _SLOTS * 65536,
                log_path=tmp_path / f"host-{i}.log",
                env={},
            )
            for i in range(count)
        ]
        for host in self.hosts:
            host.env = {
                **os.environ,
                "DATABASE_URL": test_database_url(),
                "SANDBOX_PROVIDER": "pool",
                "SECRET_KEY": settings.SECRET_KEY,
                "RECOUP_DATA_DIR": str(settings.DATA_DIR),
                "SNAPSHOT_STORAGE_ROOT": str(settings.SNAPSHOT_STORAGE_ROOT),
                "SANDBOX_GIT_BASE_URL": settings.SANDBOX_GIT_BASE_URL,
                "SANDBOX_ROOT": str(host.root),
                "SANDBOX_ID_POOL_START": str(host.id_pool_start),
                "SANDBOX_ID_POOL_SLOTS": str(_SLOTS),
                "SANDBOX_HOST_HEARTBEAT": "1",
                "SANDBOX_HOST_DOWN_AFTER": str(settings.SANDBOX_HOST_DOWN_AFTER),
                **env,
            }

    def start(self) -> Pool:
        for host in self.hosts:
            host.start()
        for host in self.hosts:
            host.wait_live()
        return self

    def by_name(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def host_of(self, sandbox_name: str) -> Host:
        placed = HostPlacement.objects.get(sandbox_name=sandbox_name)
        return self.by_name(placed.host.name)

    def close(self) -> None:
        for host in self.hosts:
            host.kill()
        for host in self.hosts:
            host.destroy_all()
        HostPlacement.objects.all().delete()
