from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.decorators import method_decorator
from django.views.decorators.debug import sensitive_post_parameters

from recoup.accounts.keys import display_prefix, generate_raw_key, key_digest
from recoup.accounts.models import Account, ApiKey, Membership, Organization
from recoup.accounts.services import organization_git_token_set


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["account"]


@admin.register(Account)
class AccountAdmin(admin.ModelAdmin):
    list_display = ["email", "name", "id", "oidc_subject", "created_at"]
    search_fields = ["email", "name", "id", "oidc_subject"]
    readonly_fields = ["id", "created_at"]


class OrganizationForm(forms.ModelForm):
    """The organization's own git token is write-only: typed here, stored encrypted, never
    rendered back (not even into the password field's value)."""

    git_token = forms.CharField(
        required=False,
        max_length=1000,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="This organization's own GitHub token; its sessions then clone with it "
        "instead of the service's. Leave empty to keep the current one.",
    )
    remove_git_token = forms.BooleanField(required=False, label="Remove the git token")

    class Meta:
        model = Organization
        fields = [
            "slug",
            "name",
            "git_token_owners",
            "max_sandboxes_per_account",
            "max_commands_per_account",
        ]

    def clean_git_token(self) -> str:
        token = self.cleaned_data["git_token"]
        if any(ch.isspace() or not ch.isprintable() or not ch.isascii() for ch in token):
            raise forms.ValidationError("A GitHub token is printable ASCII without spaces.")
        return token


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    form = OrganizationForm
    list_display = ["slug", "name", "id", "git_token_owners", "has_git_token", "created_at"]
    search_fields = ["slug", "name"]
    fields = [
        "slug",
        "name",
        "git_token_owners",
        "has_git_token",
        "git_token",
        "remove_git_token",
        "max_sandboxes_per_account",
        "max_commands_per_account",
        "id",
        "created_at",
    ]
    readonly_fields = ["id", "created_at", "has_git_token"]
    inlines = [MembershipInline]

    @admin.display(boolean=True, description="Own git token")
    def has_git_token(self, obj: Organization) -> bool:
        return bool(obj.git_token_encrypted)

    @method_decorator(sensitive_post_parameters("git_token"))
    def changeform_view(self, request: HttpRequest, *args: object, **kwargs: object) -> object:
        return super().changeform_view(request, *args, **kwargs)

    def save_model(
        self, request: HttpRequest, obj: Organization, form: OrganizationForm, change: bool
    ) -> None:
        super().save_model(request, obj, form, change)
        if form.cleaned_data.get("remove_git_token"):
            organization_git_token_set(organization=obj, token=None)
        elif form.cleaned_data.get("git_token"):
            organization_git_token_set(organization=obj, token=form.cleaned_data["git_token"])


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
