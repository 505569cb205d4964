"""A detached command's log, live: how long a line printed in a sandbox takes to reach a client
of `GET /api/sandbox/commands/{id}/logs`, p50 and p99 over some 200 lines, on each bus.

Prints a table; not a test. Runs `manage.py web` and a worker (bench_web.WebService) with a
database of its own, or the one `--database-url` names (migrated, kept). The command prints
its line number and the time (`date +%s.%N`, the host's clock: a sandbox shares it) every
`--interval-ms`; the client reads the stream (ndjson) as it comes and subtracts. So a
figure is the whole path: the pipe, the supervisor's append and wake-up on the bus, the web
thread's read of the log, the response through gunicorn and the client's parse. Also: from the
202 to the first line (the supervisor's start, the chain's, `date`'s fork).

    python bench/bench_logs.py [--lines 200] [--interval-ms 20] [--runs 2]
        [--bus redis,embedded] [--redis-url URL] [--broker-url URL] [--database-url URL]

Goal: p99 at most 50 ms.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_web import WebService, percentile  # noqa: E402


def run_once(service: WebService, key: str, session_id: str, *, lines: int, interval: float):
    """One command of `lines` lines: the latencies (ms) and the 202 -> first line (ms)."""
    headers = {"x-api-key": key}
    script = f'for i in $(seq 1 {lines}); do echo "$i $(date +%s.%N)"; sleep {interval}; done'
    started = time.time()
    response = requests.post(
        f"{service.base}/api/sandbox/commands",
        json={"sessionId": session_id, "cmd": "sh", "args": ["-c", script], "detached": True},
        headers=headers,
        timeout=30,
    )
    response.raise_for_status()
    command_id = response.json()["commandId"]
    latencies: list[float] = []
    first_line = None
    with requests.get(
        f"{service.base}/api/sandbox/commands/{command_id}/logs",
        params={"sessionId": session_id},
        headers={**headers, "Accept": "application/x-ndjson"},
        stream=True,
        timeout=60,
    ) as stream:
        buffer = b""
        for chunk in stream.iter_content(chunk_size=None):
            now = time.time()
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for line in complete:
                if not line:
                    continue  # a keep-alive
                item = json.loads(line)
                if "stream" not in item:
                    return latencies, first_line
                for text in item["data"].splitlines():
                    number, printed = text.split()
                    latencies.append((now - float(printed)) * 1000)
                    if number == "1":
                        first_line = (now - started) * 1000
    return latencies, first_line


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=200)
    parser.add_argument("--interval-ms", type=int, default=20)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--bus", default="redis,embedded")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1/0"))
    parser.add_argument("--broker-url", default=os.environ.get("CELERY_BROKER_URL"))
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    rows = []
    for bus in args.bus.split(","):
        extra = {"REDIS_URL": args.redis_url if bus == "redis" else ""}
        extra["API_RATE_LIMIT"] = "1000000/min"
        if args.broker_url:
            extra["CELERY_BROKER_URL"] = args.broker_url
        with WebService(extra_env=extra, database_url=args.database_url) as service:
            key = service.api_key(f"logs-{bus}@bench")
            session_id = service.session(key, sandbox=True)
            latencies: list[float] = []
            firsts: list[float] = []
            for _ in range(args.runs):
                got, first = run_once(
                    service, key, session_id, lines=args.lines, interval=args.interval_ms / 1000
                )
                latencies += got
                if first is not None:
                    firsts.append(first)
        rows.append((bus, latencies, firsts))

    print(
        f"\nA line printed in a sandbox -> a logs client (ndjson through manage.py web), "
        f"{args.runs} x {args.lines} lines, one every {args.interval_ms} ms\n"
    )
    print("bus      | lines | p50 ms | p99 ms | max ms | 202 -> first line ms (median)")
    print("---------|-------|--------|--------|--------|------------------------------")
    for bus, latencies, firsts in rows:
        print(
            f"{bus:<8} | {len(latencies):>5} | {statistics.median(latencies):>6.1f} | "
            f"{percentile(latencies, 0.99):>6.1f} | {max(latencies):>6.1f} | "
            f"{statistics.median(firsts):>6.1f}"
        )


if __name__ == "__main__":
    main()
