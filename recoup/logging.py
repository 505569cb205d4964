"""One structured log line per request, with the session id when the request names one."""

import json
import logging
import time
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from recoup.accounts.models import Account

logger = logging.getLogger("recoup.request")


class RequestLogMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.monotonic()
        request.received_at = started
        response = self.get_response(request)
        session_id = (
            request.GET.get("sessionId")
            or (request.resolver_match.kwargs.get("session_id") if request.resolver_match else None)
            or getattr(request, "log_session_id", None)
        )
        # Only API accounts: an admin session's request.user is a Django user, not an Account.
        account = getattr(request, "user", None)
        if not isinstance(account, Account):
            account = None
        logger.info(
            json.dumps(
                {
                    "event": "request",
                    "method": request.method,
                    "path": request.path,
                    "status": response.status_code,
                    "ms": round((time.monotonic() - started) * 1000, 1),
                    "session_id": session_id,
                    "account_id": str(account.pk) if getattr(account, "pk", None) else None,
                }
            )
        )
        return response
