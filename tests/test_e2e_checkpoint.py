"""Bring your own checkpoint: a directory of shards with no user code runs all six phases, and
each kind of break a laptop hides ends with its documented finding and decision. Checkpoints are
small and synthetic, written by each test; nothing they name is ever run.

Phases 04 and 05 do the same for every checkpoint that passes phase 03 (time restores of the
frozen set, switch to the target's byte-identical copy, reload it with the source's loader): the
smoke case runs all six phases; the cases about a checkpoint's format, its findings or where it
comes from run phases 01-03 and then 06, which decides from those records and tears down."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from typing import Any

import nbformat
import pytest
import torch
import yaml

from runbook_lib.errors import EXIT_GO, EXIT_NO_GO
from runbook_lib.run.runner import RunResult, run_migration

from .conftest import ROOT, retag_devices
from .runs import phase_statuses, receipt, run_phases

pytestmark = pytest.mark.e2e


class Planted:
    """Unpickling this runs ``os.system``: what an attacker with write access to a bucket plants."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _run(make_params: Any, ckpt: Path | str, **workload: Any) -> RunResult:
    params = make_params("demo-checkpoint.yaml", workload={"checkpoint": str(ckpt), **workload})
    return run_migration(params, reports_dir=params.parent.parent / "reports", echo=print)


def _receipt(res: RunResult) -> dict[str, Any]:
    return receipt(res.run_dir)


def _through_parity(make_params: Any, ckpt: Path | str, *, name: str = "m.yaml", target: dict[str, Any] | None = None,
                    **workload: Any) -> Path:
    """Phases 01, 02, 03 and 06 of the checkpoint migration (module docstring); returns the run."""
    params = make_params("demo-checkpoint.yaml", name=name, workload={"checkpoint": str(ckpt), **workload},
                         **({"target": target} if target else {}))
    return run_phases(params, ("01", "02", "03", "06"))


def _parity_verdicts(run_dir: Path) -> dict[str, str]:
    """The verdicts of phases 01-03, after asserting every blocking one passed and phase 06 held
    only because phases 04 and 05 were not run."""
    r = receipt(run_dir)
    early = [g for g in r["gates"] if g.get("phase") in ("01", "02", "03")]
    assert early and all(g["verdict"] == "PASS" for g in early if g["blocking"]), early
    assert r["decision"] == "HOLD" and phase_statuses(run_dir) == {"01": "completed", "02": "completed",
                                                                   "03": "completed", "06": "completed"}
    assert r["resources"]["remaining"] == []  # the freeze pod and the canary are gone
    return {g["name"]: g["verdict"] for g in early}


def _demo_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(ROOT / "examples" / "checkpoint-demo", dst)
    return dst


@pytest.mark.smoke  # the fastest whole migration: every phase once, in `make test` too
def test_a_checkpoint_directory_with_no_code_runs_all_six_phases_and_goes(make_params, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPLBACKEND", "template")  # a plotting backend that shows nothing: the plots still show
    params = make_params("demo-checkpoint.yaml", workload={"checkpoint": str(_demo_copy(tmp_path))})
    # `make test` runs this case beside the unit tier on 2 cores, where a restore round of a few
    # milliseconds slowed by a neighbouring test widened the p95 ratio's interval past the demo's
    # margin (HOLD). Here the latency gate is left at its default, scored (params.Gates): the
    # measurement is still taken, judged and shown; its verdict blocks in `make demo-checkpoint`.
    data = yaml.safe_load(params.read_text())
    del data["gates"]["latency_p95_ratio_max"]
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    res = run_migration(params, reports_dir=params.parent.parent / "reports", echo=print)
    assert (res.decision, res.exit_code) == ("GO", EXIT_GO), res.reasons
    p95 = next(g for g in _receipt(res)["gates"] if g["name"] == "latency_p95_ratio")
    assert not p95["blocking"] and p95["verdict"] in ("PASS", "FAIL", "INCONCLUSIVE"), p95
    d = res.run_dir
    rec01 = json.loads((d / "01_freeze_source.json").read_text())["data"]["freeze"]
    formats = {f["file"]: f["format"] for f in rec01["inspection"]["files"]}
    assert formats == {"checkpoint-manifest.json": "metadata", "model-00001-of-00002.safetensors": "safetensors",
                       "model-00002-of-00002.safetensors": "safetensors", "model.safetensors.index.json": "shard-index",
                       "trainer_state.pt": "torch-zip"}
    nb = nbformat.read(d / "01_freeze_source.ipynb", as_version=4)
    shown = "".join(o.get("data", {}).get(mime, "") for c in nb.cells for o in c.get("outputs", [])
                    for mime in ("text/html", "text/markdown"))
    assert "Checkpoint inspection" in shown and "trainer_state.pt" in shown  # the table is in the notebook
    verdicts = {g["name"]: g["verdict"] for g in _receipt(res)["gates"]}
    assert verdicts["checkpoint_safety"] == verdicts["output_parity"] == verdicts["reverse_reload"] == "PASS"
    assert verdicts["failure_resume"] == "PASS"  # the restore loop killed and resumed on the canary
    assert verdicts["tensor_identity"] == "PASS" and "inference_parity" not in verdicts  # no entry point: no answers
    auth = json.loads((d / "05" / "authoritative.json").read_text())
    assert rec01["identity"]["location"]["where"] == "outside the pod's disks"  # the project's directory
    assert auth["switched"] and auth["authoritative_prefix"].endswith("/cutover/0/checkpoint")
    assert auth["rollback_prefix"].endswith("/source/frozen")
    assert auth["files_sha256"] == {k: o["sha256"] for k, o in rec01["frozen"]["objects"].items()}
    assert _receipt(res)["route"]["target_percent"] == 100
    images = [o for c in nbformat.read(d / "04_compare_production.ipynb", as_version=4).cells
              for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 3  # latency CDF, throughput and cost of a restore, whatever the plotting backend
    moved = json.loads((d / "04_compare_production.json").read_text())["data"]["store_to_pod"]
    frozen_bytes = sum(o["size_bytes"] for o in rec01["frozen"]["objects"].values())
    for side in ("source", "target"):  # every bench pod's verified download of the frozen set, timed
        assert moved[side]["fetches"] >= 2 and moved[side]["p50_MB_per_s"] > 0
        assert moved[side]["bytes"] == moved[side]["fetches"] * frozen_bytes
    for name in ("01_freeze_source", "03_prove_parity", "04_compare_production", "05_cutover"):
        errors = [o for c in nbformat.read(d / f"{name}.ipynb", as_version=4).cells for o in c.get("outputs", [])
                  if o.output_type == "error" or (o.output_type == "stream" and o.name == "stderr")]
        assert errors == [], name


def test_what_a_laptop_hides_but_loads_safely_is_a_finding_and_passes_parity(make_params, tmp_path: Path) -> None:
    """Foreign device tags, a wrapper prefix on every key, tied weights and a legacy-format file
    each load safely: each is recorded with its finding, and the canary's parity passes."""
    ck = _demo_copy(tmp_path)
    emb = torch.randn(16, 8)
    torch.save({"module.embed.weight": emb, "module.lm_head.weight": emb}, tmp_path / "tied.pt")
    retag_devices(tmp_path / "tied.pt", ck / "head_on_gpu.pt", b"cuda:1")  # saved on a GPU, tied, wrapped
    torch.save({"step": 60, "momentum": torch.zeros(4)}, ck / "legacy_state.pt", _use_new_zipfile_serialization=False)
    run_dir = _through_parity(make_params, ck)
    verdicts = _parity_verdicts(run_dir)
    rec01 = json.loads((run_dir / "01_freeze_source.json").read_text())["data"]["freeze"]
    found = {(f["file"], f["check"], f["severity"]) for f in rec01["inspection"]["findings"]}
    assert found == {("head_on_gpu.pt", "device_tags", "info"), ("head_on_gpu.pt", "wrapper_prefix", "info"),
                     ("head_on_gpu.pt", "tied_weights", "info"), ("legacy_state.pt", "legacy_format", "risk"),
                     ("", "host_path", "info")}  # a local pod reads the project's directory: it outlives the pod
    [head] = [f for f in rec01["inspection"]["files"] if f["file"] == "head_on_gpu.pt"]
    assert head["devices"] == ["cuda:1"] and head["tied"] == [["module.embed.weight", "module.lm_head.weight"]]
    # the remap the device_tags finding promises is kept: the freeze pod loaded cuda:1 onto its cpu
    assert rec01["identity"]["conversions"] == {"head_on_gpu.pt": {"remap": {"cuda:1": "cpu"}, "stripped_prefix": ""}}
    assert verdicts["checkpoint_safety"] == verdicts["output_parity"] == "PASS"


def test_a_torch_distributed_checkpoint_directory_passes_parity(make_params, tmp_path: Path) -> None:
    import warnings

    import torch.distributed.checkpoint as dcp

    torch.manual_seed(3)
    state = {"layer.weight": torch.randn(32, 16), "layer.bias": torch.zeros(32), "step": torch.tensor(60)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one process, no process group
        dcp.save(state, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    run_dir = _through_parity(make_params, tmp_path / "dcp")
    verdicts = _parity_verdicts(run_dir)
    rec01 = json.loads((run_dir / "01_freeze_source.json").read_text())["data"]["freeze"]
    [meta] = [f for f in rec01["inspection"]["files"] if f["format"] == "dcp-metadata"]
    assert set(meta["tensors"]) == set(state) and meta["unsafe_globals"] == []
    assert verdicts["output_parity"] == verdicts["tensor_identity"] == verdicts["checkpoint_safety"] == "PASS"


@pytest.mark.parametrize("kind", ["planted_pickle", "truncated_shard", "missing_shard", "partial_prefix"])
def test_a_broken_checkpoint_is_no_go_before_anything_is_rented(make_params, tmp_path: Path, kind: str) -> None:
    ck = _demo_copy(tmp_path)
    marker = tmp_path / "PWNED"
    if kind == "planted_pickle":
        torch.save({"step": 60, "hook": Planted(marker)}, ck / "trainer_state.pt")
    elif kind == "truncated_shard":
        shard = ck / "model-00001-of-00002.safetensors"
        shard.write_bytes(shard.read_bytes()[:-100])
    elif kind == "missing_shard":
        (ck / "model-00002-of-00002.safetensors").unlink()
    else:
        torch.save({"module.w": torch.ones(2), "b": torch.zeros(2)}, ck / "trainer_state.pt")
    finding = {"planted_pickle": "unsafe_global", "truncated_shard": "truncated", "missing_shard": "missing_shard",
               "partial_prefix": "partial_prefix"}[kind]
    res = _run(make_params, ck)
    assert (res.decision, res.exit_code) == ("NO-GO", EXIT_NO_GO), res.reasons
    assert any(r.startswith("checkpoint_safety FAIL") and finding in r for r in res.reasons), res.reasons
    r = _receipt(res)
    assert r["resources"]["created"] == []  # blocked in phase 01, before any pod
    pre = json.loads((res.run_dir / "01_freeze_source.json").read_text())["data"]["freeze"]["preflight"]
    assert [f["check"] for f in pre["findings"] if f["severity"] == "blocker"] == [finding]
    assert not marker.exists()


def test_an_allowlisted_global_loads_only_as_frozen_and_is_shown(make_params, tmp_path: Path) -> None:
    ck = _demo_copy(tmp_path)
    state = torch.load(ck / "trainer_state.pt", weights_only=True)
    torch.save({**state, "args": argparse.Namespace(lr=0.05, epochs=2)}, ck / "trainer_state.pt")
    refused = _run(make_params, ck)
    assert refused.decision == "NO-GO" and any("argparse.Namespace" in r for r in refused.reasons)
    run_dir = _through_parity(make_params, ck, name="allowed.yaml", allow_globals=["argparse.Namespace"])
    assert _parity_verdicts(run_dir)["checkpoint_safety"] == "PASS"
    rec01 = json.loads((run_dir / "01_freeze_source.json").read_text())["data"]["freeze"]
    assert rec01["identity"]["allow_globals"] == ["argparse.Namespace"]  # shown in the evidence


def test_a_checkpoint_in_a_bucket_is_copied_in_before_renting_and_passes_parity(
        make_params, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_endpoint: str) -> None:
    """``workload.checkpoint: s3://...``: phase 01 copies the objects in (each checked against
    S3's records), inspects the copy, and the freeze pod reads that copy from the run's store;
    the bucket's own keys stay on the runbook host and in no file of the run."""
    import hashlib

    from runbook_lib.storage.s3 import S3Store

    key_id, secret = "AKIABUCKETKEY0000001", "bucket-secret-value-never-written"
    bucket = S3Store("team-checkpoints", "", endpoint_url=s3_endpoint, create_bucket=True,
                     access_key_id=key_id, secret_access_key=secret)
    files = {p.name: p.read_bytes() for p in sorted((ROOT / "examples" / "checkpoint-demo").iterdir())}
    for name, data in files.items():
        bucket.client.put_object(Bucket=bucket.bucket, Key=f"runs/2026-11/{name}", Body=data, ChecksumAlgorithm="SHA256")
    monkeypatch.setenv("CKPT_KEY_ID", key_id)
    monkeypatch.setenv("CKPT_SECRET", secret)
    run_dir = _through_parity(make_params, "s3://team-checkpoints/runs/2026-11", checkpoint_store={
        "endpoint_url": s3_endpoint, "access_key_id_ref": "env:CKPT_KEY_ID", "secret_access_key_ref": "env:CKPT_SECRET"})
    verdicts = _parity_verdicts(run_dir)
    rec01 = json.loads((run_dir / "01_freeze_source.json").read_text())["data"]["freeze"]
    want = {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}
    assert {o["file"]: o["sha256"] for o in rec01["input"]["objects"]} == want
    assert {o["verified_by"] for o in rec01["input"]["objects"]} == {"sha256 (ChecksumSHA256), md5 (single-part ETag)"}
    assert {k: o["sha256"] for k, o in rec01["frozen"]["objects"].items() if k in want} == want  # frozen as copied
    assert rec01["identity"]["location"]["where"] == "object store"
    assert rec01["identity"]["checkpoint"] == "s3://team-checkpoints/runs/2026-11"
    assert verdicts["checkpoint_safety"] == verdicts["output_parity"] == verdicts["tensor_identity"] == "PASS"
    nb = nbformat.read(run_dir / "01_freeze_source.ipynb", as_version=4)
    assert "Checkpoint copied in" in "".join(o.get("data", {}).get("text/markdown", "") for c in nb.cells
                                             for o in c.get("outputs", []))
    for f in run_dir.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes() and key_id.encode() not in f.read_bytes(), f


def test_a_checkpoint_entry_point_adds_an_inference_check_that_a_dtype_change_fails(make_params, tmp_path: Path) -> None:
    """With ``entry_point`` (a CheckpointWorkload subclass that builds the model from the loaded
    shards) phase 01 records the model's answers as golden and phase 03 holds the canary's to
    them: the same target answers the same and passes; a float16 target loads identical tensors
    (``output_parity`` passes) but answers outside float32's tolerance and is NO-GO."""
    ck = _demo_copy(tmp_path)
    entry = "runbook_lib.examples.checkpoint_model:DemoMLPCheckpoint"
    run_dir = _through_parity(make_params, ck, entry_point=entry)
    verdicts = _parity_verdicts(run_dir)
    rec01 = json.loads((run_dir / "01_freeze_source.json").read_text())["data"]["freeze"]
    assert rec01["golden"]["inference_shape"] == [32, 10]  # sample_size inputs, 10 logits
    assert verdicts["inference_parity"] == verdicts["output_parity"] == verdicts["tensor_identity"] == "PASS"
    from runbook_lib.audit.recompute import recompute_run

    again = {r.gate: r for r in recompute_run(run_dir)}
    assert again["inference_parity"].basis != "phase record" and all(r.same for r in again.values()), again

    half = _through_parity(make_params, ck, name="half.yaml", target={"dtype": "float16"}, entry_point=entry)
    r = receipt(half)
    assert r["decision"] == "NO-GO", r["reasons"]
    verdicts = {g["name"]: g["verdict"] for g in r["gates"]}
    assert verdicts["output_parity"] == "PASS" and verdicts["inference_parity"] == "FAIL"
    assert any(x.startswith("inference_parity FAIL") for x in r["reasons"]), r["reasons"]
