from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from lifecycle.models import BaseSnapshotBuild, LifecycleEvent


@admin.register(LifecycleEvent)
class LifecycleEventAdmin(admin.ModelAdmin):
    list_display = ["created_at", "session", "from_state", "to_state", "version", "reason", "actor"]
    list_filter = ["to_state", "reason"]
    search_fields = ["session__id", "actor", "error"]
    readonly_fields = [f.name for f in LifecycleEvent._meta.fields]


@admin.register(BaseSnapshotBuild)
class BaseSnapshotBuildAdmin(admin.ModelAdmin):
    list_display = [
        "repo_full_name",
        "scope",
        "status",
        "reason",
        "duration_ms",
        "created_at",
        "finished_at",
        "error",
    ]
    list_filter = ["status", "reason"]
    search_fields = ["repo_full_name", "scope"]
    readonly_fields = [f.name for f in BaseSnapshotBuild._meta.fields]
    actions = ["rebuild"]

    @admin.action(description="Rebuild the base snapshot")
    def rebuild(self, request: HttpRequest, queryset: QuerySet[BaseSnapshotBuild]) -> None:
        from lifecycle.bases import base_build_enqueue

        queued = 0
        for build in queryset:
            new = base_build_enqueue(
                scope=build.scope,
                organization_id=build.organization_id,
                account_id=build.account_id,
                repo_full_name=build.repo_full_name,
                clone_url=build.clone_url,
                reason="operator",
            )
            queued += new is not None
        self.message_user(request, f"Queued {queued} rebuild(s).")
