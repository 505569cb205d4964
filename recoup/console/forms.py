"""The console's two forms; their values are checked by the same rules as the API's."""

from django import forms

from recoup.accounts.models import Account, Organization
from sandboxes_app.git.urls import InvalidRepoUrl, RepoRef, parse_repo_url


class SignInForm(forms.Form):
    api_key = forms.CharField(
        label="API key",
        max_length=200,
        widget=forms.PasswordInput(attrs={"autocomplete": "current-password", "autofocus": True}),
    )


class NewSessionForm(forms.Form):
    repo_url = forms.CharField(
        label="Repository URL",
        max_length=200,
        widget=forms.TextInput(attrs={"placeholder": "https://github.com/owner/repo"}),
    )
    title = forms.CharField(label="Title", max_length=300, required=False)
    organization = forms.ChoiceField(label="Organization", required=False)

    def __init__(self, *args: object, account: Account, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.account = account
        organizations = Organization.objects.filter(memberships__account=account)
        self.fields["organization"].choices = [("", "personal")] + [
            (str(org.id), org.slug) for org in organizations
        ]

    def clean_repo_url(self) -> RepoRef:
        try:
            return parse_repo_url(self.cleaned_data["repo_url"])
        except InvalidRepoUrl as exc:
            raise forms.ValidationError(str(exc.detail).removeprefix("repoUrl: ")) from None
