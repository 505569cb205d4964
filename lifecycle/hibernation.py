"""Hibernation: the one code path for idle, expiry, archive, operator and client requests.

active -> hibernating -> quiesce + snapshot + verify -> record -> stop -> delete workspace ->
hibernated (or archived). The workspace is deleted only after its snapshot is durably written,
verified and recorded on the session; a crash at any step leaves either the workspace or a
recorded snapshot, and the next run (after the lease expires) finishes the job.
"""

import logging
from datetime import timedelta

from django.core.files.storage import storages
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from lifecycle.leases import (
    LEASE_RELEASE,
    lease_claim,
    lease_heartbeat,
    lease_is_live,
    lease_update,
    new_run_id,
)
from lifecycle.states import LifecycleState as S
from lifecycle.transitions import Seen, transition
from recoup.db import release_db_connection
from recoup.faults import crash_point
from sandboxes_app.models import Sandbox, Snapshot, session_sandbox_name
from sandboxes_app.providers.base import (
    SandboxProvider,
    SandboxStatus,
    SnapshotInfo,
    get_provider,
)
from sessions_app.models import Session

logger = logging.getLogger("recoup.lifecycle")

MAX_BACKOFF = timedelta(minutes=30)


def retry_backoff(attempts: int) -> timedelta:
    """10 s, 20 s, 40 s ... capped at 30 minutes."""
    return min(timedelta(seconds=10 * 2 ** max(0, attempts - 1)), MAX_BACKOFF)


def _claim(
    session: Session,
    *,
    provider: SandboxProvider,
    run_id: str,
    actor: str,
    reason: str,
    require_idle: bool,
) -> Session | None:
    seen = Seen.of(session)
    state = session.lifecycle_state
    name = session_sandbox_name(session.id)
    if state == S.HIBERNATING:
        if lease_is_live(session):
            return None
        return transition(
            session_id=session.id,
            seen=seen,
            to=S.HIBERNATING,
            reason="lease_reclaimed",
            actor=actor,
            changes=lease_claim(run_id),
        )
    if state in (S.ACTIVE, S.FAILED):
        if state == S.FAILED and provider.status(name=name) == SandboxStatus.ABSENT:
            return None  # nothing on disk to hibernate
        # Activity resets hibernate_after without bumping the version, so an idle run checks
        # the deadline in the claim itself: a session touched since it was found stays awake.
        idle = Q(hibernate_after__lte=timezone.now()) if require_idle else None
        return transition(
            session_id=session.id,
            seen=seen,
            to=S.HIBERNATING,
            reason=reason,
            actor=actor,
            changes=lease_claim(run_id),
            guard=idle,
        )
    return None


def session_hibernate(
    *,
    session_id: str,
    actor: str,
    reason: str,
    expected_version: int | None = None,
    require_idle: bool = False,
) -> Session | None:
    """Hibernate the session's sandbox. Returns the session when this call moved it, None when
    there was nothing to do or someone else moved first (the caller's fence).

    `expected_version` fences a scheduled task: if the session moved on since it was
    scheduled (resumed, extended, archived) nothing happens. `require_idle` backs off when a
    command is running, as idle hibernation must.
    """
    session = Session.objects.filter(id=session_id).first()
    if session is None:
        return None
    if expected_version is not None and session.lifecycle_version != expected_version:
        return None
    provider = get_provider()
    name = session_sandbox_name(session.id)
    if require_idle and session.lifecycle_state == S.ACTIVE:
        if provider.running_commands(name=name) > 0:
            return None
    run_id = new_run_id()
    claimed = _claim(
        session,
        provider=provider,
        run_id=run_id,
        actor=actor,
        reason=reason,
        require_idle=require_idle,
    )
    if claimed is None:
        return None
    try:
        with lease_heartbeat(session_id=session_id, run_id=run_id):
            return _hibernate_claimed(
                claimed, provider=provider, run_id=run_id, actor=actor, require_idle=require_idle
            )
    except Exception as exc:  # noqa: BLE001 - any failure leaves the workspace and retries
        logger.exception("hibernation failed session=%s", session_id)
        current = Session.objects.get(id=session_id)
        if current.lifecycle_run_id != run_id:
            return None
        attempts = current.lifecycle_attempts + 1
        return transition(
            session_id=session_id,
            seen=Seen.of(current),
            to=S.FAILED,
            reason="hibernate_failed",
            actor=actor,
            error=f"Hibernation failed: {exc}",
            changes={
                **LEASE_RELEASE,
                "lifecycle_attempts": attempts,
                "lifecycle_retry_at": timezone.now() + retry_backoff(attempts),
            },
        )


def sessions_hibernate_all(*, actor: str) -> int:
    """Hibernate, now and here, every session whose sandbox is up or kept after a failure
    (`manage.py up --hibernate-on-exit`). Returns how many were hibernated."""
    live = Session.objects.filter(lifecycle_state__in=[S.ACTIVE, S.FAILED]).values_list(
        "id", flat=True
    )
    done = 0
    for session_id in list(live):
        if session_hibernate(session_id=session_id, actor=actor, reason="shutdown") is not None:
            done += 1
    return done


def session_hibernate_request(*, session_id: str, reason: str) -> Session:
    """Ask for the session's hibernation. With a sandbox to hibernate the worker does it now;
    while one is being provisioned or resumed the request is recorded on the session, and the
    run that finishes that work hands it to the worker (see `transition`). Never dropped."""
    # A run holds the session (alive, or dead and due for recovery, which ends it too); a new
    # session waiting for its first POST /api/sandbox is `provisioning` with no run at all.
    recorded = Session.objects.filter(
        id=session_id,
        lifecycle_state__in=[S.PROVISIONING, S.RESTORING],
        lifecycle_run_id__isnull=False,
    ).update(lifecycle_intent="hibernate", updated_at=timezone.now())
    if not recorded:
        from lifecycle.tasks import hibernate_session

        transaction.on_commit(lambda: hibernate_session.delay(session_id, None, reason))
    return Session.objects.select_related("current_snapshot").get(id=session_id)


def _hibernate_claimed(
    session: Session, *, provider: SandboxProvider, run_id: str, actor: str, require_idle: bool
) -> Session | None:
    name = session_sandbox_name(session.id)
    if require_idle and provider.running_commands(name=name) > 0:
        # A command started between the idle check and the claim: stay active.
        return transition(
            session_id=session.id,
            seen=Seen.of(session),
            to=S.ACTIVE,
            reason="command_running",
            actor=actor,
            changes=LEASE_RELEASE,
        )
    previous = session.current_snapshot
    crash_point("hibernate_claimed")
    if provider.status(name=name) != SandboxStatus.ABSENT:
        live = Sandbox.objects.filter(session=session, destroyed_at__isnull=True).first()
        key = f"sessions/{session.id}/{run_id}.tar.zst"
        release_db_connection()  # a snapshot may take minutes
        info = provider.snapshot(name=name, storage_key=key)
        crash_point("hibernate_snapshot_written")
        with transaction.atomic():
            snapshot = session_snapshot_record(session=session, sandbox=live, info=info)
            if not lease_update(
                session_id=session.id, run_id=run_id, **current_snapshot_changes(snapshot)
            ):
                transaction.set_rollback(True)
                return None
        crash_point("hibernate_snapshot_recorded")
        # Only now, with a verified snapshot recorded, may the workspace go. Its detached
        # commands die with it: stopped first, their exits are recorded before their records
        # go with the sandbox's directory.
        provider.stop(name=name)
        _settle_commands(sandbox_name=name)
        provider.destroy(name=name)
        Sandbox.objects.filter(session=session).mark_destroyed()
    elif session.current_snapshot is None:
        raise RuntimeError("the workspace is gone and no snapshot was recorded")
    crash_point("hibernate_workspace_deleted")
    snapshots_drop_unrecorded(session_id=session.id)
    session.refresh_from_db()
    archived = session.status == Session.Status.ARCHIVED
    done = transition(
        session_id=session.id,
        seen=Seen.of(session),
        to=S.ARCHIVED if archived else S.HIBERNATED,
        reason="archived" if archived else "hibernated",
        actor=actor,
        changes={
            **LEASE_RELEASE,
            "hibernate_after": None,
            "sandbox_expires_at": None,
            "lifecycle_attempts": 0,
            "lifecycle_retry_at": None,
            "sandbox_state": {"name": name, "provider": provider.name, "status": "stopped"},
        },
    )
    if done is not None and previous is not None and previous.id != done.current_snapshot_id:
        snapshot_discard(snapshot=previous, provider=provider)
    return done


def session_snapshot_record(
    *, session: Session, sandbox: Sandbox | None, info: SnapshotInfo
) -> Snapshot:
    """The row of a session snapshot the provider just wrote and verified (by hibernation or
    a checkpoint); it layers on the base its sandbox sat on."""
    return Snapshot.objects.create(
        kind=Snapshot.Kind.SESSION,
        storage_key=info.storage_key,
        size_bytes=info.size_bytes,
        sha256=info.sha256,
        created_at=info.created_at,
        base=sandbox.base_snapshot if sandbox else None,
        session=session,
        account_id=session.account_id,
        organization_id=session.organization_id,
        repo_full_name=sandbox.repo_full_name if sandbox else "",
    )


def current_snapshot_changes(snapshot: Snapshot) -> dict:
    """The session's columns that make `snapshot` its current one."""
    return {
        "current_snapshot": snapshot,
        "snapshot_url": snapshot.storage_key,
        "snapshot_created_at": snapshot.created_at,
        "snapshot_size_bytes": snapshot.size_bytes,
    }


def _settle_commands(*, sandbox_name: str) -> None:
    # Imported here: sandboxes_app.commands uses the session services, which import this module.
    from sandboxes_app.commands import commands_settle

    commands_settle(sandbox_name=sandbox_name)


def snapshots_drop_unrecorded(*, session_id: str) -> int:
    """Delete the session's stored objects that no snapshot row records: what a run killed
    while writing its snapshot, or between writing and recording it, left behind.

    Called only while holding the session's lease, so no live run of this session is writing
    one; a zombie run whose lease was reclaimed can never record (or act on) its object.
    """
    storage = storages["snapshots"]
    prefix = f"sessions/{session_id}"
    try:
        _, names = storage.listdir(prefix)
    except FileNotFoundError:
        return 0
    recorded = set(
        Snapshot.objects.filter(session_id=session_id).values_list("storage_key", flat=True)
    )
    # Also the temporary file of a write that was killed before its rename (see snapshots).
    stored = [n for n in names if n.endswith(".tar.zst") or ".tar.zst.tmp-" in n]
    orphans = [f"{prefix}/{n}" for n in stored if f"{prefix}/{n}" not in recorded]
    for key in orphans:
        storage.delete(key)
    return len(orphans)


def snapshot_discard(*, snapshot: Snapshot, provider: SandboxProvider | None = None) -> None:
    """Delete a session snapshot that nothing needs any more (a newer one replaced it)."""
    if snapshot.kind != Snapshot.Kind.SESSION or snapshot.deleted_at is not None:
        return
    if Session.objects.filter(current_snapshot=snapshot).exists():
        return
    (provider or get_provider()).delete_snapshot(snapshot=snapshot.to_info())
    Snapshot.objects.filter(id=snapshot.id).update(deleted_at=timezone.now())
