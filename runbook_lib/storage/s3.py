"""S3-compatible store over boto3 (AWS S3, Cloudflare R2, MinIO, Backblaze B2, provider S3 APIs).

* Uploads stream through :class:`~runbook_lib.storage.HashingReader` into boto3's managed
  transfer (multipart above ``multipart_threshold``), so sha256 is computed in the same single
  read and kept as object metadata ``x-amz-meta-sha256``: set at upload when the writer already
  knows the digest (and checked against the streamed one), else recorded by a server-side copy
  of the object onto itself (no local bytes are read again).
* Downloads stream through :class:`~runbook_lib.storage.HashingWriter` and are checked for size
  and sha256. The ETags of objects we wrote are never compared with MD5s: a multipart ETag
  (``"...-N"``) is not an MD5. An object someone else wrote (a user's checkpoint,
  :meth:`S3Store.copy_foreign`) is checked against every whole-object record S3 keeps for it.
* boto3 1.36+ adds default request checksums (CRC) that some S3-compatible stores reject or store
  inside the object; ``checksum_mode`` (``when_required`` by default here, or ``when_supported``,
  boto3's default) sets botocore's ``request_checksum_calculation`` and
  ``response_checksum_validation`` and is recorded in evidence
  (https://docs.aws.amazon.com/sdkref/latest/guide/feature-dataintegrity.html).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from runbook_lib.errors import AuthError, RunbookError, StorageError
from runbook_lib.storage.base import HashingReader, HashingWriter, ObjectInfo, Store, accept_download, progress_bar

META_SHA256 = "sha256"
MIB = 1 << 20


@dataclass(frozen=True)
class ForeignObject:
    """An object the runbook did not write (a user's checkpoint file in their bucket), copied to
    this host by :meth:`S3Store.copy_foreign`.

    Attributes:
        key: the store-relative key. size_bytes: its size, bytes. etag: S3's ETag (quotes
        removed). version_id: the version read (None in an unversioned bucket). last_modified:
        ISO 8601 UTC. sha256: hex digest of the bytes copied. verified_by: every whole-object
        record of S3's the copy matched (see :func:`foreign_checks`); empty: size only.
    """

    key: str
    size_bytes: int
    etag: str
    version_id: str | None
    last_modified: str
    sha256: str
    verified_by: tuple[str, ...]


CHECKSUM_ALGORITHMS = ("CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256")
"""S3's additional checksums (``Checksum<ALG>`` in a HEAD or GET answered with ``ChecksumMode:
ENABLED``), https://docs.aws.amazon.com/AmazonS3/latest/userguide/checking-object-integrity.html."""


def _botocore_has_crt() -> bool:
    """Whether botocore validates a GET body against ``ChecksumCRC32C`` and ``ChecksumCRC64NVME``
    here: both need the AWS CRT (``awscrt``), which is optional (botocore/httpchecksum.py)."""
    from botocore import httpchecksum

    return bool(getattr(httpchecksum, "HAS_CRT", False))


def foreign_checks(head: Mapping[str, Any], *, size: int, sha256_hex: str, md5_hex: str,
                   crc32: int | None = None, sha1_hex: str | None = None) -> tuple[str, ...]:
    """Check bytes copied from an object someone else wrote against what S3 records for it.

    ``head``: the object's ``HeadObject`` answer (asked with ``ChecksumMode: ENABLED``); the
    digests are of the bytes copied (``crc32``: zlib's CRC-32, the one S3 calls CRC32). Checked,
    each when present: the size; an ``x-amz-meta-sha256`` (hex, any case); a whole-object
    ``ChecksumSHA256``, ``ChecksumSHA1`` or ``ChecksumCRC32`` (base64 of the big-endian digest; a
    composite one, ``...-N`` or ``ChecksumType: COMPOSITE``, covers parts, not the object), compared
    here; ``ChecksumCRC32C`` and ``ChecksumCRC64NVME`` only where botocore validates them while the
    GET body streams (with the AWS CRT installed), else not counted; the ETag as an MD5, only
    where S3 documents it is one: a single-part object (no ``-N``) not encrypted with SSE-KMS,
    DSSE-KMS or SSE-C (S3 API reference, Object.ETag,
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_Object.html).

    Returns:
        What matched, e.g. ``("sha256 (ChecksumSHA256)", "md5 (single-part ETag)")``; empty when
        S3 keeps no whole-object record checked here (the copy was checked by size only).

    Raises:
        StorageError: a size or a recorded digest differs (the message names both values).
    """
    want = int(head["ContentLength"])
    if size != want:
        raise StorageError(f"copied {size} bytes, the object has {want}: truncated in transit; copy it again")
    out: list[str] = []
    recorded = str((head.get("Metadata") or {}).get(META_SHA256) or "").lower()
    if recorded:
        if recorded != sha256_hex:
            raise StorageError(f"bytes hash to sha256 {sha256_hex[:16]}…, the object's x-amz-meta-sha256 says "
                               f"{recorded[:16]}…: corrupt in transit or rewritten without its metadata")
        out.append("sha256 (x-amz-meta-sha256)")
    mine = {"SHA256": bytes.fromhex(sha256_hex), "SHA1": bytes.fromhex(sha1_hex) if sha1_hex else None,
            "CRC32": crc32.to_bytes(4, "big") if crc32 is not None else None}
    for alg in CHECKSUM_ALGORITHMS:
        value = str(head.get(f"Checksum{alg}") or "")
        if not value or "-" in value or head.get("ChecksumType") == "COMPOSITE":
            continue
        digest = mine.get(alg)
        if digest is not None:
            ours = base64.b64encode(digest).decode()
            if value != ours:
                raise StorageError(f"bytes give {ours} (base64 {alg.lower()}), S3's Checksum{alg} is {value}: corrupt "
                                   "in transit; copy it again")
            out.append(f"{alg.lower()} (Checksum{alg})")
        elif _botocore_has_crt():  # CRC32C, CRC64NVME
            out.append(f"{alg.lower()} (Checksum{alg}, validated by botocore)")
    etag = str(head.get("ETag", "")).strip('"').lower()
    encrypted = str(head.get("ServerSideEncryption") or "").startswith("aws:kms") or bool(
        head.get("SSECustomerAlgorithm"))
    if etag and "-" not in etag and not encrypted and re.fullmatch(r"[0-9a-f]{32}", etag):
        if etag != md5_hex:
            raise StorageError(f"bytes hash to md5 {md5_hex}, the object's single-part ETag is {etag}: corrupt in "
                               "transit; copy it again (an S3-compatible store whose ETags are not MD5s for "
                               "unencrypted single-part objects breaks S3's documented contract)")
        out.append("md5 (single-part ETag)")
    return tuple(out)


# Error fields that carry no credential and help to name the cause (S3 puts AWSAccessKeyId,
# StringToSign and CanonicalRequest into some error bodies too: those are never read).
_SAFE_FIELDS = ("RequestTime", "ServerTime", "MaxAllowedSkewMilliseconds", "Region", "Endpoint", "Bucket")
_KEY_ID = re.compile(r"\b(?:AKIA|ASIA|AIDA|AROA)[A-Z0-9]{12,}\b")
_EXPECTED_REGION = re.compile(r"expecting '([A-Za-z0-9-]+)'")
_SSE_C_WORDS = ("customer", "server side encryption", "server-side encryption", "sse-c", "encryption parameters")
_ACTION = {"get": "s3:GetObject", "head": "s3:GetObject", "put": "s3:PutObject (and s3:GetObject for the copy)",
           "list": "s3:ListBucket", "delete": "s3:DeleteObject", "create bucket": "s3:CreateBucket"}
_TOKEN = {"ExpiredToken": "the session token has expired",
          "TokenRefreshRequired": "the session token must be refreshed",
          "InvalidToken": "the session token is malformed or invalid"}
_THROTTLE = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests",
             "TooManyRequestsException", "ServiceUnavailable", "503", "429"}
_KMS = {"KMS.DisabledException": ("the KMS key that encrypts this bucket or object is disabled",
                                  "enable it (aws kms enable-key --key-id <key>) or point the bucket's default "
                                  "encryption at an enabled key"),
        "KMS.NotFoundException": ("the KMS key named by the bucket's default encryption or the request does not exist "
                                  "(or is in another region or account)",
                                  "fix the key id in the bucket's default encryption (aws s3api "
                                  "get-bucket-encryption shows it), or use SSE-S3"),
        "KMS.KMSInvalidStateException": ("the KMS key is in a state that cannot be used (pending deletion, "
                                         "pending import or unavailable)",
                                         "cancel a scheduled deletion (aws kms cancel-key-deletion) and enable the "
                                         "key, or re-encrypt with another key")}


def _redact(text: str, secrets: Iterable[str]) -> str:
    for s in sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True):
        text = text.replace(s, "[credential]")
    return _KEY_ID.sub("[access key id]", text)


@dataclass(frozen=True)
class _Seen:
    """An S3 error response as :func:`diagnose` reads it: the operation and URL (``at``), what
    the store said (``seen``: code, status and message), the code and status, the message
    (``text``, ``low`` lower-cased), the error's safe fields, the region the store expects and the
    one this store signs for, and whether the error had a body."""

    at: str
    seen: str
    code: str
    status: int
    low: str
    text: str
    info: dict[str, str]
    expected: str
    region: str
    bare: bool
    where: str
    op: str

    def fields(self) -> tuple[str, str, str, int, str, str, dict[str, str], str, str, bool, str, str]:
        return (self.at, self.seen, self.code, self.status, self.low, self.text, self.info, self.expected,
                self.region, self.bare, self.where, self.op)


def diagnose(op: str, where: str, code: str, status: int, message: str, region_hint: str = "", *,
             region: str = "", details: Mapping[str, Any] | None = None, redact: Iterable[str] = ()) -> RunbookError:
    """The error to raise for an S3 error response, diagnosed by its error code first and its HTTP
    status second, with a message that says what failed, the code and value seen, and what to do.

    Codes and their meanings follow Amazon S3's error reference
    (https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html). A HEAD response has no
    body, so botocore gives the status as the code (``"403"``) and the cause cannot be told from it
    (https://docs.aws.amazon.com/AmazonS3/latest/API/API_HeadObject.html): the message then lists
    the possible causes and the checks that tell them apart.

    Args:
        op: the operation (``"get"``, ``"put"``, ``"head"``, ``"list"``, ``"delete"``, ``"create bucket"``).
        where: the object or bucket URL (``s3://bucket/key``).
        code: the ``Error.Code`` botocore parsed (``"AccessDenied"``), or the status as text for a HEAD.
        status: the HTTP status code (0 when unknown).
        message: the ``Error.Message`` the store sent.
        region_hint: the bucket's region as the store named it (``x-amz-bucket-region`` header or the
            error's ``Region``), or ``""``.
        region: the region this store signs for.
        details: the rest of the parsed ``Error``; only non-secret fields are read (request and
            server time, region, endpoint, bucket).
        redact: credential values to keep out of the message (key ids shaped like AWS's are
            always masked).

    Returns:
        :class:`~runbook_lib.errors.AuthError` for credential, signature, clock, permission, region and
        KMS-permission causes; :class:`~runbook_lib.errors.StorageError` otherwise. Never raises.
    """
    code = (code or "").strip()
    status = int(status or 0)
    info = {k: str((details or {}).get(k) or "") for k in _SAFE_FIELDS}
    text = " ".join((message or "").split())[:300]
    c = _Seen(at=f"{op} {where}", seen=f"{code or 'no code'}, HTTP {status or '?'}" + (f": {text}" if text else ""),
              code=code, status=status, low=text.lower(), text=text, info=info,
              expected=region_hint or info["Region"] or next(iter(_EXPECTED_REGION.findall(text)), ""),
              region=region, bare=not code or code == str(status), where=where, op=op)  # bare: no error body
    found = _credential_cause(c) or _region_cause(c) or _policy_cause(c) or _bare_cause(c)
    assert found is not None  # _bare_cause ends with a catch-all
    cls, out = found
    msg = _redact(out, redact)
    return AuthError(msg, provider="s3", resource_id=where) if cls is AuthError else cls(msg)


def _credential_cause(c: _Seen) -> tuple[type[RunbookError], str] | None:
    """KMS, SSE-C, clock, session token, signature and key-id causes. None when the error is none of
    them."""
    at, seen, code, status, low, text, info, expected, region, bare, where, op = c.fields()
    cls: type[RunbookError]
    cls, out = AuthError, ""
    if code.startswith("KMS.") or ("kms" in low and code in ("AccessDenied", "InvalidArgument", "InvalidRequest")):
        if code in ("KMS.AccessDeniedException", "AccessDenied"):
            out = (f"{at}: the identity may use the bucket but not the KMS key that encrypts it ({seen}). Grant "
                   "kms:Decrypt (reads) and kms:GenerateDataKey (writes) on that key to the identity the params' "
                   "storage credentials resolve to, in the key policy or IAM.")
        else:
            what, fix = _KMS.get(code, ("the KMS key that encrypts this bucket or object refused the request",
                                        "check the bucket's default encryption key and its state "
                                        "(aws kms describe-key)"))
            cls, out = StorageError, f"{at}: {what} ({seen}). {fix[0].upper()}{fix[1:]}."
    elif code in ("InvalidRequest", "InvalidArgument") and any(w in low for w in _SSE_C_WORDS):
        cls, out = StorageError, (
            f"{at}: the object is encrypted with a customer-provided key (SSE-C) and the request did not carry "
            f"it, or carried another ({seen}). The runbook sends no SSE-C keys: copy the object with its key "
            "into a bucket that uses SSE-S3 or SSE-KMS, and write checkpoints there.")
    elif code == "RequestTimeTooSkewed":
        times = ", ".join(f"{k} {info[k]}" for k in ("RequestTime", "ServerTime") if info[k])
        out = (f"{at}: the store rejected the request time: this machine's clock differs from the store's by more "
               f"than the allowed skew (15 minutes on AWS) ({seen}{'; ' + times if times else ''}). Sync the "
               "clock (timedatectl set-ntp true, or chronyc makestep) and retry.")
    elif code in _TOKEN:
        out = (f"{at}: {_TOKEN[code]} ({seen}). Get fresh temporary credentials (aws sso login, or assume the role "
               "again) and update the session token the params' storage credentials refer to.")
    elif code == "RequestExpired":
        out = (f"{at}: the signed request reached the store after its validity window ({seen}): a presigned URL "
               "expired, or this machine's clock is behind. Sync the clock and sign a new request.")
    elif code == "SignatureDoesNotMatch":
        out = (f"{at}: the store computed a different signature ({seen}): the secret access key does not belong "
               "to the access key id, or something rewrote the request. Copy the secret key for this key id into "
               "the secret the params refer to again (no trailing newline or space), and check endpoint_url and "
               "that no proxy alters the request.")
    elif code in ("InvalidAccessKeyId", "InvalidClientTokenId"):
        out = (f"{at}: the store does not know the access key id ({seen}): it was deleted or deactivated, belongs "
               "to another account or provider (an R2 or MinIO key sent to AWS, or the reverse), or the "
               "environment holds a stale value. Check the key id the params' credentials for this store refer to "
               "(storage, or workload.checkpoint_store for a checkpoint's bucket) and that endpoint_url names the "
               "provider that issued it.")
    else:
        return None
    return cls, out


def _region_cause(c: _Seen) -> tuple[type[RunbookError], str] | None:
    """A bucket in another region than the store signs for, or a malformed authorization header. None
    when the error is none of them."""
    at, seen, code, status, low, text, info, expected, region, bare, where, op = c.fields()
    cls: type[RunbookError]
    cls, out = AuthError, ""
    if (code in ("AuthorizationHeaderMalformed", "PermanentRedirect", "IllegalLocationConstraintException")
          or status == 301 or (bare and status in (400, 403) and expected and region and expected != region)):
        endpoint = info["Endpoint"]
        if expected and expected != region:
            out = (f"{at}: the bucket is in region {expected!r}, the store is configured for {region or '?'!r} "
                   f"({seen}). Set the storage region to {expected} in params"
                   + (f" (endpoint {endpoint})" if endpoint else "") + ".")
        elif code == "AuthorizationHeaderMalformed":
            out = (f"{at}: the store could not read the request's authorization header ({seen}). Usually the "
                   f"signing region is wrong (configured {region or '?'!r}) or the access key id is empty: set the "
                   "storage region to the bucket's region and check the key id reference resolves to a value.")
        elif code == "IllegalLocationConstraintException":
            out = (f"{at}: the bucket's location constraint does not match the endpoint's region (configured "
                   f"{region or '?'!r}) ({seen}). Create the bucket with the endpoint of its region, or set the "
                   "storage region to the region the bucket must live in.")
        else:
            out = (f"{at}: the bucket is in another region than {region or '?'!r} and the store did not say which "
                   f"({seen}" + (f"; endpoint {endpoint}" if endpoint else "") + "). Find it with aws s3api "
                   "get-bucket-location and set the storage region in params.")
    else:
        return None
    return cls, out


def _policy_cause(c: _Seen) -> tuple[type[RunbookError], str] | None:
    """Policy denials, a disabled bucket or account, a missing bucket or key, a changed object,
    throttling, internal errors. None when the error is none of them."""
    at, seen, code, status, low, text, info, expected, region, bare, where, op = c.fields()
    cls: type[RunbookError]
    cls, out = AuthError, ""
    if code == "AccessDenied":
        action = _ACTION.get(op, "this operation")
        out = (f"{at}: access denied by a policy: the credentials were accepted but a bucket policy, IAM policy, "
               f"SCP, block-public-access rule or object ACL denies {action} ({seen}). Grant {action} on "
               f"{where} to the identity the params' storage credentials resolve to (aws sts "
               "get-caller-identity shows it), or fix the bucket policy.")
    elif code == "AllAccessDisabled":
        out = (f"{at}: the provider has disabled all access to this bucket ({seen}). No params change fixes it: "
               "contact the provider's support, or use another bucket.")
    elif code == "AccountProblem":
        out = (f"{at}: a problem with the storage account (billing, suspension) blocks the request ({seen}). Check "
               "the account's status and billing with the provider, then retry.")
    elif code == "NoSuchBucket":
        cls, out = StorageError, (
            f"{at}: object or bucket does not exist ({code}): the bucket is not there at this endpoint "
            f"({seen}). Check the bucket name in the store URL, endpoint_url and region, or create the bucket.")
    elif code in ("NoSuchKey", "404", "NotFound") or status == 404:
        cls, out = StorageError, (
            f"{at}: object or bucket does not exist ({code or status}): nothing at this key ({seen}). Check the "
            "key and prefix; a set that was never completed has no marker and no manifest.")
    elif code == "PreconditionFailed" or status == 412:
        cls, out = StorageError, (
            f"{at}: the object changed while it was read ({code or status}: its ETag no longer matches the one "
            f"read first, {seen}): someone wrote it meanwhile. Copy it again once writers have stopped; a "
            "versioned bucket lets a copy pin the version instead.")
    elif code in _THROTTLE or status in (429, 503):
        cls, out = StorageError, (
            f"{at}: the store is throttling requests ({seen}), still after botocore's retries. Retry later, and "
            "lower max_concurrency or spread keys over more prefixes if it keeps happening.")
    elif code in ("InternalError", "InternalFailure") or status >= 500:
        cls, out = StorageError, (
            f"{at}: the store failed internally ({seen}), still after botocore's retries. Retry later; if it "
            "persists, check the provider's status page.")
    else:
        return None
    return cls, out


def _bare_cause(c: _Seen) -> tuple[type[RunbookError], str] | None:
    """An error without a body (a HEAD), refused credentials, and anything else. None when the error is
    none of them."""
    at, seen, code, status, low, text, info, expected, region, bare, where, op = c.fields()
    cls: type[RunbookError]
    cls, out = AuthError, ""
    if bare and status == 403:
        out = (f"{at}: HTTP 403 with no error body ({seen}), as S3 answers every failed HEAD, so the cause cannot be told "
               "from it. It is one of: the object is missing and the identity lacks s3:ListBucket; a policy "
               "denies s3:GetObject; the KMS key denies kms:Decrypt; an SSE-C object read without its key; "
               "refused or expired credentials; clock skew. Check: aws sts get-caller-identity with the same "
               "credentials, the machine's clock, and a GET of the object (aws s3api get-object), which returns "
               "the error code.")
    elif bare and status == 400:
        cls, out = StorageError, (
            f"{at}: HTTP 400 with no error body ({seen}), as S3 answers every failed HEAD, so the cause cannot be told "
            f"from it. It is one of: the bucket is in another region than {region or '?'!r}; an SSE-C object "
            "read without its key; an expired session token. Check: aws s3api get-bucket-location, and a GET of "
            "the object (aws s3api get-object), which returns the error code.")
    elif status in (401, 403):
        out = (f"{at}: the store refused the credentials ({code or status}, HTTP {status}"
               + (f": {text}" if text else "") + "); check the storage credential references in params and the "
               "bucket policy.")
    else:
        cls, out = StorageError, f"{at} failed: {code or status}: {text}"
    return cls, out


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
    """

    scheme = "s3"

    def __init__(self, bucket: str, prefix: str = "", *, client: Any = None, endpoint_url: str = "",
                 region: str = "", checksum_mode: str = "when_required", create_bucket: bool = False,
                 access_key_id: str | None = None, secret_access_key: str | None = None,
                 session_token: str | None = None, multipart_threshold_bytes: int = 8 * MIB,
                 multipart_chunksize_bytes: int = 8 * MIB, max_concurrency: int = 8) -> None:
        if checksum_mode not in ("when_required", "when_supported"):
            raise StorageError(f"checksum_mode must be when_required or when_supported, got {checksum_mode!r}")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self.region = region or "us-east-1"
        self.checksum_mode = checksum_mode
        self._creds = (access_key_id, secret_access_key)
        self._session_token = session_token
        self._presigner: Any = None
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
            self._client = self._make_client("s3")
        return self._client

    def _make_client(self, service: str, **config: Any) -> Any:
        """A boto3 client of ``service`` (``s3``, ``sts``) at this store's endpoint, region and
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

    def presigner(self) -> Any:
        """A boto3 S3 client that signs with Signature Version 4 (``s3v4``), for presigned URLs
        and POST policies: without it botocore may presign with Signature Version 2
        (``AWSAccessKeyId=...&Expires=...``), which new AWS buckets refuse. A SigV4 presigned URL
        is valid for at most 7 days (604800 s) and no longer than the credentials that signed it
        (https://docs.aws.amazon.com/AmazonS3/latest/userguide/using-presigned-url.html)."""
        if self._presigner is None:
            self._presigner = self._make_client("s3", signature_version="s3v4")
        return self._presigner

    def sts(self) -> Any:
        """A boto3 STS client with this store's endpoint, region and credentials (a store whose
        S3 API has STS beside it, as AWS and moto's server do)."""
        return self._make_client("sts")

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
        """Translate botocore errors into our tree, once, naming the operation and object
        (:func:`diagnose` reads the error code, not only the HTTP status)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except ClientError as exc:
            raise self._diagnose(op, key, exc.response) from None
        except BotoCoreError as exc:
            raise StorageError(f"{op} {self.url(key)} failed: {type(exc).__name__}: {exc}") from None

    def _diagnose(self, op: str, key: str, response: dict[str, Any]) -> RunbookError:
        error = response.get("Error") or {}
        meta = response.get("ResponseMetadata") or {}
        headers = meta.get("HTTPHeaders") or {}
        hint = str(headers.get("x-amz-bucket-region") or error.get("Region") or "")
        return diagnose(op, self.url(key), str(error.get("Code") or ""), int(meta.get("HTTPStatusCode") or 0),
                        str(error.get("Message") or ""), hint, region=self.region, details=error,
                        redact=self._secrets())

    def _secrets(self) -> list[str]:
        """Credential values this store resolved (key id, secret, session token), to keep out of
        messages. An injected client's own credentials are not read (botocore exposes them only
        through private attributes); :func:`diagnose` reads no field that echoes them and masks
        anything shaped like an AWS key id."""
        return [v for v in (*self._creds, self._session_token) if v]

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
            with open(dest, "wb") as f, self._errors("get", key):
                writer = HashingWriter(f, bar)
                self._download(key, writer, recorded.size_bytes)
        finally:
            if bar is not None:
                bar.close()
        return accept_download(key, self.url(key), dest, ObjectInfo(key, writer.size, writer.sha256.hexdigest()),
                               expect, recorded)

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
            return bytes(r["Body"].read())

        starts = iter(range(0, size, chunk))
        with ThreadPoolExecutor(max_workers=self._transfer_kw["max_concurrency"]) as pool:
            pending = deque(pool.submit(fetch, s) for _, s in zip(range(self._transfer_kw["max_concurrency"]), starts, strict=False))
            while pending:
                writer.write(pending.popleft().result())
                nxt = next(starts, None)
                if nxt is not None:
                    pending.append(pool.submit(fetch, nxt))

    def copy_foreign(self, key: str, dest: str | Path, *, progress: bool = False) -> ForeignObject:
        """Copy an object someone else wrote (no ``x-amz-meta-sha256`` of ours need exist) to
        ``dest``, checked by :func:`foreign_checks`. The GET is pinned to the version (or, in an
        unversioned bucket, the ETag) the HEAD saw, so an object replaced meanwhile fails rather
        than mixing versions.

        Raises:
            StorageError: the object is missing, changed during the copy, or its bytes differ from
                what S3 records (``dest`` is removed). AuthError: the store refused the
                credentials (diagnosed by error code, :func:`diagnose`).
        """
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with self._errors("head", key):
            head = self.client.head_object(Bucket=self.bucket, Key=self.object_key(key), ChecksumMode="ENABLED")
        size = int(head["ContentLength"])
        pin = {"VersionId": head["VersionId"]} if head.get("VersionId") else {"IfMatch": head["ETag"]}
        sha, md5, sha1 = hashlib.sha256(), hashlib.md5(usedforsecurity=False), hashlib.sha1(usedforsecurity=False)
        crc = 0
        bar = progress_bar(size, f"copy {key}", progress)
        got = 0
        try:
            with open(dest, "wb") as f, self._errors("get", key):
                body = self.client.get_object(Bucket=self.bucket, Key=self.object_key(key), ChecksumMode="ENABLED",
                                              **pin)["Body"]
                for part in body.iter_chunks(1 << 20):
                    sha.update(part)
                    md5.update(part)
                    sha1.update(part)
                    crc = zlib.crc32(part, crc)
                    got += len(part)
                    f.write(part)
                    if bar is not None:
                        bar.update(len(part))
            checks = foreign_checks(head, size=got, sha256_hex=sha.hexdigest(), md5_hex=md5.hexdigest(), crc32=crc,
                                    sha1_hex=sha1.hexdigest())
        except StorageError as exc:
            dest.unlink(missing_ok=True)
            raise StorageError(f"{self.url(key)}: {exc}") from None
        except OSError as exc:
            dest.unlink(missing_ok=True)
            raise StorageError(f"{self.url(key)}: cannot be written to {dest}: {exc.strerror}; the key must be a "
                               "valid file path of the checkpoint") from None
        except BaseException:
            dest.unlink(missing_ok=True)
            raise
        finally:
            if bar is not None:
                bar.close()
        modified = head.get("LastModified")
        return ForeignObject(key, got, str(head.get("ETag", "")).strip('"'), head.get("VersionId"),
                             modified.isoformat() if hasattr(modified, "isoformat") else str(modified or ""),
                             sha.hexdigest(), checks)

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
