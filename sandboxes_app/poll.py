"""GET /api/sandbox/status without DRF's per-request machinery: the poll is the hottest read in
the API, and DRF's Request wrapping, content negotiation and response finalizing cost the web
process about as much CPU as the poll's own query.

The lean path runs the very pieces SandboxStatusView runs, in its order: the view's
authentication classes, the IsAuthenticated check, its throttle classes, the poll's selector and
`kick_if_overdue`; errors go through the same exception handler and JSON renderer, and every
response carries the headers DRF's would. A request that could read differently through DRF (no
API key or Bearer header, so the console's session cookie or a 401 decides; any method but GET;
an Accept other than JSON; a query other than one well-formed sessionId) goes to the DRF view
itself. tests/sandboxes_app/test_status_lean_path.py compares the two answer for answer.
"""

import functools
from collections.abc import Callable

from django.conf import settings
from django.core.handlers.exception import convert_exception_to_response
from django.core.handlers.wsgi import WSGIHandler
from django.http import HttpRequest, HttpResponse
from django.utils.module_loading import import_string
from rest_framework import exceptions
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from recoup.errors import exception_handler
from sandboxes_app import selectors
from sandboxes_app.views import SandboxStatusView, kick_if_overdue

# The Accept headers whose negotiation picks plain application/json; anything else (a media
# type parameter such as `indent`, a type we cannot render) is negotiated by DRF.
_PLAIN_ACCEPTS = frozenset({"", "*/*", "application/json", "application/json, */*"})
_drf_view = SandboxStatusView.as_view()
_view = SandboxStatusView()
_renderer = JSONRenderer()
_ALLOW = "GET, HEAD, OPTIONS"  # what DRF's `Allow` says of a view with only `get`
LEAN = True  # tests turn it off to read the same requests through DRF


def _leanable(request: HttpRequest) -> str | None:
    """The request's sessionId when the lean path answers it exactly as DRF would, else None."""
    meta = request.META
    if not LEAN or request.method != "GET" or meta.get("HTTP_ACCEPT", "") not in _PLAIN_ACCEPTS:
        return None
    # With neither header the third class (the console's session cookie) or a 401 decides.
    if "HTTP_X_API_KEY" not in meta and not meta.get("HTTP_AUTHORIZATION", "").split():
        return None
    params = request.GET
    if len(params) != 1:
        return None
    values = params.getlist("sessionId")
    if len(values) != 1:
        return None
    session_id = values[0]
    # The same test polled_session applies before it skips the serializer.
    if not session_id or len(session_id) > 64 or session_id != session_id.strip():
        return None
    return session_id


def _authenticate(request: HttpRequest) -> object:
    """The account, as DRF's Request._authenticate finds it. The two header classes read only
    META; `_leanable` guarantees one of them answers or raises before the console's class."""
    for authenticator in _view.authentication_classes[:2]:
        found = authenticator().authenticate(request)
        if found is not None:
            return found[0]
    raise exceptions.NotAuthenticated()


def _check_throttles(request: HttpRequest) -> None:
    waits = []
    for throttle_class in _view.throttle_classes:
        throttle = throttle_class()
        if not throttle.allow_request(request, _view):
            waits.append(throttle.wait())
    if waits:
        raise exceptions.Throttled(max((w for w in waits if w is not None), default=None))


def _error(request: HttpRequest, exc: Exception) -> HttpResponse:
    """APIView.handle_exception and finalize_response, for this view."""
    if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        exc.auth_header = _view.authentication_classes[0]().authenticate_header(request)
    response = exception_handler(exc, {"view": _view, "args": (), "kwargs": {}, "request": request})
    if response is None:
        raise exc
    response.exception = True
    return _finalized(request, response)


def _finalized(request: HttpRequest, response: Response) -> Response:
    response.accepted_renderer = _renderer
    response.accepted_media_type = _renderer.media_type
    response.renderer_context = {"view": _view, "args": (), "kwargs": {}, "request": request}
    response["Allow"] = _ALLOW
    return response


@functools.wraps(_drf_view)  # its `cls`, `view_class` and `csrf_exempt`: schema and middleware
def sandbox_status(request: HttpRequest) -> HttpResponse:
    session_id = _leanable(request)
    if session_id is None:
        return _drf_view(request)
    request.user = None  # what DRF leaves when authentication fails; the request log reads it
    try:
        account = _authenticate(request)
        request.user = account
        _check_throttles(request)
        session = selectors.session_get_polled(session_id=session_id, account=account)
        request.log_session_id = session.id
        kick_if_overdue(session)
        body = selectors.session_sandbox_status(session)
    except Exception as exc:  # noqa: BLE001 - DRF's handler decides, as in APIView.dispatch
        return _error(request, exc)
    return _finalized(request, Response(body))


# Middleware the lean poll never needs, so its requests skip it (the rest, the request log and
# the response headers, run as for any request):
_SKIPPED_MIDDLEWARE = frozenset(
    {
        # The poll's credentials are an API key or a Bearer token, never the session cookie.
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
        # A GET of an exempt view: nothing to check, no cookie to set.
        "django.middleware.csrf.CsrfViewMiddleware",
        # Requests with a Transfer-Encoding are not routed here (`with_lean_poll`).
        "recoup.middleware.TransferEncodingMiddleware",
    }
)
STATUS_PATH = "/api/sandbox/status"


class LeanPollHandler(WSGIHandler):
    """Django's WSGI handler for the status poll, with the middleware it needs only: the
    sessions, messages, auth and CSRF middleware cost the poll's web process about a sixth of
    its CPU, for nothing it reads. A request the lean path would not answer is handed to the
    full handler, which answers it exactly as if this one did not exist."""

    def __init__(self, *, full: WSGIHandler) -> None:
        self._full = full
        super().__init__()

    def load_middleware(self, is_async: bool = False) -> None:
        """BaseHandler.load_middleware over a subset of settings.MIDDLEWARE (all synchronous)."""
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        handler = convert_exception_to_response(self._get_response)
        for path in reversed(settings.MIDDLEWARE):
            if path in _SKIPPED_MIDDLEWARE:
                continue
            middleware = import_string(path)(handler)
            if hasattr(middleware, "process_view"):
                self._view_middleware.insert(0, middleware.process_view)
            if hasattr(middleware, "process_template_response"):
                self._template_response_middleware.append(middleware.process_template_response)
            if hasattr(middleware, "process_exception"):
                self._exception_middleware.append(middleware.process_exception)
            handler = convert_exception_to_response(middleware)
        self._middleware_chain = handler

    def get_response(self, request: HttpRequest) -> HttpResponse:
        if request.path_info != STATUS_PATH or _leanable(request) is None:
            return self._full.get_response(request)
        return super().get_response(request)


def with_lean_poll(application: WSGIHandler) -> Callable:
    """The WSGI application, with status polls served by a LeanPollHandler."""
    poll = LeanPollHandler(full=application)

    def route(environ: dict, start_response: Callable) -> object:
        if environ.get("PATH_INFO") == STATUS_PATH and "HTTP_TRANSFER_ENCODING" not in environ:
            return poll(environ, start_response)
        return application(environ, start_response)

    return route
