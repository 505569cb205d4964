"""The local provider's detached commands below the API: the log's framing, its files on the
host, and a supervisor that never lets the command wait on a bus that does not answer."""

import os
import secrets
import socket
import stat
import time
import uuid
from pathlib import Path

import pytest

from sandboxes_app.providers.base import DetachedHooks, ProviderError
from sandboxes_app.providers.local_detached import DetachedFiles, log_append, log_boundary, log_read
from tests.support.worker import wait_for


@pytest.fixture
def sandbox(provider, source, new_name) -> str:
    name = new_name()
    provider.create(name=name, source=source)
    return name


def _hooks(settings, **extra) -> DetachedHooks:
    return DetachedHooks(
        channel="command:test",
        redis_url=extra.get("redis_url", settings.REDIS_URL),
        data_dir=str(settings.DATA_DIR),
        account_id=str(uuid.uuid4()),
    )


def _start(provider, sandbox, hooks, script: str) -> str:
    command_id = "cmd_" + secrets.token_hex(16)
    provider.start_detached(
        name=sandbox,
        command_id=command_id,
        argv=["sh", "-c", script],
        cwd=None,
        env=None,
        timeout_s=60,
        hooks=hooks,
    )
    return command_id


def test_the_log_frames_any_bytes_and_offsets_are_record_ends(tmp_path):
    path = tmp_path / "x.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    payloads = [(b"o", bytes(range(256))), (b"e", b"\n\x00\xff"), (b"t", b"")]
    for stream, data in payloads:
        log_append(fd, stream=stream, data=data)
    with open(path, "ab") as torn:
        torn.write(b"o\x00\x00\x00\x09par")  # a record still being written
    os.close(fd)

    records = log_read(path, offset=0, max_bytes=1 << 20)

    assert [(r.stream, r.data) for r in records] == [
        ("stdout", bytes(range(256))),
        ("stderr", b"\n\x00\xff"),
        ("truncated", b""),
    ]
    ends = [r.end for r in records]
    assert all(log_boundary(path, offset=end) for end in [0, *ends])
    assert not log_boundary(path, offset=ends[0] - 1)
    assert not log_boundary(path, offset=ends[-1] + 3)
    assert log_read(path, offset=ends[0], max_bytes=1) == records[1:2]  # one whole record
    assert log_read(path, offset=ends[-1], max_bytes=1 << 20) == []


def test_a_command_id_is_never_a_path():
    for bad in ("../../etc/passwd", "cmd_x", "cmd_" + "0" * 31 + "/"):
        with pytest.raises(ProviderError):
            DetachedFiles(runs=Path("/tmp"), command_id=bad)


def test_its_files_are_root_only_and_its_marker_counts_as_a_running_command(
    provider, sandbox, sandbox_root, settings
):
    command_id = _start(provider, sandbox, _hooks(settings), "echo x; sleep 30")
    runs = sandbox_root / sandbox / "runs"
    wait_for(lambda: provider.running_commands(name=sandbox) == 1, timeout=10)

    for suffix in (".log", ".json", ".run"):
        mode = (runs / f"{command_id}{suffix}").stat().st_mode
        assert stat.S_IMODE(mode) == 0o600, (suffix, oct(mode))
    assert provider.detached_kill(name=sandbox, command_id=command_id) is True
    wait_for(lambda: provider.running_commands(name=sandbox) == 0, timeout=10)
    assert stat.S_IMODE((runs / f"{command_id}.exit").stat().st_mode) == 0o600


def test_a_bus_that_does_not_answer_never_holds_the_command_up(provider, sandbox, settings):
    """A Redis that accepts connections and never answers: each publish waits out its 5 s
    timeout, while the command's output waits in the pipe. The supervisor stops publishing
    for a while after one such wait, so the 6 s command's output is all logged soon after it
    ends, not a publish (5 s) after each read (15 s)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        started = time.monotonic()
        command_id = _start(
            provider,
            sandbox,
            _hooks(settings, redis_url=url),
            "for i in $(seq 1 30); do echo $i; sleep 0.2; done",
        )
        done = wait_for(
            lambda: provider.detached_status(name=sandbox, command_id=command_id).exit,
            timeout=40,
        )
        took = time.monotonic() - started

    assert done.exit_code == 0
    assert took < 10, took
    records = provider.detached_log(name=sandbox, command_id=command_id, offset=0)
    assert b"".join(r.data for r in records) == "".join(f"{i}\n" for i in range(1, 31)).encode()


def test_finished_logs_on_the_host_stay_within_four_caps(provider, sandbox, sandbox_root, settings):
    """Logs live outside the sandbox's disk quota: however many commands finish, the host
    keeps at most four caps of their logs, the newest ones, and every exit."""
    provider.log_cap = 1024
    runs = sandbox_root / sandbox / "runs"
    finished = []
    for _ in range(6):
        # 1000 bytes each: four fit in 4 x 1024 with their record headers, a fifth does not.
        command_id = _start(provider, sandbox, _hooks(settings), "head -c 1000 /dev/zero")
        wait_for(lambda c=command_id: (runs / f"{c}.exit").exists(), timeout=20)
        finished.append(command_id)
    last = _start(provider, sandbox, _hooks(settings), "true")  # each start prunes
    # Its supervisor done writing before the fixture deletes the sandbox's directory.
    wait_for(lambda: (runs / f"{last}.exit").exists(), timeout=20)
    wait_for(lambda: provider.running_commands(name=sandbox) == 0, timeout=20)

    logs = [c for c in finished if (runs / f"{c}.log").exists()]
    assert logs == finished[-4:]
    assert all((runs / f"{c}.exit").exists() for c in finished)
