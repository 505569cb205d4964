"""Session sandbox services: create-or-resume, activity, extension and commands.

Create-or-resume claims the session with a lease in one compare-and-set; concurrent requests
for the same session find the live lease and wait for the winner's result instead of cloning
again. Slow provider work always happens outside any transaction or row lock.
"""

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from lifecycle.bases import base_snapshot_lookup
from lifecycle.hibernation import session_hibernate
from lifecycle.leases import (
    LEASE_RELEASE,
    lease_claim,
    lease_heartbeat,
    lease_is_live,
    lease_update,
    new_run_id,
)
from lifecycle.progress import ProvisioningProgress
from lifecycle.states import LifecycleState as S
from lifecycle.transitions import Seen, transition
from recoup.accounts.git_tokens import git_token_for_clone
from recoup.db import release_db_connection
from recoup.errors import ApplicationError, Conflict, ServiceUnavailable, UpstreamError
from recoup.faults import crash_point
from recoup.waits import waiting_slot
from sandboxes_app.git.commands import public_text
from sandboxes_app.git.urls import RepoRef
from sandboxes_app.models import Sandbox, Snapshot, session_sandbox_name
from sandboxes_app.providers.base import (
    CommandResult,
    GitSource,
    ProviderError,
    SandboxInfo,
    SandboxProvider,
    SandboxStatus,
    SnapshotCorrupt,
    SnapshotMissing,
    get_provider,
)
from sandboxes_app.quotas import command_slot, sandbox_quota_check
from sandboxes_app.selectors import epoch_ms, lifecycle_envelope, session_has_snapshot
from sessions_app.models import Session

logger = logging.getLogger("recoup.sandboxes")

_WAIT_POLL_SECONDS = 0.1
_RETRY_AFTER_SECONDS = 5


@dataclass(frozen=True)
class Ready:
    """What POST /api/sandbox reports about a sandbox that is up."""

    sandbox: Sandbox
    branch: str
    mode: str
    ready_at: datetime


def _idle_deadlines(now: datetime) -> dict:
    return {
        "last_activity_at": now,
        "hibernate_after": now + timedelta(seconds=settings.SANDBOX_IDLE_TIMEOUT),
    }


def session_sandbox_ensure(*, session_id: str, repo: RepoRef, actor: str) -> Ready:
    """Bring the session's sandbox up: reuse it when running, resume it from its snapshot when
    hibernated, otherwise create it. Safe to call concurrently: one caller does the work and
    the others wait for its result."""
    provider = get_provider()
    name = session_sandbox_name(session_id)
    deadline = time.monotonic() + settings.SANDBOX_PROVISION_WAIT
    while True:
        session = Session.objects.select_related("current_snapshot").get(id=session_id)
        _check_repo(session, repo)
        state = session.lifecycle_state
        if state == S.ARCHIVED or session.status == Session.Status.ARCHIVED:
            raise Conflict("Session is archived; PATCH its status to running to resume it")
        if state in (S.PROVISIONING, S.RESTORING, S.HIBERNATING) and lease_is_live(session):
            if time.monotonic() > deadline:
                # The run is alive (its lease is renewed) but slow: the client comes back.
                raise ServiceUnavailable(
                    f"The session's sandbox is still {state}; retry shortly",
                    retry_after=_RETRY_AFTER_SECONDS,
                )
            release_db_connection()
            time.sleep(_WAIT_POLL_SECONDS)
            continue
        if state == S.HIBERNATING:
            # A crashed hibernation: finish it first, so the resume starts from its snapshot.
            session_hibernate(session_id=session_id, actor=actor, reason="finish_before_resume")
            continue
        if state == S.ACTIVE:
            ready = _reuse_running(session, provider=provider, name=name, actor=actor)
            if ready is not None:
                return ready
            continue
        ready = _claim_and_provision(session, provider=provider, repo=repo, actor=actor)
        if ready is not None:
            return ready


def _check_repo(session: Session, repo: RepoRef) -> None:
    if session.repo_owner and session.repo_name and session.lifecycle_version > 0:
        if (session.repo_owner, session.repo_name) != (repo.owner, repo.name):
            raise ApplicationError(
                f"repoUrl: this session's sandbox holds {session.repo_owner}/"
                f"{session.repo_name}; start a new session for another repository"
            )


def _reuse_running(
    session: Session, *, provider: SandboxProvider, name: str, actor: str
) -> Ready | None:
    sandbox = Sandbox.objects.filter(session=session, destroyed_at__isnull=True).first()
    if sandbox is not None and provider.status(name=name) == SandboxStatus.RUNNING:
        _touch(session.id)
        return Ready(
            sandbox=sandbox, branch=sandbox.branch, mode=provider.name, ready_at=timezone.now()
        )
    # The runtime is gone (a host restart, say): record it, keep the workspace, start over.
    _record_runtime_lost(session, actor=actor)
    return None


def _record_runtime_lost(session: Session, *, actor: str) -> Session:
    """An active session whose runtime died: failed, with its workspace kept on disk and due
    at once for the sweep's retry, which hibernates it from there."""
    return transition(
        session_id=session.id,
        seen=Seen.of(session),
        to=S.FAILED,
        reason="runtime_lost",
        actor=actor,
        error="The sandbox runtime stopped unexpectedly; its workspace was kept",
        changes={"lifecycle_retry_at": timezone.now()},
    ) or Session.objects.get(id=session.id)


def _touch(session_id: str) -> int:
    """Reset the idle clock of an active session; 0 when it is not active any more."""
    now = timezone.now()
    return Session.objects.filter(id=session_id, lifecycle_state=S.ACTIVE).update(
        updated_at=now, **_idle_deadlines(now)
    )


def _claim_and_provision(
    session: Session, *, provider: SandboxProvider, repo: RepoRef, actor: str
) -> Ready | None:
    # Refused before the provider is even asked about the workspace; rechecked under the lock.
    sandbox_quota_check(
        account_id=session.account_id,
        organization_id=session.organization_id,
        session_id=session.id,
    )
    name = session_sandbox_name(session.id)
    snapshot = session.current_snapshot if session_has_snapshot(session) else None
    on_disk = provider.status(name=name) != SandboxStatus.ABSENT
    # A workspace on disk is newer than any snapshot of it (a failed session keeps it).
    resume_from = snapshot if snapshot is not None and not on_disk else None
    run_id = new_run_id()
    with transaction.atomic():
        # The quota check locks the account; the claim in this transaction takes the slot.
        sandbox_quota_check(
            account_id=session.account_id,
            organization_id=session.organization_id,
            session_id=session.id,
        )
        claimed = transition(
            session_id=session.id,
            seen=Seen.of(session),
            to=S.RESTORING if resume_from else S.PROVISIONING,
            reason="resume" if resume_from else "create",
            actor=actor,
            changes=lease_claim(run_id),
        )
    if claimed is None:
        return None
    progress = ProvisioningProgress(
        session_id=session.id, run_id=run_id, version=claimed.lifecycle_version
    )
    progress("queued")
    with lease_heartbeat(session_id=session.id, run_id=run_id):
        crash_point("resume_claimed" if resume_from else "create_claimed")
        try:
            info, base = _boot(
                claimed,
                provider=provider,
                repo=repo,
                run_id=run_id,
                resume_from=resume_from,
                actor=actor,
                progress=progress,
            )
        except ProviderError as exc:
            error = public_text(str(exc))
            _fail(session_id=session.id, run_id=run_id, actor=actor, error=error)
            raise UpstreamError(f"The sandbox provider failed: {error}") from exc
        except Exception as exc:
            logger.exception("provisioning failed session=%s", session.id)
            _fail(session_id=session.id, run_id=run_id, actor=actor, error=repr(exc))
            raise UpstreamError("The sandbox provider failed unexpectedly") from exc
        crash_point(f"{info.boot}_booted")
        return _activate(
            session.id,
            provider=provider,
            repo=repo,
            info=info,
            base=base,
            run_id=run_id,
            actor=actor,
        )


def _boot(
    session: Session,
    *,
    provider: SandboxProvider,
    repo: RepoRef,
    run_id: str,
    resume_from: Snapshot | None,
    actor: str,
    progress: ProvisioningProgress,
) -> tuple[SandboxInfo, Snapshot | None]:
    name = session_sandbox_name(session.id)
    if resume_from is not None:
        try:
            release_db_connection()  # an extraction may take minutes
            info = provider.resume(name=name, snapshot=resume_from.to_info(), progress=progress)
            return info, resume_from.base
        except (SnapshotMissing, SnapshotCorrupt) as exc:
            # The snapshot cannot come back; a fresh sandbox beats an error nobody can fix.
            logger.warning("snapshot unusable session=%s: %s", session.id, exc)
            provider.destroy(name=name)
            lease_update(session_id=session.id, run_id=run_id, current_snapshot=None)
            current = Session.objects.get(id=session.id)
            fallback = transition(
                session_id=session.id,
                seen=Seen.of(current),
                to=S.PROVISIONING,
                reason="snapshot_unusable",
                actor=actor,
                changes=lease_claim(run_id),
            )
            if fallback is None:
                raise ProviderError("lost the lease while falling back to a fresh sandbox") from exc
            progress.version = fallback.lifecycle_version
    base = base_snapshot_lookup(session=session, repo=repo)
    source = GitSource(
        clone_url=repo.clone_url,
        token=git_token_for_clone(organization_id=session.organization_id, owner=repo.owner),
    )
    release_db_connection()  # a clone may take minutes
    if base is not None:
        try:
            info = provider.create(name=name, source=source, base=base.to_info(), progress=progress)
            return info, base
        except (SnapshotMissing, SnapshotCorrupt) as exc:
            # A broken base only costs a plain clone; retire it so the next build replaces it.
            logger.warning("base snapshot %s unusable: %s", base.storage_key, exc)
            Snapshot.objects.filter(id=base.id).update(deleted_at=timezone.now())
            provider.destroy(name=name)
            release_db_connection()
    return provider.create(name=name, source=source, progress=progress), None


def _activate(
    session_id: str,
    *,
    provider: SandboxProvider,
    repo: RepoRef,
    info: SandboxInfo,
    base: Snapshot | None,
    run_id: str,
    actor: str,
) -> Ready | None:
    now = timezone.now()
    changes = {
        **LEASE_RELEASE,
        **_idle_deadlines(now),
        "sandbox_expires_at": now + timedelta(seconds=settings.SANDBOX_TIMEOUT),
        "repo_owner": repo.owner,
        "repo_name": repo.name,
        "clone_url": repo.clone_url,
        "branch": info.branch,
        "sandbox_state": {
            "name": info.name,
            "provider": provider.name,
            "status": "running",
            "boot": info.boot,
            "branch": info.branch,
        },
        "lifecycle_attempts": 0,
        "lifecycle_retry_at": None,
        # A fresh clone or a fresh resume holds nothing unsaved; a workspace kept on disk may
        # (None: its first checkpoint is due at once).
        "workspace_saved_at": None if info.details.get("reused", True) else now,
    }
    with transaction.atomic():
        current = Session.objects.select_for_update().get(id=session_id)
        if current.lifecycle_run_id != run_id:
            return None  # our lease was reclaimed; the new holder reports the result
        sandbox = Sandbox.objects.filter(session_id=session_id, destroyed_at__isnull=True).first()
        if sandbox is None:
            sandbox = Sandbox(name=info.name, session_id=session_id, account_id=current.account_id)
        sandbox.provider = provider.name
        sandbox.repo_full_name = repo.full_name
        sandbox.branch = info.branch
        sandbox.status = Sandbox.Status.RUNNING
        sandbox.boot = info.boot
        sandbox.base_snapshot = base
        sandbox.expires_at = changes["sandbox_expires_at"]
        sandbox.stopped_at = None
        sandbox.save()
        if (
            transition(
                session_id=session_id,
                seen=Seen.of(current),
                to=S.ACTIVE,
                reason=f"ready_{info.boot}",
                actor=actor,
                changes=changes,
            )
            is None
        ):
            transaction.set_rollback(True)
            return None
    return Ready(sandbox=sandbox, branch=info.branch, mode=provider.name, ready_at=now)


def _fail(*, session_id: str, run_id: str, actor: str, error: str) -> None:
    current = Session.objects.get(id=session_id)
    if current.lifecycle_run_id == run_id:
        transition(
            session_id=session_id,
            seen=Seen.of(current),
            to=S.FAILED,
            reason="provision_failed",
            actor=actor,
            error=error,
            changes=LEASE_RELEASE,
        )


def _require_active(session: Session) -> None:
    if session.lifecycle_state != S.ACTIVE:
        raise Conflict(
            f"Session has no active sandbox (lifecycle state {session.lifecycle_state}); "
            "POST /api/sandbox to create or resume it"
        )


def session_activity_touch(*, session: Session) -> Session:
    """Reset the idle clock of an active sandbox."""
    _require_active(session)
    if not _touch(session.id):
        raise Conflict("Session has no active sandbox")
    session.refresh_from_db()
    return session


def session_extend(*, session: Session, actor: str) -> Session:
    """Push the expiry out by SANDBOX_EXTEND, capped at SANDBOX_MAX_LIFETIME from creation."""
    _require_active(session)
    sandbox = Sandbox.objects.filter(session=session, destroyed_at__isnull=True).first()
    started = sandbox.created_at if sandbox else timezone.now()
    cap = started + timedelta(seconds=settings.SANDBOX_MAX_LIFETIME)
    current = session.sandbox_expires_at or timezone.now()
    new_expiry = min(current + timedelta(seconds=settings.SANDBOX_EXTEND), cap)
    extended = transition(
        session_id=session.id,
        seen=Seen.of(session),
        to=S.ACTIVE,
        reason="extend",
        actor=actor,
        changes={"sandbox_expires_at": new_expiry},
    )
    if extended is None:
        raise Conflict("The session changed while extending; retry")
    Sandbox.objects.filter(session=session, destroyed_at__isnull=True).update(expires_at=new_expiry)
    return extended


def session_command_run(
    *,
    session: Session,
    argv: list[str],
    cwd: str | None,
    env: dict[str, str] | None,
    timeout_s: float | None,
) -> CommandResult:
    """Run a command in the session's active sandbox; it counts as activity. It holds one of
    the account's command slots while it runs (429 when none is free, before any effect)."""
    _require_active(session)
    with command_slot(
        account_id=session.account_id,
        organization_id=session.organization_id,
        timeout_s=timeout_s,
    ):
        session = session_activity_touch(session=session)
        release_db_connection()
        try:
            with waiting_slot():
                result = get_provider().run(
                    name=session_sandbox_name(session.id),
                    argv=argv,
                    cwd=cwd,
                    env=env,
                    timeout_s=timeout_s,
                )
        except ProviderError as exc:
            raise UpstreamError(f"The sandbox provider failed: {public_text(str(exc))}") from exc
    _touch(session.id)
    return result


def session_reconnect(*, session: Session, actor: str) -> dict:
    """GET /api/sandbox/reconnect: probe the runtime without waking or touching it. `session`
    comes from `selectors.session_get_probed`.

    An active session whose runtime is dead is recorded as failed with its workspace kept (the
    lifecycle hibernates it from disk); a failed session whose runtime answers heals to active.
    """
    provider = get_provider()
    name = session_sandbox_name(session.id)
    live = session.has_live_sandbox
    if not live and session.current_snapshot_id is None and not session.has_any_sandbox:
        outcome = {"status": "no_sandbox"}
    elif live and session.lifecycle_state in (S.ACTIVE, S.FAILED) and provider.probe(name=name):
        if session.lifecycle_state == S.FAILED:
            session = transition(
                session_id=session.id,
                seen=Seen.of(session),
                to=S.ACTIVE,
                reason="healed",
                actor=actor,
            ) or Session.objects.get(id=session.id)
        outcome = {"status": "connected"}
        if session.sandbox_expires_at is not None:
            outcome["expiresAt"] = epoch_ms(session.sandbox_expires_at)
    else:
        if live and session.lifecycle_state == S.ACTIVE:
            session = _record_runtime_lost(session, actor=actor)
        outcome = {"status": "expired"}
    return {
        **outcome,
        "hasSnapshot": session_has_snapshot(session),
        "lifecycle": lifecycle_envelope(session),
    }
