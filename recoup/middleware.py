"""Request bodies sent with Transfer-Encoding: read them whole, or refuse them; never drop them.

WSGI has no field for "a body of unknown length". Django reads CONTENT_LENGTH bytes, so a
chunked request (which has no Content-Length) reached the views as an empty body, and
POST /api/sessions created a session as if the client had sent nothing.

gunicorn, the server the project ships, de-chunks the body and marks its input terminated
(`wsgi.input_terminated`, a de facto WSGI extension): we read that input to its end, bounded
by API_MAX_BODY_BYTES. A server that does not (Django's runserver and test server) hands us
the chunked framing or nothing at all: 411, ask for a Content-Length.
"""

import io
from collections.abc import Callable
from typing import BinaryIO

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from recoup.errors import PayloadTooLarge, error_body

LENGTH_REQUIRED = "Length Required: send the body with a Content-Length header"


class TransferEncodingMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_view(
        self, request: HttpRequest, view_func: Callable, view_args: tuple, view_kwargs: dict
    ) -> HttpResponse | None:
        # In process_view rather than __call__: the view says which error envelope it answers.
        if "HTTP_TRANSFER_ENCODING" not in request.META:
            return None
        view_class = getattr(view_func, "view_class", None)
        legacy = getattr(view_class, "error_envelope", "") == "legacy"
        if not request.META.get("wsgi.input_terminated"):
            return JsonResponse(error_body(LENGTH_REQUIRED, legacy=legacy), status=411)
        body = _read_to_end(request.META["wsgi.input"], limit=settings.API_MAX_BODY_BYTES)
        if body is None:
            message = str(PayloadTooLarge.default_detail)
            return JsonResponse(error_body(message, legacy=legacy), status=413)
        # From here on the request is what it would have been with a Content-Length: Django's
        # body, DRF's parsers and the size check all read the de-chunked bytes.
        request._stream = io.BytesIO(body)
        request.META["CONTENT_LENGTH"] = str(len(body))
        return None


def _read_to_end(stream: BinaryIO, *, limit: int) -> bytes | None:
    """The stream's bytes up to its end, or None if there are more than `limit`."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = stream.read(min(64 * 1024, limit + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
    return None
