"""API key format and hashing.

A key reads `recoup_sk_<32 letters and digits>` (about 190 bits). The recognisable prefix lets
the Bearer class tell an API key from a JWT, and lets secret scanners find leaked keys. The
secret has no `-` or `_`: a display prefix starting with `-` would read as an option to
`revoke_api_key`, and a plain alphanumeric run selects whole on a double-click.
"""

import hashlib
import hmac
import secrets
import string

from django.conf import settings

KEY_PREFIX = "recoup_sk_"
DISPLAY_PREFIX_CHARS = 8
_SECRET_CHARS = 32
_ALPHABET = string.ascii_letters + string.digits


def generate_raw_key() -> str:
    return KEY_PREFIX + "".join(secrets.choice(_ALPHABET) for _ in range(_SECRET_CHARS))


def looks_like_key(raw: str) -> bool:
    return raw.startswith(KEY_PREFIX) and len(raw) == len(KEY_PREFIX) + _SECRET_CHARS


def key_digest(raw: str) -> str:
    return hmac.new(settings.API_KEY_PEPPER.encode(), raw.encode(), hashlib.sha256).hexdigest()


def display_prefix(raw: str) -> str:
    return raw[len(KEY_PREFIX) : len(KEY_PREFIX) + DISPLAY_PREFIX_CHARS]
