"""A session's live events: what goes on the bus, and the durable record it is checked against.

Every transition's LifecycleEvent row is the record; once it commits, the transition publishes
the same facts on the session's channel (`session:<id>`), and provisioning runs publish their
progress there too (lifecycle.progress). GET /api/sandbox/events follows the channel and
re-reads the rows whenever a version shows it missed a message, so the bus needs no delivery
guarantee.

A bus message is `{"event": "transition" | "progress", "data": {...}}`, `data` exactly what
the stream sends; a progress message also carries `version`, the lifecycle version of the run
that reports it, so a reader learns from it too that it missed a transition.
"""

from django.db import transaction

from lifecycle.models import LifecycleEvent
from lifecycle.states import LifecycleState as S
from recoup import bus
from sessions_app.models import Session

# The states in which a run provisions or restores the sandbox and reports its progress.
PROVISIONING_STATES = (S.PROVISIONING, S.RESTORING)


def session_channel(session_id: str) -> str:
    return f"session:{session_id}"


def _epoch_ms(event: LifecycleEvent) -> int:
    return int(event.created_at.timestamp() * 1000)


def transition_data(event: LifecycleEvent) -> dict:
    """A transition as the events stream sends it (`event: transition`, `id: <version>`)."""
    return {
        "sessionId": event.session_id,
        "state": event.to_state,
        "fromState": event.from_state,
        "version": event.version,
        "reason": event.reason,
        "at": _epoch_ms(event),
    }


def progress_data(*, session_id: str, phase: str, percent: int | None) -> dict:
    return {"sessionId": session_id, "phase": phase, "percent": percent}


def provisioning_of(session: Session) -> dict | None:
    """The status's and the stream's `provisioning`: where the run that provisions or restores
    the sandbox is, or None when no run does (including a session nobody has asked a sandbox
    of yet, which waits in `provisioning` at version 0)."""
    if session.lifecycle_state not in PROVISIONING_STATES or not session.provisioning_phase:
        return None
    return {"phase": session.provisioning_phase, "percent": session.provisioning_percent}


def transition_publish_on_commit(event: LifecycleEvent) -> None:
    """Publish `event` once its transaction commits (never a transition that rolled back). A
    provisioning or resume that ends in `active` also reports the `active` phase."""
    channel = session_channel(event.session_id)
    messages = [{"event": "transition", "data": transition_data(event)}]
    if event.from_state in PROVISIONING_STATES and event.to_state == S.ACTIVE:
        progress = progress_data(session_id=event.session_id, phase="active", percent=None)
        messages.append({"event": "progress", "data": progress, "version": event.version})

    def publish() -> None:
        for message in messages:
            bus.publish(channel, message)

    # Robust: the transition has committed; a publish that fails must not fail its caller.
    transaction.on_commit(publish, robust=True)


def progress_publish(*, session_id: str, phase: str, percent: int | None, version: int) -> None:
    progress = progress_data(session_id=session_id, phase=phase, percent=percent)
    bus.publish(
        session_channel(session_id), {"event": "progress", "data": progress, "version": version}
    )


def lifecycle_events_after(*, session_id: str, version: int, limit: int = 1000) -> list[dict]:
    """The session's transitions with a version above `version`, oldest first, as the stream
    sends them."""
    rows = LifecycleEvent.objects.filter(session_id=session_id, version__gt=version).order_by(
        "version", "id"
    )
    return [transition_data(event) for event in rows[:limit]]
