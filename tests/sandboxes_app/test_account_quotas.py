"""Per-account quotas: live sandboxes (SANDBOX_MAX_PER_ACCOUNT) and concurrent commands
(SANDBOX_MAX_COMMANDS_PER_ACCOUNT), with per-organization overrides. Real sandboxes, real
PostgreSQL, and for commands both counters: Redis and the file-lock fallback."""

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone
from rest_framework.test import APIClient

from lifecycle.hibernation import session_hibernate
from lifecycle.models import LifecycleEvent
from lifecycle.sweeps import oneshot_sandboxes_expire
from sandboxes_app.models import Sandbox, session_sandbox_name
from sandboxes_app.providers.base import SandboxStatus, get_provider
from sessions_app.models import Session
from tests.support.api import new_session, run, start_sandbox
from tests.support.worker import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def post_sandbox(actor, body: dict):
    return actor.client.post("/api/sandbox", body, format="json")


def assert_quota_refusal(response, needle: str) -> None:
    assert response.status_code == 429, response.content
    assert int(response["Retry-After"]) >= 1
    body = response.json()
    assert body["status"] == "error"
    assert needle in body["error"]


@pytest.fixture
def one_sandbox_each(settings):
    settings.SANDBOX_MAX_PER_ACCOUNT = 1


def test_a_second_sandbox_over_the_limit_answers_429_and_creates_nothing(
    owner, repo_url, one_sandbox_each
):
    first = new_session(owner)
    start_sandbox(owner, first, repo_url)
    second = new_session(owner)
    before = Session.objects.get(id=second)

    response = post_sandbox(owner, {"repoUrl": repo_url, "sessionId": second})

    assert_quota_refusal(response, "SANDBOX_MAX_PER_ACCOUNT")
    after = Session.objects.get(id=second)
    assert (after.lifecycle_state, after.lifecycle_version) == (
        before.lifecycle_state,
        before.lifecycle_version,
    )
    assert after.lifecycle_run_id is None
    assert not Sandbox.objects.filter(session_id=second).exists()
    assert not LifecycleEvent.objects.filter(session_id=second).exists()
    assert get_provider().status(name=session_sandbox_name(second)) == SandboxStatus.ABSENT


def test_hibernating_the_first_sandbox_frees_its_slot(owner, repo_url, one_sandbox_each):
    first = new_session(owner)
    start_sandbox(owner, first, repo_url)
    second = new_session(owner)
    assert post_sandbox(owner, {"repoUrl": repo_url, "sessionId": second}).status_code == 429

    session_hibernate(session_id=first, actor="test", reason="requested")

    start_sandbox(owner, second, repo_url)
    assert Sandbox.objects.filter(account=owner.account, destroyed_at__isnull=True).count() == 1
    # And the hibernated one cannot come back while the other holds the slot.
    assert_quota_refusal(
        post_sandbox(owner, {"repoUrl": repo_url, "sessionId": first}), "SANDBOX_MAX_PER_ACCOUNT"
    )


def test_a_session_that_holds_its_sandbox_is_not_counted_again(owner, repo_url, one_sandbox_each):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)

    again = post_sandbox(owner, {"repoUrl": repo_url, "sessionId": session_id})

    assert again.status_code == 200, again.content
    assert Sandbox.objects.filter(session_id=session_id).count() == 1


def test_concurrent_posts_for_one_session_all_get_its_sandbox(owner, repo_url, one_sandbox_each):
    session_id = new_session(owner)
    results: list[int] = []

    def post() -> None:
        client = APIClient()
        client.credentials(HTTP_X_API_KEY=owner.raw_key)
        try:
            response = client.post(
                "/api/sandbox", {"repoUrl": repo_url, "sessionId": session_id}, format="json"
            )
            results.append(response.status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=post) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert results == [200] * 6
    assert Sandbox.objects.filter(account=owner.account).count() == 1


def test_concurrent_posts_for_different_sessions_never_exceed_the_limit(owner, repo_url, settings):
    settings.SANDBOX_MAX_PER_ACCOUNT = 2
    sessions = [new_session(owner) for _ in range(5)]
    results: list[int] = []

    def post(session_id: str) -> None:
        client = APIClient()
        client.credentials(HTTP_X_API_KEY=owner.raw_key)
        try:
            response = client.post(
                "/api/sandbox", {"repoUrl": repo_url, "sessionId": session_id}, format="json"
            )
            results.append(response.status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=post, args=(s,)) for s in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert sorted(results) == [200, 200, 429, 429, 429]
    assert Sandbox.objects.filter(account=owner.account, destroyed_at__isnull=True).count() == 2


def test_oneshot_sandboxes_count_and_their_expiry_frees_the_slot(owner, repo_url, one_sandbox_each):
    assert post_sandbox(owner, {"repoUrl": repo_url}).status_code == 200

    refused = post_sandbox(owner, {"repoUrl": repo_url})
    assert_quota_refusal(refused, "SANDBOX_MAX_PER_ACCOUNT")
    assert Sandbox.objects.filter(account=owner.account).count() == 1
    session_id = new_session(owner)
    assert post_sandbox(owner, {"repoUrl": repo_url, "sessionId": session_id}).status_code == 429

    Sandbox.objects.filter(account=owner.account).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert oneshot_sandboxes_expire(limit=10) == 1

    start_sandbox(owner, session_id, repo_url)


def test_an_organization_override_raises_the_limit_for_its_members_only(
    owner, stranger, org, repo_url, one_sandbox_each
):
    org.max_sandboxes_per_account = 2
    org.save()
    in_org = [new_session(owner, organizationId=str(org.id)) for _ in range(2)]
    for session_id in in_org:
        start_sandbox(owner, session_id, repo_url)

    # Personal sessions use the setting, and the account's two sandboxes already exceed it.
    personal = new_session(owner)
    assert_quota_refusal(
        post_sandbox(owner, {"repoUrl": repo_url, "sessionId": personal}),
        "SANDBOX_MAX_PER_ACCOUNT",
    )
    third = new_session(owner, organizationId=str(org.id))
    assert_quota_refusal(
        post_sandbox(owner, {"repoUrl": repo_url, "sessionId": third}), "organization"
    )
    start_sandbox(stranger, new_session(stranger), repo_url)
    assert (
        post_sandbox(
            stranger, {"repoUrl": repo_url, "sessionId": new_session(stranger)}
        ).status_code
        == 429
    )


# --- concurrent commands --------------------------------------------------------------------


@pytest.fixture(params=["redis", "file"])
def command_counter(request, settings) -> str:
    """Both counters: Redis when REDIS_URL is set, the file-lock fallback without it."""
    if request.param == "redis":
        if not settings.REDIS_URL:
            pytest.skip("REDIS_URL is not set")
    else:
        settings.REDIS_URL = ""
    settings.SANDBOX_MAX_COMMANDS_PER_ACCOUNT = 1
    return request.param


def background_command(actor, session_id: str, script: str) -> tuple[threading.Thread, list]:
    results: list = []

    def go() -> None:
        client = APIClient()
        client.credentials(HTTP_X_API_KEY=actor.raw_key)
        try:
            results.append(
                client.post(
                    "/api/sandbox/commands",
                    {"sessionId": session_id, "cmd": "sh", "args": ["-c", script]},
                    format="json",
                )
            )
        finally:
            connections.close_all()

    thread = threading.Thread(target=go)
    thread.start()
    return thread, results


def test_a_command_over_the_limit_answers_429_and_other_accounts_run(
    owner, stranger, repo_url, command_counter
):
    mine = new_session(owner)
    start_sandbox(owner, mine, repo_url)
    theirs = new_session(stranger)
    start_sandbox(stranger, theirs, repo_url)
    thread, results = background_command(owner, mine, "sleep 3")
    name = session_sandbox_name(mine)
    wait_for(lambda: get_provider().running_commands(name=name) > 0, timeout=10)
    before = Session.objects.get(id=mine)

    refused = run(owner, mine, "touch", "refused-ran")
    assert_quota_refusal(refused, "SANDBOX_MAX_COMMANDS_PER_ACCOUNT")
    other = run(stranger, theirs, "echo", "fine")
    assert other.status_code == 200, other.content
    assert other.json()["stdout"] == "fine\n"
    # The refused command touched nothing, not even the idle clock.
    assert Session.objects.get(id=mine).last_activity_at == before.last_activity_at

    thread.join(timeout=30)
    assert results[0].status_code == 200 and results[0].json()["exitCode"] == 0
    after = run(owner, mine, "ls")
    assert after.status_code == 200, after.content
    assert "refused-ran" not in after.json()["stdout"]


def test_finished_and_failed_commands_free_their_slot(owner, repo_url, command_counter):
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)

    for script in ("true", "exit 3", "sleep 0.2", "true"):
        response = run(owner, session_id, "sh", "-c", script)
        assert response.status_code == 200, response.content
    bad_cwd = run(owner, session_id, "true", cwd="/nonexistent/../../etc")
    assert bad_cwd.status_code in (200, 400, 502)
    assert run(owner, session_id, "true").status_code == 200


def test_a_crashed_commands_slot_expires_with_its_lease(owner, command_counter):
    from sandboxes_app.quotas import command_slot_acquire, command_slot_release

    account_id = str(uuid.uuid4())
    leaked = command_slot_acquire(account_id=account_id, limit=1, lease_seconds=1)
    assert leaked is not None
    assert command_slot_acquire(account_id=account_id, limit=1, lease_seconds=1) is None

    time.sleep(1.2)  # the request "crashed": nobody released `leaked`

    fresh = command_slot_acquire(account_id=account_id, limit=1, lease_seconds=30)
    assert fresh is not None
    command_slot_release(account_id=account_id, slot=fresh)
    command_slot_release(account_id=account_id, slot=leaked)  # late release harms nothing
    assert command_slot_acquire(account_id=account_id, limit=1, lease_seconds=30) is not None


# --- the operator's side ------------------------------------------------------------------


def test_an_operator_sets_and_clears_the_overrides_in_the_admin(db):
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import reverse

    from recoup.accounts.models import Organization

    user = get_user_model().objects.create_superuser("root", "root@example.com", "unused")
    operator = Client()
    operator.force_login(user)
    team = Organization.objects.create(slug="team", name="Team")
    change = reverse("admin:accounts_organization_change", args=[team.id])
    form = {
        "slug": "team",
        "name": "Team",
        "git_token_owners": "",
        "memberships-TOTAL_FORMS": "0",
        "memberships-INITIAL_FORMS": "0",
    }

    saved = operator.post(
        change, {**form, "max_sandboxes_per_account": "25", "max_commands_per_account": "40"}
    )
    assert saved.status_code == 302, saved.content.decode()[:2000]
    team.refresh_from_db()
    assert (team.max_sandboxes_per_account, team.max_commands_per_account) == (25, 40)
    assert "max_sandboxes_per_account" in operator.get(change).content.decode()

    cleared = operator.post(
        change, {**form, "max_sandboxes_per_account": "", "max_commands_per_account": ""}
    )
    assert cleared.status_code == 302
    team.refresh_from_db()
    assert (team.max_sandboxes_per_account, team.max_commands_per_account) == (None, None)
