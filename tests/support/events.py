"""Reading GET /api/sandbox/events in tests: an SSE parser, and a client that streams on its own
thread as a gunicorn thread would, recording what that thread asks of the database."""

import json
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from django.db import connection


@dataclass(frozen=True)
class Event:
    event: str  # "state", "transition", "progress", or ":" for a comment (keep-alive)
    data: dict | None
    id: str | None
    received_at: float


def parse_sse(chunks: Iterable[bytes]) -> Iterator[Event]:
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            fields: dict[str, str] = {}
            for line in block.decode().split("\n"):
                if line.startswith(":"):
                    fields.setdefault("event", ":")
                    continue
                name, _, value = line.partition(": ")
                fields[name] = value
            yield Event(
                event=fields.get("event", "message"),
                data=json.loads(fields["data"]) if "data" in fields else None,
                id=fields.get("id"),
                received_at=time.monotonic(),
            )


class EventsClient:
    """GET /api/sandbox/events through the test client, read on a thread of its own.

    `queries` holds the SQL that thread ran while it followed the stream (after the view's
    initial reads), `held_connection` whether it held a database connection after each chunk,
    that is while it waited for the next one.
    """

    def __init__(
        self, api_client, session_id: str, params: dict | None = None, **headers: str
    ) -> None:
        self.events: queue.Queue[Event] = queue.Queue()
        self.seen: list[Event] = []
        self.queries: list[str] = []
        self.held_connection: list[bool] = []
        self.status: int | None = None
        self.body: dict | None = None
        self.ended = threading.Event()
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(
            target=self._run,
            args=(api_client, {"sessionId": session_id, **(params or {})}, headers),
            daemon=True,
        )
        self._thread.start()
        assert self._started.wait(30), "the events request never answered"

    def _record(self, execute: Callable, sql: str, params, many: bool, context) -> object:
        self.queries.append(sql)
        return execute(sql, params, many, context)

    def _run(self, api_client, params: dict, headers: dict) -> None:
        try:
            response = api_client.get("/api/sandbox/events", params, **headers)
            self.status = response.status_code
            if not response.streaming:
                self.body = response.json()
                return
            self._started.set()
            try:
                with connection.execute_wrapper(self._record):
                    for event in parse_sse(self._chunks(response)):
                        self.events.put(event)
                        if self._stop.is_set():
                            break
            finally:
                response.close()
        finally:
            self._started.set()
            self.ended.set()

    def _chunks(self, response) -> Iterator[bytes]:
        for chunk in response.streaming_content:
            self.held_connection.append(connection.connection is not None)
            yield chunk

    def next(self, timeout: float = 30, *, keepalives: bool = False) -> Event:
        while True:
            event = self.events.get(timeout=timeout)
            if event.event != ":" or keepalives:
                self.seen.append(event)
                return event

    def until(self, predicate: Callable[[Event], bool], timeout: float = 60) -> list[Event]:
        """Events up to and including the first that satisfies `predicate`."""
        deadline = time.monotonic() + timeout
        got = []
        while True:
            got.append(self.next(timeout=max(0.1, deadline - time.monotonic())))
            if predicate(got[-1]):
                return got

    def close(self) -> None:
        """Stop reading (at the next chunk: keep-alives make one come) and close the stream."""
        self._stop.set()
        self._thread.join(timeout=30)
