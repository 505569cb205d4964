"""Who may call the API: API keys (x-api-key or Bearer) and OIDC JWTs, all through HTTP."""

import base64
import hashlib
import hmac
import json
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.utils import timezone
from rest_framework.test import APIClient

from recoup.accounts.keys import generate_raw_key
from recoup.accounts.models import Account, ApiKey
from recoup.accounts.services import api_key_issue, api_key_revoke
from sessions_app.services import session_create

URL = "/api/sessions"
GENERIC_401 = {"status": "error", "error": "Invalid or missing API key / Bearer token"}


def _client(**headers: str) -> APIClient:
    client = APIClient()
    client.credentials(**headers)
    return client


def _assert_rejected(response) -> None:
    assert response.status_code == 401, response.content
    assert response.json() == GENERIC_401
    assert response.headers.get("WWW-Authenticate")


def _well_formed_unknown_key() -> str:
    return "recoup_sk_" + "A" * 32


# --- API keys -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_rejects_a_request_without_credentials(anon):
    _assert_rejected(anon.get(URL))


@pytest.mark.django_db
@pytest.mark.parametrize(
    "headers",
    [
        {"HTTP_AUTHORIZATION": "Basic dXNlcjpwYXNzd29yZA=="},
        {"HTTP_AUTHORIZATION": "Bearer"},
        {"HTTP_AUTHORIZATION": "Bearer "},
        {"HTTP_AUTHORIZATION": "Bearer a b"},
        {"HTTP_AUTHORIZATION": "Token recoup_sk_" + "A" * 32},
        {"HTTP_X_API_KEY": "garbage"},
        {"HTTP_X_API_KEY": ""},
        {"HTTP_X_API_KEY": "recoup_sk_short"},
    ],
    ids=[
        "basic",
        "bearer-without-token",
        "bearer-blank-token",
        "bearer-two-tokens",
        "other-scheme",
        "garbage-x-api-key",
        "empty-x-api-key",
        "truncated-x-api-key",
    ],
)
def test_it_rejects_malformed_credentials(headers):
    _assert_rejected(_client(**headers).get(URL))


@pytest.mark.django_db
@pytest.mark.parametrize("header", ["HTTP_X_API_KEY", "HTTP_AUTHORIZATION"])
def test_it_rejects_an_unknown_key(header, owner):
    value = _well_formed_unknown_key()
    if header == "HTTP_AUTHORIZATION":
        value = f"Bearer {value}"
    _assert_rejected(_client(**{header: value}).get(URL))


@pytest.mark.django_db
def test_it_rejects_an_expired_key(owner):
    issued = api_key_issue(account=owner.account, expires_at=timezone.now() - timedelta(seconds=1))
    _assert_rejected(_client(HTTP_X_API_KEY=issued.raw_key).get(URL))
    _assert_rejected(_client(HTTP_AUTHORIZATION=f"Bearer {issued.raw_key}").get(URL))


@pytest.mark.django_db
def test_it_accepts_a_key_that_expires_in_the_future(owner):
    issued = api_key_issue(account=owner.account, expires_at=timezone.now() + timedelta(hours=1))
    assert _client(HTTP_X_API_KEY=issued.raw_key).get(URL).status_code == 200


@pytest.mark.django_db
def test_it_rejects_a_revoked_key(owner):
    assert owner.client.get(URL).status_code == 200
    api_key = ApiKey.objects.get(account=owner.account)
    assert api_key_revoke(prefix_or_id=str(api_key.id)) == 1

    _assert_rejected(owner.client.get(URL))
    _assert_rejected(_client(HTTP_AUTHORIZATION=f"Bearer {owner.raw_key}").get(URL))


@pytest.mark.django_db
def test_it_rejects_a_bad_key_even_alongside_a_valid_bearer_key(owner):
    client = _client(HTTP_X_API_KEY="garbage", HTTP_AUTHORIZATION=f"Bearer {owner.raw_key}")
    _assert_rejected(client.get(URL))


@pytest.mark.django_db
def test_it_authenticates_the_key_owner_by_x_api_key(owner, stranger):
    mine = session_create(account=owner.account, title="mine")
    session_create(account=stranger.account, title="theirs")

    response = owner.client.get(URL)

    assert response.status_code == 200
    assert [s["id"] for s in response.json()["sessions"]] == [mine.id]


@pytest.mark.django_db
def test_it_authenticates_the_key_owner_by_bearer_api_key(owner, stranger):
    mine = session_create(account=owner.account, title="mine")
    session_create(account=stranger.account, title="theirs")

    response = _client(HTTP_AUTHORIZATION=f"Bearer {owner.raw_key}").get(URL)

    assert response.status_code == 200
    assert [s["id"] for s in response.json()["sessions"]] == [mine.id]


@pytest.mark.django_db
def test_it_rejects_keys_once_the_pepper_is_rotated(owner, settings):
    assert owner.client.get(URL).status_code == 200
    settings.API_KEY_PEPPER = "a-rotated-pepper"
    _assert_rejected(owner.client.get(URL))


# --- The key service ------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_issues_prefixed_keys_and_stores_only_their_hmac_digest(owner, settings):
    issued = api_key_issue(account=owner.account, label="ci")
    raw = issued.raw_key

    assert raw.startswith("recoup_sk_")
    assert len(raw) == len("recoup_sk_") + 32
    stored = ApiKey.objects.get(id=issued.api_key.id)
    expected = hmac.new(settings.API_KEY_PEPPER.encode(), raw.encode(), hashlib.sha256).hexdigest()
    assert stored.digest == expected
    assert stored.prefix == raw[len("recoup_sk_") :][:8]
    assert stored.label == "ci"
    assert api_key_issue(account=owner.account).raw_key != raw


def test_key_secrets_are_letters_and_digits_only():
    # A display prefix starting with "-" once made `revoke_api_key <prefix>` parse as an option.
    secrets = {generate_raw_key().removeprefix("recoup_sk_") for _ in range(2000)}

    assert len(secrets) == 2000
    assert all(len(secret) == 32 and secret.isascii() and secret.isalnum() for secret in secrets)


@pytest.mark.django_db
def test_the_raw_key_never_reaches_the_database(owner, member):
    owner.client.get(URL)
    member.client.get(URL)
    secrets = [owner.raw_key, member.raw_key]
    secret_parts = [raw[len("recoup_sk_") :] for raw in secrets]

    field_names = [f.attname for f in ApiKey._meta.concrete_fields]
    rows = list(ApiKey.objects.values_list(*field_names))
    assert len(rows) == 2
    for row in rows:
        for value in row:
            text = str(value)
            for needle in secrets + secret_parts:
                assert needle not in text


@pytest.mark.django_db
def test_it_writes_last_used_at_at_most_once_a_minute(owner, settings):
    # Every request looks the key up here; with the credential cache see test_hot_read_path.
    settings.AUTH_CACHE_SECONDS = 0
    api_key = ApiKey.objects.get(account=owner.account)
    assert api_key.last_used_at is None

    assert owner.client.get(URL).status_code == 200
    api_key.refresh_from_db()
    first_use = api_key.last_used_at
    assert first_use is not None

    assert owner.client.get(URL).status_code == 200
    api_key.refresh_from_db()
    assert api_key.last_used_at == first_use

    two_minutes_ago = timezone.now() - timedelta(minutes=2)
    ApiKey.objects.filter(id=api_key.id).update(last_used_at=two_minutes_ago)
    assert owner.client.get(URL).status_code == 200
    api_key.refresh_from_db()
    assert api_key.last_used_at > two_minutes_ago + timedelta(minutes=1)


# --- OIDC JWTs ------------------------------------------------------------------------------


def _bearer(token: str) -> APIClient:
    return _client(HTTP_AUTHORIZATION=f"Bearer {token}")


@pytest.mark.django_db
@pytest.mark.parametrize("alg", ["RS256", "ES256"])
def test_it_accepts_a_valid_jwt(alg, oidc):
    response = _bearer(oidc.token(alg=alg, sub=f"idp|{alg}", email=f"{alg}@example.com")).get(URL)

    assert response.status_code == 200, response.content
    assert response.json()["sessions"] == []
    assert Account.objects.get(oidc_subject=f"idp|{alg}").email == f"{alg.lower()}@example.com"


@pytest.mark.django_db
def test_it_creates_the_account_on_first_jwt_use_and_finds_it_by_subject_after(oidc):
    assert not Account.objects.filter(email="alice@example.com").exists()

    created = _bearer(oidc.token(sub="idp|alice", email="alice@example.com")).post(
        URL, {"title": "first"}, format="json"
    )
    assert created.status_code == 201, created.content
    account = Account.objects.get(email="alice@example.com")
    assert account.oidc_subject == "idp|alice"
    assert created.json()["session"]["userId"] == str(account.id)

    # The email claim may change at the provider; the subject is what identifies the account.
    listed = _bearer(oidc.token(sub="idp|alice", email="alice@new-domain.example")).get(URL)
    assert listed.status_code == 200
    assert [s["id"] for s in listed.json()["sessions"]] == [created.json()["session"]["id"]]
    assert Account.objects.filter(oidc_subject="idp|alice").count() == 1
    assert Account.objects.count() == 1


@pytest.mark.django_db
def test_it_rejects_a_jwt_for_a_new_subject_without_an_email(oidc):
    _assert_rejected(_bearer(oidc.token(sub="idp|nobody", email=None)).get(URL))
    assert not Account.objects.filter(oidc_subject="idp|nobody").exists()


@pytest.mark.django_db
def test_a_jwt_links_an_existing_account_only_with_a_verified_email(oidc, owner):
    unverified = oidc.token(sub="idp|mallory", email=owner.account.email)
    _assert_rejected(_bearer(unverified).get(URL))
    owner.account.refresh_from_db()
    assert owner.account.oidc_subject is None

    verified = oidc.token(
        sub="idp|owner", email=owner.account.email, extra={"email_verified": True}
    )
    assert _bearer(verified).get(URL).status_code == 200
    owner.account.refresh_from_db()
    assert owner.account.oidc_subject == "idp|owner"


@pytest.mark.django_db
def test_it_rejects_a_jwt_whose_email_claim_is_not_an_email(oidc):
    for email in ("not-an-email", "x" * 300 + "@example.com", 42):
        _assert_rejected(_bearer(oidc.token(sub=f"idp|{email!s:.20}", email=email)).get(URL))
    assert Account.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize("alg", ["RS256", "ES256"])
def test_it_rejects_an_expired_jwt(alg, oidc):
    _assert_rejected(_bearer(oidc.token(alg=alg, expires_in=-120)).get(URL))


@pytest.mark.django_db
def test_it_rejects_a_jwt_from_another_issuer(oidc):
    _assert_rejected(_bearer(oidc.token(issuer="https://evil.example.test/")).get(URL))


@pytest.mark.django_db
def test_it_rejects_a_jwt_for_another_audience(oidc):
    _assert_rejected(_bearer(oidc.token(audience="someone-else")).get(URL))


@pytest.mark.django_db
@pytest.mark.parametrize("alg", ["RS256", "ES256"])
def test_it_rejects_a_jwt_signed_by_another_key(alg, oidc):
    other = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        if alg == "RS256"
        else ec.generate_private_key(ec.SECP256R1())
    )
    _assert_rejected(_bearer(oidc.token(alg=alg, key=other)).get(URL))
    assert Account.objects.count() == 0


@pytest.mark.django_db
def test_it_rejects_a_jwt_with_an_unknown_kid(oidc):
    _assert_rejected(_bearer(oidc.token(kid="not-in-the-jwks")).get(URL))


@pytest.mark.django_db
def test_it_rejects_an_hs256_jwt_keyed_with_the_public_key(oidc):
    """The algorithm-confusion attack: HMAC 'signed' with the published RSA key."""
    public_pem = oidc.rsa_key.public_key().public_bytes(
        Encoding.PEM, PublicFormat.SubjectPublicKeyInfo
    )

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    valid_claims = json.loads(base64.urlsafe_b64decode(oidc.token().split(".")[1] + "==").decode())
    header = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": oidc.rsa_kid}).encode())
    payload = b64(json.dumps(valid_claims).encode())
    signature = hmac.new(public_pem, f"{header}.{payload}".encode(), hashlib.sha256).digest()

    _assert_rejected(_bearer(f"{header}.{payload}.{b64(signature)}").get(URL))


@pytest.mark.django_db
@pytest.mark.parametrize("unset", ["OIDC_JWKS_URL", "OIDC_ISSUER", "OIDC_AUDIENCE"])
def test_it_rejects_jwts_when_oidc_is_not_configured(unset, oidc, settings):
    token = oidc.token()
    assert _bearer(token).get(URL).status_code == 200  # the same token works when configured

    setattr(settings, unset, "")
    _assert_rejected(_bearer(token).get(URL))


@pytest.mark.django_db
def test_it_answers_every_credential_failure_with_one_message(owner, oidc):
    revoked = api_key_issue(account=owner.account)
    api_key_revoke(prefix_or_id=str(revoked.api_key.id))
    expired = api_key_issue(account=owner.account, expires_at=timezone.now() - timedelta(1))
    clients = [
        APIClient(),
        _client(HTTP_AUTHORIZATION="Basic Zm9vOmJhcg=="),
        _client(HTTP_X_API_KEY="garbage"),
        _client(HTTP_X_API_KEY=_well_formed_unknown_key()),
        _client(HTTP_X_API_KEY=revoked.raw_key),
        _client(HTTP_X_API_KEY=expired.raw_key),
        _bearer(oidc.token(expires_in=-120)),
        _bearer(oidc.token(issuer="https://evil.example.test/")),
        _bearer(oidc.token(kid="nope")),
        _bearer("not.a.jwt"),
    ]
    responses = [client.get(URL) for client in clients]

    assert {r.status_code for r in responses} == {401}
    assert {json.dumps(r.json(), sort_keys=True) for r in responses} == {
        json.dumps(GENERIC_401, sort_keys=True)
    }
    assert all(r.headers.get("WWW-Authenticate") for r in responses)
