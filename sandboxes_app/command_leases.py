"""The store of command leases behind SANDBOX_MAX_COMMANDS_PER_ACCOUNT, free of Django: the web
process takes and frees leases through sandboxes_app.quotas, and a detached command's
supervisor, which runs without Django, frees its own lease when the command ends.

A Redis sorted set per account, scored by expiry (one Lua script checks and adds), when
`redis_url` is set; otherwise a JSON file per account under `data_dir`, rewritten under flock.
A lease lasts the command's timeout plus a grace, so a crashed holder frees its slot anyway.
"""

import fcntl
import json
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

_ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', KEYS[1], math.ceil((tonumber(last[2]) - tonumber(ARGV[1])) * 1000))
return 1
"""


def lease_acquire(
    *, account_id: str, limit: int, lease_seconds: float, redis_url: str, data_dir: str | Path
) -> str | None:
    """A new lease id when the account holds fewer than `limit` unexpired leases, else None."""
    slot = uuid.uuid4().hex
    now = time.time()
    expiry = now + lease_seconds
    if redis_url:
        taken = _redis_client(redis_url).eval(
            _ACQUIRE, 1, _redis_key(account_id), repr(now), repr(expiry), slot, limit
        )
    else:
        with _locked_leases(_lease_file(account_id, data_dir)) as leases:
            taken = len(leases) < limit
            if taken:
                leases[slot] = expiry
    return slot if taken else None


def lease_release(*, account_id: str, slot: str, redis_url: str, data_dir: str | Path) -> None:
    """Free the lease; freeing it again, or one that expired, does nothing."""
    if redis_url:
        _redis_client(redis_url).zrem(_redis_key(account_id), slot)
    else:
        with _locked_leases(_lease_file(account_id, data_dir)) as leases:
            leases.pop(slot, None)


@cache
def _redis_client(url: str) -> object:
    """One client (and connection pool) per URL for the process, not one per call."""
    import redis  # only where leases live in Redis: the supervisor starts without it

    return redis.Redis.from_url(url)


def _redis_key(account_id: str) -> str:
    return f"recoup:quota:commands:{account_id}"


def _lease_file(account_id: str, data_dir: str | Path) -> Path:
    directory = Path(data_dir) / "quotas" / "commands"
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
