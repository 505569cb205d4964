"""The timed lifecycle: sweeps hand due sessions to a real Celery worker, which hibernates them
through the local provider; resume brings every file back."""

import json
import threading
import time
from datetime import timedelta

import pytest
from django.core.files.storage import storages
from django.utils import timezone

from lifecycle import tasks
from lifecycle.hibernation import session_hibernate
from lifecycle.models import LifecycleEvent
from sandboxes_app.models import Snapshot, session_sandbox_name
from sandboxes_app.providers.base import SandboxStatus, get_provider
from sessions_app.models import Session
from tests.support.api import (
    MANIFEST_SCRIPT,
    TREE_SCRIPT,
    make_overdue,
    new_session,
    sh,
    start_sandbox,
    wait_state,
)
from tests.support.worker import Worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
# The worker's one line per task, once it has run (recoup.celery).
TASK_DONE = '"task": "lifecycle.hibernate_session"'


def test_an_idle_sandbox_is_hibernated_by_the_sweep(owner, repo_url, worker, fast_sweep):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    sh(owner, session_id, "echo kept > kept.txt")
    tasks.sweep()  # nothing is due yet
    assert Session.objects.get(id=session_id).lifecycle_state == "active"

    make_overdue(session_id, "hibernate_after")
    tasks.sweep()

    session = wait_state(session_id, "hibernated", worker)
    assert session.snapshot_size_bytes > 0 and session.snapshot_url
    assert (session.hibernate_after, session.sandbox_expires_at) == (None, None)
    assert get_provider().status(name=session_sandbox_name(session_id)) == SandboxStatus.ABSENT
    assert LifecycleEvent.objects.filter(session_id=session_id, reason="idle").exists()
    task_lines = [
        json.loads(line[line.index("{") :])
        for line in worker.log().splitlines()
        if '{"event": "task"' in line
    ]
    assert {
        "event": "task",
        "task": "lifecycle.hibernate_session",
        "state": "SUCCESS",
        "session_id": session_id,
    }.items() <= task_lines[-1].items()


def test_an_expiring_sandbox_is_hibernated_before_it_expires(owner, repo_url, worker, settings):
    settings.LIFECYCLE_EXPIRY_BUFFER = 60
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    Session.objects.filter(id=session_id).update(
        sandbox_expires_at=timezone.now() + timedelta(seconds=30),
        hibernate_after=timezone.now() + timedelta(hours=1),
    )

    tasks.sweep()

    wait_state(session_id, "hibernated", worker)
    assert LifecycleEvent.objects.filter(session_id=session_id, reason="expiry").exists()


def test_status_kicks_the_workflow_for_an_overdue_session(owner, repo_url, worker):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    make_overdue(session_id, "hibernate_after", "sandbox_expires_at")

    body = owner.client.get("/api/sandbox/status", {"sessionId": session_id}).json()

    assert body["status"] == "no_sandbox"  # expired is not active, even before the worker runs
    wait_state(session_id, "hibernated", worker)


def test_a_running_command_keeps_the_sandbox_awake(owner, repo_url, worker, fast_sweep):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    # Long enough to outlast the sweep and its task on a loaded machine.
    command = threading.Thread(target=sh, args=(owner, session_id, "sleep 8"))
    command.start()
    name = session_sandbox_name(session_id)
    wait_for(lambda: get_provider().running_commands(name=name) > 0, timeout=10)
    make_overdue(session_id, "hibernate_after")

    tasks.sweep()
    wait_for(lambda: worker.log().count(TASK_DONE) >= 1, timeout=30, message=worker.log())
    assert Session.objects.get(id=session_id).lifecycle_state == "active"

    command.join()
    make_overdue(session_id, "hibernate_after")
    time.sleep(1.1)  # the dispatch grace
    tasks.sweep()
    wait_state(session_id, "hibernated", worker)


def test_a_stale_task_after_a_resume_changes_nothing(owner, repo_url):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    scheduled_version = Session.objects.get(id=session_id).lifecycle_version
    session_hibernate(session_id=session_id, actor="test", reason="idle")
    start_sandbox(owner, session_id, repo_url)  # resumed: the version moved on
    resumed = Session.objects.get(id=session_id)

    tasks.hibernate_session(session_id, scheduled_version, "idle")

    after = Session.objects.get(id=session_id)
    assert after.lifecycle_state == "active"
    assert after.lifecycle_version == resumed.lifecycle_version
    assert get_provider().status(name=session_sandbox_name(session_id)) == SandboxStatus.RUNNING


def test_files_survive_ten_hibernate_resume_cycles_byte_for_byte(owner, repo_url):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    sh(owner, session_id, TREE_SCRIPT)
    manifest = sh(owner, session_id, MANIFEST_SCRIPT)["stdout"]
    assert "big.bin" in manifest and "link-to-main l 777 src/main.py" in manifest

    for cycle in range(10):
        assert session_hibernate(session_id=session_id, actor="test", reason=f"cycle{cycle}")
        assert Session.objects.get(id=session_id).lifecycle_state == "hibernated"
        start_sandbox(owner, session_id, repo_url)
        assert sh(owner, session_id, MANIFEST_SCRIPT)["stdout"] == manifest, f"cycle {cycle}"

    live = Snapshot.objects.filter(session_id=session_id, deleted_at__isnull=True)
    assert live.count() == 1  # each cycle's predecessor was discarded


def test_a_stuck_hibernation_lease_is_reclaimed(owner, repo_url, worker, fast_sweep):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    sh(owner, session_id, "echo precious > p.txt")
    session = Session.objects.get(id=session_id)
    # A run claimed the session and died without a trace but its lease.
    Session.objects.filter(id=session_id).update(
        lifecycle_state="hibernating",
        lifecycle_version=session.lifecycle_version + 1,
        lifecycle_run_id="run_dead",
        lifecycle_lease_expires_at=timezone.now() - timedelta(1),
    )

    tasks.sweep()

    wait_state(session_id, "hibernated", worker)
    assert LifecycleEvent.objects.filter(session_id=session_id, reason="lease_reclaimed").exists()
    start_sandbox(owner, session_id, repo_url)
    assert sh(owner, session_id, "cat p.txt")["stdout"] == "precious\n"


def test_after_a_host_restart_the_sweep_hibernates_from_disk(owner, repo_url, worker):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    sh(owner, session_id, "echo unsaved > work.txt; sleep 1000 >/dev/null 2>&1 &")
    name = session_sandbox_name(session_id)
    get_provider().stop(name=name)  # every process of the sandbox is gone
    assert get_provider().status(name=name) == SandboxStatus.STOPPED
    make_overdue(session_id, "hibernate_after")

    tasks.sweep()

    wait_state(session_id, "hibernated", worker)
    start_sandbox(owner, session_id, repo_url)
    assert sh(owner, session_id, "cat work.txt")["stdout"] == "unsaved\n"


def test_archive_hibernates_and_unarchive_waits_for_the_snapshot(
    owner, repo_url, tmp_path, worker, settings
):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    sh(owner, session_id, "echo archived > a.txt")
    worker.stop()
    crashing = Worker(env=worker.env, log_path=tmp_path / "crash.log", queue=worker.queue)
    crashing.start(
        RECOUP_CRASH_AT=f"hibernate_snapshot_written:{tmp_path / 'fired'}",
        LIFECYCLE_LEASE_SECONDS="5",
    )

    patched = owner.client.patch(
        f"/api/sessions/{session_id}", {"status": "archived"}, format="json"
    )
    assert patched.status_code == 200
    assert crashing.wait_exit(timeout=60) == -9  # killed mid-archive, snapshot half recorded
    assert Session.objects.get(id=session_id).lifecycle_state == "hibernating"

    refused = owner.client.patch(
        f"/api/sessions/{session_id}", {"status": "running"}, format="json"
    )
    assert refused.status_code == 409
    assert refused.json()["status"] == "error"
    blocked = owner.client.post(
        "/api/sandbox", {"repoUrl": repo_url, "sessionId": session_id}, format="json"
    )
    assert blocked.status_code == 409

    worker.start()
    settings.LIFECYCLE_DISPATCH_GRACE = 1
    wait_for(
        lambda: (
            (tasks.sweep(), Session.objects.get(id=session_id).lifecycle_state)[1] == "archived"
        ),
        timeout=60,
        interval=1,
        message=worker.log()[-3000:],
    )

    unarchived = owner.client.patch(
        f"/api/sessions/{session_id}", {"status": "running"}, format="json"
    )
    assert unarchived.status_code == 200
    assert unarchived.json()["session"]["lifecycleState"] == "hibernated"
    start_sandbox(owner, session_id, repo_url)
    assert sh(owner, session_id, "cat a.txt")["stdout"] == "archived\n"


def test_retention_deletes_old_snapshots_and_the_next_post_starts_fresh(owner, repo_url, settings):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    sh(owner, session_id, "echo gone-after-retention > README.md")
    session_hibernate(session_id=session_id, actor="test", reason="idle")
    snapshot = Session.objects.get(id=session_id).current_snapshot
    Snapshot.objects.filter(id=snapshot.id).update(
        created_at=timezone.now() - timedelta(days=settings.SNAPSHOT_RETENTION_DAYS + 1)
    )

    tasks.retention_sweep()

    assert not storages["snapshots"].exists(snapshot.storage_key)
    status = owner.client.get("/api/sandbox/status", {"sessionId": session_id}).json()
    assert status["hasSnapshot"] is False
    start_sandbox(owner, session_id, repo_url)
    assert sh(owner, session_id, "cat README.md")["stdout"] == "# app\n"


def test_oneshot_sandboxes_are_destroyed_at_their_timeout(owner, repo_url):
    from sandboxes_app.models import Sandbox

    owner.client.post("/api/sandbox", {"repoUrl": repo_url}, format="json")
    sandbox = Sandbox.objects.get(account=owner.account, session__isnull=True)
    Sandbox.objects.filter(id=sandbox.id).update(expires_at=timezone.now() - timedelta(1))

    tasks.sweep()

    sandbox.refresh_from_db()
    assert sandbox.destroyed_at is not None
    assert get_provider().status(name=sandbox.name) == SandboxStatus.ABSENT
    listed = owner.client.get("/api/sandboxes").json()["sandboxes"]
    assert [(s["sandboxId"], s["sandboxStatus"]) for s in listed] == [(sandbox.name, "stopped")]


def test_a_failed_hibernation_keeps_the_workspace_and_is_retried_with_backoff(
    owner, repo_url, settings, tmp_path
):
    from lifecycle.sweeps import session_retry_failed

    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    sh(owner, session_id, "echo keep-me > k.txt")
    good_storage = settings.STORAGES
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the snapshot storage should be")
    settings.STORAGES = {
        **good_storage,
        "snapshots": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(blocker / "snapshots")},
        },
    }

    assert session_hibernate(session_id=session_id, actor="test", reason="idle")

    failed = Session.objects.get(id=session_id)
    assert failed.lifecycle_state == "failed" and "Hibernation failed" in failed.lifecycle_error
    assert failed.lifecycle_attempts == 1
    assert failed.lifecycle_retry_at > timezone.now() + timedelta(seconds=5)  # backoff
    name = session_sandbox_name(session_id)
    assert get_provider().status(name=name) != SandboxStatus.ABSENT  # workspace kept
    tasks.sweep()  # not due yet: nothing moves
    assert Session.objects.get(id=session_id).lifecycle_version == failed.lifecycle_version

    settings.STORAGES = good_storage
    retried = session_retry_failed(
        session_id=session_id, version=failed.lifecycle_version, actor="sweep"
    )

    assert retried.lifecycle_state == "hibernated" and retried.lifecycle_attempts == 0
    start_sandbox(owner, session_id, repo_url)
    assert sh(owner, session_id, "cat k.txt")["stdout"] == "keep-me\n"


def test_an_idle_task_leaves_a_session_touched_since_it_was_found(owner, repo_url):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    make_overdue(session_id, "hibernate_after")
    found_version = Session.objects.get(id=session_id).lifecycle_version
    owner.client.post("/api/sandbox/activity", {"sessionId": session_id}, format="json")

    tasks.hibernate_session(session_id, found_version, "idle", require_idle=True)

    session = Session.objects.get(id=session_id)
    assert (session.lifecycle_state, session.lifecycle_version) == ("active", found_version)


def test_a_runtime_found_dead_by_reconnect_is_hibernated_from_disk(owner, repo_url, worker):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    sh(owner, session_id, "echo on-disk > d.txt")
    get_provider().stop(name=session_sandbox_name(session_id))

    probe = owner.client.get("/api/sandbox/reconnect", {"sessionId": session_id}).json()
    assert (probe["status"], probe["hasSnapshot"]) == ("expired", False)
    tasks.sweep()

    wait_state(session_id, "hibernated", worker)
    after = owner.client.get("/api/sandbox/reconnect", {"sessionId": session_id}).json()
    assert (after["status"], after["hasSnapshot"]) == ("expired", True)
    start_sandbox(owner, session_id, repo_url)
    assert sh(owner, session_id, "cat d.txt")["stdout"] == "on-disk\n"


def test_a_status_kick_waits_for_a_running_command_unless_expired(owner, repo_url, worker):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    # Long enough to outlast the sweep and its task on a loaded machine.
    command = threading.Thread(target=sh, args=(owner, session_id, "sleep 8"))
    command.start()
    name = session_sandbox_name(session_id)
    wait_for(lambda: get_provider().running_commands(name=name) > 0, timeout=10)
    make_overdue(session_id, "hibernate_after")

    owner.client.get("/api/sandbox/status", {"sessionId": session_id})
    wait_for(lambda: worker.log().count(TASK_DONE) >= 1, timeout=30, message=worker.log())
    assert Session.objects.get(id=session_id).lifecycle_state == "active"

    make_overdue(session_id, "sandbox_expires_at")  # now past expiry: the command loses
    owner.client.get("/api/sandbox/status", {"sessionId": session_id})
    wait_state(session_id, "hibernated", worker)
    command.join()
