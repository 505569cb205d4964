"""A host identity of its own for every running sandbox.

Each sandbox runs in its own user namespace whose ids 0-65535 map to a range of host ids that
no other running sandbox holds and no host account uses: slot `i` of the pool owns host ids
`SANDBOX_ID_POOL_START + i * 65536` onwards. Inside, the user still sees `sandbox`
(SANDBOX_UID, default 1000) and a root without power over anything of the host's.

Files keep their inside ids on disk (the sandbox user's files are owned by SANDBOX_UID), so
snapshots, base caches and resumes are independent of the slot: every start sees its
workspace and base layers through idmapped mounts that translate inside ids to its range.
Nothing is re-owned on resume, whatever range it lands in. On the host the files sit under a
root-only SANDBOX_ROOT, so their at-rest ids reach no host account.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from sandboxes_app.providers.base import ProviderError

RANGE = 65536  # ids per sandbox: everything a distribution's packages expect to exist
ACCOUNT_TABLES = ("/etc/passwd", "/etc/group")  # where `useradd` and `groupadd` write

_libc = ctypes.CDLL(None, use_errno=True)
_SYS_OPEN_TREE = 428  # the same number on every architecture (new syscall table)
_SYS_MOUNT_SETATTR = 442
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_AT_EMPTY_PATH = 0x1000
_MOUNT_ATTR_RDONLY = 0x1
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4
_MOUNT_ATTR_IDMAP = 0x100000


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


@dataclass(frozen=True)
class Identity:
    """One sandbox's slot and the host ids it maps inside ids 0-65535 onto."""

    slot: int
    host_base: int

    def host_uid(self, inside: int) -> int:
        return self.host_base + inside


def pool() -> tuple[int, int]:
    """(first host id, number of slots) of SANDBOX_ID_POOL_START / SANDBOX_ID_POOL_SLOTS."""
    # Imported here: a detached command's supervisor imports this module without Django.
    from django.conf import settings

    return settings.SANDBOX_ID_POOL_START, settings.SANDBOX_ID_POOL_SLOTS


def check_pool() -> None:
    """Refuse a pool that overlaps an account or group of this host, or an inside id past
    the range. Read from /etc/passwd and /etc/group (what `useradd` writes)."""
    from django.conf import settings

    start, slots = pool()
    end = start + slots * RANGE
    if end > 2**32 - 2:
        raise ProviderError("SANDBOX_ID_POOL_START + 65536 * SANDBOX_ID_POOL_SLOTS passes 2^32-2")
    for ids in (settings.SANDBOX_UID, settings.SANDBOX_GID):
        if not 0 < ids < RANGE:
            raise ProviderError("SANDBOX_UID and SANDBOX_GID must be between 1 and 65535")
    for table in ACCOUNT_TABLES:
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            for line in f:
                fields = line.split(":")
                if len(fields) > 2 and fields[2].isdigit() and start <= int(fields[2]) < end:
                    raise ProviderError(
                        f"{table} has {fields[0]} ({fields[2]}) inside the sandbox id pool "
                        f"{start}-{end - 1}: move SANDBOX_ID_POOL_START"
                    )


def claim_identity(*, root: Path, name: str) -> Identity:
    """A free slot for `name`, recorded in <root>/_ids/<slot>; the caller holds name's lock.

    A slot is free when its file is missing, or names a sandbox whose lock nobody holds and
    whose running init (if any) records another slot.
    """
    from sandboxes_app.providers.local_layout import SandboxPaths, file_lock, live_init

    start, slots = pool()
    ids = root / "_ids"
    ids.mkdir(mode=0o700, exist_ok=True)
    with file_lock(root / "_locks" / "_ids.lock"):
        for slot in range(slots):
            claim = ids / str(slot)
            try:
                owner = claim.read_text()
            except FileNotFoundError:
                owner = None
            if owner is not None and owner != name:
                paths = SandboxPaths(root=root, name=owner)
                if _lock_is_held(paths.lock):
                    continue
                record = live_init(paths)
                if record is not None and record.get("slot") == slot:
                    continue
            claim.write_text(name)
            return Identity(slot=slot, host_base=start + slot * RANGE)
    raise ProviderError(f"All {slots} sandbox identities are in use (SANDBOX_ID_POOL_SLOTS)")


def release_identity(*, root: Path, name: str, slot: int | None) -> None:
    if slot is None:
        return
    claim = root / "_ids" / str(slot)
    with contextlib.suppress(FileNotFoundError):
        if claim.read_text() == name:
            claim.unlink()


def _lock_is_held(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def runtime_map(identity: Identity) -> str:
    """The sandbox's own namespace: inside 0-65535 are the identity's host ids."""
    return f"0 {identity.host_base} {RANGE}\n"


def idmap_map(identity: Identity) -> str:
    """The idmapped mounts' namespace: on-disk id k appears as the identity's host id k, except
    0, which stays root so the root-owned overlay (work dirs, directories we made) keeps
    working; inside the sandbox, host root is unmapped and shows as nobody."""
    return f"0 0 1\n1 {identity.host_base + 1} {RANGE - 1}\n"


def user_namespaces(*, id_maps: list[str], unshare: str, sleep: str, env: dict) -> list[int]:
    """fds of new user namespaces, one per uid/gid map in `id_maps`.

    Throwaway processes create them (util-linux `unshare --user`), all at once; we write
    their maps as root, keep each namespace by its fd, and end the processes. About 3 ms.
    """
    holders = [
        subprocess.Popen(
            [unshare, "--user", "--", sleep, "infinity"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        for _ in id_maps
    ]
    fds: list[int] = []
    try:
        mine = os.readlink("/proc/self/ns/user")
        deadline = time.monotonic() + 5
        for holder, id_map in zip(holders, id_maps, strict=True):
            while os.readlink(f"/proc/{holder.pid}/ns/user") == mine:
                if holder.poll() is not None or time.monotonic() > deadline:
                    raise ProviderError("Could not create the sandbox's user namespace")
                time.sleep(0.0002)
            for table in ("uid_map", "gid_map"):
                with open(f"/proc/{holder.pid}/{table}", "w") as f:
                    f.write(id_map)
            fds.append(os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC))
        return fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()


def idmapped_tree(path: Path, *, userns_fd: int, read_only: bool = False) -> int:
    """A detached mount of `path` whose inside ids appear as the namespace's host ids; also
    nosuid and nodev, and read-only when asked (a base cache other sandboxes share). The fd
    is the only handle on it: closed, the mount is gone."""
    flags = _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC
    fd = _libc.syscall(_SYS_OPEN_TREE, -100, os.fsencode(path), flags)
    if fd < 0:
        raise _mount_error("open_tree", path)
    flags = _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV | (_MOUNT_ATTR_RDONLY if read_only else 0)
    try:
        set_idmap(fd, userns_fd=userns_fd, flags=flags)
    except OSError:
        os.close(fd)
        raise _mount_error("mount_setattr", path) from None
    return fd


def set_idmap(mount_fd: int, *, userns_fd: int, flags: int = 0) -> None:
    """Make the detached, never attached mount `mount_fd` idmapped through `userns_fd`."""
    attr = _MountAttr(_MOUNT_ATTR_IDMAP | flags, 0, 0, userns_fd)
    if _libc.syscall(_SYS_MOUNT_SETATTR, mount_fd, b"", _AT_EMPTY_PATH, ctypes.byref(attr), 32) < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _mount_error(call: str, path: Path) -> ProviderError:
    err = ctypes.get_errno()
    return ProviderError(
        f"Cannot make an idmapped mount of {path} ({call}: {os.strerror(err)}): sandboxes need "
        "Linux 5.19 or later and SANDBOX_ROOT on a filesystem with idmapped mounts (ext4, "
        "xfs, btrfs, tmpfs from 6.3)"
    )
