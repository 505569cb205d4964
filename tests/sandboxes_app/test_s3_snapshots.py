"""Snapshots in S3 (SNAPSHOT_STORAGE=s3) against a real S3 API, moto's server: identical
restores, bases fetched into a cold cache, damage and loss refused, orphans dropped, and large
snapshots streamed both ways in bounded memory without a local copy."""

import hashlib
import shutil
import subprocess
import tempfile
import tracemalloc
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.core.files.storage import storages

from lifecycle.hibernation import snapshots_drop_unrecorded
from sandboxes_app.models import Snapshot
from sandboxes_app.providers.base import SandboxStatus, SnapshotCorrupt, SnapshotMissing
from sessions_app.models import Session
from tests.sandboxes_app.test_provider_snapshots import build_tree, manifest

MiB = 1024 * 1024


def test_a_workspace_snapshotted_to_s3_resumes_identical(
    provider, source, new_name, s3_bucket, tmp_path
):
    name, restored = new_name(), new_name()
    provider.create(name=name, source=source)
    before = build_tree(provider, name)

    snapshot = provider.snapshot(name=name, storage_key=f"snapshots/{name}.tar.zst")
    provider.destroy(name=name)
    provider.resume(name=restored, snapshot=snapshot)

    assert manifest(provider, restored) == before
    stored = s3_bucket.client.get_object(
        Bucket=s3_bucket.name, Key=s3_bucket.key(snapshot.storage_key)
    )["Body"].read()
    assert len(stored) == snapshot.size_bytes
    assert hashlib.sha256(stored).hexdigest() == snapshot.sha256
    assert not (tmp_path / "snapshots").exists()  # nothing went to the filesystem storage


def test_a_base_in_s3_is_fetched_into_a_cold_cache(
    provider, source, new_name, s3_bucket, sandbox_root
):
    base = provider.build_base(source=source, storage_key="bases/app.tar.zst")
    cache = sandbox_root / "_bases" / base.sha256
    shutil.rmtree(cache)  # as on a host that did not build it
    name = new_name()

    info = provider.create(name=name, source=source, base=base)

    assert info.boot == "base" and cache.is_dir()
    assert s3_bucket.key("bases/app.tar.zst") in s3_bucket.keys()
    assert provider.run(name=name, argv=["cat", "src/pkg/main.py"]).stdout == "print('hello')\n"
    assert provider.run(name=name, argv=["git", "status", "--porcelain"]).stdout == ""


def test_a_damaged_object_in_s3_is_refused_as_corrupt(provider, source, new_name, s3_bucket):
    name = new_name()
    provider.create(name=name, source=source)
    snapshot = provider.snapshot(name=name, storage_key=f"snapshots/{name}.tar.zst")
    key = s3_bucket.key(snapshot.storage_key)
    stored = bytearray(s3_bucket.client.get_object(Bucket=s3_bucket.name, Key=key)["Body"].read())
    stored[len(stored) // 2] ^= 0x01
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key=key, Body=bytes(stored))
    restored = new_name()

    with pytest.raises(SnapshotCorrupt, match="sha256"):
        provider.verify_snapshot(snapshot=snapshot)
    with pytest.raises(SnapshotCorrupt):
        provider.resume(name=restored, snapshot=snapshot)
    assert provider.status(name=restored) == SandboxStatus.ABSENT

    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key=key, Body=bytes(stored[:-10]))
    with pytest.raises(SnapshotCorrupt, match="bytes"):
        provider.resume(name=restored, snapshot=snapshot)


def test_a_deleted_object_in_s3_is_missing(provider, source, new_name, s3_bucket):
    name = new_name()
    provider.create(name=name, source=source)
    snapshot = provider.snapshot(name=name, storage_key=f"snapshots/{name}.tar.zst")
    provider.verify_snapshot(snapshot=snapshot)

    provider.delete_snapshot(snapshot=snapshot)
    provider.delete_snapshot(snapshot=snapshot)  # missing is not an error
    restored = new_name()

    assert s3_bucket.key(snapshot.storage_key) not in s3_bucket.keys()
    with pytest.raises(SnapshotMissing):
        provider.verify_snapshot(snapshot=snapshot)
    with pytest.raises(SnapshotMissing):
        provider.resume(name=restored, snapshot=snapshot)
    assert provider.status(name=restored) == SandboxStatus.ABSENT


def test_dropping_unrecorded_snapshots_deletes_only_the_unrecorded_keys_in_s3(
    owner, provider, source, new_name, s3_bucket
):
    session = Session.objects.create(account=owner.account, title="s3")
    other = Session.objects.create(account=owner.account, title="other")
    name = new_name()
    provider.create(name=name, source=source)
    kept = provider.snapshot(name=name, storage_key=f"sessions/{session.id}/kept.tar.zst")
    Snapshot.objects.create(
        kind=Snapshot.Kind.SESSION,
        storage_key=kept.storage_key,
        size_bytes=kept.size_bytes,
        sha256=kept.sha256,
        created_at=datetime.now(UTC),
        session=session,
        account=owner.account,
    )
    orphan = provider.snapshot(name=name, storage_key=f"sessions/{session.id}/orphan.tar.zst")
    theirs = f"sessions/{other.id}/unrecorded.tar.zst"
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key=s3_bucket.key(theirs), Body=b"x")

    dropped = snapshots_drop_unrecorded(session_id=session.id)

    assert dropped == 1
    assert s3_bucket.keys() == {s3_bucket.key(kept.storage_key), s3_bucket.key(theirs)}
    provider.verify_snapshot(snapshot=kept)
    with pytest.raises(SnapshotMissing):
        provider.verify_snapshot(snapshot=orphan)


@pytest.fixture
def small_tmp(tmp_path, monkeypatch) -> Iterator[Path]:
    """Python's temporary files go to a 4 MiB tmpfs while the test runs: a spool of a whole
    snapshot there fails with ENOSPC."""
    tiny = tmp_path / "tiny-tmp"
    tiny.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(tiny)], check=True)
    monkeypatch.setattr(tempfile, "tempdir", str(tiny))
    yield tiny
    subprocess.run(["umount", str(tiny)], check=True)


def test_a_large_snapshot_streams_through_s3_in_bounded_memory_without_a_local_copy(
    provider, source, new_name, s3_bucket, small_tmp
):
    name, restored = new_name(), new_name()
    provider.create(name=name, source=source)
    made = provider.run(
        name=name,
        argv=["sh", "-c", "head -c 96M /dev/urandom > noise.bin && sha256sum noise.bin"],
        timeout_s=60,
    )
    assert made.exit_code == 0, made.stderr

    # botocore loads its service models (~10 MiB, once per process) on first use: not the
    # snapshot's memory.
    storages["snapshots"].exists("warm-up")
    tracemalloc.start()
    try:
        snapshot = provider.snapshot(name=name, storage_key=f"snapshots/{name}.tar.zst")
        _, upload_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        provider.resume(name=restored, snapshot=snapshot)
        _, download_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert snapshot.size_bytes > 96 * MiB  # random data does not compress
    # Four 8 MiB parts at most, whatever the size: the object was never whole in memory (nor,
    # with a 4 MiB temporary dir, on local disk). Reading it back holds a chunk or two.
    assert upload_peak < 40 * MiB, upload_peak
    assert download_peak < 8 * MiB, download_peak
    head = s3_bucket.client.head_object(
        Bucket=s3_bucket.name, Key=s3_bucket.key(snapshot.storage_key)
    )
    parts = int(head["ETag"].strip('"').rpartition("-")[2])  # "<md5 of md5s>-<parts>"
    assert parts == -(-snapshot.size_bytes // (8 * MiB))
    again = provider.run(name=restored, argv=["sha256sum", "noise.bin"])
    assert again.stdout == made.stdout
