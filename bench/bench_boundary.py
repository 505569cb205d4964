"""What the tenant boundary (issue 8) costs: the same operations on the code before it and on
this tree, side by side in one run.

Prints a table; not a test. "before" is a git revision checked out into a temporary worktree
(default: the last commit before the boundary work); "after" is this tree. Each side runs in
its own process with its own temporary RECOUP_DATA_DIR, on the same small local origin, and
the sides alternate in rounds so machine noise lands on both.

    python bench/bench_boundary.py [--before 9209a90] [--runs 10] [--commands 50] [--rounds 2]

Operations: create from a base (overlay over the base cache, fast-forward check, init start),
resume from a 1 MB snapshot, and a command round trip (`true`). A second table weighs the two
ways to give a workspace to a new id range: re-owning every file (chown) against an idmapped
mount (what the provider does), on trees of 1,000 and 10,000 files.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIT_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/nonexistent",
    "GIT_AUTHOR_NAME": "Bench",
    "GIT_AUTHOR_EMAIL": "bench@example.com",
    "GIT_COMMITTER_NAME": "Bench",
    "GIT_COMMITTER_EMAIL": "bench@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
}
OPERATIONS = ("create from base", "resume 1 MB", "command round trip")


def make_origin(base: Path) -> None:
    """base/bench/app.git: a few files, one commit."""
    work = base / "work"
    work.mkdir(parents=True)
    (work / "README.md").write_text("# app\n")
    (work / "data.bin").write_bytes(os.urandom(256 * 1024))

    def git(*args: str, cwd: Path) -> None:
        subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True)

    git("init", "-q", "-b", "main", cwd=work)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "init", cwd=work)
    git("clone", "-q", "--bare", str(work), str(base / "bench" / "app.git"), cwd=base)


def measure(*, tree: Path, origins: Path, runs: int, commands: int) -> dict[str, list[float]]:
    """Runs inside the child process whose sys.path starts with `tree`."""
    import django

    django.setup()
    from sandboxes_app.providers.base import GitSource, get_provider

    provider = get_provider()
    source = GitSource(clone_url=f"file://{origins}/bench/app.git")
    base = provider.build_base(source=source, storage_key=f"bases/{uuid.uuid4().hex}.tar.zst")
    samples: dict[str, list[float]] = {op: [] for op in OPERATIONS}
    made = []
    try:
        for _ in range(runs):
            name = f"b-{uuid.uuid4().hex[:12]}"
            started = time.perf_counter()
            provider.create(name=name, source=source, base=base)
            samples["create from base"].append((time.perf_counter() - started) * 1000)
            made.append(name)
            provider.run(name=name, argv=["sh", "-c", "head -c 1048576 /dev/urandom > one.bin"])
            snap = provider.snapshot(name=name, storage_key=f"sessions/{name}.tar.zst")
            resumed = f"r-{uuid.uuid4().hex[:12]}"
            started = time.perf_counter()
            provider.resume(name=resumed, snapshot=snap)
            samples["resume 1 MB"].append((time.perf_counter() - started) * 1000)
            made.append(resumed)
            for _ in range(commands // runs or 1):
                started = time.perf_counter()
                result = provider.run(name=resumed, argv=["true"])
                samples["command round trip"].append((time.perf_counter() - started) * 1000)
                assert result.exit_code == 0, result.stderr
            for done in (name, resumed):
                provider.destroy(name=done)
    finally:
        for name in made:
            provider.destroy(name=name)
    return samples


def run_side(*, tree: Path, origins: Path, runs: int, commands: int) -> dict[str, list[float]]:
    data = tempfile.mkdtemp(prefix="bench-boundary-")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(tree),
        "DJANGO_SETTINGS_MODULE": "recoup.settings",
        "RECOUP_DATA_DIR": data,
        "LOG_LEVEL": "WARNING",
        "SANDBOX_GIT_BASE_URL": f"file://{origins}",
    }
    argv = [sys.executable, __file__, "--measure", str(tree), "--origins", str(origins)]
    argv += ["--runs", str(runs), "--commands", str(commands)]
    try:
        out = subprocess.run(argv, env=env, cwd=tree, check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as exc:
        sys.exit(f"{tree}: {exc.stderr[-3000:]}")
    finally:
        subprocess.run(["rm", "-rf", data], check=False)
    return json.loads(out.stdout.strip().splitlines()[-1])


def reown_vs_idmap(*, files: int, runs: int = 5) -> tuple[float, float]:
    """Median ms to re-own a tree of `files` files vs. to make an idmapped mount of it."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recoup.settings")
    import django

    django.setup()
    from sandboxes_app.providers.local_identity import (
        Identity,
        idmap_map,
        idmapped_tree,
        user_namespaces,
    )

    tree = Path(tempfile.mkdtemp(prefix="bench-reown-"))
    for i in range(files):
        sub = tree / f"d{i % 100}"
        sub.mkdir(exist_ok=True)
        (sub / f"f{i}").write_bytes(b"x")
    chowns, idmaps = [], []
    try:
        for run in range(runs):
            ids = 4000 + run
            started = time.perf_counter()
            for dirpath, dirnames, filenames in os.walk(tree):
                for entry in dirnames + filenames:
                    os.lchown(os.path.join(dirpath, entry), ids, ids)
            chowns.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            identity = Identity(slot=run, host_base=0x70000000 + run * 65536)
            (userns,) = user_namespaces(
                id_maps=[idmap_map(identity)],
                unshare="/usr/bin/unshare",
                sleep="/usr/bin/sleep",
                env={"PATH": "/usr/bin:/bin"},
            )
            os.close(idmapped_tree(tree, userns_fd=userns))
            os.close(userns)
            idmaps.append((time.perf_counter() - started) * 1000)
    finally:
        subprocess.run(["rm", "-rf", str(tree)], check=False)
    return statistics.median(chowns), statistics.median(idmaps)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", default="9209a90")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--commands", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--origins", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        samples = measure(
            tree=Path(args.measure),
            origins=Path(args.origins),
            runs=args.runs,
            commands=args.commands,
        )
        print(json.dumps(samples))
        return
    scratch = Path(tempfile.mkdtemp(prefix="bench-boundary-"))
    before = scratch / "before"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(before), args.before],
        check=True,
    )
    try:
        make_origin(scratch / "origins")
        totals = {side: {op: [] for op in OPERATIONS} for side in ("before", "after")}
        for _ in range(args.rounds):
            for side, tree in (("before", before), ("after", ROOT)):
                got = run_side(
                    tree=tree, origins=scratch / "origins", runs=args.runs, commands=args.commands
                )
                for op in OPERATIONS:
                    totals[side][op].extend(got[op])
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)])
        subprocess.run(["rm", "-rf", str(scratch)], check=False)
    print(f"before = {args.before}, after = this tree; medians in ms")
    print(f"{'operation':<20} | {'before':>8} | {'after':>8} | {'delta':>8} | {'n':>4}")
    print(f"{'-' * 20}-|-{'-' * 8}-|-{'-' * 8}-|-{'-' * 8}-|-{'-' * 4}")
    for op in OPERATIONS:
        b = statistics.median(totals["before"][op])
        a = statistics.median(totals["after"][op])
        n = len(totals["after"][op])
        print(f"{op:<20} | {b:>8.1f} | {a:>8.1f} | {a - b:>+8.1f} | {n:>4}")
    print()
    print("a workspace in a new id range; medians in ms")
    print(f"{'files':>6} | {'re-own (chown)':>14} | {'idmapped mount':>14}")
    print(f"{'-' * 6}-|-{'-' * 14}-|-{'-' * 14}")
    for files in (1000, 10000):
        chown_ms, idmap_ms = reown_vs_idmap(files=files)
        print(f"{files:>6} | {chown_ms:>14.1f} | {idmap_ms:>14.1f}")


if __name__ == "__main__":
    main()
