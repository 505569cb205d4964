"""Chaos: SIGKILL the worker, a web process or beat at random moments of create, resume,
hibernate and base builds; after each kill the system converges, by itself, within 30 s.

Seeded and bounded: CHAOS_SEED picks the operations, victims and moments, CHAOS_ITERATIONS how
many (a few in the suite; run more by hand, e.g. CHAOS_ITERATIONS=40). Default lifecycle
settings (a 10 s lease renewed every 2 s), except a 1 s sweep interval for beat.

After every iteration:
- the session is in a settled state (active, hibernated or failed; never a busy state held by
  a dead run) within 30 s, and then comes up with every file it had (sha256, inside);
- storage holds exactly the snapshots the database records for it (no orphan of a killed run);
- no base build is left `running`, and no base object is unrecorded;
- no cgroup of ours belongs to a sandbox that is gone, none holds processes of a sandbox that
  is not running, and none is frozen.
"""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.files.storage import storages

from lifecycle.bases import base_build_enqueue
from lifecycle.hibernation import session_hibernate
from lifecycle.models import BaseSnapshotBuild
from sandboxes_app.models import Sandbox, Snapshot, session_sandbox_name
from sandboxes_app.providers.base import SandboxStatus
from sandboxes_app.providers.local import LocalProvider
from sessions_app.models import Session
from tests.support.api import new_session, sh, start_sandbox
from tests.support.worker import ROOT, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SEED = int(os.environ.get("CHAOS_SEED", "20261123"))
ITERATIONS = int(os.environ.get("CHAOS_ITERATIONS", "5"))
CONVERGE_S = 30
SETTLED = ("active", "hibernated", "failed")
# What the sandbox writes before the kill, and checks after: a small file and a 4 MB blob.
WRITE = "echo $RANDOM$RANDOM > notes.txt && head -c 16M /dev/urandom > blob.bin"
DIGEST = "sha256sum notes.txt blob.bin README.md"
# How long each operation takes here, once claimed: the kill lands somewhere inside.
WINDOW_S = {"create": 0.2, "resume": 0.3, "hibernate": 0.4, "base build": 0.3}


class Beat:
    """`celery beat` sending the sweep every second to the worker's queue."""

    def __init__(self, *, env: dict[str, str], queue: str, tmp: Path) -> None:
        self.env = {**env, "CELERY_TASK_DEFAULT_QUEUE": queue, "LIFECYCLE_SWEEP_INTERVAL": "1"}
        self.schedule = tmp / "beat-schedule"
        self.log_path = tmp / "beat.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> "Beat":
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "recoup", "beat", "-s", str(self.schedule)],
            cwd=ROOT,
            env=self.env,
            stdout=open(self.log_path, "ab"),  # noqa: SIM115 - handed to the child
            stderr=subprocess.STDOUT,
        )
        return self

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)


def web_process(env: dict[str, str], script: str) -> subprocess.Popen:
    """A process doing what a web worker does for POST /api/sandbox."""
    return subprocess.Popen(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def ensure_script(session_id: str) -> str:
    return (
        "from sandboxes_app.git.urls import RepoRef\n"
        "from sandboxes_app.services import session_sandbox_ensure\n"
        f"session_sandbox_ensure(session_id={session_id!r}, repo=RepoRef('acme', 'app'), "
        "actor='chaos')\n"
    )


def kill_during(process: subprocess.Popen, *, started, delay: float) -> None:
    """SIGKILL `process` `delay` seconds after `started()` says its work began (or at once
    if it ended first)."""
    deadline = time.monotonic() + 30
    while not started() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(delay)
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    process.wait(timeout=120)


def claimed(session_id: str):
    return lambda: Session.objects.filter(id=session_id, lifecycle_run_id__isnull=False).exists()


def describe(session_id: str) -> dict:
    return Session.objects.filter(id=session_id).values(
        "lifecycle_state",
        "lifecycle_version",
        "lifecycle_run_id",
        "lifecycle_lease_expires_at",
        "lifecycle_dispatched_at",
        "lifecycle_retry_at",
    )[0]


def settled(session_id: str) -> Session | None:
    session = Session.objects.get(id=session_id)
    if session.lifecycle_state in SETTLED:
        return session
    if session.lifecycle_state == "provisioning" and session.lifecycle_run_id is None:
        return session  # killed before any run claimed it: a new session, still
    return None


def assert_no_orphans(provider: LocalProvider) -> None:
    """Over this test's sandboxes only: the suite's other processes share SANDBOX_ROOT (and so
    the cgroup prefix), and one of them may be starting a sandbox of its own right now."""
    ours = set(Sandbox.objects.values_list("name", flat=True)) | {
        session_sandbox_name(session_id)
        for session_id in Session.objects.values_list("id", flat=True)
    }
    backend = provider.cgroup_backend
    if backend.kind == "v1":
        top = Path("/sys/fs/cgroup/freezer/recoup")
    elif backend.kind == "v2":
        top = Path(backend.v2_root) / "recoup"
    else:
        return
    for group in top.glob(f"{provider._cgroup_prefix}-*") if top.exists() else []:
        name = group.name[len(provider._cgroup_prefix) + 1 :]
        if name not in ours:
            continue
        status = provider.status(name=name)
        assert status != SandboxStatus.ABSENT, f"cgroup of a sandbox that is gone: {group}"
        procs = [p for f in group.rglob("cgroup.procs") for p in f.read_text().split()]
        if status != SandboxStatus.RUNNING:
            assert procs == [], f"processes of a stopped sandbox: {group}"
        frozen = (
            (group / "freezer.state").read_text().strip() != "THAWED"
            if backend.kind == "v1"
            else (group / "cgroup.freeze").read_text().strip() == "1"
        )
        assert not frozen, f"frozen cgroup left behind: {group}"


def assert_storage_is_the_record(session_id: str) -> None:
    storage = storages["snapshots"]
    try:
        _, stored = storage.listdir(f"sessions/{session_id}")
    except FileNotFoundError:
        stored = []
    recorded = Snapshot.objects.filter(session_id=session_id, deleted_at__isnull=True)
    assert sorted(f"sessions/{session_id}/{name}" for name in stored) == sorted(
        recorded.values_list("storage_key", flat=True)
    )


def test_random_kills_always_converge_without_losing_a_file(
    owner, repo_url, worker, tmp_path, settings
):
    settings.LIFECYCLE_DISPATCH_GRACE = 1
    rng = random.Random(SEED)
    beat = Beat(env=worker.env, queue=worker.queue, tmp=tmp_path).start()
    provider = LocalProvider.from_settings()
    web_env = dict(worker.env)
    outcomes: list[tuple[str, float, str]] = []
    try:
        for iteration in range(ITERATIONS):
            operation = rng.choice(["create", "resume", "hibernate", "base build"])
            delay = rng.uniform(0.0, WINDOW_S[operation])
            kill_beat = rng.random() < 0.5
            label = f"seed {SEED} iteration {iteration}: {operation}, kill at {delay:.2f}s"
            session_id = new_session(owner)
            digest = None
            if operation != "create":
                start_sandbox(owner, session_id, repo_url)
                sh(owner, session_id, WRITE)
                digest = sh(owner, session_id, DIGEST)["stdout"]
            if kill_beat:
                beat.kill()

            if operation in ("create", "resume"):
                if operation == "resume":
                    session_hibernate(session_id=session_id, actor="chaos", reason="idle")
                web = web_process(web_env, ensure_script(session_id))
                kill_during(web, started=claimed(session_id), delay=delay)
            elif operation == "hibernate":
                owner.client.post(
                    "/api/sandbox/hibernate", {"sessionId": session_id}, format="json"
                )
                kill_during(worker.process, started=claimed(session_id), delay=delay)
            else:
                build = base_build_enqueue(
                    scope=f"acct:{owner.account.id}",
                    organization_id=None,
                    account_id=owner.account.id,
                    repo_full_name="acme/app",
                    clone_url=repo_url,
                    reason="chaos",
                )
                running = BaseSnapshotBuild.objects.filter(id=build.id if build else 0)
                kill_during(
                    worker.process,
                    started=lambda q=running: q.exclude(status="queued").exists(),
                    delay=delay,
                )
            after_kill = Session.objects.get(id=session_id).lifecycle_state
            outcomes.append((operation, round(delay, 2), after_kill))
            if worker.process.poll() is not None:
                worker.start()
            if kill_beat:
                beat.start()

            deadline = time.monotonic() + CONVERGE_S
            while settled(session_id) is None:
                assert time.monotonic() < deadline, (
                    f"{label}: never settled: {describe(session_id)}"
                )
                time.sleep(0.2)
            wait_for(
                lambda: not BaseSnapshotBuild.objects.filter(status="running").exists(),
                timeout=CONVERGE_S,
                interval=0.2,
                message=f"{label}: a base build stays running",
            )
            # Comes up with every file it had, and storage is exactly the record.
            start_sandbox(owner, session_id, repo_url)
            if digest is not None:
                assert sh(owner, session_id, DIGEST)["stdout"] == digest, label
            assert_storage_is_the_record(session_id)
            assert_no_orphans(provider)
            # Done with it: hibernated and gone from the host, as its life would end.
            session_hibernate(session_id=session_id, actor="chaos", reason="idle")
            assert provider.status(name=session_sandbox_name(session_id)) == SandboxStatus.ABSENT
        bases = storages["snapshots"]
        recorded = set(Snapshot.objects.filter(kind="base").values_list("storage_key", flat=True))
        prefix = f"bases/acct-{owner.account.id}/acme/app"
        try:
            _, names = bases.listdir(prefix)
        except FileNotFoundError:
            names = []
        assert {f"{prefix}/{n}" for n in names} <= recorded
    finally:
        beat.kill()
        print(f"chaos seed {SEED}: (operation, kill delay s, state right after) {outcomes}")
