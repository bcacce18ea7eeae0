"""Streamed, hashed transfers of one object between the runbook host and an S3 bucket
(:class:`MultipartTransfer`).

Uploads stream through :class:`~runbook_lib.storage.HashingReader` into boto3's managed
transfer (multipart above ``multipart_threshold``), so sha256 is computed in the same single read
and kept as object metadata ``x-amz-meta-sha256``. Downloads stream into a
:class:`~runbook_lib.storage.HashingWriter` in order, in byte ranges above the threshold.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from runbook_lib.errors import StorageError
from runbook_lib.storage.base import HashingReader, HashingWriter, ObjectInfo
from runbook_lib.storage.s3_bucket import META_SHA256, BucketPath, S3Connection
from runbook_lib.storage.s3_errors import ErrorTranslator

MIB = 1 << 20


class MultipartTransfer:
    """Moves object bytes between this host and the bucket at ``location`` in one streamed pass.

    Args:
        connection: the clients. location: the store root in the bucket. errors: how botocore
            errors are reported.
        threshold_bytes: objects larger than this go in parts (multipart upload, ranged download).
        chunksize_bytes: the size of one part or range, bytes.
        max_concurrency: parts or ranges in flight at once.
    """

    def __init__(self, connection: S3Connection, location: BucketPath, errors: ErrorTranslator, *,
                 threshold_bytes: int = 8 * MIB, chunksize_bytes: int = 8 * MIB, max_concurrency: int = 8) -> None:
        self.connection = connection
        self.location = location
        self.errors = errors
        self.threshold_bytes = threshold_bytes
        self.chunksize_bytes = chunksize_bytes
        self.max_concurrency = max_concurrency

    def settings(self) -> dict[str, int]:
        """The transfer settings as evidence records them (boto3's ``TransferConfig`` names)."""
        return {"multipart_threshold": self.threshold_bytes, "multipart_chunksize": self.chunksize_bytes,
                "max_concurrency": self.max_concurrency}

    def config(self) -> Any:
        """These settings as a boto3 ``TransferConfig`` (for ``upload_fileobj`` and ``copy``)."""
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(**self.settings())

    def upload(self, f: Any, key: str, *, sha256: str | None = None, progress: Any = None) -> ObjectInfo:
        """Upload from a readable file object to store key ``key`` in one pass, hashing as it streams.

        With ``sha256`` (known from when the bytes were written, e.g. a checkpoint writer that
        hashed while writing) it is stored as metadata at upload and the streamed digest must
        match, else the object is deleted. Without it, the digest is recorded afterwards by a
        server-side copy of the object onto itself (no local bytes are read again, but the store
        copies the object once: for multi-GB objects prefer passing ``sha256``). ``progress``: a
        tqdm bar to advance by the bytes read, or None.

        Raises:
            StorageError: the read or the upload failed (boto3 aborts a failed multipart upload,
                so no partial object is left), or the bytes differ from ``sha256``.
        """
        reader = HashingReader(f, progress)
        extra = {"Metadata": {META_SHA256: sha256}} if sha256 else {}
        bucket, bucket_key = self.location.bucket, self.location.object_key(key)
        try:
            with self.errors.translating("put", key):
                s3 = self.connection.s3
                s3.upload_fileobj(reader, bucket, bucket_key, ExtraArgs=extra or None, Config=self.config())
                digest = reader.sha256.hexdigest()
                if sha256 and digest != sha256:
                    s3.delete_object(Bucket=bucket, Key=bucket_key)
                    raise StorageError(f"put {self.location.url(key)}: the bytes read hash to {digest[:16]}..., the "
                                       f"writer recorded {sha256[:16]}...; the file changed after it was written "
                                       "(object removed). Re-create it from a verified copy.")
                if not sha256:
                    s3.copy({"Bucket": bucket, "Key": bucket_key}, bucket, bucket_key,
                            ExtraArgs={"Metadata": {META_SHA256: digest}, "MetadataDirective": "REPLACE"},
                            Config=self.config())
        except OSError as exc:
            raise StorageError(f"put {self.location.url(key)} failed while reading the source: {exc}") from exc
        return ObjectInfo(key, reader.size, digest)

    def download(self, key: str, writer: HashingWriter, size: int) -> None:
        """Stream store key ``key`` (``size`` bytes) into ``writer`` in order. Above the threshold,
        byte ranges of ``chunksize_bytes`` are fetched ``max_concurrency`` at a time and written in
        order, so memory stays at about (concurrency + 1) x chunk size whatever the object's size;
        each range request carries ``If-Match`` with the ETag, so an object replaced mid-download
        fails. botocore errors propagate untranslated (the caller translates them).

        (boto3's ``download_fileobj`` into a non-seekable writer can deadlock in s3transfer's
        ordered-output path, seen with s3transfer 0.19; this keeps the order itself.)
        """
        s3, bucket, bucket_key = self.connection.s3, self.location.bucket, self.location.object_key(key)
        chunk = self.chunksize_bytes
        if size <= self.threshold_bytes:
            body = s3.get_object(Bucket=bucket, Key=bucket_key)["Body"]
            for part in body.iter_chunks(1 << 20):
                writer.write(part)
            return
        etag = s3.head_object(Bucket=bucket, Key=bucket_key)["ETag"]

        def fetch(first: int) -> bytes:
            last = min(first + chunk, size) - 1
            r = s3.get_object(Bucket=bucket, Key=bucket_key, Range=f"bytes={first}-{last}", IfMatch=etag)
            return bytes(r["Body"].read())

        starts = iter(range(0, size, chunk))
        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            pending = deque(pool.submit(fetch, s) for _, s in zip(range(self.max_concurrency), starts, strict=False))
            while pending:
                writer.write(pending.popleft().result())
                nxt = next(starts, None)
                if nxt is not None:
                    pending.append(pool.submit(fetch, nxt))
