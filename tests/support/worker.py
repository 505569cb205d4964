"""A real Celery worker process for tests, on the test database and its own queue."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from django.db import connection

from recoup.celery import app as celery_app

ROOT = Path(__file__).resolve().parents[2]


def test_database_url() -> str:
    """The URL of the database this test process is using (pytest-django's test database)."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


class Worker:
    """`celery worker --pool solo` in a subprocess: one process, so SIGKILL kills the task."""

    def __init__(self, env: dict[str, str], log_path: Path, queue: str | None = None) -> None:
        self.queue = queue or f"test-{uuid.uuid4().hex[:12]}"
        # What the worker itself enqueues (the sweep's recoveries) goes to its own queue too.
        self.env = {
            **os.environ,
            "DATABASE_URL": test_database_url(),
            "CELERY_TASK_DEFAULT_QUEUE": self.queue,
            **env,
        }
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self.default_queue = celery_app.conf.task_default_queue
        celery_app.conf.task_default_queue = self.queue

    def start(self, **extra_env: str) -> "Worker":
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "recoup",
                "worker",
                "--pool",
                "solo",
                "-Q",
                self.queue,
                "--loglevel",
                "INFO",
                "-n",
                f"{self.queue}@%h",
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
            ],
            cwd=ROOT,
            env={**self.env, **extra_env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        return self

    def kill(self) -> None:
        kill_process(self.process)

    def wait_exit(self, timeout: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        stop_process(self.process)

    def release_queue(self) -> None:
        """Send later tests' tasks to the default queue again, not to this stopped worker's."""
        celery_app.conf.task_default_queue = self.default_queue

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def kill_process(process: subprocess.Popen | None) -> None:
    """SIGKILL a child that is still running, and reap it."""
    if process and process.poll() is None:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)


def stop_process(process: subprocess.Popen | None, *, grace: float = 15) -> None:
    """SIGTERM a child that is still running; SIGKILL it if it has not exited within `grace`."""
    if process and process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            kill_process(process)


def wait_for(predicate, *, timeout: float, interval: float = 0.1, message: str = ""):
    """Poll `predicate` until it returns a truthy value; fail with `message` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s: {message}")
        time.sleep(interval)
