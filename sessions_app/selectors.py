"""Reads of sessions."""

from django.db.models import QuerySet

from recoup.accounts.models import Account
from recoup.errors import Forbidden, NotFound
from sessions_app.models import Session


def session_get_owned(*, session_id: str, account: Account) -> Session:
    """The session, 404 when no such id exists, then 403 when another account owns it."""
    # No stored id holds a NUL, and PostgreSQL refuses one in a query: not found, not a 500.
    # The snapshot comes along: the status poll reads it, and must stay one query.
    found = Session.objects.select_related("current_snapshot").filter(id=session_id)
    session = None if "\x00" in session_id else found.first()
    if session is None:
        raise NotFound(f"Session {session_id} not found")
    if session.account_id != account.id:
        raise Forbidden("You do not have access to this session")
    return session


def session_list(*, account: Account, status: str | None = None) -> QuerySet[Session]:
    sessions = Session.objects.filter(account=account).order_by("-created_at", "-id")
    if status:
        sessions = sessions.filter(status=status)
    return sessions
