"""A ceiling on the requests one web process lets wait on sandboxes at once.

A waiting request holds one of the process's WEB_THREADS threads. Per-account quotas stop one
account from taking them all, but many accounts together could; so past WEB_MAX_WAITING waits
a new one answers 503 with Retry-After, and the remaining threads stay free for everything else
(the status poll above all)."""

import contextlib
import threading
from collections.abc import Iterator

from django.conf import settings

from recoup.errors import ServiceUnavailable

_lock = threading.Lock()
_waiting = 0


@contextlib.contextmanager
def waiting_slot() -> Iterator[None]:
    """Hold one of this process's waiting slots for the block, or raise a 503."""
    global _waiting
    with _lock:
        if _waiting >= settings.WEB_MAX_WAITING:
            raise ServiceUnavailable(
                f"This server is waiting on {_waiting} sandbox commands, provisionings and streams "
                "already; retry shortly",
                retry_after=2,
            )
        _waiting += 1
    try:
        yield
    finally:
        with _lock:
            _waiting -= 1
