"""One-shot sandboxes (POST /api/sandbox without a session): listed, run commands by the id the
create call returned, destroyed by their owner alone; real origins and real sandboxes."""

import threading
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connections
from django.utils import timezone

from recoup.errors import Conflict
from sandboxes_app.git.urls import parse_repo_url
from sandboxes_app.models import Sandbox
from sandboxes_app.oneshots import oneshot_sandbox_create, oneshot_sandbox_destroy
from sandboxes_app.providers.base import SandboxStatus, get_provider
from tests.sandboxes_app.test_provider_commands import host_processes_with
from tests.support.api import new_session, start_sandbox
from tests.support.seeds import assert_matches_seed

pytestmark = pytest.mark.django_db(transaction=True)
MODE = {"mode": ["local"]}


def create(actor, repo_url: str) -> str:
    response = actor.client.post("/api/sandbox", {"repoUrl": repo_url}, format="json")
    assert response.status_code == 200, response.content
    body = assert_matches_seed("post", "/api/sandbox", response, MODE)
    return body["sandboxId"]


def command(actor, sandbox_id: str, *argv: str):
    return actor.client.post(
        "/api/sandbox/commands",
        {"sandboxId": sandbox_id, "cmd": argv[0], "args": list(argv[1:])},
        format="json",
    )


def destroy(actor, sandbox_id: object):
    return actor.client.post("/api/sandbox/destroy", {"sandboxId": sandbox_id}, format="json")


def listed(actor) -> dict[str, dict]:
    response = actor.client.get("/api/sandboxes")
    body = assert_matches_seed("get", "/api/sandboxes", response)
    return {row["sandboxId"]: row for row in body["sandboxes"]}


# --- create, list, run ------------------------------------------------------------------------


def test_create_returns_the_id_it_is_listed_and_run_by(owner, stranger, repo_url):
    sandbox_id = create(owner, repo_url)

    row = Sandbox.objects.get(name=sandbox_id)
    assert row.account == owner.account and row.session_id is None
    assert sandbox_id.startswith("sbx_") and len(sandbox_id) == 4 + 16
    entry = listed(owner)[sandbox_id]
    assert entry["sandboxStatus"] == "running"
    assert 0 < entry["timeout"] <= settings.SANDBOX_TIMEOUT * 1000
    assert sandbox_id not in listed(stranger)

    readme = command(owner, sandbox_id, "cat", "README.md")
    assert readme.status_code == 200, readme.content
    assert readme.json() == {
        "exitCode": 0,
        "stdout": "# app\n",
        "stderr": "",
        "durationMs": readme.json()["durationMs"],
        "timedOut": False,
        "truncated": False,
    }
    written = command(owner, sandbox_id, "sh", "-c", "echo kept > f && cat f")
    assert written.json()["stdout"] == "kept\n"


def test_a_session_create_answers_as_before_without_a_sandbox_id(owner, repo_url):
    body = start_sandbox(owner, new_session(owner), repo_url)

    assert "sandboxId" not in body


def test_the_body_names_one_sandbox_only(owner, repo_url):
    session_id = new_session(owner)
    both = owner.client.post(
        "/api/sandbox/commands",
        {"sessionId": session_id, "sandboxId": "sbx_0", "cmd": "true"},
        format="json",
    )
    neither = owner.client.post("/api/sandbox/commands", {"cmd": "true"}, format="json")
    no_id = owner.client.post("/api/sandbox/destroy", {}, format="json")
    wrong_type = destroy(owner, 7)

    assert both.status_code == 400
    assert both.json() == {
        "status": "error",
        "error": "sandboxId: give either sessionId or sandboxId, not both",
    }
    assert neither.status_code == 400
    assert neither.json() == {"status": "error", "error": "sessionId: This field is required."}
    assert no_id.status_code == 400 and no_id.json()["error"].startswith("sandboxId:")
    assert wrong_type.status_code == 400 and wrong_type.json()["error"].startswith("sandboxId:")


# --- the owner alone ---------------------------------------------------------------------------


def test_another_account_gets_the_404_of_a_missing_sandbox(owner, member, stranger, repo_url):
    sandbox_id = create(owner, repo_url)
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    missing = "sbx_" + uuid.uuid4().hex[:16]

    for actor in (member, stranger):  # an organization peer is no owner either
        for response in (command(actor, sandbox_id, "true"), destroy(actor, sandbox_id)):
            assert response.status_code == 404
            assert response.json() == {
                "status": "error",
                "error": f"One-shot sandbox {sandbox_id} not found",
            }
    for response in (command(owner, missing, "true"), destroy(owner, missing)):
        assert response.status_code == 404
        assert response.json() == {
            "status": "error",
            "error": f"One-shot sandbox {missing} not found",
        }
    # A session's sandbox is not destroyed (nor run in) by its sandbox id: its session holds it.
    for response in (
        command(owner, f"sbx_{session_id}", "true"),
        destroy(owner, f"sbx_{session_id}"),
    ):
        assert response.status_code == 404
    assert destroy(owner, "sbx_\x00").status_code in (400, 404)

    assert get_provider().status(name=sandbox_id) == SandboxStatus.RUNNING
    assert get_provider().status(name=f"sbx_{session_id}") == SandboxStatus.RUNNING
    assert Sandbox.objects.filter(destroyed_at__isnull=False).count() == 0
    assert command(owner, sandbox_id, "true").status_code == 200


# --- destroy ----------------------------------------------------------------------------------


def test_its_owner_destroys_it_with_its_processes_and_disk(owner, repo_url):
    sandbox_id = create(owner, repo_url)
    marker = f"oneshot-marker-{uuid.uuid4().hex}"
    started = command(
        owner, sandbox_id, "sh", "-c", f"(sleep 600; echo {marker}) >/dev/null 2>&1 &"
    )
    assert started.status_code == 200
    assert host_processes_with(marker), "the background process should be running"
    sandbox_dir = Path(settings.SANDBOX_ROOT) / sandbox_id
    assert sandbox_dir.exists()

    response = destroy(owner, sandbox_id)

    assert response.status_code == 200, response.content
    body = response.json()
    row = Sandbox.objects.get(name=sandbox_id)
    assert row.destroyed_at is not None and row.status == Sandbox.Status.STOPPED
    assert body == {
        "sandboxId": sandbox_id,
        "sandboxStatus": "stopped",
        "destroyedAt": int(row.destroyed_at.timestamp() * 1000),
    }
    assert host_processes_with(marker) == []
    assert get_provider().status(name=sandbox_id) == SandboxStatus.ABSENT
    assert not sandbox_dir.exists()
    assert listed(owner)[sandbox_id]["sandboxStatus"] == "stopped"
    assert listed(owner)[sandbox_id]["timeout"] == 0

    again = destroy(owner, sandbox_id)
    assert again.status_code == 200 and again.json() == body

    refused = command(owner, sandbox_id, "true")
    assert refused.status_code == 409
    assert refused.json() == {
        "status": "error",
        "error": f"Sandbox {sandbox_id} was destroyed; POST /api/sandbox to create another",
    }


def test_an_expired_sandbox_refuses_commands_before_the_sweep_takes_it(owner, repo_url):
    sandbox_id = create(owner, repo_url)
    Sandbox.objects.filter(name=sandbox_id).update(expires_at=timezone.now() - timedelta(1))

    response = command(owner, sandbox_id, "true")

    assert response.status_code == 409
    assert response.json()["error"] == f"Sandbox {sandbox_id} has expired and is being destroyed"


def test_a_destroyed_sandbox_frees_its_quota_slot(owner, repo_url, settings):
    settings.SANDBOX_MAX_PER_ACCOUNT = 1
    first = create(owner, repo_url)
    refused = owner.client.post("/api/sandbox", {"repoUrl": repo_url}, format="json")
    assert refused.status_code == 429

    assert destroy(owner, first).status_code == 200

    second = create(owner, repo_url)
    assert second != first
    assert command(owner, second, "true").status_code == 200
    assert (
        owner.client.post("/api/sandbox", {"repoUrl": repo_url}, format="json").status_code == 429
    )


def test_a_failed_create_holds_no_quota_slot(owner, repo_url, settings):
    settings.SANDBOX_MAX_PER_ACCOUNT = 1
    missing = owner.client.post(
        "/api/sandbox", {"repoUrl": "https://github.com/acme/missing"}, format="json"
    )
    assert missing.status_code == 502

    failed = Sandbox.objects.get(account=owner.account)
    assert failed.destroyed_at is not None
    assert listed(owner)[failed.name]["sandboxStatus"] == "failed"
    assert get_provider().status(name=failed.name) == SandboxStatus.ABSENT
    assert command(owner, create(owner, repo_url), "true").status_code == 200


def test_concurrent_destroys_record_it_once(owner, repo_url):
    sandbox_id = create(owner, repo_url)
    recorded: list[bool] = []
    barrier = threading.Barrier(4)

    def destroy_it() -> None:
        try:
            sandbox = Sandbox.objects.get(name=sandbox_id)
            barrier.wait()
            recorded.append(oneshot_sandbox_destroy(sandbox=sandbox, actor="test", reason="race"))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=destroy_it) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert sorted(recorded) == [False, False, False, True]
    assert get_provider().status(name=sandbox_id) == SandboxStatus.ABSENT


def test_a_sandbox_destroyed_while_it_is_created_leaves_no_runtime(owner, repo_url):
    outcome: list[object] = []

    def create_it() -> None:
        try:
            ready = oneshot_sandbox_create(account=owner.account, repo=parse_repo_url(repo_url))
            outcome.append(ready.sandbox.name)
        except Conflict as exc:
            outcome.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=create_it)
    thread.start()
    pending = None
    while pending is None and thread.is_alive():
        pending = Sandbox.objects.filter(account=owner.account).first()
    assert pending is not None, "the create never recorded its sandbox"

    assert oneshot_sandbox_destroy(sandbox=pending, actor="test", reason="race") is True
    thread.join(timeout=60)

    # Whichever finished first, nothing runs and the row says so.
    assert len(outcome) == 1
    assert isinstance(outcome[0], Conflict) or outcome[0] == pending.name
    pending.refresh_from_db()
    assert pending.destroyed_at is not None
    assert get_provider().status(name=pending.name) == SandboxStatus.ABSENT
    assert not (Path(settings.SANDBOX_ROOT) / pending.name).exists()


# --- the admin --------------------------------------------------------------------------------


@pytest.fixture
def operator(db):
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.create_superuser("root", "root@example.com", "unused")
    client = Client()
    client.force_login(user)
    return client


def test_the_admin_lists_and_destroys_oneshot_sandboxes(operator, owner, repo_url):
    from django.contrib.admin.models import LogEntry
    from django.contrib.messages import WARNING
    from django.urls import reverse

    changelist = reverse("admin:sandboxes_app_sandbox_changelist")
    doomed, kept = create(owner, repo_url), create(owner, repo_url)
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)

    page = operator.get(changelist, {"session__isempty": "1"})
    assert page.status_code == 200
    assert {s.name for s in page.context["cl"].result_list} == {doomed, kept}

    selected = Sandbox.objects.filter(name__in=[doomed, f"sbx_{session_id}"])
    response = operator.post(
        changelist,
        {"action": "destroy_oneshots", "_selected_action": [s.pk for s in selected]},
        follow=True,
    )

    assert response.status_code == 200
    notes = [(m.level, str(m)) for m in response.context["messages"]]
    assert (WARNING, "Skipped 1 session sandbox(es): hibernate or archive their sessions") in notes
    assert any(text == "Destroyed 1 one-shot sandbox(es)" for _, text in notes)
    assert get_provider().status(name=doomed) == SandboxStatus.ABSENT
    assert Sandbox.objects.get(name=doomed).destroyed_at is not None
    assert get_provider().status(name=kept) == SandboxStatus.RUNNING
    assert get_provider().status(name=f"sbx_{session_id}") == SandboxStatus.RUNNING
    entry = LogEntry.objects.get(object_id=str(Sandbox.objects.get(name=doomed).pk))
    assert entry.user.username == "root"
    assert entry.change_message == "Destroyed one-shot sandbox (admin:root)"
    assert destroy(owner, doomed).status_code == 200  # the owner's destroy is a no-op now
    assert command(owner, doomed, "true").status_code == 409
