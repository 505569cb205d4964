"""The per-account request rate (API_RATE_LIMIT): a fixed-window counter in Redis, spent from
blocks each process takes.

Each process takes counts from the window's shared counter in blocks of 1% of the limit (64 at
most; one INCRBY and EXPIREAT, pipelined, on a client shared by the whole process) and spends
them locally, so an account's requests cost Redis one round trip per block rather than one per
request: at the default 1200/min, one in 12. No window ever admits more than the limit: a block
that would cross it is cut to what fits. The price: a client at its limit may be refused early
by the counts other processes took and have not spent yet, at most (block - 1) per process
(at the default rate with two web processes, 22 requests of 1200). A limit under 200 a window
takes one count at a time, as a plain counter does.
Without REDIS_URL the counters live in the process, as DRF's did in the local-memory cache.

A fixed window lets a client spend its budget at the end of one window and again at the start
of the next: at most twice the rate over a window's length, which is all a poll guard needs.
"""

import logging
import math
import threading
import time
from typing import TYPE_CHECKING

import redis
from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import UserRateThrottle

from recoup.redis_clients import redis_client

if TYPE_CHECKING:  # DRF's views import the throttle classes from settings
    from rest_framework.views import APIView

_KEY_PREFIX = "recoup:rate:"
logger = logging.getLogger("recoup.throttling")


class _LocalCounters:
    """The in-process stand-in: one (window, count) per key, stale windows dropped as it grows."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, tuple[int, int]] = {}

    def incr(self, key: str, window: int) -> int:
        with self._lock:
            seen_window, count = self._counts.get(key, (window, 0))
            count = count + 1 if seen_window == window else 1
            if len(self._counts) > 10_000:
                self._counts = {k: v for k, v in self._counts.items() if v[0] >= window}
            self._counts[key] = (window, count)
            return count


_local_counters = _LocalCounters()


_MAX_BLOCK = 64
_MAX_HELD_KEYS = 10_000


class _Blocks:
    """The counts this process took from the shared counters and has not spent, per key, for
    the current window only."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, tuple[int, int]] = {}  # key -> (window, counts left)

    def spend(self, key: str, window: int) -> bool:
        """Spend one held count, if there is one."""
        with self._lock:
            held_window, left = self._held.get(key, (window, 0))
            if held_window != window or left <= 0:
                return False
            self._held[key] = (window, left - 1)
            return True

    def keep(self, key: str, window: int, counts: int) -> None:
        """Hold `counts` more (two threads may have taken a block each at once)."""
        if counts <= 0:
            return
        with self._lock:
            held_window, left = self._held.get(key, (window, 0))
            if held_window != window:
                left = 0
            if len(self._held) >= _MAX_HELD_KEYS:
                self._held = {k: v for k, v in self._held.items() if v[0] >= window}
                if len(self._held) >= _MAX_HELD_KEYS:
                    # So many keys in one window (a flood of new clients) must not grow the
                    # process: unspent counts given up are only refused, never admitted.
                    self._held.clear()
            self._held[key] = (window, left + counts)


_blocks = _Blocks()


def block_size(limit: int) -> int:
    """Counts a process takes at once: 1% of the limit, between 1 and _MAX_BLOCK."""
    return max(1, min(_MAX_BLOCK, limit // 100))


def window_admits(key: str, *, limit: int, window: int, window_ends_at: int) -> bool:
    """Whether one more request against `key` fits in `window`'s limit."""
    if not settings.REDIS_URL:
        return _local_counters.incr(key, window) <= limit
    if _blocks.spend(key, window):
        return True
    block = block_size(limit)
    redis_key = f"{_KEY_PREFIX}{key}:{window}"
    # No MULTI/EXEC around the two (it doubled the commands the client packs and parses):
    # another client's commands in between change nothing, since the expiry is absolute and
    # repeating it is harmless. A second of slack for clocks between hosts.
    pipe = redis_client(settings.REDIS_URL).pipeline(transaction=False)
    pipe.incrby(redis_key, block)
    pipe.expireat(redis_key, window_ends_at + 1)
    total, _ = pipe.execute()
    # Only the counts up to the limit are real: once the counter is past it, every process's
    # next take gets none.
    counts = block - max(0, total - limit)
    if counts <= 0:
        return False
    _blocks.keep(key, window, counts - 1)  # this request spends one
    return True


class AccountRateThrottle(UserRateThrottle):
    """Per-account request rate (per client address before authentication); the rate is read
    per request so it follows settings."""

    def get_rate(self) -> str:
        return settings.API_RATE_LIMIT

    def allow_request(self, request: Request, view: "APIView") -> bool:
        if self.rate is None:
            return True
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        now = time.time()
        window = int(now // self.duration)
        ends_at = (window + 1) * self.duration
        self._seconds_left = ends_at - now
        try:
            return window_admits(
                key, limit=self.num_requests, window=window, window_ends_at=ends_at
            )
        except (redis.RedisError, OSError, ValueError):
            # A guard against floods, not a gate: when Redis cannot count, let the request in
            # rather than fail it (the account's quotas still hold).
            logger.warning("rate limit not counted: Redis failed", exc_info=True)
            return True

    def wait(self) -> int:
        """Seconds until the window turns over: the 429's Retry-After."""
        return max(1, math.ceil(self._seconds_left))
