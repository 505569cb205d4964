"""Snapshot objects: a directory as a zstd-compressed tar in the "snapshots" Django storage.

GNU tar does the tree walking because it keeps everything a workspace (or an overlay upper
layer) holds: modes, numeric owners, symlinks, hardlinks, empty dirs, mtimes, whiteouts (0/0
character devices) and the `trusted.overlay.opaque` xattr. Python hashes and compresses the
stream so the sha256 is of exactly the bytes stored.

On a filesystem storage the object is written under a temporary name, fsynced and renamed, so
the key only ever names a complete object. On S3 (sandboxes_app.snapshot_s3) it is streamed up
as a multipart upload, which S3 shows under its key only once completed, so there too the key
only ever names a complete object; neither the upload nor a read holds more than a few parts
in memory or on local disk. Other Django storages are handed a local spool of the object.
Every write is verified by reading the stored object back, and every read checks the sha256.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import zstandard
from django.core.files import File
from django.core.files.storage import FileSystemStorage, Storage, storages

from sandboxes_app.providers.base import ProviderError, SnapshotCorrupt, SnapshotMissing

CHUNK = 1024 * 1024
# Overlay's other xattrs (origin, impure...) point at this host's inodes; only opacity matters.
_TAR_XATTRS = ["--xattrs", "--xattrs-include=trusted.overlay.opaque", "--xattrs-include=user.*"]


def snapshot_storage() -> Storage:
    return storages["snapshots"]


def _local_path(storage: Storage, key: str) -> Path | None:
    # By type, not by path(): some remote-like backends (InMemoryStorage) answer path() too.
    if isinstance(storage, FileSystemStorage):
        return Path(storage.path(key))
    return None


def _is_s3(storage: Storage) -> bool:
    # boto3 is slow to import (~0.3 s); an S3 storage has loaded its module already.
    module = sys.modules.get("storages.backends.s3")
    return module is not None and isinstance(storage, module.S3Storage)


def snapshot_write(*, source: Path, storage_key: str, verify: bool = True) -> tuple[str, int]:
    """Store `source` under `storage_key`; returns (sha256, size) of the stored object.

    `verify=False` leaves reading it back to the caller, who must (`snapshot_verify`) before
    trusting it: a sandbox frozen for its snapshot need not stay frozen during the read."""
    tar = subprocess.Popen(
        ["tar", "--create", "--file=-", "--format=posix", "--numeric-owner", *_TAR_XATTRS]
        + ["--directory", str(source), "."],
        stdout=subprocess.PIPE,
        stderr=tempfile.TemporaryFile(),
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
    )
    hasher = hashlib.sha256()
    size = 0

    def compressed() -> Iterator[bytes]:
        nonlocal size
        reader = zstandard.ZstdCompressor(level=3, threads=-1).stream_reader(tar.stdout)
        while chunk := reader.read(CHUNK):
            hasher.update(chunk)
            size += len(chunk)
            yield chunk

    storage = snapshot_storage()
    try:
        local = _local_path(storage, storage_key)
        if local is not None:
            _write_local(local, compressed())
        elif _is_s3(storage):
            from sandboxes_app.snapshot_s3 import s3_upload

            s3_upload(storage=storage, storage_key=storage_key, chunks=compressed())
        else:
            _write_remote(storage, storage_key, compressed())
    finally:
        tar.stdout.close()
        code = tar.wait()
    if code != 0:
        tar.stderr.seek(0)
        raise ProviderError(f"tar failed: {tar.stderr.read().decode(errors='replace')[:500]}")
    sha256 = hasher.hexdigest()
    if verify:
        snapshot_verify(storage_key=storage_key, sha256=sha256, size_bytes=size)
    return sha256, size


def _write_local(path: Path, chunks: Iterator[bytes]) -> None:
    # Workspaces of every tenant: readable by root alone, like SANDBOX_ROOT.
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _write_remote(storage: Storage, key: str, chunks: Iterator[bytes]) -> None:
    # Spooled locally first: remote backends want a seekable file to upload.
    with tempfile.TemporaryFile() as spool:
        for chunk in chunks:
            spool.write(chunk)
        spool.seek(0)
        if storage.exists(key):
            storage.delete(key)
        saved = storage.save(key, File(spool))
    if saved != key:
        raise ProviderError(f"Snapshot storage saved {saved!r} instead of {key!r}")


def _stored(*, storage_key: str, size_bytes: int) -> Iterator[bytes]:
    """The stored object in CHUNK pieces; SnapshotMissing or SnapshotCorrupt (a size other than
    `size_bytes`) are raised here, before any is read."""
    storage = snapshot_storage()
    if _is_s3(storage):
        from sandboxes_app.snapshot_s3 import s3_open

        return s3_open(storage=storage, storage_key=storage_key, size_bytes=size_bytes)
    if not storage.exists(storage_key):
        raise SnapshotMissing(f"Snapshot {storage_key} is missing from storage")
    actual = storage.size(storage_key)
    if actual != size_bytes:
        raise SnapshotCorrupt(
            f"Snapshot {storage_key} is {actual} bytes, {size_bytes} were recorded"
        )
    return _read(storage, storage_key)


def _read(storage: Storage, storage_key: str) -> Iterator[bytes]:
    with storage.open(storage_key, "rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


def snapshot_verify(*, storage_key: str, sha256: str, size_bytes: int) -> None:
    """Raise SnapshotMissing or SnapshotCorrupt unless the stored bytes hash to `sha256`."""
    hasher = hashlib.sha256()
    for chunk in _stored(storage_key=storage_key, size_bytes=size_bytes):
        hasher.update(chunk)
    if hasher.hexdigest() != sha256:
        raise SnapshotCorrupt(f"Snapshot {storage_key} does not match its sha256")


def snapshot_extract(*, storage_key: str, sha256: str, size_bytes: int, dest: Path) -> None:
    """Unpack the object into the empty dir `dest`, verifying it on the way.

    Raises SnapshotMissing/SnapshotCorrupt; the caller discards `dest` then. The hash is checked
    over the same single read that feeds tar, so a verified restore costs one pass.
    """
    chunks = _stored(storage_key=storage_key, size_bytes=size_bytes)
    hasher = hashlib.sha256()
    errors = tempfile.TemporaryFile()
    tar = subprocess.Popen(
        ["tar", "--extract", "--file=-", "--numeric-owner", "--same-owner", "--same-permissions"]
        + [*_TAR_XATTRS, "--directory", str(dest)],
        stdin=subprocess.PIPE,
        stderr=errors,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
    )
    damaged = False
    try:
        decompressor = zstandard.ZstdDecompressor().decompressobj()
        for chunk in chunks:
            hasher.update(chunk)
            if damaged:
                continue  # keep hashing so the error says what is wrong
            try:
                tar.stdin.write(decompressor.decompress(chunk))
            except (zstandard.ZstdError, BrokenPipeError):
                damaged = True
    finally:
        with contextlib.suppress(BrokenPipeError):
            tar.stdin.close()
        code = tar.wait()
    if hasher.hexdigest() != sha256:
        raise SnapshotCorrupt(f"Snapshot {storage_key} does not match its sha256")
    if damaged or code != 0:
        errors.seek(0)
        detail = errors.read().decode(errors="replace")[:300]
        raise SnapshotCorrupt(f"Snapshot {storage_key} does not unpack: {detail}")


def snapshot_delete(*, storage_key: str) -> None:
    storage = snapshot_storage()
    with contextlib.suppress(FileNotFoundError):
        storage.delete(storage_key)
