"""Signing in to the console with an API key, and the DRF class that lets a signed-in console
session call the API.

The server session keeps the key's id, never the key, and a check value bound to the key's
digest and API_KEY_PEPPER, so rotating the pepper ends console sessions as it voids keys. The
key is looked up again on every request: a revoked or expired key ends the console session at
the next request (the API's own key cache may trust a key for AUTH_CACHE_SECONDS more).
"""

import hashlib
import hmac

from django.conf import settings
from django.http import HttpRequest
from django.middleware.csrf import rotate_token
from rest_framework.authentication import SessionAuthentication
from rest_framework.request import Request

from recoup.accounts.models import Account, ApiKey
from recoup.accounts.services import api_key_live, api_key_verify

SESSION_KEY_ID = "console_key_id"
SESSION_KEY_CHECK = "console_key_check"
_CHECKED = "_console_account"


def _key_check(api_key: ApiKey) -> str:
    message = f"console-session:{api_key.id}:{api_key.digest}".encode()
    return hmac.new(settings.API_KEY_PEPPER.encode(), message, hashlib.sha256).hexdigest()


def console_sign_in(request: HttpRequest, *, raw_key: str) -> Account | None:
    """Start a console session for a live API key; None (and nothing stored) otherwise.

    The key is checked as the API's `x-api-key` checks it. The session id and the CSRF token
    are rotated, so an id or token planted before sign-in is worth nothing after it."""
    api_key = api_key_verify(raw_key=raw_key.strip())
    if api_key is None:
        return None
    request.session.cycle_key()
    rotate_token(request)
    request.session[SESSION_KEY_ID] = api_key.id
    request.session[SESSION_KEY_CHECK] = _key_check(api_key)
    setattr(request, _CHECKED, api_key.account)
    return api_key.account


def console_sign_out(request: HttpRequest) -> None:
    """End the console session: its data goes and the browser gets a new, empty session."""
    request.session.flush()
    setattr(request, _CHECKED, None)


def console_account(request: HttpRequest) -> Account | None:
    """The account of this request's console session, or None when signed out. A session
    whose key was revoked, expired or voided is ended here."""
    if hasattr(request, _CHECKED):
        return getattr(request, _CHECKED)
    account = None
    key_id = request.session.get(SESSION_KEY_ID)
    if key_id is not None:
        api_key = api_key_live(key_id=key_id) if isinstance(key_id, int) else None
        check = request.session.get(SESSION_KEY_CHECK, "")
        if api_key is not None and hmac.compare_digest(_key_check(api_key), str(check)):
            account = api_key.account
        else:
            request.session.flush()
    setattr(request, _CHECKED, account)
    return account


class ConsoleSessionAuthentication(SessionAuthentication):
    """The console's session cookie, for the API calls its pages make.

    Returns None without a signed-in console session (so the request stays unauthenticated,
    401). With one, unsafe methods must carry the CSRF token (`X-CSRFToken`) and, when sent, a
    same-origin `Origin`; otherwise 403. A Django admin login is not a console session and
    does not authenticate API requests."""

    def authenticate(self, request: Request) -> tuple[Account, str] | None:
        account = console_account(request._request)
        if account is None:
            return None
        self.enforce_csrf(request)
        return account, "console"
