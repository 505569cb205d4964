"""The status poll and reconnect's database part: one query of only the columns they read, and
the same answers as a read of the whole row."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from lifecycle.states import LifecycleState as S
from sandboxes_app import selectors
from sandboxes_app.models import Sandbox, Snapshot
from sessions_app.models import Session

pytestmark = pytest.mark.django_db
STATUS = "/api/sandbox/status"
RECONNECT = "/api/sandbox/reconnect"


def _session(owner, state: str, *, snapshot: str | None = None, **columns) -> Session:
    now = timezone.now()
    deadlines = {
        "last_activity_at": now - timedelta(seconds=30),
        "hibernate_after": now + timedelta(minutes=5),
        "sandbox_expires_at": now + timedelta(hours=1),
    }
    session = Session.objects.create(
        account=owner.account,
        title="t",
        lifecycle_state=state,
        lifecycle_version=4,
        **{**deadlines, **columns},
    )
    if snapshot is not None:
        gone = {"deleted": {"deleted_at": now}, "expired": {"expires_at": now}}.get(snapshot, {})
        session.current_snapshot = Snapshot.objects.create(
            kind="session",
            storage_key=f"s/{session.id}",
            size_bytes=1,
            sha256="0" * 64,
            session=session,
            account=owner.account,
            created_at=now,
            **gone,
        )
        session.save(update_fields=["current_snapshot"])
    return session


def _without_clock(body: dict) -> dict:
    return {**body, "lifecycle": {**body["lifecycle"], "serverTime": None}}


CASES = [
    (S.ACTIVE, None, {}),
    (S.ACTIVE, "live", {"sandbox_expires_at": timezone.now() - timedelta(seconds=1)}),
    (S.HIBERNATED, "live", {}),
    (S.HIBERNATED, "deleted", {"hibernate_after": None, "sandbox_expires_at": None}),
    (S.HIBERNATED, "expired", {}),
    (S.PROVISIONING, None, {"last_activity_at": None}),
    (S.PROVISIONING, None, {"provisioning_phase": "cloning", "provisioning_percent": 40}),
    (S.RESTORING, "live", {"provisioning_phase": "starting"}),
    (S.RESTORING, "live", {}),
    (S.HIBERNATING, "live", {}),
    (S.ARCHIVED, "live", {}),
    (S.FAILED, None, {}),
    (None, None, {}),
]


@pytest.mark.parametrize("state, snapshot, columns", CASES)
def test_the_poll_answers_what_a_full_read_of_the_row_says(owner, state, snapshot, columns):
    session = _session(owner, state, snapshot=snapshot, **columns)
    expected = selectors.session_sandbox_status(Session.objects.get(id=session.id))

    response = owner.client.get(STATUS, {"sessionId": session.id})

    assert response.status_code == 200
    assert _without_clock(response.json()) == _without_clock(expected)


@pytest.mark.parametrize(
    "state, phase, percent, expected",
    [
        (S.PROVISIONING, "cloning", 45, {"phase": "cloning", "percent": 45}),
        (S.RESTORING, "starting", None, {"phase": "starting", "percent": None}),
        (S.PROVISIONING, None, None, None),  # a new session nobody asked a sandbox of yet
        (S.ACTIVE, "cloning", 100, None),  # only while provisioning or restoring
        (S.HIBERNATED, None, None, None),
    ],
)
def test_the_poll_says_how_far_provisioning_is(owner, state, phase, percent, expected):
    session = _session(owner, state, provisioning_phase=phase, provisioning_percent=percent)

    response = owner.client.get(STATUS, {"sessionId": session.id})

    assert response.json()["provisioning"] == expected


def test_the_status_poll_is_one_narrow_query_on_a_warm_cache(owner, django_assert_num_queries):
    session = _session(owner, S.HIBERNATED, snapshot="live")
    owner.client.get(STATUS, {"sessionId": session.id})  # the key's lookup, last_used_at

    with django_assert_num_queries(1) as captured:
        response = owner.client.get(STATUS, {"sessionId": session.id})

    assert response.json()["hasSnapshot"] is True
    sql = captured.captured_queries[0]["sql"]
    for column in ("title", "cached_diff", "sandbox_state", "storage_key", "sha256"):
        assert f'."{column}"' not in sql


@pytest.mark.parametrize(
    "state, snapshot, sandbox, outcome",
    [
        (S.PROVISIONING, None, None, "no_sandbox"),
        (S.HIBERNATED, "live", None, "expired"),
        (S.HIBERNATED, None, "destroyed", "expired"),
        (S.ARCHIVED, None, "live", "expired"),
    ],
)
def test_reconnect_reads_the_database_in_one_query(
    owner, django_assert_num_queries, state, snapshot, sandbox, outcome
):
    session = _session(owner, state, snapshot=snapshot)
    if sandbox is not None:
        destroyed_at = timezone.now() if sandbox == "destroyed" else None
        Sandbox.objects.create(
            name=f"s-{session.id}",
            session=session,
            account=owner.account,
            provider="local",
            destroyed_at=destroyed_at,
        )
    owner.client.get(STATUS, {"sessionId": session.id})  # warm the credential cache

    with django_assert_num_queries(1):
        response = owner.client.get(RECONNECT, {"sessionId": session.id})

    assert response.status_code == 200
    assert response.json()["status"] == outcome
    assert response.json()["hasSnapshot"] is (snapshot == "live")


def test_the_poll_answers_404_then_403_as_before(owner, stranger):
    session = _session(owner, S.ACTIVE)

    assert owner.client.get(STATUS, {"sessionId": "nope"}).status_code == 404
    assert stranger.client.get(STATUS, {"sessionId": session.id}).status_code == 403
    assert stranger.client.get(RECONNECT, {"sessionId": session.id}).status_code == 403


def _prepared_polls() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
            ["%has_live_snapshot%"],
        )
        return cursor.fetchone()[0]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements: PostgreSQL")
@pytest.mark.parametrize("prepared", [True, False])
def test_the_poll_is_prepared_once_per_connection_unless_turned_off(owner, settings, prepared):
    settings.DB_PREPARED_POLL = prepared
    session = _session(owner, S.HIBERNATED, snapshot="live")
    before = _prepared_polls()

    answers = [owner.client.get(STATUS, {"sessionId": session.id}).json() for _ in range(3)]

    assert _prepared_polls() - before == (1 if prepared and before == 0 else 0)
    assert [a["hasSnapshot"] for a in answers] == [True] * 3
    assert {a["lifecycle"]["state"] for a in answers} == {S.HIBERNATED}
