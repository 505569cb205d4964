"""The per-account request rate (API_RATE_LIMIT): a fixed-window counter.

One Redis round trip per request (INCR and EXPIREAT pipelined) on a client shared by the whole
process, rather than DRF's history list of up to N timestamps pickled through the cache.
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


def window_count(key: str, *, window: int, window_ends_at: int) -> int:
    """Count one request against `key` in `window`; the number counted so far, this one included."""
    if not settings.REDIS_URL:
        return _local_counters.incr(key, window)
    redis_key = f"{_KEY_PREFIX}{key}:{window}"
    # No MULTI/EXEC around the two (it doubled the commands the client packs and parses):
    # another client's commands in between change nothing, since the expiry is absolute and
    # repeating it is harmless. A second of slack for clocks between hosts.
    pipe = redis_client(settings.REDIS_URL).pipeline(transaction=False)
    pipe.incr(redis_key)
    pipe.expireat(redis_key, window_ends_at + 1)
    count, _ = pipe.execute()
    return count


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
            count = window_count(key, window=window, window_ends_at=ends_at)
        except (redis.RedisError, OSError, ValueError):
            # A guard against floods, not a gate: when Redis cannot count, let the request in
            # rather than fail it (the account's quotas still hold).
            logger.warning("rate limit not counted: Redis failed", exc_info=True)
            return True
        return count <= self.num_requests

    def wait(self) -> int:
        """Seconds until the window turns over: the 429's Retry-After."""
        return max(1, math.ceil(self._seconds_left))
