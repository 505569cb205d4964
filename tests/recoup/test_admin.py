"""The accounts admin, driven through Django's own forms as an operator would: keys created
there work against the real API and are stored only as digests."""

import pytest
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from recoup.accounts.keys import display_prefix, key_digest, looks_like_key
from recoup.accounts.models import ApiKey

pytestmark = pytest.mark.django_db

KEY_CHANGELIST = reverse("admin:accounts_apikey_changelist")


@pytest.fixture
def operator() -> Client:
    user = get_user_model().objects.create_superuser("root", "root@example.com", "unused")
    client = Client()
    client.force_login(user)
    return client


def api_status(raw_key: str) -> int:
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=raw_key)
    return client.get("/api/sessions").status_code


def shown_messages(response) -> list[tuple[int, str]]:
    return [(message.level, str(message)) for message in response.context["messages"]]


def test_a_key_added_in_the_admin_is_shown_once_and_works(operator, stranger):
    response = operator.post(
        reverse("admin:accounts_apikey_add"),
        {"account": str(stranger.account.id), "label": "from admin"},
        follow=True,
    )

    assert response.status_code == 200
    warnings = [text for level, text in shown_messages(response) if level == messages.WARNING]
    assert len(warnings) == 1, shown_messages(response)
    raw_key = warnings[0].rsplit(" ", 1)[-1]
    assert looks_like_key(raw_key)
    api_key = ApiKey.objects.get(account=stranger.account, label="from admin")
    assert api_key.digest == key_digest(raw_key)
    assert api_key.prefix == display_prefix(raw_key)
    stored = [str(value) for value in ApiKey.objects.filter(id=api_key.id).values().get().values()]
    assert not any(raw_key in value for value in stored)
    assert api_status(raw_key) == 200

    # Once: the key's change page and the next page do not show it again.
    change = operator.get(reverse("admin:accounts_apikey_change", args=[api_key.id]))
    assert raw_key not in change.content.decode()
    assert raw_key not in operator.get(KEY_CHANGELIST).content.decode()


def test_the_revoke_action_revokes_only_the_selected_keys(operator, owner, member):
    selected = ApiKey.objects.get(account=member.account)

    response = operator.post(
        KEY_CHANGELIST, {"action": "revoke", "_selected_action": [selected.id]}, follow=True
    )

    assert response.status_code == 200
    assert (messages.INFO, "Revoked 1 key(s).") in shown_messages(response)
    assert api_status(member.raw_key) == 401
    assert api_status(owner.raw_key) == 200
    assert ApiKey.objects.get(account=owner.account).revoked_at is None


def test_the_organization_page_lists_its_memberships_inline(operator, org, owner, member):
    response = operator.get(reverse("admin:accounts_organization_change", args=[org.id]))

    assert response.status_code == 200
    (inline,) = response.context["inline_admin_formsets"]
    shown = {(form.instance.account.email, form.instance.role) for form in inline.formset.forms}
    assert shown == {("owner@example.com", "owner"), ("member@example.com", "member")}
    assert "owner@example.com" in response.content.decode()


@pytest.mark.parametrize(
    ("model", "query", "expected"),
    [
        ("account", "member@", ["member@example.com"]),
        ("organization", "acm", ["acme"]),
        ("apikey", "stranger@", ["stranger@example.com"]),
    ],
)
def test_changelists_load_and_search(operator, owner, member, stranger, model, query, expected):
    url = reverse(f"admin:accounts_{model}_changelist")
    assert operator.get(url).status_code == 200

    response = operator.get(url, {"q": query})

    assert response.status_code == 200
    found = list(response.context["cl"].result_list)
    if model == "apikey":
        found = [key.account for key in found]
    assert [str(row) for row in found] == expected


def test_the_admin_refuses_anyone_not_logged_in(stranger):
    response = Client().get(KEY_CHANGELIST)

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))
