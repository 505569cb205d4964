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

from django.http import HttpRequest, HttpResponse
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
