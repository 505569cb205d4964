"""The console at `/`: signing in with an API key, the sessions list, creating a session, the
session page with its lifecycle history, and the API calls its script makes with the cookie."""

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.sessions.models import Session as DjangoSession
from django.test import Client
from django.utils import timezone

from lifecycle.models import LifecycleEvent
from lifecycle.states import LifecycleState as S
from lifecycle.transitions import Seen, transition
from recoup.accounts.models import ApiKey
from recoup.accounts.services import api_key_issue
from recoup.console.auth import SESSION_KEY_ID
from sandboxes_app.git.urls import parse_repo_url
from sessions_app.models import Session
from sessions_app.services import session_create
from tests.support.console import api_post, page_token, session_cookie, sign_in

SCRIPT_TITLE = '<script>window.pwned = 1</script>"quoted" & <b>bold</b>'


def _stored_session_data() -> list[dict]:
    return [row.get_decoded() for row in DjangoSession.objects.all()]


@pytest.mark.django_db
def test_signed_out_it_shows_the_sign_in_form():
    response = Client().get("/")
    assert response.status_code == 200
    body = response.content.decode()
    assert 'action="/signin"' in body and 'name="api_key"' in body
    assert 'name="csrfmiddlewaretoken"' in body
    assert "script-src 'self'" in response["Content-Security-Policy"]


@pytest.mark.django_db
def test_signing_in_lists_the_accounts_own_sessions(owner, stranger):
    mine = session_create(account=owner.account, title="mine")
    theirs = session_create(account=stranger.account, title="theirs")
    client = sign_in(owner.raw_key)
    body = client.get("/").content.decode()
    assert owner.account.email in body
    assert f'href="/sessions/{mine.id}"' in body
    assert theirs.id not in body and "theirs" not in body
    assert 'action="/sessions"' in body and 'name="repo_url"' in body


@pytest.mark.django_db
def test_sign_in_rotates_the_session_id_and_keeps_the_keys_id_not_the_key(owner):
    client = Client(enforce_csrf_checks=True)
    token = page_token(client)
    planted = client.session  # a session id the browser held before signing in
    planted["planted"] = 1
    planted.save()
    before = session_cookie(client)
    assert before == planted.session_key

    response = client.post(
        "/signin", {"api_key": f"  {owner.raw_key} ", "csrfmiddlewaretoken": token}
    )

    assert response.status_code == 302 and response["Location"] == "/"
    after = session_cookie(client)
    assert after and after != before
    assert not DjangoSession.objects.filter(session_key=before).exists()
    data = DjangoSession.objects.get(session_key=after).get_decoded()
    assert data[SESSION_KEY_ID] == ApiKey.objects.get(account=owner.account).id
    assert all(owner.raw_key not in repr(stored) for stored in _stored_session_data())
    assert owner.raw_key not in response["Location"]


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["unknown", "revoked", "expired", "garbage", "empty"])
def test_a_bad_key_shows_the_form_again_with_a_message_and_stores_nothing(owner, kind):
    issued = api_key_issue(account=owner.account, label=kind)
    if kind == "revoked":
        ApiKey.objects.filter(id=issued.api_key.id).update(revoked_at=timezone.now())
    if kind == "expired":
        past = timezone.now() - timedelta(seconds=1)
        ApiKey.objects.filter(id=issued.api_key.id).update(expires_at=past)
    raw = {
        "unknown": "recoup_sk_" + "A" * 32,
        "revoked": issued.raw_key,
        "expired": issued.raw_key,
        "garbage": "<script>x</script>",
        "empty": "",
    }[kind]
    client = Client(enforce_csrf_checks=True)
    response = client.post("/signin", {"api_key": raw, "csrfmiddlewaretoken": page_token(client)})

    assert response.status_code == 400
    body = response.content.decode()
    assert "That API key is not valid: it is unknown, revoked or expired." in body
    assert 'name="api_key"' in body and "<script>x</script>" not in body
    assert all(SESSION_KEY_ID not in stored for stored in _stored_session_data())
    assert client.get("/api/sessions").status_code == 401


@pytest.mark.django_db
def test_sign_out_ends_the_console_session(owner):
    client = sign_in(owner.raw_key)
    token = page_token(client)
    assert client.get("/signout").status_code == 405

    response = client.post("/signout", {"csrfmiddlewaretoken": token})

    assert response.status_code == 302
    assert 'name="api_key"' in client.get("/").content.decode()
    assert client.get("/api/sessions").status_code == 401
    assert all(SESSION_KEY_ID not in stored for stored in _stored_session_data())


@pytest.mark.django_db
def test_a_new_session_from_the_console_opens_its_page(owner, org):
    client = sign_in(owner.raw_key)
    response = client.post(
        "/sessions",
        {
            "repo_url": "https://github.com/acme/app",
            "title": "fix the build",
            "organization": str(org.id),
            "csrfmiddlewaretoken": page_token(client),
        },
    )
    session = Session.objects.get(account=owner.account)
    assert response.status_code == 302 and response["Location"] == f"/sessions/{session.id}"
    assert (session.title, session.repo_owner, session.repo_name) == (
        "fix the build",
        "acme",
        "app",
    )
    assert session.organization_id == org.id
    page = client.get(response["Location"]).content.decode()
    assert 'data-repo-url="https://github.com/acme/app"' in page
    assert 'data-state="provisioning"' in page and 'data-version="0"' in page
    assert "No transitions yet." in page


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("repo_url", "message"),
    [
        ("https://gitlab.com/acme/app", "only github.com repositories are accepted"),
        ("", "This field is required."),
        ("https://github.com/acme", "must name exactly an owner and a repository"),
    ],
)
def test_a_bad_repository_url_is_refused_and_creates_nothing(owner, repo_url, message):
    client = sign_in(owner.raw_key)
    response = client.post(
        "/sessions",
        {"repo_url": repo_url, "title": "t", "csrfmiddlewaretoken": page_token(client)},
    )
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not Session.objects.exists()


@pytest.mark.django_db
def test_an_organization_the_account_is_not_in_is_refused(owner, stranger):
    from recoup.accounts.models import Organization

    other = Organization.objects.create(slug="other", name="Other")
    client = sign_in(stranger.raw_key)
    response = client.post(
        "/sessions",
        {
            "repo_url": "https://github.com/acme/app",
            "organization": str(other.id),
            "csrfmiddlewaretoken": page_token(client),
        },
    )
    assert response.status_code == 400
    assert not Session.objects.exists()


@pytest.mark.django_db
def test_a_membership_that_ended_after_the_form_was_shown_is_refused(owner, org):
    from recoup.accounts.models import Membership

    client = sign_in(owner.raw_key)
    token = page_token(client)  # the form offers the organization
    Membership.objects.filter(account=owner.account).delete()
    response = client.post(
        "/sessions",
        {
            "repo_url": "https://github.com/acme/app",
            "organization": str(org.id),
            "csrfmiddlewaretoken": token,
        },
    )
    assert response.status_code == 400
    assert not Session.objects.exists()


@pytest.mark.django_db
def test_signed_out_pages_lead_to_the_sign_in_form(owner):
    session = session_create(account=owner.account, title="t")
    client = Client()
    response = client.get(f"/sessions/{session.id}")
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.post("/sessions", {"repo_url": "https://github.com/a/b"}).status_code == 302
    assert not Session.objects.exclude(id=session.id).exists()


@pytest.mark.django_db
def test_the_session_page_shows_the_history_newest_first_to_the_millisecond(owner):
    session = session_create(
        account=owner.account, title="t", repo=parse_repo_url("https://github.com/acme/app")
    )
    created = transition(
        session_id=session.id, seen=Seen.of(session), to=S.PROVISIONING, reason="create", actor="t"
    )
    transition(
        session_id=session.id, seen=Seen.of(created), to=S.ACTIVE, reason="ready", actor="worker"
    )
    stamps = [datetime(2030, 1, 2, 3, 4, 5, 6000 + n * 1000, tzinfo=UTC) for n in range(2)]
    for event, at in zip(LifecycleEvent.objects.order_by("version"), stamps, strict=True):
        LifecycleEvent.objects.filter(id=event.id).update(created_at=at)

    body = sign_in(owner.raw_key).get(f"/sessions/{session.id}").content.decode()

    newest, oldest = body.index("2030-01-02 03:04:05.007"), body.index("2030-01-02 03:04:05.006")
    assert newest < oldest
    assert 'data-version="2"' in body and 'data-state="active"' in body


@pytest.mark.django_db
@pytest.mark.parametrize("session_id", ["nope", "a" * 300, "x%00y"])
def test_an_unknown_session_page_is_404(owner, session_id):
    assert sign_in(owner.raw_key).get(f"/sessions/{session_id}").status_code == 404


@pytest.mark.django_db
def test_a_title_with_markup_renders_as_text(owner):
    session = session_create(account=owner.account, title=SCRIPT_TITLE)
    client = sign_in(owner.raw_key)
    for path in ("/", f"/sessions/{session.id}"):
        body = client.get(path).content.decode()
        assert "<script>window.pwned" not in body and "<b>bold</b>" not in body
        assert "&lt;script&gt;window.pwned = 1&lt;/script&gt;" in body


@pytest.mark.django_db
def test_the_console_session_calls_the_api_as_its_account(owner):
    client = sign_in(owner.raw_key)
    token = page_token(client)

    created = api_post(client, "/api/sessions", {"title": "from the page"}, token=token)

    assert created.status_code == 201, created.content
    session = Session.objects.get(id=created.json()["session"]["id"])
    assert session.account_id == owner.account.id
    listed = client.get("/api/sessions").json()["sessions"]
    assert [s["id"] for s in listed] == [session.id]
    status = client.get("/api/sandbox/status", {"sessionId": session.id})
    assert status.status_code == 200 and status.json()["lifecycleVersion"] == 0


@pytest.mark.django_db
def test_the_page_script_and_styles_are_local_files():
    from django.contrib.staticfiles import finders

    script = finders.find("console/console.js")
    assert script and finders.find("console/console.css")
    source = open(script).read()
    # Text from the server goes in as text, never as markup.
    assert "innerHTML" not in source and "insertAdjacentHTML" not in source
    assert "http://" not in source and "https://" not in source
