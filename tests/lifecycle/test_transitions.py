"""Compare-and-set transitions against real PostgreSQL, with real threads."""

import threading

import pytest
from django.db import IntegrityError, connections

from lifecycle.models import LifecycleEvent
from lifecycle.transitions import IllegalTransition, Seen, transition
from sandboxes_app.models import Sandbox
from sessions_app.models import Session


@pytest.fixture
def session(owner) -> Session:
    return Session.objects.create(account=owner.account, title="t")


@pytest.mark.django_db
def test_a_transition_bumps_the_version_and_records_an_event(session):
    before = session.updated_at

    moved = transition(
        session_id=session.id,
        seen=Seen.of(session),
        to="failed",
        reason="test",
        actor="tester",
        error="boom",
    )

    assert (moved.lifecycle_state, moved.lifecycle_version) == ("failed", 1)
    assert moved.lifecycle_error == "boom"
    assert moved.updated_at > before
    event = LifecycleEvent.objects.get(session=session)
    assert (event.from_state, event.to_state, event.version, event.actor, event.error) == (
        "provisioning",
        "failed",
        1,
        "tester",
        "boom",
    )


@pytest.mark.django_db
def test_a_transition_that_lost_its_race_changes_nothing(session):
    seen = Seen.of(session)
    assert transition(session_id=session.id, seen=seen, to="failed", reason="a", actor="x")

    lost = transition(session_id=session.id, seen=seen, to="active", reason="b", actor="y")

    assert lost is None
    session.refresh_from_db()
    assert (session.lifecycle_state, session.lifecycle_version) == ("failed", 1)
    assert LifecycleEvent.objects.filter(session=session).count() == 1


@pytest.mark.django_db
def test_the_state_table_refuses_an_illegal_move(session):
    with pytest.raises(IllegalTransition):
        transition(
            session_id=session.id, seen=Seen.of(session), to="hibernated", reason="x", actor="x"
        )
    session.refresh_from_db()
    assert session.lifecycle_version == 0


@pytest.mark.django_db(transaction=True)
def test_exactly_one_of_many_concurrent_transitions_wins(session):
    seen = Seen.of(session)
    winners: list[bool] = []
    barrier = threading.Barrier(8)

    def attempt(i: int) -> None:
        barrier.wait()
        try:
            moved = transition(
                session_id=session.id, seen=seen, to="active", reason=f"r{i}", actor="thread"
            )
            winners.append(moved is not None)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(winners) == [False] * 7 + [True]
    session.refresh_from_db()
    assert session.lifecycle_version == 1
    assert LifecycleEvent.objects.filter(session=session).count() == 1


@pytest.mark.django_db
def test_a_session_has_at_most_one_live_sandbox(session, owner):
    Sandbox.objects.create(name="sbx_a", session=session, account=owner.account, provider="local")
    with pytest.raises(IntegrityError):
        Sandbox.objects.create(
            name="sbx_b", session=session, account=owner.account, provider="local"
        )
