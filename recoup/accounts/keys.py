"""API key format and hashing.

A key reads `recoup_sk_<32 url-safe chars>`. The recognisable prefix lets the Bearer class
tell an API key from a JWT, and lets secret scanners find leaked keys.
"""

import hashlib
import hmac
import secrets

from django.conf import settings

KEY_PREFIX = "recoup_sk_"
DISPLAY_PREFIX_CHARS = 8
_SECRET_CHARS = 32


def generate_raw_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(24)[:_SECRET_CHARS]


def looks_like_key(raw: str) -> bool:
    return raw.startswith(KEY_PREFIX) and len(raw) == len(KEY_PREFIX) + _SECRET_CHARS


def key_digest(raw: str) -> str:
    return hmac.new(settings.API_KEY_PEPPER.encode(), raw.encode(), hashlib.sha256).hexdigest()


def display_prefix(raw: str) -> str:
    return raw[len(KEY_PREFIX) : len(KEY_PREFIX) + DISPLAY_PREFIX_CHARS]
