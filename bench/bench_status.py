"""In-process cost of the status poll against the bare liveness view.

Prints a table of median and p99 per request, through django.test.Client (the whole middleware,
authentication and throttle stack, no socket), for `/healthz` and `GET /api/sandbox/status` on a
real session row. Runs on PostgreSQL and Redis with a database of its own, created and dropped
here; not a test.

    python bench/bench_status.py [--runs 1000]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
ADMIN_URL = os.environ.get(
    "BENCH_ADMIN_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")


def timed(client: object, path: str, params: dict, runs: int, headers: dict) -> list[float]:
    """Milliseconds per request, after a short warm-up (connections, caches, imports)."""
    for _ in range(20):
        assert client.get(path, params, **headers).status_code == 200
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        response = client.get(path, params, **headers)
        samples.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200, response.content
    return samples


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    # Under the default API_RATE_LIMIT (1200/min) so the throttle never answers 429.
    parser.add_argument("--runs", type=int, default=1000)
    args = parser.parse_args()

    db_name = f"recoup_bench_status_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{db_name}"')
    os.environ.update(
        DJANGO_SETTINGS_MODULE="recoup.settings",
        DATABASE_URL=f"{ADMIN_URL.rsplit('/', 1)[0]}/{db_name}",
        REDIS_URL=REDIS_URL,
        RECOUP_DATA_DIR=tempfile.mkdtemp(prefix="recoup-bench-status-"),
        LOG_LEVEL="WARNING",
    )
    sys.path.insert(0, str(ROOT))
    try:
        rows = run(args.runs)
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
    print(f"\n{args.runs} requests each, in-process (django.test.Client), milliseconds\n")
    print(f"| {'endpoint':<24} | {'median':>7} | {'p99':>7} |")
    print(f"| {'-' * 24} | {'-' * 7}:| {'-' * 7}:|")
    for name, samples in rows:
        print(f"| {name:<24} | {statistics.median(samples):7.2f} | {p99(samples):7.2f} |")
    base = statistics.median(rows[0][1])
    print(f"\nstatus poll / healthz (median): {statistics.median(rows[1][1]) / base:.1f}x")


def run(runs: int) -> list[tuple[str, list[float]]]:
    import django

    django.setup()
    from django.core.management import call_command
    from django.test import Client
    from django.utils import timezone

    from lifecycle.states import LifecycleState
    from recoup.accounts.services import account_get_or_create, api_key_issue
    from sessions_app.models import Session

    call_command("migrate", verbosity=0)
    account = account_get_or_create(email=f"bench-{uuid.uuid4().hex[:8]}@example.com")
    raw_key = api_key_issue(account=account, label="bench").raw_key
    now = timezone.now()
    session = Session.objects.create(
        account=account,
        title="bench",
        lifecycle_state=LifecycleState.ACTIVE,
        lifecycle_version=3,
        last_activity_at=now,
        hibernate_after=now + timedelta(hours=1),
        sandbox_expires_at=now + timedelta(hours=2),
    )
    client = Client()
    headers = {"HTTP_X_API_KEY": raw_key}
    return [
        ("GET /healthz", timed(client, "/healthz", {}, runs, {})),
        (
            "GET /api/sandbox/status",
            timed(client, "/api/sandbox/status", {"sessionId": session.id}, runs, headers),
        ),
    ]


if __name__ == "__main__":
    main()
