from datetime import timedelta

from django.contrib import admin, messages
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html

from lifecycle.admin import LifecycleEventInline
from lifecycle.states import LifecycleState as S
from sessions_app.models import Session


class NeedsAttentionFilter(admin.SimpleListFilter):
    """Failed sessions, and runs holding an expired lease (their worker died)."""

    title = "needs attention"
    parameter_name = "attention"

    def lookups(self, request: HttpRequest, model_admin: object) -> list[tuple[str, str]]:
        return [
            ("failed", "Failed"),
            ("stuck", "Stuck (lease expired)"),
            ("overdue", "Overdue for hibernation"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Session]) -> QuerySet[Session]:
        now = timezone.now()
        if self.value() == "failed":
            return queryset.filter(lifecycle_state=S.FAILED)
        if self.value() == "stuck":
            return queryset.filter(
                lifecycle_state__in=[S.PROVISIONING, S.RESTORING, S.HIBERNATING],
                lifecycle_lease_expires_at__lt=now,
            )
        if self.value() == "overdue":
            return queryset.filter(lifecycle_state=S.ACTIVE).filter(
                Q(hibernate_after__lt=now - timedelta(minutes=1)) | Q(sandbox_expires_at__lt=now)
            )
        return queryset


class SessionStatusFilter(admin.ChoicesFieldListFilter):
    """The contract's session status, named so it is not taken for the sandbox's state."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.title = "session status"


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "title",
        "account",
        "state",
        "lifecycle_version",
        "hibernate_after",
        "sandbox_expires_at",
        "updated_at",
    ]
    list_filter = [NeedsAttentionFilter, "lifecycle_state", ("status", SessionStatusFilter)]
    search_fields = ["id", "title", "account__email"]
    readonly_fields = [f.name for f in Session._meta.fields]
    list_select_related = ["account"]
    inlines = [LifecycleEventInline]
    actions = ["hibernate_now", "archive", "resume"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # sessions are created through the API, by their account

    @admin.display(description="state", ordering="lifecycle_state")
    def state(self, session: Session) -> str:
        """The sandbox's real state. The session's own `status` (the contract's field) stays
        "running" while its sandbox is hibernated or has failed, so alone it misleads."""
        state = session.lifecycle_state or "-"
        if session.status not in (Session.Status.RUNNING, state):
            state = f"{state} (session {session.status})"
        if session.lifecycle_state == S.FAILED and session.lifecycle_error:
            return format_html('<span title="{}">{}</span>', session.lifecycle_error, state)
        return state

    def actor(self, request: HttpRequest) -> str:
        return f"admin:{request.user.get_username()}"

    @admin.action(description="Hibernate now (in the worker)")
    def hibernate_now(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        from lifecycle.tasks import hibernate_session

        for session in queryset:
            hibernate_session.delay(session.id, None, "operator")
        self.message_user(request, f"Queued hibernation of {queryset.count()} session(s).")

    @admin.action(description="Archive (hibernates a running sandbox)")
    def archive(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        from sessions_app.services import session_update

        for session in queryset:
            session_update(
                session=session,
                fields={"status": Session.Status.ARCHIVED},
                actor=self.actor(request),
            )
        self.message_user(request, f"Archived {queryset.count()} session(s).")

    @admin.action(description="Resume the sandbox (from its snapshot)")
    def resume(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        from recoup.errors import ApplicationError
        from sandboxes_app.git.urls import RepoRef
        from sandboxes_app.services import session_sandbox_ensure

        for session in queryset:
            if not (session.repo_owner and session.repo_name):
                self.message_user(request, f"{session.id}: no repository", messages.WARNING)
                continue
            try:
                session_sandbox_ensure(
                    session_id=session.id,
                    repo=RepoRef(owner=session.repo_owner, name=session.repo_name),
                    actor=self.actor(request),
                )
            except ApplicationError as exc:
                self.message_user(request, f"{session.id}: {exc.detail}", messages.ERROR)
            else:
                self.message_user(request, f"{session.id}: resumed")
