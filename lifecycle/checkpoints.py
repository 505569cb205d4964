"""Checkpoints: snapshots of an active sandbox taken while it keeps running.

A session whose host dies resumes elsewhere from its current snapshot; every SANDBOX_CHECKPOINT
_INTERVAL seconds a sandbox that changed since its last one gets a new one, which bounds what
such a loss costs. The sandbox is frozen for the tar only (the provider's snapshot), not stopped.

A checkpoint is not a lifecycle run: it takes no lease and bumps no version, so it never fences
off a hibernation, a resume or a task scheduled for the session's version. It is fenced itself:
its snapshot becomes current only by a compare-and-set on the (state, version, current snapshot)
it saw before it started, so a hibernation, resume or other checkpoint that moved first wins
and the checkpoint deletes what it wrote. Against a hibernation of the same sandbox:

- The provider's snapshot holds the sandbox's lock from freeze to thaw, so the two tars never
  interleave their freezes, and the one that comes second contains everything the first did.
- A hibernation's `snapshots_drop_unrecorded` runs between its claim and its end, and the claim
  moved the version: any checkpoint whose object is unrecorded then has already lost its
  compare-and-set, so the object it drops was never going to be current.
"""

import json
import logging
import time
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from lifecycle.hibernation import (
    current_snapshot_changes,
    session_snapshot_record,
    snapshot_discard,
)
from lifecycle.leases import new_run_id
from lifecycle.states import LifecycleState as S
from recoup.db import release_db_connection
from sandboxes_app.models import Sandbox, Snapshot, session_sandbox_name
from sandboxes_app.providers.base import (
    ProviderError,
    SandboxNotFound,
    SnapshotInfo,
    get_provider,
)
from sandboxes_app.snapshots import snapshot_delete
from sessions_app.models import Session

logger = logging.getLogger("recoup.lifecycle")


def _unsaved() -> Q:
    """Sessions whose workspace may hold changes no snapshot has (None: not known)."""
    return Q(workspace_saved_at__isnull=True) | Q(last_activity_at__gt=F("workspace_saved_at"))


def sessions_claim_checkpoints(*, limit: int) -> list[str]:
    """Claim up to `limit` active sessions due for a checkpoint, marking them dispatched in the
    same transaction: saved longer than SANDBOX_CHECKPOINT_INTERVAL ago and active since.
    Nothing when the interval is 0."""
    interval = settings.SANDBOX_CHECKPOINT_INTERVAL
    if interval <= 0 or limit <= 0:
        return []
    now = timezone.now()
    grace = now - timedelta(seconds=settings.LIFECYCLE_DISPATCH_GRACE)
    due = (
        Session.objects.filter(lifecycle_state=S.ACTIVE)
        .filter(
            Q(workspace_saved_at__isnull=True)
            | Q(
                workspace_saved_at__lte=now - timedelta(seconds=interval),
                last_activity_at__gt=F("workspace_saved_at"),
            )
        )
        .filter(Q(checkpoint_dispatched_at__isnull=True) | Q(checkpoint_dispatched_at__lt=grace))
        # Oldest save first (never-saved ones last on PostgreSQL, first on SQLite), as the
        # partial index serves it.
        .order_by("workspace_saved_at")
    )
    with transaction.atomic():
        ids = list(
            due.select_for_update(skip_locked=True, of=("self",)).values_list("id", flat=True)[
                :limit
            ]
        )
        if ids:
            Session.objects.filter(id__in=ids).update(checkpoint_dispatched_at=now)
    return ids


def session_checkpoint(*, session_id: str, actor: str) -> Snapshot | None:
    """Snapshot the session's running sandbox without stopping it and make that its current
    snapshot, discarding the previous one. Returns the new snapshot, or None when there was
    nothing to save or another lifecycle step moved first (then nothing of it is left).

    Never touches the idle clock (`last_activity_at`, `hibernate_after`): a checkpoint is not
    activity, and an idle sandbox is still hibernated on time.
    """
    session = Session.objects.filter(Q(id=session_id, lifecycle_state=S.ACTIVE) & _unsaved())
    session = session.first()
    if session is None:
        return None
    sandbox = Sandbox.objects.filter(session=session, destroyed_at__isnull=True).first()
    if sandbox is None:
        return None
    previous_id = session.current_snapshot_id
    # Every change before this instant is in the tar: the freeze comes after it. Activity from
    # now on (a command that was running, say) makes the session due again.
    saved_at = timezone.now()
    key = f"sessions/{session.id}/{new_run_id()}.tar.zst"
    started = time.monotonic()
    release_db_connection()  # a snapshot may take minutes
    provider = get_provider()
    try:
        info = provider.snapshot(name=session_sandbox_name(session.id), storage_key=key)
    except SandboxNotFound:
        return None  # a hibernation deleted the workspace first; its snapshot is current
    except (ProviderError, OSError):
        # A failed checkpoint must not fail the session: the next sweep tries again. (A worker
        # killed here leaves its object to the next hibernation's snapshots_drop_unrecorded.)
        logger.exception("checkpoint failed session=%s", session.id)
        snapshot_delete(storage_key=key)
        return None
    snapshot = _record(
        session, sandbox=sandbox, info=info, previous_id=previous_id, saved_at=saved_at
    )
    ms = round((time.monotonic() - started) * 1000, 1)
    if snapshot is None:
        snapshot_delete(storage_key=key)
        _log(session_id=session.id, actor=actor, outcome="superseded", ms=ms, size=info.size_bytes)
        return None
    if previous_id is not None:
        previous = Snapshot.objects.filter(id=previous_id).first()
        if previous is not None:
            snapshot_discard(snapshot=previous, provider=provider)
    _log(session_id=session.id, actor=actor, outcome="saved", ms=ms, size=info.size_bytes)
    return snapshot


def _record(
    session: Session,
    *,
    sandbox: Sandbox,
    info: SnapshotInfo,
    previous_id: uuid.UUID | None,
    saved_at: datetime,
) -> Snapshot | None:
    """Record the snapshot and make it current, in one transaction, if the session is still
    where it was when the checkpoint started; None (and no row) otherwise."""
    with transaction.atomic():
        snapshot = session_snapshot_record(session=session, sandbox=sandbox, info=info)
        # No version bump, no last_activity_at: see the module docstring.
        won = Session.objects.filter(
            id=session.id,
            lifecycle_state=S.ACTIVE,
            lifecycle_version=session.lifecycle_version,
            current_snapshot_id=previous_id,
        ).update(
            **current_snapshot_changes(snapshot),
            workspace_saved_at=saved_at,
            updated_at=timezone.now(),
        )
        if won != 1:
            transaction.set_rollback(True)
            return None
    return snapshot


def _log(*, session_id: str, actor: str, outcome: str, ms: float, size: int) -> None:
    # A log line, not a LifecycleEvent: those rows are transitions, one per version, and the
    # events stream replays them as such; a checkpoint changes no state.
    logger.info(
        json.dumps(
            {
                "event": "checkpoint",
                "session_id": session_id,
                "outcome": outcome,
                "ms": ms,
                "size_bytes": size,
                "actor": actor,
            }
        )
    )
