"""Objects the runbook did not write (a user's checkpoint in their bucket): copied to this host by
:class:`ForeignCopier` and checked by :func:`foreign_checks` against every whole-object record S3
keeps for them. The ETags of objects the runbook wrote are never compared with MD5s (a multipart
ETag, ``"...-N"``, is not an MD5); a foreign object's ETag is, only where S3 documents it is one.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from runbook_lib.errors import StorageError
from runbook_lib.storage.base import progress_bar
from runbook_lib.storage.s3_bucket import META_SHA256, BucketPath, S3Connection
from runbook_lib.storage.s3_errors import ErrorTranslator


@dataclass(frozen=True)
class ForeignObject:
    """An object the runbook did not write (a user's checkpoint file in their bucket), copied to
    this host by :meth:`ForeignCopier.copy`
    (:meth:`runbook_lib.storage.s3.S3Store.copy_foreign`).

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



class _Digests:
    """The digests :func:`foreign_checks` compares, computed over the bytes as they stream:
    sha256, md5, sha1 and zlib's CRC-32, and the byte count."""

    def __init__(self) -> None:
        self.sha256 = hashlib.sha256()
        self.md5 = hashlib.md5(usedforsecurity=False)
        self.sha1 = hashlib.sha1(usedforsecurity=False)
        self.crc32 = 0
        self.size = 0

    def update(self, part: bytes) -> None:
        self.sha256.update(part)
        self.md5.update(part)
        self.sha1.update(part)
        self.crc32 = zlib.crc32(part, self.crc32)
        self.size += len(part)

    def checks(self, head: Mapping[str, Any]) -> tuple[str, ...]:
        """:func:`foreign_checks` of these bytes against ``head``."""
        return foreign_checks(head, size=self.size, sha256_hex=self.sha256.hexdigest(), md5_hex=self.md5.hexdigest(),
                              crc32=self.crc32, sha1_hex=self.sha1.hexdigest())


class ForeignCopier:
    """Copies objects someone else wrote from the bucket at ``location`` to this host, checked
    against S3's own records of them (no ``x-amz-meta-sha256`` of ours need exist).

    Args:
        connection: the clients. location: the store root in the bucket. errors: how botocore
            errors are reported.
    """

    def __init__(self, connection: S3Connection, location: BucketPath, errors: ErrorTranslator) -> None:
        self.connection = connection
        self.location = location
        self.errors = errors

    def copy(self, key: str, dest: str | Path, *, progress: bool = False) -> ForeignObject:
        """Copy store key ``key`` to ``dest``, checked by :func:`foreign_checks`. The GET is pinned
        to the version (or, in an unversioned bucket, the ETag) the HEAD saw, so an object replaced
        meanwhile fails rather than mixing versions. ``progress``: show a byte progress bar.

        Raises:
            StorageError: the object is missing, changed during the copy, or its bytes differ from
                what S3 records (``dest`` is removed). AuthError: the store refused the
                credentials (diagnosed by error code,
                :func:`~runbook_lib.storage.s3_errors.diagnose`).
        """
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        url, bucket, bucket_key = self.location.url(key), self.location.bucket, self.location.object_key(key)
        with self.errors.translating("head", key):
            head = self.connection.s3.head_object(Bucket=bucket, Key=bucket_key, ChecksumMode="ENABLED")
        pin = {"VersionId": head["VersionId"]} if head.get("VersionId") else {"IfMatch": head["ETag"]}
        digests = _Digests()
        bar = progress_bar(int(head["ContentLength"]), f"copy {key}", progress)
        try:
            with open(dest, "wb") as f, self.errors.translating("get", key):
                body = self.connection.s3.get_object(Bucket=bucket, Key=bucket_key, ChecksumMode="ENABLED",
                                                     **pin)["Body"]
                for part in body.iter_chunks(1 << 20):
                    digests.update(part)
                    f.write(part)
                    if bar is not None:
                        bar.update(len(part))
            checks = digests.checks(head)
        except StorageError as exc:
            dest.unlink(missing_ok=True)
            raise StorageError(f"{url}: {exc}") from None
        except OSError as exc:
            dest.unlink(missing_ok=True)
            raise StorageError(f"{url}: cannot be written to {dest}: {exc.strerror}; the key must be a "
                               "valid file path of the checkpoint") from None
        except BaseException:
            dest.unlink(missing_ok=True)
            raise
        finally:
            if bar is not None:
                bar.close()
        modified = head.get("LastModified")
        return ForeignObject(key, digests.size, str(head.get("ETag", "")).strip('"'), head.get("VersionId"),
                             modified.isoformat() if hasattr(modified, "isoformat") else str(modified or ""),
                             digests.sha256.hexdigest(), checks)
