"""The sessions API over HTTP: create, list, read and patch, with the contract's envelopes."""

import re
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from sessions_app.models import Session

URL = "/api/sessions"
SESSION_FIELDS = {
    "id", "userId", "artistId", "title", "status", "repoOwner", "repoName", "branch",
    "cloneUrl", "isNewBranch", "globalSkillRefs", "sandboxState", "lifecycleState",
    "lifecycleVersion", "lastActivityAt", "sandboxExpiresAt", "hibernateAfter",
    "lifecycleRunId", "lifecycleError", "linesAdded", "linesRemoved", "snapshotUrl",
    "snapshotCreatedAt", "snapshotSizeBytes", "cachedDiff", "cachedDiffUpdatedAt",
    "createdAt", "updatedAt",
}  # fmt: skip
GENERATED_TITLE = re.compile(r"^[A-Z][a-z]+ [A-Z][a-z]+ session$")

pytestmark = pytest.mark.django_db


def _error(response, status: int) -> str:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"status", "error"} and body["status"] == "error"
    return body["error"]


def _detail(session_id: str) -> str:
    return f"{URL}/{session_id}"


def _row(session_id: str) -> dict:
    return Session.objects.filter(id=session_id).values().get()


# --- POST /api/sessions ---------------------------------------------------------------------


def test_it_creates_a_provisioning_session_for_the_caller(owner):
    artist = uuid.uuid4()
    response = owner.client.post(URL, {"title": "Fix the build", "artistId": str(artist)}, "json")

    assert response.status_code == 201, response.content
    assert set(response.json()) == {"session"}
    session = response.json()["session"]
    assert set(session) == SESSION_FIELDS
    assert session["title"] == "Fix the build"
    assert session["userId"] == str(owner.account.id)
    assert session["artistId"] == str(artist)
    assert session["lifecycleState"] == "provisioning"
    assert session["lifecycleVersion"] == 0
    assert session["status"] == "running"
    assert session["isNewBranch"] is False
    assert session["globalSkillRefs"] == []
    assert (session["linesAdded"], session["linesRemoved"]) == (0, 0)
    assert session["repoOwner"] is session["repoName"] is session["cloneUrl"] is None

    row = Session.objects.get(id=session["id"])
    assert row.account_id == owner.account.id
    assert row.organization_id is None
    assert len(row.id) == 21


@pytest.mark.parametrize("body", [{}, {"title": ""}, {"title": "   "}, {"title": None}], ids=repr)
def test_it_generates_a_readable_title_when_none_is_given(body, owner):
    response = owner.client.post(URL, body, "json")

    assert response.status_code == 201, response.content
    title = response.json()["session"]["title"]
    assert GENERATED_TITLE.match(title), title
    assert Session.objects.get(id=response.json()["session"]["id"]).title == title


def test_it_creates_a_session_in_an_organization_the_caller_belongs_to(member, org):
    response = member.client.post(URL, {"organizationId": str(org.id)}, "json")

    assert response.status_code == 201, response.content
    assert Session.objects.get(id=response.json()["session"]["id"]).organization_id == org.id


def test_it_refuses_an_organization_the_caller_does_not_belong_to(stranger, org):
    response = stranger.client.post(URL, {"organizationId": str(org.id)}, "json")

    _error(response, 403)
    assert not Session.objects.exists()


def test_it_answers_404_for_an_unknown_organization(owner):
    response = owner.client.post(URL, {"organizationId": str(uuid.uuid4())}, "json")

    _error(response, 404)
    assert not Session.objects.exists()


@pytest.mark.parametrize(
    "repo_url, owner_name, repo_name",
    [
        ("https://github.com/octo-org/hello-world", "octo-org", "hello-world"),
        ("https://github.com/octo-org/hello.world.git", "octo-org", "hello.world"),
        ("https://github.com/a/b_c/", "a", "b_c"),
    ],
)
def test_it_binds_a_valid_repo_url(repo_url, owner_name, repo_name, owner, settings):
    settings.SANDBOX_GIT_BASE_URL = "https://git.internal.example"

    response = owner.client.post(URL, {"repoUrl": repo_url}, "json")

    assert response.status_code == 201, response.content
    session = response.json()["session"]
    assert session["repoOwner"] == owner_name
    assert session["repoName"] == repo_name
    assert session["cloneUrl"] == f"https://github.com/{owner_name}/{repo_name}.git"


@pytest.mark.parametrize(
    "repo_url",
    [
        "http://github.com/a/b",
        "https://gitlab.com/a/b",
        "https://github.com/a",
        "https://github.com/a/b/c",
        "https://github.com/-a/b",
        "https://github.com/a/..",
        "https://user:pw@github.com/a/b",
        "https://github.com/a/b?x=1",
        "git@github.com:a/b.git",
        "not a url",
    ],
)
def test_it_refuses_an_invalid_repo_url_naming_the_field(repo_url, owner):
    response = owner.client.post(URL, {"repoUrl": repo_url}, "json")

    assert _error(response, 400).startswith("repoUrl")
    assert not Session.objects.exists()


def test_it_ignores_unknown_body_fields(owner):
    response = owner.client.post(URL, {"title": "t", "sandboxType": "vercel", "x": [1]}, "json")

    assert response.status_code == 201, response.content
    assert response.json()["session"]["title"] == "t"


@pytest.mark.parametrize(
    "field, value",
    [
        ("title", 5),
        ("title", ["a"]),
        ("title", "x" * 301),
        ("organizationId", 123),
        ("organizationId", "not-a-uuid"),
        ("artistId", "not-a-uuid"),
        ("artistId", 42),
        ("repoUrl", []),
        ("repoUrl", 7),
    ],
    ids=lambda v: repr(v)[:20],
)
def test_it_refuses_a_wrongly_typed_field_naming_it(field, value, owner):
    response = owner.client.post(URL, {field: value}, "json")

    assert _error(response, 400).startswith(f"{field}:")
    assert not Session.objects.exists()


@pytest.mark.parametrize("raw", ['["title"]', '"title"', "42", "null"])
def test_it_refuses_a_body_that_is_not_an_object(raw, owner):
    response = owner.client.generic("POST", URL, raw, content_type="application/json")

    _error(response, 400)
    assert not Session.objects.exists()


# --- GET /api/sessions ----------------------------------------------------------------------


def test_it_lists_only_the_callers_sessions_newest_first(owner, member, stranger, make_session):
    old = make_session(owner, title="old", age=timedelta(hours=2))
    new = make_session(owner, title="new", age=timedelta(minutes=1))
    middle = make_session(owner, title="middle", age=timedelta(hours=1))
    make_session(member, title="member's")
    make_session(stranger, title="stranger's")

    response = owner.client.get(URL)

    assert response.status_code == 200
    body = response.json()
    assert [s["id"] for s in body["sessions"]] == [new.id, middle.id, old.id]
    assert body["pagination"] == {"limit": 50, "offset": 0, "hasMore": False}
    assert set(body["sessions"][0]) == SESSION_FIELDS


def test_it_filters_the_list_by_status(owner, make_session):
    make_session(owner, title="running")
    done = make_session(owner, title="done", status=Session.Status.COMPLETED)

    response = owner.client.get(URL, {"status": "completed"})

    assert response.status_code == 200
    assert [s["id"] for s in response.json()["sessions"]] == [done.id]
    assert owner.client.get(URL, {"status": "archived"}).json()["sessions"] == []


def test_it_pages_with_limit_offset_and_has_more(owner, make_session):
    ids = [make_session(owner, age=timedelta(minutes=i)).id for i in range(5)]  # newest first

    def page(**query):
        body = owner.client.get(URL, query).json()
        return [s["id"] for s in body["sessions"]], body["pagination"]

    assert page(limit=2) == (ids[:2], {"limit": 2, "offset": 0, "hasMore": True})
    assert page(limit=2, offset=2) == (ids[2:4], {"limit": 2, "offset": 2, "hasMore": True})
    assert page(limit=2, offset=4) == (ids[4:], {"limit": 2, "offset": 4, "hasMore": False})
    assert page(limit=5) == (ids, {"limit": 5, "offset": 0, "hasMore": False})
    assert page(limit=1, offset=9) == ([], {"limit": 1, "offset": 9, "hasMore": False})
    assert page(limit=100)[1] == {"limit": 100, "offset": 0, "hasMore": False}


def test_it_defaults_to_pages_of_fifty(owner):
    Session.objects.bulk_create([Session(account=owner.account, title=f"s{i}") for i in range(51)])

    body = owner.client.get(URL).json()

    assert len(body["sessions"]) == 50
    assert body["pagination"] == {"limit": 50, "offset": 0, "hasMore": True}


@pytest.mark.parametrize(
    "query, field",
    [
        ({"limit": 0}, "limit"),
        ({"limit": 101}, "limit"),
        ({"limit": "abc"}, "limit"),
        ({"limit": ""}, "limit"),
        ({"offset": -1}, "offset"),
        ({"offset": "x"}, "offset"),
        ({"offset": 2**63}, "offset"),
        ({"status": "paused"}, "status"),
    ],
    ids=repr,
)
def test_it_refuses_bad_list_parameters_naming_them(query, field, owner):
    assert _error(owner.client.get(URL, query), 400).startswith(f"{field}:")


# --- GET /api/sessions/{id} -----------------------------------------------------------------


def test_it_returns_the_owners_session(owner, make_session):
    session = make_session(owner, title="mine")

    response = owner.client.get(_detail(session.id))

    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"session"}
    assert body["session"]["id"] == session.id
    assert body["session"]["title"] == "mine"
    assert set(body["session"]) == SESSION_FIELDS


def test_it_answers_404_for_an_unknown_session(owner):
    assert "nope" in _error(owner.client.get(_detail("nope")), 404)


def test_it_answers_404_for_an_id_no_session_could_have(owner):
    # A NUL reaches the database as a query error on PostgreSQL unless refused first.
    _error(owner.client.get(_detail("%00abc")), 404)
    _error(owner.client.get(_detail("x" * 500)), 404)


def test_it_forbids_reading_another_accounts_session(owner, stranger, make_session):
    session = make_session(owner)
    _error(stranger.client.get(_detail(session.id)), 403)


def test_it_forbids_an_organization_peer_from_reading_the_owners_session(
    owner, member, org, make_session
):
    created = owner.client.post(URL, {"organizationId": str(org.id)}, "json")
    assert created.status_code == 201

    _error(member.client.get(_detail(created.json()["session"]["id"])), 403)


# --- PATCH /api/sessions/{id} ---------------------------------------------------------------


def test_it_updates_the_editable_fields_and_bumps_updated_at(owner, make_session):
    session = make_session(owner, title="before", age=timedelta(hours=1))
    before = _row(session.id)

    response = owner.client.patch(
        _detail(session.id),
        {"title": "after", "status": "completed", "linesAdded": 12, "linesRemoved": 0},
        "json",
    )

    assert response.status_code == 200, response.content
    body = response.json()["session"]
    assert (body["title"], body["status"]) == ("after", "completed")
    assert (body["linesAdded"], body["linesRemoved"]) == (12, 0)
    row = _row(session.id)
    assert (row["title"], row["status"], row["lines_added"]) == ("after", "completed", 12)
    assert row["updated_at"] > before["updated_at"] + timedelta(minutes=30)
    assert parse_datetime(body["updatedAt"]) == row["updated_at"]
    assert row["lifecycle_state"] == before["lifecycle_state"]
    assert row["lifecycle_version"] == before["lifecycle_version"]


def test_it_applies_a_partial_patch_leaving_other_fields(owner, make_session):
    session = make_session(owner, title="keep", lines_added=3)

    response = owner.client.patch(_detail(session.id), {"linesRemoved": 4}, "json")

    assert response.status_code == 200
    row = _row(session.id)
    assert (row["title"], row["lines_added"], row["lines_removed"]) == ("keep", 3, 4)


def test_it_accepts_the_largest_line_counts_the_column_holds(owner, make_session):
    session = make_session(owner)
    big = 2**31 - 1

    response = owner.client.patch(
        _detail(session.id), {"linesAdded": big, "linesRemoved": big}, "json"
    )

    assert response.status_code == 200, response.content
    assert (_row(session.id)["lines_added"], _row(session.id)["lines_removed"]) == (big, big)


def test_an_empty_patch_returns_the_session_unchanged(owner, make_session):
    session = make_session(owner, title="same", age=timedelta(hours=1))
    before = _row(session.id)

    response = owner.client.patch(_detail(session.id), {}, "json")

    assert response.status_code == 200
    assert parse_datetime(response.json()["session"]["updatedAt"]) == before["updated_at"]
    assert _row(session.id) == before


def test_a_patch_of_only_unknown_fields_changes_nothing(owner, make_session):
    session = make_session(owner, age=timedelta(hours=1))
    before = _row(session.id)

    response = owner.client.patch(
        _detail(session.id), {"lifecycleState": "active", "userId": str(uuid.uuid4())}, "json"
    )

    assert response.status_code == 200
    assert _row(session.id) == before


@pytest.mark.parametrize(
    "field, value",
    [
        ("title", ""),
        ("title", "   "),
        ("title", None),
        ("title", 5),
        ("title", "x" * 301),
        ("status", "paused"),
        ("status", None),
        ("status", 1),
        ("linesAdded", -1),
        ("linesAdded", 1.5),
        ("linesAdded", True),
        ("linesAdded", "7"),
        ("linesAdded", None),
        ("linesAdded", 2**31),
        ("linesRemoved", -5),
        ("linesRemoved", False),
        ("linesRemoved", "0"),
        ("linesRemoved", 10**20),
    ],
    ids=lambda v: repr(v)[:20],
)
def test_it_refuses_an_invalid_patch_and_leaves_the_row(field, value, owner, make_session):
    session = make_session(owner, title="untouched", age=timedelta(hours=1))
    before = _row(session.id)

    response = owner.client.patch(_detail(session.id), {"title": "new", field: value}, "json")

    assert _error(response, 400).startswith(f"{field}:")
    assert _row(session.id) == before


@pytest.mark.parametrize("raw", ['["title"]', '"title"'])
def test_it_refuses_a_patch_body_that_is_not_an_object(raw, owner, make_session):
    session = make_session(owner)
    response = owner.client.generic(
        "PATCH", _detail(session.id), raw, content_type="application/json"
    )
    _error(response, 400)


def test_a_patch_answers_404_for_an_unknown_session_before_validating(stranger):
    _error(stranger.client.patch(_detail("nope"), {"linesAdded": -1}, "json"), 404)


def test_a_patch_answers_403_for_another_accounts_session_before_validating(
    owner, member, stranger, make_session
):
    session = make_session(owner, title="owner's")
    before = _row(session.id)

    for intruder in (member, stranger):
        _error(intruder.client.patch(_detail(session.id), {"linesAdded": -1}, "json"), 403)
        _error(intruder.client.patch(_detail(session.id), {"title": "mine now"}, "json"), 403)

    assert _row(session.id) == before


def test_timestamps_round_trip_in_utc(owner, make_session):
    session = make_session(owner)
    body = owner.client.get(_detail(session.id)).json()["session"]
    created = parse_datetime(body["createdAt"])
    assert created == session.created_at
    assert abs(created - timezone.now()) < timedelta(minutes=1)
