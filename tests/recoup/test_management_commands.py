"""The operator's key commands: `create_api_key` and `revoke_api_key`, run as `manage.py` would
run them, and the keys they print used against the real API."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from rest_framework.test import APIClient

from recoup.accounts.keys import display_prefix, looks_like_key
from recoup.accounts.models import Account, ApiKey, Membership, Organization

pytestmark = pytest.mark.django_db


def create_api_key(*argv: str) -> tuple[str, str]:
    """Run the command; return its whole stdout and its last line (the raw key)."""
    out = StringIO()
    call_command("create_api_key", *argv, stdout=out)
    text = out.getvalue()
    return text, text.splitlines()[-1]


def sessions_status(raw_key: str) -> int:
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=raw_key)
    return client.get("/api/sessions").status_code


def test_it_creates_the_account_organization_and_membership_when_missing():
    text, raw_key = create_api_key(
        "--email", "new@example.com", "--org", "newco", "--label", "ci", "--expires-days", "3"
    )

    assert looks_like_key(raw_key)
    assert text.count(raw_key) == 1  # printed once, alone on the last line
    account = Account.objects.get(email="new@example.com")
    organization = Organization.objects.get(slug="newco")
    # The id POST /api/sessions takes as organizationId: nothing else in the API shows it.
    assert f"in organization newco (organizationId {organization.id})" in text
    membership = Membership.objects.get(account=account, organization=organization)
    assert membership.role == Membership.Role.MEMBER
    api_key = ApiKey.objects.get(account=account)
    assert (api_key.prefix, api_key.label) == (display_prefix(raw_key), "ci")
    expected_expiry = timezone.now() + timedelta(days=3)
    assert abs(api_key.expires_at - expected_expiry) < timedelta(minutes=1)
    assert sessions_status(raw_key) == 200


def test_the_printed_key_authenticates_as_the_new_account(anon):
    _, raw_key = create_api_key("--email", "solo@example.com")
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=raw_key)

    created = client.post("/api/sessions", {"title": "mine"}, format="json")

    assert created.status_code == 201, created.content
    assert [s["title"] for s in client.get("/api/sessions").json()["sessions"]] == ["mine"]
    assert not Organization.objects.exists()  # no --org, no organization
    assert anon.get("/api/sessions").status_code == 401


def test_it_reuses_an_existing_account_organization_and_membership(owner, org):
    counts = (Account.objects.count(), Organization.objects.count(), Membership.objects.count())

    _, raw_key = create_api_key("--email", "owner@example.com", "--org", org.slug)

    after = (Account.objects.count(), Organization.objects.count(), Membership.objects.count())
    assert after == counts
    assert Membership.objects.get(account=owner.account, organization=org).role == "owner"
    assert owner.account.api_keys.count() == 2
    assert raw_key != owner.raw_key
    assert sessions_status(raw_key) == 200
    assert sessions_status(owner.raw_key) == 200  # the earlier key still works


def test_zero_expiry_days_is_refused_and_creates_nothing():
    with pytest.raises(CommandError, match="expires-days"):
        create_api_key("--email", "never@example.com", "--expires-days", "0")

    assert not Account.objects.filter(email="never@example.com").exists()
    assert not ApiKey.objects.exists()


def test_revoking_by_display_prefix_makes_the_key_fail(owner):
    _, raw_key = create_api_key("--email", "owner@example.com")
    assert sessions_status(raw_key) == 200
    out = StringIO()

    call_command("revoke_api_key", display_prefix(raw_key), stdout=out)

    assert "Revoked 1 key(s)" in out.getvalue()
    assert sessions_status(raw_key) == 401
    assert sessions_status(owner.raw_key) == 200  # only the named key


def test_revoking_by_the_prefixed_display_form_makes_the_key_fail(owner):
    _, raw_key = create_api_key("--email", "owner@example.com")

    call_command("revoke_api_key", "recoup_sk_" + display_prefix(raw_key), stdout=StringIO())

    assert sessions_status(raw_key) == 401
    assert sessions_status(owner.raw_key) == 200


def test_revoking_by_numeric_id_makes_the_key_fail(owner, member):
    api_key = ApiKey.objects.get(account=member.account)

    call_command("revoke_api_key", str(api_key.id), stdout=StringIO())

    assert sessions_status(member.raw_key) == 401
    assert sessions_status(owner.raw_key) == 200


def test_an_unknown_or_already_revoked_key_is_a_command_error(owner):
    with pytest.raises(CommandError, match="No live API key"):
        call_command("revoke_api_key", "zzzzzzzz", stdout=StringIO())
    prefix = ApiKey.objects.get(account=owner.account).prefix
    call_command("revoke_api_key", prefix, stdout=StringIO())

    with pytest.raises(CommandError, match="No live API key"):
        call_command("revoke_api_key", prefix, stdout=StringIO())
