"""GET /api/sandbox/status's lean path answers every request exactly as the DRF view does:
status, body, headers and the request log line, for successes and for each error."""

import json
import logging
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.test import Client
from django.utils import timezone

from lifecycle.states import LifecycleState as S
from recoup.redis_clients import redis_client
from sandboxes_app import poll
from sessions_app.models import Session

pytestmark = pytest.mark.django_db
STATUS = "/api/sandbox/status"


@pytest.fixture
def drf_calls(monkeypatch) -> list[int]:
    """Counts the requests the lean path hands to the DRF view."""
    calls: list[int] = []
    drf_view = poll._drf_view

    def counting(request: object) -> object:
        calls.append(1)
        return drf_view(request)

    monkeypatch.setattr(poll, "_drf_view", counting)
    return calls


def _session(account: object, **columns: object) -> Session:
    now = timezone.now()
    fields = {
        "lifecycle_state": S.ACTIVE,
        "lifecycle_version": 2,
        "last_activity_at": now,
        "hibernate_after": now + timedelta(minutes=5),
        "sandbox_expires_at": now + timedelta(hours=1),
        **columns,
    }
    return Session.objects.create(account=account, title="t", **fields)


def _answer(response: object) -> tuple[int, object, dict]:
    body = response.json()
    if "lifecycle" in body:
        body["lifecycle"]["serverTime"] = None
    return response.status_code, body, dict(response.headers)


def _both(monkeypatch, params: dict, **headers: str) -> tuple[tuple, tuple]:
    """The same request through the lean path, then through DRF."""
    lean = _answer(Client().get(STATUS, params, **headers))
    monkeypatch.setattr(poll, "LEAN", False)
    drf = _answer(Client().get(STATUS, params, **headers))
    monkeypatch.setattr(poll, "LEAN", True)
    return lean, drf


def _cases(owner, stranger) -> dict[str, tuple[dict, dict, int]]:
    mine = _session(owner.account).id
    return {
        "api key": ({"sessionId": mine}, {"HTTP_X_API_KEY": owner.raw_key}, 200),
        "bearer key": ({"sessionId": mine}, {"HTTP_AUTHORIZATION": f"Bearer {owner.raw_key}"}, 200),
        "accept json": (
            {"sessionId": mine},
            {"HTTP_X_API_KEY": owner.raw_key, "HTTP_ACCEPT": "application/json"},
            200,
        ),
        "unknown key": ({"sessionId": mine}, {"HTTP_X_API_KEY": "recoup_sk_" + "a" * 32}, 401),
        "malformed key": ({"sessionId": mine}, {"HTTP_X_API_KEY": "nope"}, 401),
        "basic auth": ({"sessionId": mine}, {"HTTP_AUTHORIZATION": "Basic Zm9vOmJhcg=="}, 401),
        "bearer jwt, no oidc": ({"sessionId": mine}, {"HTTP_AUTHORIZATION": "Bearer a.b.c"}, 401),
        "bearer, two words": ({"sessionId": mine}, {"HTTP_AUTHORIZATION": "Bearer a b"}, 401),
        "stranger": ({"sessionId": mine}, {"HTTP_X_API_KEY": stranger.raw_key}, 403),
        "unknown session": ({"sessionId": "nope"}, {"HTTP_X_API_KEY": owner.raw_key}, 404),
        "nul in id": ({"sessionId": "a\x00b"}, {"HTTP_X_API_KEY": owner.raw_key}, 404),
    }


LEAN_CASES = [
    "api key",
    "bearer key",
    "accept json",
    "unknown key",
    "malformed key",
    "basic auth",
    "bearer jwt, no oidc",
    "bearer, two words",
    "stranger",
    "unknown session",
    "nul in id",
]


@pytest.mark.parametrize("case", LEAN_CASES)
def test_the_lean_path_answers_as_drf_does(owner, stranger, monkeypatch, drf_calls, case):
    params, headers, expected = _cases(owner, stranger)[case]

    lean, drf = _both(monkeypatch, params, **headers)

    assert drf_calls == [1]  # only the second request went through DRF
    assert lean[0] == expected
    assert lean == drf


FALLBACKS = {
    "no credentials": ({}, {}),
    "head": ({"method": "head"}, {}),
    "html only": ({}, {"HTTP_ACCEPT": "text/html"}),
    "indented json": ({}, {"HTTP_ACCEPT": "application/json; indent=4"}),
    "format param": ({"extra": {"format": "xml"}}, {}),
    "second param": ({"extra": {"x": "1"}}, {}),
    "two ids": ({"ids": 2}, {}),
    "missing id": ({"ids": 0}, {}),
    "padded id": ({"pad": True}, {}),
    "long id": ({"long": True}, {}),
}


@pytest.mark.parametrize("case", FALLBACKS)
def test_requests_it_would_answer_differently_go_to_drf(owner, drf_calls, case):
    options, headers = FALLBACKS[case]
    session_id = _session(owner.account).id
    if options.get("pad"):
        session_id = f" {session_id}"
    if options.get("long"):
        session_id = "x" * 65
    query = "&".join([f"sessionId={session_id}"] * options.get("ids", 1))
    query = "&".join([query, *(f"{k}={v}" for k, v in options.get("extra", {}).items())])
    if case != "no credentials":
        headers = {"HTTP_X_API_KEY": owner.raw_key, **headers}
    client = Client()
    request = client.head if options.get("method") == "head" else client.get

    response = request(f"{STATUS}?{query.strip('&')}", **headers)

    assert drf_calls == [1]
    assert response.status_code != 500


def test_the_lean_path_throttles_as_drf_does(owner, stranger, settings, monkeypatch, drf_calls):
    settings.API_RATE_LIMIT = "1/day"
    for actor in (owner, stranger):
        rate_keys = f"recoup:rate:throttle_user_{actor.account.pk}:*"
        if settings.REDIS_URL:
            for key in redis_client(settings.REDIS_URL).keys(rate_keys):
                redis_client(settings.REDIS_URL).delete(key)
    lean_client, drf_client = Client(), Client()
    lean_params = {"sessionId": _session(owner.account).id}
    drf_params = {"sessionId": _session(stranger.account).id}

    assert lean_client.get(STATUS, lean_params, HTTP_X_API_KEY=owner.raw_key).status_code == 200
    lean = _answer(lean_client.get(STATUS, lean_params, HTTP_X_API_KEY=owner.raw_key))
    monkeypatch.setattr(poll, "LEAN", False)
    assert drf_client.get(STATUS, drf_params, HTTP_X_API_KEY=stranger.raw_key).status_code == 200
    drf = _answer(drf_client.get(STATUS, drf_params, HTTP_X_API_KEY=stranger.raw_key))

    assert lean[0] == 429
    retry_lean, retry_drf = int(lean[2].pop("Retry-After")), int(drf[2].pop("Retry-After"))
    assert abs(retry_lean - retry_drf) <= 1 and 1 <= retry_lean <= 24 * 3600
    assert lean[1]["status"] == "error"
    assert lean[1]["error"].split(" in ")[0] == drf[1]["error"].split(" in ")[0]
    assert lean[2] == drf[2]


def test_the_lean_path_writes_the_request_log_line(owner, stranger, caplog, drf_calls):
    session = _session(owner.account)
    client = Client()
    with caplog.at_level(logging.INFO, logger="recoup.request"):
        client.get(STATUS, {"sessionId": session.id}, HTTP_X_API_KEY=owner.raw_key)
        client.get(STATUS, {"sessionId": session.id}, HTTP_X_API_KEY="nope")
    ok, refused = (json.loads(r.getMessage()) for r in caplog.records)

    assert drf_calls == []
    assert ok == {**ok, "status": 200, "session_id": session.id}
    assert ok["account_id"] == str(owner.account.pk)
    assert refused == {**refused, "status": 401, "session_id": session.id, "account_id": None}


def test_the_next_poll_sees_a_state_change(owner, drf_calls):
    session = _session(owner.account)
    client = Client()
    before = client.get(STATUS, {"sessionId": session.id}, HTTP_X_API_KEY=owner.raw_key).json()
    Session.objects.filter(id=session.id).update(lifecycle_state=S.HIBERNATED, lifecycle_version=3)

    after = client.get(STATUS, {"sessionId": session.id}, HTTP_X_API_KEY=owner.raw_key).json()

    assert (before["status"], before["lifecycle"]["state"]) == ("active", S.ACTIVE)
    assert (after["status"], after["lifecycle"]["state"]) == ("no_sandbox", S.HIBERNATED)
    assert after["lifecycleVersion"] == 3
    assert drf_calls == []


def test_the_lean_path_kicks_an_overdue_session(
    owner, monkeypatch, drf_calls, django_capture_on_commit_callbacks
):
    session = _session(owner.account, hibernate_after=timezone.now() - timedelta(seconds=1))
    kicked: list[tuple] = []
    from lifecycle import tasks

    monkeypatch.setattr(tasks.hibernate_session, "delay", lambda *args, **kw: kicked.append(args))
    cache.delete(f"kick:{session.id}:2:idle")

    with django_capture_on_commit_callbacks(execute=True):
        response = Client().get(STATUS, {"sessionId": session.id}, HTTP_X_API_KEY=owner.raw_key)

    assert response.status_code == 200
    assert kicked == [(session.id, 2, "idle")]
    assert drf_calls == []


# --- The WSGI route: polls skip the middleware they never need ------------------------------


@pytest.fixture
def session_middleware_calls(monkeypatch) -> list[int]:
    """Counts the requests the sessions middleware saw (the full stack's, not the poll's)."""
    from django.contrib.sessions.middleware import SessionMiddleware

    calls: list[int] = []
    process_request = SessionMiddleware.process_request

    def counting(self, request):
        calls.append(1)
        return process_request(self, request)

    monkeypatch.setattr(SessionMiddleware, "process_request", counting)
    return calls


def _wsgi(application, query: str, method: str = "GET", **headers: str) -> tuple:
    """One request through a WSGI application: status, headers and body."""
    from django.core import signals
    from django.db import close_old_connections
    from django.test import RequestFactory

    environ = RequestFactory().generic(method, f"{STATUS}?{query}", **headers).environ
    started = {}

    def start_response(status: str, response_headers: list) -> None:
        started.update(status=status, headers=sorted(response_headers))

    # As Django's test client does: the test's transaction must outlive the request.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        response = application(environ, start_response)
        body = b"".join(response)
        response.close()
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)
    if body.startswith(b"{") and b"serverTime" in body:
        answer = json.loads(body)
        answer["lifecycle"]["serverTime"] = None
        body = answer
    return started["status"], started["headers"], body


@pytest.mark.parametrize("case", [*LEAN_CASES, *FALLBACKS, "session cookie", "chunked"])
def test_the_served_application_answers_polls_as_the_full_stack_does(
    owner, stranger, session_middleware_calls, case
):
    from django.core.handlers.wsgi import WSGIHandler

    from recoup.wsgi import application

    mine = _session(owner.account).id
    key = {"HTTP_X_API_KEY": owner.raw_key}
    method, query, headers, lean = "GET", f"sessionId={mine}", dict(key), False
    if case in LEAN_CASES:
        params, headers, _ = _cases(owner, stranger)[case]
        query, lean = "&".join(f"sessionId={v}" for v in params.values()), True
    elif case == "session cookie":
        headers = {"HTTP_COOKIE": "sessionid=abc"}
    elif case == "chunked":
        headers = {**key, "HTTP_TRANSFER_ENCODING": "chunked"}
    else:
        options, extra = FALLBACKS[case]
        headers = {} if case == "no credentials" else {**key, **extra}
        method = options.get("method", "get").upper()
        query = "&".join(
            [f"sessionId={mine}"] * options.get("ids", 1)
            + [f"{k}={v}" for k, v in options.get("extra", {}).items()]
        )
        if options.get("pad"):
            query = f"sessionId=%20{mine}"
        if options.get("long"):
            query = "sessionId=" + "x" * 65

    served = _wsgi(application, query, method, **headers)
    assert len(session_middleware_calls) == (0 if lean else 1)
    full = _wsgi(WSGIHandler(), query, method, **headers)

    assert served == full
    assert served[0] != "500 Internal Server Error"
