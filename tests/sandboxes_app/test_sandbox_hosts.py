"""A pool of two sandbox hosts on this machine: real `manage.py sandbox_host` processes, each
with its own SANDBOX_ROOT, behind this test process acting as the web (SANDBOX_PROVIDER=pool)."""

import time

import pytest
from django.core.files.storage import storages
from django.utils import timezone

from lifecycle.checkpoints import session_checkpoint
from lifecycle.hibernation import session_hibernate
from lifecycle.states import LifecycleState as S
from sandboxes_app.hosts.services import hosts_mark_down
from sandboxes_app.models import HostPlacement, SandboxHost, Snapshot, session_sandbox_name
from sessions_app.models import Session
from tests.support.api import new_session, sh, start_sandbox
from tests.support.commands import log_events, start_detached, text_of, wait_finished
from tests.support.hosts import Host
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


def test_a_killed_host_is_marked_down_and_its_session_resumes_elsewhere_from_its_checkpoint(
    pool, owner, repo_url
):
    session_id = new_session(owner)
    name = session_sandbox_name(session_id)
    start_sandbox(owner, session_id, repo_url)
    sh(owner, session_id, "echo before-snapshot > saved.txt")
    assert session_hibernate(session_id=session_id, actor="test", reason="test") is not None
    start_sandbox(owner, session_id, repo_url)  # resumed from the snapshot
    doomed = pool.host_of(name)
    sh(owner, session_id, "echo checkpointed > checkpointed.txt")
    assert session_checkpoint(session_id=session_id, actor="test") is not None
    sh(owner, session_id, "echo after-checkpoint > unsaved.txt")

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
    assert sh(owner, session_id, "cat checkpointed.txt")["stdout"] == "checkpointed\n"
    # Documented loss: what changed after the last checkpoint stayed on the dead host.
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


def test_a_detached_command_runs_on_its_host_and_its_log_streams_through_the_web(
    pool, owner, repo_url
):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    command_id = start_detached(owner, session_id, "echo one; echo two >&2; exit 3")
    finished = wait_finished(owner, session_id, command_id)
    assert finished["exitCode"] == 3
    events = log_events(owner, command_id, sessionId=session_id)
    assert text_of(events, "stdout") == "one\n" and text_of(events, "stderr") == "two\n"
    host = pool.host_of(session_sandbox_name(session_id))
    assert host.holds(session_sandbox_name(session_id))


def test_a_call_to_a_host_that_died_unnoticed_answers_502_and_changes_nothing(
    pool, owner, repo_url, settings
):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    pool.host_of(session_sandbox_name(session_id)).kill()
    settings.SANDBOX_HOST_DOWN_AFTER = 60  # its last heartbeat stays fresh for this test
    for response in (
        owner.client.post(
            "/api/sandbox", {"repoUrl": repo_url, "sessionId": session_id}, format="json"
        ),
        owner.client.post(
            "/api/sandbox/commands", {"sessionId": session_id, "cmd": "true"}, format="json"
        ),
    ):
        assert response.status_code == 502, response.content
        body = response.json()
        assert body["status"] == "error" and "did not answer" in body["error"]
    assert Session.objects.get(id=session_id).lifecycle_state == S.ACTIVE


def test_a_second_process_with_a_live_hosts_name_waits_instead_of_sharing_it(pool, tmp_path):
    first = pool.hosts[0]
    address = SandboxHost.objects.get(name=first.name).address
    twin = Host(
        name=first.name,
        root=tmp_path / "twin",
        id_pool_start=pool.hosts[-1].id_pool_start + 64 * 65536,  # the worker's third block
        log_path=tmp_path / "twin.log",
        env={
            **first.env,
            "SANDBOX_ROOT": str(tmp_path / "twin"),
            "SANDBOX_ID_POOL_START": str(pool.hosts[-1].id_pool_start + 64 * 65536),
            # Generous, so a slow heartbeat of the first on a busy machine is not a takeover.
            "SANDBOX_HOST_DOWN_AFTER": "8",
        },
    ).start()
    try:
        wait_for(lambda: "waiting until its heartbeat" in twin.log(), timeout=30)
        time.sleep(2)
        assert SandboxHost.objects.get(name=first.name).address == address
        first.kill()
        wait_for(
            lambda: SandboxHost.objects.get(name=first.name).address != address,
            timeout=60,
            message=twin.log()[-2000:],
        )
    finally:
        twin.kill()


def test_a_host_drops_its_cache_of_a_base_the_pool_deleted(pool, owner, org, repo_url):
    from sandboxes_app.hosts.client import PoolProvider
    from sandboxes_app.hosts.services import host_base_caches_prune
    from sandboxes_app.providers.base import GitSource

    provider = PoolProvider.from_settings()
    source = GitSource(clone_url=repo_url)
    info = provider.build_base(source=source, storage_key="bases/prune-test.tar.zst")
    row = Snapshot.objects.create(
        kind=Snapshot.Kind.BASE,
        storage_key=info.storage_key,
        sha256=info.sha256,
        size_bytes=info.size_bytes,
        created_at=info.created_at,
        account=owner.account,
        organization=org,
    )
    builder = next(h for h in pool.hosts if (h.root / "_bases" / info.sha256).exists())
    local = builder.local_provider_for_test()
    assert host_base_caches_prune(root=builder.root, delete=lambda i: None) == 0  # still live

    Snapshot.objects.filter(id=row.id).update(deleted_at=timezone.now())
    provider.delete_snapshot(snapshot=row.to_info())
    assert (
        host_base_caches_prune(
            root=builder.root, delete=lambda i: local.delete_snapshot(snapshot=i)
        )
        == 1
    )
    assert not (builder.root / "_bases" / info.sha256).exists()
