"""A detached command's log through the production web entry (`manage.py web`, gunicorn):
bytes reach the client as the command writes them, the command outlives the web process, and
a client that reconnects to a new one with Last-Event-ID gets exactly the rest."""

import time

import pytest
import requests

from tests.recoup.test_web_entry import start_web
from tests.support.api import new_session, start_sandbox
from tests.support.commands import Event, sse_events

LINES = 30


def _events(response: requests.Response):
    return (e for e in sse_events(response.iter_content(chunk_size=None)) if e is not None)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_log_streams_through_gunicorn_and_outlives_a_web_restart(owner, repo_url, settings):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    headers = {"x-api-key": owner.raw_key}
    logs_params = {"sessionId": session_id}
    script = f"for i in $(seq 1 {LINES}); do echo line$i; sleep 0.1; done"

    web, base = start_web(settings)
    try:
        started = time.monotonic()
        response = requests.post(
            f"{base}/api/sandbox/commands",
            json={"sessionId": session_id, "cmd": "sh", "args": ["-c", script], "detached": True},
            headers=headers,
            timeout=30,
        )
        assert response.status_code == 202, response.text
        command_id = response.json()["commandId"]
        with requests.get(
            f"{base}/api/sandbox/commands/{command_id}/logs",
            params=logs_params,
            headers=headers,
            stream=True,
            timeout=30,
        ) as stream:
            assert stream.headers["Content-Type"] == "text/event-stream"
            events = _events(stream)
            before: list[Event] = [next(events)]
            first_at = time.monotonic() - started
            while len(before) < 5:
                before.append(next(events))
    finally:
        web.terminate()
        web.wait(timeout=60)

    time.sleep(0.5)  # the command goes on with no web process at all
    web, base = start_web(settings)
    try:
        resume = {**headers, "Last-Event-ID": str(before[-1].id)}
        logs = f"{base}/api/sandbox/commands/{command_id}/logs"
        with requests.get(logs, params=logs_params, headers=resume, stream=True, timeout=60) as s:
            after = list(_events(s))
    finally:
        web.terminate()
        web.wait(timeout=60)

    # Line 1 came while the command had some 3 s still to run.
    assert first_at < 2.0, first_at
    assert before[0].data == {"stream": "stdout", "data": "line1\n"}
    text = "".join(e.data["data"] for e in before + after[:-1])
    assert text == "".join(f"line{i}\n" for i in range(1, LINES + 1))
    assert after[-1].event == "exit" and after[-1].data["exitCode"] == 0
