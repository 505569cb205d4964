"""SANDBOX_PROVIDER=pool: sandboxes on a pool of sandbox hosts, reached from any process.

The web and the lifecycle worker talk to this provider exactly as to the local one; it finds
the sandbox's host (sandboxes_app.hosts.services) and forwards the call. Lifecycle calls go to
the host's own Celery queue and their reply comes back on a Redis list, so a create that clones
for minutes holds no connection to the host; the caller keeps checking that the host lives
while it waits. Interactive calls go to the host's internal endpoint over keep-alive HTTP.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import requests
from django.conf import settings

from recoup.db import release_db_connection
from recoup.redis_clients import redis_client
from sandboxes_app.git.tree import file_tree
from sandboxes_app.hosts.auth import HEADER, host_secret, sign
from sandboxes_app.hosts.services import (
    host_choose,
    host_is_live,
    hosts_live,
    reply_key,
    sandbox_host_of,
    sandbox_place,
    sandbox_unplace,
)
from sandboxes_app.hosts.wire import decode, decode_error, encode
from sandboxes_app.models import SandboxHost
from sandboxes_app.providers.base import (
    CommandResult,
    DetachedHooks,
    DetachedStatus,
    FileTreeEntry,
    GitSource,
    LogRecord,
    Progress,
    ProviderError,
    SandboxInfo,
    SandboxNotFound,
    SandboxProvider,
    SandboxStatus,
    SnapshotInfo,
)
from sandboxes_app.snapshots import snapshot_delete, snapshot_verify

_WAIT_STEP_SECONDS = 2  # how often a waiting lifecycle call checks that its host lives
_local = threading.local()


def _http() -> requests.Session:
    session = getattr(_local, "session", None)
    if session is None:
        session = _local.session = requests.Session()
    return session


def pool_problem() -> str | None:
    """Why this deployment cannot be a pool, naming the fix; None when it can. Every process
    of a pool, on any machine, shares the database, Redis, the broker and the snapshots."""
    from django.core.files.storage import FileSystemStorage, storages

    if not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        return "SANDBOX_PROVIDER=pool needs PostgreSQL (DATABASE_URL=postgres://...)"
    if not settings.REDIS_URL or settings.CELERY_BROKER_URL.startswith("filesystem://"):
        return "SANDBOX_PROVIDER=pool needs REDIS_URL and a Redis CELERY_BROKER_URL"
    # A resume lands on any host, and a snapshot it cannot find makes a fresh sandbox: a
    # storage only one machine sees would quietly lose every session that moves.
    if isinstance(storages["snapshots"], FileSystemStorage) and not (
        settings.SNAPSHOT_STORAGE_ROOT_EXPLICIT
    ):
        return (
            "SANDBOX_PROVIDER=pool needs a snapshot storage every host reaches: "
            "SNAPSHOT_STORAGE=s3, or SNAPSHOT_STORAGE_ROOT on a filesystem all hosts mount"
        )
    return None


def _progress_spec(progress: Progress | None) -> dict | None:
    # A host reports progress itself, into the same session row and bus, fenced by the lease.
    from lifecycle.progress import ProvisioningProgress

    if isinstance(progress, ProvisioningProgress):
        return {
            "session_id": progress.session_id,
            "run_id": progress.run_id,
            "version": progress.version,
        }
    return None


class PoolProvider(SandboxProvider):
    """Local sandboxes on the pool's hosts; `mode` stays `local`, the engine they run on."""

    name = "local"

    def __init__(self, *, call_timeout: float) -> None:
        self.call_timeout = call_timeout
        self.secret = host_secret()

    @classmethod
    def from_settings(cls) -> PoolProvider:
        problem = pool_problem()
        if problem is not None:
            raise ProviderError(problem)
        return cls(call_timeout=settings.SANDBOX_HOST_CALL_TIMEOUT)

    def describe_limits(self) -> str:
        live = hosts_live().count()
        return f"pool of sandbox hosts ({live} up); limits are each host's own"

    # -- transport -------------------------------------------------------------------------

    def _lifecycle(self, host: SandboxHost, method: str, **kwargs: object) -> object:
        from sandboxes_app.tasks import host_call

        call_id = uuid.uuid4().hex
        wire = {k: encode(v) for k, v in kwargs.items()}
        # Never run late: a host that comes back after its caller gave up drops the message.
        host_call.apply_async(
            args=[call_id, method, wire], queue=host.queue, expires=self.call_timeout
        )
        release_db_connection()  # the call may take minutes
        client = redis_client(settings.REDIS_URL)
        deadline = time.monotonic() + self.call_timeout
        while True:
            popped = client.blpop([reply_key(call_id)], timeout=_WAIT_STEP_SECONDS)
            if popped is not None:
                return self._result(json.loads(popped[1]))
            live = host_is_live(host_id=host.id)
            release_db_connection()
            if not live:
                raise ProviderError(f"Sandbox host {host.name} went down during {method}")
            if time.monotonic() > deadline:
                raise ProviderError(f"Sandbox host {host.name} did not finish {method} in time")

    def _interactive(
        self, host: SandboxHost, method: str, *, read_timeout: float = 30, **kwargs: object
    ) -> object:
        body = json.dumps({"method": method, "kwargs": {k: encode(v) for k, v in kwargs.items()}})
        data = body.encode()
        try:
            response = _http().post(
                f"{host.address}/call",
                data=data,
                headers={HEADER: sign(secret=self.secret, body=data)},
                timeout=(3, read_timeout),
            )
        except requests.RequestException as exc:
            raise ProviderError(
                f"Sandbox host {host.name} did not answer ({type(exc).__name__})"
            ) from exc
        if response.status_code != 200:
            raise ProviderError(
                f"Sandbox host {host.name} refused the call ({response.status_code})"
            )
        return self._result(response.json())

    @staticmethod
    def _result(reply: dict) -> object:
        if "error" in reply:
            raise decode_error(reply["error"])
        return decode(reply["ok"])

    def _host(self, name: str) -> SandboxHost | None:
        host = sandbox_host_of(name=name)
        release_db_connection()
        return host

    # -- lifecycle -------------------------------------------------------------------------

    def create(
        self,
        *,
        name: str,
        source: GitSource,
        base: SnapshotInfo | None = None,
        progress: Progress | None = None,
    ) -> SandboxInfo:
        host = sandbox_place(name=name)
        info = self._lifecycle(
            host, "create", name=name, source=source, base=base, progress=_progress_spec(progress)
        )
        return _on(info, host)

    def resume(
        self, *, name: str, snapshot: SnapshotInfo, progress: Progress | None = None
    ) -> SandboxInfo:
        host = sandbox_place(name=name)
        info = self._lifecycle(
            host, "resume", name=name, snapshot=snapshot, progress=_progress_spec(progress)
        )
        return _on(info, host)

    def snapshot(self, *, name: str, storage_key: str) -> SnapshotInfo:
        host = self._host(name)
        if host is None:
            raise SandboxNotFound(f"No sandbox {name} on a live host")
        return self._lifecycle(host, "snapshot", name=name, storage_key=storage_key)

    def build_base(self, *, source: GitSource, storage_key: str) -> SnapshotInfo:
        # Any host: the base goes to the shared storage; the others fetch it on first use.
        host = host_choose()
        return self._lifecycle(host, "build_base", source=source, storage_key=storage_key)

    def stop(self, *, name: str) -> None:
        host = self._host(name)
        if host is not None:
            self._lifecycle(host, "stop", name=name)

    def destroy(self, *, name: str) -> None:
        host = self._host(name)
        if host is not None:
            self._lifecycle(host, "destroy", name=name)
            sandbox_unplace(name=name, host_id=host.id)

    # -- storage, done by the caller itself ------------------------------------------------

    def verify_snapshot(self, *, snapshot: SnapshotInfo) -> None:
        snapshot_verify(
            storage_key=snapshot.storage_key, sha256=snapshot.sha256, size_bytes=snapshot.size_bytes
        )

    def delete_snapshot(self, *, snapshot: SnapshotInfo) -> None:
        # Each host drops its cache of a deleted base by itself (host_base_caches_prune).
        snapshot_delete(storage_key=snapshot.storage_key)

    def file_tree(self, *, source: GitSource) -> list[FileTreeEntry]:
        return file_tree(
            url=source.clone_url,
            branch=source.branch,
            cache_root=Path(settings.DATA_DIR) / "trees",
            token=source.token,
        )

    # -- interactive -----------------------------------------------------------------------

    def status(self, *, name: str) -> SandboxStatus:
        host = self._host(name)
        if host is None:
            return SandboxStatus.ABSENT
        return self._interactive(host, "status", name=name)

    def probe(self, *, name: str, timeout_s: float = 2.0) -> bool:
        host = self._host(name)
        if host is None:
            return False
        try:
            return self._interactive(
                host, "probe", read_timeout=timeout_s + 5, name=name, timeout_s=timeout_s
            )
        except ProviderError:
            return False

    def run(
        self,
        *,
        name: str,
        argv: list[str],
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> CommandResult:
        host = self._require(name)
        wait = (timeout_s or settings.SANDBOX_COMMAND_MAX_TIMEOUT) + 30
        return self._interactive(
            host,
            "run",
            read_timeout=wait,
            name=name,
            argv=argv,
            cwd=cwd,
            env=env,
            timeout_s=timeout_s,
        )

    def running_commands(self, *, name: str) -> int:
        host = self._host(name)
        return 0 if host is None else self._interactive(host, "running_commands", name=name)

    def start_detached(
        self,
        *,
        name: str,
        command_id: str,
        argv: list[str],
        cwd: str | None,
        env: dict[str, str] | None,
        timeout_s: float,
        hooks: DetachedHooks,
    ) -> None:
        host = self._require(name)
        self._interactive(
            host,
            "start_detached",
            name=name,
            command_id=command_id,
            argv=argv,
            cwd=cwd,
            env=env,
            timeout_s=timeout_s,
            hooks=hooks,
        )

    def detached_status(self, *, name: str, command_id: str) -> DetachedStatus:
        host = self._host(name)
        if host is None:
            return DetachedStatus(running=False, exit=None)  # gone with its host
        return self._interactive(host, "detached_status", name=name, command_id=command_id)

    def detached_log(
        self, *, name: str, command_id: str, offset: int, max_bytes: int = 1 << 20
    ) -> list[LogRecord]:
        host = self._host(name)
        if host is None:
            return []
        return self._interactive(
            host,
            "detached_log",
            name=name,
            command_id=command_id,
            offset=offset,
            max_bytes=max_bytes,
        )

    def detached_log_offset_valid(self, *, name: str, command_id: str, offset: int) -> bool:
        host = self._host(name)
        if host is None:
            return True
        return self._interactive(
            host, "detached_log_offset_valid", name=name, command_id=command_id, offset=offset
        )

    def detached_kill(self, *, name: str, command_id: str) -> bool:
        host = self._host(name)
        if host is None:
            return False
        return self._interactive(host, "detached_kill", name=name, command_id=command_id)

    def _require(self, name: str) -> SandboxHost:
        host = self._host(name)
        if host is None:
            raise SandboxNotFound(f"No sandbox {name} is running on a live host")
        return host


def _on(info: SandboxInfo, host: SandboxHost) -> SandboxInfo:
    """The host's answer, with where it ran (for the caller's records, tests and benchmarks)."""
    return SandboxInfo(
        name=info.name,
        branch=info.branch,
        created_at=info.created_at,
        base=info.base,
        boot=info.boot,
        details={**info.details, "host": host.name},
    )
