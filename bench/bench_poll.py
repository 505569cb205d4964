"""The status poll under load, beside the bare /healthz view, on the production web entry.

Prints a table; not a test. Runs `manage.py web` (2 x 128 threads) and a worker on PostgreSQL and
Redis with a database of its own, then wrk (Debian: `apt-get install wrk`) against /healthz and
against GET /api/sandbox/status of a session with a running sandbox, one after the other in one
run, at 32 connections. The rate limit is raised for the bench (API_RATE_LIMIT): wrk is one
client sending thousands of requests a second.

    python bench/bench_poll.py [--connections 32] [--seconds 10] [--threads 2]
"""

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_web import WebService, process_tree_cpu_seconds  # noqa: E402

_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def wrk(
    url: str, *, connections: int, seconds: int, threads: int, key: str | None, web_pid: int
) -> dict:
    """wrk's figures, and the CPU the web processes spent per request meanwhile."""
    cpu_before = process_tree_cpu_seconds(web_pid)
    argv = ["wrk", "--latency", f"-t{threads}", f"-c{connections}", f"-d{seconds}s"]
    if key:
        argv += ["-H", f"x-api-key: {key}"]
    out = subprocess.run([*argv, url], check=True, capture_output=True, text=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    latency = {}
    for pct in ("50", "99"):
        value, unit = re.search(rf"\s{pct}%\s+([\d.]+)(us|ms|s)\b", out).groups()
        latency[pct] = float(value) * _UNITS[unit]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    requests_done = int(re.search(r"(\d+) requests in", out).group(1))
    web_cpu_ms = (process_tree_cpu_seconds(web_pid) - cpu_before) * 1000 / requests_done
    return {
        "rps": rps,
        **latency,
        "non2xx": int(errors.group(1)) if errors else 0,
        "web_cpu_ms": web_cpu_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("bench_poll needs wrk: apt-get install wrk")
    with WebService(extra_env={"API_RATE_LIMIT": "100000000/min"}) as service:
        key = service.api_key("poll@bench")
        session_id = service.session(key, sandbox=True)
        load = {
            "connections": args.connections,
            "seconds": args.seconds,
            "threads": args.threads,
            "web_pid": service.procs[0].pid,
        }
        wrk(f"{service.base}/healthz", **load, key=None)  # warm both up
        healthz = wrk(f"{service.base}/healthz", **load, key=None)
        status = wrk(f"{service.base}/api/sandbox/status?sessionId={session_id}", **load, key=key)
    print(
        f"\nwrk, {args.connections} connections, {args.seconds} s each, on manage.py web "
        "(2 x 128 threads), PostgreSQL and Redis\n"
    )
    print("| endpoint | req/s | p50 ms | p99 ms | non-2xx | web CPU ms/req |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, row in (("/healthz", healthz), ("GET /api/sandbox/status", status)):
        print(
            f"| {name} | {row['rps']:.0f} | {row['50']:.1f} | {row['99']:.1f} | {row['non2xx']} "
            f"| {row['web_cpu_ms']:.2f} |"
        )
    print(f"\nstatus / healthz requests per second: {status['rps'] / healthz['rps']:.2f}x")


if __name__ == "__main__":
    main()
