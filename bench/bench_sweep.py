"""How long the lifecycle sweep takes to find due sessions as the table grows (10k vs 100k).

Prints a table; not a test. Needs PostgreSQL: it creates (and drops) its own database.

    python bench/bench_sweep.py [--sizes 10000,100000] [--runs 20]
"""

import argparse
import os
import statistics
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ADMIN_URL = os.environ.get(
    "BENCH_ADMIN_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"
)
DB_NAME = f"recoup_bench_{uuid.uuid4().hex[:8]}"


def setup_django() -> None:
    os.environ["DATABASE_URL"] = ADMIN_URL.rsplit("/", 1)[0] + f"/{DB_NAME}"
    os.environ.setdefault("RECOUP_DATA_DIR", f"/tmp/{DB_NAME}")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recoup.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def fill(total: int, due: int) -> None:
    """`total` sessions: most hibernated (the history), a few active, `due` of them overdue."""
    from django.utils import timezone

    from recoup.accounts.models import Account
    from sessions_app.models import Session

    account, _ = Account.objects.get_or_create(email="bench@example.com")
    now = timezone.now()
    have = Session.objects.count()
    rows = []
    for i in range(have, total):
        if i < due:
            state, hibernate_after = "active", now - timedelta(seconds=5)
        elif i % 50 == 0:
            state, hibernate_after = "active", now + timedelta(minutes=5)
        else:
            state, hibernate_after = "hibernated", None
        rows.append(
            Session(
                account=account,
                title=f"s{i}",
                lifecycle_state=state,
                hibernate_after=hibernate_after,
                sandbox_expires_at=hibernate_after and now + timedelta(hours=1),
            )
        )
        if len(rows) == 5000:
            Session.objects.bulk_create(rows)
            rows = []
    Session.objects.bulk_create(rows)
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE sessions_app_session")


def time_claims(runs: int, batch: int) -> tuple[list[float], str]:
    from django.db import connection

    from lifecycle.sweeps import _due_querysets, sessions_claim_due
    from sessions_app.models import Session

    samples = []
    for _ in range(runs):
        Session.objects.filter(lifecycle_dispatched_at__isnull=False).update(
            lifecycle_dispatched_at=None
        )
        start = time.perf_counter()
        claimed = sessions_claim_due(limit=batch)
        samples.append((time.perf_counter() - start) * 1000)
        assert len(claimed) == batch, len(claimed)
    from django.utils import timezone

    idle = dict(_due_querysets(timezone.now()))["idle"][:batch]
    sql, params = idle.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql, params)
        plan = " / ".join(row[0].strip() for row in cursor.fetchall()[:3])
    return samples, plan


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{DB_NAME}"')
    try:
        setup_django()
        print(f"sweep claim of {args.batch} due sessions, {args.runs} runs each\n")
        print("| sessions | median ms | p95 ms | idle lookup plan |")
        print("| ---: | ---: | ---: | --- |")
        for size in (int(s) for s in args.sizes.split(",")):
            fill(size, due=args.batch)
            samples, plan = time_claims(args.runs, args.batch)
            p95 = sorted(samples)[max(0, int(len(samples) * 0.95) - 1)]
            print(f"| {size:,} | {statistics.median(samples):.2f} | {p95:.2f} | {plan[:90]} |")
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}"')


if __name__ == "__main__":
    main()
