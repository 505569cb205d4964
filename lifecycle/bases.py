"""The per-organization base snapshot builder.

Keyed by (organization, or the account when the session has none; repository). The first
sandbox of a key clones as usual and requests one build; later sandboxes boot copy-on-write from
the base and fast-forward. A failed or missing base only means a plain clone.
"""

import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from lifecycle.leases import heartbeat, lease_expiry
from lifecycle.models import BaseSnapshotBuild
from recoup.accounts.git_tokens import git_token_for_clone
from sandboxes_app.git.urls import RepoRef
from sandboxes_app.models import Snapshot
from sandboxes_app.providers.base import GitSource, get_provider
from sessions_app.models import Session

logger = logging.getLogger("recoup.lifecycle")


def base_scope(session: Session) -> str:
    if session.organization_id:
        return f"org:{session.organization_id}"
    return f"acct:{session.account_id}"


def base_build_request(*, session: Session, repo: RepoRef, reason: str) -> BaseSnapshotBuild | None:
    """Queue one build for the session's key; None when one is already queued or running."""
    return base_build_enqueue(
        scope=base_scope(session),
        organization_id=session.organization_id,
        account_id=session.account_id,
        repo_full_name=repo.full_name,
        clone_url=repo.clone_url,
        reason=reason,
    )


def base_build_enqueue(
    *,
    scope: str,
    organization_id: object,
    account_id: object,
    repo_full_name: str,
    clone_url: str,
    reason: str,
) -> BaseSnapshotBuild | None:
    """Insert a queued build and hand it to the worker on commit; None when the unique
    constraint says one is already queued or running for (scope, repository)."""
    try:
        with transaction.atomic():
            build = BaseSnapshotBuild.objects.create(
                scope=scope,
                organization_id=organization_id,
                account_id=account_id,
                repo_full_name=repo_full_name,
                clone_url=clone_url,
                reason=reason,
            )
    except IntegrityError:
        return None
    from lifecycle.tasks import build_base_snapshot

    transaction.on_commit(lambda: build_base_snapshot.delay(build.id))
    return build


def base_build_run(*, build_id: int) -> BaseSnapshotBuild | None:
    """Run a queued build: claim it, clone into a scratch workspace, record the base."""
    started = timezone.now()
    claimed = BaseSnapshotBuild.objects.filter(
        id=build_id, status=BaseSnapshotBuild.Status.QUEUED
    ).update(
        status=BaseSnapshotBuild.Status.RUNNING, started_at=started, lease_expires_at=lease_expiry()
    )
    if claimed != 1:
        return None
    build = BaseSnapshotBuild.objects.get(id=build_id)
    clock = time.monotonic()

    def renew() -> bool:
        running = BaseSnapshotBuild.objects.filter(
            id=build_id, status=BaseSnapshotBuild.Status.RUNNING
        )
        return running.update(lease_expires_at=lease_expiry()) == 1

    try:
        with heartbeat(renew, what=f"base build {build_id}"):
            snapshot = _build(build=build, started=started)
        status, error = BaseSnapshotBuild.Status.SUCCEEDED, None
    except Exception as exc:  # noqa: BLE001 - a failed base only means plain clones
        logger.exception("base build %s failed", build_id)
        snapshot, status, error = None, BaseSnapshotBuild.Status.FAILED, str(exc)[:2000]
    BaseSnapshotBuild.objects.filter(id=build_id, status=BaseSnapshotBuild.Status.RUNNING).update(
        status=status,
        snapshot=snapshot,
        error=error,
        finished_at=timezone.now(),
        lease_expires_at=None,
        duration_ms=int((time.monotonic() - clock) * 1000),
    )
    return BaseSnapshotBuild.objects.get(id=build_id)


def _build(*, build: BaseSnapshotBuild, started: datetime) -> Snapshot:
    # From the name, not the stored clone_url: the base's origin is the public URL whatever
    # the row recorded, and the token is chosen now, for the organization as it is now.
    owner, name = build.repo_full_name.split("/")
    repo = RepoRef(owner=owner, name=name)
    source = GitSource(
        clone_url=repo.clone_url,
        token=git_token_for_clone(organization_id=build.organization_id, owner=owner),
    )
    info = get_provider().build_base(
        source=source,
        storage_key=f"bases/{build.scope.replace(':', '-')}/{build.repo_full_name}/"
        f"{build.id}-{int(started.timestamp())}.tar.zst",
    )
    return Snapshot.objects.create(
        kind=Snapshot.Kind.BASE,
        storage_key=info.storage_key,
        size_bytes=info.size_bytes,
        sha256=info.sha256,
        created_at=info.created_at,
        account_id=build.account_id,
        organization_id=build.organization_id,
        repo_full_name=build.repo_full_name,
    )


def base_snapshot_lookup(*, session: Session, repo: RepoRef) -> Snapshot | None:
    """The newest base for the session's key, requesting a build when there is none or it is
    older than BASE_SNAPSHOT_MAX_AGE (the stale one still serves meanwhile)."""
    bases = Snapshot.objects.filter(
        kind=Snapshot.Kind.BASE, repo_full_name=repo.full_name, deleted_at__isnull=True
    )
    if session.organization_id:
        bases = bases.filter(organization_id=session.organization_id)
    else:
        bases = bases.filter(account_id=session.account_id, organization__isnull=True)
    base = bases.order_by("-created_at").first()
    max_age = timedelta(seconds=settings.BASE_SNAPSHOT_MAX_AGE)
    if base is None:
        base_build_request(session=session, repo=repo, reason="first_use")
    elif base.created_at < timezone.now() - max_age:
        base_build_request(session=session, repo=repo, reason="stale")
    return base
