"""A sandbox's disk quota: its own sparse ext4 image, SANDBOX_DISK_MB large.

Everything a sandbox can write lands in its overlay's upper layer (and overlayfs's work dir),
so both live on a filesystem of the quota's size: a write past it fails with ENOSPC inside the
sandbox, and nowhere else. The image is a sparse file: the host pays only for what is written,
and the filesystem is mounted with `discard`, so what the sandbox deletes is given back too.

Nothing is ever mounted in a mount namespace. The image is attached to a loop device that
detaches itself once unused (autoclear), and mounted with the new mount API (fsopen, fsmount)
as detached mounts whose fds are their only handles: the host side reads and writes the layers
through `/proc/<pid>/fd/<fd>` while it holds one, and the sandbox's init stages its overlay from
an idmapped one. When the last user goes (the init's overlay, a snapshot's reader), the
filesystem is unmounted and the loop device freed by the kernel, even if this process crashed.
No mount of one sandbox is ever copied into another's namespace, and a deleted sandbox's image
is not kept alive by anybody.

The kernel shares one superblock among all mounts of one block device, so every user of an
image must go through the same loop device: a second loop device on the same file would be a
second, unaware filesystem over the same blocks. `attach` finds the image's loop device if it
has one and holds it open (so it cannot be freed and reused) before checking it is the image's.
Callers hold the sandbox's lock, so two of them never attach the same image at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from sandboxes_app.providers.base import ProviderError
from sandboxes_app.providers.local_identity import set_idmap

_libc = ctypes.CDLL(None, use_errno=True)
_SYS_FSOPEN = 430  # the same numbers on every architecture (new syscall table)
_SYS_FSCONFIG = 431
_SYS_FSMOUNT = 432
_FSOPEN_CLOEXEC = 1
_FSCONFIG_SET_FLAG = 0
_FSCONFIG_SET_STRING = 1
_FSCONFIG_CMD_CREATE = 6
_FSMOUNT_CLOEXEC = 1
_MOUNT_ATTR_RDONLY = 0x1
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4

_LOOP_CONFIGURE = 0x4C0A
_LOOP_GET_STATUS64 = 0x4C05
_LOOP_CTL_GET_FREE = 0x4C82
_LO_FLAGS_AUTOCLEAR = 4
# struct loop_info64: device, inode, rdevice, offset, sizelimit (u64); number, encrypt type,
# key size, flags (u32); file name, crypt name (64 bytes), key (32 bytes); init (2 x u64).
_LOOP_INFO64 = struct.Struct("=QQQQQIIII64s64s32s2Q")
# struct loop_config: fd, block size (u32), the loop_info64, 8 reserved u64.
_LOOP_CONFIG = struct.Struct(f"=II{_LOOP_INFO64.size}s64x")

IMAGE_NAME = "disk.img"
# Inside the image: the overlay's layers, owned by root, and nothing else a sandbox sees.
_MKFS_OPTIONS = [
    "-q",
    "-F",
    "-t",
    "ext4",
    "-m",
    "0",  # no blocks reserved for root: the sandbox gets the whole quota
    # Never grown online, so no blocks set aside for it: mkfs takes 6 ms instead of 16.
    "-O",
    "^resize_inode",
    # Sparse from the start: no inode table or journal is written until used (a hole reads as
    # zeros, which is what an initialised table is).
    "-E",
    "lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=0:0",
]


def volume_support_problem() -> str | None:
    """Why this host cannot give sandboxes a disk quota, naming the fix; None when it can."""
    if not os.path.exists("/dev/loop-control"):
        return (
            "loop devices are unavailable (/dev/loop-control is missing: load the loop module, "
            "or give the container access to /dev/loop-control and /dev/loop*)"
        )
    from sandboxes_app.providers.local_runtime import host_tool

    try:
        host_tool("mkfs.ext4")
    except ProviderError as exc:
        return f"{exc} (Debian: e2fsprogs)"
    return None


def create_image(path: Path, *, size_mb: int) -> None:
    """A new sparse image at `path` holding an empty ext4 filesystem of `size_mb`."""
    from sandboxes_app.providers.local_runtime import HOST_ENV, host_tool

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size_mb * 1024 * 1024)
    finally:
        os.close(fd)
    done = subprocess.run(
        [host_tool("mkfs.ext4"), *_MKFS_OPTIONS, str(path)],
        capture_output=True,
        env=HOST_ENV,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        path.unlink()
        raise ProviderError(f"mkfs.ext4 failed: {done.stderr.decode(errors='replace')[:300]}")


@contextlib.contextmanager
def attach(image: Path) -> Iterator[str]:
    """The image's loop device, held open (so it stays the image's) while the block runs."""
    st = os.stat(image)
    for device in _loop_devices_of(image):
        try:
            fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            if _backing_file(fd) == (st.st_dev, st.st_ino):
                yield device
                return
        finally:
            os.close(fd)
    fd, device = _attach_new(image)
    try:
        yield device
    finally:
        os.close(fd)  # autoclear: the device goes with its last user


def mount_volume(device: str, *, userns_fd: int | None = None, read_only: bool = False) -> int:
    """A detached mount of the filesystem on `device`, nosuid and nodev; idmapped through
    `userns_fd` when given. The fd is its only handle: closed, the mount is gone."""
    fs_fd = _syscall_fd(_SYS_FSOPEN, b"ext4", _FSOPEN_CLOEXEC, what="fsopen")
    try:
        _fsconfig(fs_fd, _FSCONFIG_SET_STRING, b"source", os.fsencode(device))
        # What the sandbox deletes goes back to the host (the image's blocks are punched out).
        _fsconfig(fs_fd, _FSCONFIG_SET_FLAG, b"discard", None)
        # The lazy init thread would write zeros over holes that already read as zeros.
        _fsconfig(fs_fd, _FSCONFIG_SET_FLAG, b"noinit_itable", None)
        _fsconfig(fs_fd, _FSCONFIG_CMD_CREATE, None, None)
        attrs = _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV | (_MOUNT_ATTR_RDONLY if read_only else 0)
        mount_fd = _syscall_fd(_SYS_FSMOUNT, fs_fd, _FSMOUNT_CLOEXEC, attrs, what="fsmount")
    finally:
        os.close(fs_fd)
    if userns_fd is not None:
        try:
            set_idmap(mount_fd, userns_fd=userns_fd)
        except OSError as exc:
            os.close(mount_fd)
            raise ProviderError(f"Cannot idmap a sandbox disk: {exc.strerror}") from None
    return mount_fd


@contextlib.contextmanager
def mounted(image: Path) -> Iterator[Path]:
    """The root of the image's filesystem, as a path this process and its children (root)
    can use while the block runs."""
    with attach(image) as device:
        fd = mount_volume(device)
    try:
        yield Path(f"/proc/{os.getpid()}/fd/{fd}")
    finally:
        os.close(fd)


# As host root in a throwaway mount namespace: the disk on $1 mounted at $2 (the one superblock
# the detached mounts share), then the rest, which sees the disk under a plain path. For tools
# that resolve their paths (git does), which a detached mount's /proc/<pid>/fd path defeats.
_MOUNT_DISK = 'mount -t ext4 -o nosuid,nodev "$1" "$2" || exit 125; shift 2; exec "$@"'


def in_disk_namespace(argv: list[str], *, device: str, target: Path) -> list[str]:
    """argv run with the disk on `device` (attached by the caller) mounted at `target`."""
    from sandboxes_app.providers.local_runtime import SH, host_tool

    return [
        host_tool("unshare"),
        "--mount",
        "--propagation",
        "private",
        "--",
        SH,
        "-c",
        _MOUNT_DISK,
        "sh",
        device,
        str(target),
        *argv,
    ]


def loop_users(image: Path) -> list[str]:
    """The loop devices backed by `image` now (at most one while we are right)."""
    return list(_loop_devices_of(image))


def _loop_devices_of(image: Path) -> Iterator[str]:
    wanted = str(image)
    for entry in Path("/sys/block").glob("loop*"):
        try:
            backing = (entry / "loop" / "backing_file").read_text().rstrip("\n")
        except (FileNotFoundError, NotADirectoryError, OSError):
            continue  # not bound to a file
        if backing == wanted:
            yield f"/dev/{entry.name}"


def _backing_file(loop_fd: int) -> tuple[int, int] | None:
    buf = bytearray(_LOOP_INFO64.size)
    try:
        fcntl.ioctl(loop_fd, _LOOP_GET_STATUS64, buf)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # unbound
            return None
        raise
    fields = _LOOP_INFO64.unpack(bytes(buf))
    return fields[0], fields[1]


def _attach_new(image: Path) -> tuple[int, str]:
    image_fd = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
        try:
            for _ in range(64):  # another process may take the free device first
                number = fcntl.ioctl(control, _LOOP_CTL_GET_FREE)
                device = f"/dev/loop{number}"
                fd = _open_loop(device)
                info = _LOOP_INFO64.pack(
                    0, 0, 0, 0, 0, 0, 0, 0, _LO_FLAGS_AUTOCLEAR, b"", b"", b"", 0, 0
                )
                try:
                    fcntl.ioctl(fd, _LOOP_CONFIGURE, _LOOP_CONFIG.pack(image_fd, 0, info))
                except OSError as exc:
                    os.close(fd)
                    if exc.errno == errno.EBUSY:
                        continue
                    raise ProviderError(f"Cannot attach a loop device: {exc.strerror}") from exc
                return fd, device
        finally:
            os.close(control)
    finally:
        os.close(image_fd)
    raise ProviderError("Cannot attach a loop device: every free one was taken meanwhile")


def _open_loop(device: str) -> int:
    # devtmpfs creates the node a moment after LOOP_CTL_GET_FREE made the device.
    for _ in range(100):
        try:
            return os.open(device, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            time.sleep(0.005)
    raise ProviderError(f"{device} did not appear")


def _syscall_fd(number: int, *args, what: str) -> int:
    fd = _libc.syscall(number, *args)
    if fd < 0:
        err = ctypes.get_errno()
        raise ProviderError(f"Cannot mount a sandbox disk ({what}: {os.strerror(err)})")
    return fd


def _fsconfig(fs_fd: int, command: int, key: bytes | None, value: bytes | None) -> None:
    if _libc.syscall(_SYS_FSCONFIG, fs_fd, command, key, value, 0) < 0:
        err = ctypes.get_errno()
        raise ProviderError(
            f"Cannot mount a sandbox disk (fsconfig {key!r}: {os.strerror(err)}): sandboxes "
            "with SANDBOX_DISK_MB need Linux 5.2 or later with ext4"
        )
