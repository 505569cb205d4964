"""The session sandbox endpoints end to end: real git origins, real bubblewrap sandboxes, real
PostgreSQL; every response checked against its seed document."""

import threading
import time

import pytest
from django.conf import settings
from django.db import connections
from rest_framework.test import APIClient

from lifecycle.models import LifecycleEvent
from sandboxes_app.models import Sandbox, session_sandbox_name
from sandboxes_app.providers.base import SandboxStatus, get_provider
from sessions_app.models import Session
from tests.support.api import new_session, run
from tests.support.seeds import assert_matches_seed

pytestmark = pytest.mark.django_db(transaction=True)
MODE = {"mode": ["local"]}


def post_sandbox(client: APIClient, body: object):
    return client.post("/api/sandbox", body, format="json")


def test_it_creates_a_sandbox_holding_the_repository(owner, repo_url):
    session_id = new_session(owner)
    response = post_sandbox(owner.client, {"repoUrl": repo_url, "sessionId": session_id})

    assert response.status_code == 200, response.content
    body = assert_matches_seed("post", "/api/sandbox", response, MODE)
    assert body["mode"] == "local"
    assert body["currentBranch"] == "main"
    assert body["timeout"] == 300_000
    assert body["timing"]["readyMs"] >= 0
    assert abs(body["createdAt"] - time.time() * 1000) < 60_000

    session = owner.client.get(f"/api/sessions/{session_id}")
    data = assert_matches_seed("get", "/api/sessions/{sessionId}", session)["session"]
    assert data["lifecycleState"] == "active"
    assert data["lifecycleVersion"] >= 2
    assert (data["repoOwner"], data["repoName"], data["branch"]) == ("acme", "app", "main")
    assert data["cloneUrl"] == "https://github.com/acme/app.git"
    assert data["sandboxState"]["status"] == "running"
    assert data["lastActivityAt"] and data["hibernateAfter"] and data["sandboxExpiresAt"]

    readme = run(owner, session_id, "cat", "README.md")
    assert readme.status_code == 200
    assert readme.json()["stdout"] == "# app\n"


@pytest.mark.parametrize(
    "body, needle",
    [
        ("{not json", "JSON"),
        ({}, "repoUrl"),
        ({"repoUrl": "https://gitlab.com/a/b"}, "repoUrl"),
        ({"repoUrl": "https://github.com/-u/x"}, "repoUrl"),
        ({"repoUrl": 7}, "repoUrl"),
        ({"repoUrl": "https://github.com/acme/app", "sessionId": 12}, "sessionId"),
        (["https://github.com/acme/app"], "JSON object"),
    ],
)
def test_it_rejects_bad_input_and_changes_nothing(owner, repo_url, body, needle):
    session_id = new_session(owner)
    if isinstance(body, dict) and body.get("sessionId") is None and "repoUrl" in body:
        body = {**body, "sessionId": session_id}
    if isinstance(body, str):
        response = owner.client.post("/api/sandbox", body, content_type="application/json")
    else:
        response = post_sandbox(owner.client, body)

    assert response.status_code == 400
    error = assert_matches_seed("post", "/api/sandbox", response)["error"]
    assert needle in error
    session = Session.objects.get(id=session_id)
    assert (session.lifecycle_state, session.lifecycle_version) == ("provisioning", 0)
    assert not Sandbox.objects.exists()


def test_it_answers_401_404_then_403(owner, member, stranger, anon, repo_url):
    session_id = new_session(owner)
    body = {"repoUrl": repo_url, "sessionId": session_id}

    assert_matches_seed("post", "/api/sandbox", post_sandbox(anon, body))
    unknown = post_sandbox(owner.client, {**body, "sessionId": "nope"})
    assert unknown.status_code == 404
    assert_matches_seed("post", "/api/sandbox", unknown)
    for outsider in (member, stranger):
        forbidden = post_sandbox(outsider.client, body)
        assert forbidden.status_code == 403
        assert_matches_seed("post", "/api/sandbox", forbidden)
    assert not Sandbox.objects.exists()


def test_concurrent_posts_all_succeed_with_one_sandbox(owner, repo_url):
    session_id = new_session(owner)
    results: list[int] = []

    def post() -> None:
        client = APIClient()
        client.credentials(HTTP_X_API_KEY=owner.raw_key)
        try:
            response = post_sandbox(client, {"repoUrl": repo_url, "sessionId": session_id})
            results.append(response.status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=post) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert results == [200] * 12
    assert Sandbox.objects.filter(session_id=session_id).count() == 1
    events = LifecycleEvent.objects.filter(session_id=session_id)
    assert events.filter(to_state="active").count() == 1
    assert events.filter(reason="create").count() == 1


def test_a_provider_failure_is_502_and_the_session_recovers(owner, origins):
    session_id = new_session(owner)
    body = {"repoUrl": "https://github.com/acme/missing", "sessionId": session_id}

    failed = post_sandbox(owner.client, body)
    assert failed.status_code == 502
    assert_matches_seed("post", "/api/sandbox", failed)
    session = Session.objects.get(id=session_id)
    assert session.lifecycle_state == "failed"
    assert "https://github.com/acme/missing" in session.lifecycle_error
    # git's own message names the repository as the client knows it, not the mirror or our disk.
    for private in (settings.SANDBOX_GIT_BASE_URL, str(settings.SANDBOX_ROOT)):
        assert private not in failed.json()["error"]
        assert private not in session.lifecycle_error

    origins.create("acme", "missing", {"a.txt": "now it exists\n"})
    recovered = post_sandbox(owner.client, body)
    assert recovered.status_code == 200
    session.refresh_from_db()
    assert (session.lifecycle_state, session.lifecycle_error) == ("active", None)
    get_provider().destroy(name=session_sandbox_name(session_id))


def test_status_reports_the_lifecycle_from_the_database(owner, stranger, anon, repo_url):
    session_id = new_session(owner)
    path = "/api/sandbox/status"

    before = owner.client.get(path, {"sessionId": session_id})
    body = assert_matches_seed("get", path, before)
    assert (body["status"], body["hasSnapshot"]) == ("no_sandbox", False)
    assert body["lifecycle"]["state"] == "provisioning"

    post_sandbox(owner.client, {"repoUrl": repo_url, "sessionId": session_id})
    after = assert_matches_seed("get", path, owner.client.get(path, {"sessionId": session_id}))
    session = Session.objects.get(id=session_id)
    assert after["status"] == "active"
    assert after["lifecycleVersion"] == session.lifecycle_version
    assert after["lifecycle"]["hibernateAfter"] == int(session.hibernate_after.timestamp() * 1000)
    assert abs(after["lifecycle"]["serverTime"] - time.time() * 1000) < 5_000

    assert owner.client.get(path).status_code == 400
    assert_matches_seed("get", path, owner.client.get(path))
    assert owner.client.get(path, {"sessionId": "nope"}).status_code == 404
    assert stranger.client.get(path, {"sessionId": session_id}).status_code == 403
    assert anon.get(path, {"sessionId": session_id}).status_code == 401


def test_reconnect_probes_the_runtime_without_touching_it(owner, repo_url):
    session_id = new_session(owner)
    path = "/api/sandbox/reconnect"

    never = assert_matches_seed("get", path, owner.client.get(path, {"sessionId": session_id}))
    assert never["status"] == "no_sandbox"

    post_sandbox(owner.client, {"repoUrl": repo_url, "sessionId": session_id})
    session = Session.objects.get(id=session_id)
    connected = owner.client.get(path, {"sessionId": session_id})
    body = assert_matches_seed("get", path, connected)
    assert body["status"] == "connected"
    assert body["expiresAt"] == int(session.sandbox_expires_at.timestamp() * 1000)
    session_after = Session.objects.get(id=session_id)
    assert session_after.hibernate_after == session.hibernate_after  # idle clock untouched

    # The runtime dies (a host restart, say): expired, recorded, workspace kept.
    name = session_sandbox_name(session_id)
    get_provider().stop(name=name)
    expired = assert_matches_seed("get", path, owner.client.get(path, {"sessionId": session_id}))
    assert (expired["status"], expired["hasSnapshot"]) == ("expired", False)
    assert Session.objects.get(id=session_id).lifecycle_state == "failed"
    assert get_provider().status(name=name) == SandboxStatus.STOPPED

    # A later POST starts the kept workspace again, with its files.
    run_before = post_sandbox(owner.client, {"repoUrl": repo_url, "sessionId": session_id})
    assert run_before.status_code == 200
    assert Session.objects.get(id=session_id).lifecycle_state == "active"


def test_reconnect_heals_a_failed_session_whose_runtime_is_alive(owner, repo_url):
    session_id = new_session(owner)
    post_sandbox(owner.client, {"repoUrl": repo_url, "sessionId": session_id})
    Session.objects.filter(id=session_id).update(lifecycle_state="failed", lifecycle_error="x")

    body = owner.client.get("/api/sandbox/reconnect", {"sessionId": session_id}).json()

    assert body["status"] == "connected"
    session = Session.objects.get(id=session_id)
    assert (session.lifecycle_state, session.lifecycle_error) == ("active", None)


def test_commands_run_in_the_sandbox_and_count_as_activity(owner, repo_url):
    session_id = new_session(owner)
    assert run(owner, session_id, "true").status_code == 409  # no sandbox yet
    post_sandbox(owner.client, {"repoUrl": repo_url, "sessionId": session_id})
    Session.objects.filter(id=session_id).update(hibernate_after=None)

    result = run(owner, session_id, "sh", "-c", "echo out; echo err >&2; exit 3", env={"X": "1"})
    assert result.json() == {
        **result.json(),
        "exitCode": 3,
        "stdout": "out\n",
        "stderr": "err\n",
        "timedOut": False,
        "truncated": False,
    }
    assert Session.objects.get(id=session_id).hibernate_after is not None

    cwd = run(owner, session_id, "pwd", cwd="src").json()
    assert cwd["stdout"].strip() == "/workspace/src"
    slow = run(owner, session_id, "sleep", "30", timeoutMs=300).json()
    assert slow["timedOut"] is True and slow["exitCode"] is None

    for bad in (
        {"cmd": 5},
        {"args": "x"},
        {"env": {"A": 1}},
        {"timeoutMs": -1},
        {"timeoutMs": 10**9},
    ):
        response = owner.client.post(
            "/api/sandbox/commands", {"sessionId": session_id, "cmd": "true", **bad}, format="json"
        )
        assert response.status_code == 400, bad
        assert response.json()["status"] == "error"


def test_activity_and_extend_move_the_clocks(owner, repo_url, settings):
    session_id = new_session(owner)
    assert (
        owner.client.post(
            "/api/sandbox/extend", {"sessionId": session_id}, format="json"
        ).status_code
        == 409
    )
    post_sandbox(owner.client, {"repoUrl": repo_url, "sessionId": session_id})
    before = Session.objects.get(id=session_id)

    touched = owner.client.post("/api/sandbox/activity", {"sessionId": session_id}, format="json")
    assert touched.status_code == 200
    assert Session.objects.get(id=session_id).hibernate_after >= before.hibernate_after

    extended = owner.client.post("/api/sandbox/extend", {"sessionId": session_id}, format="json")
    assert extended.status_code == 200
    after = Session.objects.get(id=session_id)
    delta = (after.sandbox_expires_at - before.sandbox_expires_at).total_seconds()
    assert delta == pytest.approx(settings.SANDBOX_EXTEND, abs=1)
    assert after.lifecycle_version == before.lifecycle_version + 1

    settings.SANDBOX_MAX_LIFETIME = 60
    capped = owner.client.post("/api/sandbox/extend", {"sessionId": session_id}, format="json")
    sandbox = Sandbox.objects.get(session_id=session_id)
    cap = capped.json()["lifecycle"]["sandboxExpiresAt"]
    assert cap == int((sandbox.created_at.timestamp() + 60) * 1000)


def test_hibernate_then_resume_brings_the_files_back(owner, repo_url, worker):
    session_id = new_session(owner)
    post_sandbox(owner.client, {"repoUrl": repo_url, "sessionId": session_id})
    run(owner, session_id, "sh", "-c", "echo draft > notes.txt && rm README.md")

    accepted = owner.client.post("/api/sandbox/hibernate", {"sessionId": session_id}, format="json")
    assert accepted.status_code == 202
    from tests.support.worker import wait_for

    wait_for(
        lambda: Session.objects.get(id=session_id).lifecycle_state == "hibernated",
        timeout=60,
        message=worker.log(),
    )
    status = owner.client.get("/api/sandbox/status", {"sessionId": session_id}).json()
    assert (status["status"], status["hasSnapshot"]) == ("no_sandbox", True)
    assert get_provider().status(name=session_sandbox_name(session_id)) == SandboxStatus.ABSENT
    reconnect = owner.client.get("/api/sandbox/reconnect", {"sessionId": session_id}).json()
    assert (reconnect["status"], reconnect["hasSnapshot"]) == ("expired", True)

    resumed = post_sandbox(owner.client, {"repoUrl": repo_url, "sessionId": session_id})
    assert resumed.status_code == 200
    assert run(owner, session_id, "cat", "notes.txt").json()["stdout"] == "draft\n"
    assert run(owner, session_id, "ls").json()["stdout"].split() == ["notes.txt", "scripts", "src"]
    assert LifecycleEvent.objects.filter(session_id=session_id, reason="ready_resume").exists()


def test_an_unusable_snapshot_gives_a_fresh_sandbox(owner, repo_url, worker):
    from django.core.files.storage import storages

    from tests.support.worker import wait_for

    session_id = new_session(owner)
    post_sandbox(owner.client, {"repoUrl": repo_url, "sessionId": session_id})
    owner.client.post("/api/sandbox/hibernate", {"sessionId": session_id}, format="json")
    wait_for(
        lambda: Session.objects.get(id=session_id).lifecycle_state == "hibernated",
        timeout=60,
        message=worker.log(),
    )
    storages["snapshots"].delete(Session.objects.get(id=session_id).current_snapshot.storage_key)

    response = post_sandbox(owner.client, {"repoUrl": repo_url, "sessionId": session_id})

    assert response.status_code == 200
    assert run(owner, session_id, "cat", "README.md").json()["stdout"] == "# app\n"
    assert LifecycleEvent.objects.filter(session_id=session_id, reason="snapshot_unusable").exists()


def test_a_oneshot_sandbox_is_bound_to_the_account_only(owner, repo_url):
    response = post_sandbox(owner.client, {"repoUrl": repo_url})

    assert response.status_code == 200
    assert_matches_seed("post", "/api/sandbox", response, MODE)
    sandbox = Sandbox.objects.get(account=owner.account)
    assert sandbox.session_id is None
    assert get_provider().status(name=sandbox.name) == SandboxStatus.RUNNING


def test_the_status_poll_is_one_query_after_authentication(
    owner, repo_url, django_assert_max_num_queries
):
    from lifecycle.hibernation import session_hibernate

    session_id = new_session(owner)
    post_sandbox(owner.client, {"repoUrl": repo_url, "sessionId": session_id})
    session_hibernate(session_id=session_id, actor="test", reason="idle")
    owner.client.get("/api/sandbox/status", {"sessionId": session_id})  # last_used_at written

    # API key lookup, then the session with its snapshot.
    with django_assert_max_num_queries(2):
        body = owner.client.get("/api/sandbox/status", {"sessionId": session_id}).json()
    assert body["hasSnapshot"] is True
