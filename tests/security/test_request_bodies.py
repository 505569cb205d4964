"""Request bodies that used to slip past the API: JSON nested deep enough to overflow the
decoder's recursion (a 500), and a chunked body the WSGI layer read as empty (a 201 as if the
client had sent nothing). Each is read correctly or refused in the envelope, and changes nothing.
"""

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxes_app.models import Sandbox
from sessions_app.models import Session
from tests.support.worker import ROOT
from tests.support.worker import test_database_url as database_url

DEEP = 100_000
# The documented limit (README): a body may nest this many arrays and objects, top level included.
MAX_DEPTH = 64


def _nested(depth: int, shape: str) -> str:
    if shape == "array":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


# --- nesting, through the real API ------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("shape", ["array", "object"])
def test_a_body_nested_100k_deep_is_a_400_in_the_envelope_and_creates_no_session(owner, shape):
    body = '{"title": "deep", "extra": ' + _nested(DEEP, shape) + "}"

    response = owner.client.post("/api/sessions", body, content_type="application/json")

    assert response.status_code == 400
    assert response.json() == {
        "status": "error",
        "error": f"JSON nested deeper than {MAX_DEPTH} levels",
    }
    assert not Session.objects.exists()


@pytest.mark.django_db
def test_a_bare_100k_deep_array_is_a_400_on_the_commands_endpoint(owner):
    session_id = owner.client.post("/api/sessions", {"title": "t"}, format="json").json()[
        "session"
    ]["id"]

    response = owner.client.post(
        "/api/sandbox/commands", _nested(DEEP, "array"), content_type="application/json"
    )

    assert response.status_code == 400
    assert response.json()["status"] == "error"
    assert "nested deeper" in response.json()["error"]
    assert not Sandbox.objects.filter(session_id=session_id).exists()


@pytest.mark.django_db
def test_a_deep_patch_leaves_the_session_unchanged(owner):
    session_id = owner.client.post("/api/sessions", {"title": "before"}, format="json").json()[
        "session"
    ]["id"]
    body = '{"title": "after", "extra": ' + _nested(DEEP, "object") + "}"

    response = owner.client.patch(
        f"/api/sessions/{session_id}", body, content_type="application/json"
    )

    assert response.status_code == 400
    assert Session.objects.get(id=session_id).title == "before"


@pytest.mark.django_db
def test_nesting_up_to_the_limit_is_accepted_and_one_more_level_is_not(owner):
    # The top-level object is the first level; an unknown field is ignored by the contract.
    at_limit = '{"title": "at", "extra": ' + _nested(MAX_DEPTH - 1, "array") + "}"
    past_limit = '{"title": "past", "extra": ' + _nested(MAX_DEPTH, "array") + "}"

    accepted = owner.client.post("/api/sessions", at_limit, content_type="application/json")
    refused = owner.client.post("/api/sessions", past_limit, content_type="application/json")

    assert accepted.status_code == 201, accepted.content
    assert refused.status_code == 400
    assert list(Session.objects.values_list("title", flat=True)) == ["at"]


@pytest.mark.django_db
def test_brackets_and_escaped_quotes_inside_strings_do_not_count_as_nesting(owner):
    title = '[[{{\\"[[[' * 30 + '"' + "{" * 20

    response = owner.client.post("/api/sessions", {"title": title}, format="json")

    assert response.status_code == 201, response.content
    assert response.json()["session"]["title"] == title


@pytest.mark.django_db
def test_a_utf16_body_is_scanned_as_text(owner):
    body = ('{"title": "utf16", "extra": ' + _nested(DEEP, "array") + "}").encode("utf-16")

    response = owner.client.post(
        "/api/sessions", body, content_type="application/json; charset=utf-16"
    )

    assert response.status_code == 400
    assert "nested deeper" in response.json()["error"]


# --- chunked bodies, through real HTTP servers ------------------------------------------------


def _send(
    base_url: str, method: str, path: str, raw_key: str, body: bytes | None
) -> tuple[int, dict]:
    """One request with `Transfer-Encoding: chunked`, the body cut into small chunks.

    Written in one go: a server that answers before reading the body (the 411) would otherwise
    close while later chunks are still being sent, and the client would see a broken pipe
    instead of the answer."""
    host, port = base_url.removeprefix("http://").split(":")
    chunks = [body[i : i + 7] for i in range(0, len(body), 7)] if body else []
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nX-API-Key: {raw_key}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    framed = b"".join(f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in chunks) + b"0\r\n\r\n"
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(head + framed)
        response = http.client.HTTPResponse(connection)
        response.begin()
        return response.status, json.loads(response.read())


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def gunicorn(transactional_db, tmp_path) -> Iterator[str]:
    """The project's web entry (`manage.py web`, what `manage.py up` and compose run) on the
    test database, with a 4 KiB body limit so the 413 is cheap to reach."""
    port = _free_port()
    log_path = tmp_path / "gunicorn.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "web",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                "1",
            ],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": database_url(), "API_MAX_BODY_BYTES": "4096"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_listening(port, process, log_path)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=15)


def _wait_listening(port: int, process: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + 90  # a loaded CI machine imports Django twice here
    while time.monotonic() < deadline:
        assert process.poll() is None, log_path.read_text(errors="replace")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", "/healthz")
            if connection.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.1)
        finally:
            connection.close()
    raise AssertionError("gunicorn never answered:\n" + log_path.read_text(errors="replace"))


@pytest.mark.slow
def test_gunicorn_reads_a_chunked_body(gunicorn, owner):
    title = "sent in chunks " + "x" * 100

    status, body = _send(
        gunicorn, "POST", "/api/sessions", owner.raw_key, json.dumps({"title": title}).encode()
    )

    assert status == 201, body
    assert body["session"]["title"] == title
    assert Session.objects.get(id=body["session"]["id"]).title == title


@pytest.mark.slow
def test_gunicorn_refuses_a_chunked_body_over_the_limit_with_a_413(gunicorn, owner):
    payload = json.dumps({"title": "big", "extra": "y" * 8192}).encode()

    status, body = _send(gunicorn, "POST", "/api/sessions", owner.raw_key, payload)

    assert status == 413
    assert body == {"status": "error", "error": "Request body too large (see API_MAX_BODY_BYTES)"}
    assert not Session.objects.exists()


@pytest.mark.slow
def test_gunicorn_refuses_a_deep_chunked_body_with_a_400(gunicorn, owner):
    status, body = _send(gunicorn, "POST", "/api/sessions", owner.raw_key, b"[" * 4000)

    assert status == 400
    assert body == {"status": "error", "error": f"JSON nested deeper than {MAX_DEPTH} levels"}


@pytest.mark.django_db(transaction=True)
def test_a_server_that_cannot_dechunk_answers_411_and_creates_nothing(live_server, owner):
    # Django's own server (runserver, the test server) leaves chunked framing to the app.
    payload = json.dumps({"title": "sent in chunks"}).encode()

    status, body = _send(live_server.url, "POST", "/api/sessions", owner.raw_key, payload)

    assert status == 411
    assert body == {
        "status": "error",
        "error": "Length Required: send the body with a Content-Length header",
    }
    assert not Session.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_411_on_the_legacy_listing_uses_its_envelope(live_server, owner):
    status, body = _send(live_server.url, "GET", "/api/sandboxes", owner.raw_key, None)

    assert status == 411
    assert body == {"error": "Length Required: send the body with a Content-Length header"}
