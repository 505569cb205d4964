"""The operator's admin for sessions, snapshots and base builds: the "needs attention" filter,
the lifecycle audit trail inline, and actions carried out on live sandboxes by a real worker."""

import html
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.core.files.base import ContentFile
from django.core.files.storage import storages
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from lifecycle.hibernation import session_hibernate
from lifecycle.models import BaseSnapshotBuild, LifecycleEvent
from recoup.accounts.models import Account
from sandboxes_app.models import Sandbox, Snapshot, session_sandbox_name
from sandboxes_app.providers.base import SandboxStatus, get_provider
from sessions_app.models import Session
from tests.support.api import new_session, sh, start_sandbox, wait_state
from tests.support.worker import wait_for

SESSIONS = reverse("admin:sessions_app_session_changelist")
SNAPSHOTS = reverse("admin:sandboxes_app_snapshot_changelist")
BUILDS = reverse("admin:lifecycle_basesnapshotbuild_changelist")


@pytest.fixture
def operator(db) -> Client:
    user = get_user_model().objects.create_superuser("root", "root@example.com", "unused")
    client = Client()
    client.force_login(user)
    return client


def act(client: Client, changelist: str, action: str, ids: list) -> list[tuple[int, str]]:
    """Run an admin action from the changelist form; return the messages it left."""
    response = client.post(changelist, {"action": action, "_selected_action": ids}, follow=True)
    assert response.status_code == 200, response.content[:2000]
    return [(message.level, str(message)) for message in response.context["messages"]]


def live_session(owner, repo_url: str, script: str = "echo kept > f") -> str:
    session_id = new_session(owner)
    start_sandbox(owner, session_id, repo_url)
    sh(owner, session_id, script)
    return session_id


# --- the changelist filter and the audit trail ---------------------------------------------


@pytest.fixture
def attention_cases(owner) -> dict[str, set[str]]:
    """Sessions in every state the filter must tell apart; returns the expected ids per value."""
    now = timezone.now()
    past, future = now - timedelta(minutes=5), now + timedelta(minutes=5)

    def make(state: str | None, **fields) -> str:
        return Session.objects.create(
            account=owner.account, title=f"{state}", lifecycle_state=state, **fields
        ).id

    expected = {
        "failed": {make("failed"), make("failed", lifecycle_lease_expires_at=past)},
        "stuck": {
            make("provisioning", lifecycle_lease_expires_at=past),
            make("restoring", lifecycle_lease_expires_at=past),
            make("hibernating", lifecycle_lease_expires_at=past),
        },
        "overdue": {
            make("active", hibernate_after=past, sandbox_expires_at=future),
            make("active", hibernate_after=future, sandbox_expires_at=past),
        },
    }
    # Near misses: a live lease, no lease, a lease on a state that holds none, a deadline
    # inside the sweep's one-minute grace, deadlines on a session already hibernated.
    make("provisioning", lifecycle_lease_expires_at=future)
    make("hibernating")
    make("hibernated", lifecycle_lease_expires_at=past, hibernate_after=past)
    make("active", hibernate_after=now - timedelta(seconds=20), sandbox_expires_at=future)
    make("active")
    make(None)
    return expected


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["failed", "stuck", "overdue"])
def test_needs_attention_filter_returns_exactly_the_matching_sessions(
    operator, attention_cases, value
):
    response = operator.get(SESSIONS, {"attention": value})

    assert response.status_code == 200
    assert {session.id for session in response.context["cl"].result_list} == attention_cases[value]


@pytest.mark.django_db
def test_the_unfiltered_changelist_and_its_search_show_every_session(
    operator, attention_cases, stranger
):
    theirs = Session.objects.create(account=stranger.account, title="needle").id

    everything = operator.get(SESSIONS)
    searched = operator.get(SESSIONS, {"q": "stranger@example.com"})

    assert everything.context["cl"].result_count == Session.objects.count() == 14
    assert [session.id for session in searched.context["cl"].result_list] == [theirs]


@pytest.mark.django_db
def test_the_session_page_shows_its_lifecycle_events_newest_first(operator, owner):
    session = Session.objects.create(account=owner.account, title="audited")
    other = Session.objects.create(account=owner.account, title="other")
    for version, (before, after, reason) in enumerate(
        [(None, "provisioning", "created"), ("provisioning", "active", "provisioned")], start=1
    ):
        LifecycleEvent.objects.create(
            session=session,
            from_state=before,
            to_state=after,
            version=version,
            reason=reason,
            actor="worker",
        )
    LifecycleEvent.objects.create(
        session=other, to_state="failed", version=1, reason="elsewhere", actor="sweep"
    )

    response = operator.get(reverse("admin:sessions_app_session_change", args=[session.id]))

    assert response.status_code == 200
    (events,) = [
        inline
        for inline in response.context["inline_admin_formsets"]
        if inline.formset.model is LifecycleEvent
    ]
    assert [form.instance.reason for form in events.formset.forms] == ["provisioned", "created"]
    assert not events.has_add_permission
    page = response.content.decode()
    assert "provisioned" in page and "elsewhere" not in page


def row_cells(page: str, column: str) -> dict[str, str]:
    """The text of `column` in each changelist row, by the row's first (linked) cell."""
    cells = {}
    for row in re.findall(r"<tr>(.*?)</tr>", page, re.S):
        key = re.search(r'<th class="field-[^"]*"><a [^>]*>([^<]*)</a>', row)
        cell = re.search(rf'<td class="field-{column}[^"]*">(.*?)</td>', row, re.S)
        if key and cell:
            cells[html.unescape(key.group(1))] = re.sub(r"<[^>]+>", "", cell.group(1)).strip()
    return cells


@pytest.mark.django_db
def test_the_state_column_shows_failed_and_hibernated_sessions_as_they_are(operator, owner):
    """A session's own status stays "running" while its sandbox is hibernated or has failed;
    the list shows the sandbox's real state."""

    def make(state: str, status: str = "running", **fields) -> str:
        return Session.objects.create(
            account=owner.account, title=state, lifecycle_state=state, status=status, **fields
        ).id

    failed = make("failed", lifecycle_error="git clone failed: repository not found")
    hibernated = make("hibernated")
    active = make("active")
    archived = make("archived", status="archived")
    closing = make("hibernating", status="archived")
    sandbox = Sandbox.objects.create(
        name=f"sbx_{failed}",
        session_id=failed,
        account=owner.account,
        provider="local",
        status=Sandbox.Status.RUNNING,
    )

    page = operator.get(SESSIONS).content.decode()

    assert row_cells(page, "state") == {
        failed: "failed",
        hibernated: "hibernated",
        active: "active",
        archived: "archived",
        closing: "hibernating (session archived)",
    }
    assert 'title="git clone failed: repository not found"' in page
    sandboxes = operator.get(reverse("admin:sandboxes_app_sandbox_changelist")).content.decode()
    assert row_cells(sandboxes, "state") == {sandbox.name: "failed"}


@pytest.mark.django_db
def test_lifecycle_events_show_milliseconds_and_api_actors_by_email(operator, owner, stranger):
    session = Session.objects.create(account=owner.account, title="audited")
    at = datetime(2026, 3, 4, 5, 6, 7, 891_000, tzinfo=UTC)
    for n, actor in enumerate([f"api:{owner.account.id}", f"api:{stranger.account.id}", "sweep"]):
        event = LifecycleEvent.objects.create(
            session=session, to_state="active", version=n + 1, reason=f"r{n}", actor=actor
        )
        LifecycleEvent.objects.filter(id=event.id).update(created_at=at + timedelta(seconds=n))

    for url in (
        reverse("admin:sessions_app_session_change", args=[session.id]),
        reverse("admin:lifecycle_lifecycleevent_changelist"),
    ):
        page = operator.get(url).content.decode()

        assert "2026-03-04 05:06:07.891" in page and "2026-03-04 05:06:09.891" in page, url
        assert "owner@example.com" in page and "stranger@example.com" in page, url
        assert "sweep" in page
        assert f"api:{owner.account.id}" not in page, url


@pytest.mark.django_db
def test_actor_emails_cost_one_query_however_many_accounts_acted(operator, owner):
    session = Session.objects.create(account=owner.account, title="busy")

    def queries_for(accounts: int) -> dict[str, int]:
        for n in range(accounts):
            account = Account.objects.create(email=f"actor{n}-{accounts}@example.com")
            LifecycleEvent.objects.create(
                session=session, to_state="active", version=n, reason="r", actor=f"api:{account.id}"
            )
        counts = {}
        for url in (
            reverse("admin:sessions_app_session_change", args=[session.id]),
            reverse("admin:lifecycle_lifecycleevent_changelist"),
        ):
            with CaptureQueriesContext(connection) as queries:
                assert operator.get(url).status_code == 200
            counts[url] = len(queries)
        return counts

    assert queries_for(2) == queries_for(12)


# --- session actions on live sandboxes -------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_hibernate_now_is_carried_out_by_the_worker(operator, owner, repo_url, worker):
    session_id = live_session(owner, repo_url)

    shown = act(operator, SESSIONS, "hibernate_now", [session_id])

    assert (messages.INFO, "Queued hibernation of 1 session(s).") in shown
    session = wait_state(session_id, "hibernated", worker)
    assert session.current_snapshot_id is not None and session.status == "running"
    assert get_provider().status(name=session_sandbox_name(session_id)) == SandboxStatus.ABSENT
    claim = LifecycleEvent.objects.get(session_id=session_id, to_state="hibernating")
    assert (claim.reason, claim.actor) == ("operator", "worker")


@pytest.mark.django_db(transaction=True)
def test_archive_hibernates_the_sandbox_and_ends_archived(operator, owner, repo_url, worker):
    session_id = live_session(owner, repo_url)

    shown = act(operator, SESSIONS, "archive", [session_id])

    assert (messages.INFO, "Archived 1 session(s).") in shown
    session = wait_state(session_id, "archived", worker)
    assert session.status == "archived"
    assert session.current_snapshot_id is not None
    assert get_provider().status(name=session_sandbox_name(session_id)) == SandboxStatus.ABSENT
    assert LifecycleEvent.objects.filter(session_id=session_id, reason="archive").exists()


@pytest.mark.django_db(transaction=True)
def test_resume_brings_a_hibernated_session_back_with_its_files(operator, owner, repo_url):
    session_id = live_session(owner, repo_url, "echo kept > f")
    assert session_hibernate(session_id=session_id, actor="test", reason="idle")

    shown = act(operator, SESSIONS, "resume", [session_id])

    assert (messages.INFO, f"{session_id}: resumed") in shown
    assert Session.objects.get(id=session_id).lifecycle_state == "active"
    assert sh(owner, session_id, "cat f")["stdout"] == "kept\n"
    restore = LifecycleEvent.objects.filter(session_id=session_id, to_state="restoring").get()
    assert restore.actor == "admin:root"


@pytest.mark.django_db
def test_resume_reports_sessions_it_cannot_resume_and_leaves_them_alone(operator, owner):
    bare = Session.objects.create(account=owner.account, title="no repo")
    archived = Session.objects.create(
        account=owner.account,
        title="archived",
        repo_owner="acme",
        repo_name="app",
        status=Session.Status.ARCHIVED,
        lifecycle_state="archived",
        lifecycle_version=3,
    )

    shown = act(operator, SESSIONS, "resume", [bare.id, archived.id])

    assert (messages.WARNING, f"{bare.id}: no repository") in shown
    errors = [text for level, text in shown if level == messages.ERROR]
    assert len(errors) == 1 and errors[0].startswith(f"{archived.id}: Session is archived")
    assert Session.objects.get(id=archived.id).lifecycle_state == "archived"
    assert Session.objects.get(id=bare.id).lifecycle_state == "provisioning"


# --- snapshots and base builds ---------------------------------------------------------------


@pytest.fixture
def snapshot(owner, repo_url) -> Snapshot:
    """A real session snapshot, written by hibernating a live sandbox."""
    session_id = live_session(owner, repo_url)
    assert session_hibernate(session_id=session_id, actor="test", reason="idle")
    return Session.objects.get(id=session_id).current_snapshot


@pytest.mark.django_db(transaction=True)
def test_verify_reports_ok_for_a_good_snapshot_and_an_error_once_its_object_is_gone(
    operator, snapshot
):
    assert snapshot.storage_key in operator.get(SNAPSHOTS).content.decode()
    key = snapshot.storage_key

    assert act(operator, SNAPSHOTS, "verify", [snapshot.id]) == [(messages.INFO, f"{key}: OK")]

    storages["snapshots"].delete(key)

    assert act(operator, SNAPSHOTS, "verify", [snapshot.id]) == [
        (messages.ERROR, f"{key}: Snapshot {key} is missing from storage")
    ]


@pytest.mark.django_db(transaction=True)
def test_verify_reports_a_snapshot_whose_bytes_changed(operator, snapshot):
    storage, key = storages["snapshots"], snapshot.storage_key
    storage.delete(key)
    assert storage.save(key, ContentFile(b"\0" * snapshot.size_bytes)) == key

    ((level, text),) = act(operator, SNAPSHOTS, "verify", [snapshot.id])

    assert level == messages.ERROR
    assert text == f"{key}: Snapshot {key} does not match its sha256"


def base_build(owner, org, clone_url: str, status: str) -> BaseSnapshotBuild:
    return BaseSnapshotBuild.objects.create(
        scope=f"org:{org.id}",
        organization=org,
        account=owner.account,
        repo_full_name="acme/app",
        clone_url=clone_url,
        status=status,
    )


@pytest.mark.django_db
def test_rebuild_queues_one_build_and_refuses_another_while_it_is_queued(operator, owner, org):
    clone_url = "file:///nowhere/acme/app.git"
    succeeded = base_build(owner, org, clone_url, BaseSnapshotBuild.Status.SUCCEEDED)
    failed = base_build(owner, org, clone_url, BaseSnapshotBuild.Status.FAILED)

    # Both rows name the same (scope, repository): one rebuild between them.
    shown = act(operator, BUILDS, "rebuild", [succeeded.id, failed.id])

    assert (messages.INFO, "Queued 1 rebuild(s).") in shown
    (queued,) = BaseSnapshotBuild.objects.filter(status=BaseSnapshotBuild.Status.QUEUED)
    assert (queued.scope, queued.repo_full_name, queued.clone_url, queued.reason) == (
        f"org:{org.id}",
        "acme/app",
        clone_url,
        "operator",
    )
    assert (queued.organization_id, queued.account_id) == (org.id, owner.account.id)

    shown = act(operator, BUILDS, "rebuild", [succeeded.id])

    assert (messages.INFO, "Queued 0 rebuild(s).") in shown
    assert BaseSnapshotBuild.objects.count() == 3


@pytest.mark.django_db(transaction=True)
def test_a_queued_rebuild_is_built_by_the_worker(operator, owner, org, repo_url, origins, worker):
    stale = base_build(
        owner, org, f"{origins.base_url}/acme/app.git", BaseSnapshotBuild.Status.SUCCEEDED
    )

    act(operator, BUILDS, "rebuild", [stale.id])

    built = wait_for(
        lambda: BaseSnapshotBuild.objects.filter(
            reason="operator", status__in=["succeeded", "failed"]
        ).first(),
        timeout=60,
        message=worker.log()[-4000:],
    )
    assert built.status == "succeeded", built.error
    assert (built.snapshot.kind, built.snapshot.organization_id) == ("base", org.id)
    get_provider().verify_snapshot(snapshot=built.snapshot.to_info())
