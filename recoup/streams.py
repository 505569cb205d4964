"""Long-lived responses (server-sent events, ndjson): what every stream shares.

A stream holds one gunicorn thread for its life, as a waiting command does, so it takes one of
the process's WEB_MAX_WAITING slots (recoup.waits): past the ceiling a new stream answers 503
with Retry-After at once, and the remaining threads stay free for short requests. It holds no
database connection while it waits, sends a keep-alive comment every STREAM_KEEPALIVE_SECONDS
(which is also how a vanished client is noticed: the write fails and the stream closes), and
ends after STREAM_MAX_SECONDS so threads come back; a client reconnects with Last-Event-ID.
"""

import collections
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator

from django.conf import settings
from django.http import HttpRequest, StreamingHttpResponse

from recoup.db import release_db_connection
from recoup.errors import TooManyRequests
from recoup.waits import waiting_slot

SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
KEEPALIVE = b": keep-alive\n\n"
# Set when this process is asked to stop (gunicorn's SIGTERM, see recoup/gunicorn_hooks.py):
# open streams end within SHUTDOWN_CHECK_SECONDS instead of holding the graceful shutdown for
# its whole timeout, and their clients reconnect, with Last-Event-ID, to a process that runs.
shutting_down = threading.Event()
SHUTDOWN_CHECK_SECONDS = 0.5


def sse_event(*, event: str, data: dict, id: str | int | None = None) -> bytes:
    """One event; `data` is JSON on one line, so it never needs splitting across data: lines."""
    head = f"id: {id}\n" if id is not None else ""
    body = json.dumps(data, separators=(",", ":"))
    return f"{head}event: {event}\ndata: {body}\n\n".encode()


def ndjson_line(data: dict) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode() + b"\n"


def wants_ndjson(request: HttpRequest) -> bool:
    accept = request.headers.get("Accept", "")
    return NDJSON in accept and SSE not in accept


def last_event_id(request: HttpRequest) -> str | None:
    """The id an EventSource sends on reconnect (or `lastEventId` in the query, for clients
    that cannot set headers)."""
    value = request.headers.get("Last-Event-ID") or request.GET.get("lastEventId")
    return value.strip() if value and value.strip() else None


def stream_deadline() -> float:
    return time.monotonic() + settings.STREAM_MAX_SECONDS


def stream_over(deadline: float) -> bool:
    """Whether a stream should end now: past its deadline, or its process is stopping."""
    return shutting_down.is_set() or time.monotonic() >= deadline


_accounts_lock = threading.Lock()
_streams_of: collections.Counter = collections.Counter()


@contextlib.contextmanager
def _account_slot(account_id: object) -> Iterator[None]:
    """One of the account's STREAM_MAX_PER_ACCOUNT streams in this process, or a 429: without
    it one account could open streams until every waiting slot of the process is its own, and
    every other account's commands would answer 503."""
    with _accounts_lock:
        if _streams_of[account_id] >= settings.STREAM_MAX_PER_ACCOUNT:
            raise TooManyRequests(
                f"This account already holds {_streams_of[account_id]} open streams on this "
                "server (STREAM_MAX_PER_ACCOUNT); close one or retry shortly",
                retry_after=2,
            )
        _streams_of[account_id] += 1
    try:
        yield
    finally:
        with _accounts_lock:
            _streams_of[account_id] -= 1
            if _streams_of[account_id] <= 0:
                del _streams_of[account_id]


def stream_response(
    chunks: Iterator[bytes], *, content_type: str, account_id: object
) -> StreamingHttpResponse:
    """`chunks` as a streaming response holding a waiting slot and one of the account's stream
    slots until it is closed (by its end, a client that went away, or a response that was never
    sent). Raises now, before any byte is sent: 429 when the account holds
    STREAM_MAX_PER_ACCOUNT streams in this process, 503 when the process already waits on
    WEB_MAX_WAITING things."""
    with contextlib.ExitStack() as entering:
        entering.enter_context(_account_slot(account_id))
        entering.enter_context(waiting_slot())
        slots = entering.pop_all()
    release_db_connection()
    response = StreamingHttpResponse(
        _Held(chunks, release=slots.close),
        content_type=content_type,
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # a proxy in front must not buffer the stream
    return response


class _Held:
    """An iterator that gives its slot back exactly once, on close, even if never iterated (a
    generator's `finally` would not run then)."""

    def __init__(self, chunks: Iterator[bytes], *, release: Callable[[], None]) -> None:
        self._chunks = chunks
        self._release: Callable[[], None] | None = release

    def __iter__(self) -> "_Held":
        return self

    def __next__(self) -> bytes:
        return next(self._chunks)

    def close(self) -> None:
        try:
            close = getattr(self._chunks, "close", None)
            if close is not None:
                close()
        finally:
            release, self._release = self._release, None
            if release is not None:
                release()
