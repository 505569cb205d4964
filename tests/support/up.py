"""`manage.py up`, the README's run command, as a real process on the embedded default (SQLite
and a file broker) in a data dir of the test's."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
BANNER_FIRST = "recoup is up on "
BANNER_LAST = "stop with Ctrl-C"
DESTROY_ALL_SANDBOXES = """
from django.conf import settings
from sandboxes_app.providers.base import get_provider
provider = get_provider()
for path in settings.SANDBOX_ROOT.iterdir():
    if not path.name.startswith("_"):
        provider.destroy(name=path.name)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def embedded_env(data: Path, **extra: str) -> dict[str, str]:
    """This process's environment without the test services: `up` brings its own."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL", "SECRET_KEY")
    }
    return {**env, "RECOUP_DATA_DIR": str(data), **extra}


class Up:
    """A started `manage.py up`; `banner` is what it printed once the web server answered,
    `answered_at_banner` whether /healthz answered at that very moment."""

    def __init__(self, data: Path, *flags: str, **env: str) -> None:
        self.data = data
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        data.mkdir(parents=True, exist_ok=True)
        self.stderr_path = data.parent / f"up-{self.port}.log"
        with open(self.stderr_path, "wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "manage.py", "up", "--port", str(self.port), *flags],
                cwd=ROOT,
                env=embedded_env(data, **env),
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.banner = self._read_banner()
        try:
            self.answered_at_banner = requests.get(f"{self.base}/healthz", timeout=5).ok
        except requests.ConnectionError:
            self.answered_at_banner = False
        self.key = (data / "demo-api-key").read_text().strip()

    def _read_banner(self) -> list[str]:
        deadline = time.monotonic() + 150
        lines: list[str] = []
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line and self.process.poll() is not None:
                raise AssertionError(f"manage.py up exited early:\n{self.log()[-3000:]}")
            if line.startswith(BANNER_FIRST) or lines:
                lines.append(line.rstrip("\n"))
            if line.startswith(BANNER_LAST):
                return lines
        raise AssertionError(f"no banner:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")

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
        """SIGTERM, as Ctrl-C would; returns the rest of its output."""
        self.process.send_signal(signal.SIGTERM)
        out, _ = self.process.communicate(timeout=120)
        return out


def destroy_all_sandboxes(data: Path) -> None:
    """Whatever a failed test left running in this data dir goes."""
    subprocess.run(
        [sys.executable, "manage.py", "shell", "--no-imports", "-c", DESTROY_ALL_SANDBOXES],
        cwd=ROOT,
        env=embedded_env(data),
        check=False,
        capture_output=True,
    )
