"""Attacks on detached commands: another account (or another session of the same account)
reading, following or killing a command, ids that are not ids, and a detached command's
client env reaching a process on the host (its supervisor is one)."""

import secrets
import uuid

import pytest

from sandboxes_app.models import Command
from sandboxes_app.providers.base import DetachedHooks
from tests.sandboxes_app.conftest import host_upper
from tests.security.test_host_chain import (
    HONOURED,
    _build_library,
    _plant_fakes,
    evil_library,  # noqa: F401  (fixture)
    host_watch,
)
from tests.support.api import new_session, start_sandbox
from tests.support.commands import get_command, start_detached
from tests.support.worker import wait_for


def _all_three(actor, command_id: str, scope: dict) -> list[int]:
    """The status codes of GET, GET /logs and POST /kill as `actor` with `scope`."""
    base = f"/api/sandbox/commands/{command_id}"
    codes = []
    for response in (
        actor.client.get(base, scope),
        actor.client.get(f"{base}/logs", scope),
        actor.client.post(f"{base}/kill", scope, format="json"),
    ):
        codes.append(response.status_code)
        if response.status_code != 200:
            assert response.json()["status"] == "error", response.content
        if hasattr(response, "streaming_content"):
            response.close()
    return codes


@pytest.mark.django_db(transaction=True)
def test_another_account_gets_404_everywhere_and_changes_nothing(owner, member, stranger, repo_url):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    command_id = start_detached(owner, session_id, "sleep 60")
    own_session = new_session(stranger)
    before = Command.objects.filter(id=command_id).values().get()

    attempts = [
        (stranger, {"sessionId": own_session}),  # its own session, the owner's command
        (stranger, {"sessionId": session_id}),  # the owner's session too
        (stranger, {"sandboxId": f"sbx_{session_id}"}),  # as if it were a one-shot
        (member, {"sessionId": session_id}),  # an organization peer
    ]
    for actor, scope in attempts:
        assert _all_three(actor, command_id, scope) == [404, 404, 404], scope

    assert Command.objects.filter(id=command_id).values().get() == before
    still = get_command(owner, command_id, sessionId=session_id).json()
    assert still["finishedAt"] is None and still["killed"] is False
    owner.client.post(
        f"/api/sandbox/commands/{command_id}/kill", {"sessionId": session_id}, format="json"
    )


@pytest.mark.django_db(transaction=True)
def test_another_session_of_the_same_account_gets_404(owner, repo_url):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    command_id = start_detached(owner, session_id, "echo mine")
    other = new_session(owner)

    assert _all_three(owner, command_id, {"sessionId": other}) == [404, 404, 404]
    assert Command.objects.get(id=command_id).killed is False


@pytest.mark.parametrize(
    "command_id",
    [
        "cmd_zz",
        "cmd_" + "0" * 32,  # well-formed, never issued
        "x" * 300,
        "cmd_%00" + "0" * 29,
        "..%2f..%2fetc",
        "CMD_" + "A" * 32,
    ],
)
@pytest.mark.django_db
def test_a_malformed_or_unknown_command_id_is_404_in_the_envelope(owner, command_id):
    session_id = new_session(owner)
    assert _all_three(owner, command_id, {"sessionId": session_id}) == [404, 404, 404]


@pytest.mark.django_db
def test_a_scope_with_a_nul_or_none_at_all_is_refused(owner):
    command_id = "cmd_" + secrets.token_hex(16)
    assert set(_all_three(owner, command_id, {"sessionId": "a\x00b"})) <= {400, 404}
    response = owner.client.get(f"/api/sandbox/commands/{command_id}")
    assert response.status_code == 400 and "sessionId" in response.json()["error"]


# --- the host chain -----------------------------------------------------------------------


def _hooks(settings) -> DetachedHooks:
    return DetachedHooks(
        channel="command:test",
        redis_url=settings.REDIS_URL,
        data_dir=str(settings.DATA_DIR),
        account_id=str(uuid.uuid4()),
    )


def _run_detached(provider, sandbox, settings, *, argv, env, timeout_s=20) -> bytes:
    """Start a detached command, wait for its end; its stdout and stderr, as logged."""
    command_id = "cmd_" + secrets.token_hex(16)
    provider.start_detached(
        name=sandbox,
        command_id=command_id,
        argv=argv,
        cwd=None,
        env=env,
        timeout_s=timeout_s,
        hooks=_hooks(settings),
    )
    wait_for(
        lambda: not provider.detached_status(name=sandbox, command_id=command_id).running,
        timeout=timeout_s + 10,
    )
    records = provider.detached_log(name=sandbox, command_id=command_id, offset=0)
    return b"".join(record.data for record in records)


def test_a_detached_command_with_a_hostile_env_runs_nothing_on_the_host(
    provider,
    sandbox,
    sandbox_root,
    host_marker,
    evil_library,  # noqa: F811
    settings,
):
    with host_upper(sandbox_root, sandbox) as upper:
        evil = upper / "evil"
        _plant_fakes(evil, host_marker)
        library = upper / "evil.so"
        _build_library(evil_library, marker=host_marker, dest=library)
        env = {"PATH": f"{evil}:/usr/bin:/bin", "LD_PRELOAD": str(library)}
        env["LD_AUDIT"] = str(library)

        output = _run_detached(provider, sandbox, settings, argv=["echo", "ran"], env=env)

    # ld.so inside the sandbox complains that it cannot find the host path: fine.
    assert output.endswith(b"ran\n"), output
    assert not host_marker.exists()


def test_no_host_process_sees_a_detached_commands_env_or_args(provider, sandbox, settings):
    """The supervisor is a host process that lives as long as the command: neither it nor
    anything else on the host holds a client variable or argument."""
    canary = b"recoup-canary-d7e2"
    env = {name: f"/nonexistent/{canary.decode()}" for name in HONOURED}
    env["SHELLOPTS"] = "xtrace"
    env["PS4"] = f"$(touch /tmp/{canary.decode()})"
    with host_watch(canary) as seen:
        output = _run_detached(
            provider,
            sandbox,
            settings,
            argv=["/bin/sh", "-c", "sleep 1.5; echo done", canary.decode()],
            env=env,
        )

    assert output.endswith(b"done\n"), output
    assert seen == []
