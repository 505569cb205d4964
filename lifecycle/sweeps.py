"""The beat sweeps: find due work in bounded batches and hand each item to a task.

Due times live in columns, so the sweep alone is enough to drive the lifecycle: a lost broker
message delays hibernation by one dispatch grace, never forever. Each lookup is served by a
partial index on the live rows only, so its cost does not grow with hibernated history.
"""

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.core.files.storage import storages
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from lifecycle.checkpoints import sessions_claim_checkpoints
from lifecycle.hibernation import snapshot_discard
from lifecycle.leases import LEASE_RELEASE
from lifecycle.models import BaseSnapshotBuild
from lifecycle.states import LifecycleState as S
from lifecycle.transitions import Seen, transition
from sandboxes_app.hosts.services import hosts_mark_down
from sandboxes_app.models import Sandbox, Snapshot, session_sandbox_name
from sandboxes_app.oneshots import oneshot_sandbox_destroy
from sandboxes_app.providers.base import get_provider
from sessions_app.models import Session

logger = logging.getLogger("recoup.lifecycle")


@dataclass(frozen=True)
class Due:
    session_id: str
    version: int
    reason: str


def _due_querysets(now: object) -> list[tuple[str, QuerySet[Session]]]:
    expiry_cutoff = now + timedelta(seconds=settings.LIFECYCLE_EXPIRY_BUFFER)
    return [
        (
            "expiry",
            Session.objects.filter(
                lifecycle_state=S.ACTIVE, sandbox_expires_at__lte=expiry_cutoff
            ).order_by("sandbox_expires_at"),
        ),
        (
            "idle",
            Session.objects.filter(lifecycle_state=S.ACTIVE, hibernate_after__lte=now).order_by(
                "hibernate_after"
            ),
        ),
        (
            "stuck",
            Session.objects.filter(
                lifecycle_state__in=[S.PROVISIONING, S.RESTORING, S.HIBERNATING],
                lifecycle_lease_expires_at__lte=now,
            ).order_by("lifecycle_lease_expires_at"),
        ),
        (
            "retry",
            Session.objects.filter(lifecycle_state=S.FAILED, lifecycle_retry_at__lte=now).order_by(
                "lifecycle_retry_at"
            ),
        ),
    ]


def sessions_claim_due(*, limit: int) -> list[Due]:
    """Claim up to `limit` due sessions, marking them dispatched in the same transaction.

    `skip_locked` lets two sweeps (two beats after a failover, say) split the work instead of
    queueing behind each other; the dispatch mark keeps the next sweep from re-sending a
    session whose task is still in the queue.
    """
    now = timezone.now()
    grace = now - timedelta(seconds=settings.LIFECYCLE_DISPATCH_GRACE)
    not_dispatched = Q(lifecycle_dispatched_at__isnull=True) | Q(lifecycle_dispatched_at__lt=grace)
    claimed: list[Due] = []
    with transaction.atomic():
        for reason, queryset in _due_querysets(now):
            remaining = limit - len(claimed)
            if remaining <= 0:
                break
            taken = {due.session_id for due in claimed}
            rows = (
                queryset.filter(not_dispatched)
                .exclude(id__in=taken)
                .select_for_update(skip_locked=True, of=("self",))
                .values_list("id", "lifecycle_version")[:remaining]
            )
            claimed += [Due(session_id=i, version=v, reason=reason) for i, v in rows]
        if claimed:
            Session.objects.filter(id__in=[due.session_id for due in claimed]).update(
                lifecycle_dispatched_at=now
            )
    return claimed


def sweep_run(*, limit: int, enqueue: Callable[[Due], None]) -> int:
    """Beat's frequent sweep: claim due sessions (checkpoints too) and enqueue one task each,
    expire one-shot sandboxes, reap dead base builds. Returns how many sessions were dispatched.

    It runs every LIFECYCLE_SWEEP_INTERVAL (5 s), so it logs one line when it did something
    and nothing when it did not: an idle service's log stays quiet.
    """
    # First, so a dead host's sessions are already failed (and its sandboxes unreachable) when
    # the due work is claimed.
    hosts_down = hosts_mark_down() if settings.SANDBOX_PROVIDER == "pool" else []
    due = sessions_claim_due(limit=limit)
    # Checkpoints come last, with what is left of the batch: hibernations and recoveries first.
    checkpoints = sessions_claim_checkpoints(limit=limit - len(due))
    due += [Due(session_id=i, version=0, reason="checkpoint") for i in checkpoints]
    for item in due:
        enqueue(item)
    expired = oneshot_sandboxes_expire(limit=limit)
    reaped = base_builds_reap()
    if due or expired or reaped or hosts_down:
        dispatched: dict[str, list[str]] = {}
        for item in due:
            dispatched.setdefault(item.reason, []).append(item.session_id)
        logger.info(
            json.dumps(
                {
                    "event": "sweep",
                    "dispatched": dispatched,
                    "oneshots_expired": expired,
                    "builds_reaped": reaped,
                    **({"hosts_down": hosts_down} if hosts_down else {}),
                }
            )
        )
    return len(due)


def session_recover(*, session_id: str, version: int, actor: str) -> Session | None:
    """Recover a run whose lease expired (its worker died), converging without losing files.

    hibernating: finish the hibernation. restoring: the snapshot is still the truth; drop the
    half-extracted workspace and go back to hibernated. provisioning: keep whatever is on disk
    and mark it failed, so the retry path hibernates it or the next POST starts it.
    """
    from lifecycle.hibernation import session_hibernate

    session = Session.objects.filter(id=session_id, lifecycle_version=version).first()
    if session is None or session.lifecycle_lease_expires_at is None:
        return None
    if session.lifecycle_lease_expires_at > timezone.now():
        return None
    if session.lifecycle_state == S.HIBERNATING:
        return session_hibernate(
            session_id=session_id, actor=actor, reason="recover", expected_version=version
        )
    if session.lifecycle_state == S.RESTORING:
        # The resume never became active, so no user write happened in this workspace.
        get_provider().destroy(name=session_sandbox_name(session_id))
        Sandbox.objects.filter(session_id=session_id).mark_destroyed()
        return transition(
            session_id=session_id,
            seen=Seen.of(session),
            to=S.HIBERNATED,
            reason="resume_abandoned",
            actor=actor,
            changes=LEASE_RELEASE,
        )
    if session.lifecycle_state == S.PROVISIONING:
        return transition(
            session_id=session_id,
            seen=Seen.of(session),
            to=S.FAILED,
            reason="provision_abandoned",
            actor=actor,
            error="Provisioning was interrupted; retry POST /api/sandbox",
            changes={**LEASE_RELEASE, "lifecycle_retry_at": timezone.now()},
        )
    return None


def session_retry_failed(*, session_id: str, version: int, actor: str) -> Session | None:
    """A failed session with a workspace on disk is hibernated (with backoff on failure);
    one with nothing on disk just stops being retried."""
    from lifecycle.hibernation import session_hibernate

    moved = session_hibernate(
        session_id=session_id, actor=actor, reason="retry", expected_version=version
    )
    if moved is None:
        Session.objects.filter(
            id=session_id, lifecycle_version=version, lifecycle_state=S.FAILED
        ).update(lifecycle_retry_at=None)
    return moved


def oneshot_sandboxes_expire(*, limit: int) -> int:
    """Destroy one-shot (legacy) sandboxes whose timeout has passed; returns how many this
    sweep recorded (one its owner destroyed meanwhile is not counted twice)."""
    now = timezone.now()
    expired = list(
        Sandbox.objects.filter(
            session__isnull=True, destroyed_at__isnull=True, expires_at__lte=now
        ).order_by("expires_at")[:limit]
    )
    return sum(
        oneshot_sandbox_destroy(sandbox=sandbox, actor="sweep", reason="expired")
        for sandbox in expired
    )


def base_builds_reap() -> int:
    """Fail builds whose worker died mid-run (their heartbeat lease ran out), so a new one can
    be queued for the key, and delete what they stored but never recorded."""
    reaped = 0
    dead = BaseSnapshotBuild.objects.filter(
        status=BaseSnapshotBuild.Status.RUNNING, lease_expires_at__lt=timezone.now()
    )
    for build in dead:
        taken = dead.filter(id=build.id).update(
            status=BaseSnapshotBuild.Status.FAILED,
            error="The build's worker stopped",
            finished_at=timezone.now(),
            lease_expires_at=None,
        )
        if taken:
            reaped += 1
            _base_build_drop_unrecorded(build)
    return reaped


def _base_build_drop_unrecorded(build: BaseSnapshotBuild) -> None:
    """A build killed after storing its object, before recording it, leaves an object nobody
    knows: its key starts with the build's id (see base_build_run)."""
    storage = storages["snapshots"]
    prefix = f"bases/{build.scope.replace(':', '-')}/{build.repo_full_name}"
    try:
        _, names = storage.listdir(prefix)
    except FileNotFoundError:
        return
    bases = Snapshot.objects.filter(kind=Snapshot.Kind.BASE, storage_key__startswith=prefix)
    recorded = set(bases.values_list("storage_key", flat=True))
    for name in names:
        key = f"{prefix}/{name}"
        if name.startswith(f"{build.id}-") and key not in recorded:
            storage.delete(key)


def snapshots_retention(*, limit: int) -> int:
    """Delete session snapshots older than SNAPSHOT_RETENTION_DAYS, and bases that are both
    superseded and no longer under any session snapshot. Returns how many were deleted."""
    cutoff = timezone.now() - timedelta(days=settings.SNAPSHOT_RETENTION_DAYS)
    provider = get_provider()
    deleted = 0
    old_sessions = Snapshot.objects.filter(
        kind=Snapshot.Kind.SESSION, deleted_at__isnull=True, created_at__lt=cutoff
    )[:limit]
    for snapshot in old_sessions:
        Session.objects.filter(current_snapshot=snapshot).update(
            current_snapshot=None,
            snapshot_url=None,
            snapshot_created_at=None,
            snapshot_size_bytes=None,
            updated_at=timezone.now(),
        )
        snapshot_discard(snapshot=snapshot, provider=provider)
        deleted += 1
    for base in Snapshot.objects.filter(
        kind=Snapshot.Kind.BASE, deleted_at__isnull=True, created_at__lt=cutoff
    )[:limit]:
        newer = Snapshot.objects.filter(
            kind=Snapshot.Kind.BASE,
            deleted_at__isnull=True,
            repo_full_name=base.repo_full_name,
            organization_id=base.organization_id,
            account_id=base.account_id,
            created_at__gt=base.created_at,
        ).exists()
        in_use = (
            base.layers.filter(deleted_at__isnull=True).exists()
            or base.sandboxes.filter(destroyed_at__isnull=True).exists()
        )
        if newer and not in_use:
            provider.delete_snapshot(snapshot=base.to_info())
            Snapshot.objects.filter(id=base.id).update(deleted_at=timezone.now())
            deleted += 1
    return deleted
