"""The two DRF authentication classes: `x-api-key` and `Authorization: Bearer`.

Every failure answers the same generic message so that a caller cannot tell an unknown key
from a revoked or expired one. A verified API key is remembered for AUTH_CACHE_SECONDS
(`keys.CredentialCache`), so a revoked or expired key may still pass for that long.
"""

import logging

import jwt
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from recoup.accounts.keys import KEY_PREFIX, credential_cache, key_digest, looks_like_key
from recoup.accounts.models import Account
from recoup.accounts.services import account_from_oidc, api_key_authenticate

logger = logging.getLogger(__name__)

INVALID_CREDENTIALS = "Invalid or missing API key / Bearer token"
_jwks_clients: dict[str, jwt.PyJWKClient] = {}
_ACCOUNT_FIELDS = [field.attname for field in Account._meta.concrete_fields]


def _fail() -> exceptions.AuthenticationFailed:
    return exceptions.AuthenticationFailed(INVALID_CREDENTIALS)


def api_key_account(raw_key: str) -> Account | None:
    """The key's account, from the credential cache or `api_key_authenticate` (which also
    writes `last_used_at`, at most once a minute)."""
    if not looks_like_key(raw_key):
        return None
    digest = key_digest(raw_key)
    values = credential_cache.get(digest)
    if values is not None:
        # A fresh instance per request: a shared one could be changed by a concurrent request.
        return Account.from_db(DEFAULT_DB_ALIAS, _ACCOUNT_FIELDS, values)
    account = api_key_authenticate(raw_key=raw_key)
    if account is not None:
        credential_cache.put(digest, tuple(getattr(account, f) for f in _ACCOUNT_FIELDS))
    return account


class ApiKeyHeaderAuthentication(authentication.BaseAuthentication):
    """`x-api-key: recoup_sk_...`.

    Returns None when the header is absent (so Bearer may be tried), raises when it is
    present but not a live key.
    """

    def authenticate(self, request: Request) -> tuple[Account, str] | None:
        raw = request.META.get("HTTP_X_API_KEY")
        if raw is None:
            return None
        account = api_key_account(raw.strip())
        if account is None:
            raise _fail()
        return account, "api_key"

    def authenticate_header(self, request: Request) -> str:
        return 'ApiKey realm="api", header="x-api-key"'


class BearerAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <token>`: an API key (by its prefix) or an OIDC JWT.

    JWTs are verified against OIDC_JWKS_URL (RS256 or ES256), OIDC_ISSUER and OIDC_AUDIENCE;
    with no OIDC configured only API keys are accepted.
    """

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Account, str] | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != b"bearer":
            if header:
                raise _fail()
            return None
        if len(header) != 2:
            raise _fail()
        try:
            token = header[1].decode()
        except UnicodeDecodeError:
            raise _fail() from None
        if token.startswith(KEY_PREFIX):
            account = api_key_account(token)
            if account is None:
                raise _fail()
            return account, "api_key"
        return self._authenticate_jwt(token), "oidc"

    def _authenticate_jwt(self, token: str) -> Account:
        if not (settings.OIDC_JWKS_URL and settings.OIDC_ISSUER and settings.OIDC_AUDIENCE):
            raise _fail()
        try:
            client = _jwks_clients.get(settings.OIDC_JWKS_URL)
            if client is None:
                client = jwt.PyJWKClient(settings.OIDC_JWKS_URL, lifespan=300)
                _jwks_clients[settings.OIDC_JWKS_URL] = client
            signing_key = client.get_signing_key_from_jwt(token)
            claims = jwt.decode(
                token,
                signing_key.key,
                algorithms=["RS256", "ES256"],
                issuer=settings.OIDC_ISSUER,
                audience=settings.OIDC_AUDIENCE,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except (jwt.PyJWTError, ValueError) as exc:
            logger.info("bearer jwt rejected: %s", type(exc).__name__)
            raise _fail() from None
        account = account_from_oidc(
            subject=str(claims["sub"]),
            email=claims.get("email"),
            email_verified=claims.get("email_verified") is True,
        )
        if account is None:
            raise _fail()
        return account

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'
