"""Thin Celery tasks: take ids, re-fetch, re-check, call a service."""

from celery import shared_task
from django.conf import settings

from lifecycle import sweeps
from lifecycle.bases import base_build_run
from lifecycle.checkpoints import session_checkpoint
from lifecycle.hibernation import session_hibernate


@shared_task(name="lifecycle.hibernate_session", ignore_result=True)
def hibernate_session(
    session_id: str, version: int | None, reason: str, require_idle: bool = False
) -> None:
    """Hibernate a session if it is still at `version` (None: whatever its version)."""
    session_hibernate(
        session_id=session_id,
        actor="worker",
        reason=reason,
        expected_version=version,
        require_idle=require_idle,
    )


@shared_task(name="lifecycle.recover_session", ignore_result=True)
def recover_session(session_id: str, version: int) -> None:
    sweeps.session_recover(session_id=session_id, version=version, actor="sweep")


@shared_task(name="lifecycle.retry_session", ignore_result=True)
def retry_session(session_id: str, version: int) -> None:
    sweeps.session_retry_failed(session_id=session_id, version=version, actor="sweep")


@shared_task(name="lifecycle.checkpoint_session", ignore_result=True)
def checkpoint_session(session_id: str) -> None:
    """Checkpoint a session if it is still active with unsaved changes (a redelivered task
    finds none and does nothing)."""
    session_checkpoint(session_id=session_id, actor="worker")


def _enqueue(due: sweeps.Due) -> None:
    if due.reason == "checkpoint":
        checkpoint_session.delay(due.session_id)
    elif due.reason == "stuck":
        recover_session.delay(due.session_id, due.version)
    elif due.reason == "retry":
        retry_session.delay(due.session_id, due.version)
    else:
        hibernate_session.delay(
            due.session_id, due.version, due.reason, require_idle=due.reason == "idle"
        )


# quiet: no per-task log line when it succeeds; the sweep logs what it did (recoup.celery).
@shared_task(name="lifecycle.sweep", ignore_result=True, quiet=True)
def sweep() -> None:
    """Beat's frequent sweep. A full batch re-enqueues the sweep to drain the backlog."""
    limit = settings.LIFECYCLE_SWEEP_BATCH
    dispatched = sweeps.sweep_run(limit=limit, enqueue=_enqueue)
    if dispatched >= limit:
        sweep.delay()


@shared_task(name="lifecycle.retention_sweep", ignore_result=True)
def retention_sweep() -> None:
    limit = settings.LIFECYCLE_SWEEP_BATCH
    if sweeps.snapshots_retention(limit=limit) >= limit:
        retention_sweep.delay()


@shared_task(name="lifecycle.build_base_snapshot", ignore_result=True)
def build_base_snapshot(build_id: int) -> None:
    base_build_run(build_id=build_id)
