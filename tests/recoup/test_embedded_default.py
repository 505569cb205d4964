"""The README's run command on the embedded default: SQLite and a file broker, nothing else."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_service_runs_on_sqlite_and_a_file_broker(tmp_path):
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL", "SECRET_KEY")
    }
    env["RECOUP_DATA_DIR"] = str(tmp_path / "data")
    up = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        key = None
        deadline = time.monotonic() + 90
        while key is None and time.monotonic() < deadline:
            line = up.stdout.readline()
            assert line or up.poll() is None, "manage.py up exited early"
            found = re.search(r"^API key: (recoup_sk_\S+)", line)
            key = found.group(1) if found else None
        assert key, "no API key printed"
        base = f"http://127.0.0.1:{port}"
        ready = None
        while time.monotonic() < deadline:
            try:
                # Workers may still be importing Django: the first answer can take a while.
                ready = requests.get(f"{base}/readyz", timeout=30)
                break
            except requests.ConnectionError:
                time.sleep(0.2)
        assert ready is not None and ready.status_code == 200, ready and ready.text
        assert ready.json()["checks"] == {"database": "ok", "broker": "ok"}
        assert ready.json()["broker"] == "filesystem"

        created = requests.post(
            f"{base}/api/sessions",
            json={"title": "embedded"},
            headers={"x-api-key": key},
            timeout=10,
        )
        assert created.status_code == 201
        assert created.json()["session"]["title"] == "embedded"
        assert (tmp_path / "data" / "recoup.sqlite3").exists()
        assert requests.get(f"{base}/api/docs/", timeout=5).status_code == 200
    finally:
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=30) is not None
