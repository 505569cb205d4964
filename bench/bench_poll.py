"""The status poll under load, beside the bare /healthz view, on the production web entry.

Prints a table; not a test. Runs `manage.py web` (2 x 128 threads) and a worker on PostgreSQL and
Redis with a database of its own, then wrk (Debian: `apt-get install wrk`) against /healthz and
against GET /api/sandbox/status, one after the other in one run, at 32 connections.

The poll runs twice, each time beside /healthz on the same server: all connections on one
account's session, with the rate limit raised (wrk is one client sending thousands of requests a
second); then spread over --accounts accounts of a session each, every request another
account's, at the default rate limit (API_RATE_LIMIT 1200/min, so the rate limit takes its counts
from Redis in blocks of 12), as many open tabs would poll; its /healthz row goes through the
same kind of wrk script, whose Lua runs on the same cores.

    python bench/bench_poll.py [--connections 32] [--seconds 10] [--threads 2] [--accounts 128]
                               [--rounds 3]
"""

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_web import WebService, process_tree_cpu_seconds  # noqa: E402

_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


# Each request another (path, key) pair, round the list; wrk gives each of its threads a copy.
_ROTATE_LUA = """
local polls = %s
local i = 0
request = function()
  i = i + 1
  local poll = polls[(i %% #polls) + 1]
  return wrk.format("GET", poll[1], {["x-api-key"] = poll[2]})
end
"""


def rotate_script(polls: list[tuple[str, str]]) -> str:
    """A wrk script polling each (path, key) in turn; its path."""
    table = "{" + ", ".join(f"{{{json.dumps(p)}, {json.dumps(k)}}}" for p, k in polls) + "}"
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(_ROTATE_LUA % table)
    return script.name


def wrk(
    url: str,
    *,
    connections: int,
    seconds: int,
    threads: int,
    key: str | None,
    web_pid: int,
    script: str | None = None,
) -> dict:
    """wrk's figures, and the CPU the web processes spent per request meanwhile."""
    cpu_before = process_tree_cpu_seconds(web_pid)
    argv = ["wrk", "--latency", f"-t{threads}", f"-c{connections}", f"-d{seconds}s"]
    if key:
        argv += ["-H", f"x-api-key: {key}"]
    if script:
        argv += ["-s", script]
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
    parser.add_argument("--accounts", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("bench_poll needs wrk: apt-get install wrk")
    rows = []
    # One account: wrk is one client sending thousands of requests a second, over any rate.
    # /healthz and the poll alternate for --rounds rounds; each row is the round with the
    # median ratio, so a slow spell of the machine moves both figures of a row together.
    with WebService(extra_env={"API_RATE_LIMIT": "100000000/min"}) as service:
        key = service.api_key("poll@bench")
        session_id = service.session(key, sandbox=True)
        load = _load(service, args)
        status_url = f"{service.base}/api/sandbox/status?sessionId={session_id}"
        warm_up = {**load, "seconds": 3}
        wrk(f"{service.base}/healthz", **warm_up, key=None)
        wrk(status_url, **warm_up, key=key)
        rounds = []
        for _ in range(args.rounds):
            healthz = wrk(f"{service.base}/healthz", **load, key=None)
            rounds.append((healthz, wrk(status_url, **load, key=key)))
    rounds.sort(key=lambda pair: pair[1]["rps"] / pair[0]["rps"])
    healthz, status = rounds[len(rounds) // 2]
    rows += [("/healthz", healthz), ("GET /api/sandbox/status, one account", status, healthz)]
    ratios = ", ".join(f"{s['rps'] / h['rps']:.2f}x" for h, s in rounds)
    # Many accounts at the default rate limit, each under it.
    with WebService() as service:
        keys = service.api_keys([f"poll{n}@bench" for n in range(args.accounts)])
        polls = [
            (f"/api/sandbox/status?sessionId={service.session(key, sandbox=False)}", key)
            for key in keys
        ]
        load = _load(service, args)
        # /healthz through the same kind of script, so wrk's Lua costs both rows alike.
        bare = rotate_script([("/healthz", key) for key in keys])
        spread_script = rotate_script(polls)
        wrk(f"{service.base}/", **load, key=None, script=bare)
        healthz = wrk(f"{service.base}/", **load, key=None, script=bare)
        spread = wrk(f"{service.base}/", **load, key=None, script=spread_script)
        Path(bare).unlink()
        Path(spread_script).unlink()
    name = f"GET /api/sandbox/status, {args.accounts} accounts at the default rate limit"
    rows += [("/healthz, from the same wrk script", healthz), (name, spread, healthz)]
    print(
        f"\nwrk, {args.connections} connections, {args.seconds} s each, on manage.py web "
        "(2 x 128 threads), PostgreSQL and Redis; each poll row beside the /healthz row above "
        "it, from the same server\n"
    )
    print("| endpoint | req/s | p50 ms | p99 ms | non-2xx | web CPU ms/req | vs /healthz |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, row, *base in rows:
        ratio = f"{row['rps'] / base[0]['rps']:.2f}x" if base else ""
        print(
            f"| {name} | {row['rps']:.0f} | {row['50']:.1f} | {row['99']:.1f} | {row['non2xx']} "
            f"| {row['web_cpu_ms']:.2f} | {ratio} |"
        )
    print(f"\none account, every round's ratio: {ratios}")


def _load(service: WebService, args: argparse.Namespace) -> dict:
    return {
        "connections": args.connections,
        "seconds": args.seconds,
        "threads": args.threads,
        "web_pid": service.procs[0].pid,
    }


if __name__ == "__main__":
    main()
