"""Liveness and readiness, without authentication, for load balancers and compose."""

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse

from recoup.celery import app as celery_app


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
        "sandboxLimits": _sandbox_limits(),
    }
    return JsonResponse(body, status=200 if ready else 503)


def _sandbox_limits() -> str:
    """Whether sandboxes run with their memory, process and CPU limits, for operators."""
    from sandboxes_app.providers.base import ProviderError, get_provider

    try:
        backend = getattr(get_provider(), "cgroup_backend", None)
    except ProviderError as exc:
        return f"error: {exc}"
    if backend is None:
        return "provider-managed"
    if backend.enforced:
        return backend.describe()
    return f"off: sandboxes run unlimited ({backend.describe()})"
