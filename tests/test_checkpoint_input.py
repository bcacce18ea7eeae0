"""An ``s3://`` checkpoint is copied in before anything is rented: every object checked against
what S3 records for it, then frozen into the run's store and inspected. moto's server on
127.0.0.1 plays the user's bucket; golden digests come from hashlib over the original files."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import zlib
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.errors import RunbookError, StorageError
from runbook_lib.phases import freeze, open_phase
from runbook_lib.storage.s3 import S3Store, foreign_checks

from .conftest import ROOT

KEY_ID, SECRET = "AKIAUSERMODELS000001", "user-models-secret-never-shown"
_n = itertools.count()


def _digests(data: bytes) -> dict[str, Any]:
    return {"size": len(data), "sha256_hex": hashlib.sha256(data).hexdigest(),
            "md5_hex": hashlib.md5(data, usedforsecurity=False).hexdigest()}


def test_keys_that_cannot_be_files_of_one_checkpoint_are_each_named() -> None:
    from runbook_lib.phases.freeze import checkpoint_key_problems

    assert checkpoint_key_problems(["model.safetensors", "sub/a.pt", "sub/b.pt"]) == []
    found = checkpoint_key_problems(["a", "a/b", "./x.pt", "x/../y.pt", "_SUCCESS", "MANIFEST.json", "x" * 256,
                                     "sub/MANIFEST.json"], {"extra/": 15})
    assert found == ["'extra/' ends in '/' but holds 15 bytes", "'./x.pt' has an empty, '.' or '..' segment",
                     "'x/../y.pt' has an empty, '.' or '..' segment",
                     "'_SUCCESS' is a name the run's store keeps for a set's manifest or completion marker",
                     "'MANIFEST.json' is a name the run's store keeps for a set's manifest or completion marker",
                     f"'{'x' * 256}' has a segment longer than 255 bytes",
                     "'a' is both an object and the folder of other objects"]


def test_foreign_checks_use_every_whole_object_record_and_only_those() -> None:
    data = b"weights" * 1000
    d = _digests(data)
    sha_b64 = base64.b64encode(hashlib.sha256(data).digest()).decode()
    single = {"ContentLength": len(data), "ETag": f'"{d["md5_hex"]}"', "ChecksumSHA256": sha_b64}
    assert foreign_checks(single, **d) == ("sha256 (ChecksumSHA256)", "md5 (single-part ETag)")
    multipart = {"ContentLength": len(data), "ETag": '"0123456789abcdef0123456789abcdef-3"'}
    assert foreign_checks(multipart, **d) == ()  # S3 keeps no whole-object digest: size only
    kms = {"ContentLength": len(data), "ETag": '"0123456789abcdef0123456789abcdef"', "ServerSideEncryption": "aws:kms"}
    assert foreign_checks(kms, **d) == ()  # an SSE-KMS ETag is not an MD5 (S3 API reference, Object.ETag)
    composite = {**multipart, "ChecksumSHA256": "AAAA-3", "ChecksumType": "COMPOSITE"}
    assert foreign_checks(composite, **d) == ()
    ours = {**multipart, "Metadata": {"sha256": d["sha256_hex"]}}
    assert foreign_checks(ours, **d) == ("sha256 (x-amz-meta-sha256)",)
    with pytest.raises(StorageError, match=r"copied 6999 bytes, the object has 7000: truncated"):
        foreign_checks(single, **{**d, "size": len(data) - 1})
    with pytest.raises(StorageError, match=r"single-part ETag is 0{32}"):
        foreign_checks({**single, "ChecksumSHA256": None, "ETag": '"' + "0" * 32 + '"'}, **d)
    with pytest.raises(StorageError, match=r"S3's ChecksumSHA256 is AAAA"):
        foreign_checks({**single, "ChecksumSHA256": "AAAA"}, **d)
    crc = zlib.crc32(data)
    crc_b64 = base64.b64encode(crc.to_bytes(4, "big")).decode()
    assert foreign_checks({**multipart, "ChecksumCRC32": crc_b64}, **d, crc32=crc) == ("crc32 (ChecksumCRC32)",)
    with pytest.raises(StorageError, match=r"S3's ChecksumCRC32 is AAAAAA=="):
        foreign_checks({**multipart, "ChecksumCRC32": "AAAAAA=="}, **d, crc32=crc)
    # CRC64NVME (AWS's default for multipart uploads) is validated only by botocore with the AWS CRT;
    # without it the copy is not claimed as checked by it
    from botocore import httpchecksum
    crt = bool(getattr(httpchecksum, "HAS_CRT", False))
    assert foreign_checks({**multipart, "ChecksumCRC64NVME": "AAAAAAAAAAA="}, **d) == \
        (("crc64nvme (ChecksumCRC64NVME, validated by botocore)",) if crt else ())
    dsse = {**single, "ChecksumSHA256": None, "ETag": '"' + "0" * 32 + '"', "ServerSideEncryption": "aws:kms:dsse"}
    assert foreign_checks(dsse, **d) == ()  # a DSSE-KMS ETag is not an MD5 either
    upper = {**multipart, "Metadata": {"sha256": d["sha256_hex"].upper()}}
    assert foreign_checks(upper, **d) == ("sha256 (x-amz-meta-sha256)",)


@pytest.fixture
def bucket(s3_endpoint: str) -> S3Store:
    store = S3Store(f"user-models-{next(_n)}", "", endpoint_url=s3_endpoint, create_bucket=True,
                    access_key_id=KEY_ID, secret_access_key=SECRET)
    return store


def _ctx(make_params: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, url: str, endpoint: str) -> Any:
    (tmp_path / "pyproject.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MODELS_KEY_ID", KEY_ID)
    monkeypatch.setenv("MODELS_SECRET", SECRET)
    params = make_params("demo-checkpoint.yaml", workload={"checkpoint": url, "checkpoint_store": {
        "endpoint_url": endpoint, "access_key_id_ref": "env:MODELS_KEY_ID", "secret_access_key_ref": "env:MODELS_SECRET"}})
    return open_phase("01", str(params), run_mode="headless")


def _upload_demo(bucket: S3Store, prefix: str) -> dict[str, bytes]:
    """The demo checkpoint's files under ``prefix``, three ways: one with a SHA256 checksum, one
    as a one-part multipart upload (ETag ``...-1``: no whole-object digest), the rest plain."""
    files = {p.name: p.read_bytes() for p in sorted((ROOT / "examples" / "checkpoint-demo").iterdir())}
    c, b = bucket.client, bucket.bucket
    for name, data in files.items():
        key = f"{prefix}/{name}"
        if name == "trainer_state.pt":
            c.put_object(Bucket=b, Key=key, Body=data, ChecksumAlgorithm="SHA256")
        elif name == "model-00001-of-00002.safetensors":
            up = c.create_multipart_upload(Bucket=b, Key=key)
            part = c.upload_part(Bucket=b, Key=key, PartNumber=1, UploadId=up["UploadId"], Body=data)
            c.complete_multipart_upload(Bucket=b, Key=key, UploadId=up["UploadId"],
                                        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
        else:
            c.put_object(Bucket=b, Key=key, Body=data)
    c.put_object(Bucket=b, Key=f"{prefix}/logs/", Body=b"")  # a console-made folder placeholder
    c.put_object(Bucket=b, Key=f"{prefix}/", Body=b"")  # the console's "Create folder" for the prefix itself
    return files


def test_an_s3_checkpoint_is_copied_in_checked_and_inspected_before_anything_is_rented(
        make_params: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_endpoint: str, bucket: S3Store) -> None:
    files = _upload_demo(bucket, "llm/v3")
    ctx = _ctx(make_params, monkeypatch, tmp_path, f"s3://{bucket.bucket}/llm/v3", s3_endpoint)
    inspection = freeze.preflight_checkpoint(ctx)
    assert inspection is not None
    pre = inspection.model_dump(mode="json")  # as phase 01's record keeps it
    assert pre["blockers"] == 0
    copied = pre["input"]
    assert copied["placeholders"] == ["(the prefix itself)", "logs/"] and copied["total_bytes"] == sum(map(len, files.values()))
    rows = {o["file"]: o for o in copied["objects"]}
    assert {k: o["sha256"] for k, o in rows.items()} == {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}
    assert rows["trainer_state.pt"]["verified_by"] == "sha256 (ChecksumSHA256), md5 (single-part ETag)"
    assert rows["model-00001-of-00002.safetensors"]["verified_by"] == "size only"
    assert rows["model.safetensors.index.json"]["verified_by"] == "md5 (single-part ETag)"
    assert [f["file"] for f in pre["findings"] if f["check"] == "input_size_only"] == \
        ["model-00001-of-00002.safetensors"]
    # the copy is a verified set in the run's store: what the freeze pod reads, through its grant
    assert copied["prefix"] == freeze.input_prefix(ctx) == f"runs/{ctx.run_id}/source/input"
    held = ctx.store.verify_set(copied["prefix"], run_id=ctx.run_id)
    about = ctx.store.read_manifest(copied["prefix"], run_id=ctx.run_id)["about"]  # what moves with the set
    assert (about["run_id"], about["mode"], about["model"]["checkpoint"]) == (ctx.run_id, "checkpoint_input",
                                                                                 copied["url"])
    assert about["model"]["model_id"] == ctx.mig.workload.model_id and about["runtime"]["runbook_lib"]
    assert about["configuration"]["params_sha256"] and about["validation"]["objects"] == len(files)
    assert {k: o.sha256 for k, o in held.items()} == {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}
    assert {f["file"] for f in pre["files"]} == set(files)  # inspected as copied, nothing run
    plan = freeze.plan_freeze(ctx)
    argv = list(plan.spec.command)  # type: ignore[union-attr]
    assert argv[argv.index("--frozen-prefix") + 1] == copied["prefix"]
    record = json.loads(ctx.evidence.path("01/checkpoint_input.json").read_text())
    assert record["objects"] == copied["objects"]
    for f in ctx.run_dir.rglob("*"):  # the bucket's keys are resolved here and written nowhere
        if f.is_file():
            blob = f.read_bytes()
            assert SECRET.encode() not in blob and KEY_ID.encode() not in blob, f


def test_a_single_object_url_is_one_file_and_a_bad_url_or_key_is_refused_with_what_to_do(
        make_params: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_endpoint: str, bucket: S3Store) -> None:
    data = (ROOT / "examples" / "checkpoint-demo" / "trainer_state.pt").read_bytes()
    bucket.client.put_object(Bucket=bucket.bucket, Key="one/state.pt", Body=data)
    ctx = _ctx(make_params, monkeypatch, tmp_path, f"s3://{bucket.bucket}/one/state.pt", s3_endpoint)
    pre = freeze.preflight_checkpoint(ctx)
    assert pre is not None and pre.input is not None and [o.file for o in pre.input.objects] == ["state.pt"]
    assert pre.input.objects[0].sha256 == hashlib.sha256(data).hexdigest()

    ctx = _ctx(make_params, monkeypatch, tmp_path, f"s3://{bucket.bucket}/nothing/here", s3_endpoint)
    with pytest.raises(StorageError, match=r"no object at that key and none under it as a prefix"):
        freeze.preflight_checkpoint(ctx)

    bucket.client.put_object(Bucket=bucket.bucket, Key="evil/../../outside.pt", Body=data)
    ctx = _ctx(make_params, monkeypatch, tmp_path, f"s3://{bucket.bucket}/evil", s3_endpoint)
    with pytest.raises(StorageError, match=r"'\.\./\.\./outside\.pt' has an empty, '\.' or '\.\.' segment"):
        freeze.preflight_checkpoint(ctx)
    assert not list(tmp_path.parent.rglob("outside.pt"))


def test_a_missing_bucket_key_reference_is_named_and_its_value_never_shown(
        make_params: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_endpoint: str, bucket: S3Store) -> None:
    ctx = _ctx(make_params, monkeypatch, tmp_path, f"s3://{bucket.bucket}/llm/v3", s3_endpoint)
    monkeypatch.delenv("MODELS_KEY_ID")
    with pytest.raises(RunbookError, match=r"MODELS_KEY_ID") as err:
        freeze.preflight_checkpoint(ctx)
    assert SECRET not in str(err.value)
