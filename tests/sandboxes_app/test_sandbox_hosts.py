"""A pool of two sandbox hosts on this machine: real `manage.py sandbox_host` processes, each
with its own SANDBOX_ROOT, behind this test process acting as the web (SANDBOX_PROVIDER=pool)."""

import pytest
from django.core.files.storage import storages

from lifecycle.hibernation import session_hibernate
from lifecycle.states import LifecycleState as S
from sandboxes_app.hosts.services import hosts_mark_down
from sandboxes_app.models import HostPlacement, SandboxHost, session_sandbox_name
from sessions_app.models import Session
from tests.support.api import new_session, sh, start_sandbox
from tests.support.worker import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _mark_down(host) -> None:
    """What the beat sweep does once the host's heartbeat is older than DOWN_AFTER."""
    wait_for(
        lambda: host.name in hosts_mark_down(),
        timeout=15,
        message=f"{host.name} was never marked down",
    )


def test_new_sandboxes_spread_over_the_hosts_and_commands_stay_on_theirs(pool, owner, repo_url):
    first, second = new_session(owner), new_session(owner)
    start_sandbox(owner, first, repo_url)
    start_sandbox(owner, second, repo_url)
    host_1 = pool.host_of(session_sandbox_name(first))
    host_2 = pool.host_of(session_sandbox_name(second))
    assert host_1 is not host_2  # least loaded first
    assert host_1.holds(session_sandbox_name(first))
    assert not host_2.holds(session_sandbox_name(first))

    written = sh(owner, first, "echo kept > notes.txt && cat README.md")
    assert written["exitCode"] == 0 and written["stdout"] == "# app\n"
    for _ in range(3):
        assert sh(owner, first, "cat notes.txt")["stdout"] == "kept\n"
    # The file is on its host's disk, and the other host never saw this sandbox.
    assert pool.host_of(session_sandbox_name(first)) is host_1
    assert not host_2.holds(session_sandbox_name(first))


def test_a_killed_host_is_marked_down_and_its_session_resumes_elsewhere_from_its_snapshot(
    pool, owner, repo_url
):
    session_id = new_session(owner)
    name = session_sandbox_name(session_id)
    start_sandbox(owner, session_id, repo_url)
    sh(owner, session_id, "echo before-snapshot > saved.txt")
    assert session_hibernate(session_id=session_id, actor="test", reason="test") is not None
    start_sandbox(owner, session_id, repo_url)  # resumed from the snapshot
    doomed = pool.host_of(name)
    sh(owner, session_id, "echo after-snapshot > unsaved.txt")

    doomed.kill()
    _mark_down(doomed)
    assert SandboxHost.objects.get(name=doomed.name).status == SandboxHost.Status.DOWN
    session = Session.objects.get(id=session_id)
    assert session.lifecycle_state == S.FAILED
    assert doomed.name in session.lifecycle_error and "resumes" in session.lifecycle_error
    assert not HostPlacement.objects.filter(sandbox_name=name).exists()

    answer = start_sandbox(owner, session_id, repo_url)
    survivor = pool.host_of(name)
    assert survivor is not doomed
    assert answer["currentBranch"]
    assert sh(owner, session_id, "cat saved.txt")["stdout"] == "before-snapshot\n"
    # Documented loss: what changed after the last snapshot stayed on the dead host.
    assert sh(owner, session_id, "test -e unsaved.txt")["exitCode"] == 1

    # The dead host comes back: its stale copy is kept in storage for operators, then deleted.
    doomed.start().wait_live()
    assert not doomed.holds(name)
    orphans = storages["snapshots"].listdir(f"orphans/{doomed.name}/{name}")[1]
    assert len(orphans) == 1 and orphans[0].endswith(".tar.zst")
    assert pool.host_of(name) is survivor


def test_a_host_that_returns_before_the_next_post_gives_back_every_file(pool, owner, repo_url):
    session_id = new_session(owner)
    name = session_sandbox_name(session_id)
    start_sandbox(owner, session_id, repo_url)
    sh(owner, session_id, "echo only-on-this-disk > work.txt")  # no snapshot at all
    host = pool.host_of(name)
    host.kill()
    _mark_down(host)
    assert Session.objects.get(id=session_id).lifecycle_state == S.FAILED

    host.start().wait_live()  # adopts the workspace nobody took over
    assert pool.host_of(name) is host
    start_sandbox(owner, session_id, repo_url)
    assert sh(owner, session_id, "cat work.txt")["stdout"] == "only-on-this-disk\n"
