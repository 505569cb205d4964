"""Recovery from a worker SIGKILLed mid-hibernation, under default lifecycle settings: the time
from the kill to a resumed sandbox whose files are verified (sha256 inside the sandbox).

Prints a table; not a test. Runs the real service (gunicorn web, Celery worker and beat) on
PostgreSQL and Redis with a database of its own, created and dropped here. Each run: a session
on a small repository writes `--workspace-mb` of random data, asks for hibernation, and the
worker is SIGKILLed once the hibernation is under way (the session is `hibernating`). Like a
supervisor, the bench starts the worker again 4 s later. The client, as a chat UI does, keeps
asking POST /api/sandbox until it answers 200, then checks its files.

    python bench/bench_recovery.py [--runs 5] [--workspace-mb 100]
"""

import argparse
import os
import signal
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
from bench_http import ADMIN_URL, Service, clean_up  # noqa: E402
from bench_web import make_origin  # noqa: E402

SUPERVISOR_RESTART_S = 4


def worker_process(env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "recoup", "worker", "--concurrency", "2"],
        cwd=ROOT,
        env=env,
        stdout=open(log, "ab"),  # noqa: SIM115 - handed to the child
        stderr=subprocess.STDOUT,
    )


def call(service: Service, key: str, method: str, path: str, **kwargs) -> requests.Response:
    return requests.request(
        method, f"{service.base}{path}", headers={"x-api-key": key}, timeout=600, **kwargs
    )


def one_run(service: Service, env: dict[str, str], key: str, workspace_mb: int) -> float:
    repo = "https://github.com/bench/app"
    session_id = call(service, key, "POST", "/api/sessions", json={}).json()["session"]["id"]
    body = {"repoUrl": repo, "sessionId": session_id}
    call(service, key, "POST", "/api/sandbox", json=body).raise_for_status()
    write = f"head -c {workspace_mb}M /dev/urandom > data.bin && echo kept > notes.txt"
    digest_cmd = {"sessionId": session_id, "cmd": "sha256sum", "args": ["data.bin", "notes.txt"]}
    call(
        service,
        key,
        "POST",
        "/api/sandbox/commands",
        json={"sessionId": session_id, "cmd": "sh", "args": ["-c", write], "timeoutMs": 120000},
    ).raise_for_status()
    digest = call(service, key, "POST", "/api/sandbox/commands", json=digest_cmd).json()["stdout"]

    call(service, key, "POST", "/api/sandbox/hibernate", json={"sessionId": session_id})
    deadline = time.monotonic() + 60
    while True:
        status = call(service, key, "GET", "/api/sandbox/status", params={"sessionId": session_id})
        if status.json()["lifecycle"]["state"] == "hibernating":
            break
        if time.monotonic() > deadline:
            raise TimeoutError("the hibernation never started")
        time.sleep(0.02)
    time.sleep(0.2)  # into the snapshot
    worker = service.procs[1]
    worker.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    worker.wait()
    restart_at = killed + SUPERVISOR_RESTART_S
    while True:
        if worker is service.procs[1] and time.monotonic() >= restart_at:
            service.procs[1] = worker_process(env, Path(env["RECOUP_DATA_DIR"]) / "worker.log")
        response = call(service, key, "POST", "/api/sandbox", json=body)
        if response.status_code == 200:
            break
        if time.monotonic() - killed > 300:
            raise TimeoutError(f"never resumed: {response.status_code} {response.text}")
        time.sleep(0.5)
    after = call(service, key, "POST", "/api/sandbox/commands", json=digest_cmd).json()["stdout"]
    recovered = time.monotonic() - killed
    if after != digest:
        raise AssertionError(f"files differ after recovery: {after!r} != {digest!r}")
    if worker is service.procs[1]:
        service.procs[1] = worker_process(env, Path(env["RECOUP_DATA_DIR"]) / "worker.log")
    return recovered


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workspace-mb", type=int, default=100)
    args = parser.parse_args()
    db_name = f"recoup_bench_recovery_{uuid.uuid4().hex[:8]}"
    db_url = ADMIN_URL.rsplit("/", 1)[0] + f"/{db_name}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db_name}"')
    data_dir = tempfile.mkdtemp(prefix="recoup-bench-recovery-")
    origins = Path(data_dir) / "origins"
    make_origin(origins)
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "RECOUP_DATA_DIR": data_dir,
        "REDIS_URL": "redis://127.0.0.1:6379/0",
        "CELERY_BROKER_URL": f"redis://127.0.0.1:6379/{os.environ.get('BENCH_REDIS_DB', 3)}",
        "SANDBOX_GIT_BASE_URL": f"file://{origins}",
        "API_RATE_LIMIT": "100000/min",
    }
    service = Service(env)
    beat = None
    try:
        service.start()
        beat = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "recoup", "beat", "-s", f"{data_dir}/beat"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        key = (
            service.manage("create_api_key", "--email", "bench@example.com")
            .strip()
            .splitlines()[-1]
        )
        times = [one_run(service, env, key, args.workspace_mb) for _ in range(args.runs)]
        print(
            f"\nWorker SIGKILLed mid-hibernation of a {args.workspace_mb} MB workspace, back "
            f"after {SUPERVISOR_RESTART_S} s; default lease (10 s, heartbeat 2 s), sweep 5 s\n"
        )
        print("| measure | median s | min s | max s | runs |")
        print("| --- | ---: | ---: | ---: | ---: |")
        print(
            f"| kill -> resumed, files verified | {statistics.median(times):.1f} | "
            f"{min(times):.1f} | {max(times):.1f} | {len(times)} |"
        )
    finally:
        if beat is not None:
            beat.kill()
        service.stop()
        clean_up(env=env, data_dir=data_dir, db_name=db_name)


if __name__ == "__main__":
    main()
