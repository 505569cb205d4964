"""Attacks on the console's cookie: cross-site requests, a revoked, expired or voided key, an
admin login, a planted session id, and another account's sessions."""

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from lifecycle.models import LifecycleEvent
from recoup.accounts.models import ApiKey
from recoup.accounts.services import api_key_revoke
from sessions_app.models import Session
from sessions_app.services import session_create
from tests.support.console import api_post, page_token, session_cookie, sign_in

GENERIC_401 = {"status": "error", "error": "Invalid or missing API key / Bearer token"}
EVIL = "http://evil.example"


def _unchanged(session: Session) -> bool:
    fresh = Session.objects.get(id=session.id)
    return (fresh.lifecycle_state, fresh.lifecycle_version, fresh.title) == (
        session.lifecycle_state,
        session.lifecycle_version,
        session.title,
    ) and not LifecycleEvent.objects.filter(session=session).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/sessions", {"title": "forged"}),
        ("/api/sandbox/hibernate", {"sessionId": "SID"}),
        ("/api/sandbox", {"sessionId": "SID", "repoUrl": "https://github.com/acme/app"}),
        ("/api/sandbox/commands", {"sessionId": "SID", "cmd": "true"}),
    ],
)
def test_a_cross_site_api_post_without_the_csrf_token_is_refused_and_changes_nothing(
    owner, path, body
):
    session = session_create(account=owner.account, title="t")
    client = sign_in(owner.raw_key)
    body = {k: (session.id if v == "SID" else v) for k, v in body.items()}

    for headers in ({}, {"HTTP_ORIGIN": EVIL}, {"HTTP_X_CSRFTOKEN": "forged" * 6}):
        response = api_post(client, path, body, token=None, **headers)
        assert response.status_code == 403, response.content
        assert response.json()["status"] == "error"
        assert response.json()["error"].startswith("CSRF Failed")

    assert Session.objects.filter(account=owner.account).count() == 1
    assert _unchanged(session)


@pytest.mark.django_db
def test_the_right_token_from_another_origin_is_refused_too(owner):
    client = sign_in(owner.raw_key)
    token = page_token(client)
    response = api_post(client, "/api/sessions", {"title": "x"}, token=token, HTTP_ORIGIN=EVIL)
    assert response.status_code == 403 and response.json()["error"].startswith("CSRF Failed")
    assert not Session.objects.exists()
    # The same request from the console's own origin goes through: the refusal was the origin.
    ok = api_post(
        client, "/api/sessions", {"title": "x"}, token=token, HTTP_ORIGIN="http://testserver"
    )
    assert ok.status_code == 201


@pytest.mark.django_db
def test_cross_site_form_posts_to_the_console_are_refused(owner):
    client = sign_in(owner.raw_key)
    forged = client.post("/sessions", {"repo_url": "https://github.com/acme/app", "title": "x"})
    assert forged.status_code == 403
    assert not Session.objects.exists()
    # Signing a victim out, or into the attacker's account (login CSRF), needs the token too.
    assert client.post("/signout").status_code == 403
    assert client.get("/api/sessions").status_code == 200
    victim = Client(enforce_csrf_checks=True)
    assert victim.post("/signin", {"api_key": owner.raw_key}).status_code == 403
    assert session_cookie(victim) is None


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["revoked", "expired", "pepper_rotated"])
def test_a_dead_key_ends_the_console_session_at_the_next_request(owner, settings, how):
    session = session_create(account=owner.account, title="t")
    client = sign_in(owner.raw_key)
    token = page_token(client)
    assert client.get("/api/sessions").status_code == 200

    if how == "revoked":
        assert api_key_revoke(prefix_or_id=owner.raw_key[10:18]) == 1
    elif how == "expired":
        ApiKey.objects.filter(account=owner.account).update(expires_at=timezone.now())
    else:
        settings.API_KEY_PEPPER = "rotated"

    refused = client.get("/api/sessions")
    assert refused.status_code == 401 and refused.json() == GENERIC_401
    assert refused.headers.get("WWW-Authenticate")
    write = api_post(client, "/api/sandbox/hibernate", {"sessionId": session.id}, token=token)
    assert write.status_code == 401
    assert 'name="api_key"' in client.get("/").content.decode()
    assert client.get(f"/sessions/{session.id}").status_code == 302
    assert _unchanged(session)


@pytest.mark.django_db
def test_a_revoked_key_stays_refused_even_while_the_api_cache_trusts_it(owner, settings):
    """The API may trust a verified key for AUTH_CACHE_SECONDS; the console checks every time."""
    settings.AUTH_CACHE_SECONDS = 300
    client = sign_in(owner.raw_key)
    assert owner.client.get("/api/sessions").status_code == 200  # now in the credential cache
    ApiKey.objects.filter(account=owner.account).update(revoked_at=timezone.now())  # elsewhere
    assert client.get("/api/sessions").status_code == 401


@pytest.mark.django_db
def test_an_admin_login_does_not_authenticate_the_api(owner):
    admin = User.objects.create_superuser("root", "root@example.com", "pw")
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin)
    assert client.get("/admin/").status_code == 200
    response = client.get("/api/sessions")
    assert response.status_code == 401 and response.json() == GENERIC_401
    assert 'name="api_key"' in client.get("/").content.decode()


@pytest.mark.django_db
def test_a_session_id_planted_before_sign_in_is_worthless_after_it(owner):
    attacker = Client()
    attacker.get("/")
    planted = attacker.session
    planted["x"] = 1
    planted.save()
    victim = Client(enforce_csrf_checks=True)
    victim.cookies["sessionid"] = planted.session_key
    token = page_token(victim)
    victim.post("/signin", {"api_key": owner.raw_key, "csrfmiddlewaretoken": token})
    assert victim.get("/api/sessions").status_code == 200

    attacker.cookies["sessionid"] = planted.session_key
    assert attacker.get("/api/sessions").status_code == 401
    assert 'name="api_key"' in attacker.get("/").content.decode()


@pytest.mark.django_db
def test_another_accounts_session_is_404_on_the_console_and_refused_by_the_api(owner, stranger):
    session = session_create(account=owner.account, title="owner's")
    client = sign_in(stranger.raw_key)
    token = page_token(client)

    page = client.get(f"/sessions/{session.id}")
    assert page.status_code == 404 and b"owner&#x27;s" not in page.content
    status = client.get("/api/sandbox/status", {"sessionId": session.id})
    assert status.status_code == 403
    for path, body in [
        ("/api/sandbox/hibernate", {"sessionId": session.id}),
        ("/api/sandbox", {"sessionId": session.id, "repoUrl": "https://github.com/acme/app"}),
        ("/api/sandbox/commands", {"sessionId": session.id, "cmd": "true"}),
    ]:
        response = api_post(client, path, body, token=token)
        assert response.status_code == 403, (path, response.content)
    assert _unchanged(session)


@pytest.mark.django_db
def test_a_key_id_swapped_in_the_session_store_does_not_pass_as_another_account(owner, member):
    """Someone who can write the session store but does not hold API_KEY_PEPPER cannot point a
    console session at another account's key: the check value binds the key it was made for."""
    client = sign_in(owner.raw_key)
    stored = client.session
    stored["console_key_id"] = ApiKey.objects.get(account=member.account).id
    stored.save()
    assert client.get("/api/sessions").status_code == 401
