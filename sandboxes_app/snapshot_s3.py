"""Snapshot objects in S3 (django-storages' S3Storage), moved as streams.

S3Storage's own save() wants a seekable file and its open() downloads the whole object before
the first read (into memory, by default), so a snapshot would pass through a local copy of its
full size both ways. Here the compressed chunks go up as a multipart upload fed from a
non-seekable reader, and come down from one GET body read in pieces: memory stays within a few
parts, whatever the snapshot's size.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError
from botocore.response import StreamingBody
from storages.backends.s3 import S3Storage
from storages.utils import clean_name

from sandboxes_app.providers.base import SnapshotCorrupt, SnapshotMissing

CHUNK = 1024 * 1024
PART = 8 * 1024 * 1024
# At most 10,000 parts: 80 GiB a snapshot, far past any workspace's disk quota. The classic
# transfer manager, not the CRT one, which ignores the bound on parts held in memory.
TRANSFER = TransferConfig(
    multipart_threshold=PART,
    multipart_chunksize=PART,
    max_concurrency=2,
    preferred_transfer_client="classic",
)
# Parts read ahead of the uploads (s3transfer's default is 10): with two uploading, ~4 parts,
# 32 MiB, in memory at worst.
TRANSFER.max_in_memory_upload_chunks = 2


class ChunkReader(io.RawIOBase):
    """A read-once, non-seekable file over an iterator of byte chunks.

    A read returns all it was asked for unless the chunks run out: boto3 takes each read of a
    non-seekable file as one part, and S3 refuses parts under 5 MiB but the last.
    """

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._pending = b""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        # Joined once, to exactly `size`: RawIOBase.read would fill a bytearray and copy it,
        # and slicing a longer join would copy it again, a part in memory twice either way.
        pieces, have = [], 0
        while size < 0 or have < size:
            chunk = self._pending or next(self._chunks, b"")
            if not chunk:
                break
            take = len(chunk) if size < 0 else min(len(chunk), size - have)
            pieces.append(chunk[:take] if take < len(chunk) else chunk)
            self._pending = chunk[take:]
            have += take
        return b"".join(pieces)

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def s3_key(storage: S3Storage, storage_key: str) -> str:
    """The bucket key of `storage_key`: under the storage's prefix (AWS_LOCATION), as S3Storage
    itself names it in save(), exists() and listdir()."""
    return storage._normalize_name(clean_name(storage_key))


def s3_upload(*, storage: S3Storage, storage_key: str, chunks: Iterator[bytes]) -> None:
    """Upload the chunks as one object. Parts of a multipart upload stay invisible until it is
    completed, so the key never names a partial object; a failed upload is aborted."""
    obj = storage.bucket.Object(s3_key(storage, storage_key))
    obj.upload_fileobj(
        ChunkReader(chunks),
        ExtraArgs={"ContentType": "application/zstd", **storage.get_object_parameters(obj.key)},
        Config=TRANSFER,
    )


def s3_open(*, storage: S3Storage, storage_key: str, size_bytes: int) -> Iterator[bytes]:
    """The object's bytes in pieces of CHUNK, from one GET streamed as it is read.

    Raises SnapshotMissing when there is no such key and SnapshotCorrupt when its size is not
    `size_bytes`, here, before a byte is read.
    """
    client = storage.connection.meta.client
    try:
        response = client.get_object(Bucket=storage.bucket_name, Key=s3_key(storage, storage_key))
    except ClientError as error:
        if error.response["Error"]["Code"] in ("NoSuchKey", "404"):
            raise SnapshotMissing(f"Snapshot {storage_key} is missing from storage") from None
        raise
    body = response["Body"]
    if response["ContentLength"] != size_bytes:
        body.close()
        raise SnapshotCorrupt(
            f"Snapshot {storage_key} is {response['ContentLength']} bytes, "
            f"{size_bytes} were recorded"
        )
    return _drain(body)


def _drain(body: StreamingBody) -> Iterator[bytes]:
    try:
        yield from body.iter_chunks(CHUNK)
    finally:
        body.close()
