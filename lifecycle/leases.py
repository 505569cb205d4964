"""Leases on a session's lifecycle runs.

A run (provision, resume, hibernate) claims the session by writing `lifecycle_run_id` and a
lease expiry in the same compare-and-set as its transition. Anyone else who finds a live lease
waits or does nothing; a lease past its expiry belongs to a crashed run and may be reclaimed.
"""

import uuid
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from sessions_app.models import Session


def new_run_id() -> str:
    return f"run_{uuid.uuid4().hex}"


def lease_claim(run_id: str) -> dict:
    """Column values that claim the session for `run_id` (merge into a transition's changes)."""
    return {
        "lifecycle_run_id": run_id,
        "lifecycle_lease_expires_at": timezone.now()
        + timedelta(seconds=settings.LIFECYCLE_LEASE_SECONDS),
    }


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
