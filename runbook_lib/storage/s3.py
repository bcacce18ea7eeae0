"""S3-compatible store over boto3 (AWS S3, Cloudflare R2, MinIO, Backblaze B2, provider S3 APIs):
:class:`S3Store`, composed of the parts each of these modules owns:

* :mod:`runbook_lib.storage.s3_bucket`: the store root's names (:class:`BucketPath`) and the
  boto3 clients of its endpoint, region and identity (:class:`S3Connection`, with presigning and
  STS). ``checksum_mode`` (``when_required`` by default here, or ``when_supported``, boto3's
  default) is recorded in evidence.
* :mod:`runbook_lib.storage.s3_errors`: what an error response means (:func:`diagnose`) and
  the translation of botocore errors (:class:`ErrorTranslator`).
* :mod:`runbook_lib.storage.s3_transfer`: streamed, hashed uploads and downloads
  (:class:`MultipartTransfer`). sha256 is computed in the same single read and kept as object
  metadata ``x-amz-meta-sha256``: set at upload when the writer already knows the digest (and
  checked against the streamed one), else recorded by a server-side copy of the object onto
  itself (no local bytes are read again). Downloads are checked for size and sha256.
* :mod:`runbook_lib.storage.s3_foreign`: objects someone else wrote (a user's checkpoint,
  :meth:`S3Store.copy_foreign`), checked against every whole-object record S3 keeps for them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from runbook_lib.errors import StorageError
from runbook_lib.storage.base import HashingWriter, ObjectInfo, Store, accept_download, progress_bar
from runbook_lib.storage.s3_bucket import META_SHA256, BucketPath, S3Connection
from runbook_lib.storage.s3_errors import ErrorTranslator, diagnose
from runbook_lib.storage.s3_foreign import ForeignCopier, ForeignObject, foreign_checks
from runbook_lib.storage.s3_transfer import MIB, MultipartTransfer

# Importable from here as well as from the modules that define them.
__all__ = ["META_SHA256", "ForeignObject", "S3Store", "diagnose", "foreign_checks"]


class S3Store(Store):
    """Objects under ``s3://bucket/prefix``.

    Args:
        bucket: bucket name.
        prefix: key prefix inside the bucket (no leading or trailing slash).
        client: a boto3 S3 client (injected by tests); built lazily when None.
        endpoint_url: S3 API endpoint for non-AWS stores (``http://127.0.0.1:5000``).
        region: region name (``us-east-1`` when empty).
        checksum_mode: ``when_required`` or ``when_supported``.
        create_bucket: create the bucket when it does not exist (local test servers).
        access_key_id, secret_access_key: resolved credentials, or None for boto3's own chain.
        session_token: the session token of temporary credentials (a pod's session grant,
            :mod:`runbook_lib.storage.grants`), or None.
        multipart_threshold_bytes, multipart_chunksize_bytes, max_concurrency: transfer settings.

    Attributes:
        connection: the boto3 clients (:class:`~runbook_lib.storage.s3_bucket.S3Connection`;
            ``connection.presigner()`` signs presigned URLs and POST policies, ``connection.sts()``
            asks STS). location: the store root (:class:`~runbook_lib.storage.s3_bucket.BucketPath`).
        errors: the botocore error translation (:class:`~runbook_lib.storage.s3_errors.ErrorTranslator`).
        transfer: streamed uploads and downloads
            (:class:`~runbook_lib.storage.s3_transfer.MultipartTransfer`; ``transfer.upload``
            uploads from a file object). foreign: copies of objects someone else wrote
            (:class:`~runbook_lib.storage.s3_foreign.ForeignCopier`).

    Raises:
        StorageError: ``checksum_mode`` is not ``when_required`` or ``when_supported``.
    """

    scheme = "s3"

    def __init__(self, bucket: str, prefix: str = "", *, client: Any = None, endpoint_url: str = "",
                 region: str = "", checksum_mode: str = "when_required", create_bucket: bool = False,
                 access_key_id: str | None = None, secret_access_key: str | None = None,
                 session_token: str | None = None, multipart_threshold_bytes: int = 8 * MIB,
                 multipart_chunksize_bytes: int = 8 * MIB, max_concurrency: int = 8) -> None:
        self.connection = S3Connection(endpoint_url, region, checksum_mode, access_key_id=access_key_id,
                                       secret_access_key=secret_access_key, session_token=session_token,
                                       client=client)
        self.location = BucketPath(bucket, prefix.strip("/"))
        self.bucket, self.prefix = self.location.bucket, self.location.prefix
        self.endpoint_url = self.connection.endpoint_url
        self.region = self.connection.region
        self.checksum_mode = self.connection.checksum_mode
        self.errors = ErrorTranslator(self.url, self.region, self.connection.secrets())
        self.transfer = MultipartTransfer(self.connection, self.location, self.errors,
                                          threshold_bytes=multipart_threshold_bytes,
                                          chunksize_bytes=multipart_chunksize_bytes, max_concurrency=max_concurrency)
        self.foreign = ForeignCopier(self.connection, self.location, self.errors)
        if create_bucket:
            self.connection.ensure_bucket(self.bucket, self.errors)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> "S3Store":
        """``s3://bucket[/prefix]`` plus the constructor's keyword options."""
        rest = url[len("s3://"):]
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise StorageError(f"store URL {url!r} names no bucket; use s3://<bucket>[/<prefix>]")
        return cls(bucket, prefix, **options)

    def settings(self) -> dict[str, Any]:
        return {"scheme": "s3", "url": self.url(), **self.connection.settings(), **self.transfer.settings()}

    @property
    def client(self) -> Any:
        """The boto3 S3 client this store's requests go through (built on first use)."""
        return self.connection.s3

    def object_key(self, key: str) -> str:
        """The bucket key of store key ``key`` (the store's prefix joined in front)."""
        return self.location.object_key(key)

    def url(self, key: str = "") -> str:
        return self.location.url(key)

    def put_file(self, src: str | Path, key: str, *, sha256: str | None = None, progress: bool = False) -> ObjectInfo:
        """As :meth:`Store.put_file`, streamed by :meth:`MultipartTransfer.upload
        <runbook_lib.storage.s3_transfer.MultipartTransfer.upload>`; an object whose size differs
        from the file's once read (the file changed meanwhile) is removed."""
        size = Path(src).stat().st_size
        bar = progress_bar(size, f"put {key}", progress)
        try:
            with open(src, "rb") as f:
                info = self.transfer.upload(f, key, sha256=sha256, progress=bar)
        except OSError as exc:
            raise StorageError(f"put {src} -> {self.url(key)} failed: {exc.strerror}") from exc
        finally:
            if bar is not None:
                bar.close()
        if info.size_bytes != size:
            self.delete(key)
            raise StorageError(f"put {src}: read {info.size_bytes} bytes, the file has {size}; it changed during "
                               "upload (object removed)")
        return info

    def put_bytes(self, data: bytes, key: str) -> ObjectInfo:
        digest = hashlib.sha256(data).hexdigest()
        with self.errors.translating("put", key):
            self.client.put_object(Bucket=self.bucket, Key=self.object_key(key), Body=data, Metadata={META_SHA256: digest})
        return ObjectInfo(key, len(data), digest)

    def head(self, key: str) -> ObjectInfo | None:
        from botocore.exceptions import ClientError

        try:
            r = self.client.head_object(Bucket=self.bucket, Key=self.object_key(key))
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return None
            with self.errors.translating("head", key):
                raise
        return ObjectInfo(key, int(r["ContentLength"]), r.get("Metadata", {}).get(META_SHA256))

    def get_bytes(self, key: str) -> bytes:
        with self.errors.translating("get", key):
            return bytes(self.client.get_object(Bucket=self.bucket, Key=self.object_key(key))["Body"].read())

    def get_file(self, key: str, dest: str | Path, *, expect: ObjectInfo | None = None,
                 progress: bool = False) -> ObjectInfo:
        recorded = self.head(key)
        if recorded is None:
            raise StorageError(f"object {self.url(key)} does not exist")
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        bar = progress_bar(recorded.size_bytes, f"get {key}", progress)
        try:
            with open(dest, "wb") as f, self.errors.translating("get", key):
                writer = HashingWriter(f, bar)
                self.transfer.download(key, writer, recorded.size_bytes)
        finally:
            if bar is not None:
                bar.close()
        return accept_download(key, self.url(key), dest, ObjectInfo(key, writer.size, writer.sha256.hexdigest()),
                               expect, recorded)

    def copy_foreign(self, key: str, dest: str | Path, *, progress: bool = False) -> ForeignObject:
        """Copy an object someone else wrote to ``dest``, checked against S3's records of it
        (:meth:`ForeignCopier.copy <runbook_lib.storage.s3_foreign.ForeignCopier.copy>`, which
        says what it raises)."""
        return self.foreign.copy(key, dest, progress=progress)

    def list(self, prefix: str = "") -> list[str]:
        base = self.object_key(prefix).rstrip("/") + "/" if prefix else (self.prefix + "/" if self.prefix else "")
        keys: list[str] = []
        with self.errors.translating("list", prefix):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base):
                keys += [o["Key"] for o in page.get("Contents", [])]
        strip = len(self.prefix) + 1 if self.prefix else 0
        return sorted(k[strip:] for k in keys)

    def delete(self, key: str) -> None:
        with self.errors.translating("delete", key):
            self.client.delete_object(Bucket=self.bucket, Key=self.object_key(key))

    def delete_prefix(self, prefix: str) -> None:
        keys = self.list(prefix)
        with self.errors.translating("delete", prefix):
            for i in range(0, len(keys), 1000):
                self.client.delete_objects(Bucket=self.bucket,
                                           Delete={"Objects": [{"Key": self.object_key(k)} for k in keys[i:i + 1000]]})
