"""What a pool of sandbox hosts (issue 12) costs: a command through a remote host against the
local path, and a create from a base with the host's base cache cold (fetched from the snapshot
storage) against warm. Prints tables; not a test.

    python bench/bench_hosts.py [--commands 200] [--creates 5] [--s3] [--base-mb 20]

It starts one `manage.py sandbox_host` on this machine (its own SANDBOX_ROOT and id pool) and
acts as the pool's web itself. "local" is the embedded default's path: this process's own local
provider. "remote" is SANDBOX_PROVIDER=pool: the placement lookup, a signed keep-alive HTTP call
to the host's internal endpoint, and the same local provider there. Needs PostgreSQL and Redis
(a database `recoup_bench_hosts` is recreated, Redis databases 14 and 15 are used). With --s3
the snapshots live in an S3 API served by moto on a free port (if the project's S3 storage
support is installed); otherwise in a filesystem storage both sides share.
"""

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # bench_boundary's origin
DB = "recoup_bench_hosts"


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def row(label: str, samples: list[float]) -> str:
    return (
        f"| {label:<28} | {len(samples):>4} | {statistics.median(samples):>9.2f} "
        f"| {pct(samples, 0.95):>9.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commands", type=int, default=200)
    parser.add_argument("--creates", type=int, default=5)
    parser.add_argument("--s3", action="store_true")
    parser.add_argument("--base-mb", type=int, default=20, help="size of the base's one big file")
    args = parser.parse_args()

    data = Path(tempfile.mkdtemp(prefix="bench-hosts-"))
    subprocess.run(["dropdb", "-h", "127.0.0.1", "-U", "postgres", "--if-exists", DB], check=True)
    subprocess.run(["createdb", "-h", "127.0.0.1", "-U", "postgres", DB], check=True)
    from bench_boundary import GIT_ENV, make_origin

    origins = data / "origins"
    make_origin(origins)
    if args.base_mb:  # a base worth fetching: incompressible, so it is that big in storage
        work = origins / "work"
        (work / "blob.bin").write_bytes(os.urandom(args.base_mb * 1024 * 1024))
        for git in (["add", "-A"], ["commit", "-q", "-m", "blob"]):
            subprocess.run(["git", *git], cwd=work, env=GIT_ENV, check=True)
        subprocess.run(
            ["git", "push", "-q", str(origins / "bench" / "app.git"), "main"],
            cwd=work,
            env=GIT_ENV,
            check=True,
        )
    env = {
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{DB}",
        "REDIS_URL": "redis://127.0.0.1:6379/14",
        "CELERY_BROKER_URL": "redis://127.0.0.1:6379/15",
        "RECOUP_DATA_DIR": str(data),
        "SANDBOX_PROVIDER": "pool",
        "SANDBOX_GIT_BASE_URL": f"file://{origins}",
        "LOG_LEVEL": "WARNING",
        "DJANGO_SETTINGS_MODULE": "recoup.settings",
    }
    moto = None
    if args.s3:
        # moto's server in a process of its own, as the tests run it.
        from tests.support.s3 import CREDENTIALS, MotoServer

        moto = MotoServer(log_path=data / "moto.log").start()
        env.update(
            CREDENTIALS,
            SNAPSHOT_STORAGE="s3",
            SNAPSHOT_S3_BUCKET=moto.new_bucket(),
            SNAPSHOT_S3_ENDPOINT_URL=moto.endpoint_url,
            SNAPSHOT_S3_REGION="us-east-1",
        )
    else:  # one machine: its hosts share a filesystem storage, set explicitly for the pool
        env["SNAPSHOT_STORAGE_ROOT"] = str(data / "snapshots")
    os.environ.update(env)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django.conf import settings

    from sandboxes_app.hosts.client import PoolProvider
    from sandboxes_app.hosts.services import hosts_live, sandbox_host_of
    from sandboxes_app.models import HostPlacement, SandboxHost
    from sandboxes_app.providers.base import GitSource
    from sandboxes_app.providers.local import LocalProvider

    host_root = data / "host-a"
    host_env = {
        **os.environ,
        "SANDBOX_ROOT": str(host_root),
        "SANDBOX_ID_POOL_START": str(0xC8000000),
        "SANDBOX_ID_POOL_SLOTS": "64",
        "SECRET_KEY": settings.SECRET_KEY,
    }
    log = open(data / "host.log", "ab")  # noqa: SIM115
    name = f"bench-{uuid.uuid4().hex[:6]}"
    host = subprocess.Popen(
        [sys.executable, "manage.py", "sandbox_host", "--name", name],
        cwd=ROOT,
        env=host_env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    local = LocalProvider.from_settings()
    pool = PoolProvider.from_settings()
    made_local, made_remote = [], []
    try:
        deadline = time.monotonic() + 60
        while not hosts_live().filter(name=name).exists():
            if time.monotonic() > deadline or host.poll() is not None:
                sys.exit((data / "host.log").read_text()[-3000:])
            time.sleep(0.2)
        source = GitSource(clone_url="https://github.com/bench/app")
        key = f"bases/{uuid.uuid4().hex}.tar.zst"
        base = pool.build_base(source=source, storage_key=key)

        # Commands: one sandbox on each side, alternating calls so noise lands on both.
        local_name, remote_name = f"l-{uuid.uuid4().hex[:8]}", f"r-{uuid.uuid4().hex[:8]}"
        local.create(name=local_name, source=source, base=base)
        made_local.append(local_name)
        pool.create(name=remote_name, source=source, base=base)
        made_remote.append(remote_name)
        for _ in range(10):  # warm both paths (connections, caches)
            local.run(name=local_name, argv=["true"])
            pool.run(name=remote_name, argv=["true"])
        on_local, on_remote, transport, lookup, queued = [], [], [], [], []
        host_row = SandboxHost.objects.get(name=name)
        for _ in range(args.commands):
            started = time.perf_counter()
            sandbox_host_of(name=remote_name)
            lookup.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            pool.status(name=remote_name)
            transport.append((time.perf_counter() - started) * 1000)
            # The other door: the same kind of no-op through the host's Celery queue and a
            # Redis reply list (`stop` of a sandbox that does not exist does nothing).
            started = time.perf_counter()
            pool._lifecycle(host_row, "stop", name="bench-nothing")
            queued.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            assert local.run(name=local_name, argv=["true"]).exit_code == 0
            on_local.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            assert pool.run(name=remote_name, argv=["true"]).exit_code == 0
            on_remote.append((time.perf_counter() - started) * 1000)

        # Creates from the base on the host: its cache dropped before each cold one.
        cold, warm = [], []
        cache = host_root / "_bases" / base.sha256
        for _ in range(args.creates):
            for sample in (cold, warm):
                if sample is cold:
                    shutil.rmtree(cache, ignore_errors=True)
                made = f"c-{uuid.uuid4().hex[:8]}"
                started = time.perf_counter()
                pool.create(name=made, source=source, base=base)
                sample.append((time.perf_counter() - started) * 1000)
                pool.destroy(name=made)
    finally:
        for made in made_local:
            local.destroy(name=made)
        for made in made_remote:
            pool.destroy(name=made)
        host.send_signal(signal.SIGTERM)
        try:
            host.wait(timeout=15)
        except subprocess.TimeoutExpired:
            host.kill()
        HostPlacement.objects.all().delete()
        if moto is not None:
            moto.stop()

    storage = "S3 (moto)" if args.s3 else "filesystem"
    print(f"\ncommand round trip (`true`), ms; {args.commands} each, alternating\n")
    print(f"| {'path':<28} | {'n':>4} | {'median':>9} | {'p95':>9} |")
    print(f"|{'-' * 30}|{'-' * 6}|{'-' * 11}|{'-' * 11}|")
    print(row("local provider", on_local))
    print(row("remote host (pool)", on_remote))
    print(row("of which: placement lookup", lookup))
    print(row("status call (lookup + HTTP)", transport))
    print(row("no-op via the Celery queue", queued))
    added = statistics.median(on_remote) - statistics.median(on_local)
    print(f"\nadded by the remote host on the median: {added:+.2f} ms (goal: at most +5 ms)")
    print(f"\ncreate from a base on the host, ms; snapshot storage: {storage}\n")
    print(f"| {'base cache':<28} | {'n':>4} | {'median':>9} | {'p95':>9} |")
    print(f"|{'-' * 30}|{'-' * 6}|{'-' * 11}|{'-' * 11}|")
    print(row("cold (fetched from storage)", cold))
    print(row("warm", warm))
    print(f"\nbase snapshot: {base.size_bytes / 1e6:.2f} MB compressed")
    shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
