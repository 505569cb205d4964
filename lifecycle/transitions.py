"""Lifecycle transitions, each one compare-and-set on (lifecycle_state, lifecycle_version).

A transition reads nothing inside its UPDATE: the caller passes the session as it last saw it,
and the row moves only if nobody else moved it since. Zero rows updated means the caller lost
the race; it gets None back and must not act on the sandbox.
"""

import logging
from dataclasses import dataclass

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from lifecycle.events import PROVISIONING_STATES, transition_publish_on_commit
from lifecycle.models import LifecycleEvent
from lifecycle.states import can_transition
from sessions_app.models import Session

logger = logging.getLogger("recoup.lifecycle")


class IllegalTransition(Exception):
    """A programming error: the state table does not allow this move."""


@dataclass(frozen=True)
class Seen:
    """The (state, version) pair a caller observed; the CAS condition of its transition."""

    state: str | None
    version: int

    @classmethod
    def of(cls, session: Session) -> "Seen":
        return cls(state=session.lifecycle_state, version=session.lifecycle_version)


def transition(
    *,
    session_id: str,
    seen: Seen,
    to: str,
    reason: str,
    actor: str,
    error: str | None = None,
    changes: dict | None = None,
    guard: Q | None = None,
) -> Session | None:
    """Move the session from `seen` to `to`, applying `changes` to other columns in the same
    UPDATE. Returns the updated session, or None when the row was not in `seen` any more (or
    `guard`, an extra condition on the row, no longer held)."""
    if not can_transition(seen.state, to):
        raise IllegalTransition(f"{seen.state} -> {to} is not an allowed transition")
    now = timezone.now()
    values = dict(changes or {})
    values.update(
        lifecycle_state=to,
        lifecycle_version=F("lifecycle_version") + 1,
        updated_at=now,
    )
    if to in PROVISIONING_STATES:
        # A run that claims the session starts over from `queued` (lifecycle.progress).
        values.setdefault("provisioning_phase", "queued")
        values.setdefault("provisioning_percent", None)
    else:
        values.update(provisioning_phase=None, provisioning_percent=None)
    if to == "failed" or error is not None:
        values["lifecycle_error"] = error
    elif "lifecycle_error" not in values:
        values["lifecycle_error"] = None
    with transaction.atomic():
        rows = Session.objects.filter(
            id=session_id, lifecycle_state=seen.state, lifecycle_version=seen.version
        )
        moved = (rows.filter(guard) if guard is not None else rows).update(**values)
        if moved != 1:
            logger.info(
                "transition lost session=%s %s@%s -> %s (%s)",
                session_id,
                seen.state,
                seen.version,
                to,
                reason,
            )
            return None
        event = LifecycleEvent.objects.create(
            session_id=session_id,
            from_state=seen.state,
            to_state=to,
            version=seen.version + 1,
            reason=reason,
            actor=actor,
            error=error,
        )
        transition_publish_on_commit(event)
    logger.info(
        "transition session=%s %s -> %s v%s reason=%s actor=%s",
        session_id,
        seen.state,
        to,
        seen.version + 1,
        reason,
        actor,
    )
    if seen.state in _BUSY and to not in _BUSY:
        _intent_carry_out(session_id)
    return Session.objects.get(id=session_id)


_BUSY = ("provisioning", "restoring")


def _intent_carry_out(session_id: str) -> None:
    """The run that ends a provisioning or resume hands a hibernation asked for meanwhile to
    the worker. Cleared in one compare-and-set, so it is handed over exactly once."""
    taken = Session.objects.filter(id=session_id, lifecycle_intent="hibernate").update(
        lifecycle_intent=None
    )
    if taken:
        from lifecycle.tasks import hibernate_session

        transaction.on_commit(lambda: hibernate_session.delay(session_id, None, "requested"))
