"""GET /api/sandbox/events: a session's lifecycle transitions and provisioning progress, pushed
as server-sent events.

The stream subscribes to the session's bus channel first, then reads the session and any
transitions to replay from the database, then follows the channel: nothing committed after the
read can slip between the two. While following it reads the database only when a version shows
it missed a message (the rows are the record, the bus only a wake-up), and holds no database
connection while it waits.
"""

import time
from collections.abc import Iterator

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from lifecycle.events import lifecycle_events_after, provisioning_of, session_channel
from recoup import bus
from recoup.accounts.models import Account
from recoup.api import validated
from recoup.db import release_db_connection
from recoup.schema import ERROR_RESPONSES
from recoup.streams import (
    KEEPALIVE,
    SHUTDOWN_CHECK_SECONDS,
    SSE,
    last_event_id,
    sse_event,
    stream_deadline,
    stream_over,
    stream_response,
)
from sandboxes_app import selectors
from sandboxes_app.serializers import SessionIdQuerySerializer

_REPLAY_PAGE = 500


class SessionEventStream:
    """The session's events as SSE chunks, from its state at connect time onwards.

    Built in the request (subscribe, then the database reads), iterated by the server while it
    streams, closed by the server when the client goes or the stream ends.
    """

    def __init__(self, *, session_id: str, account: Account, after: int | None) -> None:
        self.session_id = session_id
        self._subscription = bus.subscribe(session_channel(session_id))
        self._pending: list[bytes] = []
        try:
            session = selectors.session_get_streamed(session_id=session_id, account=account)
            version = session.lifecycle_version
            state = {
                "sessionId": session_id,
                "state": session.lifecycle_state,
                "version": version,
                "provisioning": provisioning_of(session),
            }
            # With Last-Event-ID the state keeps the client's id (or winds it back to ours when
            # it is ahead), so a drop mid-replay resumes the replay, never skips it.
            replay_from = None if after is None else min(after, version)
            self._emit(sse_event(event="state", data=state, id=replay_from))
            self._version = version if replay_from is None else replay_from
            if replay_from is not None:
                self._catch_up()
            self._version = max(self._version, version)
        except BaseException:
            self.close()
            raise
        self._deadline = stream_deadline()
        self._next_keepalive = time.monotonic() + settings.STREAM_KEEPALIVE_SECONDS

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        while not self._pending:
            now = time.monotonic()
            if stream_over(self._deadline):
                raise StopIteration  # the client reconnects with Last-Event-ID
            if now >= self._next_keepalive:
                self._pending.append(KEEPALIVE)
                break
            wait = min(self._deadline, self._next_keepalive, now + SHUTDOWN_CHECK_SECONDS) - now
            message = self._subscription.get(timeout=wait)
            if message is not None:
                self._receive(message)
        chunk, self._pending = b"".join(self._pending), []
        self._next_keepalive = time.monotonic() + settings.STREAM_KEEPALIVE_SECONDS
        return chunk

    def close(self) -> None:
        self._subscription.close()

    def _emit(self, chunk: bytes) -> None:
        self._pending.append(chunk)

    def _receive(self, message: dict) -> None:
        data = message.get("data") or {}
        if message.get("event") == "transition":
            version = data.get("version", 0)
            if version > self._version + 1:
                self._catch_up()  # we missed one: the rows have it
            if version > self._version:
                self._emit(sse_event(event="transition", data=data, id=version))
                self._version = version
        elif message.get("event") == "progress":
            version = message.get("version", 0)
            if version > self._version:
                self._catch_up()  # the run's own transition never reached us
            if version >= self._version:  # else a report of a run that has ended
                self._emit(sse_event(event="progress", data=data))

    def _catch_up(self) -> None:
        """Emit every transition after the last one sent, from the LifecycleEvent rows."""
        while True:
            rows = lifecycle_events_after(
                session_id=self.session_id, version=self._version, limit=_REPLAY_PAGE
            )
            for row in rows:
                self._emit(sse_event(event="transition", data=row, id=row["version"]))
                self._version = row["version"]
            if len(rows) < _REPLAY_PAGE:
                break
        release_db_connection()  # the stream goes back to waiting


def _requested_last_id(request: Request) -> int | None:
    value = last_event_id(request)
    if value is None:
        return None
    # ASCII only: str.isdigit() also accepts digits int() refuses ("²").
    if not (value.isascii() and value.isdigit()) or len(value) > 18:
        raise ValidationError(
            {"lastEventId": "must be the id of a transition event (a non-negative integer)"}
        )
    return int(value)


class _JsonErrors(BaseContentNegotiation):
    """The stream is text/event-stream whatever the client accepts; an error before it starts
    is the usual JSON envelope, also for an EventSource's `Accept: text/event-stream`."""

    def select_parser(self, request: Request, parsers: list) -> object:
        return parsers[0] if parsers else None

    def select_renderer(
        self, request: Request, renderers: list, format_suffix: str | None = None
    ) -> tuple:
        return renderers[0], renderers[0].media_type


EVENTS_DESCRIPTION = """\
A `text/event-stream` of the session's lifecycle, pushed as it happens (no polling needed).

- First, one `event: state`, data `{"sessionId", "state", "version", "provisioning"}`: `state`
  is `lifecycle.state` of GET /api/sandbox/status, `version` its `lifecycleVersion`,
  `provisioning` `{"phase", "percent"}` or null as there. It has no `id`, except on a
  reconnect with Last-Event-ID (then the id sent, or the current version when that is lower).
- `event: transition`, `id: <version>`, data `{"sessionId", "state", "fromState", "version",
  "reason", "at"}` (`at` in epoch ms): one per lifecycle transition, in version order.
- `event: progress`, no id, data `{"sessionId", "phase", "percent"}` while the sandbox is
  provisioned or restored: `phase` one of `queued`, `cloning`, `checkout`, `from_base`,
  `starting`, `active`; `percent` git's own (0-100, never going back) while cloning or checking
  out, else null. At most one per phase change, 5 percent or 250 ms; not replayed.
- Lines starting with `:` are keep-alives, every STREAM_KEEPALIVE_SECONDS (15).

Reconnect with `Last-Event-ID: <version>` (an EventSource does it itself) or
`?lastEventId=<version>`: every transition with a higher version is replayed, in order, before
the stream goes live, so nothing is missed or repeated across reconnects and restarts. The
stream ends after STREAM_MAX_SECONDS (300); reconnect then. Each open stream takes one of the
web process's WEB_MAX_WAITING slots: past them, 503 with Retry-After. Another account's
session answers 404, as an unknown one does.
"""


class SandboxEventsView(APIView):
    content_negotiation_class = _JsonErrors
    # Not HEAD: it would hold a thread for a stream whose body nobody reads.
    http_method_names = ["get", "options"]

    @extend_schema(
        operation_id="streamSandboxEvents",
        summary="Follow the session's lifecycle events",
        description=EVENTS_DESCRIPTION,
        parameters=[
            SessionIdQuerySerializer,
            OpenApiParameter(
                "lastEventId",
                OpenApiTypes.INT,
                OpenApiParameter.QUERY,
                description="Replay transitions after this version (as Last-Event-ID).",
            ),
            OpenApiParameter(
                "Last-Event-ID",
                OpenApiTypes.INT,
                OpenApiParameter.HEADER,
                description="The last transition's id the client saw; an EventSource sends it.",
            ),
        ],
        responses={
            (200, SSE): OpenApiResponse(OpenApiTypes.STR, "The event stream."),
            **ERROR_RESPONSES(
                400,
                401,
                404,
                429,
                503,
                d429="This account holds STREAM_MAX_PER_ACCOUNT open streams on this server; see "
                "Retry-After.",
                d404="No session of this account has this id.",
                d503="This server already holds WEB_MAX_WAITING waits and streams; see "
                "Retry-After.",
            ),
        },
    )
    def get(self, request: Request) -> Response:
        data = validated(SessionIdQuerySerializer, request.query_params.dict())
        after = _requested_last_id(request)
        # Refused before anything is subscribed: a stranger's ids create nothing.
        session = selectors.session_get_streamed(session_id=data["sessionId"], account=request.user)
        request._request.log_session_id = session.id
        stream = SessionEventStream(session_id=session.id, account=request.user, after=after)
        try:
            return stream_response(stream, content_type=SSE, account_id=request.user.pk)
        except BaseException:
            stream.close()
            raise
