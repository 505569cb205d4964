"""Fair share on the web entry: while one account holds 100 concurrent 15 s commands, another
account's status poll, p50 and p99.

Prints a table; not a test. Runs `manage.py web` (2 x 128 threads by default) and a worker on
PostgreSQL and Redis with a database of its own. The busy account's command quota is raised to
let it hold 100 commands (SANDBOX_MAX_COMMANDS_PER_ACCOUNT, default 16, would answer 429 past
that) and the rate limit is raised for the bench (API_RATE_LIMIT).

    python bench/bench_fairness.py [--commands 100] [--seconds 15] [--old]

--old runs the same load against the previous entry's thread count (2 x 8), for comparison.
"""

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_web import WebService, percentile  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commands", type=int, default=100)
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--old", action="store_true", help="2 x 8 threads, as before")
    args = parser.parse_args()
    extra = {
        "SANDBOX_MAX_COMMANDS_PER_ACCOUNT": str(args.commands * 2),
        "API_RATE_LIMIT": "1000000/min",
    }
    if args.old:
        extra["WEB_THREADS"] = "8"
    with WebService(extra_env=extra) as service:
        busy_key, other_key = service.api_key("busy@bench"), service.api_key("other@bench")
        busy = service.session(busy_key, sandbox=True)
        other = service.session(other_key, sandbox=False)
        body = {
            "sessionId": busy,
            "cmd": "sleep",
            "args": [str(args.seconds)],
            "timeoutMs": (args.seconds + 30) * 1000,
        }
        codes: list[int] = []

        def hold() -> None:
            response = requests.post(
                f"{service.base}/api/sandbox/commands",
                json=body,
                headers={"x-api-key": busy_key},
                timeout=args.seconds + 60,
            )
            codes.append(response.status_code)

        holders = [threading.Thread(target=hold) for _ in range(args.commands)]
        for thread in holders:
            thread.start()
        time.sleep(2)  # every command is in the sandbox now
        polls: list[float] = []
        poll_session = requests.Session()
        poll_session.headers["x-api-key"] = other_key
        deadline = time.monotonic() + args.seconds - 4
        while time.monotonic() < deadline:
            started = time.monotonic()
            poll_session.get(
                f"{service.base}/api/sandbox/status", params={"sessionId": other}, timeout=60
            ).raise_for_status()
            polls.append((time.monotonic() - started) * 1000)
            time.sleep(0.02)
        for thread in holders:
            thread.join()
    threads = "2 x 8" if args.old else "2 x 128"
    print(
        f"\nOne account holds {args.commands} concurrent {args.seconds} s commands; another "
        f"account polls its status (web entry {threads} threads)\n"
    )
    print("| measure | value |")
    print("| --- | ---: |")
    print(f"| commands answered 200 | {codes.count(200)} / {len(codes)} |")
    print(f"| status polls | {len(polls)} |")
    print(f"| poll p50 ms | {statistics.median(polls):.1f} |")
    print(f"| poll p99 ms | {percentile(polls, 0.99):.1f} |")
    print(f"| poll max ms | {max(polls):.1f} |")


if __name__ == "__main__":
    main()
