"""Requests that meet another run's work: a hibernation asked for during provisioning is kept
and carried out, and a request waiting on a slow run answers within SANDBOX_PROVISION_WAIT.

The provisioning under test is real and slow for real: a clone of a 64 MB repository of random
bytes takes a couple of seconds."""

import os
import threading
import time

import pytest
from django.db import connections
from rest_framework.test import APIClient

from sessions_app.models import Session
from tests.support.api import new_session, wait_state
from tests.support.worker import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BIG = 64 * 1024 * 1024


@pytest.fixture
def slow_repo(origins) -> str:
    origins.create("acme", "slow", {"blob.bin": os.urandom(BIG), "README.md": "slow\n"})
    return "https://github.com/acme/slow"


def provision_in_background(raw_key: str, body: dict) -> tuple[threading.Thread, dict]:
    """POST /api/sandbox from another thread (its own client and connection)."""
    result: dict = {}

    def post() -> None:
        client = APIClient()
        client.credentials(HTTP_X_API_KEY=raw_key)
        try:
            result["response"] = client.post("/api/sandbox", body, format="json")
        finally:
            connections.close_all()

    thread = threading.Thread(target=post)
    thread.start()
    return thread, result


def wait_claimed(session_id: str) -> None:
    """Until a run holds the session (a new session is `provisioning` before any run)."""
    wait_for(
        lambda: Session.objects.filter(id=session_id, lifecycle_run_id__isnull=False).exists(),
        timeout=10,
        interval=0.02,
    )


def test_a_hibernation_asked_during_provisioning_is_carried_out_once_ready(
    owner, slow_repo, worker
):
    session_id = new_session(owner)
    thread, result = provision_in_background(
        owner.raw_key, {"repoUrl": slow_repo, "sessionId": session_id}
    )
    wait_claimed(session_id)

    accepted = owner.client.post("/api/sandbox/hibernate", {"sessionId": session_id}, format="json")
    thread.join()

    assert accepted.status_code == 202
    body = accepted.json()
    assert (body["requestedState"], body["lifecycle"]["state"]) == ("hibernated", "provisioning")
    assert result["response"].status_code == 200, result["response"].content
    session = wait_state(session_id, "hibernated", worker, timeout=60)
    assert session.current_snapshot_id is not None and session.lifecycle_intent is None
    reasons = list(
        session.lifecycle_events.order_by("id").values_list("to_state", "reason", flat=False)
    )
    assert reasons[-3:] == [
        ("active", "ready_clone"),
        ("hibernating", "requested"),
        (
            "hibernated",
            "hibernated",
        ),
    ]


def test_an_archive_during_provisioning_ends_archived(owner, slow_repo, worker):
    session_id = new_session(owner)
    thread, result = provision_in_background(
        owner.raw_key, {"repoUrl": slow_repo, "sessionId": session_id}
    )
    wait_claimed(session_id)

    archived = owner.client.patch(
        f"/api/sessions/{session_id}", {"status": "archived"}, format="json"
    )
    thread.join()

    assert archived.status_code == 200, archived.content
    wait_state(session_id, "archived", worker, timeout=60)
    assert Session.objects.get(id=session_id).current_snapshot_id is not None


def test_a_request_waiting_on_a_slow_run_answers_503_within_the_wait(owner, slow_repo, settings):
    settings.SANDBOX_PROVISION_WAIT = 1
    session_id = new_session(owner)
    body = {"repoUrl": slow_repo, "sessionId": session_id}
    thread, first = provision_in_background(owner.raw_key, body)
    wait_claimed(session_id)

    started = time.monotonic()
    second = owner.client.post("/api/sandbox", body, format="json")
    waited = time.monotonic() - started
    thread.join()

    assert second.status_code == 503, second.content
    assert second["Retry-After"] == "5"
    assert second.json() == {
        "status": "error",
        "error": "The session's sandbox is still provisioning; retry shortly",
    }
    assert 1 <= waited < 3
    # The slow run was never disturbed: it finished, and the retry finds its sandbox.
    assert first["response"].status_code == 200
    retry = owner.client.post("/api/sandbox", body, format="json")
    assert retry.status_code == 200
