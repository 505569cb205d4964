"""One application-error hierarchy and the one handler that maps every error to its envelope.

Session-scoped endpoints answer `{"status": "error", "error": "..."}`; a view that sets
`error_envelope = "legacy"` (the `/api/sandboxes` listing) answers `{"error": "..."}`.
"""

import logging

from django.core.exceptions import PermissionDenied, RequestDataTooBig, SuspiciousOperation
from django.http import Http404, HttpRequest, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import set_rollback

from recoup.accounts.authentication import INVALID_CREDENTIALS
from sandboxes_app.providers.base import ProviderError

logger = logging.getLogger(__name__)


class ApplicationError(exceptions.APIException):
    """Base of the service's own errors; `status_code` and the message map straight to HTTP."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_detail = "Bad request"


class NotFound(ApplicationError):
    status_code = status.HTTP_404_NOT_FOUND
    default_detail = "Not found"


class Forbidden(ApplicationError):
    status_code = status.HTTP_403_FORBIDDEN
    default_detail = "Forbidden"


class Conflict(ApplicationError):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "Conflict"


class PayloadTooLarge(ApplicationError):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "Request body too large (see API_MAX_BODY_BYTES)"


class TooManyRequests(ApplicationError):
    """Over a quota; `retry_after` seconds becomes the Retry-After header."""

    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    default_detail = "Too many requests"

    def __init__(self, detail: str | None = None, *, retry_after: int) -> None:
        super().__init__(detail)
        self.wait = max(1, retry_after)


class ServiceUnavailable(ApplicationError):
    """Waited as long as we may for another run; `retry_after` becomes Retry-After."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "Busy; retry shortly"

    def __init__(self, detail: str | None = None, *, retry_after: int) -> None:
        super().__init__(detail)
        self.wait = max(1, retry_after)


class UpstreamError(ApplicationError):
    status_code = status.HTTP_502_BAD_GATEWAY
    default_detail = "The sandbox provider failed"


def error_body(message: str, *, legacy: bool = False) -> dict:
    return {"error": message} if legacy else {"status": "error", "error": message}


def _first_message(detail: object, path: str = "") -> str:
    """Flatten DRF's nested error detail into one message naming the field."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = path if key == "non_field_errors" else (f"{path}.{key}" if path else str(key))
            return _first_message(value, name)
        return "Invalid request"
    if isinstance(detail, list):
        return _first_message(detail[0], path) if detail else "Invalid request"
    text = str(detail)
    return f"{path}: {text}" if path else text


def exception_handler(exc: Exception, context: dict) -> Response:
    view = context.get("view")
    legacy = getattr(view, "error_envelope", "") == "legacy"
    headers: dict[str, str] = {}
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, RequestDataTooBig):
        exc = PayloadTooLarge()
    elif isinstance(exc, SuspiciousOperation):
        exc = exceptions.ParseError("Malformed request")
    elif isinstance(exc, ProviderError):
        # Where a service did not translate it (a status or probe of a pool host that stopped
        # answering, say): the provider's messages are written to be shown.
        logger.warning("provider error in %s: %s", type(view).__name__ if view else "view", exc)
        exc = UpstreamError(f"The sandbox provider failed: {exc}")

    if isinstance(exc, exceptions.APIException):
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header
        if getattr(exc, "wait", None):
            headers["Retry-After"] = str(int(exc.wait))
        status_code = exc.status_code
        message = _first_message(exc.detail)
        if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
            # One message for every credential failure, so keys cannot be probed.
            message = INVALID_CREDENTIALS
    else:
        logger.exception("unhandled error in %s", type(view).__name__ if view else "view")
        status_code = status.HTTP_500_INTERNAL_SERVER_ERROR
        message = "Internal server error"
    set_rollback()
    return Response(error_body(message, legacy=legacy), status=status_code, headers=headers)


def api_not_found(request: HttpRequest, *args: object, **kwargs: object) -> JsonResponse:
    """Unknown paths under /api/ answer the envelope rather than Django's HTML page."""
    return JsonResponse(error_body(f"No such endpoint: {request.path}"), status=404)
