"""How the runbook host names and reaches one S3 bucket: :class:`BucketPath` (store keys to bucket
keys and ``s3://`` URLs) and :class:`S3Connection` (the boto3 clients of one endpoint, region and
identity).

boto3 1.36+ adds default request checksums (CRC) that some S3-compatible stores reject or store
inside the object; ``checksum_mode`` (``when_required`` by default here, or ``when_supported``,
boto3's default) sets botocore's ``request_checksum_calculation`` and
``response_checksum_validation``
(https://docs.aws.amazon.com/sdkref/latest/guide/feature-dataintegrity.html).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runbook_lib.errors import StorageError
from runbook_lib.storage.s3_errors import ErrorTranslator

META_SHA256 = "sha256"
"""The user-metadata name (``x-amz-meta-sha256``) under which every object the runbook writes
records the hex sha256 of its bytes."""
CHECKSUM_MODES = ("when_required", "when_supported")
"""botocore's ``request_checksum_calculation`` / ``response_checksum_validation`` values."""


@dataclass(frozen=True)
class BucketPath:
    """A store root inside a bucket: ``s3://bucket/prefix``.

    Attributes:
        bucket: the bucket name. prefix: the key prefix of the store root (no leading or
            trailing slash; ``""`` for the bucket's root).
    """

    bucket: str
    prefix: str = ""

    def object_key(self, key: str) -> str:
        """The bucket key of store key ``key`` (the prefix joined in front)."""
        return f"{self.prefix}/{key}" if self.prefix else key

    def url(self, key: str = "") -> str:
        """The ``s3://`` URL of store key ``key``, or of the store root."""
        path = "/".join(p for p in (self.prefix, key) if p)
        return f"s3://{self.bucket}/{path}" if path else f"s3://{self.bucket}"


class S3Connection:
    """The boto3 clients of one S3 API endpoint, region and identity, built on first use.

    Args:
        endpoint_url: S3 API endpoint for non-AWS stores (``http://127.0.0.1:5000``); ``""``: AWS.
        region: region name (``us-east-1`` when empty).
        checksum_mode: one of :data:`CHECKSUM_MODES`.
        access_key_id, secret_access_key: resolved credentials, or None for boto3's own chain.
        session_token: the session token of temporary credentials, or None.
        client: a boto3 S3 client to use instead of building one (tests inject a stubbed one).

    Raises:
        StorageError: ``checksum_mode`` is not one of :data:`CHECKSUM_MODES`.
    """

    def __init__(self, endpoint_url: str = "", region: str = "", checksum_mode: str = "when_required", *,
                 access_key_id: str | None = None, secret_access_key: str | None = None,
                 session_token: str | None = None, client: Any = None) -> None:
        if checksum_mode not in CHECKSUM_MODES:
            raise StorageError(f"checksum_mode must be when_required or when_supported, got {checksum_mode!r}")
        self.endpoint_url = endpoint_url
        self.region = region or "us-east-1"
        self.checksum_mode = checksum_mode
        self._creds = (access_key_id, secret_access_key)
        self._session_token = session_token
        self._s3 = client
        self._presigner: Any = None

    @property
    def s3(self) -> Any:
        """The boto3 S3 client requests go through (the injected one, or one built on first use)."""
        if self._s3 is None:
            self._s3 = self._client("s3")
        return self._s3

    def presigner(self) -> Any:
        """A boto3 S3 client that signs with Signature Version 4 (``s3v4``), for presigned URLs
        and POST policies: without it botocore may presign with Signature Version 2
        (``AWSAccessKeyId=...&Expires=...``), which new AWS buckets refuse. A SigV4 presigned URL
        is valid for at most 7 days (604800 s) and no longer than the credentials that signed it
        (https://docs.aws.amazon.com/AmazonS3/latest/userguide/using-presigned-url.html)."""
        if self._presigner is None:
            self._presigner = self._client("s3", signature_version="s3v4")
        return self._presigner

    def sts(self) -> Any:
        """A boto3 STS client with this endpoint, region and credentials (a store whose S3 API has
        STS beside it, as AWS and moto's server do)."""
        return self._client("sts")

    def _client(self, service: str, **config: Any) -> Any:
        """A boto3 client of ``service`` (``s3``, ``sts``) at this endpoint, region and
        credentials; ``config``: extra ``botocore.config.Config`` settings."""
        import boto3
        from botocore.config import Config

        cfg = Config(request_checksum_calculation=self.checksum_mode,
                     response_checksum_validation=self.checksum_mode,
                     retries={"max_attempts": 5, "mode": "standard"}, s3={"addressing_style": "path"}, **config)
        kw: dict[str, Any] = {"region_name": self.region, "config": cfg}
        if self.endpoint_url:
            kw["endpoint_url"] = self.endpoint_url
        if self._creds[0] and self._creds[1]:
            kw["aws_access_key_id"], kw["aws_secret_access_key"] = self._creds
            if self._session_token:
                kw["aws_session_token"] = self._session_token
        return boto3.client(service, **kw)

    def secrets(self) -> tuple[str, ...]:
        """The credential values given (key id, secret, session token), to keep out of messages."""
        return tuple(v for v in (*self._creds, self._session_token) if v)

    def settings(self) -> dict[str, Any]:
        """The connection as evidence records it: endpoint, region, checksum mode (no credentials)."""
        return {"endpoint_url": self.endpoint_url or "(AWS default)", "region": self.region,
                "checksum_mode": self.checksum_mode}

    def ensure_bucket(self, bucket: str, errors: ErrorTranslator) -> None:
        """Create ``bucket`` in this region unless a ``HeadBucket`` finds it (local test servers).

        Raises:
            StorageError, AuthError: the store refused the creation (diagnosed by ``errors``).
        """
        from botocore.exceptions import ClientError

        try:
            self.s3.head_bucket(Bucket=bucket)
        except ClientError:
            with errors.translating("create bucket", ""):
                kw: dict[str, Any] = {"Bucket": bucket}
                if self.region != "us-east-1":
                    kw["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
                self.s3.create_bucket(**kw)
