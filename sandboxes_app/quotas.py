"""Per-account quotas: live sandboxes (SANDBOX_MAX_PER_ACCOUNT) and commands running at once
(SANDBOX_MAX_COMMANDS_PER_ACCOUNT), each overridable per organization in the admin.

One count per account over all its sandboxes and commands, personal, organization and one-shot
alike; the limit a request meets is that of the session's organization when it sets one, else
the setting (personal sessions and one-shot sandboxes always meet the setting).

Live sandboxes are counted in the database under a row lock on the Account, in the same
transaction as the claim or insert that takes the slot, so two workers cannot both take the
last one. Commands hold leases (sandboxes_app.command_leases): a Redis sorted set per account
when REDIS_URL is set, otherwise a JSON file per account under RECOUP_DATA_DIR. A lease lasts
the command's timeout plus a grace, so a crashed request frees its slot.
"""

from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from lifecycle.states import LifecycleState as S
from recoup.accounts.models import Account, Organization
from recoup.errors import TooManyRequests
from sandboxes_app.command_leases import lease_acquire, lease_release
from sandboxes_app.models import Sandbox
from sessions_app.models import Session

# Retry-After: a sandbox slot frees when one hibernates (minutes), a command slot in seconds.
SANDBOX_RETRY_AFTER = 30
COMMAND_RETRY_AFTER = 2
# A command's lease outlives its timeout by this much: the kill and the reply take a moment.
COMMAND_LEASE_GRACE = 30


def _limit(*, organization_id: object, field: str, setting: str) -> tuple[int, str]:
    """The limit and where it comes from, for the error message."""
    if organization_id is not None:
        row = Organization.objects.filter(id=organization_id).values_list(field, "slug").first()
        if row is not None and row[0] is not None:
            return row[0], f"organization {row[1]}'s quota"
    return getattr(settings, setting), setting


def account_live_sandboxes(*, account_id: object, excluding_session_id: object = None) -> int:
    """Sandboxes holding a slot: live (not destroyed) rows, and sessions a live lease is
    provisioning or resuming (their row is written only once the sandbox is up)."""
    holding = Exists(Sandbox.objects.filter(session=OuterRef("pk"), destroyed_at__isnull=True))
    claimed = Q(
        lifecycle_state__in=(S.PROVISIONING, S.RESTORING),
        lifecycle_run_id__isnull=False,
        lifecycle_lease_expires_at__gt=timezone.now(),
    )
    sessions = Session.objects.filter(account_id=account_id).filter(holding | claimed)
    if excluding_session_id is not None:
        sessions = sessions.exclude(id=excluding_session_id)
    oneshots = Sandbox.objects.filter(
        account_id=account_id, session__isnull=True, destroyed_at__isnull=True
    )
    return sessions.count() + oneshots.count()


def sandbox_quota_check(
    *, account_id: object, organization_id: object, session_id: object = None
) -> None:
    """Raise TooManyRequests when the account may not take one more live sandbox.

    Inside a transaction it first locks the account's row: the caller then takes the slot (the
    lease claim, the row insert) in that same transaction, and every concurrent check for the
    account waits for it and counts it. A session that already holds its sandbox takes no new
    slot and always passes.
    """
    if transaction.get_connection().in_atomic_block:
        list(Account.objects.select_for_update().filter(id=account_id).values_list("id"))
    if session_id is not None and (
        Sandbox.objects.filter(session_id=session_id, destroyed_at__isnull=True).exists()
    ):
        return
    limit, source = _limit(
        organization_id=organization_id,
        field="max_sandboxes_per_account",
        setting="SANDBOX_MAX_PER_ACCOUNT",
    )
    live = account_live_sandboxes(account_id=account_id, excluding_session_id=session_id)
    if live >= limit:
        raise TooManyRequests(
            f"This account has {live} live sandboxes and {source} is {limit}: hibernate or "
            "archive one, or retry later",
            retry_after=SANDBOX_RETRY_AFTER,
        )


def command_slot_take(
    *, account_id: object, organization_id: object, timeout_s: float | None
) -> str:
    """Take one of the account's command slots for a command of `timeout_s` (the default
    command timeout when None) and return its lease id, or raise TooManyRequests. The lease
    runs out by itself `COMMAND_LEASE_GRACE` seconds after the timeout."""
    limit, source = _limit(
        organization_id=organization_id,
        field="max_commands_per_account",
        setting="SANDBOX_MAX_COMMANDS_PER_ACCOUNT",
    )
    timeout = settings.SANDBOX_COMMAND_TIMEOUT if timeout_s is None else timeout_s
    lease = min(timeout, settings.SANDBOX_COMMAND_MAX_TIMEOUT) + COMMAND_LEASE_GRACE
    slot = command_slot_acquire(account_id=str(account_id), limit=limit, lease_seconds=lease)
    if slot is None:
        raise TooManyRequests(
            f"This account is running {limit} commands at once and {source} is {limit}: "
            "retry when one finishes",
            retry_after=COMMAND_RETRY_AFTER,
        )
    return slot


@contextmanager
def command_slot(
    *, account_id: object, organization_id: object, timeout_s: float | None
) -> Iterator[None]:
    """Hold one of the account's command slots for the block, or raise TooManyRequests."""
    slot = command_slot_take(
        account_id=account_id, organization_id=organization_id, timeout_s=timeout_s
    )
    try:
        yield
    finally:
        command_slot_release(account_id=str(account_id), slot=slot)


def command_slot_acquire(*, account_id: str, limit: int, lease_seconds: float) -> str | None:
    """A new lease id when fewer than `limit` unexpired leases exist, else None."""
    return lease_acquire(
        account_id=account_id, limit=limit, lease_seconds=lease_seconds, **_store()
    )


def command_slot_release(*, account_id: str, slot: str) -> None:
    lease_release(account_id=account_id, slot=slot, **_store())


def _store() -> dict:
    """Where leases live (sandboxes_app.command_leases): Redis, else files under DATA_DIR."""
    return {"redis_url": settings.REDIS_URL, "data_dir": settings.DATA_DIR}
