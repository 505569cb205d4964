"""The service's git token serves only whom it should (issue 8, item 7).

A real private git host (tests.support.git_http) stands in for GitHub: `secret-co` reads only
with the service's GITHUB_TOKEN, `own-co` only with the token `own-co`'s users brought
themselves. Every request git makes to it is recorded, so the tests see which credentials
were offered to whom, and the sandboxes are real ones behind the real API.
"""

import base64
import shutil

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.urls import reverse

from lifecycle.bases import base_build_run
from lifecycle.models import BaseSnapshotBuild
from recoup.accounts.git_tokens import git_token_for_clone
from recoup.accounts.models import Organization, git_owner_list
from recoup.accounts.services import organization_git_token_set, organization_join
from sandboxes_app.git.urls import parse_repo_url
from sandboxes_app.models import session_sandbox_name
from tests.support.api import new_session, run
from tests.support.git_http import GitHttpServer, basic_auth

pytestmark = pytest.mark.django_db(transaction=True)

SERVICE_TOKEN = "ghp_" + "Serv1ceT0ken" * 3
ORG_TOKEN = "ghp_" + "0rgOwnT0ken" * 3
FILES = {"README.md": "# private\n"}


@pytest.fixture
def git_host(origins, settings):
    """secret-co/app and own-co/app, private; the service holds SERVICE_TOKEN for no owner."""
    origins.create("secret-co", "app", FILES)
    origins.create("own-co", "app", FILES)
    with GitHttpServer(
        origins.root, {"secret-co": {SERVICE_TOKEN}, "own-co": {ORG_TOKEN}}
    ) as server:
        settings.SANDBOX_GIT_BASE_URL = server.base_url
        settings.GITHUB_TOKEN = SERVICE_TOKEN
        settings.GITHUB_TOKEN_OWNERS = []
        yield server


@pytest.fixture
def allowed_org(org) -> Organization:
    """The owner's organization, allowed the service's token for secret-co."""
    org.git_token_owners = "secret-co"
    org.save()
    return org


@pytest.fixture
def other_org(stranger) -> Organization:
    """The stranger's own organization, allowed nothing."""
    return organization_join(account=stranger.account, slug="globex")


def start(actor, repo: str, org: Organization | None = None):
    """POST /api/sandbox for a new session (in `org`, if given) on github.com/`repo`."""
    extra = {"organizationId": str(org.id)} if org else {}
    session_id = new_session(actor, **extra)
    response = actor.client.post(
        "/api/sandbox",
        {"repoUrl": f"https://github.com/{repo}", "sessionId": session_id},
        format="json",
    )
    return response, session_id


def sent_tokens(server: GitHttpServer, owner: str) -> set[str | None]:
    return {seen.authorization for seen in server.seen if seen.owner == owner}


def test_an_organization_allowed_the_owner_clones_with_the_service_token(
    owner, allowed_org, git_host
):
    response, session_id = start(owner, "secret-co/app", allowed_org)

    assert response.status_code == 200, response.content
    assert run(owner, session_id, "cat", "README.md").json()["stdout"] == "# private\n"
    assert basic_auth(SERVICE_TOKEN) in sent_tokens(git_host, "secret-co")


@pytest.mark.parametrize("in_an_organization", [True, False])
def test_anyone_else_gets_the_502_of_a_missing_repository(
    owner, allowed_org, stranger, other_org, git_host, origins, in_an_organization
):
    denied, denied_session = start(
        stranger, "secret-co/app", other_org if in_an_organization else None
    )
    assert sent_tokens(git_host, "secret-co") == {None}  # the token was never offered
    shutil.rmtree(origins.bare("secret-co", "app"))
    missing, missing_session = start(owner, "secret-co/app", allowed_org)

    assert denied.status_code == missing.status_code == 502
    assert denied.json() == missing.json()
    assert "https://github.com/secret-co/app" in denied.json()["error"]
    errors = [
        stranger.client.get(f"/api/sessions/{denied_session}").json()["session"],
        owner.client.get(f"/api/sessions/{missing_session}").json()["session"],
    ]
    assert errors[0]["lifecycleError"] == errors[1]["lifecycleError"]
    assert SERVICE_TOKEN not in denied.content.decode()


@pytest.mark.parametrize("owners", [["Secret-Co"], ["*"]])
def test_the_setting_allows_owners_for_every_account(stranger, git_host, settings, owners):
    settings.GITHUB_TOKEN_OWNERS = owners

    response, _ = start(stranger, "secret-co/app")

    assert response.status_code == 200, response.content


def test_an_organization_token_serves_its_own_organization_only(
    owner, org, stranger, other_org, git_host
):
    organization_git_token_set(organization=org, token=ORG_TOKEN)
    other_org.git_token_owners = "own-co"  # the service's token cannot read own-co
    other_org.save()

    own, _ = start(owner, "own-co/app", org)
    others, _ = start(stranger, "own-co/app", other_org)
    personal, _ = start(owner, "own-co/app")  # the owner, outside the organization

    assert own.status_code == 200, own.content
    assert others.status_code == personal.status_code == 502
    assert others.json() == personal.json()
    assert ORG_TOKEN not in others.content.decode()


def test_an_organization_token_is_stored_encrypted(org, db):
    organization_git_token_set(organization=org, token=ORG_TOKEN)

    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM accounts_organization WHERE id = %s", [org.id])
        row = " ".join(str(value) for value in cursor.fetchone())
    assert ORG_TOKEN not in row
    assert base64.b64encode(ORG_TOKEN.encode()).decode()[:20] not in row


@pytest.mark.parametrize(
    "repo, token", [("secret-co/app", SERVICE_TOKEN), ("own-co/app", ORG_TOKEN)]
)
def test_no_token_reaches_the_sandbox(owner, allowed_org, git_host, settings, repo, token):
    if token == ORG_TOKEN:
        organization_git_token_set(organization=allowed_org, token=ORG_TOKEN)
    response, session_id = start(owner, repo, allowed_org)
    assert response.status_code == 200, response.content
    assert basic_auth(token) in sent_tokens(git_host, repo.split("/")[0])

    inside = run(
        owner,
        session_id,
        "sh",
        "-c",
        "env; cat /proc/*/environ; git config --list --show-origin; cat .git/config; "
        "grep -ra x-access-token . /tmp /home 2>/dev/null",
    ).json()["stdout"]
    encoded = basic_auth(token).removeprefix("Basic ")
    for secret in (token, encoded):
        assert secret not in inside
    assert "extraheader" not in inside.lower() and "GIT_CONFIG" not in inside
    workspace = settings.SANDBOX_ROOT / session_sandbox_name(session_id)
    for path in workspace.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            assert token.encode() not in data and encoded.encode() not in data, path
    for body in (
        owner.client.get(f"/api/sessions/{session_id}").content,
        owner.client.get("/api/sandboxes").content,
    ):
        assert token.encode() not in body and encoded.encode() not in body


def test_a_base_build_uses_only_the_organizations_token_scope(
    owner, allowed_org, stranger, other_org, git_host
):
    def build(org: Organization, account) -> BaseSnapshotBuild:
        row = BaseSnapshotBuild.objects.create(
            scope=f"org:{org.id}",
            organization=org,
            account=account,
            repo_full_name="secret-co/app",
            clone_url=parse_repo_url("https://github.com/secret-co/app").clone_url,
            reason="first_use",
        )
        return base_build_run(build_id=row.id)

    allowed = build(allowed_org, owner.account)
    denied = build(other_org, stranger.account)

    assert allowed.status == BaseSnapshotBuild.Status.SUCCEEDED, allowed.error
    assert denied.status == BaseSnapshotBuild.Status.FAILED
    assert "https://github.com/secret-co/app" in denied.error and SERVICE_TOKEN not in denied.error


def test_the_legacy_file_tree_of_a_private_repository_needs_an_allowed_owner(
    owner, allowed_org, stranger, other_org, git_host
):
    for actor, org in ((owner, allowed_org), (stranger, other_org)):
        new_session(actor, organizationId=str(org.id), repoUrl="https://github.com/secret-co/app")

    allowed = owner.client.get("/api/sandboxes").json()
    denied = stranger.client.get("/api/sandboxes").json()

    assert [entry["path"] for entry in allowed["filetree"]] == ["README.md"]
    assert denied["github_repo"] == "https://github.com/secret-co/app"
    assert denied["filetree"] is None


@pytest.fixture
def operator() -> Client:
    user = get_user_model().objects.create_superuser("root", "root@example.com", "unused")
    client = Client()
    client.force_login(user)
    return client


def test_the_admin_takes_an_organization_token_and_never_shows_it(operator, org, settings):
    settings.GITHUB_TOKEN = ""
    url = reverse("admin:accounts_organization_change", args=[org.id])
    form = {
        "slug": org.slug,
        "name": org.name,
        "git_token_owners": "secret-co, Other-Owner",
        "git_token": ORG_TOKEN,
        **{f"memberships-{key}": "0" for key in ("TOTAL_FORMS", "INITIAL_FORMS")},
    }

    assert operator.post(url, form).status_code == 302
    org.refresh_from_db()
    assert git_token_for_clone(organization_id=org.id, owner="anyone") == ORG_TOKEN
    assert git_owner_list(org.git_token_owners) == ["secret-co", "other-owner"]
    page = operator.get(url).content.decode()
    assert ORG_TOKEN not in page and org.git_token_encrypted not in page
    assert ORG_TOKEN not in str(list(LogEntry.objects.values()))

    operator.post(url, {**form, "git_token": ""})  # saved without a token: kept
    assert git_token_for_clone(organization_id=org.id, owner="anyone") == ORG_TOKEN
    operator.post(url, {**form, "git_token": "", "remove_git_token": "on"})
    assert git_token_for_clone(organization_id=org.id, owner="anyone") is None

    refused = operator.post(url, {**form, "git_token_owners": "ok, -bad, ../x"})
    assert refused.status_code == 200
    assert "Not GitHub owner names: -bad, ../x" in refused.content.decode()


def test_a_token_sealed_under_another_secret_key_is_not_used(org, settings):
    settings.GITHUB_TOKEN = ""
    organization_git_token_set(organization=org, token=ORG_TOKEN)
    settings.SECRET_KEY = "a-rotated-secret-key"

    assert git_token_for_clone(organization_id=org.id, owner="own-co") is None
