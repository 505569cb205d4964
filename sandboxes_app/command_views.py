"""Detached commands over the API: GET /api/sandbox/commands/{commandId}, its /logs stream and
/kill, thin views over sandboxes_app.commands. `POST /api/sandbox/commands` with `detached`
starts one (sandboxes_app.views).

Every one answers 404 for a command the caller cannot see: another account's, another
session's, a malformed id, one that never existed alike."""

import re
from collections.abc import Iterator

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from recoup.api import validated
from recoup.schema import ERROR_RESPONSES
from recoup.streams import (
    KEEPALIVE,
    NDJSON,
    SSE,
    last_event_id,
    ndjson_line,
    sse_event,
    stream_response,
    wants_ndjson,
)
from sandboxes_app import commands
from sandboxes_app.command_serializers import (
    CommandScopeBodySerializer,
    CommandScopeQuerySerializer,
    DetachedCommandSerializer,
    DetachedCommandStartedSerializer,
)
from sandboxes_app.models import Command
from sandboxes_app.providers.base import LogRecord
from sandboxes_app.selectors import epoch_ms

_OFFSET = re.compile(r"[0-9]{1,15}")
_NOT_FOUND = "No command of this account has this id in that session (or one-shot sandbox)."


def command_started_body(command: Command) -> dict:
    return DetachedCommandStartedSerializer(
        {"commandId": command.id, "startedAt": epoch_ms(command.started_at)}
    ).data


def _exit_body(command: Command) -> dict:
    return {
        "exitCode": command.exit_code,
        "finishedAt": epoch_ms(command.finished_at),
        "timedOut": command.timed_out,
        "killed": command.killed,
    }


def command_body(command: Command) -> dict:
    return DetachedCommandSerializer(
        {
            "commandId": command.id,
            "cmd": command.cmd,
            "args": command.args,
            "startedAt": epoch_ms(command.started_at),
            **_exit_body(command),
        }
    ).data


def _owned_command(request: Request, command_id: str, scope: dict) -> Command:
    command = commands.command_get_owned(
        command_id=command_id,
        account=request.user,
        session_id=scope.get("sessionId"),
        sandbox_id=scope.get("sandboxId"),
    )
    request._request.log_session_id = command.session_id
    return command


class CommandView(APIView):
    @extend_schema(
        operation_id="getSandboxCommand",
        summary="Get a detached command",
        description=(
            "The command `POST /api/sandbox/commands` started with `detached`, in the session's "
            "sandbox (`sessionId`) or a one-shot sandbox (`sandboxId`): `exitCode` and "
            "`finishedAt` are null while it runs. A command whose sandbox hibernated or was "
            "destroyed under it is `killed`."
        ),
        parameters=[CommandScopeQuerySerializer],
        responses={
            200: DetachedCommandSerializer,
            **ERROR_RESPONSES(400, 401, 404, d404=_NOT_FOUND),
        },
    )
    def get(self, request: Request, command_id: str) -> Response:
        scope = validated(CommandScopeQuerySerializer, request.query_params.dict())
        command = commands.command_refresh(command=_owned_command(request, command_id, scope))
        return Response(command_body(command))


class CommandLogsView(APIView):
    def perform_content_negotiation(self, request: Request, force: bool = False) -> tuple:
        # The stream takes its format from Accept itself; everything else (errors) is JSON.
        renderer = JSONRenderer()
        return renderer, renderer.media_type

    @extend_schema(
        operation_id="streamSandboxCommandLogs",
        summary="Stream a detached command's output",
        description=(
            "stdout and stderr as the command writes them, from the start of its log, then its "
            "exit; the response ends when the command has. Server-sent events by default: "
            '`event: stdout` or `stderr` with data `{"stream", "data"}` and `id:` the byte '
            "offset in the log after that record, `event: truncated` once where the log "
            'reached SANDBOX_COMMAND_LOG_BYTES, and last `event: exit` with data `{"exitCode", '
            '"finishedAt", "timedOut", "killed"}`. With `Accept: application/x-ndjson`, one '
            'JSON object per line: `{"stream", "data", "offset"}`, `{"truncated": true, '
            '"offset"}`, then the exit object; blank lines are keep-alives. `Last-Event-ID` '
            "(or `lastEventId`) resumes after that offset: exactly the rest, nothing twice. "
            "Output is decoded as UTF-8 (invalid bytes become U+FFFD). A stream ends after "
            "STREAM_MAX_SECONDS without `exit`; reconnect with the last id. 503 with "
            "Retry-After when the server already holds WEB_MAX_WAITING waits and streams."
        ),
        parameters=[
            CommandScopeQuerySerializer,
            OpenApiParameter(
                "lastEventId",
                OpenApiTypes.INT,
                OpenApiParameter.QUERY,
                description="Resume after this offset (as the Last-Event-ID header does).",
            ),
            OpenApiParameter(
                "Last-Event-ID",
                OpenApiTypes.INT,
                OpenApiParameter.HEADER,
                description="Resume after this offset (an `id:` this stream sent).",
            ),
        ],
        responses={
            (200, SSE): OpenApiResponse(OpenApiTypes.STR, "Server-sent events."),
            (200, NDJSON): OpenApiResponse(OpenApiTypes.STR, "Newline-delimited JSON."),
            **ERROR_RESPONSES(
                400,
                401,
                404,
                429,
                503,
                d429="This account holds STREAM_MAX_PER_ACCOUNT open streams on this server; see "
                "Retry-After.",
                d400="A bad sessionId/sandboxId, or a Last-Event-ID this log never sent.",
                d404=_NOT_FOUND,
                d503="This server already holds WEB_MAX_WAITING waits and streams; see "
                "Retry-After.",
            ),
        },
    )
    def get(self, request: Request, command_id: str) -> object:
        scope = validated(CommandScopeQuerySerializer, request.query_params.dict())
        command = _owned_command(request, command_id, scope)
        offset = _resume_offset(request)
        if not commands.command_log_offset_valid(command=command, offset=offset):
            raise ValidationError({"Last-Event-ID": "not an offset this command's log sent"})
        follow = commands.command_log_follow(command=command, offset=offset)
        if wants_ndjson(request):
            return stream_response(_ndjson(follow), content_type=NDJSON, account_id=request.user.pk)
        return stream_response(_sse(follow), content_type=SSE, account_id=request.user.pk)


def _resume_offset(request: Request) -> int:
    value = last_event_id(request)
    if value is None:
        return 0
    if not _OFFSET.fullmatch(value):
        raise ValidationError({"Last-Event-ID": "must be an offset this stream sent"})
    return int(value)


def _text(record: LogRecord) -> str:
    return record.data.decode("utf-8", errors="replace")


def _sse(follow: Iterator) -> Iterator[bytes]:
    for item in follow:
        if item is None:
            yield KEEPALIVE
        elif isinstance(item, Command):
            yield sse_event(event="exit", data=_exit_body(item))
        else:
            yield b"".join(_sse_record(record) for record in item)


def _sse_record(record: LogRecord) -> bytes:
    if record.stream == "truncated":
        return sse_event(event="truncated", data={"truncated": True}, id=record.end)
    data = {"stream": record.stream, "data": _text(record)}
    return sse_event(event=record.stream, data=data, id=record.end)


def _ndjson(follow: Iterator) -> Iterator[bytes]:
    for item in follow:
        if item is None:
            yield b"\n"
        elif isinstance(item, Command):
            yield ndjson_line(_exit_body(item))
        else:
            yield b"".join(_ndjson_record(record) for record in item)


def _ndjson_record(record: LogRecord) -> bytes:
    if record.stream == "truncated":
        return ndjson_line({"truncated": True, "offset": record.end})
    return ndjson_line({"stream": record.stream, "data": _text(record), "offset": record.end})


class CommandKillView(APIView):
    @extend_schema(
        operation_id="killSandboxCommand",
        summary="Kill a detached command",
        description=(
            "Kills the command's whole process tree (whatever it forked or started in the "
            "background during it), then answers the command once its exit is recorded "
            "(`killed` true, `exitCode` null), within about 2 s; if that takes longer it "
            "answers with `finishedAt` still null and the kill goes on. A command that has "
            "already ended answers as it ended."
        ),
        request=CommandScopeBodySerializer,
        responses={
            200: DetachedCommandSerializer,
            **ERROR_RESPONSES(400, 401, 404, d404=_NOT_FOUND),
        },
    )
    def post(self, request: Request, command_id: str) -> Response:
        scope = validated(CommandScopeBodySerializer, request.data)
        command = commands.command_kill(command=_owned_command(request, command_id, scope))
        return Response(command_body(command))
