"""The sandbox lifecycle states of the contract, and which moves between them are allowed."""

from django.db import models


class LifecycleState(models.TextChoices):
    PROVISIONING = "provisioning"
    ACTIVE = "active"
    HIBERNATING = "hibernating"
    HIBERNATED = "hibernated"
    RESTORING = "restoring"
    ARCHIVED = "archived"
    FAILED = "failed"


S = LifecycleState

# from-state -> the states it may move to. A move to the same state (active -> active) is an
# in-place change that still bumps the version, such as an extension of the expiry.
TRANSITIONS: dict[str, frozenset[str]] = {
    S.PROVISIONING: frozenset({S.PROVISIONING, S.ACTIVE, S.FAILED}),
    S.ACTIVE: frozenset({S.ACTIVE, S.HIBERNATING, S.FAILED}),
    # hibernating -> hibernating reclaims a crashed run's lease; -> active backs off when a
    # command started after the idle check.
    S.HIBERNATING: frozenset({S.HIBERNATING, S.HIBERNATED, S.ARCHIVED, S.FAILED, S.ACTIVE}),
    S.HIBERNATED: frozenset({S.RESTORING, S.PROVISIONING, S.ARCHIVED}),
    # restoring -> hibernated abandons a crashed resume; its snapshot is still the truth.
    S.RESTORING: frozenset({S.RESTORING, S.ACTIVE, S.FAILED, S.PROVISIONING, S.HIBERNATED}),
    # failed keeps its workspace: it can heal, be hibernated from disk, or start over.
    S.FAILED: frozenset({S.ACTIVE, S.HIBERNATING, S.PROVISIONING, S.RESTORING, S.ARCHIVED}),
    S.ARCHIVED: frozenset({S.HIBERNATED, S.PROVISIONING}),
}

# States in which a runtime may be alive and its workspace must not be touched by anyone but
# the lease holder.
BUSY_STATES = frozenset({S.PROVISIONING, S.HIBERNATING, S.RESTORING})


def can_transition(from_state: str | None, to_state: str) -> bool:
    return to_state in TRANSITIONS.get(from_state or S.PROVISIONING, frozenset())
