"""Latency from a lifecycle transition to the clients of GET /api/sandbox/events, through the
real web server (`manage.py web`, gunicorn gthread), on both buses: Redis pub/sub and the
embedded Unix datagram sockets.

This process makes real transitions (lifecycle.transitions: the compare-and-set, the
LifecycleEvent row, the publish once it commits) on one session, cycling active -> hibernating
-> hibernated -> restoring -> active; N clients follow the session's stream over HTTP. The
latency of an event at a client runs from just before the transition is called (its own write
and commit included) to the moment the client has parsed the event. Prints a table; not a test.
Runs on PostgreSQL with a database of its own, created and dropped here (or BENCH_DATABASE_URL,
migrated and left in place).

    python bench/bench_events.py [--events 100] [--clients 1,50] [--buses redis,embedded]
"""

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psycopg
import requests

ROOT = Path(__file__).resolve().parents[1]
ADMIN_URL = os.environ.get(
    "BENCH_ADMIN_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")
CYCLE = [
    ("hibernating", "idle"),
    ("hibernated", "hibernated"),
    ("restoring", "resume"),
    ("active", "ready_resume"),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_web(env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    web = subprocess.Popen(
        [sys.executable, "manage.py", "web", "--bind", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=open(log, "ab"),  # noqa: SIM115 - handed to the child
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{base}/healthz", timeout=5).status_code == 200:
                return web, base
        except requests.ConnectionError:
            time.sleep(0.2)
    web.kill()
    raise RuntimeError(f"web did not come up; see {log}")


class Follower(threading.Thread):
    """One events client: records when each transition (by version) reached it."""

    def __init__(self, url: str, params: dict, headers: dict) -> None:
        super().__init__(daemon=True)
        self.url, self.params, self.headers = url, params, headers
        self.ready = threading.Event()
        self.received: dict[int, float] = {}
        self.response: requests.Response | None = None

    def run(self) -> None:
        self.response = requests.get(
            self.url, params=self.params, headers=self.headers, stream=True, timeout=60
        )
        self.response.raise_for_status()
        buffer = b""
        try:
            for chunk in self.response.iter_content(chunk_size=None):
                buffer += chunk
                while b"\n\n" in buffer:
                    block, buffer = buffer.split(b"\n\n", 1)
                    now = time.monotonic()
                    lines = block.decode().split("\n")
                    if "event: state" in lines:
                        self.ready.set()
                    elif "event: transition" in lines:
                        version = next(int(x[4:]) for x in lines if x.startswith("id: "))
                        self.received[version] = now
        except (requests.RequestException, AttributeError, ValueError):
            return  # closed by `hang_up`

    def hang_up(self) -> None:
        if self.response is not None:
            self.response.close()


def measure(base: str, raw_key: str, session_id: str, *, events: int, clients: int) -> dict:
    from lifecycle.transitions import Seen, transition
    from sessions_app.models import Session

    params, headers = {"sessionId": session_id}, {"x-api-key": raw_key}
    followers = [Follower(f"{base}/api/sandbox/events", params, headers) for _ in range(clients)]
    for follower in followers:
        follower.start()
    for follower in followers:
        if not follower.ready.wait(30):
            raise RuntimeError("a client never got its first event")
    latencies, writes = [], []
    for n in range(events):
        to, reason = CYCLE[n % len(CYCLE)]
        session = Session.objects.get(id=session_id)
        started = time.monotonic()
        moved = transition(
            session_id=session_id, seen=Seen.of(session), to=to, reason=reason, actor="bench"
        )
        writes.append((time.monotonic() - started) * 1000)
        version = moved.lifecycle_version
        deadline = time.monotonic() + 5
        while any(version not in f.received for f in followers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"version {version} never reached every client")
            time.sleep(0.0005)
        latencies += [(f.received[version] - started) * 1000 for f in followers]
        time.sleep(0.02)
    for follower in followers:
        follower.hang_up()
    return {"latencies": latencies, "writes": writes}


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[98]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--clients", default="1,50")
    parser.add_argument("--buses", default="redis,embedded")
    args = parser.parse_args()

    own_db = "BENCH_DATABASE_URL" not in os.environ
    db_name = f"recoup_bench_events_{uuid.uuid4().hex[:8]}"
    db_url = os.environ.get("BENCH_DATABASE_URL") or f"{ADMIN_URL.rsplit('/', 1)[0]}/{db_name}"
    if own_db:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{db_name}"')
    data_dir = Path(tempfile.mkdtemp(prefix="recoup-bench-events-"))
    os.environ.update(
        DJANGO_SETTINGS_MODULE="recoup.settings",
        DATABASE_URL=db_url,
        REDIS_URL=REDIS_URL,
        RECOUP_DATA_DIR=str(data_dir),
        LOG_LEVEL="WARNING",
    )
    sys.path.insert(0, str(ROOT))
    rows = []
    try:
        rows = run(args, data_dir)
    finally:
        from django.db import connections

        connections.close_all()
        subprocess.run(["rm", "-rf", str(data_dir)], check=False)
        if own_db:
            with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
    print(
        f"\nTransition -> events client over HTTP (manage.py web), {args.events} transitions "
        "per row, milliseconds\n"
    )
    print("| bus | clients | samples | p50 | p99 | max | transition's own write p50 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for bus, clients, result in rows:
        lat, writes = result["latencies"], result["writes"]
        print(
            f"| {bus} | {clients} | {len(lat)} | {statistics.median(lat):.1f} | "
            f"{p99(lat):.1f} | {max(lat):.1f} | {statistics.median(writes):.1f} |"
        )
    print("\ngoal: p99 <= 50 ms")


def run(args: argparse.Namespace, data_dir: Path) -> list:
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from lifecycle.states import LifecycleState
    from recoup.accounts.services import account_get_or_create, api_key_issue
    from sessions_app.models import Session

    call_command("migrate", verbosity=0)
    account = account_get_or_create(email=f"bench-{uuid.uuid4().hex[:8]}@example.com")
    raw_key = api_key_issue(account=account, label="bench").raw_key
    rows = []
    for bus in args.buses.split(","):
        # The embedded bus's sockets live under the data dir this process shares with web.
        settings.REDIS_URL = REDIS_URL if bus == "redis" else ""
        env = {
            **os.environ,
            "REDIS_URL": settings.REDIS_URL,
            "API_RATE_LIMIT": "100000/min",
            "STREAM_MAX_SECONDS": "3600",
            # A client that hung up is noticed at the next keep-alive: web stops quickly.
            "STREAM_KEEPALIVE_SECONDS": "1",
        }
        web, base = start_web(env, data_dir / f"web-{bus}.log")
        try:
            for clients in [int(c) for c in args.clients.split(",")]:
                session = Session.objects.create(
                    account=account, title="bench", lifecycle_state=LifecycleState.ACTIVE
                )
                result = measure(base, raw_key, session.id, events=args.events, clients=clients)
                rows.append((bus, clients, result))
        finally:
            web.send_signal(signal.SIGTERM)
            web.wait(timeout=30)
    return rows


if __name__ == "__main__":
    main()
