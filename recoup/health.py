"""Liveness and readiness, without authentication, for load balancers and compose."""

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse

from recoup.celery import app as celery_app
from sandboxes_app.checks import sandbox_limits


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def readyz(request: HttpRequest) -> JsonResponse:
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means not ready
        checks["database"] = f"error: {type(exc).__name__}"
    try:
        with celery_app.connection_for_write() as conn:
            # One quick attempt: a probe must answer within its own (often 1 s) timeout.
            conn.ensure_connection(max_retries=1, interval_start=0, timeout=0.5)
        checks["broker"] = "ok"
    except Exception as exc:  # noqa: BLE001
        checks["broker"] = f"error: {type(exc).__name__}"
    ready = all(value == "ok" for value in checks.values())
    body = {
        "status": "ok" if ready else "error",
        "checks": checks,
        "broker": settings.CELERY_BROKER_URL.split("://", 1)[0],
        "sandboxLimits": sandbox_limits(),
    }
    return JsonResponse(body, status=200 if ready else 503)
