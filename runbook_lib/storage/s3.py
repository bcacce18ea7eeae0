"""S3-compatible store over boto3 (AWS S3, Cloudflare R2, MinIO, Backblaze B2, provider S3 APIs).

* Uploads stream through :class:`~runbook_lib.storage.HashingReader` into boto3's managed
  transfer (multipart above ``multipart_threshold``), so sha256 is computed in the same single
  read and kept as object metadata ``x-amz-meta-sha256``: set at upload when the writer already
  knows the digest (and checked against the streamed one), else recorded by a server-side copy
  of the object onto itself (no local bytes are read again).
* Downloads stream through :class:`~runbook_lib.storage.HashingWriter` and are checked for size
  and sha256. ETags are never compared with MD5s: a multipart ETag (``"...-N"``) is not an MD5.
* boto3 1.36+ adds default request checksums (CRC) that some S3-compatible stores reject or store
  inside the object; ``checksum_mode`` (``when_required`` by default here, or ``when_supported``,
  boto3's default) sets botocore's ``request_checksum_calculation`` and
  ``response_checksum_validation`` and is recorded in evidence
  (https://docs.aws.amazon.com/sdkref/latest/guide/feature-dataintegrity.html).
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import Any, Iterator

from runbook_lib.errors import AuthError, StorageError
from runbook_lib.storage.base import HashingReader, HashingWriter, ObjectInfo, Store, check, progress_bar

META_SHA256 = "sha256"
MIB = 1 << 20


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
        multipart_threshold_bytes, multipart_chunksize_bytes, max_concurrency: transfer settings.
    """

    scheme = "s3"

    def __init__(self, bucket: str, prefix: str = "", *, client: Any = None, endpoint_url: str = "",
                 region: str = "", checksum_mode: str = "when_required", create_bucket: bool = False,
                 access_key_id: str | None = None, secret_access_key: str | None = None,
                 multipart_threshold_bytes: int = 8 * MIB, multipart_chunksize_bytes: int = 8 * MIB,
                 max_concurrency: int = 8) -> None:
        if checksum_mode not in ("when_required", "when_supported"):
            raise StorageError(f"checksum_mode must be when_required or when_supported, got {checksum_mode!r}")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self.region = region or "us-east-1"
        self.checksum_mode = checksum_mode
        self._creds = (access_key_id, secret_access_key)
        self._client = client
        self._transfer_kw = {"multipart_threshold": multipart_threshold_bytes,
                             "multipart_chunksize": multipart_chunksize_bytes, "max_concurrency": max_concurrency}
        if create_bucket:
            self._ensure_bucket()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> "S3Store":
        """``s3://bucket[/prefix]`` plus the constructor's keyword options."""
        rest = url[len("s3://"):]
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise StorageError(f"store URL {url!r} names no bucket; use s3://<bucket>[/<prefix>]")
        return cls(bucket, prefix, **options)

    def settings(self) -> dict[str, Any]:
        return {"scheme": "s3", "url": self.url(), "endpoint_url": self.endpoint_url or "(AWS default)",
                "region": self.region, "checksum_mode": self.checksum_mode, **self._transfer_kw}

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3
            from botocore.config import Config

            cfg = Config(request_checksum_calculation=self.checksum_mode,
                         response_checksum_validation=self.checksum_mode,
                         retries={"max_attempts": 5, "mode": "standard"}, s3={"addressing_style": "path"})
            kw: dict[str, Any] = {"region_name": self.region, "config": cfg}
            if self.endpoint_url:
                kw["endpoint_url"] = self.endpoint_url
            if self._creds[0] and self._creds[1]:
                kw["aws_access_key_id"], kw["aws_secret_access_key"] = self._creds
            self._client = boto3.client("s3", **kw)
        return self._client

    def _transfer(self) -> Any:
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(**self._transfer_kw)

    def object_key(self, key: str) -> str:
        """The bucket key of store key ``key`` (the store's prefix joined in front)."""
        return f"{self.prefix}/{key}" if self.prefix else key

    def url(self, key: str = "") -> str:
        path = "/".join(p for p in (self.prefix, key) if p)
        return f"s3://{self.bucket}/{path}" if path else f"s3://{self.bucket}"

    @contextlib.contextmanager
    def _errors(self, op: str, key: str) -> Iterator[None]:
        """Translate botocore errors into our tree, once, naming the operation and object."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            where = self.url(key)
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken") or status == 403:
                raise AuthError(f"{op} {where}: the store refused the credentials ({code}); check the "
                                "storage credential references in params") from None
            if code in ("NoSuchKey", "404", "NotFound", "NoSuchBucket"):
                raise StorageError(f"{op} {where}: object or bucket does not exist ({code})") from None
            raise StorageError(f"{op} {where} failed: {code or status}: {exc.response.get('Error', {}).get('Message', '')}") \
                from None
        except BotoCoreError as exc:
            raise StorageError(f"{op} {self.url(key)} failed: {type(exc).__name__}: {exc}") from None

    def _ensure_bucket(self) -> None:
        from botocore.exceptions import ClientError

        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError:
            with self._errors("create bucket", ""):
                kw: dict[str, Any] = {"Bucket": self.bucket}
                if self.region != "us-east-1":
                    kw["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
                self.client.create_bucket(**kw)

    def put_file(self, src: str | Path, key: str, *, sha256: str | None = None, progress: bool = False) -> ObjectInfo:
        size = Path(src).stat().st_size
        bar = progress_bar(size, f"put {key}", progress)
        try:
            with open(src, "rb") as f:
                info = self.put_fileobj(f, key, sha256=sha256, progress=bar)
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

    def put_fileobj(self, f: Any, key: str, *, sha256: str | None = None, progress: Any = None) -> ObjectInfo:
        """Upload from a readable file object in one pass, hashing as it streams.

        With ``sha256`` (known from when the bytes were written, e.g. a checkpoint writer that
        hashed while writing) it is stored as metadata at upload and the streamed digest must
        match, else the object is deleted. Without it, the digest is recorded afterwards by a
        server-side copy of the object onto itself (no local bytes are read again, but the store
        copies the object once: for multi-GB objects prefer passing ``sha256``).

        Raises:
            StorageError: the read or the upload failed (boto3 aborts a failed multipart upload,
                so no partial object is left), or the bytes differ from ``sha256``.
        """
        reader = HashingReader(f, progress)
        extra = {"Metadata": {META_SHA256: sha256}} if sha256 else {}
        try:
            with self._errors("put", key):
                self.client.upload_fileobj(reader, self.bucket, self.object_key(key), ExtraArgs=extra or None,
                                           Config=self._transfer())
                digest = reader.sha256.hexdigest()
                if sha256 and digest != sha256:
                    self.client.delete_object(Bucket=self.bucket, Key=self.object_key(key))
                    raise StorageError(f"put {self.url(key)}: the bytes read hash to {digest[:16]}..., the writer "
                                       f"recorded {sha256[:16]}...; the file changed after it was written (object "
                                       "removed). Re-create it from a verified copy.")
                if not sha256:
                    self.client.copy({"Bucket": self.bucket, "Key": self.object_key(key)}, self.bucket, self.object_key(key),
                                     ExtraArgs={"Metadata": {META_SHA256: digest}, "MetadataDirective": "REPLACE"},
                                     Config=self._transfer())
        except OSError as exc:
            raise StorageError(f"put {self.url(key)} failed while reading the source: {exc}") from exc
        return ObjectInfo(key, reader.size, digest)

    def put_bytes(self, data: bytes, key: str) -> ObjectInfo:
        digest = hashlib.sha256(data).hexdigest()
        with self._errors("put", key):
            self.client.put_object(Bucket=self.bucket, Key=self.object_key(key), Body=data, Metadata={META_SHA256: digest})
        return ObjectInfo(key, len(data), digest)

    def head(self, key: str) -> ObjectInfo | None:
        from botocore.exceptions import ClientError

        try:
            r = self.client.head_object(Bucket=self.bucket, Key=self.object_key(key))
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return None
            with self._errors("head", key):
                raise
        return ObjectInfo(key, int(r["ContentLength"]), r.get("Metadata", {}).get(META_SHA256))

    def get_bytes(self, key: str) -> bytes:
        with self._errors("get", key):
            return self.client.get_object(Bucket=self.bucket, Key=self.object_key(key))["Body"].read()

    def get_file(self, key: str, dest: str | Path, *, expect: ObjectInfo | None = None,
                 progress: bool = False) -> ObjectInfo:
        recorded = self.head(key)
        if recorded is None:
            raise StorageError(f"object {self.url(key)} does not exist")
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        bar = progress_bar(recorded.size_bytes, f"get {key}", progress)
        try:
            with open(dest, "wb") as f, self._errors("get", key):
                writer = HashingWriter(f, bar)
                self._download(key, writer, recorded.size_bytes)
        finally:
            if bar is not None:
                bar.close()
        got = ObjectInfo(key, writer.size, writer.sha256.hexdigest())
        try:
            check(key, self.url(key), got, expect or recorded)
            if recorded.sha256 and got.sha256 != recorded.sha256:
                raise StorageError(f"{self.url(key)}: bytes hash to {(got.sha256 or '')[:16]}..., object metadata says "
                                   f"{recorded.sha256[:16]}...; the object is corrupt")
        except StorageError:
            dest.unlink(missing_ok=True)
            raise
        return got

    def _download(self, key: str, writer: HashingWriter, size: int) -> None:
        """Stream ``key`` into ``writer`` in order. Above the multipart threshold, byte ranges of
        ``multipart_chunksize`` are fetched ``max_concurrency`` at a time and written in order, so
        memory stays at about (concurrency + 1) x chunk size whatever the object's size; each range
        request carries ``If-Match`` with the ETag, so an object replaced mid-download fails.

        (boto3's ``download_fileobj`` into a non-seekable writer can deadlock in s3transfer's
        ordered-output path, seen with s3transfer 0.19; this keeps the order ourselves.)
        """
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor

        chunk = self._transfer_kw["multipart_chunksize"]
        if size <= self._transfer_kw["multipart_threshold"]:
            body = self.client.get_object(Bucket=self.bucket, Key=self.object_key(key))["Body"]
            for part in body.iter_chunks(1 << 20):
                writer.write(part)
            return
        etag = self.client.head_object(Bucket=self.bucket, Key=self.object_key(key))["ETag"]

        def fetch(first: int) -> bytes:
            last = min(first + chunk, size) - 1
            r = self.client.get_object(Bucket=self.bucket, Key=self.object_key(key), Range=f"bytes={first}-{last}", IfMatch=etag)
            return r["Body"].read()

        starts = iter(range(0, size, chunk))
        with ThreadPoolExecutor(max_workers=self._transfer_kw["max_concurrency"]) as pool:
            pending = deque(pool.submit(fetch, s) for _, s in zip(range(self._transfer_kw["max_concurrency"]), starts, strict=False))
            while pending:
                writer.write(pending.popleft().result())
                nxt = next(starts, None)
                if nxt is not None:
                    pending.append(pool.submit(fetch, nxt))

    def list(self, prefix: str = "") -> list[str]:
        base = self.object_key(prefix).rstrip("/") + "/" if prefix else (self.prefix + "/" if self.prefix else "")
        keys: list[str] = []
        with self._errors("list", prefix):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base):
                keys += [o["Key"] for o in page.get("Contents", [])]
        strip = len(self.prefix) + 1 if self.prefix else 0
        return sorted(k[strip:] for k in keys)

    def delete(self, key: str) -> None:
        with self._errors("delete", key):
            self.client.delete_object(Bucket=self.bucket, Key=self.object_key(key))

    def delete_prefix(self, prefix: str) -> None:
        keys = self.list(prefix)
        with self._errors("delete", prefix):
            for i in range(0, len(keys), 1000):
                self.client.delete_objects(Bucket=self.bucket,
                                           Delete={"Objects": [{"Key": self.object_key(k)} for k in keys[i:i + 1000]]})
