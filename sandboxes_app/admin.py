from django.contrib import admin, messages
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.timesince import timesince

from sandboxes_app.checks import sandbox_limits
from sandboxes_app.models import Sandbox, SandboxHost, Snapshot
from sandboxes_app.oneshots import oneshot_sandbox_destroy
from sandboxes_app.providers.base import ProviderError, get_provider
from sandboxes_app.selectors import legacy_sandbox_status


@admin.register(Sandbox)
class SandboxAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "session",
        "account",
        "provider",
        "state",
        "boot",
        "repo_full_name",
        "created_at",
        "expires_at",
        "destroyed_at",
    ]
    # "session: Empty" lists the one-shot sandboxes.
    list_filter = [
        ("session", admin.EmptyFieldListFilter),
        "status",
        "provider",
        "boot",
        ("destroyed_at", admin.EmptyFieldListFilter),
    ]
    search_fields = ["name", "session__id", "account__email", "repo_full_name"]
    readonly_fields = [f.name for f in Sandbox._meta.fields]
    list_select_related = ["account", "session"]
    actions = ["destroy_oneshots"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # sandboxes are created through the API

    @admin.display(description="status", ordering="status")
    def state(self, sandbox: Sandbox) -> str:
        """What the API reports: a session's live sandbox follows its session's lifecycle (the
        row still says "running" while a failed session keeps its workspace)."""
        return legacy_sandbox_status(sandbox)

    @admin.action(description="Destroy selected one-shot sandboxes (processes and disk)")
    def destroy_oneshots(self, request: HttpRequest, queryset: QuerySet[Sandbox]) -> None:
        actor = f"admin:{request.user.get_username()}"
        skipped = queryset.filter(session__isnull=False).count()
        if skipped:
            # A session's sandbox holds work: the session admin hibernates or archives it.
            self.message_user(
                request,
                f"Skipped {skipped} session sandbox(es): hibernate or archive their sessions",
                messages.WARNING,
            )
        destroyed = 0
        for sandbox in queryset.filter(session__isnull=True, destroyed_at__isnull=True):
            try:
                recorded = oneshot_sandbox_destroy(sandbox=sandbox, actor=actor, reason="admin")
            except ProviderError as exc:
                self.message_user(request, f"{sandbox.name}: {exc}", messages.ERROR)
                continue
            if recorded:
                destroyed += 1
                self.log_change(request, sandbox, f"Destroyed one-shot sandbox ({actor})")
        self.message_user(request, f"Destroyed {destroyed} one-shot sandbox(es)")

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None):
        # Operators see here, where they look at sandboxes, whether they run unlimited.
        limits = sandbox_limits()
        level = messages.WARNING if limits.startswith(("off", "error")) else messages.INFO
        self.message_user(request, f"Sandbox limits: {limits}", level)
        return super().changelist_view(request, extra_context)


@admin.register(Snapshot)
class SnapshotAdmin(admin.ModelAdmin):
    list_display = [
        "storage_key",
        "kind",
        "size_bytes",
        "age",
        "repo_full_name",
        "account",
        "organization",
        "deleted_at",
    ]
    list_filter = ["kind", ("deleted_at", admin.EmptyFieldListFilter)]
    search_fields = ["storage_key", "repo_full_name", "account__email", "session__id"]
    readonly_fields = [f.name for f in Snapshot._meta.fields]
    actions = ["verify"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # snapshots are written by hibernations and base builds

    @admin.display(description="age")
    def age(self, obj: Snapshot) -> str:
        return timesince(obj.created_at, timezone.now())

    @admin.action(description="Verify size and sha256 against storage")
    def verify(self, request: HttpRequest, queryset: QuerySet[Snapshot]) -> None:
        provider = get_provider()
        for snapshot in queryset.filter(deleted_at__isnull=True):
            try:
                provider.verify_snapshot(snapshot=snapshot.to_info())
            except ProviderError as exc:
                self.message_user(request, f"{snapshot.storage_key}: {exc}", messages.ERROR)
            else:
                self.message_user(request, f"{snapshot.storage_key}: OK")


@admin.register(SandboxHost)
class SandboxHostAdmin(admin.ModelAdmin):
    """The pool's hosts (SANDBOX_PROVIDER=pool), as their heartbeats describe them. Read-only:
    a host registers itself (`manage.py sandbox_host`) and the sweep marks it down."""

    list_display = [
        "name",
        "status",
        "placed",
        "live_sandboxes",
        "max_sandboxes",
        "cpus",
        "memory_mb",
        "disk_free_mb",
        "heartbeat_age",
        "address",
    ]
    list_filter = ["status"]
    readonly_fields = [f.name for f in SandboxHost._meta.fields]

    def get_queryset(self, request: HttpRequest) -> QuerySet[SandboxHost]:
        return super().get_queryset(request).annotate(placed_count=Count("placements"))

    @admin.display(description="placed sandboxes", ordering="placed_count")
    def placed(self, host: SandboxHost) -> int:
        return host.placed_count

    @admin.display(description="last heartbeat")
    def heartbeat_age(self, host: SandboxHost) -> str:
        return f"{timesince(host.heartbeat_at)} ago"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
