import re
import uuid

from django.core.exceptions import ValidationError
from django.db import models

# GitHub's rule for user and organization names (as sandboxes_app.git.urls checks them).
_GITHUB_OWNER = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9]|-(?=[A-Za-z0-9])){0,38}")


def git_owner_list(text: str) -> list[str]:
    """Owner names from a comma or whitespace separated list, lower-cased as GitHub compares."""
    return [owner.lower() for owner in re.split(r"[\s,]+", text) if owner]


def validate_git_owners(text: str) -> None:
    bad = [o for o in git_owner_list(text) if o != "*" and not _GITHUB_OWNER.fullmatch(o)]
    if bad:
        raise ValidationError(f"Not GitHub owner names: {', '.join(bad)}")


class Account(models.Model):
    """A user of the API. Authenticated by API keys or by an OIDC subject (`sub`)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    email = models.EmailField(unique=True)
    name = models.CharField(max_length=200, blank=True, default="")
    oidc_subject = models.CharField(max_length=255, unique=True, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    # DRF's IsAuthenticated reads these; an Account is only ever handed to DRF once verified.
    is_authenticated = True
    is_anonymous = False

    class Meta:
        ordering = ["email"]

    def __str__(self) -> str:
        return self.email


class Organization(models.Model):
    """A team of accounts. Its sessions share base snapshots, and it decides which private
    repositories they may clone: through the service's token for the owners it is allowed, or
    with a token of its own."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    slug = models.SlugField(max_length=100, unique=True)
    name = models.CharField(max_length=200)
    members = models.ManyToManyField(Account, through="Membership", related_name="organizations")
    git_token_owners = models.TextField(
        blank=True,
        default="",
        validators=[validate_git_owners],
        help_text="GitHub owners (users or organizations) whose repositories this "
        "organization's sessions may clone with the service's GITHUB_TOKEN, separated by "
        "commas or spaces; * allows every owner the token can read.",
    )
    # The organization's own GitHub token, Fernet-encrypted (recoup.accounts.git_tokens);
    # written through the admin's password field, never read back out.
    git_token_encrypted = models.TextField(blank=True, default="", editable=False)
    # Quota overrides for sessions of this organization; empty means the service's setting.
    max_sandboxes_per_account = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Live sandboxes one account may hold through this organization's sessions "
        "(its other sandboxes count too). Empty: SANDBOX_MAX_PER_ACCOUNT.",
    )
    max_commands_per_account = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Commands one account may run at once in this organization's sessions "
        "(its other commands count too). Empty: SANDBOX_MAX_COMMANDS_PER_ACCOUNT.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner"
        ADMIN = "admin"
        MEMBER = "member"

    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="memberships")
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=20, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["account", "organization"], name="uniq_membership")
        ]

    def __str__(self) -> str:
        return f"{self.account} in {self.organization} ({self.role})"


class ApiKey(models.Model):
    """An API key. Only an HMAC-SHA256 digest of the raw key is stored; the raw key is shown once.

    `prefix` is the first characters of the random part, kept to let people and operators
    name a key (`revoke_api_key PREFIX`) without the secret.
    """

    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="api_keys")
    label = models.CharField(max_length=200, blank=True, default="")
    prefix = models.CharField(max_length=16, db_index=True, editable=False)
    digest = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.label or self.account.email})"
