"""The running part of a local sandbox: its bubblewrap init, and commands joined to it.

The init is `bwrap ... -- sh -c 'echo ready; exec sleep infinity'` with its own PID, IPC, UTS,
network, mount (and cgroup) namespaces, started detached so it outlives whoever started it.
bwrap's child is PID 1 of the sandbox; we record it, and killing it ends the PID namespace and
with it every process of the sandbox. Commands enter the init's namespaces with nsenter and
drop to the sandbox user with setpriv (no capabilities, no_new_privs), so a background process
started by one command is still there for the next.

When the sandbox sits on a base, overlayfs is mounted inside a private mount namespace
(`unshare --mount`) that only the init's bwrap inherits: nothing is mounted on the host, and the
mount disappears with the sandbox, even on a crash.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sandboxes_app.providers.base import ProviderError
from sandboxes_app.providers.local_cgroups import SandboxCgroups
from sandboxes_app.providers.local_identity import check_pool
from sandboxes_app.providers.local_layout import (
    SandboxPaths,
    init_record,
    process_start_time,
)

logger = logging.getLogger(__name__)

WORKSPACE = "/workspace"  # where the workspace appears inside
HOME = "/home/sandbox"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# What every host-side process we start runs with: our PATH and locale, nothing a client said.
HOST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
HOST_ENV = {"PATH": HOST_PATH, "LANG": "C.UTF-8"}
SH = "/bin/sh"


@functools.cache
def host_tool(name: str) -> str:
    """The absolute path of a system tool, found in HOST_PATH only (never /usr/local)."""
    path = shutil.which(name, path=HOST_PATH)
    if path is None:
        raise ProviderError(f"{name} is missing from {HOST_PATH}: install it from the distribution")
    return path


# Joins the cgroup.procs files given before "--", then execs the rest. A shell is the cheapest
# way to put a process in its cgroups before it execs anything.
_JOIN_CGROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; '
JOIN_AND_EXEC = _JOIN_CGROUPS + 'exec "$@"'
# The same, but backgrounded so the init is reparented away from the calling process.
_JOIN_AND_DETACH = _JOIN_CGROUPS + '"$@" & exit 0'

# Host files the sandbox's minimal /etc borrows read-only; all harmless to disclose.
_HOST_ETC = (
    "alternatives",
    "ssl",
    "ca-certificates",
    "ld.so.cache",
    "localtime",
    "mime.types",
    "protocols",
    "services",
)


@dataclass(frozen=True)
class Limits:
    cpus: float
    memory_mb: int
    max_processes: int
    max_file_mb: int
    cpu_seconds: int


@contextlib.contextmanager
def memfd_with(data: bytes, *, name: str) -> Iterator[int]:
    """An anonymous in-memory file holding `data`, read from its start by whoever gets it.

    Close-on-exec here; `pass_fds` hands it to one child only. Nothing touches the disk.
    """
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)


def etc_files(*, network: bool, uid: int, gid: int) -> dict[str, str]:
    """The sandbox's own /etc files: a passwd with the sandbox user, hosts, resolv.conf, git.

    bwrap copies them into the sandbox's root (`--file`), so no host path backs them.
    """
    return {
        "passwd": (
            "root:x:0:0:root:/root:/usr/sbin/nologin\n"
            f"sandbox:x:{uid}:{gid}:sandbox:{HOME}:/bin/sh\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        ),
        "group": f"root:x:0:\nsandbox:x:{gid}:\nnogroup:x:65534:\n",
        "hosts": "127.0.0.1 localhost\n::1 localhost\n",
        # slirp4netns's built-in DNS forwarder; with the network off there is nothing to ask.
        "resolv.conf": "nameserver 10.0.2.3\n" if network else "",
        "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
        "gitconfig": (
            "[user]\n\tname = sandbox\n\temail = sandbox@localhost\n"
            "[safe]\n\tdirectory = *\n[init]\n\tdefaultBranch = main\n"
        ),
    }


def _system_image_args(*, etc_fds: dict[str, int]) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("bin", "lib", "lib32", "lib64", "sbin"):
        host = Path("/") / top
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), f"/{top}"]
        elif host.is_dir():
            args += ["--ro-bind", str(host), f"/{top}"]
    args += ["--dir", "/etc"]
    for name, fd in etc_fds.items():
        args += ["--perms", "0644", "--file", str(fd), f"/etc/{name}"]
    for name in _HOST_ETC:
        if os.path.exists(f"/etc/{name}"):
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    return args


_INIT_SCRIPT = "echo ready; exec sleep infinity </dev/null >/dev/null 2>&1"

# Where, in the init's throwaway mount namespace only, the workspace overlay is mounted for
# bwrap to bind: a directory every Linux has, that the sandbox's own root (a pool uid) can
# traverse, unlike SANDBOX_ROOT. The host's /mnt is untouched: only that namespace sees it.
STAGE = "/mnt"

# As host root, in the init's new mount namespace: from inside the sandbox dir's idmapped
# view ($1), mount the overlay ($3: options with relative layer names) on $2, close the layer
# fds ($4: the overlay holds its own references; left open, the sandbox's root would hold a
# writable handle on its storage), then exec the rest, which enters the sandbox's user
# namespace. bash, because dash cannot name fds past 9.
_STAGE_WORKSPACE = (
    'cd "$1" && mount -t overlay overlay -o "$3" "$2" || exit 125; cd / || exit 125; '
    'for fd in $4; do eval "exec $fd<&-"; done; shift 4; exec "$@"'
)
# Right after nsenter entered the user namespace: close its fd ($1), then exec bwrap.
_CLOSE_AND_EXEC = 'eval "exec $1<&-"; shift; exec "$@"'
_OVERLAY_FLAGS = (
    # metacopy would leave data in the lower layer, making the upper layer alone (what a
    # snapshot stores) incomplete; redirect_dir and index would tie it to this host's inodes.
    "redirect_dir=off,index=off,metacopy=off,xino=off"
)


@dataclass(frozen=True)
class InitMounts:
    """What the init's mounts are made of: fds of the sandbox's user namespace, of the
    idmapped sandbox dir (lower/, upper/, work/) and of the idmapped base cache, if any."""

    userns_fd: int
    dir_fd: int
    base_fd: int | None

    @property
    def fds(self) -> tuple[int, ...]:
        return tuple(fd for fd in (self.userns_fd, self.dir_fd, self.base_fd) if fd is not None)

    def overlay_options(self) -> str:
        lower = "lower" if self.base_fd is None else f"/proc/self/fd/{self.base_fd}"
        return f"lowerdir={lower},upperdir=upper,workdir=work,{_OVERLAY_FLAGS}"


def start_init(
    *,
    paths: SandboxPaths,
    mounts: InitMounts,
    cgroups: SandboxCgroups | None,
    limits: Limits,
    network: bool,
    uid: int,
    gid: int,
    seccomp_fd: int,
) -> dict:
    """Start the sandbox's init over its workspace and return its init record.

    Host root mounts the overlay in a new mount namespace, from idmapped layers; bwrap then
    runs as the root of the sandbox's own user namespace (a pool uid on the host), so every
    namespace it makes belongs to that user namespace. `uid`/`gid` are the inside ids the
    sandbox's passwd names; the record keeps them so this init's commands run as them whatever
    the settings say by the time they come. bwrap reads its arguments from a memfd (`--args`),
    so the sandbox's PID 1 shows `bwrap --args N` and no host path.
    """
    if cgroups is not None:
        cgroups.kill_all_and_remove()
        cgroups.setup(limits=limits)
    info_r, info_w = os.pipe()
    with contextlib.ExitStack() as stack:
        etc_fds = {
            name: stack.enter_context(memfd_with(content.encode(), name=f"etc-{name}"))
            for name, content in etc_files(network=network, uid=uid, gid=gid).items()
        }
        bwrap_args = [
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-net",
            "--unshare-cgroup-try",
            "--hostname",
            paths.name,
            *_system_image_args(etc_fds=etc_fds),
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--perms",
            "1777",
            "--tmpfs",
            "/tmp",
            "--perms",
            "0755",
            "--dir",
            "/home",
            "--perms",
            "1777",
            "--tmpfs",
            HOME,
            # The overlay's own root: mountinfo shows "overlay" and relative layer names.
            "--bind",
            STAGE,
            WORKSPACE,
            "--chdir",
            WORKSPACE,
            "--remount-ro",
            "/",
            "--new-session",
            # The init only sleeps: even inside its own user namespace it holds no capability.
            "--cap-drop",
            "ALL",
            "--info-fd",
            str(info_w),
            "--seccomp",
            str(seccomp_fd),
        ]
        args_fd = stack.enter_context(
            memfd_with(b"".join(a.encode() + b"\0" for a in bwrap_args), name="bwrap-args")
        )
        procs = cgroups.init_procs_files() if cgroups else []
        argv = [SH, "-c", _JOIN_AND_DETACH, "sh", *map(str, procs), "--"]
        argv += [host_tool("unshare"), "--mount", "--propagation", "private", "--"]
        layer_fds = " ".join(str(fd) for fd in mounts.fds if fd != mounts.userns_fd)
        argv += [host_tool("bash"), "-c", _STAGE_WORKSPACE, "bash"]
        argv += [f"/proc/self/fd/{mounts.dir_fd}", STAGE, mounts.overlay_options(), layer_fds]
        argv += [host_tool("nsenter"), f"--user=/proc/self/fd/{mounts.userns_fd}", "--"]
        argv += [host_tool("bash"), "-c", _CLOSE_AND_EXEC, "bash", str(mounts.userns_fd)]
        argv += [host_tool("bwrap"), "--args", str(args_fd), "--", SH, "-c", _INIT_SCRIPT]
        launcher = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(info_w, seccomp_fd, args_fd, *etc_fds.values(), *mounts.fds),
            env=HOST_ENV,
            start_new_session=True,
        )
        os.close(info_w)
        try:
            ready = _read_until(launcher.stdout, b"ready\n", timeout_s=15.0)
            info = _read_json_fd(info_r) if ready else None
            if not ready or info is None:
                launcher.kill()
                error = launcher.stderr.read().decode(errors="replace").strip()
                raise ProviderError(f"The sandbox did not start: {error or 'no output'}")
        finally:
            os.close(info_r)
            launcher.stdout.close()
            launcher.stderr.close()
            launcher.wait()
    record = init_record(pid=info["child-pid"], extra={"network": network, "uid": uid, "gid": gid})
    if network:
        record["slirp_pid"] = _start_slirp(pid=record["pid"], cgroups=cgroups)
    return record


def ensure_layers(*, layers: Path, merged: Path) -> None:
    """The overlay's dirs under `layers` (the sandbox dir, or the root of its disk): `lower`
    is the empty lower layer of a sandbox without a base (a base's cache is handed over by fd
    instead), `work` overlayfs's own; `merged` is where host-side git mounts the overlay."""
    lower = layers / "lower"
    if lower.is_symlink():
        lower.unlink()
    for layer in (lower, layers / "upper", layers / "work", merged):
        layer.mkdir(mode=0o755, exist_ok=True)


# Host-side git on a base layer: the overlay in a throwaway mount namespace (nothing is mounted
# on the host, and the mount disappears with the namespace, even on a crash), then the rest.
_MOUNT_OVERLAY = 'mount -t overlay overlay -o "$1" "$2" || exit 125; shift 2; exec "$@"'


def in_overlay_namespace(
    *, paths: SandboxPaths, layers: Path, lower: Path, argv: list[str]
) -> list[str]:
    """argv run as host root with the sandbox's overlay over `lower` mounted at paths.merged."""
    ensure_layers(layers=layers, merged=paths.merged)
    for path in (lower, layers):
        if any(ch in str(path) for ch in ",:\\"):
            raise ProviderError(f"Paths with ',', ':' or '\\' cannot be overlay layers: {path}")
    options = f"lowerdir={lower},upperdir={layers}/upper,workdir={layers}/work,{_OVERLAY_FLAGS}"
    return [
        host_tool("unshare"),
        "--mount",
        "--propagation",
        "private",
        "--",
        SH,
        "-c",
        _MOUNT_OVERLAY,
        "sh",
        options,
        str(paths.merged),
        *argv,
    ]


def _read_until(stream, marker: bytes, *, timeout_s: float) -> bool:
    data = b""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        while marker not in data:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not sel.select(timeout=remaining):
                return False
            chunk = os.read(stream.fileno(), 4096)
            if not chunk:
                return False
            data += chunk
    return True


def _read_json_fd(fd: int) -> dict | None:
    # bwrap writes the info before the sandbox's command runs, so after "ready" it is all there.
    os.set_blocking(fd, False)
    data = b""
    try:
        while chunk := os.read(fd, 4096):
            data += chunk
    except BlockingIOError:
        pass
    try:
        return json.loads(data)
    except ValueError:
        return None


def _start_slirp(*, pid: int, cgroups: SandboxCgroups | None) -> int:
    """Outbound network through slirp4netns; host loopback stays unreachable."""
    ready_r, ready_w = os.pipe()
    procs = cgroups.init_procs_files() if cgroups else []
    argv = [
        SH,
        "-c",
        _JOIN_AND_DETACH,
        "sh",
        *map(str, procs),
        "--",
        host_tool("slirp4netns"),
        "--configure",
        "--mtu=65520",
        "--disable-host-loopback",
        f"--ready-fd={ready_w}",
        str(pid),
        "tap0",
    ]
    launcher = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        pass_fds=(ready_w,),
        env=HOST_ENV,
        start_new_session=True,
    )
    os.close(ready_w)
    launcher.wait()
    with os.fdopen(ready_r, "rb") as ready:
        if not _read_until(ready, b"1", timeout_s=10.0):
            raise ProviderError("slirp4netns did not come up for the sandbox network")
    return _find_slirp_pid(target=pid)


def _find_slirp_pid(*, target: int) -> int:
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline[0] == host_tool("slirp4netns").encode() and str(target).encode() in cmdline:
            return int(proc.name)
    raise ProviderError("slirp4netns exited right after starting")


def stop_init(*, record: dict | None, cgroups: SandboxCgroups | None) -> None:
    """Kill the init (its PID namespace dies with it), the network helper and any stragglers."""
    if record is not None:
        for key in ("pid", "slirp_pid"):
            if record.get(key):
                try:
                    os.kill(record[key], signal.SIGKILL)
                except ProcessLookupError:
                    pass
        _wait_gone(record["pid"])
    if cgroups is not None:
        cgroups.kill_all_and_remove()


def _wait_gone(pid: int, *, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while process_start_time(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.005)


# Per process: which network modes passed the isolation check (a cache, not sandbox state).
_ISOLATION_CHECKED: set[bool] = set()


def start_placeholder() -> dict:
    """SANDBOX_ISOLATION=none: a detached sleeper stands in for the init, so status works."""
    proc = subprocess.Popen(
        [host_tool("sleep"), "infinity"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=HOST_ENV,
        start_new_session=True,
    )
    return init_record(pid=proc.pid, extra={"isolation": "none"})


def check_isolation(*, network: bool) -> None:
    """Fail loudly, naming the fix, when bubblewrap cannot build a sandbox here."""
    if network in _ISOLATION_CHECKED:
        return
    for tool, package in (
        ("bwrap", "bubblewrap"),
        ("nsenter", "util-linux"),
        ("unshare", "util-linux"),
        ("setpriv", "util-linux"),
        ("prlimit", "util-linux"),
        ("git", "git"),
        ("tar", "tar"),
    ):
        if shutil.which(tool, path=HOST_PATH) is None:
            raise ProviderError(f"{tool} is missing: apt-get install {package}")
    if not os.path.isdir(STAGE):
        raise ProviderError(f"{STAGE} is missing: sandboxes stage their workspace mount on it")
    check_pool()
    if network and shutil.which("slirp4netns", path=HOST_PATH) is None:
        raise ProviderError("SANDBOX_NETWORK=on needs slirp4netns: apt-get install slirp4netns")
    probe = subprocess.run(
        [host_tool("bwrap"), "--unshare-all", "--ro-bind", "/usr", "/usr"]
        + [
            "--symlink",
            "usr/bin",
            "/bin",
            "--symlink",
            "usr/lib",
            "/lib",
            "--symlink",
            "usr/lib64",
            "/lib64",
            "--",
            "/bin/true",
        ],
        capture_output=True,
        env=HOST_ENV,
    )
    if probe.returncode != 0:
        raise ProviderError(
            "bubblewrap cannot create namespaces here "
            f"({probe.stderr.decode(errors='replace').strip()}): run the service as root or "
            "enable user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
            "user.max_user_namespaces > 0)"
        )
    _ISOLATION_CHECKED.add(network)
