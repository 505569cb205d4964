"""What the per-sandbox disk quota (SANDBOX_DISK_MB) costs: the same operations with no quota
(the workspace is a directory of SANDBOX_ROOT) and with the default quota (a sparse ext4 image
on a loop device per sandbox), alternating in one process so machine noise lands on both.

Prints a table; not a test. Needs root, bubblewrap, git and loop devices.

    python bench/bench_disk.py [--runs 10] [--quota-mb 10240]

Operations: cold create (a clone of a small origin), create from a base, snapshot of 10 MB of
changes, resume of that snapshot, a command writing a 1 MB file, and destroy.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from bench_boundary import make_origin  # noqa: E402

OPERATIONS = (
    "cold create",
    "create from base",
    "snapshot 10 MB",
    "resume 10 MB",
    "write 1 MB command",
    "destroy",
)


def timed(samples: list[float], action):
    started = time.perf_counter()
    result = action()
    samples.append((time.perf_counter() - started) * 1000)
    return result


def one_round(*, quota_mb: int, base, source, samples: dict[str, list[float]]) -> None:
    from django.conf import settings

    from sandboxes_app.providers.local import LocalProvider

    settings.SANDBOX_DISK_MB = quota_mb
    provider = LocalProvider.from_settings()
    cold, layered, resumed = (f"b-{uuid.uuid4().hex[:10]}" for _ in range(3))
    timed(samples["cold create"], lambda: provider.create(name=cold, source=source))
    timed(
        samples["create from base"], lambda: provider.create(name=layered, source=source, base=base)
    )
    provider.run(
        name=layered,
        argv=["sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do head -c 1M /dev/urandom > r$i; done"],
    )
    snapshot = timed(
        samples["snapshot 10 MB"],
        lambda: provider.snapshot(name=layered, storage_key=f"sessions/{layered}.tar.zst"),
    )
    timed(samples["resume 10 MB"], lambda: provider.resume(name=resumed, snapshot=snapshot))
    timed(
        samples["write 1 MB command"],
        lambda: provider.run(name=resumed, argv=["sh", "-c", "head -c 1M /dev/zero > w"]),
    )
    for name in (cold, layered):
        provider.destroy(name=name)
    timed(samples["destroy"], lambda: provider.destroy(name=resumed))
    provider.delete_snapshot(snapshot=snapshot)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--quota-mb", type=int, default=10240)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-disk-") as tmp:
        origins = Path(tmp) / "origins"
        make_origin(origins)
        os.environ.update(
            RECOUP_DATA_DIR=str(Path(tmp) / "data"),
            DJANGO_SETTINGS_MODULE="recoup.settings",
            SANDBOX_GIT_BASE_URL=f"file://{origins}",
        )
        import django

        django.setup()
        from sandboxes_app.providers.base import GitSource
        from sandboxes_app.providers.local import LocalProvider

        source = GitSource(clone_url=f"file://{origins}/bench/app.git")
        base = LocalProvider.from_settings().build_base(
            source=source, storage_key="bases/app.tar.zst"
        )
        sides = {0: {op: [] for op in OPERATIONS}, args.quota_mb: {op: [] for op in OPERATIONS}}
        for _ in range(args.runs):
            for quota_mb, samples in sides.items():
                one_round(quota_mb=quota_mb, base=base, source=source, samples=samples)

    print(f"\nSANDBOX_DISK_MB: no quota (0) vs {args.quota_mb}, {args.runs} runs each, ms\n")
    print(
        f"{'operation':<20} | {'no quota p50':>12} | {'quota p50':>10} | {'delta':>7} | "
        f"{'quota p95':>9}"
    )
    print(f"{'-' * 20}-|-{'-' * 12}-|-{'-' * 10}-|-{'-' * 7}-|-{'-' * 9}")
    for op in OPERATIONS:
        off, on = sides[0][op], sides[args.quota_mb][op]
        p50_off, p50_on = statistics.median(off), statistics.median(on)
        p95_on = sorted(on)[max(0, int(len(on) * 0.95) - 1)]
        print(
            f"{op:<20} | {p50_off:>12.1f} | {p50_on:>10.1f} | {p50_on - p50_off:>+7.1f} | "
            f"{p95_on:>9.1f}"
        )


if __name__ == "__main__":
    main()
