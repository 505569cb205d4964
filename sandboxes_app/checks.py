"""The start-up check of the processes that run sandboxes (web, worker, `manage.py up`): they
refuse to start when sandboxes could not be what the settings promise (isolated, and limited
unless SANDBOX_LIMITS=off). The migration job, which runs no sandbox, does not need it."""

from django.core.exceptions import ImproperlyConfigured


def sandbox_provider_problem() -> str | None:
    """Why sandboxes cannot run here as configured, naming the fix; None when they can."""
    from sandboxes_app.providers.base import ProviderError, get_provider

    try:
        get_provider()
    except ProviderError as exc:
        return str(exc)
    return None


def require_sandbox_provider() -> None:
    problem = sandbox_provider_problem()
    if problem is not None:
        raise ImproperlyConfigured(f"recoup cannot run sandboxes here: {problem}")


def sandbox_limits() -> str:
    """Which limits sandboxes run with, for operators (/readyz, the admin); starts with "off:"
    when they run unlimited (SANDBOX_LIMITS=off on a host that cannot enforce them)."""
    from sandboxes_app.providers.base import ProviderError, get_provider

    try:
        provider = get_provider()
    except ProviderError as exc:
        return f"error: {exc}"
    describe = getattr(provider, "describe_limits", None)
    return describe() if describe is not None else "provider-managed"
