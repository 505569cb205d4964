import secrets

from django.db import models
from django.db.models import Q

from lifecycle.states import LifecycleState
from recoup.accounts.models import Account, Organization

# What a provisioning or resume run reports, in order (lifecycle.progress).
PROVISIONING_PHASES = ("queued", "cloning", "checkout", "from_base", "starting", "active")

_NANOID_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_-"


def new_session_id() -> str:
    """A 21-character nanoid-style id: URL-safe, about 126 bits of randomness."""
    return "".join(secrets.choice(_NANOID_ALPHABET) for _ in range(21))


class Session(models.Model):
    """One agent session: the row the contract's `Session` schema serializes, field for field,
    plus the organization it was created in. The lifecycle columns are driven by
    `lifecycle.transitions`, never written directly by views."""

    class Status(models.TextChoices):
        RUNNING = "running"
        COMPLETED = "completed"
        FAILED = "failed"
        ARCHIVED = "archived"

    id = models.CharField(primary_key=True, max_length=32, default=new_session_id, editable=False)
    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="sessions")
    organization = models.ForeignKey(
        Organization, on_delete=models.SET_NULL, null=True, blank=True, related_name="sessions"
    )
    artist_id = models.UUIDField(null=True, blank=True)
    title = models.CharField(max_length=300)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.RUNNING)

    repo_owner = models.CharField(max_length=100, null=True, blank=True)
    repo_name = models.CharField(max_length=100, null=True, blank=True)
    branch = models.CharField(max_length=255, null=True, blank=True)
    clone_url = models.CharField(max_length=500, null=True, blank=True)
    is_new_branch = models.BooleanField(default=False)
    global_skill_refs = models.JSONField(default=list, blank=True)
    sandbox_state = models.JSONField(null=True, blank=True)

    lifecycle_state = models.CharField(
        max_length=20,
        choices=LifecycleState.choices,
        null=True,
        blank=True,
        default=LifecycleState.PROVISIONING,
    )
    lifecycle_version = models.IntegerField(default=0)
    last_activity_at = models.DateTimeField(null=True, blank=True)
    sandbox_expires_at = models.DateTimeField(null=True, blank=True)
    hibernate_after = models.DateTimeField(null=True, blank=True)
    lifecycle_run_id = models.CharField(max_length=64, null=True, blank=True)
    lifecycle_error = models.TextField(null=True, blank=True)
    # Not in the contract: the lease behind lifecycle_run_id, the session's current snapshot,
    # and the retry backoff of a failed lifecycle step.
    lifecycle_lease_expires_at = models.DateTimeField(null=True, blank=True)
    # A hibernation asked for while the sandbox was being provisioned or resumed: carried out
    # by the run that finishes it, never dropped.
    lifecycle_intent = models.CharField(
        max_length=20, null=True, blank=True, choices=[("hibernate", "hibernate")]
    )
    current_snapshot = models.ForeignKey(
        "sandboxes_app.Snapshot",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    lifecycle_attempts = models.IntegerField(default=0)
    lifecycle_retry_at = models.DateTimeField(null=True, blank=True)
    # When the sweep last handed this session to a task; it is not handed again until the
    # dispatch grace passes, so a slow queue does not fill with duplicates.
    lifecycle_dispatched_at = models.DateTimeField(null=True, blank=True)
    # Where the run that provisions or restores the sandbox is (lifecycle.progress), for the
    # status poll: written by that run only (fenced by lifecycle_run_id), cleared by the
    # transition that leaves provisioning or restoring.
    provisioning_phase = models.CharField(
        max_length=16, null=True, blank=True, choices=[(p, p) for p in PROVISIONING_PHASES]
    )
    provisioning_percent = models.SmallIntegerField(null=True, blank=True)
    # Every change made to the live workspace before this instant survives losing it: it is in
    # the current snapshot, or there was none (a fresh clone comes back from the repository).
    # None: not known, so a checkpoint is due (lifecycle.checkpoints). Never activity.
    workspace_saved_at = models.DateTimeField(null=True, blank=True)
    # The sweep's dispatch mark for checkpoints, apart from lifecycle_dispatched_at so a queued
    # checkpoint never delays the dispatch of a hibernation by a dispatch grace.
    checkpoint_dispatched_at = models.DateTimeField(null=True, blank=True)

    lines_added = models.IntegerField(null=True, blank=True, default=0)
    lines_removed = models.IntegerField(null=True, blank=True, default=0)
    snapshot_url = models.CharField(max_length=500, null=True, blank=True)
    snapshot_created_at = models.DateTimeField(null=True, blank=True)
    snapshot_size_bytes = models.BigIntegerField(null=True, blank=True)
    cached_diff = models.JSONField(null=True, blank=True)
    cached_diff_updated_at = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["account", "-created_at"], name="session_account_recent"),
            models.Index(fields=["lifecycle_state"], name="session_lifecycle_state"),
            models.Index(fields=["hibernate_after"], name="session_hibernate_after"),
            models.Index(fields=["sandbox_expires_at"], name="session_expires_at"),
            # The sweep's lookups: partial indexes stay as small as the set of live sandboxes,
            # however many hibernated sessions the table holds.
            models.Index(
                fields=["hibernate_after"], name="sweep_idle", condition=Q(lifecycle_state="active")
            ),
            models.Index(
                fields=["sandbox_expires_at"],
                name="sweep_expiry",
                condition=Q(lifecycle_state="active"),
            ),
            models.Index(
                fields=["lifecycle_lease_expires_at"],
                name="sweep_stuck",
                condition=Q(lifecycle_state__in=["provisioning", "restoring", "hibernating"]),
            ),
            models.Index(
                fields=["lifecycle_retry_at"],
                name="sweep_retry",
                condition=Q(lifecycle_state="failed"),
            ),
            # A plain ascending index: SQLite (the embedded default) has no NULLS FIRST in one.
            models.Index(
                fields=["workspace_saved_at"],
                name="sweep_checkpoint",
                condition=Q(lifecycle_state="active"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.title!r}"
