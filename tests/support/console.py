"""A browser's view of the console for the Django-level tests: a client that enforces CSRF as
a browser session would meet it, and signs in through the sign-in form."""

import re

from django.conf import settings
from django.test import Client

_META_TOKEN = re.compile(r'<meta name="csrf-token" content="([^"]+)">')


def page_token(client: Client, path: str = "/") -> str:
    """The CSRF token a page of the console carries for its forms and script."""
    response = client.get(path)
    found = _META_TOKEN.search(response.content.decode())
    assert found, response.content[:500]
    return found.group(1)


def sign_in(raw_key: str) -> Client:
    """A browser signed in to the console with `raw_key`."""
    client = Client(enforce_csrf_checks=True)
    token = page_token(client)
    response = client.post("/signin", {"api_key": raw_key, "csrfmiddlewaretoken": token})
    assert response.status_code == 302, response.content[:500]
    return client


def session_cookie(client: Client) -> str | None:
    morsel = client.cookies.get(settings.SESSION_COOKIE_NAME)
    return morsel.value if morsel is not None and morsel.value else None


def api_post(client: Client, path: str, body: dict, *, token: str | None, **extra: str):
    """What the console's script sends: JSON with the page's CSRF token (or none)."""
    headers = {"HTTP_X_CSRFTOKEN": token} if token else {}
    return client.post(path, body, content_type="application/json", **headers, **extra)
