"""/healthz and /readyz: unauthenticated probes for load balancers and compose, answered from
real connections to the database and the broker."""

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.conf import settings

from recoup.celery import app as celery_app

CLOSED_PORT_BROKER = "redis://127.0.0.1:1/0"


@contextmanager
def broker_at(url: str) -> Iterator[None]:
    """Point the Celery app's broker at `url` until the block ends.

    Celery's `conf.broker_url` prefers the CELERY_BROKER_URL environment variable (which CI
    sets) over the configured value, so the variable is lifted for the block as well.
    """
    previous_env = os.environ.pop("CELERY_BROKER_URL", None)
    previous = celery_app.conf["broker_url"]
    celery_app.conf.broker_url = url
    try:
        assert celery_app.conf.broker_write_url == url
        yield
    finally:
        celery_app.conf.broker_url = previous
        if previous_env is not None:
            os.environ["CELERY_BROKER_URL"] = previous_env


@pytest.fixture
def unreachable_broker() -> Iterator[str]:
    with broker_at(CLOSED_PORT_BROKER):
        yield CLOSED_PORT_BROKER


def test_healthz_answers_without_credentials_or_a_database(anon):
    # No django_db mark: a query here would raise, so liveness never depends on the database.
    response = anon.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_is_ready_when_the_database_and_broker_answer(anon):
    response = anon.get("/readyz")

    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/json"
    body = response.json()
    limits = body.pop("sandboxLimits")
    assert limits.startswith("enforced (cgroup v")  # v1 or v2, by host
    assert limits.endswith(f"; disk {settings.SANDBOX_DISK_MB} MB")
    assert body == {
        "status": "ok",
        "checks": {"database": "ok", "broker": "ok"},
        "broker": settings.CELERY_BROKER_URL.split("://", 1)[0],
    }


@pytest.mark.django_db
def test_readyz_is_503_with_the_broker_in_error_when_the_broker_is_unreachable(
    anon, unreachable_broker
):
    response = anon.get("/readyz")

    assert response.status_code == 503, response.content
    body = response.json()
    assert body["status"] == "error"
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["broker"].startswith("error: ")
    assert CLOSED_PORT_BROKER not in response.content.decode()  # no URL leaks to the probe
    assert anon.get("/healthz").status_code == 200  # liveness does not follow readiness


@pytest.mark.django_db
def test_readyz_reads_the_broker_configuration_at_each_call(anon):
    with broker_at(CLOSED_PORT_BROKER):
        assert anon.get("/readyz").status_code == 503

    assert anon.get("/readyz").status_code == 200
