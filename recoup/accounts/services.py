"""Account and API key services (writes)."""

import hmac
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from recoup.accounts.git_tokens import git_token_encrypt
from recoup.accounts.keys import (
    DISPLAY_PREFIX_CHARS,
    KEY_PREFIX,
    credential_cache,
    display_prefix,
    generate_raw_key,
    key_digest,
    looks_like_key,
)
from recoup.accounts.models import Account, ApiKey, Membership, Organization

# last_used_at is a hint for operators, not an audit log: one write a minute per key at most.
LAST_USED_RESOLUTION = timedelta(minutes=1)


@dataclass(frozen=True)
class IssuedKey:
    api_key: ApiKey
    raw_key: str


def account_get_or_create(*, email: str, name: str = "") -> Account:
    account, _ = Account.objects.get_or_create(email=email.lower(), defaults={"name": name})
    return account


def organization_join(
    *, account: Account, slug: str, role: str = Membership.Role.MEMBER
) -> Organization:
    organization, _ = Organization.objects.get_or_create(slug=slug, defaults={"name": slug})
    Membership.objects.get_or_create(
        account=account, organization=organization, defaults={"role": role}
    )
    return organization


def organization_git_token_set(*, organization: Organization, token: str | None) -> None:
    """Store the organization's own GitHub token, encrypted; None or "" removes it."""
    organization.git_token_encrypted = git_token_encrypt(token) if token else ""
    organization.save(update_fields=["git_token_encrypted"])


def api_key_issue(
    *, account: Account, label: str = "", expires_at: datetime | None = None
) -> IssuedKey:
    """Create a key and return it with its raw value, which is never stored or shown again."""
    raw = generate_raw_key()
    api_key = ApiKey.objects.create(
        account=account,
        label=label,
        prefix=display_prefix(raw),
        digest=key_digest(raw),
        expires_at=expires_at,
    )
    return IssuedKey(api_key=api_key, raw_key=raw)


def api_key_verify(*, raw_key: str) -> ApiKey | None:
    """The live key a raw key is (its account loaded), or None when it is unknown, expired or
    revoked."""
    if not looks_like_key(raw_key):
        return None
    digest = key_digest(raw_key)
    api_key = ApiKey.objects.select_related("account").filter(digest=digest).first()
    if api_key is None or not hmac.compare_digest(api_key.digest, digest):
        return None
    if not _api_key_touch(api_key):
        return None
    return api_key


def api_key_authenticate(*, raw_key: str) -> Account | None:
    """The account a raw key belongs to, or None when it is unknown, expired or revoked."""
    api_key = api_key_verify(raw_key=raw_key)
    return None if api_key is None else api_key.account


def api_key_live(*, key_id: int) -> ApiKey | None:
    """The key with this id (its account loaded) while it is neither revoked nor expired: how a
    console session, which keeps the key's id rather than the key, is checked on each request."""
    api_key = ApiKey.objects.select_related("account").filter(id=key_id).first()
    if api_key is None or not _api_key_touch(api_key):
        return None
    return api_key


def _api_key_touch(api_key: ApiKey) -> bool:
    """Whether the key is live; if so, note its use (at most one write a minute)."""
    now = timezone.now()
    if api_key.revoked_at is not None or (api_key.expires_at and api_key.expires_at <= now):
        return False
    if api_key.last_used_at is None or now - api_key.last_used_at >= LAST_USED_RESOLUTION:
        # Conditional update: concurrent requests in the same minute write once.
        ApiKey.objects.filter(id=api_key.id).filter(
            Q(last_used_at__isnull=True) | Q(last_used_at__lte=now - LAST_USED_RESOLUTION)
        ).update(last_used_at=now)
    return True


def api_key_revoke(*, prefix_or_id: str) -> int:
    """Revoke the keys named by display prefix or numeric id; returns how many were revoked."""
    query = Q(prefix=prefix_or_id.removeprefix(KEY_PREFIX))
    # Display prefixes are always 8 characters; a shorter number can only be an id.
    if prefix_or_id.isdigit() and len(prefix_or_id) != DISPLAY_PREFIX_CHARS:
        query = Q(id=int(prefix_or_id))
    live = ApiKey.objects.filter(query, revoked_at__isnull=True)
    digests = list(live.values_list("digest", flat=True))
    revoked = live.update(revoked_at=timezone.now())
    # Other processes drop theirs within AUTH_CACHE_SECONDS.
    credential_cache.forget(digests)
    return revoked


def account_from_oidc(*, subject: str, email: object, email_verified: bool) -> Account | None:
    """The account for an OIDC subject, created on first use from the token's email claim.

    An existing account that never used OIDC is linked only when the identity provider says
    it verified the email; otherwise anyone able to register that address could take it over.
    """
    account = Account.objects.filter(oidc_subject=subject).first()
    if account is not None:
        return account
    if not isinstance(email, str) or len(email) > 254 or len(subject) > 255:
        return None
    try:
        validate_email(email)
    except ValidationError:
        return None
    email = email.lower()
    try:
        with transaction.atomic():
            existing = Account.objects.select_for_update().filter(email=email).first()
            if existing is None:
                return Account.objects.create(email=email, oidc_subject=subject)
            if existing.oidc_subject is None and email_verified:
                existing.oidc_subject = subject
                existing.save(update_fields=["oidc_subject"])
                return existing
            return None
    except IntegrityError:
        # A concurrent first request created it; read the winner.
        return Account.objects.filter(oidc_subject=subject).first()
