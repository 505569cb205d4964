"""API key format and hashing, and the per-process cache of verified credentials.

A key reads `recoup_sk_<32 letters and digits>` (about 190 bits). The recognisable prefix lets
the Bearer class tell an API key from a JWT, and lets secret scanners find leaked keys. The
secret has no `-` or `_`: a display prefix starting with `-` would read as an option to
`revoke_api_key`, and a plain alphanumeric run selects whole on a double-click.
"""

import hashlib
import hmac
import secrets
import string
import threading
import time

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


class CredentialCache:
    """Recently verified API keys and their account's column values, in this process.

    Hits spare the request its lookup query for AUTH_CACHE_SECONDS (read per call; 0 turns the
    cache off). Only successful lookups are kept, under the key's HMAC digest, never the raw
    key: a failed or forged key adds no entry, and an entry is reachable only by the key whose
    digest it is. A revocation reaches the process that revokes at once (`forget`) and every
    other process once the entry ages out.
    """

    _MAX_ENTRIES = 10_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, tuple]] = {}

    def get(self, digest: str) -> tuple | None:
        entry = self._entries.get(digest)
        if entry is None or entry[0] <= time.monotonic():
            return None
        return entry[1]

    def put(self, digest: str, values: tuple) -> None:
        ttl = settings.AUTH_CACHE_SECONDS
        if ttl <= 0:
            return
        with self._lock:
            if len(self._entries) >= self._MAX_ENTRIES:
                self._entries.clear()
            self._entries[digest] = (time.monotonic() + ttl, values)

    def forget(self, digests: list[str]) -> None:
        with self._lock:
            for digest in digests:
                self._entries.pop(digest, None)


credential_cache = CredentialCache()
