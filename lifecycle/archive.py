"""Archiving a session hibernates its sandbox; un-archiving lets POST /api/sandbox resume it."""

from lifecycle.states import LifecycleState as S
from lifecycle.transitions import Seen, transition
from recoup.errors import Conflict
from sessions_app.models import Session


def session_archive_lifecycle(*, session: Session, actor: str) -> None:
    """Called after the session's status became archived."""
    if session.lifecycle_state in (S.ACTIVE, S.FAILED, S.HIBERNATING, S.PROVISIONING, S.RESTORING):
        # Hibernation ends in `archived` because the session's status says so; one asked for
        # during provisioning or a resume waits for it (recorded, not dropped).
        from lifecycle.hibernation import session_hibernate_request

        session_hibernate_request(session_id=session.id, reason="archive")
    elif session.lifecycle_state == S.HIBERNATED:
        transition(
            session_id=session.id,
            seen=Seen.of(session),
            to=S.ARCHIVED,
            reason="archived",
            actor=actor,
        )


def session_unarchive_check(*, session: Session) -> None:
    """Refuse to un-archive while the archive's snapshot is still being written."""
    if session.lifecycle_state == S.HIBERNATING or (
        session.lifecycle_state == S.ACTIVE and session.status == Session.Status.ARCHIVED
    ):
        raise Conflict("The session's snapshot is still being written; retry shortly")


def session_unarchive_lifecycle(*, session: Session, actor: str) -> None:
    """Called after the session's status left archived: a resumable hibernated session."""
    if session.lifecycle_state == S.ARCHIVED:
        has_snapshot = session.current_snapshot_id is not None
        transition(
            session_id=session.id,
            seen=Seen.of(session),
            to=S.HIBERNATED if has_snapshot else S.PROVISIONING,
            reason="unarchived",
            actor=actor,
        )
