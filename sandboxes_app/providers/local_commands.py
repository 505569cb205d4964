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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sandboxes_app.providers.base import CommandResult, ProviderError
from sandboxes_app.providers.local_cgroups import SandboxCgroups
from sandboxes_app.providers.local_layout import SandboxPaths
from sandboxes_app.providers.local_runtime import JOIN_AND_EXEC, Limits

WORKSPACE = "/workspace"
_CD_AND_EXEC = 'cd "$1" || exit 125; shift; exec "$@"'


@dataclass(frozen=True)
class Command:
    argv: list[str]
    cwd: str  # absolute, inside /workspace
    env: dict[str, str]
    timeout_s: float
    output_cap: int


def command_argv(
    *, record: dict | None, command: Command, limits: Limits, procs: list[Path], host_cwd: str
) -> list[str]:
    """The host-side argv: join cgroups, set rlimits, enter the sandbox, drop to its user."""
    rlimits = [f"--fsize={limits.max_file_mb * 1024 * 1024}", f"--cpu={limits.cpu_seconds}"]
    if not procs:
        # RLIMIT_NPROC counts every process of the uid on the host, across sandboxes: only a
        # fallback when the pids cgroup is not there to limit each sandbox on its own.
        rlimits.append(f"--nproc={limits.max_processes}")
    argv = ["sh", "-c", JOIN_AND_EXEC, "sh", *map(str, procs), "--", "prlimit", *rlimits, "--"]
    if record is not None:
        argv += ["nsenter", "--target", str(record["pid"]), "--all", "--root", "--wd", "--"]
        argv += [
            "setpriv",
            f"--reuid={record['uid']}",
            f"--regid={record['gid']}",
            "--clear-groups",
            "--no-new-privs",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
        ]
        # cd happens inside, as the sandbox user, so symlinks resolve in the sandbox's view.
        argv += ["/bin/sh", "-c", _CD_AND_EXEC, "sh", command.cwd]
    else:
        argv += ["/bin/sh", "-c", _CD_AND_EXEC, "sh", host_cwd]
    return argv + command.argv


def execute(*, argv: list[str], env: dict[str, str], command: Command, kill_tree) -> CommandResult:
    """Run argv, capture capped output, kill its whole tree on timeout."""
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    deadline = started + command.timeout_s
    try:
        out, err, truncated, timed_out = _collect(
            proc, deadline=deadline, cap=command.output_cap, kill_tree=kill_tree
        )
    finally:
        if proc.poll() is None:
            kill_tree(proc)
        proc.wait()
    code = proc.returncode
    return CommandResult(
        exit_code=None if timed_out else (code if code >= 0 else 128 - code),
        stdout=out.decode("utf-8", errors="replace"),
        stderr=err.decode("utf-8", errors="replace"),
        duration_ms=int((time.monotonic() - started) * 1000),
        timed_out=timed_out,
        truncated=truncated,
    )


def _collect(proc, *, deadline: float, cap: int, kill_tree) -> tuple[bytes, bytes, bool, bool]:
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    truncated = timed_out = False
    exited_at: float | None = None
    # A pidfd turns readable when the command exits, so we notice at once even while a
    # background process it left keeps the pipes open.
    pidfd = os.pidfd_open(proc.pid)
    with selectors.DefaultSelector() as sel:
        sel.register(pidfd, selectors.EVENT_READ)
        for fd in bufs:
            sel.register(fd, selectors.EVENT_READ)
        try:
            while exited_at is None or sel.get_map():
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
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fd)
                        continue
                    buf = bufs[key.fd]
                    room = cap - len(buf)
                    if len(chunk) > room:
                        truncated = True
                    # Past the cap we keep reading (and dropping) so the child never blocks on
                    # a full pipe.
                    if room > 0:
                        buf += chunk[:room]
        finally:
            os.close(pidfd)
    proc.stdout.close()
    proc.stderr.close()
    return bytes(bufs[out_fd]), bytes(bufs[err_fd]), truncated, timed_out


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
        cgroups.kill_run(run_id, spare=proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2)
        if proc.poll() is None:
            proc.kill()
    else:
        # Without cgroups the command's process group is all we can find; a grandchild that
        # called setsid() escapes it (and dies only with the sandbox).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
