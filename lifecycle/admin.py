import uuid
from collections.abc import Iterable
from datetime import datetime

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest
from django.utils import timezone

from lifecycle.models import BaseSnapshotBuild, LifecycleEvent
from recoup.accounts.models import Account

API_ACTOR = "api:"


def _api_account_id(actor: str) -> uuid.UUID | None:
    if not actor.startswith(API_ACTOR):
        return None
    try:
        return uuid.UUID(actor.removeprefix(API_ACTOR))
    except ValueError:  # not an account id: shown as recorded
        return None


def with_actor_emails(events: Iterable[LifecycleEvent]) -> list[LifecycleEvent]:
    """Give each event `actor_email` when its actor is `api:<account id>`: one query for all
    of them, so a page of events costs the same however many accounts acted on it."""
    events = list(events)
    ids = {_api_account_id(event.actor) for event in events} - {None}
    emails = dict(Account.objects.filter(id__in=ids).values_list("id", "email")) if ids else {}
    for event in events:
        event.actor_email = emails.get(_api_account_id(event.actor))
    return events


def actor_display(event: LifecycleEvent) -> str:
    """The account's email for an API actor (a deleted account keeps its recorded id)."""
    return getattr(event, "actor_email", None) or event.actor


def to_the_millisecond(value: datetime | None) -> str:
    """Transitions of one run come milliseconds apart; Django's format stops at the minute."""
    if value is None:
        return "-"
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


class EventChangeList(ChangeList):
    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.result_list = with_actor_emails(self.result_list)


class EventFormSet(BaseInlineFormSet):
    def get_queryset(self) -> QuerySet[LifecycleEvent]:
        if not hasattr(self, "_queryset"):
            # The formset's forms are built from this queryset's cached rows: annotating them
            # here reaches every form's instance.
            with_actor_emails(super().get_queryset())
        return self._queryset


class LifecycleEventInline(admin.TabularInline):
    """A session's lifecycle history, newest first, on the session's page."""

    model = LifecycleEvent
    formset = EventFormSet
    extra = 0
    can_delete = False
    fields = ["at", "from_state", "to_state", "version", "reason", "actor_name", "error"]
    readonly_fields = fields
    ordering = ["-created_at", "-id"]

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    @admin.display(description="at")
    def at(self, event: LifecycleEvent) -> str:
        return to_the_millisecond(event.created_at)

    @admin.display(description="actor")
    def actor_name(self, event: LifecycleEvent) -> str:
        return actor_display(event)


@admin.register(LifecycleEvent)
class LifecycleEventAdmin(admin.ModelAdmin):
    """The audit trail: written by transitions only, never by hand."""

    list_display = ["at", "session", "from_state", "to_state", "version", "reason", "actor_name"]
    list_filter = ["to_state", "reason"]
    search_fields = ["session__id", "actor", "error"]
    readonly_fields = [
        *(f.name for f in LifecycleEvent._meta.fields if f.name != "created_at"),
        "at",
        "actor_name",
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def get_changelist(self, request: HttpRequest, **kwargs: object) -> type[ChangeList]:
        return EventChangeList

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None):
        event = super().get_object(request, object_id, from_field)
        return with_actor_emails([event])[0] if event is not None else None

    @admin.display(description="at", ordering="created_at")
    def at(self, event: LifecycleEvent) -> str:
        return to_the_millisecond(event.created_at)

    @admin.display(description="actor", ordering="actor")
    def actor_name(self, event: LifecycleEvent) -> str:
        return actor_display(event)


@admin.register(BaseSnapshotBuild)
class BaseSnapshotBuildAdmin(admin.ModelAdmin):
    """Builds are queued by first use and by the rebuild action, never added by hand."""

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

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

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
