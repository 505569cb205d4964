"""A sandbox host's side of a call: run one provider method on this host's local provider.

Two doors lead here, each to its own allowlist of methods: the host's Celery queue for the
lifecycle (slow, may take minutes) and the host-internal endpoint for interactive calls
(commands, probes, logs), which must answer in milliseconds. Nothing else of the provider, and
no other attribute, can be reached by naming it in a message.
"""

from __future__ import annotations

import logging
from typing import Any

from sandboxes_app.hosts.wire import decode, encode, encode_error
from sandboxes_app.providers.base import ProviderError, SandboxProvider

logger = logging.getLogger("recoup.hosts")

LIFECYCLE_METHODS = frozenset({"create", "resume", "snapshot", "build_base", "stop", "destroy"})
INTERACTIVE_METHODS = frozenset(
    {
        "run",
        "start_detached",
        "detached_status",
        "detached_log",
        "detached_log_offset_valid",
        "detached_kill",
        "running_commands",
        "probe",
        "status",
    }
)

_provider: SandboxProvider | None = None


def host_provider_set(provider: SandboxProvider) -> None:
    """Called once by `manage.py sandbox_host`: this process serves calls with `provider`."""
    global _provider
    _provider = provider


def _progress(spec: Any):
    """A create's or resume's progress reports, written from this host as the caller would
    (one narrow update fenced by the caller's lease, then the bus)."""
    if not isinstance(spec, dict):
        return None
    from lifecycle.progress import ProvisioningProgress

    return ProvisioningProgress(
        session_id=str(spec["session_id"]), run_id=str(spec["run_id"]), version=int(spec["version"])
    )


def host_dispatch(*, method: str, kwargs: dict, allowed: frozenset[str]) -> dict:
    """{"ok": result} or {"error": {"type", "message"}}, both ready for the wire."""
    if _provider is None:
        # A worker that is not a sandbox host took a host's message: a routing mistake.
        return {"error": {"type": "ProviderError", "message": "this process is no sandbox host"}}
    if method not in allowed or not isinstance(kwargs, dict):
        return {"error": {"type": "ProviderError", "message": f"{method!r} is not a host call"}}
    try:
        args = {str(k): decode(v) for k, v in kwargs.items()}
        if "progress" in args:
            args["progress"] = _progress(args["progress"])
        result = getattr(_provider, method)(**args)
    except ProviderError as exc:
        return {"error": encode_error(exc)}
    except Exception:  # noqa: BLE001 - the caller gets an error, the host's log the trace
        logger.exception("host call %s failed", method)
        return {"error": {"type": "ProviderError", "message": f"the sandbox host failed {method}"}}
    return {"ok": encode(result)}
