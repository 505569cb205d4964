"""Reads for the console's pages."""

from django.db.models import QuerySet

from lifecycle.models import LifecycleEvent
from recoup.accounts.models import Account
from sessions_app.models import Session

SESSIONS_SHOWN = 100
EVENTS_SHOWN = 200


def console_sessions(*, account: Account) -> QuerySet[Session]:
    """The account's newest sessions."""
    return Session.objects.filter(account=account).order_by("-created_at", "-id")[:SESSIONS_SHOWN]


def console_session(*, account: Account, session_id: str) -> Session | None:
    """The account's session, or None: another account's session is as absent as a missing
    one, so the console never tells which ids exist."""
    if "\x00" in session_id:  # PostgreSQL refuses a NUL in a query
        return None
    return Session.objects.filter(id=session_id, account=account).first()


def console_session_history(*, session: Session) -> QuerySet[LifecycleEvent]:
    """The session's lifecycle transitions, newest first."""
    return LifecycleEvent.objects.filter(session=session).order_by("-created_at", "-id")[
        :EVENTS_SHOWN
    ]
