"""A detached command's supervisor: a process of its own that runs one command in a sandbox and
outlives whoever started it (the request, the web process).

Started by local_detached.start_supervisor as `python -E -s -m <this module> SPEC_FD`, in a
session of its own, stdin and stdout on /dev/null, with HOST_ENV. Everything is prepared for it
(the chain's argv from command_argv, the script memfd, the seccomp filter, the fds of the
sandbox's namespaces, the cgroup run, the locked marker, the open log), so it needs neither
Django's setup nor the database: it connects to the bus, starts the chain, pumps its output into
the log (waking readers on the bus after each append), kills the tree on timeout or on SIGTERM
(a kill request), writes the exit record, frees the account's command slot and wakes readers
once more. It runs nothing a client sent: the client's argv, env and cwd are only in the
script that the sandbox's final shell reads.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import sys
import time
from pathlib import Path

from sandboxes_app.providers.local_cgroups import CgroupBackend
from sandboxes_app.providers.local_commands import (
    STDERR,
    STDOUT,
    exit_status,
    kill_tree,
    pump,
    spawn_chain,
)
from sandboxes_app.providers.local_detached import log_append
from sandboxes_app.providers.local_layout import process_start_time, write_json

_SLOW_PUBLISH = 0.5
_QUIET_SECONDS = 5.0


def main(spec_fd: int) -> None:
    with os.fdopen(spec_fd, "rb") as spec_file:
        spec = json.loads(spec_file.read())
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGTERM, lambda *_: None)  # the wake-up fd tells the pump
    # Blocked by our starter until now; the chain must not inherit the block either.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    Supervisor(spec, wake_fd=wake_r).run()


class Supervisor:
    def __init__(self, spec: dict, *, wake_fd: int) -> None:
        self.spec = spec
        self.wake_fd = wake_fd
        self.log_fd = spec["log_fd"]
        self.cap = spec["log_cap"]
        self.written = 0  # bytes of output in the log, framing aside
        self.offset = 0  # the log's size
        self.truncated = False
        self.killed = False
        self.held = {STDOUT: b"", STDERR: b""}  # an incomplete UTF-8 character, per stream
        self.publish = _publisher(spec["hooks"])
        self.quiet_until = 0.0
        cgroups = spec["cgroups"]
        self.cgroups = (
            CgroupBackend(
                kind=cgroups["kind"],
                v2_root=cgroups["v2_root"],
                controllers=frozenset(cgroups["controllers"]),
            ).for_sandbox(cgroups["key"])
            if cgroups
            else None
        )

    def run(self) -> None:
        spec = self.spec
        started = time.monotonic()
        kill = functools.partial(kill_tree, cgroups=self.cgroups, run_id=spec["run_id"])
        try:
            # Killed, or its sandbox stopped, while we were starting: it never runs.
            if self.kill_requested() or not self.init_alive():
                self.finish(code=None, timed_out=False)
                return
            proc = spawn_chain(
                argv=spec["argv"], script_fd=spec["script_fd"], pass_fds=tuple(spec["pass_fds"])
            )
        except OSError:
            self.finish(code=None, timed_out=False)
            raise
        finally:
            # The chain holds what it needs; we keep no fd of the sandbox's namespaces or root.
            for fd in (spec["script_fd"], *spec["pass_fds"]):
                os.close(fd)

        def on_wake() -> None:
            with contextlib.suppress(BlockingIOError):
                while os.read(self.wake_fd, 64):
                    pass
            if not self.killed and proc.poll() is None:
                self.killed = True
                kill(proc)

        timed_out = False
        try:
            timed_out = pump(
                proc,
                deadline=started + spec["timeout_s"],
                sink=self.append,
                kill_tree=kill,
                wake_fd=self.wake_fd,
                on_wake=on_wake,
            )
        finally:
            if proc.poll() is None:
                kill(proc)
            proc.wait()
            for stream in (STDOUT, STDERR):
                self.flush(stream)
            self.finish(code=proc.returncode, timed_out=timed_out)

    # -- output ------------------------------------------------------------------------------

    def append(self, stream: int, chunk: bytes) -> None:
        data = self.held[stream] + chunk
        keep = _utf8_complete(data)
        self.held[stream] = data[keep:]
        self.write(stream, data[:keep])

    def flush(self, stream: int) -> None:
        data, self.held[stream] = self.held[stream], b""
        self.write(stream, data)

    def write(self, stream: int, data: bytes) -> None:
        if not data or self.truncated:
            return  # past the cap we keep draining the pipes, so the command never blocks
        room = self.cap - self.written
        if len(data) > room:
            data = data[:room]
            self.truncated = True
        if data:
            tag = b"o" if stream == STDOUT else b"e"
            self.offset += log_append(self.log_fd, stream=tag, data=data)
            self.written += len(data)
        if self.truncated:
            self.offset += log_append(self.log_fd, stream=b"t", data=b"")
        self.notify()

    def notify(self, **extra: object) -> None:
        now = time.monotonic()
        if self.publish is None or (now < self.quiet_until and not extra):
            return
        self.publish({"offset": self.offset, **extra})
        if time.monotonic() - now > _SLOW_PUBLISH:
            # The bus is unwell (a publish waits out its timeouts, up to seconds): the pump,
            # and so the command, must not wait on it. Readers meanwhile find the new records
            # at their next keep-alive.
            self.quiet_until = time.monotonic() + _QUIET_SECONDS

    # -- the end -----------------------------------------------------------------------------

    def finish(self, *, code: int | None, timed_out: bool) -> None:
        """Record the exit, let go of the marker, free the slot, wake readers: in that order,
        so whoever sees the marker free finds the exit, and whoever sees the exit has the
        whole log (and frees the slot too, should we die before we do)."""
        spec = self.spec
        killed = self.killed
        if code is None or (not timed_out and not killed and code < 0 and not self.init_alive()):
            killed = True  # never started, or died with its sandbox (stopped, hibernated)
        exit_code = None if timed_out or killed else exit_status(code)
        record = {
            "exitCode": exit_code,
            "finishedAt": time.time(),
            "timedOut": timed_out,
            "killed": killed,
            "truncated": self.truncated,
        }
        # Gone with its sandbox's directory, the record is not needed: readers record the
        # command killed when they find neither it nor a live supervisor.
        with contextlib.suppress(OSError):
            write_json(Path(spec["exit"]), record)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(spec["marker"])
        os.close(spec["lock_fd"])
        hooks = spec["hooks"]
        if hooks.get("lease_slot"):
            from sandboxes_app.command_leases import lease_release

            with contextlib.suppress(Exception):  # the lease runs out by itself anyway
                lease_release(
                    account_id=hooks["account_id"],
                    slot=hooks["lease_slot"],
                    redis_url=hooks["redis_url"],
                    data_dir=hooks["data_dir"],
                )
        self.notify(exit=True)
        if self.cgroups is not None:
            self.cgroups.release_run(spec["run_id"])

    def kill_requested(self) -> bool:
        try:
            return bool(os.read(self.wake_fd, 64))
        except BlockingIOError:
            return False

    def init_alive(self) -> bool:
        init = self.spec["init"]
        return init is not None and process_start_time(init["pid"]) == init["start_time"]


def _utf8_complete(data: bytes) -> int:
    """How much of `data` to write now: all of it but an incomplete UTF-8 character at its
    end (up to 3 bytes), which waits for the rest so a record never splits a character."""
    for back in range(1, min(3, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for the lead
        if byte < 0x80:
            break
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
        return len(data) - back if byte >= 0xC0 and need > back else len(data)
    return len(data)


def _publisher(hooks: dict):
    """What wakes the log's readers: recoup.bus, connected before the command starts (its
    import, with Django's settings module and redis, is most of our 0.2 s start-up), so no
    line the command prints waits for it. Without it readers still find every line, at
    their keep-alive."""
    try:
        from recoup.bus import publish_to
    except Exception:  # noqa: BLE001 - the log is the truth; wake-ups only save latency
        return None
    return functools.partial(
        publish_to, hooks["channel"], redis_url=hooks["redis_url"], data_dir=hooks["data_dir"]
    )


if __name__ == "__main__":
    main(int(sys.argv[1]))
