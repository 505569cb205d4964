"""Schemathesis against the served schema: every operation, authenticated, must neither fail
with a server error nor answer outside its published schema, whatever the input."""

import os
from collections.abc import Iterator

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from recoup.accounts.services import account_get_or_create, api_key_issue
from recoup.wsgi import application

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)


@pytest.fixture
def api_key(db, tmp_path, settings) -> Iterator[str]:
    # Clones go to an empty directory: a valid-looking repository fails fast with a 502.
    settings.SANDBOX_GIT_BASE_URL = f"file://{tmp_path}/no-origins"
    settings.API_RATE_LIMIT = "100000/min"
    # As Django's test client does: requests served inside the test's transaction must not
    # close its connection.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield api_key_issue(account=account_get_or_create(email="fuzz@example.com")).raw_key
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@schema.parametrize()
@settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)
def test_no_input_produces_a_server_error_or_an_undocumented_answer(case, api_key):
    case.call_and_validate(
        headers={"x-api-key": api_key},
        checks=[not_a_server_error, status_code_conformance, response_schema_conformance],
    )
