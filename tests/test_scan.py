"""The credential scan finds resolved secret values and key shapes, and redacts them in place."""

from __future__ import annotations

from pathlib import Path

from runbook_lib.params import load_params
from runbook_lib.phases.scan import scan_run


def test_scan_finds_and_redacts_by_name(make_params, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "canary-value-123456789")
    monkeypatch.setenv("SHORT_ONE", "abc")
    p = make_params("demo.yaml", source={"secrets": [{"name": "HF_TOKEN", "ref": "env:HF_TOKEN"},
                                                     {"name": "SHORT", "ref": "env:SHORT_ONE"}]})
    run = tmp_path / "run"
    (run / "04").mkdir(parents=True)
    (run / "clean.json").write_text('{"sha256": "' + "ab" * 32 + '"}')  # digests are not keys
    (run / "04" / "leak.txt").write_text("token=canary-value-123456789 and " + "AKIA" + "ABCDEFGHIJKLMNOP")
    res = scan_run(run, load_params(p))
    found = {(f.path, f.what) for f in res["findings"]}
    assert found == {("04/leak.txt", "HF_TOKEN"), ("04/leak.txt", "an AWS access key id")}
    assert res["too_short_to_scan"] == ["SHORT"] and res["secret_names"] == ["HF_TOKEN"]
    text = (run / "04" / "leak.txt").read_text()
    assert "canary-value" not in text and "[REDACTED:HF_TOKEN]" in text and "AKIA" not in text
    assert scan_run(run, load_params(p))["findings"] == []


def test_an_s3_checkpoint_s_bucket_keys_are_scanned_for_too(make_params, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CKPT_KEY_ID", "AKIABUCKETKEYSCAN001")
    monkeypatch.setenv("CKPT_SECRET", "bucket-secret-value-to-redact")
    p = make_params("demo-checkpoint.yaml", workload={"checkpoint": "s3://models/ck", "checkpoint_store": {
        "access_key_id_ref": "env:CKPT_KEY_ID", "secret_access_key_ref": "env:CKPT_SECRET"}})
    run = tmp_path / "run"
    run.mkdir()
    (run / "cell.txt").write_text("printed bucket-secret-value-to-redact by mistake")
    res = scan_run(run, load_params(p))
    assert [(f.path, f.what) for f in res["findings"]] == [("cell.txt", "workload.checkpoint_store.secret_access_key")]
    assert "bucket-secret" not in (run / "cell.txt").read_text()
