"""Running one command in a local sandbox: the host-side argv that enters it, output capture
with caps, whole-tree kills on timeout, cwd confinement, and the in-flight markers that
running_commands counts across processes."""

from __future__ import annotations

import contextlib
import fcntl
import os
import posixpath
import selectors
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sandboxes_app.providers.base import CommandResult, ProviderError, SandboxNotRunning
from sandboxes_app.providers.local_cgroups import SandboxCgroups
from sandboxes_app.providers.local_layout import SandboxPaths, process_start_time
from sandboxes_app.providers.local_runtime import (
    HOST_ENV,
    JOIN_AND_EXEC,
    SH,
    Limits,
    host_tool,
)

WORKSPACE = "/workspace"

# The final, in-sandbox shell sources the command's script from its stdin, a memfd: the
# client's cwd, env and argv reach no process before this one, which runs after privileges
# are dropped. The script gives the command /dev/null as stdin, as before.
LAUNCH = ". /proc/self/fd/0"
# The same, first closing the fds of the sandbox's namespaces that nsenter was handed ("$@"):
# bash, because dash cannot name fds past 9.
CLOSE_AND_LAUNCH = 'for fd in "$@"; do eval "exec $fd<&-"; done; set --; . /proc/self/fd/0'
# What nsenter enters (its option, the init's /proc/<pid>/ns file), each by an fd.
_NAMESPACES = (
    ("user", "user"),
    ("mount", "mnt"),
    ("pid", "pid"),
    ("net", "net"),
    ("ipc", "ipc"),
    ("uts", "uts"),
    ("cgroup", "cgroup"),
)


@dataclass(frozen=True)
class Command:
    argv: list[str]
    cwd: str  # absolute: inside /workspace, or the host path with SANDBOX_ISOLATION=none
    env: dict[str, str]  # the client's variables over our defaults, already validated
    timeout_s: float
    output_cap: int


def command_script(command: Command) -> bytes:
    """The script the in-sandbox shell sources: export, cd, exec.

    Every client string is single-quoted, so the shell takes it as data. Even a quoting
    mistake would only run code as the sandbox user inside the sandbox, where the client's
    command runs anyway.
    """
    lines = [f"export {name}={_quote(value)}" for name, value in command.env.items()]
    lines.append(f"cd {_quote(command.cwd)} || exit 125")
    lines.append("set -- " + " ".join(_quote(arg) for arg in command.argv))
    lines.append('exec "$@" </dev/null')
    return ("\n".join(lines) + "\n").encode()


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


@contextlib.contextmanager
def init_handles(record: dict) -> Iterator[dict[str, int]]:
    """fds of the init's namespaces, root and working directory, opened from its pid and then
    checked to still belong to that init (same start time, so the pid was not reused in
    between): a command can never be sent into another process's namespaces or root."""
    pid = record["pid"]
    fds: dict[str, int] = {}
    try:
        try:
            ours = os.readlink("/proc/self/ns/user")
            for option, ns in _NAMESPACES:
                # setns into one's own user namespace fails; an init started before user
                # namespaces (kept running across an upgrade) shares ours.
                if ns != "user" or os.readlink(f"/proc/{pid}/ns/user") != ours:
                    fds[option] = os.open(f"/proc/{pid}/ns/{ns}", os.O_RDONLY | os.O_CLOEXEC)
            for name, entry in (("root", "root"), ("wd", "cwd")):
                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
                fds[name] = os.open(f"/proc/{pid}/{entry}", flags)
        except OSError as exc:
            raise SandboxNotRunning("The sandbox stopped") from exc
        if process_start_time(pid) != record["start_time"]:
            raise SandboxNotRunning("The sandbox stopped")
        yield fds
    finally:
        for fd in fds.values():
            os.close(fd)


def command_argv(
    *,
    record: dict | None,
    handles: dict[str, int] | None,
    limits: Limits,
    procs: list[Path],
    seccomp_fd: int | None,
) -> list[str]:
    """The host-side argv: join cgroups, set rlimits, enter the sandbox, load the syscall
    filter, drop to the sandbox user, then source the command's script from stdin. `handles`
    (init_handles) name the sandbox's namespaces, root and cwd by fd, never by pid.

    Never allow: a client string in this argv, a relative program name, or an environment
    other than HOST_ENV before setpriv. Each program is an absolute path resolved in a PATH we
    fix, so nothing the sandbox wrote can stand in for it.
    """
    rlimits = [f"--fsize={limits.max_file_mb * 1024 * 1024}", f"--cpu={limits.cpu_seconds}"]
    if not procs:
        # RLIMIT_NPROC counts every process of the uid on the host, across sandboxes: only a
        # fallback when the pids cgroup is not there to limit each sandbox on its own.
        rlimits.append(f"--nproc={limits.max_processes}")
    argv = [SH, "-c", JOIN_AND_EXEC, "sh", *map(str, procs), "--"]
    argv += [host_tool("prlimit"), *rlimits, "--"]
    if record is None or handles is None:
        return argv + [SH, "-c", LAUNCH]
    argv.append(host_tool("nsenter"))
    argv += [f"--{name}=/proc/self/fd/{fd}" for name, fd in handles.items() if name != "wd"]
    argv.append(f"--wd=/proc/self/fd/{handles['wd']}")
    launch = [host_tool("bash"), "-c", CLOSE_AND_LAUNCH, "bash", *map(str, handles.values())]
    # bwrap is only the filter's loader here (the sandbox's /usr is the host's, so the same
    # path names the same binary): one private bind of the sandbox's own root, then the
    # filter, then setpriv. The filter allows setpriv's calls; nothing after it can undo it.
    argv += ["--", host_tool("bwrap"), "--dev-bind", "/", "/", "--seccomp", str(seccomp_fd)]
    argv += [
        "--",
        host_tool("setpriv"),
        f"--reuid={record['uid']}",
        f"--regid={record['gid']}",
        "--clear-groups",
        "--no-new-privs",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
    ]
    return argv + launch


STDOUT, STDERR = 1, 2


def spawn_chain(*, argv: list[str], script_fd: int, pass_fds: tuple[int, ...]) -> subprocess.Popen:
    """Start the host chain (command_argv) with HOST_ENV and nothing else, the script as its
    stdin, its output on two pipes, in a session of its own."""
    return subprocess.Popen(
        argv,
        stdin=script_fd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=HOST_ENV,
        pass_fds=pass_fds,
        start_new_session=True,
    )


def exit_status(returncode: int) -> int:
    """A shell's exit status for a chain's return code: 128 + N when signal N ended it."""
    return returncode if returncode >= 0 else 128 - returncode


def execute(
    *, argv: list[str], script_fd: int, pass_fds: tuple[int, ...], command: Command, kill_tree
) -> CommandResult:
    """Run argv with HOST_ENV and the script as stdin, capture capped output, kill its whole
    tree on timeout."""
    started = time.monotonic()
    proc = spawn_chain(argv=argv, script_fd=script_fd, pass_fds=pass_fds)
    bufs = {STDOUT: bytearray(), STDERR: bytearray()}
    truncated = False

    def keep(stream: int, chunk: bytes) -> None:
        nonlocal truncated
        buf = bufs[stream]
        room = command.output_cap - len(buf)
        if len(chunk) > room:
            truncated = True
        # Past the cap we keep reading (and dropping) so the child never blocks on a full pipe.
        if room > 0:
            buf += chunk[:room]

    try:
        timed_out = pump(proc, deadline=started + command.timeout_s, sink=keep, kill_tree=kill_tree)
    finally:
        if proc.poll() is None:
            kill_tree(proc)
        proc.wait()
    return CommandResult(
        exit_code=None if timed_out else exit_status(proc.returncode),
        stdout=bufs[STDOUT].decode("utf-8", errors="replace"),
        stderr=bufs[STDERR].decode("utf-8", errors="replace"),
        duration_ms=int((time.monotonic() - started) * 1000),
        timed_out=timed_out,
        truncated=truncated,
    )


def pump(
    proc: subprocess.Popen,
    *,
    deadline: float,
    sink: Callable[[int, bytes], None],
    kill_tree: Callable[[subprocess.Popen], None],
    wake_fd: int | None = None,
    on_wake: Callable[[], None] | None = None,
) -> bool:
    """Hand the chain's output to `sink(STDOUT or STDERR, chunk)` as it comes until the chain
    has exited, killing its tree at `deadline`; True when it timed out. `on_wake` runs when
    `wake_fd` turns readable (a detached command's supervisor: a kill was asked for)."""
    streams = {proc.stdout.fileno(): STDOUT, proc.stderr.fileno(): STDERR}
    timed_out = False
    exited_at: float | None = None
    # A pidfd turns readable when the command exits, so we notice at once even while a
    # background process it left keeps the pipes open.
    pidfd = os.pidfd_open(proc.pid)
    with selectors.DefaultSelector() as sel:
        sel.register(pidfd, selectors.EVENT_READ)
        for fd in streams:
            sel.register(fd, selectors.EVENT_READ)
        if wake_fd is not None:
            sel.register(wake_fd, selectors.EVENT_READ)
        try:
            while exited_at is None or any(fd in sel.get_map() for fd in streams):
                now = time.monotonic()
                if not timed_out and now >= deadline:
                    kill_tree(proc)
                    timed_out = True
                # Once the command has exited, take what the pipes already hold and stop:
                # a background process may keep them open forever.
                wait = 0 if exited_at else max(deadline - now, 0) + 0.01
                events = sel.select(timeout=wait)
                if exited_at and (not events or now - exited_at > 0.2):
                    break
                for key, _ in events:
                    if key.fd == pidfd:
                        sel.unregister(pidfd)
                        exited_at = time.monotonic()
                        continue
                    if key.fd == wake_fd:
                        on_wake()
                        continue
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fd)
                        continue
                    sink(streams[key.fd], chunk)
        finally:
            os.close(pidfd)
    proc.stdout.close()
    proc.stderr.close()
    return timed_out


def resolve_cwd(cwd: str | None) -> str:
    """The absolute in-sandbox cwd; anything resolving outside /workspace is refused."""
    if cwd is None or cwd == "":
        return WORKSPACE
    if not isinstance(cwd, str) or "\0" in cwd:
        raise ProviderError("cwd must be a string")
    path = posixpath.normpath(cwd if cwd.startswith("/") else f"{WORKSPACE}/{cwd}")
    if path != WORKSPACE and not path.startswith(WORKSPACE + "/"):
        raise ProviderError(f"cwd {cwd!r} is outside {WORKSPACE}")
    return path


@contextlib.contextmanager
def run_marker(paths: SandboxPaths) -> Iterator[None]:
    """A file locked for as long as this run lasts; running_commands counts the locked ones.

    Locked before it gets its counted name, so no counter ever sees it unlocked while alive.
    """
    paths.runs.mkdir(exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=paths.runs, prefix=".new-")
    marker = paths.runs / f"{uuid.uuid4().hex}.run"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(tmp, marker)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            marker.unlink()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        os.close(fd)


def kill_tree(proc: subprocess.Popen, *, cgroups: SandboxCgroups | None, run_id: str) -> None:
    if cgroups is not None:
        # The chain may not have joined its cgroups yet (a timeout of a few ms), or may fork
        # after a sweep: sweep until the spared host-side process has exited, which it does
        # as soon as its child is gone. Only if it never does is it killed itself.
        deadline = time.monotonic() + 2
        while proc.poll() is None and time.monotonic() < deadline:
            cgroups.kill_run(run_id, spare=proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.005)
        if proc.poll() is None:
            proc.kill()
    else:
        # Without cgroups the command's process group is all we can find; a grandchild that
        # called setsid() escapes it (and dies only with the sandbox).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
