"""The pieces bench_fairness.py and bench_poll.py share: the production web entry (`manage.py
web`) on PostgreSQL and Redis with a database of its own, a local origin, and API keys."""

import os
import signal
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
from bench_http import ADMIN_URL, clean_up, free_port  # noqa: E402


def make_origin(base: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1"}
    identity = ["-c", "user.name=Bench", "-c", "user.email=bench@example.com"]
    work = base / "work"
    work.mkdir(parents=True)
    (work / "README.md").write_text("# app\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], [*identity, "commit", "-qm", "x"]):
        subprocess.run(["git", *args], cwd=work, env=env, check=True, capture_output=True)
    subprocess.run(
        ["git", "clone", "-q", "--bare", str(work), str(base / "bench" / "app.git")],
        env=env,
        check=True,
        capture_output=True,
    )


class WebService:
    """`manage.py web` plus a Celery worker, on a database created here and dropped on exit."""

    def __init__(
        self, *, extra_env: dict[str, str] | None = None, database_url: str | None = None
    ) -> None:
        """`database_url`: an existing database to migrate and use (kept afterwards) instead
        of one created here."""
        self.db_name = f"recoup_bench_web_{uuid.uuid4().hex[:8]}"
        self.own_db = database_url is None
        self.db_url = database_url or ADMIN_URL.rsplit("/", 1)[0] + f"/{self.db_name}"
        self.data_dir = tempfile.mkdtemp(prefix="recoup-bench-web-")
        origins = Path(self.data_dir) / "origins"
        make_origin(origins)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "DATABASE_URL": self.db_url,
            "RECOUP_DATA_DIR": self.data_dir,
            "REDIS_URL": "redis://127.0.0.1:6379/0",
            "CELERY_BROKER_URL": f"redis://127.0.0.1:6379/{os.environ.get('BENCH_REDIS_DB', 3)}",
            "SANDBOX_GIT_BASE_URL": f"file://{origins}",
            **(extra_env or {}),
        }
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

    def __enter__(self) -> "WebService":
        if self.own_db:
            with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{self.db_name}"')
        self.manage("migrate", "--noinput")
        log = open(Path(self.data_dir) / "service.log", "ab")  # noqa: SIM115
        self.procs = [
            subprocess.Popen(
                [sys.executable, "manage.py", "web", "--bind", f"127.0.0.1:{self.port}"],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=log,
            ),
            subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "recoup", "worker", "--loglevel", "WARNING"],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=log,
            ),
        ]
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{self.base}/readyz", timeout=5).status_code == 200:
                    return self
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the service did not become ready")
            time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            proc.wait(timeout=60)
        clean_up(
            env=self.env, data_dir=self.data_dir, db_name=self.db_name if self.own_db else None
        )

    def api_key(self, email: str) -> str:
        return self.manage("create_api_key", "--email", email).strip().splitlines()[-1]

    def api_keys(self, emails: list[str]) -> list[str]:
        """A key for each address, from one process (a `create_api_key` each takes a second)."""
        code = (
            "from recoup.accounts.services import account_get_or_create, api_key_issue\n"
            f"for email in {emails!r}:\n"
            "    account = account_get_or_create(email=email)\n"
            "    print(api_key_issue(account=account, label='bench').raw_key)\n"
        )
        return self.manage("shell", "-c", code).split()[-len(emails) :]

    def session(self, key: str, *, sandbox: bool) -> str:
        headers = {"x-api-key": key}
        created = requests.post(f"{self.base}/api/sessions", json={}, headers=headers, timeout=30)
        session_id = created.json()["session"]["id"]
        if sandbox:
            body = {"repoUrl": "https://github.com/bench/app", "sessionId": session_id}
            ready = requests.post(
                f"{self.base}/api/sandbox", json=body, headers=headers, timeout=120
            )
            ready.raise_for_status()
        return session_id


def process_tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of `pid` and its children (gunicorn's master and workers), so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(entry.name) == pid or int(fields[1]) == pid:
            total += int(fields[11]) + int(fields[12])
    return total / tick


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]
