"""Detached commands end to end: real sandboxes, real supervisors, the log stream read as a
client reads it (Django's test client; tests/sandboxes_app/test_detached_web.py reads one
through `manage.py web`)."""

import json
import os
import signal
import threading
import time

import pytest

from lifecycle.hibernation import session_hibernate
from sandboxes_app.models import Command
from sandboxes_app.providers.base import SandboxStatus, get_provider
from sessions_app.models import Session
from tests.support.api import make_overdue, new_session, run, sh, start_sandbox, wait_state
from tests.support.commands import (
    get_command,
    log_events,
    sse_events,
    start_detached,
    text_of,
    wait_finished,
)
from tests.support.worker import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def session_id(owner, repo_url) -> str:
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    return session_id


@pytest.fixture(params=["redis", "embedded"])
def bus_backend(request, settings) -> str:
    """Both buses: Redis pub/sub, and the embedded default's Unix datagram sockets."""
    if request.param == "embedded":
        settings.REDIS_URL = ""
    elif not settings.REDIS_URL:
        pytest.fail("the suite runs with REDIS_URL set (scripts/test sets it)")
    return request.param


def test_a_line_reaches_a_log_reader_while_the_command_still_runs(owner, session_id, bus_backend):
    started = time.monotonic()
    command_id = start_detached(owner, session_id, "echo one; sleep 2; echo two")
    assert time.monotonic() - started < 1.5  # answered at once, not after the command

    response = owner.client.get(
        f"/api/sandbox/commands/{command_id}/logs", {"sessionId": session_id}
    )
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    events = sse_events(response.streaming_content)
    try:
        first = next(event for event in events if event is not None)
        running = get_command(owner, command_id, sessionId=session_id).json()
        seen_at = time.monotonic() - started
        rest = [event for event in events if event is not None]
    finally:
        response.close()

    assert (first.event, first.data) == ("stdout", {"stream": "stdout", "data": "one\n"})
    assert running["exitCode"] is None and running["finishedAt"] is None
    assert seen_at < 1.8, seen_at
    assert [(e.event, e.data.get("data")) for e in rest[:-1]] == [("stdout", "two\n")]
    assert rest[-1].event == "exit"
    assert rest[-1].data["exitCode"] == 0 and rest[-1].data["finishedAt"] is not None
    # "two" and the exit came by the bus, not at the next keep-alive (15 s).
    assert 2 <= time.monotonic() - started < 6


def test_the_command_object_reports_the_exit(owner, session_id):
    command_id = start_detached(owner, session_id, "exit 3", timeoutMs=20_000)

    body = wait_finished(owner, session_id, command_id)

    assert body["commandId"] == command_id
    assert (body["cmd"], body["args"]) == ("sh", ["-c", "exit 3"])
    assert body["exitCode"] == 3
    assert body["timedOut"] is False and body["killed"] is False
    assert body["startedAt"] <= body["finishedAt"]
    row = Command.objects.get(id=command_id)
    assert (row.exit_code, row.timeout_ms, row.session_id) == (3, 20_000, session_id)


def test_stdout_and_stderr_stay_apart_and_a_late_reader_gets_the_whole_log(owner, session_id):
    command_id = start_detached(owner, session_id, "echo out1; echo err1 >&2; echo out2; exit 1")
    wait_finished(owner, session_id, command_id)

    events = log_events(owner, command_id, sessionId=session_id)

    assert text_of(events, "stdout") == "out1\nout2\n"
    assert text_of(events, "stderr") == "err1\n"
    for event in events[:-1]:
        assert event.data["stream"] == event.event
    assert events[-1].event == "exit" and events[-1].data["exitCode"] == 1
    ids = [event.id for event in events[:-1]]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_last_event_id_resumes_with_exactly_the_rest(owner, session_id):
    script = "for i in $(seq 1 20); do echo line$i; sleep 0.02; done"
    command_id = start_detached(owner, session_id, script)
    wait_finished(owner, session_id, command_id)
    whole = log_events(owner, command_id, sessionId=session_id)
    records = whole[:-1]
    cut = records[len(records) // 2]

    by_header = log_events(
        owner, command_id, headers={"Last-Event-ID": str(cut.id)}, sessionId=session_id
    )
    by_query = log_events(owner, command_id, sessionId=session_id, lastEventId=str(cut.id))

    expected = [(e.id, e.data) for e in records if e.id > cut.id]
    assert [(e.id, e.data) for e in by_header[:-1]] == expected
    assert [(e.id, e.data) for e in by_query[:-1]] == expected
    assert by_header[-1].event == by_query[-1].event == "exit"
    assert text_of(whole, "stdout") == "".join(f"line{i}\n" for i in range(1, 21))


@pytest.mark.parametrize("bad", ["3", "abc", "-1", "99999999"])
def test_a_last_event_id_the_log_never_sent_is_a_400(owner, session_id, bad):
    command_id = start_detached(owner, session_id, "echo hello; echo world")
    wait_finished(owner, session_id, command_id)

    response = owner.client.get(
        f"/api/sandbox/commands/{command_id}/logs",
        {"sessionId": session_id},
        headers={"Last-Event-ID": bad},
    )

    assert response.status_code == 400
    assert response.json()["status"] == "error"
    assert "Last-Event-ID" in response.json()["error"]


def test_the_ndjson_form_has_one_object_a_line_and_the_exit_last(owner, session_id):
    command_id = start_detached(owner, session_id, "echo a; echo b >&2; exit 4")
    wait_finished(owner, session_id, command_id)

    response = owner.client.get(
        f"/api/sandbox/commands/{command_id}/logs",
        {"sessionId": session_id},
        headers={"Accept": "application/x-ndjson"},
    )
    body = b"".join(response.streaming_content).decode()
    response.close()

    assert response["Content-Type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in body.splitlines() if line]
    assert {(line["stream"], line["data"]) for line in lines[:-1]} == {
        ("stdout", "a\n"),
        ("stderr", "b\n"),
    }
    assert lines[-1]["exitCode"] == 4 and lines[-1]["finishedAt"] is not None
    resumed = owner.client.get(
        f"/api/sandbox/commands/{command_id}/logs",
        {"sessionId": session_id, "lastEventId": str(lines[0]["offset"])},
        headers={"Accept": "application/x-ndjson"},
    )
    rest = [json.loads(line) for line in b"".join(resumed.streaming_content).splitlines() if line]
    resumed.close()
    assert rest == lines[1:]


def test_output_that_is_not_utf8_is_served_replaced_and_characters_are_never_split(
    owner, session_id
):
    # é is \303\251: written in two pieces, 0.3 s apart.
    script = r"printf 'bin\377\376\n'; printf 'caf\303'; sleep 0.3; printf '\251\n'"
    command_id = start_detached(owner, session_id, script)
    wait_finished(owner, session_id, command_id)

    events = log_events(owner, command_id, sessionId=session_id)

    assert text_of(events, "stdout") == "bin\ufffd\ufffd\ncafé\n"


def test_kill_ends_the_whole_tree_at_once_and_the_stream_ends_with_the_exit(owner, session_id):
    command_id = start_detached(owner, session_id, "sleep 100 & sleep 100 & echo up; wait")
    streamed: list = []
    response = owner.client.get(
        f"/api/sandbox/commands/{command_id}/logs", {"sessionId": session_id}
    )

    def read() -> None:
        streamed.extend(e for e in sse_events(response.streaming_content) if e is not None)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        wait_for(lambda: streamed, timeout=10, message="no output before the kill")
        started = time.monotonic()
        killed = owner.client.post(
            f"/api/sandbox/commands/{command_id}/kill", {"sessionId": session_id}, format="json"
        )
        took = time.monotonic() - started
        reader.join(timeout=10)
    finally:
        response.close()

    assert killed.status_code == 200, killed.content
    body = killed.json()
    assert body["killed"] is True and body["exitCode"] is None and body["finishedAt"]
    assert took < 2, took
    assert not reader.is_alive()
    assert streamed[0].data["data"] == "up\n"
    assert streamed[-1].event == "exit" and streamed[-1].data["killed"] is True
    # Nothing of the tree is left in the sandbox.
    left = sh(owner, session_id, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
    assert "sleep 100" not in left["stdout"], left["stdout"]
    again = owner.client.post(
        f"/api/sandbox/commands/{command_id}/kill", {"sessionId": session_id}, format="json"
    )
    assert again.status_code == 200 and again.json() == body


def test_a_timeout_kills_it_and_is_recorded(owner, session_id):
    started = time.monotonic()
    command_id = start_detached(owner, session_id, "echo begin; sleep 30", timeoutMs=500)

    body = wait_finished(owner, session_id, command_id, timeout=15)

    assert body["timedOut"] is True and body["exitCode"] is None
    assert time.monotonic() - started < 5
    events = log_events(owner, command_id, sessionId=session_id)
    assert text_of(events, "stdout") == "begin\n"
    assert events[-1].data["timedOut"] is True


def test_the_log_keeps_its_head_up_to_the_cap_and_the_command_is_never_blocked(
    owner, session_id, settings
):
    settings.SANDBOX_COMMAND_LOG_BYTES = 2048
    # 1 MB through a 64 KB pipe: it ends only if the supervisor keeps draining past the cap.
    script = "head -c 1000000 /dev/zero | tr '\\0' a; echo after >&2; exit 0"
    command_id = start_detached(owner, session_id, script)

    body = wait_finished(owner, session_id, command_id, timeout=30)
    events = log_events(owner, command_id, sessionId=session_id)

    assert body["exitCode"] == 0
    assert text_of(events, "stdout") == "a" * 2048
    assert text_of(events, "stderr") == ""
    assert [e.event for e in events].count("truncated") == 1
    assert events[-2].event == "truncated" and events[-1].event == "exit"


def test_a_detached_command_holds_its_command_slot_until_it_ends(owner, session_id, settings):
    settings.SANDBOX_MAX_COMMANDS_PER_ACCOUNT = 1
    command_id = start_detached(owner, session_id, "sleep 60")

    refused = owner.client.post(
        "/api/sandbox/commands",
        {"sessionId": session_id, "cmd": "true", "detached": True},
        format="json",
    )
    assert refused.status_code == 429 and refused["Retry-After"] == "2"
    assert run(owner, session_id, "true").status_code == 429
    assert Command.objects.count() == 1  # the refused one created nothing

    owner.client.post(
        f"/api/sandbox/commands/{command_id}/kill", {"sessionId": session_id}, format="json"
    )
    assert run(owner, session_id, "true").status_code == 200


def test_a_finished_command_frees_its_slot_without_anybody_reading_it(owner, session_id, settings):
    settings.SANDBOX_MAX_COMMANDS_PER_ACCOUNT = 1
    start_detached(owner, session_id, "sleep 0.5")
    assert run(owner, session_id, "true").status_code == 429

    wait_for(lambda: run(owner, session_id, "true").status_code == 200, timeout=10)


@pytest.mark.parametrize(
    "extra, needle",
    [
        ({"detached": "yes"}, "detached"),
        ({"detached": 1}, "detached"),
        ({"timeoutMs": 10_000_000}, "timeoutMs"),
        ({"env": {"1BAD": "x"}}, "env"),
        ({"cmd": 7}, "cmd"),
    ],
)
def test_a_bad_detached_request_is_a_400_and_starts_nothing(owner, session_id, extra, needle):
    body = {"sessionId": session_id, "cmd": "true", "detached": True, **extra}
    response = owner.client.post("/api/sandbox/commands", body, format="json")

    assert response.status_code == 400, response.content
    assert needle in response.json()["error"]
    assert not Command.objects.exists()


def test_without_an_active_sandbox_it_is_a_409(owner):
    session_id = new_session(owner)
    response = owner.client.post(
        "/api/sandbox/commands",
        {"sessionId": session_id, "cmd": "true", "detached": True},
        format="json",
    )
    assert response.status_code == 409
    assert not Command.objects.exists()


def test_a_oneshot_sandbox_runs_detached_commands_by_its_id(owner, repo_url):
    created = owner.client.post("/api/sandbox", {"repoUrl": repo_url}, format="json")
    sandbox_id = created.json()["sandboxId"]
    started = owner.client.post(
        "/api/sandbox/commands",
        {"sandboxId": sandbox_id, "cmd": "cat", "args": ["README.md"], "detached": True},
        format="json",
    )
    assert started.status_code == 202, started.content
    command_id = started.json()["commandId"]

    body = wait_for(
        lambda: (
            get_command(owner, command_id, sandboxId=sandbox_id).json()["finishedAt"]
            and get_command(owner, command_id, sandboxId=sandbox_id).json()
        ),
        timeout=20,
    )
    events = log_events(owner, command_id, sandboxId=sandbox_id)

    assert body["exitCode"] == 0
    assert text_of(events, "stdout") == "# app\n"
    assert get_command(owner, command_id, sessionId=new_session(owner)).status_code == 404


def test_a_supervisor_that_dies_without_a_record_leaves_its_command_recorded_killed(
    owner, session_id, settings
):
    command_id = start_detached(owner, session_id, "sleep 100")
    runs = settings.SANDBOX_ROOT / f"sbx_{session_id}" / "runs"
    meta = wait_for(lambda: json.loads((runs / f"{command_id}.json").read_text()), timeout=10)
    os.kill(meta["pid"], signal.SIGKILL)
    wait_for(lambda: _zombie(meta["pid"]), timeout=10)

    body = get_command(owner, command_id, sessionId=session_id).json()

    assert body["killed"] is True and body["exitCode"] is None and body["finishedAt"]
    left = sh(owner, session_id, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
    assert "sleep 100" not in left["stdout"]


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_hibernation_records_each_command_as_it_ended_or_killed_with_its_sandbox(
    owner, session_id, worker
):
    name = f"sbx_{session_id}"
    ended = start_detached(owner, session_id, "echo done; exit 7")
    running = start_detached(owner, session_id, "sleep 100")
    # Ended on the host, never looked at: only its supervisor's record knows how.
    wait_for(lambda: get_provider().detached_status(name=name, command_id=ended).exit, timeout=10)
    assert Command.objects.get(id=ended).finished_at is None

    hibernating = owner.client.post(
        "/api/sandbox/hibernate", {"sessionId": session_id}, format="json"
    )
    assert hibernating.status_code == 202
    wait_state(session_id, "hibernated", worker)

    assert get_provider().status(name=name) == SandboxStatus.ABSENT
    finished = Command.objects.get(id=ended)
    assert (finished.exit_code, finished.killed) == (7, False)
    killed = get_command(owner, running, sessionId=session_id).json()
    assert killed["killed"] is True and killed["exitCode"] is None and killed["finishedAt"]
    # The log went with the sandbox's directory; its stream still ends with the exit.
    events = log_events(owner, ended, sessionId=session_id)
    assert [e.event for e in events] == ["exit"] and events[0].data["exitCode"] == 7


def test_a_running_detached_command_keeps_its_sandbox_from_idle_hibernation(owner, session_id):
    command_id = start_detached(owner, session_id, "sleep 60")
    make_overdue(session_id, "hibernate_after")

    idle = {"session_id": session_id, "actor": "t", "reason": "idle", "require_idle": True}
    assert session_hibernate(**idle) is None
    assert Session.objects.get(id=session_id).lifecycle_state == "active"

    owner.client.post(
        f"/api/sandbox/commands/{command_id}/kill", {"sessionId": session_id}, format="json"
    )
    name = f"sbx_{session_id}"
    wait_for(lambda: get_provider().running_commands(name=name) == 0, timeout=5)
    make_overdue(session_id, "hibernate_after")
    done = session_hibernate(**idle)
    assert done is not None and done.lifecycle_state == "hibernated"


def test_a_kill_right_after_the_start_is_never_lost(owner, session_id):
    command_id = start_detached(owner, session_id, "sleep 100")
    killed = owner.client.post(
        f"/api/sandbox/commands/{command_id}/kill", {"sessionId": session_id}, format="json"
    )

    body = killed.json()
    assert body["killed"] is True and body["finishedAt"] is not None, body
    left = sh(owner, session_id, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
    assert "sleep 100" not in left["stdout"]


def test_a_quiet_stream_sends_keep_alives_ends_at_its_deadline_and_resumes(
    owner, session_id, settings
):
    settings.STREAM_KEEPALIVE_SECONDS = 1
    settings.STREAM_MAX_SECONDS = 3
    command_id = start_detached(owner, session_id, "echo a; sleep 5; echo b")
    response = owner.client.get(
        f"/api/sandbox/commands/{command_id}/logs", {"sessionId": session_id}
    )
    started = time.monotonic()
    try:
        first = list(sse_events(response.streaming_content))
    finally:
        response.close()
    ended_after = time.monotonic() - started

    records = [e for e in first if e is not None]
    assert [e.data["data"] for e in records] == ["a\n"]  # no exit: the command still runs
    assert first.count(None) >= 1
    assert 2.5 < ended_after < 5, ended_after
    rest = log_events(
        owner, command_id, headers={"Last-Event-ID": str(records[-1].id)}, sessionId=session_id
    )
    assert [e.event for e in rest] == ["stdout", "exit"] and rest[0].data["data"] == "b\n"


def test_destroying_a_oneshot_sandbox_records_its_running_command_killed(owner, repo_url):
    sandbox_id = owner.client.post("/api/sandbox", {"repoUrl": repo_url}, format="json").json()[
        "sandboxId"
    ]
    started = owner.client.post(
        "/api/sandbox/commands",
        {"sandboxId": sandbox_id, "cmd": "sleep", "args": ["100"], "detached": True},
        format="json",
    )
    command_id = started.json()["commandId"]

    destroyed = owner.client.post("/api/sandbox/destroy", {"sandboxId": sandbox_id}, format="json")

    assert destroyed.status_code == 200
    row = Command.objects.get(id=command_id)  # recorded by the destroy itself, nobody asked
    assert (row.killed, row.exit_code) == (True, None), (row.exit_code, row.timed_out)
    assert row.finished_at is not None
    body = get_command(owner, command_id, sandboxId=sandbox_id).json()
    assert body["killed"] is True and body["exitCode"] is None
