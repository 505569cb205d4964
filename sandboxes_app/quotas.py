"""Per-account quotas: live sandboxes (SANDBOX_MAX_PER_ACCOUNT) and commands running at once
(SANDBOX_MAX_COMMANDS_PER_ACCOUNT), each overridable per organization in the admin.

One count per account over all its sandboxes and commands, personal, organization and one-shot
alike; the limit a request meets is that of the session's organization when it sets one, else
the setting (personal sessions and one-shot sandboxes always meet the setting).

Live sandboxes are counted in the database under a row lock on the Account, in the same
transaction as the claim or insert that takes the slot, so two workers cannot both take the
last one. Commands hold leases: a Redis sorted set per account (one Lua script checks and adds)
when REDIS_URL is set, otherwise a JSON file per account under RECOUP_DATA_DIR rewritten under
flock. A lease lasts the command's timeout plus a grace, so a crashed request frees its slot.
"""

import fcntl
import json
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from lifecycle.states import LifecycleState as S
from recoup.accounts.models import Account, Organization
from recoup.errors import TooManyRequests
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


@contextmanager
def command_slot(
    *, account_id: object, organization_id: object, timeout_s: float | None
) -> Iterator[None]:
    """Hold one of the account's command slots for the block, or raise TooManyRequests."""
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
    try:
        yield
    finally:
        command_slot_release(account_id=str(account_id), slot=slot)


def command_slot_acquire(*, account_id: str, limit: int, lease_seconds: float) -> str | None:
    """A new lease id when fewer than `limit` unexpired leases exist, else None."""
    slot = uuid.uuid4().hex
    now = time.time()
    if settings.REDIS_URL:
        taken = _redis_acquire(
            _redis_key(account_id), slot=slot, now=now, expiry=now + lease_seconds, limit=limit
        )
    else:
        taken = _file_acquire(
            _lease_file(account_id), slot=slot, now=now, expiry=now + lease_seconds, limit=limit
        )
    return slot if taken else None


def command_slot_release(*, account_id: str, slot: str) -> None:
    if settings.REDIS_URL:
        _redis_client().zrem(_redis_key(account_id), slot)
    else:
        with _locked_leases(_lease_file(account_id)) as leases:
            leases.pop(slot, None)


# --- Redis: a sorted set of lease ids scored by expiry; the key outlives its last lease --------

_ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', KEYS[1], math.ceil((tonumber(last[2]) - tonumber(ARGV[1])) * 1000))
return 1
"""
_redis_clients: dict = {}


def _redis_client() -> object:
    """One client (and connection pool) per URL for the process, not one per call."""
    url = settings.REDIS_URL
    if url not in _redis_clients:
        import redis

        _redis_clients[url] = redis.Redis.from_url(url)
    return _redis_clients[url]


def _redis_key(account_id: str) -> str:
    return f"recoup:quota:commands:{account_id}"


def _redis_acquire(key: str, *, slot: str, now: float, expiry: float, limit: int) -> bool:
    client = _redis_client()
    return bool(client.eval(_ACQUIRE, 1, key, repr(now), repr(expiry), slot, limit))


# --- No Redis (the embedded default, one host): a lease file per account under flock ----------


def _lease_file(account_id: str) -> Path:
    directory = Path(settings.DATA_DIR) / "quotas" / "commands"
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"{uuid.UUID(account_id).hex}.json"


@contextmanager
def _locked_leases(path: Path) -> Iterator[dict[str, float]]:
    """The file's unexpired leases, written back when the block ends; flock excludes every
    other process and thread (each call opens its own file description)."""
    with open(os.open(path, os.O_RDWR | os.O_CREAT, 0o600), "r+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            leases = json.loads(handle.read() or "{}")
        except ValueError:
            leases = {}  # a torn write by a crashed process: its leases are lost, not ours
        now = time.time()
        leases = {slot: expiry for slot, expiry in leases.items() if expiry > now}
        yield leases
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(leases))


def _file_acquire(path: Path, *, slot: str, now: float, expiry: float, limit: int) -> bool:
    with _locked_leases(path) as leases:
        if len(leases) >= limit:
            return False
        leases[slot] = expiry
        return True
