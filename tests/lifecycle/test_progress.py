"""Provisioning progress as a run reports it: stored on the session for the status poll and
published on its channel, throttled, and only while the run holds the session."""

import time

import pytest

from lifecycle.leases import lease_claim
from lifecycle.progress import ProvisioningProgress
from lifecycle.states import LifecycleState as S
from lifecycle.transitions import Seen, transition
from recoup import bus
from sessions_app.models import Session
from tests.support.api import new_session

pytestmark = pytest.mark.django_db(transaction=True)


def claimed(owner, run_id: str) -> Session:
    session = Session.objects.get(id=new_session(owner))
    return transition(
        session_id=session.id,
        seen=Seen.of(session),
        to=S.PROVISIONING,
        reason="create",
        actor="test",
        changes=lease_claim(run_id),
    )


def drain(subscription) -> list[dict]:
    got = []
    while (message := subscription.get(timeout=0.3)) is not None:
        got.append(message)
    return got


def test_a_claim_stores_queued_and_leaving_clears_it(owner):
    session = claimed(owner, "run_a")
    assert (session.provisioning_phase, session.provisioning_percent) == ("queued", None)

    failed = transition(
        session_id=session.id, seen=Seen.of(session), to=S.FAILED, reason="x", actor="test"
    )

    assert (failed.provisioning_phase, failed.provisioning_percent) == (None, None)


def test_every_percent_of_git_becomes_one_report_in_five(owner):
    session = claimed(owner, "run_a")
    progress = ProvisioningProgress(session_id=session.id, run_id="run_a", version=1)
    with bus.subscribe(f"session:{session.id}") as subscription:
        progress("cloning", 0)
        for percent in range(1, 101):
            progress("cloning", percent)
        progress("cloning", 100)  # a repeat says nothing new
        progress("starting")
        messages = drain(subscription)

    reports = [(m["data"]["phase"], m["data"]["percent"]) for m in messages]
    cloning = [percent for phase, percent in reports if phase == "cloning"]
    assert cloning[0] == 0 and cloning[-1] == 100
    assert 20 <= len(cloning) <= 22, cloning  # every 5 percent (the run was quicker than 250 ms)
    assert reports[-1] == ("starting", None)
    assert {m["version"] for m in messages} == {1}
    stored = Session.objects.get(id=session.id)
    assert (stored.provisioning_phase, stored.provisioning_percent) == ("starting", None)


def test_a_slow_percent_is_reported_after_250_ms(owner):
    session = claimed(owner, "run_a")
    progress = ProvisioningProgress(session_id=session.id, run_id="run_a", version=1)
    with bus.subscribe(f"session:{session.id}") as subscription:
        progress("cloning", 10)
        progress("cloning", 11)  # too soon, too small
        time.sleep(0.3)
        progress("cloning", 12)
        messages = drain(subscription)

    assert [m["data"]["percent"] for m in messages] == [10, 12]


def test_a_run_that_lost_the_session_reports_nothing(owner):
    session = claimed(owner, "run_a")
    reclaimed = transition(
        session_id=session.id,
        seen=Seen.of(session),
        to=S.PROVISIONING,
        reason="reclaim",
        actor="test",
        changes=lease_claim("run_b"),
    )
    stale = ProvisioningProgress(session_id=session.id, run_id="run_a", version=1)
    with bus.subscribe(f"session:{session.id}") as subscription:
        stale("cloning", 50)
        stale("starting")
        messages = drain(subscription)

    assert messages == []
    current = Session.objects.get(id=session.id)
    assert current.lifecycle_version == reclaimed.lifecycle_version
    assert (current.provisioning_phase, current.provisioning_percent) == ("queued", None)
