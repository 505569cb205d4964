"""`manage.py web`, the production web entry: it refuses a taken port clearly, and requests
waiting on sandboxes do not stall anybody else's requests."""

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

import pytest
import requests

from tests.recoup.test_embedded_default import free_port
from tests.support import worker as worker_support
from tests.support.api import new_session, start_sandbox
from tests.support.worker import ROOT

WAITERS = 40
WAIT_S = 4


def test_a_taken_port_is_a_clear_error_and_a_nonzero_exit():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "manage.py", "web", "--bind", f"127.0.0.1:{port}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in result.stderr
    assert time.monotonic() - started < 30


def test_a_bad_bind_is_refused():
    result = subprocess.run(
        [sys.executable, "manage.py", "web", "--bind", "localhost"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and "--bind must be HOST:PORT" in result.stderr


def start_web(settings, **extra: str) -> tuple[subprocess.Popen, str]:
    """`manage.py web` on this test's database, data dir and origins; its base URL."""
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": worker_support.test_database_url(),
        "RECOUP_DATA_DIR": str(settings.DATA_DIR),
        "SANDBOX_ROOT": str(settings.SANDBOX_ROOT),
        "SNAPSHOT_STORAGE_ROOT": str(settings.SNAPSHOT_STORAGE_ROOT),
        "SANDBOX_GIT_BASE_URL": settings.SANDBOX_GIT_BASE_URL,
        "API_RATE_LIMIT": "100000/min",
        **extra,
    }
    web = subprocess.Popen(
        [sys.executable, "manage.py", "web", "--bind", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=open(settings.DATA_DIR / "web.log", "ab"),  # noqa: SIM115 - handed to the child
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if requests.get(f"{base}/healthz", timeout=5).status_code == 200:
                return web, base
        except requests.ConnectionError:
            assert time.monotonic() < deadline and web.poll() is None, "web never came up"
            time.sleep(0.2)


def poll_while(base: str, actor, session_id: str, busy) -> list[float]:
    """Seconds each status poll of `session_id` took while `busy()` holds."""
    polls = []
    while busy() and len(polls) < 40:
        started = time.monotonic()
        status = requests.get(
            f"{base}/api/sandbox/status",
            params={"sessionId": session_id},
            headers={"x-api-key": actor.raw_key},
            timeout=60,
        )
        polls.append(time.monotonic() - started)
        assert status.status_code == 200
        time.sleep(0.05)
    return polls


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_many_waiting_commands_leave_other_accounts_fast(owner, stranger, repo_url, settings):
    web, base = start_web(settings, SANDBOX_MAX_COMMANDS_PER_ACCOUNT=str(WAITERS * 2))
    try:
        busy = new_session(owner)
        start_sandbox(owner, busy, repo_url)
        other = new_session(stranger)
        body = {"sessionId": busy, "cmd": "sleep", "args": [str(WAIT_S)], "timeoutMs": 30000}
        codes: list[int] = []

        def wait_on_a_command() -> None:
            response = requests.post(
                f"{base}/api/sandbox/commands",
                json=body,
                headers={"x-api-key": owner.raw_key},
                timeout=60,
            )
            codes.append(response.status_code)

        waiters = [threading.Thread(target=wait_on_a_command) for _ in range(WAITERS)]
        for thread in waiters:
            thread.start()
        time.sleep(1)  # all of them are waiting in the sandbox now

        polls, healthz = [], []
        while any(thread.is_alive() for thread in waiters) and len(polls) < 40:
            started = time.monotonic()
            status = requests.get(
                f"{base}/api/sandbox/status",
                params={"sessionId": other},
                headers={"x-api-key": stranger.raw_key},
                timeout=30,
            )
            polls.append(time.monotonic() - started)
            assert status.status_code == 200
            started = time.monotonic()
            assert requests.get(f"{base}/healthz", timeout=30).status_code == 200
            healthz.append(time.monotonic() - started)
            time.sleep(0.05)
        for thread in waiters:
            thread.join()

        assert codes == [200] * WAITERS
        # On the old entry (gunicorn, 2 x 8 threads) these waited for a command to end (~4 s).
        assert len(polls) >= 10, "the commands ended before the polls could be measured"
        assert max(polls) < 1.0 and max(healthz) < 1.0, (polls, healthz)
        assert statistics.median(polls) < 0.2
    finally:
        web.terminate()
        web.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_slow_provisionings_do_not_hold_the_database_pool(owner, stranger, origins, settings):
    """Six clones at once on a web process with two pooled connections: each gives its
    connection back while git works, so another account's poll is not queued behind them."""
    origins.create("acme", "slow", {"blob.bin": os.urandom(48 * 1024 * 1024)})
    web, base = start_web(settings, DB_POOL_SIZE="2")
    try:
        other = new_session(stranger)
        sessions = [new_session(owner) for _ in range(6)]
        codes: list[int] = []

        def provision(session_id: str) -> None:
            response = requests.post(
                f"{base}/api/sandbox",
                json={"repoUrl": "https://github.com/acme/slow", "sessionId": session_id},
                headers={"x-api-key": owner.raw_key},
                timeout=120,
            )
            codes.append(response.status_code)

        workers = [threading.Thread(target=provision, args=(s,)) for s in sessions]
        for thread in workers:
            thread.start()
        time.sleep(0.5)
        polls = poll_while(base, stranger, other, lambda: any(t.is_alive() for t in workers))
        for thread in workers:
            thread.join()

        assert codes == [200] * 6
        assert len(polls) >= 5, "the provisionings ended before the polls could be measured"
        assert max(polls) < 1.0, polls
    finally:
        web.terminate()
        web.wait(timeout=30)


def send_and_hang_up(base: str, key: str, body: dict) -> None:
    """POST /api/sandbox/commands over a raw socket, closed before the answer comes."""
    payload = json.dumps(body).encode()
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /api/sandbox/commands HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + b"Content-Type: application/json\r\n"
            + f"x-api-key: {key}\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        time.sleep(0.5)  # the command is running in the sandbox by now


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_client_that_hangs_up_mid_command_leaks_nothing(owner, repo_url, settings):
    """The command a client hung up on runs to its end, then frees its quota slot and its
    thread like any other: the account can use the slot again at once, not after the lease's
    grace (timeout + 30 s), which is what a leaked slot would cost."""
    web, base = start_web(settings, SANDBOX_MAX_COMMANDS_PER_ACCOUNT="2")
    try:
        session_id = new_session(owner)
        start_sandbox(owner, session_id, repo_url)

        def command(script: str) -> requests.Response:
            body = {"sessionId": session_id, "cmd": "sh", "args": ["-c", script]}
            headers = {"x-api-key": owner.raw_key}
            return requests.post(
                f"{base}/api/sandbox/commands", json=body, headers=headers, timeout=30
            )

        started = time.monotonic()
        for n in range(2):
            body = {"sessionId": session_id, "cmd": "sh", "args": ["-c", f"sleep 2; touch d{n}"]}
            send_and_hang_up(base, owner.raw_key, body)
        assert command("true").status_code == 429  # both still run, holding their slots

        time.sleep(max(0, started + 3 - time.monotonic()))
        finished = command("ls d0 d1")
        assert finished.status_code == 200, finished.text
        assert finished.json()["exitCode"] == 0, finished.json()
    finally:
        web.terminate()
        web.wait(timeout=30)
