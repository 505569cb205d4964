from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.timesince import timesince

from sandboxes_app.models import Sandbox, Snapshot
from sandboxes_app.providers.base import ProviderError, get_provider


@admin.register(Sandbox)
class SandboxAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "session",
        "account",
        "provider",
        "status",
        "boot",
        "repo_full_name",
        "created_at",
        "expires_at",
        "destroyed_at",
    ]
    list_filter = ["status", "provider", "boot", ("destroyed_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "session__id", "account__email", "repo_full_name"]
    readonly_fields = [f.name for f in Sandbox._meta.fields]
    list_select_related = ["account", "session"]


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
