"""Settings, all from the environment (see the README's settings table).

With nothing configured the service runs on the embedded default: SQLite and a filesystem
Celery broker under RECOUP_DATA_DIR, so one command starts it on a fresh machine.
"""

from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from recoup.env import (
    database_from_url,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_str,
    persistent_secret,
    s3_snapshot_storage,
)

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("RECOUP_DATA_DIR", str(BASE_DIR / "var"))).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = env_str("SECRET_KEY", "") or persistent_secret(DATA_DIR / "secret_key")
# The pepper for API key digests; rotating it invalidates every key, so it is its own setting.
API_KEY_PEPPER = env_str("API_KEY_PEPPER", "") or SECRET_KEY
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
# Origins (https://console.example.com) the console's forms and API calls may come from when a
# TLS proxy in front makes the browser's origin differ from what Django sees.
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "recoup",
    "recoup.accounts",
    "recoup.console",
    "sessions_app",
    "sandboxes_app",
    "lifecycle",
]

MIDDLEWARE = [
    "recoup.logging.RequestLogMiddleware",
    "recoup.middleware.TransferEncodingMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "recoup.urls"
WSGI_APPLICATION = "recoup.wsgi.application"
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = env_str("DATABASE_URL", f"sqlite:///{DATA_DIR / 'recoup.sqlite3'}")
DATABASES = {"default": database_from_url(DATABASE_URL)}
if "pool" in DATABASES["default"].get("OPTIONS", {}):
    # Connections one process keeps to PostgreSQL, shared by all its threads; web workers x
    # this (plus the worker's) must stay under the server's max_connections.
    DATABASES["default"]["OPTIONS"]["pool"]["max_size"] = env_int("DB_POOL_SIZE", 8, minimum=1)
# The status poll's statement is prepared once per pooled connection (sandboxes_app.selectors).
# Turn off behind a pooler that cannot keep prepared statements (PgBouncer before 1.21 in
# transaction mode).
DB_PREPARED_POLL = env_bool("DB_PREPARED_POLL", True)
if DB_PREPARED_POLL and "pool" in DATABASES["default"].get("OPTIONS", {}):
    # Django turns psycopg's preparing off (None), which also refuses an explicit prepare; a
    # threshold no statement reaches keeps every other query unprepared, as before.
    DATABASES["default"]["OPTIONS"]["prepare_threshold"] = 2**31 - 1
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL", "")
if REDIS_URL:
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
# No separate web server in the embedded default or compose: Django serves the admin's and
# Swagger UI's collected static files itself (they are small and cacheable).
SERVE_STATIC = env_bool("SERVE_STATIC", True)

# --- Celery -------------------------------------------------------------------------------
# The host part means nothing to the filesystem transport, but without one kombu warns on
# every message sent ("No hostname was supplied"), a second log line for such requests.
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "") or "filesystem://localhost/"
if CELERY_BROKER_URL.startswith("filesystem://"):
    _queue_dir = DATA_DIR / "broker" / "queue"
    _processed_dir = DATA_DIR / "broker" / "processed"
    # kombu otherwise writes its control (broadcast) files to ./control in the cwd.
    _control_dir = DATA_DIR / "broker" / "control"
    for _d in (_queue_dir, _processed_dir, _control_dir):
        _d.mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        "processed_folder": str(_processed_dir),
        "control_folder": str(_control_dir),
        "store_processed": False,
    }
else:
    # Redis redelivers unacked messages after the visibility timeout; hibernation of a big
    # workspace can take minutes, so the timeout is well above any task's run time.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")
CELERY_TASK_ALWAYS_EAGER = False
# The web entry (`manage.py web`): gunicorn processes and threads per process. A request waiting
# on a sandbox holds a thread (and no database connection), so threads are many.
WEB_WORKERS = env_int("WEB_WORKERS", 2, minimum=1)
WEB_THREADS = env_int("WEB_THREADS", 128, minimum=1)
# Of those, how many may wait on sandboxes (commands, provisioning) at once; past it a new wait
# answers 503 with Retry-After, so the rest stay free for other requests.
WEB_MAX_WAITING = env_int("WEB_MAX_WAITING", max(1, WEB_THREADS - 16), minimum=1)
# Event and log streams take those slots too (recoup.streams); each ends after
# STREAM_MAX_SECONDS, so threads come back, and the client reconnects with Last-Event-ID.
STREAM_MAX_SECONDS = env_int("STREAM_MAX_SECONDS", 300, minimum=1)
STREAM_KEEPALIVE_SECONDS = env_int("STREAM_KEEPALIVE_SECONDS", 15, minimum=1)
# Streams one account may hold open in one web process (past it, 429 with Retry-After), so no
# account takes every waiting slot of a process.
STREAM_MAX_PER_ACCOUNT = env_int("STREAM_MAX_PER_ACCOUNT", 8, minimum=1)
# The queue web and beat send to and the worker consumes (one deployment per queue on a shared
# broker).
CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_TASK_DEFAULT_QUEUE", "celery")
CELERY_BEAT_SCHEDULE = {
    "lifecycle-sweep": {
        "task": "lifecycle.sweep",
        "schedule": float(env_int("LIFECYCLE_SWEEP_INTERVAL", 5, minimum=1)),
    },
    "retention-sweep": {"task": "lifecycle.retention_sweep", "schedule": 24 * 3600.0},
}

# --- OIDC Bearer tokens -------------------------------------------------------------------
OIDC_JWKS_URL = env_str("OIDC_JWKS_URL", "")
OIDC_ISSUER = env_str("OIDC_ISSUER", "")
OIDC_AUDIENCE = env_str("OIDC_AUDIENCE", "")

# --- API ----------------------------------------------------------------------------------
API_RATE_LIMIT = env_str("API_RATE_LIMIT", "1200/min")
# How long a process trusts a verified API key or OIDC subject; a revoked key stops working
# within this many seconds (at once in the process that revoked it).
AUTH_CACHE_SECONDS = env_int("AUTH_CACHE_SECONDS", 5, minimum=0)
# Largest request body; a command's arguments are the only big thing a client sends.
API_MAX_BODY_BYTES = env_int("API_MAX_BODY_BYTES", 8 * 1024 * 1024, minimum=1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = API_MAX_BODY_BYTES

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "recoup.accounts.authentication.ApiKeyHeaderAuthentication",
        "recoup.accounts.authentication.BearerAuthentication",
        # The console's pages call the API with their session cookie (CSRF enforced).
        "recoup.console.auth.ConsoleSessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_THROTTLE_CLASSES": ["recoup.throttling.AccountRateThrottle"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["recoup.parsers.JSONParser"],
    "EXCEPTION_HANDLER": "recoup.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Recoup sandboxes API",
    "DESCRIPTION": (
        "Self-hostable per-session code sandboxes for LLM agents. Session-scoped endpoints "
        'answer errors as `{"status": "error", "error": "..."}`; the legacy `/api/sandboxes` '
        'answers `{"error": "..."}`. Unknown body fields are ignored; a known field with a '
        "wrong type or value is a 400 naming the field."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_ADD_EXPLICIT_BLANK_NULL_CHOICE": False,
    "SCHEMA_PATH_PREFIX": r"/api",
    # URL kwargs are snake_case in Python; the contract's path parameters are camelCase.
    "CAMELIZE_NAMES": True,
    "ENUM_NAME_OVERRIDES": {
        "SessionStatusEnum": "sessions_app.models.Session.Status",
        "LifecycleStateEnum": "lifecycle.states.LifecycleState",
        "ErrorStatusEnum": [("error", "error")],
        "SessionSandboxStatusEnum": [("active", "active"), ("no_sandbox", "no_sandbox")],
        "ProvisioningPhaseEnum": "sessions_app.models.PROVISIONING_PHASES",
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"line": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "line"},
        "null": {"class": "logging.NullHandler"},
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        # One line per request: recoup.request's. django.request still logs a 500's traceback;
        # runserver's own line per request (django.server) is dropped, and gunicorn's access
        # log stays off (manage.py web).
        "django.request": {"level": "ERROR"},
        "django.server": {"handlers": ["null"], "propagate": False},
        # One line per task: recoup.task's. Celery's "received" and "succeeded" lines, and
        # beat's "sending due task" every LIFECYCLE_SWEEP_INTERVAL, say it again; their
        # warnings and errors (a task that raised) still show.
        "celery.worker.strategy": {"level": "WARNING"},
        "celery.app.trace": {"level": "WARNING"},
        "celery.beat": {"level": "WARNING"},
    },
}

# --- Sandboxes (issue 2/4 onward) ---------------------------------------------------------
# local: this process runs sandboxes itself (the embedded default, one machine). pool: they run
# on sandbox hosts (`manage.py sandbox_host --name NAME`), reached through Celery and each
# host's internal endpoint; needs PostgreSQL, Redis and a shared snapshot storage (S3).
SANDBOX_PROVIDER = env_choice("SANDBOX_PROVIDER", "local", ("local", "pool"))
# Pool only. A host whose heartbeat (every SANDBOX_HOST_HEARTBEAT seconds) is older than
# SANDBOX_HOST_DOWN_AFTER gets no new work and, at the next sweep, is marked down.
SANDBOX_HOST_HEARTBEAT = env_int("SANDBOX_HOST_HEARTBEAT", 5, minimum=1)
SANDBOX_HOST_DOWN_AFTER = env_int("SANDBOX_HOST_DOWN_AFTER", 20, minimum=2)
# How to choose a host for a new sandbox or a resume: a dotted path to a function taking the
# live hosts (annotated with `placed`) and returning one, or None when none has room.
SANDBOX_HOST_PLACEMENT = env_str(
    "SANDBOX_HOST_PLACEMENT", "sandboxes_app.hosts.services.least_loaded"
)
# Placement stops at this many sandboxes on one host; 0: twice its memory over SANDBOX_MEMORY_MB.
SANDBOX_HOST_MAX_SANDBOXES = env_int("SANDBOX_HOST_MAX_SANDBOXES", 0, minimum=0)
# Signs calls to the hosts' internal endpoints; derived from SECRET_KEY when empty.
SANDBOX_HOST_SECRET = env_str("SANDBOX_HOST_SECRET", "")
# The longest a lifecycle call on a host (a clone, a snapshot) may take before its caller gives up.
SANDBOX_HOST_CALL_TIMEOUT = env_int("SANDBOX_HOST_CALL_TIMEOUT", 3600, minimum=10)
SANDBOX_GIT_BASE_URL = env_str("SANDBOX_GIT_BASE_URL", "https://github.com").rstrip("/")
GITHUB_TOKEN = env_str("GITHUB_TOKEN", "")
# Repository owners any account may clone with GITHUB_TOKEN (organizations add their own in the
# admin); "*" means every owner the token can read. Empty: the token serves no one by default.
GITHUB_TOKEN_OWNERS = env_list("GITHUB_TOKEN_OWNERS", [])
SANDBOX_ROOT = Path(env_str("SANDBOX_ROOT", str(DATA_DIR / "sandboxes"))).resolve()
SANDBOX_ISOLATION = env_choice("SANDBOX_ISOLATION", "bwrap", ("bwrap", "none"))
# The unprivileged user sandbox commands run as, inside the sandbox's user namespace (1-65535).
SANDBOX_UID = env_int("SANDBOX_UID", 1000, minimum=1)
SANDBOX_GID = env_int("SANDBOX_GID", SANDBOX_UID, minimum=1)
# Host ids for sandboxes: slot i maps inside ids 0-65535 onto START + i * 65536 onwards. The
# default starts past systemd's container range and ends below 2^31; no host account may be in it.
SANDBOX_ID_POOL_START = env_int("SANDBOX_ID_POOL_START", 0x70000000, minimum=65536)
SANDBOX_ID_POOL_SLOTS = env_int("SANDBOX_ID_POOL_SLOTS", 1024, minimum=1)
SANDBOX_NETWORK = env_choice("SANDBOX_NETWORK", "off", ("off", "on"))
# "off" runs sandboxes without memory/process/CPU limits where cgroups cannot enforce them
# (the service otherwise refuses to start there); /readyz says so.
SANDBOX_LIMITS = env_choice("SANDBOX_LIMITS", "on", ("on", "off"))
# Which cgroups carry the limits: v1 hierarchies, a cgroup2 mount, or whichever is complete.
SANDBOX_CGROUP = env_choice("SANDBOX_CGROUP", "auto", ("auto", "v1", "v2"))
SANDBOX_CGROUP2_ROOT = Path(env_str("SANDBOX_CGROUP2_ROOT", "/sys/fs/cgroup"))
SANDBOX_IDLE_TIMEOUT = env_int("SANDBOX_IDLE_TIMEOUT", 300, minimum=1)
SANDBOX_TIMEOUT = env_int("SANDBOX_TIMEOUT", 1800, minimum=1)
SANDBOX_EXTEND = env_int("SANDBOX_EXTEND", 1200, minimum=1)
SANDBOX_MAX_LIFETIME = env_int("SANDBOX_MAX_LIFETIME", 6 * 3600, minimum=1)
SANDBOX_COMMAND_TIMEOUT = env_int("SANDBOX_COMMAND_TIMEOUT", 60, minimum=1)
SANDBOX_COMMAND_MAX_TIMEOUT = env_int("SANDBOX_COMMAND_MAX_TIMEOUT", 600, minimum=1)
SANDBOX_OUTPUT_CAP = env_int("SANDBOX_OUTPUT_CAP", 1024 * 1024, minimum=1024)
# A detached command's log keeps its first this many bytes of output (stdout and stderr
# together), then one truncation marker; the command's output is drained past it.
SANDBOX_COMMAND_LOG_BYTES = env_int("SANDBOX_COMMAND_LOG_BYTES", 4 * 1024 * 1024, minimum=1024)
SANDBOX_MEMORY_MB = env_int("SANDBOX_MEMORY_MB", 2048, minimum=64)
SANDBOX_MAX_PROCESSES = env_int("SANDBOX_MAX_PROCESSES", 512, minimum=16)
SANDBOX_MAX_FILE_MB = env_int("SANDBOX_MAX_FILE_MB", 1024, minimum=1)
# Everything one sandbox can write (its workspace changes), on a disk of its own: a write past it
# fails with ENOSPC inside the sandbox. 0: no quota (the workspace is a dir in SANDBOX_ROOT).
SANDBOX_DISK_MB = env_int("SANDBOX_DISK_MB", 10240, minimum=0)
SANDBOX_CPU_SECONDS = env_int("SANDBOX_CPU_SECONDS", 3600, minimum=1)
# CPUs a sandbox may use at once, all its processes together (fractions allowed).
SANDBOX_CPUS = env_float("SANDBOX_CPUS", 1.0, minimum=0.01)
# Per-account quotas: live (not destroyed) sandboxes and commands running at once, over all the
# account's sessions; an organization may override both in the admin for its sessions.
SANDBOX_MAX_PER_ACCOUNT = env_int("SANDBOX_MAX_PER_ACCOUNT", 10, minimum=1)
SANDBOX_MAX_COMMANDS_PER_ACCOUNT = env_int("SANDBOX_MAX_COMMANDS_PER_ACCOUNT", 16, minimum=1)
# A lifecycle run (provision, resume, hibernate, base build) holds a lease this long, renewed
# every LIFECYCLE_HEARTBEAT seconds while it works; a dead run's lease runs out and the next
# request or sweep reclaims it.
LIFECYCLE_LEASE_SECONDS = env_int("LIFECYCLE_LEASE_SECONDS", 10, minimum=3)
LIFECYCLE_HEARTBEAT = env_float("LIFECYCLE_HEARTBEAT", 2.0, minimum=0.1)
if LIFECYCLE_HEARTBEAT * 2 > LIFECYCLE_LEASE_SECONDS:
    raise ImproperlyConfigured("LIFECYCLE_HEARTBEAT must be at most half LIFECYCLE_LEASE_SECONDS")
# How long a POST /api/sandbox that found another request provisioning waits for its result,
# before answering 503 with Retry-After.
SANDBOX_PROVISION_WAIT = env_int("SANDBOX_PROVISION_WAIT", 60, minimum=1)
LIFECYCLE_SWEEP_INTERVAL = env_int("LIFECYCLE_SWEEP_INTERVAL", 10, minimum=1)
LIFECYCLE_SWEEP_BATCH = env_int("LIFECYCLE_SWEEP_BATCH", 100, minimum=1)
# Hibernate this many seconds before sandboxExpiresAt, so expiry never outruns the snapshot.
LIFECYCLE_EXPIRY_BUFFER = env_int("LIFECYCLE_EXPIRY_BUFFER", 30, minimum=0)
LIFECYCLE_DISPATCH_GRACE = env_int("LIFECYCLE_DISPATCH_GRACE", 60, minimum=1)
BASE_SNAPSHOT_MAX_AGE = env_int("BASE_SNAPSHOT_MAX_AGE", 7 * 24 * 3600, minimum=60)
SNAPSHOT_RETENTION_DAYS = env_int("SNAPSHOT_RETENTION_DAYS", 30, minimum=1)
# Seconds between checkpoint snapshots of an active sandbox that changed since its last one
# (0: none). They bound what losing the host loses: the session resumes from its last snapshot.
SANDBOX_CHECKPOINT_INTERVAL = env_int("SANDBOX_CHECKPOINT_INTERVAL", 0, minimum=0)
SNAPSHOT_STORAGE_ROOT = Path(env_str("SNAPSHOT_STORAGE_ROOT", str(DATA_DIR / "snapshots")))
# A pool's hosts must all reach every snapshot: with a filesystem storage only when the root is
# set explicitly (a mount every host shares), never the per-machine default under the data dir.
SNAPSHOT_STORAGE_ROOT_EXPLICIT = bool(env_str("SNAPSHOT_STORAGE_ROOT", ""))
# Where snapshots are kept: "filesystem" (SNAPSHOT_STORAGE_ROOT, the embedded default) or "s3",
# a bucket of AWS S3 or any S3-compatible server (MinIO...), streamed both ways.
SNAPSHOT_STORAGE = env_choice("SNAPSHOT_STORAGE", "filesystem", ("filesystem", "s3"))
SNAPSHOT_S3_BUCKET = env_str("SNAPSHOT_S3_BUCKET", "")
SNAPSHOT_S3_ENDPOINT_URL = env_str("SNAPSHOT_S3_ENDPOINT_URL", "")
SNAPSHOT_S3_REGION = env_str("SNAPSHOT_S3_REGION", "")
SNAPSHOT_S3_PREFIX = env_str("SNAPSHOT_S3_PREFIX", "")
# Any other Django storage backend, by dotted path (it reads its own settings).
SNAPSHOT_STORAGE_BACKEND = env_str("SNAPSHOT_STORAGE_BACKEND", "")
if SNAPSHOT_STORAGE_BACKEND and SNAPSHOT_STORAGE == "s3":
    raise ImproperlyConfigured("Set SNAPSHOT_STORAGE=s3 or SNAPSHOT_STORAGE_BACKEND, not both")
if SNAPSHOT_STORAGE_BACKEND:
    _snapshots_storage = {"BACKEND": SNAPSHOT_STORAGE_BACKEND}
elif SNAPSHOT_STORAGE == "s3":
    _snapshots_storage = s3_snapshot_storage(
        bucket=SNAPSHOT_S3_BUCKET,
        endpoint_url=SNAPSHOT_S3_ENDPOINT_URL,
        region=SNAPSHOT_S3_REGION,
        prefix=SNAPSHOT_S3_PREFIX,
    )
else:
    _snapshots_storage = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        # Every tenant's workspace is in there: root's alone.
        "OPTIONS": {
            "location": str(SNAPSHOT_STORAGE_ROOT),
            "file_permissions_mode": 0o600,
            "directory_permissions_mode": 0o700,
        },
    }
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "snapshots": _snapshots_storage,
}
