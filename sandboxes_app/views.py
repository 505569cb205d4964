"""Session sandbox endpoints (seeds 000-002) and their siblings; thin views over services."""

import time

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from lifecycle.hibernation import session_hibernate_request
from recoup.api import validated
from recoup.schema import ERROR_RESPONSES
from sandboxes_app import commands, oneshots, selectors, services
from sandboxes_app.command_serializers import DetachedCommandStartedSerializer
from sandboxes_app.command_views import command_started_body
from sandboxes_app.git.urls import parse_repo_url
from sandboxes_app.serializers import (
    CommandRequestSerializer,
    CommandResponseSerializer,
    CreateSandboxRequestSerializer,
    CreateSandboxResponseSerializer,
    HibernateAcceptedSerializer,
    ReconnectResponseSerializer,
    SandboxStatusResponseSerializer,
    SessionIdBodySerializer,
    SessionIdQuerySerializer,
)
from sessions_app.models import Session
from sessions_app.selectors import session_get_owned


def owned_session(request: Request, data: dict) -> Session:
    session = session_get_owned(session_id=data["sessionId"], account=request.user)
    request._request.log_session_id = session.id
    return session


def polled_session(request: Request, *, probe: bool = False) -> Session:
    session_id = request.query_params.get("sessionId")
    # A well-formed id skips the serializer (a fifth of the poll's CPU); anything else goes
    # through it, so every error reads as before.
    if not session_id or len(session_id) > 64 or session_id != session_id.strip():
        session_id = validated(SessionIdQuerySerializer, request.query_params.dict())["sessionId"]
    select = selectors.session_get_probed if probe else selectors.session_get_polled
    session = select(session_id=session_id, account=request.user)
    request._request.log_session_id = session.id
    return session


def actor_of(request: Request) -> str:
    return f"api:{request.user.pk}"


class SandboxView(APIView):
    @extend_schema(
        operation_id="createSandbox",
        summary="Create or restore session sandbox",
        description=(
            "Provisions a sandbox for the session, or resumes it from its snapshot when it was "
            "hibernated. Concurrent calls for one session all answer 200 with the same sandbox. "
            "An archived session answers 409 until it is un-archived (PATCH status running); "
            "a session whose sandbox holds another repository answers 400. 429 with "
            "Retry-After when the account already holds its quota of live sandboxes "
            "(SANDBOX_MAX_PER_ACCOUNT or its organization's override); a session that holds "
            "its sandbox already is never refused. A call that finds another request "
            "provisioning or resuming the session waits for it up to SANDBOX_PROVISION_WAIT "
            "(60 s), then answers 503 with Retry-After."
        ),
        request=CreateSandboxRequestSerializer,
        responses={
            200: OpenApiResponse(
                CreateSandboxResponseSerializer, "Sandbox provisioned and bound to the session."
            ),
            **ERROR_RESPONSES(
                400,
                401,
                403,
                404,
                409,
                429,
                502,
                503,
                d429="The account holds its quota of live sandboxes; see Retry-After.",
            ),
        },
    )
    def post(self, request: Request) -> Response:
        data = validated(CreateSandboxRequestSerializer, request.data)
        repo = parse_repo_url(data["repoUrl"])
        if "sessionId" in data:
            session = owned_session(request, data)
            ready = services.session_sandbox_ensure(
                session_id=session.id, repo=repo, actor=actor_of(request)
            )
        else:
            ready = oneshots.oneshot_sandbox_create(account=request.user, repo=repo)
        ready_ms = int((time.monotonic() - request._request.received_at) * 1000)
        body = {
            "createdAt": selectors.epoch_ms(ready.ready_at),
            "timeout": settings.SANDBOX_IDLE_TIMEOUT * 1000,
            "currentBranch": ready.branch,
            "mode": ready.mode,
            "timing": {"readyMs": ready_ms},
        }
        if "sessionId" not in data:
            body["sandboxId"] = ready.sandbox.name  # a one-shot's only handle
        return Response(CreateSandboxResponseSerializer(body).data)


def kick_if_overdue(session: Session) -> None:
    """Hand an overdue active session to the worker (once per version and reason, not once per
    poll). Past its expiry a sandbox goes regardless; merely idle, it waits for a running
    command."""
    if not selectors.session_is_overdue(session):
        return
    expired = selectors.session_is_expired(session)
    reason = "expiry" if expired else "idle"
    if not cache.add(f"kick:{session.id}:{session.lifecycle_version}:{reason}", 1, timeout=30):
        return
    from lifecycle.tasks import hibernate_session

    transaction.on_commit(
        lambda: hibernate_session.delay(
            session.id, session.lifecycle_version, reason, require_idle=not expired
        )
    )


class SandboxStatusView(APIView):
    @extend_schema(
        operation_id="getSandboxStatus",
        summary="Get session sandbox status",
        description=(
            "Database-only read of the session's sandbox lifecycle, cheap enough to poll. "
            "An overdue active session is handed to the lifecycle workflow as a side effect."
        ),
        parameters=[SessionIdQuerySerializer],
        responses={
            200: OpenApiResponse(
                SandboxStatusResponseSerializer, "Sandbox status retrieved successfully."
            ),
            **ERROR_RESPONSES(400, 401, 403, 404),
        },
    )
    def get(self, request: Request) -> Response:
        session = polled_session(request)
        kick_if_overdue(session)
        return Response(selectors.session_sandbox_status(session))


class SandboxReconnectView(APIView):
    @extend_schema(
        operation_id="reconnectSandbox",
        summary="Reconnect to session sandbox",
        description=(
            "Live probe of the session's sandbox. Never resumes a sandbox and never resets the "
            "idle clock."
        ),
        parameters=[SessionIdQuerySerializer],
        responses={
            200: OpenApiResponse(
                ReconnectResponseSerializer,
                "Reconnect probe completed. Inspect `status` for the outcome.",
            ),
            **ERROR_RESPONSES(400, 401, 403, 404),
        },
    )
    def get(self, request: Request) -> Response:
        session = polled_session(request, probe=True)
        return Response(services.session_reconnect(session=session, actor=actor_of(request)))


class SandboxCommandView(APIView):
    @extend_schema(
        operation_id="runSandboxCommand",
        summary="Run a command in the session's sandbox",
        description=(
            "Runs `cmd` with `args` (no shell unless you run `sh -c`) inside /workspace. Counts "
            "as activity; a running command keeps the sandbox from idle hibernation. "
            "409 when the session has no active sandbox. With `sandboxId` instead of "
            "`sessionId` it runs in that one-shot sandbox: 404 unless the caller owns it, 409 "
            "once it is destroyed or expired. 429 with Retry-After when the "
            "account already runs its quota of commands at once "
            "(SANDBOX_MAX_COMMANDS_PER_ACCOUNT or its organization's override). With "
            "`detached: true` it answers 202 with the command's id as soon as the command runs "
            "(the same checks first), and the command goes on, holding its command slot, until "
            "it ends, its timeout (default SANDBOX_COMMAND_MAX_TIMEOUT) or a kill: see "
            "`GET /api/sandbox/commands/{commandId}`, its `/logs` and `/kill`."
        ),
        request=CommandRequestSerializer,
        responses={
            200: CommandResponseSerializer,
            202: OpenApiResponse(
                DetachedCommandStartedSerializer, "With `detached`: the command is running."
            ),
            **ERROR_RESPONSES(
                400,
                401,
                403,
                404,
                409,
                413,
                429,
                502,
                503,
                d429="The account runs its quota of commands at once; see Retry-After.",
                d503="This server already waits on WEB_MAX_WAITING commands; see Retry-After.",
            ),
        },
    )
    def post(self, request: Request) -> Response:
        data = validated(CommandRequestSerializer, request.data)
        # The same checks in the same order for a session's and a one-shot sandbox: owner, then
        # timeout.
        if "sandboxId" in data:
            sandbox = oneshots.oneshot_get_owned(sandbox_id=data["sandboxId"], account=request.user)
        else:
            session = owned_session(request, data)
        timeout_s = data["timeoutMs"] / 1000 if "timeoutMs" in data else None
        if timeout_s is not None and timeout_s > settings.SANDBOX_COMMAND_MAX_TIMEOUT:
            raise ValidationError(
                {"timeoutMs": f"must be at most {settings.SANDBOX_COMMAND_MAX_TIMEOUT * 1000}"}
            )
        command = {
            "argv": [data["cmd"], *data.get("args", [])],
            "cwd": data.get("cwd"),
            "env": data.get("env"),
            "timeout_s": timeout_s,
        }
        if data["detached"]:
            started = commands.command_start(
                session=None if "sandboxId" in data else session,
                sandbox=sandbox if "sandboxId" in data else None,
                **command,
            )
            return Response(command_started_body(started), status=status.HTTP_202_ACCEPTED)
        if "sandboxId" in data:
            result = oneshots.oneshot_command_run(sandbox=sandbox, **command)
        else:
            result = services.session_command_run(session=session, **command)
        return Response(
            {
                "exitCode": result.exit_code,
                "stdout": result.stdout,
                "stderr": result.stderr,
                "durationMs": result.duration_ms,
                "timedOut": result.timed_out,
                "truncated": result.truncated,
            }
        )


def _session_action_schema(operation_id: str, summary: str, description: str, code: int = 200):
    return extend_schema(
        operation_id=operation_id,
        summary=summary,
        description=description,
        request=SessionIdBodySerializer,
        responses={
            code: SandboxStatusResponseSerializer,
            **ERROR_RESPONSES(400, 401, 403, 404, 409),
        },
    )


class SandboxActivityView(APIView):
    @_session_action_schema(
        "touchSandboxActivity",
        "Reset the sandbox's idle clock",
        "Pushes `hibernateAfter` to now + the idle timeout. 409 without an active sandbox.",
    )
    def post(self, request: Request) -> Response:
        session = owned_session(request, validated(SessionIdBodySerializer, request.data))
        session = services.session_activity_touch(session=session)
        return Response(selectors.session_sandbox_status(session))


class SandboxExtendView(APIView):
    @_session_action_schema(
        "extendSandbox",
        "Extend the sandbox's expiry",
        "Pushes `sandboxExpiresAt` out by SANDBOX_EXTEND seconds, capped at "
        "SANDBOX_MAX_LIFETIME from the sandbox's creation. 409 without an active sandbox.",
    )
    def post(self, request: Request) -> Response:
        session = owned_session(request, validated(SessionIdBodySerializer, request.data))
        session = services.session_extend(session=session, actor=actor_of(request))
        return Response(selectors.session_sandbox_status(session))


class SandboxHibernateView(APIView):
    @extend_schema(
        operation_id="hibernateSandbox",
        summary="Hibernate the sandbox now",
        description=(
            "Accepted for the worker: snapshot, verify, stop, then mark hibernated. While the "
            "sandbox is being provisioned or resumed, the request is recorded and carried out "
            "once it is ready; `requestedState` says what was asked for, `lifecycle.state` "
            "where the session is now. Idempotent: a session with nothing to hibernate "
            "answers 202 too."
        ),
        request=SessionIdBodySerializer,
        responses={
            202: HibernateAcceptedSerializer,
            **ERROR_RESPONSES(400, 401, 403, 404, 409),
        },
    )
    def post(self, request: Request) -> Response:
        session = owned_session(request, validated(SessionIdBodySerializer, request.data))
        session = session_hibernate_request(session_id=session.id, reason="requested")
        body = selectors.session_sandbox_status(session)
        archived = session.status == Session.Status.ARCHIVED
        body["requestedState"] = "archived" if archived else "hibernated"
        return Response(body, status=status.HTTP_202_ACCEPTED)
