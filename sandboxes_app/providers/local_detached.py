"""Detached commands of a local sandbox, on the host: their files, their log's framing, and
starting, asking after and killing their supervisors (local_supervisor).

Each command has four files in the sandbox's root-only runs directory, named by its id:

    <id>.run    the run marker (local_commands.run_marker), flock-held by the supervisor for
                exactly its life: running_commands counts it, so the sandbox does not
                hibernate while idle, and a free lock means the supervisor is gone
    <id>.log    the output, as framed records (below); appended by the supervisor only
    <id>.exit   how it ended (JSON), written atomically, before the marker is let go
    <id>.json   the supervisor's pid and start time, for a kill

A record is a 5-byte header, the stream (b"o" stdout, b"e" stderr, b"t" the one truncation
marker) and the payload's length (big-endian), then the payload: raw bytes, whatever the
command wrote. So any byte offset a record ends at names a place in the log that a reader
can resume from, binary output included; readers decode text only when they serve it.

The files go with the sandbox's directory (hibernation, destroy); only the newest LOGS_KEPT
logs of finished commands are kept, so a sandbox cannot fill the host's disk through them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sandboxes_app.providers.base import (
    DetachedExit,
    DetachedStatus,
    LogRecord,
    ProviderError,
)
from sandboxes_app.providers.local_layout import process_start_time, read_json, write_json
from sandboxes_app.providers.local_runtime import HOST_ENV, memfd_with

COMMAND_ID = re.compile(r"cmd_[0-9a-f]{32}")
HEADER = struct.Struct(">cI")
STREAMS = {b"o": "stdout", b"e": "stderr", b"t": "truncated"}
LOGS_KEPT = 64
# Finished logs sit on the host's disk, outside the sandbox's disk quota: besides LOGS_KEPT, a
# sandbox keeps at most this many of its cap (log_cap each) of them in all.
LOG_CAPS_KEPT = 4

# The project's root: the supervisor runs as `python -m` from there, so it imports this tree's
# modules whatever the interpreter has installed.
_PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class DetachedFiles:
    runs: Path
    command_id: str

    def __post_init__(self) -> None:
        # The id becomes file names: only ever ours.
        if not COMMAND_ID.fullmatch(self.command_id):
            raise ProviderError(f"Invalid command id {self.command_id!r}")

    def _file(self, suffix: str) -> Path:
        return self.runs / f"{self.command_id}{suffix}"

    @property
    def marker(self) -> Path:
        return self._file(".run")

    @property
    def log(self) -> Path:
        return self._file(".log")

    @property
    def exit(self) -> Path:
        return self._file(".exit")

    @property
    def meta(self) -> Path:
        return self._file(".json")

    @property
    def run_id(self) -> str:
        """The command's own cgroup run (run-<hex>), derivable from its id alone."""
        return self.command_id.removeprefix("cmd_")


# --- the log ------------------------------------------------------------------------------


def log_append(fd: int, *, stream: bytes, data: bytes) -> int:
    """Append one record to the log open at `fd` (O_APPEND); returns its size."""
    record = HEADER.pack(stream, len(data)) + data
    view = memoryview(record)
    while view:
        view = view[os.write(fd, view) :]
    return len(record)


def log_read(path: Path, *, offset: int, max_bytes: int) -> list[LogRecord]:
    """The complete records from `offset` on, about `max_bytes` of them at most (always at
    least one when one is complete). A record still being written waits for the next read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    try:
        data = os.pread(fd, max(max_bytes, HEADER.size), offset)
        if len(data) >= HEADER.size:
            wanted = HEADER.size + HEADER.unpack_from(data)[1]
            if wanted > len(data):  # one record larger than max_bytes: read it whole
                data = os.pread(fd, wanted, offset)
    finally:
        os.close(fd)
    records, at = [], 0
    while at + HEADER.size <= len(data):
        stream, size = HEADER.unpack_from(data, at)
        end = at + HEADER.size + size
        if end > len(data) or stream not in STREAMS:
            break
        records.append(LogRecord(STREAMS[stream], data[at + HEADER.size : end], offset + end))
        at = end
    return records


def log_boundary(path: Path, *, offset: int) -> bool:
    """True when a record of the log ends at `offset` (or it is 0, or the log is gone)."""
    if offset == 0:
        return True
    try:
        with open(path, "rb") as f:
            data = f.read(offset)
    except FileNotFoundError:
        return True
    at = 0
    while at < len(data):
        if at + HEADER.size > len(data):
            return False
        at += HEADER.size + HEADER.unpack_from(data, at)[1]
    return at == offset


# --- status -------------------------------------------------------------------------------


def read_exit(files: DetachedFiles) -> DetachedExit | None:
    try:
        record = read_json(files.exit)
    except ValueError:
        return None  # never half-written (renamed into place); unreadable is not ours
    if record is None:
        return None
    return DetachedExit(
        exit_code=record["exitCode"],
        finished_at=datetime.fromtimestamp(record["finishedAt"], UTC),
        timed_out=record["timedOut"],
        killed=record["killed"],
        truncated=record["truncated"],
    )


def marker_held(files: DetachedFiles) -> bool:
    try:
        fd = os.open(files.marker, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also lets go of the shared lock, if we got it
    return False


def detached_status(files: DetachedFiles) -> DetachedStatus:
    done = read_exit(files)
    if done is not None:
        return DetachedStatus(running=False, exit=done)
    if marker_held(files):
        return DetachedStatus(running=True)
    # The supervisor writes its exit before it lets go of the marker: read it once more.
    return DetachedStatus(running=False, exit=read_exit(files))


# --- starting and killing supervisors -------------------------------------------------------

_children: list[subprocess.Popen] = []
_children_lock = threading.Lock()


def start_supervisor(*, files: DetachedFiles, spec: dict, pass_fds: tuple[int, ...]) -> None:
    """Start the command's supervisor with `spec` (local_supervisor reads it) and the chain's
    fds, and return once it runs: from here on it holds the marker, writes the log and the
    exit. The spec travels in a memfd, never in argv or the environment (it holds the bus's
    address, which may carry a password)."""
    files.runs.mkdir(exist_ok=True)
    prune_logs(files.runs, budget_bytes=LOG_CAPS_KEPT * spec["log_cap"])
    lock_fd = _hold_marker(files)
    try:
        log_fd = os.open(
            files.log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600
        )
    except BaseException:
        _drop_marker(files, lock_fd)
        raise
    try:
        spec = {**spec, "lock_fd": lock_fd, "log_fd": log_fd, "exit": str(files.exit)}
        spec["marker"] = str(files.marker)
        with memfd_with(json.dumps(spec).encode(), name="supervisor") as spec_fd:
            proc = _spawn(spec_fd=spec_fd, pass_fds=(lock_fd, log_fd, *pass_fds))
    except BaseException:
        _drop_marker(files, lock_fd)
        raise
    finally:
        os.close(log_fd)
    # Our copy of the marker's fd goes; the supervisor's keeps the lock held.
    os.close(lock_fd)
    write_json(files.meta, {"pid": proc.pid, "start_time": process_start_time(proc.pid)})


def _spawn(*, spec_fd: int, pass_fds: tuple[int, ...]) -> subprocess.Popen:
    # SIGTERM is how a kill is asked for: blocked until the supervisor has its handler (the
    # mask is inherited), so an early kill waits for it rather than ending it unrecorded.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        proc = subprocess.Popen(
            [sys.executable, "-E", "-s", "-m", "sandboxes_app.providers.local_supervisor"]
            + [str(spec_fd)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=HOST_ENV,
            cwd=_PROJECT_ROOT,
            pass_fds=(spec_fd, *pass_fds),
            # Its own session: the web process's signals and restarts do not reach it.
            start_new_session=True,
        )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    with _children_lock:
        # Reaped as they end, so a long-lived web process keeps no zombies.
        _children[:] = [child for child in _children if child.poll() is None]
        _children.append(proc)
    return proc


def _hold_marker(files: DetachedFiles) -> int:
    """The command's run marker, locked before it gets its counted name (as run_marker)."""
    fd, tmp = tempfile.mkstemp(dir=files.runs, prefix=".new-")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(tmp, files.marker)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return fd


def _drop_marker(files: DetachedFiles, lock_fd: int) -> None:
    for path in (files.marker, files.log):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    os.close(lock_fd)


def prune_logs(runs: Path, *, budget_bytes: int) -> None:
    """Delete the logs of finished commands but the newest LOGS_KEPT that fit in
    `budget_bytes` together; their exits stay."""
    finished = []
    for exit_path in runs.glob("cmd_*.exit"):
        with contextlib.suppress(FileNotFoundError):
            finished.append((exit_path.stat().st_mtime, exit_path.with_suffix(".log")))
    finished.sort(reverse=True)
    kept = total = 0
    for _, log in finished:
        try:
            size = log.stat().st_size
        except FileNotFoundError:
            continue
        if kept < LOGS_KEPT and total + size <= budget_bytes:
            kept, total = kept + 1, total + size
            continue
        with contextlib.suppress(FileNotFoundError):
            log.unlink()


def signal_supervisor(files: DetachedFiles) -> bool:
    """Ask the supervisor to kill its command (SIGTERM); False when it is gone. Through a
    pidfd opened before the start time is checked, so a reused pid is never signalled."""
    try:
        meta = read_json(files.meta)
    except ValueError:
        meta = None
    if not meta or meta.get("start_time") is None:
        return False
    try:
        pidfd = os.pidfd_open(meta["pid"])
    except ProcessLookupError:
        return False
    try:
        if process_start_time(meta["pid"]) != meta["start_time"]:
            return False
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)
    return True
