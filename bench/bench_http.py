"""End to end over HTTP: `timing.readyMs` of POST /api/sandbox for a cold create, a create from
the organization's base snapshot, and a resume of 10 MB of changes, on the 100 MB repository.

Prints a table; not a test. Runs the real service (gunicorn + Celery worker) on PostgreSQL and
Redis with a database of its own, created and dropped here.

    python bench/bench_http.py [--size-mb 100] [--runs 3]
"""

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from bench_provider import ORIGINS, make_origin  # noqa: E402

ADMIN_URL = os.environ.get(
    "BENCH_ADMIN_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


DESTROY_ALL_SANDBOXES = """
from django.conf import settings
from sandboxes_app.providers.base import get_provider
provider = get_provider()
for path in settings.SANDBOX_ROOT.iterdir():
    if not path.name.startswith("_"):
        provider.destroy(name=path.name)
"""


class Service:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []

    def manage(self, *args: str) -> str:
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    def start(self) -> None:
        self.manage("migrate", "--noinput")
        log = open(Path(self.env["RECOUP_DATA_DIR"]) / "service.log", "ab")  # noqa: SIM115
        self.procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gunicorn",
                    "recoup.wsgi:application",
                    "--bind",
                    f"127.0.0.1:{self.port}",
                    "--workers",
                    "2",
                    "--threads",
                    "4",
                    "--timeout",
                    "600",
                ],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=log,
            ),
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "recoup",
                    "worker",
                    "--concurrency",
                    "2",
                    "--loglevel",
                    "WARNING",
                ],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=log,
            ),
        ]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{self.base}/readyz", timeout=5).status_code == 200:
                    return
            except requests.ConnectionError:
                time.sleep(0.2)
        raise RuntimeError("service did not become ready")

    def stop(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            proc.wait(timeout=30)


def post(service: Service, key: str, path: str, body: dict) -> dict:
    response = requests.post(
        f"{service.base}{path}", json=body, headers={"x-api-key": key}, timeout=600
    )
    response.raise_for_status()
    return response.json()


def wait_until(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError
        time.sleep(0.2)


def one_run(service: Service, db_url: str, repo: str) -> dict[str, float]:
    org = f"bench-{uuid.uuid4().hex[:8]}"
    key = (
        service.manage("create_api_key", "--email", f"{org}@example.com", "--org", org)
        .strip()
        .splitlines()[-1]
    )
    with psycopg.connect(db_url) as conn:
        org_id = str(
            conn.execute("SELECT id FROM accounts_organization WHERE slug=%s", (org,)).fetchone()[0]
        )

    def session() -> str:
        return post(service, key, "/api/sessions", {"organizationId": org_id})["session"]["id"]

    cold = post(service, key, "/api/sandbox", {"repoUrl": repo, "sessionId": session()})

    def base_ready() -> bool:
        with psycopg.connect(db_url) as conn:
            row = conn.execute(
                "SELECT status FROM lifecycle_basesnapshotbuild WHERE scope=%s", (f"org:{org_id}",)
            ).fetchone()
        return bool(row and row[0] == "succeeded")

    wait_until(base_ready, timeout=600)
    second = session()
    from_base = post(service, key, "/api/sandbox", {"repoUrl": repo, "sessionId": second})
    post(
        service,
        key,
        "/api/sandbox/commands",
        {
            "sessionId": second,
            "cmd": "sh",
            "args": ["-c", "head -c 10485760 /dev/urandom > changes.bin"],
        },
    )
    post(service, key, "/api/sandbox/hibernate", {"sessionId": second})

    def hibernated() -> bool:
        status = requests.get(
            f"{service.base}/api/sandbox/status",
            params={"sessionId": second},
            headers={"x-api-key": key},
            timeout=10,
        ).json()
        return status["lifecycle"]["state"] == "hibernated"

    wait_until(hibernated, timeout=300)
    resumed = post(service, key, "/api/sandbox", {"repoUrl": repo, "sessionId": second})
    return {
        "cold create": cold["timing"]["readyMs"],
        "create from org base": from_base["timing"]["readyMs"],
        "resume (10 MB changed)": resumed["timing"]["readyMs"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    make_origin(args.size_mb)
    db_name = f"recoup_bench_http_{uuid.uuid4().hex[:8]}"
    db_url = ADMIN_URL.rsplit("/", 1)[0] + f"/{db_name}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db_name}"')
    data_dir = tempfile.mkdtemp(prefix="recoup-bench-http-")
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "RECOUP_DATA_DIR": data_dir,
        "REDIS_URL": "redis://127.0.0.1:6379/0",
        "CELERY_BROKER_URL": f"redis://127.0.0.1:6379/{os.environ.get('BENCH_REDIS_DB', 3)}",
        "SANDBOX_GIT_BASE_URL": f"file://{ORIGINS}",
        "API_RATE_LIMIT": "100000/min",
    }
    service = Service(env)
    try:
        service.start()
        repo = f"https://github.com/bench/repo{args.size_mb}mb"
        results: dict[str, list[float]] = {}
        for _ in range(args.runs):
            for name, value in one_run(service, db_url, repo).items():
                results.setdefault(name, []).append(value)
        print(
            f"\nPOST /api/sandbox timing.readyMs over HTTP, {args.size_mb} MB repository, "
            f"{args.runs} runs\n"
        )
        print("| operation | median ms | max ms |")
        print("| --- | ---: | ---: |")
        for name, values in results.items():
            print(f"| {name} | {statistics.median(values):.0f} | {max(values):.0f} |")
    finally:
        service.stop()
        clean_up(env=env, data_dir=data_dir, db_name=db_name)


def clean_up(*, env: dict[str, str], data_dir: str, db_name: str | None) -> None:
    """After a bench's processes stopped: its sandboxes, its data dir, its database (if any)."""
    # The sandboxes outlive the service's processes: stop their inits and remove their
    # cgroups through the provider before their directory goes.
    subprocess.run(
        [sys.executable, "manage.py", "shell", "--no-imports", "-c", DESTROY_ALL_SANDBOXES],
        cwd=ROOT,
        env=env,
        check=False,
    )
    subprocess.run(["rm", "-rf", data_dir], check=False)
    if db_name is not None:
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
