"""How fast the local provider is at the operations a session waits on, by repository size.

Prints a table; not a test. Runs real bubblewrap sandboxes, so it needs what the provider needs
(root or user namespaces, bubblewrap, git). Origins of about 1, 100 and 500 MB of incompressible
working tree are generated once and cached under var/bench/origins; everything else lives in a
temporary RECOUP_DATA_DIR that is removed afterwards.

    python bench/bench_provider.py [--sizes 1,100,500] [--runs 5] [--large-runs 3]

Per size: cold create (clone from the local origin), create from a base (copy-on-write over
the base cache, then fast-forward check), snapshot of 10 MB of changes made in a base sandbox,
resume from that snapshot, and probe (20 per run).
"""

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ORIGINS = ROOT / "var" / "bench" / "origins"
GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "Bench",
    "GIT_AUTHOR_EMAIL": "bench@example.com",
    "GIT_COMMITTER_NAME": "Bench",
    "GIT_COMMITTER_EMAIL": "bench@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
}
CHANGES = (
    "mkdir -p changes && for i in 0 1 2 3 4 5 6 7 8 9; do "
    "head -c 1048576 /dev/urandom > changes/f$i.bin; done"
)


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True)


def make_origin(size_mb: int) -> Path:
    """A bare repo of about `size_mb` MB of random files in 1 MB pieces, over three commits."""
    bare = ORIGINS / "bench" / f"repo{size_mb}mb.git"
    if (bare / "HEAD").exists():
        return pack(bare)
    work = Path(tempfile.mkdtemp(prefix=f"bench-origin-{size_mb}-"))
    try:
        git("init", "-q", "-b", "main", cwd=work)
        files = max(size_mb, 1)
        piece = size_mb * 1024 * 1024 // files if size_mb else 1024 * 1024
        for commit in range(3):
            for i in range(commit, files, 3):
                path = work / f"dir{i % 10}" / f"file{i}.bin"
                path.parent.mkdir(exist_ok=True)
                path.write_bytes(os.urandom(piece))
            (work / "README.md").write_text(f"bench repo, commit {commit}\n")
            git("add", "-A", cwd=work)
            git("commit", "-q", "-m", f"commit {commit}", cwd=work)
        bare.parent.mkdir(parents=True, exist_ok=True)
        tmp = bare.with_name(bare.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        git("clone", "-q", "--bare", str(work), str(tmp), cwd=work)
        tmp.rename(bare)
    finally:
        shutil.rmtree(work)
    return pack(bare)


def pack(bare: Path) -> Path:
    """Repack into one pack, as a hosted origin serves it: loose objects would make every
    clone recompress the whole repository and measure git, not the provider."""
    counts = subprocess.run(
        ["git", "count-objects", "-v"], cwd=bare, env=GIT_ENV, check=True, capture_output=True
    ).stdout.decode()
    if "count: 0\n" not in counts:
        git("repack", "-a", "-d", "-q", "--window=0", cwd=bare)
    return bare


@contextlib.contextmanager
def timer(into: list[float]) -> Iterator[None]:
    """Append the block's wall time, in milliseconds, to `into`."""
    started = time.perf_counter()
    yield
    into.append((time.perf_counter() - started) * 1000)


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1) + 0.4999))]


def bench_size(provider, size_mb: int, runs: int) -> dict[str, list[float]]:
    from sandboxes_app.providers.base import GitSource

    make_origin(size_mb)
    source = GitSource(clone_url=f"file://{ORIGINS}/bench/repo{size_mb}mb.git")
    results: dict[str, list[float]] = {
        "build base": [],
        "cold create": [],
        "create from base": [],
        "snapshot 10 MB": [],
        "resume 10 MB": [],
        "probe": [],
    }
    with timer(results["build base"]):
        base = provider.build_base(source=source, storage_key=f"bases/{size_mb}.tzst")
    for _ in range(runs):
        name = f"b-{uuid.uuid4().hex[:10]}"
        with timer(results["cold create"]):
            provider.create(name=name, source=source)
        provider.destroy(name=name)

        name = f"b-{uuid.uuid4().hex[:10]}"
        with timer(results["create from base"]):
            provider.create(name=name, source=source, base=base)
        made = provider.run(name=name, argv=["sh", "-c", CHANGES])
        assert made.exit_code == 0, made.stderr
        with timer(results["snapshot 10 MB"]):
            snapshot = provider.snapshot(name=name, storage_key=f"snapshots/{name}.tzst")
        for _ in range(20):
            with timer(results["probe"]):
                assert provider.probe(name=name)
        provider.destroy(name=name)

        restored = f"b-{uuid.uuid4().hex[:10]}"
        with timer(results["resume 10 MB"]):
            provider.resume(name=restored, snapshot=snapshot)
        check = provider.run(name=restored, argv=["sh", "-c", "ls changes | wc -l"])
        assert check.stdout.strip() == "10", check
        provider.destroy(name=restored)
        provider.delete_snapshot(snapshot=snapshot)
    provider.delete_snapshot(snapshot=base)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,100,500", help="working tree sizes in MB")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--large-runs", type=int, default=3, help="runs for sizes >= 500 MB")
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="recoup-bench-"))
    os.environ["DJANGO_SETTINGS_MODULE"] = "recoup.settings"
    os.environ["RECOUP_DATA_DIR"] = str(data_dir)
    os.environ["SANDBOX_GIT_BASE_URL"] = f"file://{ORIGINS}"
    for name in ("SANDBOX_ROOT", "SNAPSHOT_STORAGE_ROOT", "SNAPSHOT_STORAGE_BACKEND"):
        os.environ.pop(name, None)
    import django

    django.setup()
    from sandboxes_app.providers.local import LocalProvider

    provider = LocalProvider.from_settings()
    rows = []
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            runs = args.large_runs if size >= 500 else args.runs
            print(f"... {size} MB, {runs} runs", file=sys.stderr, flush=True)
            results = bench_size(provider, size, runs)
            cold = statistics.median(results["cold create"])
            for op, values in results.items():
                extra = ""
                if op == "create from base":
                    extra = f"{statistics.median(values) / cold:.1%} of cold create"
                rows.append(
                    (f"{size} MB", op, statistics.median(values), p95(values), len(values), extra)
                )
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)

    print(f"{'repo':>7} | {'operation':<17} | {'median ms':>9} | {'p95 ms':>8} | {'n':>3} | note")
    print(f"{'-' * 7}-|-{'-' * 17}-|-{'-' * 9}-|-{'-' * 8}-|-{'-' * 3}-|-{'-' * 24}")
    for repo, op, median, high, n, extra in rows:
        print(f"{repo:>7} | {op:<17} | {median:9.1f} | {high:8.1f} | {n:3d} | {extra}")


if __name__ == "__main__":
    main()
