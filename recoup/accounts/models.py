import uuid

from django.db import models


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
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    slug = models.SlugField(max_length=100, unique=True)
    name = models.CharField(max_length=200)
    members = models.ManyToManyField(Account, through="Membership", related_name="organizations")
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
