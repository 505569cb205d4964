from collections.abc import Callable
from datetime import timedelta

import pytest
from django.utils import timezone

from sessions_app.models import Session
from sessions_app.services import session_create


@pytest.fixture
def make_session(db) -> Callable[..., Session]:
    """A session for an account through the real service; `age` backdates it (and its updates)
    so ordering and updatedAt assertions never depend on clock resolution."""

    def make(actor, *, title: str = "A session", age: timedelta = timedelta(0), **fields):
        session = session_create(account=actor.account, title=title)
        when = timezone.now() - age
        Session.objects.filter(id=session.id).update(created_at=when, updated_at=when, **fields)
        session.refresh_from_db()
        return session

    return make
