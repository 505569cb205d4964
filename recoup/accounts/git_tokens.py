"""Which GitHub token a clone may use, and how an organization's own token is kept.

The service's GITHUB_TOKEN can read whatever its owner can, so it is lent only for repository
owners an operator allowed: for everyone in GITHUB_TOKEN_OWNERS, for an organization's sessions
in its `git_token_owners`. An organization may bring a token of its own instead, used for all
of its sessions' clones. Anything else clones anonymously, so a private repository fails
exactly like a missing one.

An organization's token is stored Fernet-encrypted under a key derived from SECRET_KEY; it is
decrypted only here, to be handed to git (sandboxes_app.git.commands), never shown or logged.
"""

from __future__ import annotations

import base64
import logging
import uuid

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

from recoup.accounts.models import Organization, git_owner_list

logger = logging.getLogger("recoup.accounts")

# Domain separation: this key encrypts git tokens and nothing else derived from SECRET_KEY.
_KEY_LABEL = b"recoup organization git token v1"


def _fernet() -> Fernet:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_KEY_LABEL).derive(
        settings.SECRET_KEY.encode()
    )
    return Fernet(base64.urlsafe_b64encode(key))


def git_token_encrypt(token: str) -> str:
    return _fernet().encrypt(token.encode()).decode()


def git_token_decrypt(encrypted: str) -> str | None:
    """The token, or None when it was encrypted under another SECRET_KEY (or tampered with)."""
    try:
        return _fernet().decrypt(encrypted.encode()).decode()
    except InvalidToken:
        return None


def owner_allowed(*, owner: str, owners: list[str]) -> bool:
    allowed = [name.lower() for name in owners]
    return "*" in allowed or owner.lower() in allowed


def git_token_for_clone(*, organization_id: uuid.UUID | None, owner: str) -> str | None:
    """The token to clone a repository of `owner` for a session of `organization_id` (None:
    a personal session), or None for an anonymous clone."""
    organization = (
        Organization.objects.filter(id=organization_id).first() if organization_id else None
    )
    if organization is not None and organization.git_token_encrypted:
        token = git_token_decrypt(organization.git_token_encrypted)
        if token:
            return token
        logger.warning(
            "The git token of organization %s cannot be decrypted (SECRET_KEY changed?); "
            "set it again in the admin",
            organization.slug,
        )
    owners = list(settings.GITHUB_TOKEN_OWNERS)
    if organization is not None:
        owners += git_owner_list(organization.git_token_owners)
    if settings.GITHUB_TOKEN and owner_allowed(owner=owner, owners=owners):
        return settings.GITHUB_TOKEN
    return None
