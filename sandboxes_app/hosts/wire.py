"""The provider interface's values on the wire between a caller and a sandbox host, as JSON.

Only the interface's own dataclasses are encoded and decoded, by an allowlist: a message names
a type by a key of `_TYPES`, never by an import path, so nothing a message says can make the
receiver build an arbitrary object.
"""

from __future__ import annotations

import base64
import dataclasses
from datetime import datetime
from typing import Any

from sandboxes_app.providers import base

_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        base.GitSource,
        base.SnapshotInfo,
        base.SandboxInfo,
        base.CommandResult,
        base.DetachedHooks,
        base.DetachedExit,
        base.DetachedStatus,
        base.LogRecord,
        base.FileTreeEntry,
    )
}
# A host's failure is raised again on the caller's side as the same class, so the services'
# handling (a corrupt snapshot falls back to a clone, say) works across hosts.
_ERRORS: dict[str, type[base.ProviderError]] = {
    cls.__name__: cls
    for cls in (
        base.ProviderError,
        base.SandboxNotFound,
        base.SandboxNotRunning,
        base.SnapshotMissing,
        base.SnapshotCorrupt,
    )
}


def encode(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, base.SandboxStatus):
        return {"~": "SandboxStatus", "v": value.value}
    if isinstance(value, datetime):
        return {"~": "datetime", "v": value.isoformat()}
    if isinstance(value, bytes):
        return {"~": "bytes", "v": base64.b64encode(value).decode()}
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {"~": "dict", "v": {str(k): encode(v) for k, v in value.items()}}
    name = type(value).__name__
    if _TYPES.get(name) is type(value):
        fields = {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"~": name, "v": fields}
    raise TypeError(f"{name} does not go on the wire")


def decode(value: Any) -> Any:
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    kind, inner = value.get("~"), value.get("v")
    if kind == "dict":
        return {k: decode(v) for k, v in inner.items()}
    if kind == "datetime":
        return datetime.fromisoformat(inner)
    if kind == "bytes":
        return base64.b64decode(inner)
    if kind == "SandboxStatus":
        return base.SandboxStatus(inner)
    cls = _TYPES.get(kind)
    if cls is None:
        raise ValueError(f"unknown type on the wire: {str(kind)[:40]!r}")
    return cls(**{k: decode(v) for k, v in inner.items()})


def encode_error(exc: base.ProviderError) -> dict:
    name = type(exc).__name__
    return {"type": name if name in _ERRORS else "ProviderError", "message": str(exc)}


def decode_error(error: dict) -> base.ProviderError:
    return _ERRORS.get(error.get("type"), base.ProviderError)(str(error.get("message", "")))
