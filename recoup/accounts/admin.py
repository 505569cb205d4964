from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from recoup.accounts.keys import display_prefix, generate_raw_key, key_digest
from recoup.accounts.models import Account, ApiKey, Membership, Organization


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["account"]


@admin.register(Account)
class AccountAdmin(admin.ModelAdmin):
    list_display = ["email", "name", "id", "oidc_subject", "created_at"]
    search_fields = ["email", "name", "id", "oidc_subject"]
    readonly_fields = ["id", "created_at"]


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "id", "created_at"]
    search_fields = ["slug", "name"]
    readonly_fields = ["id", "created_at"]
    inlines = [MembershipInline]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Creating a key here shows its raw value once, in the confirmation message."""

    list_display = [
        "prefix",
        "label",
        "account",
        "created_at",
        "expires_at",
        "revoked_at",
        "last_used_at",
    ]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["prefix", "label", "account__email"]
    autocomplete_fields = ["account"]
    fields = [
        "account",
        "label",
        "expires_at",
        "prefix",
        "revoked_at",
        "last_used_at",
        "created_at",
    ]
    readonly_fields = ["prefix", "revoked_at", "last_used_at", "created_at"]
    actions = ["revoke"]

    def save_model(self, request: HttpRequest, obj: ApiKey, form: object, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        raw = generate_raw_key()
        obj.prefix = display_prefix(raw)
        obj.digest = key_digest(raw)
        super().save_model(request, obj, form, change)
        messages.warning(request, f"Copy this key now, it will not be shown again: {raw}")

    @admin.action(description="Revoke selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"Revoked {count} key(s).")
