"""Small typed readers for settings from the environment.

Each reader fails loudly (ImproperlyConfigured naming the variable) on a malformed value, so a
typo in a deployment stops the process at start-up instead of silently using a default.
"""

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false/1/0), got {raw!r}")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {value}")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from None
    if value != value or (minimum is not None and value < minimum):  # NaN, or too small
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {raw!r}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = os.environ.get(name, default).strip()
    if value not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def database_from_url(url: str) -> dict:
    """Turn `postgres://user:pass@host:port/name` or `sqlite:///path` into a DATABASES entry."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = unquote(parts.path)
        if parts.netloc or not path:
            raise ImproperlyConfigured(
                "DATABASE_URL sqlite form is sqlite:///relative or sqlite:////absolute, "
                f"got {url!r}"
            )
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": path[1:] if path.startswith("/") else path,
            "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE"},
        }
    if parts.scheme in ("postgres", "postgresql", "pgsql"):
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise ImproperlyConfigured(f"DATABASE_URL must name a database, got {url!r}")
        try:
            port = parts.port
        except ValueError:
            raise ImproperlyConfigured(f"DATABASE_URL has a bad port: {url!r}") from None
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(port or ""),
            # A pool per process, not a connection per thread: the web entry runs many threads
            # (most of them waiting on sandboxes, holding no connection), and PostgreSQL's
            # connection limit must bound what they take together (see settings DB_POOL_SIZE).
            "CONN_MAX_AGE": 0,
            "OPTIONS": {"pool": {"min_size": 1, "max_size": 8, "timeout": 30}},
        }
    raise ImproperlyConfigured(
        f"DATABASE_URL scheme must be postgres:// or sqlite://, got {parts.scheme!r}"
    )


def s3_snapshot_storage(*, bucket: str, endpoint_url: str, region: str, prefix: str) -> dict:
    """The STORAGES entry for snapshots in an S3 bucket (django-storages' S3Storage).

    Credentials are not settings: boto3 finds them itself (AWS_ACCESS_KEY_ID and
    AWS_SECRET_ACCESS_KEY, a profile, or the instance's role).
    """
    if not bucket:
        raise ImproperlyConfigured("SNAPSHOT_STORAGE=s3 needs SNAPSHOT_S3_BUCKET")
    if endpoint_url and urlsplit(endpoint_url).scheme not in ("http", "https"):
        raise ImproperlyConfigured(
            f"SNAPSHOT_S3_ENDPOINT_URL must be an http(s):// URL, got {endpoint_url!r}"
        )
    return {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": bucket,
            "endpoint_url": endpoint_url or None,
            "region_name": region or None,
            "location": prefix.strip("/"),
            # S3-compatible servers (MinIO...) answer at one host, not one per bucket.
            "addressing_style": "path" if endpoint_url else None,
            # Keys are unique per snapshot; the bucket's own policy decides who may read.
            "file_overwrite": True,
            "default_acl": None,
        },
    }


def persistent_secret(path: Path) -> str:
    """Read a generated secret from the data dir, creating it on first start.

    The embedded default has no SECRET_KEY configured; a per-process random key would
    invalidate every API key on restart, so one is generated once and kept.
    """
    import secrets

    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        # Write then hard-link so concurrent first starts agree on one secret, never a partial file.
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(secrets.token_urlsafe(50))
        os.chmod(tmp, 0o600)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_text().strip()
