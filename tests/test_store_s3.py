"""S3Store passes the store contract against moto's server on 127.0.0.1, over real HTTP."""

from __future__ import annotations

import hashlib
from pathlib import Path

import boto3
import pytest

from runbook_lib.errors import StorageError
from runbook_lib.storage.s3 import S3Store

from .contract.store_contract import StoreContract

MIB = 1 << 20


@pytest.fixture(autouse=True)
def fake_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


_n = iter(range(10_000))


class TestS3Store(StoreContract):
    @pytest.fixture
    def store(self, s3_endpoint: str) -> S3Store:
        return S3Store(f"bucket-{next(_n)}", "runs", endpoint_url=s3_endpoint, create_bucket=True,
                       multipart_threshold_bytes=5 * MIB, multipart_chunksize_bytes=5 * MIB)

    def corrupt(self, store: S3Store, key: str, data: bytes) -> None:
        meta = store.client.head_object(Bucket=store.bucket, Key=store.object_key(key))["Metadata"]
        store.client.put_object(Bucket=store.bucket, Key=store.object_key(key), Body=data, Metadata=meta)


def test_multipart_object_etag_is_not_an_md5(s3_endpoint: str, tmp_path: Path) -> None:
    store = S3Store("multi", endpoint_url=s3_endpoint, create_bucket=True,
                    multipart_threshold_bytes=5 * MIB, multipart_chunksize_bytes=5 * MIB)
    data = hashlib.sha256(b"seed").digest() * (12 * MIB // 32)  # 12 MiB -> 3 parts
    (tmp_path / "big").write_bytes(data)
    info = store.put_file(tmp_path / "big", "ck/big")
    etag = store.client.head_object(Bucket="multi", Key="ck/big")["ETag"].strip('"')
    assert etag.endswith("-3")  # multipart ETag: an MD5 of part MD5s, never compared with a plain MD5
    assert info.sha256 == hashlib.sha256(data).hexdigest() == store.head("ck/big").sha256
    assert store.get_file("ck/big", tmp_path / "back", expect=info).sha256 == info.sha256


def test_interrupted_multipart_upload_leaves_nothing_and_retry_succeeds(s3_endpoint: str, tmp_path: Path) -> None:
    store = S3Store("interrupt", endpoint_url=s3_endpoint, create_bucket=True,
                    multipart_threshold_bytes=5 * MIB, multipart_chunksize_bytes=5 * MIB)
    src = tmp_path / "big"
    src.write_bytes(b"z" * (11 * MIB))

    class Dies:
        """A source whose disk goes away after two reads (mid multipart upload)."""

        def __init__(self) -> None:
            self.f = open(src, "rb")
            self.n = 0

        def read(self, n: int = -1) -> bytes:
            self.n += 1
            if self.n > 2:
                raise OSError(5, "input/output error")
            return self.f.read(n)

    dies = Dies()
    with pytest.raises(StorageError, match="failed while reading the source"):
        store.transfer.upload(dies, "ck/big")
    dies.f.close()
    assert store.head("ck/big") is None
    assert store.client.list_multipart_uploads(Bucket="interrupt").get("Uploads", []) == []  # aborted
    info = store.put_file(src, "ck/big")
    assert info.size_bytes == 11 * MIB


def test_checksum_mode_is_a_recorded_setting(s3_endpoint: str) -> None:
    store = S3Store("modes", endpoint_url=s3_endpoint, create_bucket=True, checksum_mode="when_supported")
    assert store.settings()["checksum_mode"] == "when_supported"
    assert store.client.meta.config.request_checksum_calculation == "when_supported"
    with pytest.raises(StorageError, match="checksum_mode"):
        S3Store("modes", endpoint_url=s3_endpoint, checksum_mode="always")


def test_bad_credentials_and_missing_bucket_are_clear(s3_endpoint: str) -> None:
    store = S3Store("nobucket", endpoint_url=s3_endpoint)
    with pytest.raises(StorageError, match=r"s3://nobucket/x: object or bucket does not exist"):
        store.get_bytes("x")
    assert boto3  # boto3 is the client the store drives
