"""GET /api/sandboxes (seed 004): the account's sandboxes, its access rule and its envelope."""

import pytest

from lifecycle.hibernation import session_hibernate
from sandboxes_app.models import Sandbox
from tests.support.api import new_session, start_sandbox
from tests.support.seeds import assert_matches_seed

pytestmark = pytest.mark.django_db(transaction=True)
PATH = "/api/sandboxes"


def listing(actor, **params) -> dict:
    response = actor.client.get(PATH, params)
    assert response.status_code == 200, response.content
    return assert_matches_seed("get", PATH, response)


def test_it_lists_session_and_oneshot_sandboxes_newest_first(owner, repo_url):
    hibernated = new_session(owner)
    start_sandbox(owner, hibernated, repo_url)
    session_hibernate(session_id=hibernated, actor="test", reason="idle")
    running = new_session(owner)
    start_sandbox(owner, running, repo_url)
    owner.client.post("/api/sandbox", {"repoUrl": repo_url}, format="json")

    body = listing(owner)

    names = [row["sandboxId"] for row in body["sandboxes"]]
    expected = list(Sandbox.objects.order_by("-created_at", "-id").values_list("name", flat=True))
    assert names == expected and len(names) == 3
    statuses = {row["sandboxId"]: row["sandboxStatus"] for row in body["sandboxes"]}
    assert statuses[f"sbx_{hibernated}"] == "stopped"
    assert statuses[f"sbx_{running}"] == "running"
    by_name = {row["sandboxId"]: row for row in body["sandboxes"]}
    assert 0 < by_name[f"sbx_{running}"]["timeout"] <= 300_000  # the idle clock comes first
    assert by_name[f"sbx_{hibernated}"]["timeout"] == 0
    assert body["status"] == "success"
    assert body["snapshot_id"].startswith("snap_")
    assert body["github_repo"] == "https://github.com/acme/app"
    tree = {(entry["path"], entry["type"]) for entry in body["filetree"]}
    assert {("README.md", "blob"), ("src", "tree"), ("src/main.py", "blob")} <= tree
    readme = next(e for e in body["filetree"] if e["path"] == "README.md")
    assert readme["size"] == len("# app\n") and len(readme["sha"]) == 40


def test_an_account_without_sandboxes_gets_empty_fields(stranger):
    body = listing(stranger)
    assert body == {
        "status": "success",
        "sandboxes": [],
        "snapshot_id": None,
        "github_repo": None,
        "filetree": None,
    }


def test_a_resumed_sandbox_is_listed_once_with_its_current_status(owner, repo_url):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    session_hibernate(session_id=session_id, actor="test", reason="idle")
    start_sandbox(owner, session_id, repo_url)

    rows = listing(owner, sandbox_id=f"sbx_{session_id}")["sandboxes"]

    assert [(r["sandboxId"], r["sandboxStatus"]) for r in rows] == [
        (f"sbx_{session_id}", "running")
    ]


def test_it_filters_by_sandbox_id(owner, repo_url):
    first, second = new_session(owner), new_session(owner)
    start_sandbox(owner, first, repo_url)
    start_sandbox(owner, second, repo_url)

    body = listing(owner, sandbox_id=f"sbx_{first}")

    assert [row["sandboxId"] for row in body["sandboxes"]] == [f"sbx_{first}"]
    assert listing(owner, sandbox_id="sbx_unknown")["sandboxes"] == []


def test_account_id_is_allowed_for_organization_peers_only(owner, member, stranger, repo_url):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)

    peer_view = listing(member, account_id=str(owner.account.id))
    assert [row["sandboxId"] for row in peer_view["sandboxes"]] == [f"sbx_{session_id}"]
    own_view = listing(owner, account_id=str(owner.account.id))
    assert [row["sandboxId"] for row in own_view["sandboxes"]] == [f"sbx_{session_id}"]

    refused = stranger.client.get(PATH, {"account_id": str(owner.account.id)})
    assert refused.status_code == 403
    assert set(assert_matches_seed("get", PATH, refused)) == {"error"}


def test_errors_use_the_legacy_envelope(owner, anon):
    unauthorized = anon.get(PATH)
    assert unauthorized.status_code == 401
    assert set(assert_matches_seed("get", PATH, unauthorized)) == {"error"}
    assert unauthorized.headers["WWW-Authenticate"]

    bad = owner.client.get(PATH, {"account_id": "not-a-uuid"})
    assert bad.status_code == 400
    assert set(bad.json()) == {"error"} and "account_id" in bad.json()["error"]


def test_reconnect_answers_its_seed_error_codes(owner, stranger, anon):
    session_id = new_session(owner)
    path = "/api/sandbox/reconnect"
    for client, params, code in (
        (owner.client, {}, 400),
        (anon, {"sessionId": session_id}, 401),
        (stranger.client, {"sessionId": session_id}, 403),
        (owner.client, {"sessionId": "missing"}, 404),
    ):
        response = client.get(path, params)
        assert response.status_code == code
        assert_matches_seed("get", path, response)
