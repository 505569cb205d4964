"""Stopping `manage.py up`: sandboxes keep running for the next start, which adopts them, or,
with --hibernate-on-exit, are all hibernated first and resume on the next start."""

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.recoup.test_embedded_default import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


class Up:
    """`manage.py up` on the embedded default, in a data dir of the test's."""

    def __init__(self, data: Path, git_base_url: str, *flags: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL", "SECRET_KEY")
        }
        env.update(RECOUP_DATA_DIR=str(data), SANDBOX_GIT_BASE_URL=git_base_url)
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "up", "--port", str(self.port), *flags],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.key = self._key()
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{self.base}/readyz", timeout=30).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, "never ready"
            time.sleep(0.2)

    def _key(self) -> str:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            assert line or self.process.poll() is None, "manage.py up exited early"
            found = re.search(r"API key \(shown once\): (recoup_sk_\S+)", line)
            if found:
                return found.group(1)
        raise AssertionError("no API key printed")

    def post(self, path: str, body: dict) -> requests.Response:
        return requests.post(
            f"{self.base}{path}", json=body, headers={"x-api-key": self.key}, timeout=120
        )

    def sh(self, session_id: str, script: str) -> dict:
        body = {"sessionId": session_id, "cmd": "sh", "args": ["-c", script]}
        response = self.post("/api/sandbox/commands", body)
        assert response.status_code == 200, response.text
        return response.json()

    def stop(self) -> str:
        self.process.send_signal(signal.SIGTERM)
        out, _ = self.process.communicate(timeout=120)
        return out


def lifecycle_state(data: Path, session_id: str) -> str:
    with sqlite3.connect(data / "recoup.sqlite3") as db:
        row = db.execute(
            "SELECT lifecycle_state FROM sessions_app_session WHERE id = ?", (session_id,)
        ).fetchone()
    return row[0]


def test_stopping_keeps_sandboxes_for_the_next_start_or_hibernates_them_all(
    tmp_path, origins, repo_url
):
    data = tmp_path / "data"
    first = Up(data, origins.base_url)
    try:
        session_id = first.post("/api/sessions", {"title": "kept"}).json()["session"]["id"]
        body = {"repoUrl": repo_url, "sessionId": session_id}
        assert first.post("/api/sandbox", body).status_code == 200
        first.sh(session_id, "echo draft > notes.txt")
    finally:
        first.stop()
    sandbox_dirs = [p for p in (data / "sandboxes").iterdir() if not p.name.startswith("_")]
    assert len(sandbox_dirs) == 1 and (sandbox_dirs[0] / "init.json").exists()
    assert lifecycle_state(data, session_id) == "active"

    # The next start adopts the running sandbox: same workspace, nothing resumed.
    second = Up(data, origins.base_url, "--hibernate-on-exit")
    try:
        again = second.post("/api/sandbox", body)
        assert again.status_code == 200, again.text
        assert second.sh(session_id, "cat notes.txt")["stdout"] == "draft\n"
    finally:
        said = second.stop()
    assert "hibernated 1 sandbox(es)" in said
    assert lifecycle_state(data, session_id) == "hibernated"
    assert not sandbox_dirs[0].exists()

    # Resumed from its snapshot; hibernated again on exit, so nothing outlives the test.
    third = Up(data, origins.base_url, "--hibernate-on-exit")
    try:
        resumed = third.post("/api/sandbox", body)
        assert resumed.status_code == 200, resumed.text
        assert third.sh(session_id, "cat notes.txt")["stdout"] == "draft\n"
    finally:
        third.stop()
    assert lifecycle_state(data, session_id) == "hibernated"
