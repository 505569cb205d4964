"""A real S3 API for tests: moto's server in a subprocess on a free port.

A subprocess, not moto's threaded server: the objects it keeps must not count in this
process's memory, which the streaming tests measure.
"""

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import boto3
import requests

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "recoup-test",
    "AWS_SECRET_ACCESS_KEY": "recoup-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """`python -m moto.server` on 127.0.0.1; one per test process (xdist worker)."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self.endpoint_url = ""

    def start(self, timeout: float = 30) -> "MotoServer":
        port = _free_port()
        self.endpoint_url = f"http://127.0.0.1:{port}"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto server exited: {self.log_path.read_text()[-2000:]}")
            try:
                requests.get(f"{self.endpoint_url}/moto-api/", timeout=1)
                return self
            except requests.ConnectionError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto server did not answer on {self.endpoint_url}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=10)

    def client(self):  # -> botocore S3 client
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )

    def new_bucket(self) -> str:
        name = f"recoup-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name
