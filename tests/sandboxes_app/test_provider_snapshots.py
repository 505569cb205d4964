"""Snapshots and bases with real sandboxes and a real filesystem storage: byte-identical
restores of every kind of file, corruption and loss detected, copy-on-write bases."""

import hashlib
import os
import signal
import time

import pytest
from django.core.files.storage import storages

from sandboxes_app.providers.base import (
    GitSource,
    SandboxStatus,
    SnapshotCorrupt,
    SnapshotMissing,
)
from sandboxes_app.providers.local_layout import read_json
from sandboxes_app.providers.local_workspace import tree_bytes
from tests.sandboxes_app.conftest import host_upper

# Every kind of entry a workspace holds, made by the sandbox user inside the sandbox.
BUILD_TREE = r"""
set -e
printf 'plain\n' > plain.txt
printf '#!/bin/sh\necho hi\n' > tool.sh && chmod 755 tool.sh
printf 'secret\n' > private.txt && chmod 600 private.txt
mkdir -p empty/nested && mkdir locked && chmod 700 locked
ln -s plain.txt link && ln -s /nowhere/at/all dangling && ln -s ../README.md src/up
ln plain.txt hardlink.txt
printf 'ünïcødé\n' > 'naïve café ☕.txt' && mkdir 'dír ✓'
head -c 3000000 /dev/urandom > large.bin
touch -d '2001-02-03 04:05:06' plain.txt && touch -h -d '2002-01-01' link
rm README.md && rm -r src/pkg
"""

# One line per entry: path, type, mode, owner, size, mtime, symlink target, link count; then
# each regular file's sha256. GNU find and sha256sum inside the sandbox see what a user sees.
MANIFEST = (
    "find . -path ./.git -prune -o -printf '%P|%y|%m|%U:%G|%s|%T@|%l|%n\\n' | sort; "
    "find . -path ./.git -prune -o -type f -print0 | sort -z | xargs -0 sha256sum"
)


def manifest(provider, name: str) -> str:
    result = provider.run(name=name, argv=["sh", "-c", MANIFEST])
    assert result.exit_code == 0, result.stderr
    return result.stdout


def build_tree(provider, name: str) -> str:
    result = provider.run(name=name, argv=["sh", "-c", BUILD_TREE], timeout_s=30)
    assert result.exit_code == 0, result.stderr
    return manifest(provider, name)


def test_a_restored_workspace_is_identical(provider, source, new_name):
    name, restored = new_name(), new_name()
    provider.create(name=name, source=source)
    before = build_tree(provider, name)

    snapshot = provider.snapshot(name=name, storage_key=f"snapshots/{name}.tar.zst")
    provider.destroy(name=name)
    info = provider.resume(name=restored, snapshot=snapshot)

    assert info.boot == "resume" and info.branch == "main"
    assert manifest(provider, restored) == before
    assert "1000:1000" in before and "2001" not in before  # owned by the sandbox user
    assert "|l|777|1000:1000|9|" in before  # the symlink itself is there, not its target
    status = provider.run(name=restored, argv=["git", "status", "--short"]).stdout
    assert " D README.md" in status and "?? large.bin" in status


def test_a_restored_workspace_on_a_base_is_identical_deletions_included(provider, source, new_name):
    base = provider.build_base(source=source, storage_key="bases/app.tar.zst")
    name, restored = new_name(), new_name()
    provider.create(name=name, source=source, base=base)
    before = build_tree(provider, name)
    # A directory replaced wholesale becomes opaque in the upper layer: its old files must
    # not show through again after a restore.
    provider.run(
        name=name, argv=["sh", "-c", "rm -r scripts && mkdir scripts && echo n > scripts/new"]
    )
    before = manifest(provider, name)

    snapshot = provider.snapshot(name=name, storage_key=f"snapshots/{name}.tar.zst")
    provider.destroy(name=name)
    info = provider.resume(name=restored, snapshot=snapshot)

    assert snapshot.base == base and info.base == base
    after = manifest(provider, restored)
    assert after == before
    paths = {line.split("|")[0] for line in after.splitlines() if "|" in line}
    assert {"README.md", "src/pkg", "src/pkg/main.py", "scripts/run.sh"}.isdisjoint(paths)
    assert {"scripts/new", "large.bin", "empty/nested", "link"} <= paths
    # Only the changes were stored: far less than the 3 MB of random data plus the base.
    assert snapshot.size_bytes < base.size_bytes + 3_200_000


def test_a_flipped_byte_in_storage_is_detected(provider, source, new_name):
    name = new_name()
    provider.create(name=name, source=source)
    snapshot = provider.snapshot(name=name, storage_key=f"snapshots/{name}.tar.zst")
    path = storages["snapshots"].path(snapshot.storage_key)
    with open(path, "r+b") as f:
        f.seek(snapshot.size_bytes // 2)
        byte = f.read(1)
        f.seek(snapshot.size_bytes // 2)
        f.write(bytes([byte[0] ^ 0x01]))
    restored = new_name()

    with pytest.raises(SnapshotCorrupt):
        provider.verify_snapshot(snapshot=snapshot)
    with pytest.raises(SnapshotCorrupt):
        provider.resume(name=restored, snapshot=snapshot)

    assert provider.status(name=restored) == SandboxStatus.ABSENT


def test_a_truncated_object_is_detected(provider, source, new_name):
    name = new_name()
    provider.create(name=name, source=source)
    snapshot = provider.snapshot(name=name, storage_key=f"snapshots/{name}.tar.zst")
    os.truncate(storages["snapshots"].path(snapshot.storage_key), snapshot.size_bytes - 10)

    with pytest.raises(SnapshotCorrupt):
        provider.resume(name=new_name(), snapshot=snapshot)


def test_a_deleted_object_is_missing(provider, source, new_name):
    name = new_name()
    provider.create(name=name, source=source)
    snapshot = provider.snapshot(name=name, storage_key=f"snapshots/{name}.tar.zst")
    provider.verify_snapshot(snapshot=snapshot)

    provider.delete_snapshot(snapshot=snapshot)
    provider.delete_snapshot(snapshot=snapshot)  # missing is not an error
    restored = new_name()

    with pytest.raises(SnapshotMissing):
        provider.verify_snapshot(snapshot=snapshot)
    with pytest.raises(SnapshotMissing):
        provider.resume(name=restored, snapshot=snapshot)
    assert provider.status(name=restored) == SandboxStatus.ABSENT


def test_a_corrupt_base_fails_a_resume_that_needs_it(provider, source, new_name, sandbox_root):
    base = provider.build_base(source=source, storage_key="bases/app.tar.zst")
    name = new_name()
    provider.create(name=name, source=source, base=base)
    snapshot = provider.snapshot(name=name, storage_key=f"snapshots/{name}.tar.zst")
    provider.destroy(name=name)
    provider.delete_snapshot(snapshot=base)

    assert not (sandbox_root / "_bases" / base.sha256).exists()
    with pytest.raises(SnapshotMissing):
        provider.resume(name=new_name(), snapshot=snapshot)


def test_creating_from_a_base_shares_its_files_instead_of_copying(
    provider, origins, new_name, sandbox_root
):
    payload = os.urandom(4_000_000)
    origins.create("acme", "big", {"data/blob.bin": payload, "README.md": "big\n"})
    source = GitSource(clone_url=f"{origins.base_url}/acme/big.git")
    base = provider.build_base(source=source, storage_key="bases/big.tar.zst")
    name = new_name()

    info = provider.create(name=name, source=source, base=base)

    assert info.boot == "base" and info.details["fast_forwarded"] is False
    with host_upper(sandbox_root, name) as upper:
        assert tree_bytes(upper) < 100_000
    digest = provider.run(name=name, argv=["sha256sum", "data/blob.bin"]).stdout.split()[0]
    assert digest == hashlib.sha256(payload).hexdigest()
    # Writing one file copies just that file up.
    provider.run(name=name, argv=["sh", "-c", "echo changed >> README.md"])
    with host_upper(sandbox_root, name) as upper:
        assert tree_bytes(upper) < 100_000


def test_creating_from_a_stale_base_fast_forwards_to_the_origin(
    provider, origins, source, new_name, sandbox_root
):
    base = provider.build_base(source=source, storage_key="bases/app.tar.zst")
    head = origins.commit("acme", "app", {"NEW.md": "added after the base\n"})
    name = new_name()

    info = provider.create(name=name, source=source, base=base)

    assert info.details["fast_forwarded"] is True and info.branch == "main"
    log = provider.run(name=name, argv=["git", "rev-parse", "HEAD"]).stdout.strip()
    assert log == head
    assert provider.run(name=name, argv=["cat", "NEW.md"]).stdout == "added after the base\n"
    assert provider.run(name=name, argv=["git", "status", "--porcelain"]).stdout == ""
    # What git wrote during the fast-forward belongs to the sandbox user.
    with host_upper(sandbox_root, name) as upper:
        owners = {p.stat().st_uid for p in upper.rglob("*") if p.is_file()}
    assert owners == {1000}
    assert (
        provider.run(name=name, argv=["git", "commit", "--allow-empty", "-qm", "x"]).exit_code == 0
    )


def test_a_sandbox_whose_init_was_killed_is_stopped_and_can_still_be_snapshotted(
    provider, source, new_name, sandbox_root
):
    name = new_name()
    provider.create(name=name, source=source)
    provider.run(name=name, argv=["sh", "-c", "echo kept > notes.txt"])
    init = read_json(sandbox_root / name / "init.json")

    os.kill(init["pid"], signal.SIGKILL)  # what a host restart does to it

    deadline = time.monotonic() + 2  # the kernel tears the namespace down asynchronously
    while provider.status(name=name) != SandboxStatus.STOPPED and time.monotonic() < deadline:
        time.sleep(0.01)
    assert provider.status(name=name) == SandboxStatus.STOPPED
    assert provider.probe(name=name) is False
    snapshot = provider.snapshot(name=name, storage_key=f"snapshots/{name}.tar.zst")
    restored = new_name()
    provider.resume(name=restored, snapshot=snapshot)
    assert provider.run(name=restored, argv=["cat", "notes.txt"]).stdout == "kept\n"
    # create() over the stopped workspace restarts it as it was, without recloning.
    again = provider.create(name=name, source=source)
    assert again.details["reused"] is True
    assert provider.status(name=name) == SandboxStatus.RUNNING
    assert provider.run(name=name, argv=["cat", "notes.txt"]).stdout == "kept\n"


def test_a_snapshot_leaves_the_sandbox_running(provider, source, new_name):
    name = new_name()
    provider.create(name=name, source=source)
    provider.run(name=name, argv=["sh", "-c", "sleep 1000 >/dev/null 2>&1 &"])

    provider.snapshot(name=name, storage_key=f"snapshots/{name}.tar.zst")

    assert provider.run(name=name, argv=["pgrep", "-x", "sleep"]).exit_code == 0
    assert provider.run(name=name, argv=["sh", "-c", "echo still writable > w"]).exit_code == 0


def test_a_snapshot_reads_its_object_back_only_after_thawing_the_sandbox(
    provider, source, new_name, monkeypatch
):
    """A checkpoint stalls a running sandbox's commands for the write alone, not the read-back
    (which, from S3, costs as much again); the read-back still happens before it returns."""
    from sandboxes_app.providers import local

    name = new_name()
    provider.create(name=name, source=source)
    provider.run(name=name, argv=["sh", "-c", "head -c 2000000 /dev/urandom > big.bin"])
    frozen_during_read_back = []
    real_verify = local.snapshot_verify

    def observed_verify(**kwargs):
        frozen_during_read_back.append(provider._cgroups(name).is_frozen())
        real_verify(**kwargs)

    monkeypatch.setattr(local, "snapshot_verify", observed_verify)
    info = provider.snapshot(name=name, storage_key=f"snapshots/{name}.tar.zst")

    assert frozen_during_read_back == [False]
    provider.verify_snapshot(snapshot=info)


def test_a_storage_without_local_paths_round_trips(provider, source, new_name, settings):
    # Django's in-memory storage has no path(), as S3 has none: the remote write path runs.
    settings.STORAGES = {
        **settings.STORAGES,
        "snapshots": {"BACKEND": "django.core.files.storage.InMemoryStorage"},
    }
    name, restored = new_name(), new_name()
    provider.create(name=name, source=source)
    before = build_tree(provider, name)

    info = provider.snapshot(name=name, storage_key=f"remote/{name}.tar.zst")
    provider.destroy(name=name)
    provider.resume(name=restored, snapshot=info)

    assert manifest(provider, restored) == before
    with storages["snapshots"].open(info.storage_key, "rb") as stored:
        assert hashlib.sha256(stored.read()).hexdigest() == info.sha256
    storages["snapshots"].delete(info.storage_key)
    with pytest.raises(SnapshotMissing):
        provider.verify_snapshot(snapshot=info)
