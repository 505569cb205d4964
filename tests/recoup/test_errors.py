"""Every error, DRF's own included, answers the contract's envelope."""

import json

import pytest
from django.core.exceptions import PermissionDenied
from django.http import Http404
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from recoup.throttling import AccountRateThrottle


def _assert_envelope(response, status: int) -> str:
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"status", "error"}
    assert body["status"] == "error"
    assert isinstance(body["error"], str) and body["error"]
    return body["error"]


@pytest.mark.django_db
def test_it_answers_unparseable_json_with_a_400_envelope(owner):
    response = owner.client.generic(
        "POST", "/api/sessions", '{"title": "unterminated', content_type="application/json"
    )
    assert "JSON parse error" in _assert_envelope(response, 400)


@pytest.mark.django_db
def test_it_answers_an_unsupported_content_type_with_a_415_envelope(owner):
    response = owner.client.generic(
        "POST", "/api/sessions", "title=x", content_type="application/x-www-form-urlencoded"
    )
    _assert_envelope(response, 415)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "method, path", [("DELETE", "/api/sessions"), ("PUT", "/api/sessions/some-id")]
)
def test_it_answers_a_wrong_method_with_a_405_envelope(method, path, owner):
    response = owner.client.generic(method, path)
    assert method in _assert_envelope(response, 405)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path", ["/api/nope", "/api/sessions/abc/extra", "/api/sessions/", "/api/"]
)
def test_it_answers_an_unknown_api_path_with_a_404_envelope(path, owner):
    response = owner.client.get(path)
    assert path in _assert_envelope(response, 404)


# --- Throttling -----------------------------------------------------------------------------


def _throttle_key(account) -> str:
    # Only this account's counter: a flush of the shared cache would race other test workers.
    return AccountRateThrottle.cache_format % {"scope": "user", "ident": account.pk}


@pytest.fixture
def tight_rate_limit(settings, owner, stranger):
    from django.core.cache import cache

    keys = [_throttle_key(owner.account), _throttle_key(stranger.account)]
    cache.delete_many(keys)
    settings.API_RATE_LIMIT = "2/min"
    yield
    cache.delete_many(keys)


@pytest.mark.django_db
def test_it_throttles_an_account_over_its_rate_with_a_429_envelope(tight_rate_limit, owner):
    assert owner.client.get("/api/sessions").status_code == 200
    assert owner.client.get("/api/sessions").status_code == 200

    response = owner.client.get("/api/sessions")

    _assert_envelope(response, 429)
    retry_after = int(response["Retry-After"])
    assert 0 < retry_after <= 60


@pytest.mark.django_db
def test_it_throttles_each_account_separately(tight_rate_limit, owner, stranger):
    for _ in range(2):
        owner.client.get("/api/sessions")
    assert owner.client.get("/api/sessions").status_code == 429
    assert stranger.client.get("/api/sessions").status_code == 200


@pytest.mark.django_db
def test_it_reads_the_rate_limit_per_request(tight_rate_limit, owner, settings):
    for _ in range(2):
        owner.client.get("/api/sessions")
    assert owner.client.get("/api/sessions").status_code == 429

    settings.API_RATE_LIMIT = "100/min"
    assert owner.client.get("/api/sessions").status_code == 200


# --- The handler itself, on real views ------------------------------------------------------


class _Open(APIView):
    authentication_classes: list = []
    permission_classes: list = []
    throttle_classes: list = []


class ExplodingView(_Open):
    def get(self, request: Request) -> Response:
        raise RuntimeError("database password is hunter2")


class LegacyExplodingView(ExplodingView):
    error_envelope = "legacy"


class DjangoErrorsView(_Open):
    def get(self, request: Request) -> Response:
        if request.query_params.get("kind") == "404":
            raise Http404("secret path detail")
        raise PermissionDenied("secret permission detail")


def _call(view: type[APIView], query: str = "") -> Response:
    request = APIRequestFactory().get(f"/whatever{query}")
    response = view.as_view()(request)
    response.render()
    return response


def test_it_answers_an_unhandled_exception_with_a_500_envelope_without_its_message():
    response = _call(ExplodingView)

    assert response.status_code == 500
    assert response.data == {"status": "error", "error": "Internal server error"}
    assert b"hunter2" not in response.content


def test_it_answers_the_legacy_envelope_on_views_that_ask_for_it():
    response = _call(LegacyExplodingView)

    assert response.status_code == 500
    assert response.data == {"error": "Internal server error"}


@pytest.mark.parametrize("kind, status", [("404", 404), ("403", 403)])
def test_it_maps_djangos_own_errors_to_the_envelope(kind, status):
    response = _call(DjangoErrorsView, f"?kind={kind}")

    assert response.status_code == status
    assert set(response.data) == {"status", "error"}
    assert response.data["status"] == "error"
    assert b"secret" not in response.content


@pytest.mark.django_db
def test_a_body_over_the_limit_is_a_413_in_the_envelope(owner, settings):
    settings.API_MAX_BODY_BYTES = settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2048
    body = json.dumps({"sessionId": "x", "cmd": "echo", "args": ["a" * 4096]})

    response = owner.client.post("/api/sandbox/commands", body, content_type="application/json")

    assert response.status_code == 413
    assert response.json() == {
        "status": "error",
        "error": "Request body too large (see API_MAX_BODY_BYTES)",
    }
