"""Checkpoints: an active sandbox that changed is snapshotted every SANDBOX_CHECKPOINT_INTERVAL
without stopping, so losing its host loses at most that much work."""

import threading
import time
from datetime import timedelta

import pytest
from django.core.files.storage import storages
from django.db import connection
from django.utils import timezone

from lifecycle import tasks
from lifecycle.checkpoints import session_checkpoint, sessions_claim_checkpoints
from lifecycle.hibernation import session_hibernate
from lifecycle.sweeps import sweep_run
from sandboxes_app.models import Sandbox, Snapshot, session_sandbox_name
from sandboxes_app.providers.base import get_provider
from sessions_app.models import Session
from tests.support.api import new_session, sh, start_sandbox, wait_state
from tests.support.worker import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def saved_long_ago(session_id: str) -> None:
    """Move the last save (and the activity after it) back past any interval, as waiting would."""
    past = timezone.now() - timedelta(hours=1)
    Session.objects.filter(id=session_id).update(
        workspace_saved_at=past, last_activity_at=past + timedelta(seconds=1)
    )


def stored_keys(session_id: str) -> set[str]:
    storage = storages["snapshots"]
    try:
        _, names = storage.listdir(f"sessions/{session_id}")
    except FileNotFoundError:
        return set()
    return {f"sessions/{session_id}/{name}" for name in names}


def live_snapshot_keys(session_id: str) -> set[str]:
    rows = Snapshot.objects.filter(session_id=session_id, deleted_at__isnull=True)
    return set(rows.values_list("storage_key", flat=True))


def lose_the_host(session_id: str) -> None:
    """What a dead host leaves: no workspace, and its Sandbox row recorded destroyed."""
    get_provider().destroy(name=session_sandbox_name(session_id))
    Sandbox.objects.filter(session_id=session_id).mark_destroyed()


def test_a_checkpointed_file_comes_back_after_the_workspace_is_lost(
    owner, repo_url, worker, settings
):
    settings.SANDBOX_CHECKPOINT_INTERVAL = 60
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    sh(owner, session_id, "echo checkpointed > saved.txt")
    saved_long_ago(session_id)

    tasks.sweep()

    wait_for(
        lambda: Session.objects.filter(id=session_id, current_snapshot__isnull=False).exists(),
        timeout=30,
        message=worker.log()[-3000:],
    )
    sh(owner, session_id, "echo after > unsaved.txt")
    lose_the_host(session_id)

    start_sandbox(owner, session_id, repo_url)

    assert Session.objects.get(id=session_id).sandbox_state["boot"] == "resume"
    assert sh(owner, session_id, "cat saved.txt")["stdout"] == "checkpointed\n"
    assert sh(owner, session_id, "cat README.md")["stdout"] == "# app\n"
    assert sh(owner, session_id, "test -e unsaved.txt; echo $?")["stdout"] == "1\n"


def test_an_unchanged_sandbox_is_not_checkpointed_twice(owner, repo_url, settings):
    settings.SANDBOX_CHECKPOINT_INTERVAL = 1
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    assert sessions_claim_checkpoints(limit=10) == []  # a fresh clone holds nothing unsaved
    sh(owner, session_id, "echo once > once.txt")
    saved_long_ago(session_id)
    assert sessions_claim_checkpoints(limit=10) == [session_id]
    first = session_checkpoint(session_id=session_id, actor="test")
    assert first is not None

    time.sleep(1.1)  # past the interval, with no activity since

    Session.objects.filter(id=session_id).update(checkpoint_dispatched_at=None)
    assert sessions_claim_checkpoints(limit=10) == []
    assert session_checkpoint(session_id=session_id, actor="test") is None
    assert Snapshot.objects.filter(session_id=session_id).count() == 1
    assert stored_keys(session_id) == {first.storage_key}


def test_interval_zero_schedules_nothing(owner, repo_url, settings):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    sh(owner, session_id, "echo work > w.txt")
    saved_long_ago(session_id)
    dispatched = []

    settings.SANDBOX_CHECKPOINT_INTERVAL = 0
    sweep_run(limit=10, enqueue=dispatched.append)

    assert dispatched == []
    assert Session.objects.get(id=session_id).checkpoint_dispatched_at is None
    settings.SANDBOX_CHECKPOINT_INTERVAL = 60  # the same session, with checkpoints on
    sweep_run(limit=10, enqueue=dispatched.append)
    assert [(d.session_id, d.reason) for d in dispatched] == [(session_id, "checkpoint")]
    sweep_run(limit=10, enqueue=dispatched.append)  # dispatched: not sent again
    assert len(dispatched) == 1


def test_a_checkpoint_does_not_move_the_idle_clock(owner, repo_url):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    sh(owner, session_id, "echo x > x.txt")
    before = Session.objects.get(id=session_id)

    assert session_checkpoint(session_id=session_id, actor="test") is not None

    after = Session.objects.get(id=session_id)
    assert after.hibernate_after == before.hibernate_after
    assert after.last_activity_at == before.last_activity_at
    assert after.lifecycle_version == before.lifecycle_version
    assert after.current_snapshot_id is not None


def test_the_previous_checkpoint_is_deleted_once_a_newer_one_is_current(owner, repo_url):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    sh(owner, session_id, "echo one > f.txt")
    first = session_checkpoint(session_id=session_id, actor="test")
    sh(owner, session_id, "echo two > f.txt")

    second = session_checkpoint(session_id=session_id, actor="test")

    assert second is not None and second.id != first.id
    assert Session.objects.get(id=session_id).current_snapshot_id == second.id
    assert Snapshot.objects.get(id=first.id).deleted_at is not None
    assert stored_keys(session_id) == {second.storage_key}
    lose_the_host(session_id)
    start_sandbox(owner, session_id, repo_url)
    assert sh(owner, session_id, "cat f.txt")["stdout"] == "two\n"


def _checkpoint_in_thread(session_id: str, outcome: list) -> threading.Thread:
    def run() -> None:
        try:
            outcome.append(session_checkpoint(session_id=session_id, actor="test"))
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _assert_hibernated_with_one_verified_snapshot(session_id: str) -> Snapshot:
    session = Session.objects.select_related("current_snapshot").get(id=session_id)
    assert session.lifecycle_state == "hibernated"
    current = session.current_snapshot
    assert current is not None and current.deleted_at is None
    get_provider().verify_snapshot(snapshot=current.to_info())
    # Nothing leaked: storage holds exactly the one snapshot the session needs.
    assert stored_keys(session_id) == live_snapshot_keys(session_id) == {current.storage_key}
    return current


def test_a_checkpoint_in_flight_loses_to_a_hibernation_and_leaves_nothing(owner, repo_url):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    # Incompressible, so the checkpoint's tar is still being written when the hibernation starts.
    sh(owner, session_id, "head -c 40000000 /dev/urandom > big.bin; echo kept > kept.txt")
    outcome: list = []

    checkpoint = _checkpoint_in_thread(session_id, outcome)
    wait_for(
        lambda: any(".tmp-" in key for key in stored_keys(session_id)), timeout=10, interval=0.001
    )
    hibernated = session_hibernate(session_id=session_id, actor="test", reason="idle")
    checkpoint.join()

    assert hibernated is not None
    assert outcome == [None]  # the hibernation moved the session first: the checkpoint lost
    _assert_hibernated_with_one_verified_snapshot(session_id)
    start_sandbox(owner, session_id, repo_url)
    assert sh(owner, session_id, "cat kept.txt")["stdout"] == "kept\n"


@pytest.mark.parametrize("head_start", [0.0, 0.02, 0.1, 0.3])
def test_a_checkpoint_racing_a_hibernation_never_loses_the_snapshot_or_leaks(
    owner, repo_url, head_start
):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    sh(owner, session_id, "head -c 8000000 /dev/urandom > big.bin; echo raced > r.txt")
    outcome: list = []

    checkpoint = _checkpoint_in_thread(session_id, outcome)
    time.sleep(head_start)
    hibernated = session_hibernate(session_id=session_id, actor="test", reason="idle")
    checkpoint.join()

    assert hibernated is not None  # the checkpoint never makes a hibernation fail
    current = _assert_hibernated_with_one_verified_snapshot(session_id)
    assert outcome[0] is None or outcome[0].id != current.id  # a winning checkpoint was replaced
    start_sandbox(owner, session_id, repo_url)
    assert sh(owner, session_id, "cat r.txt")["stdout"] == "raced\n"
    wait_state(session_id, "active")


def test_of_two_checkpoints_at_once_one_is_current_and_the_other_leaves_nothing(owner, repo_url):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    sh(owner, session_id, "head -c 40000000 /dev/urandom > big.bin; echo both > b.txt")
    outcomes: list = []

    first = _checkpoint_in_thread(session_id, outcomes)
    wait_for(
        lambda: any(".tmp-" in key for key in stored_keys(session_id)), timeout=10, interval=0.001
    )
    second = _checkpoint_in_thread(session_id, outcomes)  # sees the same session as the first
    first.join()
    second.join()

    winners = [snapshot for snapshot in outcomes if snapshot is not None]
    assert len(winners) == 1
    session = Session.objects.get(id=session_id)
    assert session.current_snapshot_id == winners[0].id
    assert stored_keys(session_id) == live_snapshot_keys(session_id) == {winners[0].storage_key}
