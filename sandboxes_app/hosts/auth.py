"""Calls between our own processes and a sandbox host's internal endpoint are signed.

The signature is an HMAC-SHA256 over a timestamp and the body, keyed by SANDBOX_HOST_SECRET
(derived from SECRET_KEY when unset: every process of one deployment shares it). A host
refuses an unsigned or wrongly signed call, and one signed more than MAX_SKEW seconds ago.
"""

from __future__ import annotations

import hashlib
import hmac
import time

HEADER = "X-Recoup-Signature"
MAX_SKEW = 30


def host_secret() -> bytes:
    from django.conf import settings

    if settings.SANDBOX_HOST_SECRET:
        return settings.SANDBOX_HOST_SECRET.encode()
    return hmac.new(settings.SECRET_KEY.encode(), b"recoup sandbox host calls", "sha256").digest()


def sign(*, secret: bytes, body: bytes, now: float | None = None) -> str:
    stamp = str(int(now if now is not None else time.time()))
    mac = hmac.new(secret, stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={stamp},s={mac}"


def signature_valid(*, secret: bytes, header: str, body: bytes, now: float | None = None) -> bool:
    try:
        parts = dict(item.split("=", 1) for item in header.split(","))
        stamp = int(parts["t"])
        mac = parts["s"]
    except (KeyError, ValueError):
        return False
    if abs((now if now is not None else time.time()) - stamp) > MAX_SKEW:
        return False
    expected = hmac.new(secret, str(stamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, mac)
