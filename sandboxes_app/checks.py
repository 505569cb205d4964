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
