from django.db import models


class LifecycleEvent(models.Model):
    """One row per lifecycle transition: the audit trail operators read in the admin."""

    session = models.ForeignKey(
        "sessions_app.Session", on_delete=models.CASCADE, related_name="lifecycle_events"
    )
    from_state = models.CharField(max_length=20, null=True, blank=True)
    to_state = models.CharField(max_length=20)
    version = models.IntegerField(help_text="lifecycle_version after the transition")
    reason = models.CharField(max_length=100)
    actor = models.CharField(max_length=100, help_text="api:<account>, worker, sweep, admin:<user>")
    error = models.TextField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["session", "-created_at"], name="event_session_recent")]

    def __str__(self) -> str:
        return f"{self.session_id}: {self.from_state} -> {self.to_state} ({self.reason})"


class BaseSnapshotBuild(models.Model):
    """A job row for the per-organization base snapshot builder: the source of truth for the
    build, whatever the broker does. At most one queued or running build per (scope, repo)."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    scope = models.CharField(max_length=60, help_text="org:<uuid>, or acct:<uuid> without one")
    organization = models.ForeignKey(
        "accounts.Organization", on_delete=models.CASCADE, null=True, blank=True
    )
    account = models.ForeignKey("accounts.Account", on_delete=models.CASCADE)
    repo_full_name = models.CharField(max_length=200)
    clone_url = models.CharField(max_length=500)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    snapshot = models.ForeignKey(
        "sandboxes_app.Snapshot",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    error = models.TextField(null=True, blank=True)
    reason = models.CharField(max_length=40, default="first_use")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(
        null=True, blank=True, help_text="a running build's heartbeat lease; past it, reaped"
    )
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.IntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["scope", "repo_full_name"],
                condition=models.Q(status__in=["queued", "running"]),
                name="one_pending_base_build",
            )
        ]

    def __str__(self) -> str:
        return f"{self.scope} {self.repo_full_name} {self.status}"
