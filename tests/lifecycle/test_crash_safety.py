"""SIGKILL at every step of hibernation and resume: the session converges with its files."""

import subprocess
import sys

import pytest
from django.core.files.storage import storages

from lifecycle import tasks
from sandboxes_app.models import session_sandbox_name
from sandboxes_app.providers.base import SandboxStatus, get_provider
from sessions_app.models import Session
from tests.support.api import new_session, sh, start_sandbox, wait_state
from tests.support.worker import ROOT, Worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

HIBERNATION_STEPS = [
    "hibernate_claimed",
    "hibernate_snapshot_written",
    "hibernate_snapshot_recorded",
    "hibernate_workspace_deleted",
]


def sweep_until(session_id: str, state: str, worker: Worker, timeout: float = 60) -> Session:
    """Call the sweep, as beat would, until the session reaches `state`."""
    return wait_for(
        lambda: (
            tasks.sweep(),
            Session.objects.filter(id=session_id, lifecycle_state=state).first(),
        )[1],
        timeout=timeout,
        interval=0.5,
        message=f"never {state}:\n{worker.log()[-4000:]}",
    )


@pytest.mark.parametrize("step", HIBERNATION_STEPS)
def test_a_worker_killed_mid_hibernation_converges_with_files_intact(
    step, owner, repo_url, worker, tmp_path, settings
):
    settings.LIFECYCLE_DISPATCH_GRACE = 1
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    sh(owner, session_id, "echo before-crash > state.txt && mkdir -p d && ln -s ../state.txt d/l")
    worker.stop()
    crashing = Worker(env=worker.env, log_path=tmp_path / "crash.log", queue=worker.queue)
    crashing.start(RECOUP_CRASH_AT=f"{step}:{tmp_path / 'fired'}", LIFECYCLE_LEASE_SECONDS="5")

    owner.client.post("/api/sandbox/hibernate", {"sessionId": session_id}, format="json")
    assert crashing.wait_exit(timeout=60) == -9, crashing.log()[-3000:]
    assert Session.objects.get(id=session_id).lifecycle_state == "hibernating"

    worker.start()  # the restarted worker; the sweep finds the expired lease
    session = sweep_until(session_id, "hibernated", worker)
    # Exactly the recorded snapshot is in storage: no object of the killed run is left over.
    _, stored = storages["snapshots"].listdir(f"sessions/{session_id}")
    assert [f"sessions/{session_id}/{name}" for name in stored] == [session.snapshot_url]

    start_sandbox(owner, session_id, repo_url)
    assert sh(owner, session_id, "cat state.txt d/l")["stdout"] == "before-crash\n" * 2


@pytest.mark.parametrize("step", ["resume_claimed", "resume_booted"])
def test_a_process_killed_mid_resume_converges_with_files_intact(
    step, owner, repo_url, worker, tmp_path, settings
):
    from lifecycle.hibernation import session_hibernate

    settings.LIFECYCLE_DISPATCH_GRACE = 1
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    sh(owner, session_id, "echo survives > s.txt")
    session_hibernate(session_id=session_id, actor="test", reason="idle")

    # The resume runs in another process (as in a web worker) that dies at `step`.
    script = (
        "from sandboxes_app.git.urls import RepoRef\n"
        "from sandboxes_app.services import session_sandbox_ensure\n"
        f"session_sandbox_ensure(session_id={session_id!r}, repo=RepoRef('acme', 'app'), "
        "actor='test')\n"
    )
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        timeout=120,
        env={
            **worker.env,
            "RECOUP_CRASH_AT": f"{step}:{tmp_path / 'fired'}",
            "LIFECYCLE_LEASE_SECONDS": "5",
        },
        capture_output=True,
        text=True,
    )
    assert result.returncode == -9, result.stderr[-3000:]
    assert Session.objects.get(id=session_id).lifecycle_state == "restoring"

    sweep_until(session_id, "hibernated", worker)
    assert get_provider().status(name=session_sandbox_name(session_id)) == SandboxStatus.ABSENT

    start_sandbox(owner, session_id, repo_url)
    assert sh(owner, session_id, "cat s.txt")["stdout"] == "survives\n"
    wait_state(session_id, "active")
