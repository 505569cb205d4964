"""Session writes."""

import secrets
import uuid

from django.utils import timezone

from lifecycle.archive import (
    session_archive_lifecycle,
    session_unarchive_check,
    session_unarchive_lifecycle,
)
from recoup.accounts.models import Account, Organization
from recoup.errors import Forbidden, NotFound
from sandboxes_app.git.urls import RepoRef
from sessions_app.models import Session

_ADJECTIVES = (
    "Amber",
    "Brisk",
    "Calm",
    "Daring",
    "Eager",
    "Gentle",
    "Lucid",
    "Nimble",
    "Quiet",
    "Rapid",
    "Steady",
    "Vivid",
)
_NOUNS = (
    "Falcon",
    "Harbor",
    "Lantern",
    "Maple",
    "Meadow",
    "Orbit",
    "Pine",
    "Quartz",
    "River",
    "Summit",
    "Tide",
    "Willow",
)


def generated_title() -> str:
    return f"{secrets.choice(_ADJECTIVES)} {secrets.choice(_NOUNS)} session"


def session_create(
    *,
    account: Account,
    title: str | None = None,
    organization_id: uuid.UUID | None = None,
    artist_id: uuid.UUID | None = None,
    repo: RepoRef | None = None,
) -> Session:
    """Create a session in `provisioning`; the organization must be one the account belongs to."""
    organization = None
    if organization_id is not None:
        organization = Organization.objects.filter(id=organization_id).first()
        if organization is None:
            raise NotFound(f"Organization {organization_id} not found")
        if not organization.memberships.filter(account=account).exists():
            raise Forbidden("You are not a member of this organization")
    return Session.objects.create(
        account=account,
        organization=organization,
        artist_id=artist_id,
        title=(title or "").strip() or generated_title(),
        repo_owner=repo.owner if repo else None,
        repo_name=repo.name if repo else None,
        clone_url=repo.clone_url if repo else None,
    )


def session_update(*, session: Session, fields: dict, actor: str) -> Session:
    """Apply a validated partial update of the client-editable fields.

    Archiving hibernates a running sandbox; un-archiving is refused (409) while that snapshot
    is still being written, and afterwards lets POST /api/sandbox resume the session.
    """
    allowed = {"title", "status", "lines_added", "lines_removed"}
    changes = {name: value for name, value in fields.items() if name in allowed}
    if not changes:
        return session
    was_archived = session.status == Session.Status.ARCHIVED
    new_status = changes.get("status", session.status)
    if was_archived and new_status != Session.Status.ARCHIVED:
        session_unarchive_check(session=session)
    changes["updated_at"] = timezone.now()
    Session.objects.filter(id=session.id).update(**changes)
    session.refresh_from_db()
    if new_status == Session.Status.ARCHIVED and not was_archived:
        session_archive_lifecycle(session=session, actor=actor)
    elif was_archived and new_status != Session.Status.ARCHIVED:
        session_unarchive_lifecycle(session=session, actor=actor)
    session.refresh_from_db()
    return session
