import re
import secrets
import uuid

from django.db import models
from django.db.models import Q
from django.utils import timezone

from recoup.accounts.models import Account, Organization
from sandboxes_app.providers.base import SnapshotInfo


def session_sandbox_name(session_id: str) -> str:
    """The deterministic name of a session's sandbox, so every process finds the same one."""
    return f"sbx_{session_id}"


def oneshot_sandbox_name() -> str:
    return f"sbx_{secrets.token_hex(8)}"


class Snapshot(models.Model):
    """A verified snapshot object in the snapshot storage.

    `session` snapshots hold a session's workspace (only its changes when `base` is set);
    `base` snapshots hold a prepared clone for an organization's repository.
    """

    class Kind(models.TextChoices):
        SESSION = "session"
        BASE = "base"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    storage_key = models.CharField(max_length=300, unique=True)
    size_bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    base = models.ForeignKey(
        "self", on_delete=models.PROTECT, null=True, blank=True, related_name="layers"
    )
    session = models.ForeignKey(
        "sessions_app.Session",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="snapshots",
    )
    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="snapshots")
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, null=True, blank=True, related_name="snapshots"
    )
    repo_full_name = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["account", "-created_at"], name="snapshot_account_recent"),
            models.Index(fields=["expires_at"], name="snapshot_expires_at"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.storage_key}"

    @property
    def public_id(self) -> str:
        return f"snap_{self.id.hex}"

    def to_info(self) -> SnapshotInfo:
        return SnapshotInfo(
            storage_key=self.storage_key,
            sha256=self.sha256,
            size_bytes=self.size_bytes,
            kind=self.kind,
            created_at=self.created_at,
            base=self.base.to_info() if self.base_id else None,
        )


class SandboxQuerySet(models.QuerySet):
    def mark_destroyed(self) -> int:
        """Record that these sandboxes' runtimes and workspaces are gone."""
        now = timezone.now()
        return self.filter(destroyed_at__isnull=True).update(
            status=Sandbox.Status.STOPPED, stopped_at=now, destroyed_at=now
        )


class Sandbox(models.Model):
    """A runtime bound to a session (or, on the legacy path, to an account only).

    A session has at most one live (not destroyed) sandbox: a database constraint.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        STOPPING = "stopping"
        STOPPED = "stopped"
        FAILED = "failed"

    name = models.CharField(max_length=64)
    session = models.ForeignKey(
        "sessions_app.Session",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="sandboxes",
    )
    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="sandboxes")
    provider = models.CharField(max_length=20)
    repo_full_name = models.CharField(max_length=200, blank=True, default="")
    branch = models.CharField(max_length=255, blank=True, default="")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    boot = models.CharField(max_length=10, blank=True, default="", help_text="clone, base, resume")
    base_snapshot = models.ForeignKey(
        Snapshot, on_delete=models.SET_NULL, null=True, blank=True, related_name="sandboxes"
    )
    run_id = models.CharField(max_length=64, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    destroyed_at = models.DateTimeField(null=True, blank=True)

    objects = SandboxQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["session"],
                condition=Q(destroyed_at__isnull=True, session__isnull=False),
                name="one_live_sandbox_per_session",
            ),
            models.UniqueConstraint(
                fields=["name"],
                condition=Q(destroyed_at__isnull=True),
                name="unique_live_sandbox_name",
            ),
        ]
        indexes = [
            models.Index(fields=["account", "-created_at"], name="sandbox_account_recent"),
            models.Index(fields=["expires_at"], name="sandbox_expires_at"),
        ]

    def __str__(self) -> str:
        return self.name


COMMAND_ID = re.compile(r"cmd_[0-9a-f]{32}")


def new_command_id() -> str:
    """`cmd_` and 128 random bits: the only handle on a detached command, so unguessable."""
    return f"cmd_{secrets.token_hex(16)}"


class Command(models.Model):
    """A detached command (POST /api/sandbox/commands with `detached`), in a session's sandbox
    or a one-shot sandbox. Its supervisor on the host runs it and writes its log and exit;
    this row is what the API answers from. The exit columns are written once, by a
    compare-and-set on `finished_at` being null: from the supervisor's exit record, or as
    killed when the supervisor went away without one."""

    id = models.CharField(primary_key=True, max_length=36, default=new_command_id, editable=False)
    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="commands")
    session = models.ForeignKey(
        "sessions_app.Session",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="commands",
    )
    sandbox = models.ForeignKey(Sandbox, on_delete=models.CASCADE, related_name="commands")
    cmd = models.TextField()
    args = models.JSONField(default=list)
    timeout_ms = models.IntegerField()
    # The account's command slot it holds while it runs; freed by the supervisor at exit, and
    # again (harmlessly) by whoever records the exit.
    quota_slot = models.CharField(max_length=32, blank=True, default="")
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    timed_out = models.BooleanField(default=False)
    killed = models.BooleanField(default=False)

    class Meta:
        ordering = ["-started_at"]
        indexes = [
            models.Index(
                fields=["sandbox"],
                condition=Q(finished_at__isnull=True),
                name="command_running",
            ),
        ]

    def __str__(self) -> str:
        return self.id


HOST_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


class SandboxHost(models.Model):
    """A machine that runs sandboxes in a pool (SANDBOX_PROVIDER=pool): `manage.py sandbox_host`
    keeps this row's heartbeat fresh. The beat sweep marks it down once the heartbeat is older
    than SANDBOX_HOST_DOWN_AFTER; a host that heartbeats again comes back up by itself."""

    class Status(models.TextChoices):
        UP = "up"
        DOWN = "down"

    name = models.CharField(max_length=63, unique=True)
    # The process heartbeating under this name: a second process started with the same name
    # waits until this one's heartbeat is stale instead of sharing its queue and its rows.
    instance = models.CharField(max_length=32, default="")
    # The host-internal endpoint for interactive calls (commands, probes, logs).
    address = models.CharField(max_length=200)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.UP)
    cpus = models.IntegerField(default=0)
    memory_mb = models.IntegerField(default=0)
    disk_free_mb = models.BigIntegerField(default=0)
    live_sandboxes = models.IntegerField(default=0, help_text="running here, by the host's count")
    max_sandboxes = models.IntegerField(default=0, help_text="placement stops here")
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    down_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def queue(self) -> str:
        """The Celery queue only this host consumes: lifecycle calls routed to it."""
        return f"host.{self.name}"


class HostPlacement(models.Model):
    """Which host holds a sandbox (by the provider's name for it): written before the host is
    asked to create or resume it, so a crash in between leaves a record of where to look, and
    deleted once the sandbox is destroyed or its host is down. A running sandbox stays on its
    host; a resume may land anywhere."""

    sandbox_name = models.CharField(max_length=64, primary_key=True)
    host = models.ForeignKey(SandboxHost, on_delete=models.CASCADE, related_name="placements")
    placed_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.sandbox_name} on {self.host_id}"
