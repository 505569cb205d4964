"""Reads for the sandbox endpoints: the lifecycle envelope and the legacy account listing."""

from datetime import datetime
from functools import cache
from typing import Self

import psycopg
from django.conf import settings
from django.db import connection
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from lifecycle.events import provisioning_of
from lifecycle.states import LifecycleState as S
from recoup.accounts.models import Account, Membership
from recoup.errors import Forbidden, NotFound
from sandboxes_app.models import Sandbox, Snapshot
from sessions_app.models import Session


def epoch_ms(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp() * 1000)


# Every column the status poll reads, and nothing else: the poll is the hottest read in the API,
# and the session row is wide.
_POLL_COLUMNS = (
    "id",
    "account_id",
    "lifecycle_state",
    "lifecycle_version",
    "last_activity_at",
    "hibernate_after",
    "sandbox_expires_at",
    "current_snapshot_id",
    "provisioning_phase",
    "provisioning_percent",
)


# The same columns in the model's field order, which Model.from_db expects.
_POLL_ATTNAMES = tuple(
    f.attname for f in Session._meta.concrete_fields if f.attname in _POLL_COLUMNS
)


@cache
def _poll_sql() -> str:
    """The status poll's one statement, written once. Building the same query through the ORM
    cost 0.8 ms of CPU a poll (0.3 ms through `raw`), a third of the whole request: at
    hundreds of polls a second the web processes spent their cores compiling SQL."""
    session, snapshot = Session._meta, Snapshot._meta
    columns = ", ".join(f's."{session.get_field(name).column}"' for name in _POLL_ATTNAMES)
    deleted = snapshot.get_field("deleted_at").column
    expires = snapshot.get_field("expires_at").column
    return (
        f'SELECT {columns}, (n."id" IS NOT NULL AND n."{deleted}" IS NULL'
        f' AND (n."{expires}" IS NULL OR n."{expires}" > %s)) AS has_live_snapshot'
        f' FROM "{session.db_table}" s LEFT JOIN "{snapshot.db_table}" n'
        f' ON n."id" = s."{session.get_field("current_snapshot").column}"'
        f' WHERE s."id" = %s'
    )


class _PreparedCursor(psycopg.Cursor):
    """Server-side binding, and the statement prepared on its connection's first use: PostgreSQL
    then neither parses nor plans the poll again (its CPU per poll went from about 100 to 13
    microseconds, the client's from 40 to 13, on the two cores it shares with the web)."""

    def execute(self, query: str, params: list | None = None, **kwargs: object) -> "Self":
        return super().execute(query, params, prepare=True, **kwargs)


def _poll_row(params: list) -> tuple | None:
    """The poll's row from PostgreSQL. Prepared, on the connection itself rather than through
    Django's cursor wrapper (0.05-0.1 ms of the web's CPU a poll, in one-process measurements
    on a noisy VM): Django's own cursors never prepare, for the sake of external poolers, and
    DB_PREPARED_POLL=0 turns this one off too (see settings). While queries are logged (DEBUG,
    tests that count queries) or watched (`connection.execute_wrapper`), the poll runs through
    Django's cursor, unprepared, so they see it."""
    if not settings.DB_PREPARED_POLL or connection.queries_logged or connection.execute_wrappers:
        with connection.cursor() as cursor:
            cursor.execute(_poll_sql(), params)
            return cursor.fetchone()
    connection.ensure_connection()
    with connection.wrap_database_errors, _PreparedCursor(connection.connection) as cursor:
        cursor.execute(_poll_sql(), params)
        return cursor.fetchone()


def _poll_fetch(params: list) -> Session | None:
    """Run the poll's statement. On PostgreSQL the row is already what the model holds (psycopg
    gives aware datetimes), so it becomes a Session without `raw`'s per-row column mapping
    (0.4 ms of the poll's CPU); other databases need Django's converters, which `raw` applies."""
    if connection.vendor != "postgresql":
        return next(iter(Session.objects.raw(_poll_sql(), params)), None)
    row = _poll_row(params)
    if row is None:
        return None
    session = Session.from_db(connection.alias, _POLL_ATTNAMES, row[:-1])
    session.has_live_snapshot = row[-1]
    return session


def session_get_polled(*, session_id: str, account: Account) -> Session:
    """The session for the status poll, in one query of only the columns it reads, answering
    as `session_get_owned` does (404, then 403). The query also says whether its snapshot is
    live (`has_live_snapshot`), which `session_has_snapshot` then reads instead of the
    snapshot row. Other columns load on first use."""
    session = None
    # No stored id holds a NUL, and PostgreSQL refuses one in a query: not found, not a 500.
    if "\x00" not in session_id:
        now = connection.ops.adapt_datetimefield_value(timezone.now())
        session = _poll_fetch([now, session_id])
    if session is None:
        raise NotFound(f"Session {session_id} not found")
    if session.account_id != account.id:
        raise Forbidden("You do not have access to this session")
    session.has_live_snapshot = bool(session.has_live_snapshot)  # SQLite answers 0 or 1
    return session


# What the events stream reads of the session: its state and where its provisioning is.
_STREAM_COLUMNS = (
    "id",
    "account_id",
    "lifecycle_state",
    "lifecycle_version",
    "provisioning_phase",
    "provisioning_percent",
)


def session_get_streamed(*, session_id: str, account: Account) -> Session:
    """The session for GET /api/sandbox/events, in one narrow query. Another account's session
    answers 404 like one that does not exist: a live feed of someone else's session gives away
    no more than that it is not yours to watch."""
    # No stored id holds a NUL, and PostgreSQL refuses one in a query: not found, not a 500.
    session = None
    if "\x00" not in session_id:
        session = Session.objects.filter(id=session_id).only(*_STREAM_COLUMNS).first()
    if session is None or session.account_id != account.id:
        raise NotFound(f"Session {session_id} not found")
    return session


def session_get_probed(*, session_id: str, account: Account) -> Session:
    """The session for reconnect, answering as `session_get_owned` does (404, then 403), with
    whether it has a live sandbox (`has_live_sandbox`) and ever had one (`has_any_sandbox`)
    from the same query."""
    of_session = Sandbox.objects.filter(session=OuterRef("pk"))
    found = (
        Session.objects.select_related("current_snapshot")
        .filter(id=session_id)
        .annotate(
            has_live_sandbox=Exists(of_session.filter(destroyed_at__isnull=True)),
            has_any_sandbox=Exists(of_session),
        )
    )
    # No stored id holds a NUL, and PostgreSQL refuses one in a query: not found, not a 500.
    session = None if "\x00" in session_id else found.first()
    if session is None:
        raise NotFound(f"Session {session_id} not found")
    if session.account_id != account.id:
        raise Forbidden("You do not have access to this session")
    return session


def session_has_snapshot(session: Session) -> bool:
    live = getattr(session, "has_live_snapshot", None)  # the status poll's query answered it
    if live is not None:
        return live
    snapshot = session.current_snapshot
    return bool(
        snapshot is not None
        and snapshot.deleted_at is None
        and (snapshot.expires_at is None or snapshot.expires_at > timezone.now())
    )


def lifecycle_envelope(session: Session) -> dict:
    """The contract's `SandboxLifecycle`, stamped with the server clock."""
    return {
        "serverTime": epoch_ms(timezone.now()),
        "state": session.lifecycle_state,
        "lastActivityAt": epoch_ms(session.last_activity_at),
        "hibernateAfter": epoch_ms(session.hibernate_after),
        "sandboxExpiresAt": epoch_ms(session.sandbox_expires_at),
    }


def session_sandbox_status(session: Session) -> dict:
    """GET /api/sandbox/status: a database-only read."""
    active = session.lifecycle_state == S.ACTIVE and not session_is_expired(session)
    return {
        "status": "active" if active else "no_sandbox",
        "hasSnapshot": session_has_snapshot(session),
        "lifecycleVersion": session.lifecycle_version,
        "lifecycle": lifecycle_envelope(session),
        "provisioning": provisioning_of(session),
    }


def session_is_expired(session: Session) -> bool:
    expires = session.sandbox_expires_at
    return expires is not None and expires <= timezone.now()


def session_is_overdue(session: Session) -> bool:
    now = timezone.now()
    return session.lifecycle_state == S.ACTIVE and any(
        due is not None and due <= now
        for due in (session.hibernate_after, session.sandbox_expires_at)
    )


def session_ever_provisioned(session: Session) -> bool:
    return session.current_snapshot_id is not None or session.sandboxes.exists()


def accounts_visible_to(account: Account) -> QuerySet[Account]:
    """The caller and every account sharing an organization with it."""
    org_ids = Membership.objects.filter(account=account).values("organization_id")
    return Account.objects.filter(
        Q(id=account.id) | Q(memberships__organization_id__in=org_ids)
    ).distinct()


def legacy_sandbox_status(sandbox: Sandbox) -> str:
    if sandbox.session_id is None or sandbox.destroyed_at is not None:
        return sandbox.status
    return {
        S.PROVISIONING: Sandbox.Status.PENDING,
        S.RESTORING: Sandbox.Status.PENDING,
        S.ACTIVE: Sandbox.Status.RUNNING,
        S.HIBERNATING: Sandbox.Status.STOPPING,
        S.HIBERNATED: Sandbox.Status.STOPPED,
        S.ARCHIVED: Sandbox.Status.STOPPED,
        S.FAILED: Sandbox.Status.FAILED,
    }.get(sandbox.session.lifecycle_state, sandbox.status)


def legacy_sandbox_timeout_ms(sandbox: Sandbox) -> int:
    """Milliseconds left before the sandbox stops on its own (0 once it is not running)."""
    if legacy_sandbox_status(sandbox) != Sandbox.Status.RUNNING:
        return 0
    dues = [sandbox.expires_at]
    if sandbox.session_id is not None:
        dues += [sandbox.session.hibernate_after, sandbox.session.sandbox_expires_at]
    dues = [due for due in dues if due is not None]
    if not dues:
        return 0
    return max(0, int((min(dues) - timezone.now()).total_seconds() * 1000))


def account_sandboxes(*, account: Account, sandbox_id: str | None) -> list[Sandbox]:
    """The account's sandboxes, newest first, each name once: a session's sandbox keeps its
    name across hibernate and resume, and only its newest row says what it is now."""
    sandboxes = Sandbox.objects.filter(account=account).select_related("session")
    if sandbox_id:
        sandboxes = sandboxes.filter(name=sandbox_id)
    newest: dict[str, Sandbox] = {}
    for sandbox in sandboxes.order_by("-created_at", "-id")[:500]:
        newest.setdefault(sandbox.name, sandbox)
    return list(newest.values())[:200]


def account_latest_snapshot(*, account: Account) -> Snapshot | None:
    return (
        Snapshot.objects.filter(account=account, deleted_at__isnull=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()))
        .order_by("-created_at")
        .first()
    )


def account_latest_repo(*, account: Account) -> str | None:
    sandbox = (
        Sandbox.objects.filter(account=account)
        .exclude(repo_full_name="")
        .order_by("-created_at")
        .first()
    )
    if sandbox is not None:
        return sandbox.repo_full_name
    session = (
        Session.objects.filter(account=account, repo_owner__isnull=False, repo_name__isnull=False)
        .order_by("-created_at")
        .first()
    )
    return f"{session.repo_owner}/{session.repo_name}" if session else None
