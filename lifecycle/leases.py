"""Leases on a session's lifecycle runs.

A run (provision, resume, hibernate) claims the session by writing `lifecycle_run_id` and a
lease expiry in the same compare-and-set as its transition. Anyone else who finds a live lease
waits or does nothing; a lease past its expiry belongs to a crashed run and may be reclaimed.

Leases are short (LIFECYCLE_LEASE_SECONDS, 10 s) and renewed by a heartbeat while the run works
(every LIFECYCLE_HEARTBEAT, 2 s): a dead run's session is reclaimed seconds after it died, and
a slow run that is alive (a 5 GB snapshot) keeps its lease however long it takes. The heartbeat
renews only while the run still holds the lease, so fencing is unchanged: a run whose lease was
reclaimed stays fenced off, heartbeat or not.
"""

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

from sessions_app.models import Session


def new_run_id() -> str:
    return f"run_{uuid.uuid4().hex}"


logger = logging.getLogger("recoup.lifecycle")


def lease_expiry() -> object:
    return timezone.now() + timedelta(seconds=settings.LIFECYCLE_LEASE_SECONDS)


def lease_claim(run_id: str) -> dict:
    """Column values that claim the session for `run_id` (merge into a transition's changes)."""
    return {"lifecycle_run_id": run_id, "lifecycle_lease_expires_at": lease_expiry()}


LEASE_RELEASE = {"lifecycle_run_id": None, "lifecycle_lease_expires_at": None}


def lease_is_live(session: Session) -> bool:
    return bool(
        session.lifecycle_run_id
        and session.lifecycle_lease_expires_at
        and session.lifecycle_lease_expires_at > timezone.now()
    )


def lease_update(*, session_id: str, run_id: str, **changes: object) -> bool:
    """Write columns only while `run_id` still holds the lease; False when it was lost."""
    changes["updated_at"] = timezone.now()
    return Session.objects.filter(id=session_id, lifecycle_run_id=run_id).update(**changes) == 1


@contextlib.contextmanager
def lease_heartbeat(*, session_id: str, run_id: str) -> Iterator[None]:
    """Keep `run_id`'s lease on the session alive while the block runs."""

    def renew() -> bool:
        return (
            Session.objects.filter(id=session_id, lifecycle_run_id=run_id).update(
                lifecycle_lease_expires_at=lease_expiry()
            )
            == 1
        )

    with heartbeat(renew, what=f"session={session_id} {run_id}"):
        yield


@contextlib.contextmanager
def heartbeat(renew: Callable[[], bool], *, what: str) -> Iterator[None]:
    """Call `renew` every LIFECYCLE_HEARTBEAT seconds from a thread while the block runs; it
    stops once `renew` says the lease is gone (the run's next fenced write then fails too)."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(settings.LIFECYCLE_HEARTBEAT):
            try:
                if not renew():
                    logger.warning("lease lost %s", what)
                    return
            except Exception:  # noqa: BLE001 - a missed beat is retried; the TTL covers it
                logger.exception("lease renewal failed %s", what)
            finally:
                connection.close()  # between beats, its connection is back in the pool

    thread = threading.Thread(target=beat, name=f"heartbeat {what}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
