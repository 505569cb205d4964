"""Where a local sandbox lives on disk, and the small files that describe it.

Everything the local provider knows about a sandbox is under `SANDBOX_ROOT`:

    <root>/<name>/meta.json      written once the workspace is complete; its presence is what
                                 makes the sandbox exist (STOPPED at least)
    <root>/<name>/init.json      pid, start time and boot id of the running init
    <root>/<name>/disk.img       the sandbox's disk (SANDBOX_DISK_MB, sparse ext4; see
                                 local_volume), holding the three layer dirs below; without a
                                 quota they sit in <root>/<name>/ itself
        upper/                   the workspace: the overlay's upper layer, which holds the whole
                                 checkout, or only the changes when the sandbox sits on a base
        lower/                   the overlay's lower layer when there is no base: empty
        work/                    overlayfs work dir
    <root>/<name>/merged/        overlay mount point for host-side git, only ever mounted in
                                 private namespaces
    <root>/<name>/runs/          one flock-held marker per in-flight command
    <root>/_locks/<name>.lock    per-sandbox lock; outside the sandbox dir so destroy can't
                                 delete a lock somebody is waiting on
    <root>/_bases/<sha256>/      extracted, read-only cache of a base snapshot
    <root>/_trees/<hash>.git     bare shallow fetches used by file_tree
    <root>/_seccomp-<hash>.bpf   the compiled syscall filter

The root is mode 0700, owned by root: no host user but root can reach a workspace, so a file a
sandbox marked setuid is never executable with raised ids by anyone on the host.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sandboxes_app.providers.base import ProviderError, SnapshotInfo


def sandbox_ids() -> tuple[int, int]:
    """(uid, gid) of the sandbox user: SANDBOX_UID and SANDBOX_GID.

    Ids inside the sandbox's user namespace, and the owner of workspace files on disk (under a
    root-only SANDBOX_ROOT); on the host a running sandbox is a pool uid. Read at each use: a
    resumed workspace is re-owned to the current ids.
    """
    # Imported here: a detached command's supervisor imports this module without Django.
    from django.conf import settings

    return settings.SANDBOX_UID, settings.SANDBOX_GID


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def check_name(name: str) -> str:
    """Refuse names that could not safely be a directory, hostname and cgroup name."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise ProviderError(f"Invalid sandbox name {name!r}")
    return name


@dataclass(frozen=True)
class SandboxPaths:
    root: Path
    name: str

    @property
    def dir(self) -> Path:
        return self.root / self.name

    @property
    def image(self) -> Path:
        return self.dir / "disk.img"

    @property
    def upper(self) -> Path:
        return self.dir / "upper"

    @property
    def lower(self) -> Path:
        return self.dir / "lower"

    @property
    def work(self) -> Path:
        return self.dir / "work"

    @property
    def merged(self) -> Path:
        return self.dir / "merged"

    @property
    def meta(self) -> Path:
        return self.dir / "meta.json"

    @property
    def init(self) -> Path:
        return self.dir / "init.json"

    @property
    def runs(self) -> Path:
        return self.dir / "runs"

    @property
    def lock(self) -> Path:
        return self.root / "_locks" / f"{self.name}.lock"


def base_cache_dir(*, root: Path, sha256: str) -> Path:
    return root / "_bases" / sha256


@contextlib.contextmanager
def file_lock(path: Path, *, shared: bool = False) -> Iterator[None]:
    """Hold a flock on `path` (created if needed); released when the process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_json(path: Path, data: dict) -> None:
    """Replace `path` atomically and durably: readers see the old or the new file, whole."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def snapshot_to_dict(info: SnapshotInfo | None) -> dict | None:
    if info is None:
        return None
    return {
        "storage_key": info.storage_key,
        "sha256": info.sha256,
        "size_bytes": info.size_bytes,
        "kind": info.kind,
        "created_at": info.created_at.isoformat(),
        "base": snapshot_to_dict(info.base),
    }


def snapshot_from_dict(data: dict | None) -> SnapshotInfo | None:
    if data is None:
        return None
    return SnapshotInfo(
        storage_key=data["storage_key"],
        sha256=data["sha256"],
        size_bytes=data["size_bytes"],
        kind=data["kind"],
        created_at=datetime.fromisoformat(data["created_at"]),
        base=snapshot_from_dict(data["base"]),
    )


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


_PF_EXITING = 0x4  # a killed init tearing its namespace down is not running any more


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot), None if gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name may contain spaces and parentheses; fields resume after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X") or int(fields[6]) & _PF_EXITING:
        return None
    return int(fields[19])


def init_record(*, pid: int, extra: dict) -> dict:
    """What init.json holds: enough to tell our init from a later process that reused its pid."""
    start = process_start_time(pid)
    if start is None:
        raise ProviderError("The sandbox init exited while starting")
    return {"pid": pid, "start_time": start, "boot_id": _boot_id(), **extra}


def live_init(paths: SandboxPaths) -> dict | None:
    """The init record when that very process is still alive, else None."""
    record = read_json(paths.init)
    if record is None or record.get("boot_id") != _boot_id():
        return None
    if process_start_time(record["pid"]) != record["start_time"]:
        return None
    return record
