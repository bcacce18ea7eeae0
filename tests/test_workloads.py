"""The acceptance workloads on real torch: checkpoints, resume determinism, and embeddings that
match sentence-transformers called directly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from runbook_lib.errors import WorkloadError
from runbook_lib.params import load_params
from runbook_lib.workload import load_workload_class, make_workload
from runbook_lib.workload.job import newest_verified_checkpoint, run_steps, save_checkpoint, step_timing

from .conftest import ROOT


def test_entry_point_errors_are_clear() -> None:
    with pytest.raises(WorkloadError, match="cannot be imported"):
        load_workload_class("no_such_module:Thing")
    with pytest.raises(WorkloadError, match="not an AcceptanceWorkload"):
        load_workload_class("pathlib:Path")
    # an entry point with abstract methods left is refused before anything is rented (it failed in the pod)
    with pytest.raises(WorkloadError, match=r"leaves 8 method\(s\) abstract: export_artifact, identity, load, "):
        load_workload_class("runbook_lib.workload:AcceptanceWorkload")


def test_newest_verified_checkpoint_skips_bad_ones(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        save_checkpoint({"step": step}, tmp_path, step)
    (tmp_path / "step-000004.pt").write_bytes(b"")                        # zero bytes
    data = (tmp_path / "step-000003.pt").read_bytes()
    (tmp_path / "step-000003.pt").write_bytes(data[: len(data) // 2])     # truncated
    (tmp_path / "step-000002.pt.sha256").unlink()                         # write never finished
    ck, rejected = newest_verified_checkpoint(tmp_path)
    assert ck is not None and ck.name == "step-000001.pt"
    assert [(r["file"], r["reason"].split(" ")[0]) for r in rejected] == [
        ("step-000004.pt", "zero"), ("step-000003.pt", "sha256"), ("step-000002.pt", "no")]
    assert torch.load(ck, weights_only=True) == {"step": 1}


def test_digits_resume_matches_uninterrupted_run(tmp_path: Path) -> None:
    mig = load_params(ROOT / "params" / "demo-train.yaml")
    straight = make_workload(mig.workload, mig.source)
    straight.load()
    run_steps(straight, ckpt_dir=tmp_path / "a", checkpoint_every=10, resume=False, pause_after_checkpoint=False)
    # Interrupted: run 25 steps, then a *fresh* workload resumes from the newest checkpoint (step 20).
    first = make_workload(mig.workload, mig.source)
    first.load()
    run_steps(first, ckpt_dir=tmp_path / "b", checkpoint_every=10, resume=False, pause_after_checkpoint=False,
              max_steps=25)
    resumed = make_workload(mig.workload, mig.source)
    resumed.load()
    res = run_steps(resumed, ckpt_dir=tmp_path / "b", checkpoint_every=10, resume=True, pause_after_checkpoint=False)
    assert res["resumed_from"] == "step-000020.pt" and res["start_step"] == 20
    np.testing.assert_array_equal(resumed.outputs(), straight.outputs())
    assert resumed.eval_accuracy() > 0.85  # a real classifier after 60 steps on 1,500 digits
    t = res["timing"]  # the driver's own clock check: steps + checkpoint saves + the rest = wall
    assert t["steps_sum_s"] == pytest.approx(sum(res["step_times_s"]))
    assert 0 < t["steps_share"] <= 1 and t["checkpoint_s"] > 0
    assert t["steps_sum_s"] + t["checkpoint_s"] + t["other_s"] == pytest.approx(t["wall_s"], abs=1e-3)


def test_the_newest_checkpoint_is_the_highest_step_number_not_the_last_name(tmp_path: Path) -> None:
    import hashlib

    for name in ("step-999999.pt", "step-1000000.pt", "step-9.pt"):
        (tmp_path / name).write_bytes(name.encode())
        (tmp_path / f"{name}.sha256").write_text(hashlib.sha256(name.encode()).hexdigest())
    ck, rejected = newest_verified_checkpoint(tmp_path)
    assert ck is not None and ck.name == "step-1000000.pt" and rejected == []


def test_step_times_that_exceed_the_wall_clock_are_refused() -> None:
    assert step_timing([0.1, 0.2], wall_s=0.35, checkpoint_s=0.01)["other_s"] == pytest.approx(0.04)
    with pytest.raises(WorkloadError, match=r"sum to 0.5000 s but the loop took 0.3000 s"):
        step_timing([0.25, 0.25], wall_s=0.3, checkpoint_s=0.0)


def test_embeddings_match_sentence_transformers_directly() -> None:
    from sentence_transformers import SentenceTransformer

    from runbook_lib.workload.embed import packaged_model_dir

    mig = load_params(ROOT / "params" / "demo.yaml")
    wl = make_workload(mig.workload, mig.source)
    wl.load()
    for i in range(wl.num_steps()):
        wl.step(i)
    ours = wl.outputs()
    assert ours.shape == (32, 384) and ours.dtype == np.float32
    direct = SentenceTransformer(str(packaged_model_dir()), device="cpu")
    sentences = [s for _, s in sorted(dict(wl.request_inputs(400, seed=0)).items())]
    assert len(sentences) == 32
    ref = direct.encode(sentences, batch_size=8, convert_to_numpy=True)
    torch.testing.assert_close(torch.from_numpy(ours), torch.from_numpy(ref))


def test_a_pipeline_other_than_mean_pooling_is_refused(tmp_path: Path) -> None:
    import json
    import shutil

    from runbook_lib.workload.embed import check_pipeline, packaged_model_dir

    src = packaged_model_dir()
    for name in ("modules.json", "sentence_bert_config.json"):
        shutil.copy2(src / name, tmp_path / name)
    (tmp_path / "1_Pooling").mkdir()
    cfg = json.loads((src / "1_Pooling" / "config.json").read_text())
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(cfg))
    assert check_pipeline(tmp_path) == 256
    cfg.update(pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WorkloadError, match="pooling_mode_cls_token"):
        check_pipeline(tmp_path)


class _Payload:
    """Pickles to a call of ``os.system``: what an attacker with write access to the store plants."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_that_would_run_code_is_refused_and_never_runs(tmp_path: Path) -> None:

    from runbook_lib.workload.digits import CHECKPOINT_FILE

    marker = tmp_path / "pwned"
    art = tmp_path / "artifact"
    art.mkdir()
    torch.save({"step": 0, "model": _Payload(marker)}, art / CHECKPOINT_FILE)
    mig = load_params(ROOT / "params" / "demo-train.yaml")
    wl = make_workload(mig.workload, mig.source)
    with pytest.raises(WorkloadError, match=r"outside torch's weights_only allowlist \(posix.system\); it was not run"):
        wl.load(art)
    assert not marker.exists()


def test_library_never_loads_with_weights_only_false() -> None:
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "runbook_lib").rglob("*.py")
                 if "weights_only=False" in p.read_text()]
    assert offenders == []


def test_a_checkpoint_entry_point_answers_as_the_model_built_by_hand_and_must_subclass_the_loader(
        make_params, tmp_path: Path) -> None:
    """The example entry point's logits equal a forward pass written here from the shards
    (safetensors' own loader, plain matmuls); an entry point that would load the checkpoint
    itself is refused for kind checkpoint."""
    from safetensors.torch import load_file

    from runbook_lib.workload.checkpoint_set import CheckpointWorkload

    mig = load_params(make_params("demo-checkpoint.yaml", workload={
        "entry_point": "runbook_lib.examples.checkpoint_model:DemoMLPCheckpoint", "sample_size": 5, "seed": 3,
        "checkpoint": str(ROOT / "examples" / "checkpoint-demo")}))
    wl = make_workload(mig.workload, mig.source)
    assert isinstance(wl, CheckpointWorkload)
    wl.load(None)
    got = wl.inference_outputs()
    wl.close()
    ck = Path(mig.workload.checkpoint)
    w = {**load_file(str(ck / "model-00001-of-00002.safetensors")), **load_file(str(ck / "model-00002-of-00002.safetensors"))}
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(3))
    want = torch.relu(x @ w["0.weight"].T + w["0.bias"]) @ w["2.weight"].T + w["2.bias"]
    assert got is not None and got.dtype == np.float32 and got.shape == (5, 10)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
    plain = make_workload(load_params(make_params("demo-checkpoint.yaml")).workload, mig.source)
    assert plain.inference_outputs() is None  # no entry point: tensor digests only
    with pytest.raises(WorkloadError, match=r"does not subclass runbook_lib.workload.checkpoint_set.CheckpointWorkload"):
        make_workload(load_params(make_params("demo-checkpoint.yaml", workload={
            "entry_point": "tests.fixture_workloads:SleepWorkload"})).workload, mig.source)


def test_a_wrapper_prefix_the_inspection_reports_is_stripped_by_the_example_entry_point(make_params,
                                                                                        tmp_path: Path) -> None:
    """The demo shards re-saved from a DataParallel wrapper (every key ``module.``): phase 01's
    inspection reports the prefix and says how an entry point strips it, and the example entry
    point, loading strictly, answers exactly as it does on the unwrapped shards (it failed with
    missing and unexpected keys: nothing gave load_state the model's keys)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from runbook_lib.portability.checkpoint import inspect

    wrapped = tmp_path / "wrapped"
    shutil.copytree(ROOT / "examples" / "checkpoint-demo", wrapped)
    for shard in wrapped.glob("*.safetensors"):
        save_file({f"module.{k}": v for k, v in load_file(str(shard)).items()}, str(shard))
    index = wrapped / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"] = {f"module.{k}": v for k, v in data["weight_map"].items()}
    index.write_text(json.dumps(data))
    [finding] = [f for f in inspect(wrapped / "model-00001-of-00002.safetensors").findings if f.check == "wrapper_prefix"]
    assert "strip_wrapper_prefix(weights, model.state_dict())" in finding.fix
    answers = {}
    for name, ck in (("plain", ROOT / "examples" / "checkpoint-demo"), ("wrapped", wrapped)):
        mig = load_params(make_params("demo-checkpoint.yaml", name=f"{name}.yaml", workload={
            "entry_point": "runbook_lib.examples.checkpoint_model:DemoMLPCheckpoint", "sample_size": 4,
            "checkpoint": str(ck)}))
        wl = make_workload(mig.workload, mig.source)
        wl.load(None)
        answers[name] = wl.inference_outputs()
        wl.close()
    np.testing.assert_array_equal(answers["wrapped"], answers["plain"])


def test_tensor_tables_compare_names_dtypes_shapes_and_bytes(make_params, tmp_path: Path) -> None:
    """The loaded table's digests are hashlib's over each tensor's bytes (numpy's view of the
    same memory); any renamed, recast, reshaped or changed tensor is named."""
    import hashlib

    from runbook_lib.evidence.records import TensorRow
    from runbook_lib.phases.parity import tensor_differences
    from runbook_lib.workload.checkpoint_set import CheckpointWorkload

    mig = load_params(make_params("demo-checkpoint.yaml", workload={
        "checkpoint": str(ROOT / "examples" / "checkpoint-demo")}))
    wl = make_workload(mig.workload, mig.source)
    assert isinstance(wl, CheckpointWorkload)
    wl.load(None)
    rows = wl.tensor_table()
    state = wl.state
    wl.close()
    bias = state["model-00002-of-00002.safetensors/2.bias"]
    [row] = [r for r in rows if r["name"] == "model-00002-of-00002.safetensors/2.bias"]
    assert row == {"name": "model-00002-of-00002.safetensors/2.bias", "dtype": "float32", "shape": [10],
                   "sha256": hashlib.sha256(bias.numpy().tobytes()).hexdigest()}
    typed = [TensorRow.model_validate(r) for r in rows]  # as phase 01's and phase 03's records keep them
    assert tensor_differences(typed, typed) == []
    changed = [dict(r) for r in rows]
    changed[0]["sha256"] = "0" * 64
    changed[1]["dtype"] = "bfloat16"
    changed[2]["shape"] = [1]
    renamed = changed[:-1] + [{**rows[-1], "name": "renamed"}]
    found = tensor_differences(typed, [TensorRow.model_validate(r) for r in renamed])
    assert found == [f"{rows[-1]['name']}: loaded on the source, missing on the canary",
                     "renamed: loaded on the canary only",
                     f"{rows[0]['name']}: sha256 {'0' * 16} on the canary, {rows[0]['sha256'][:16]} on the source",
                     f"{rows[1]['name']}: dtype bfloat16 on the canary, float32 on the source",
                     f"{rows[2]['name']}: shape [1] on the canary, {rows[2]['shape']} on the source"]


def test_conjugate_and_negative_views_are_hashed_as_their_values(make_params, tmp_path: Path) -> None:
    import hashlib

    from runbook_lib.workload.checkpoint_set import CheckpointWorkload

    ck = tmp_path / "ck"
    ck.mkdir()
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    torch.save({"z": z.conj()}, ck / "state.pt")
    mig = load_params(make_params("demo-checkpoint.yaml", workload={"checkpoint": str(ck)}))
    wl = make_workload(mig.workload, mig.source)
    assert isinstance(wl, CheckpointWorkload)
    wl.load(None)
    [row] = wl.tensor_table()
    wl.close()
    want = torch.tensor([1 - 2j, 3 + 4j], dtype=torch.complex64)  # the values, not the view's storage
    assert row["sha256"] == hashlib.sha256(want.numpy().tobytes()).hexdigest()


def test_a_checkpoint_entry_point_that_would_load_the_files_itself_is_refused_before_anything_runs(
        make_params, tmp_path: Path) -> None:
    from runbook_lib.errors import ParamsError
    from runbook_lib.run.runner import run_migration

    params = make_params("demo-checkpoint.yaml", workload={"entry_point": "tests.fixture_workloads:SleepWorkload",
                                                           "checkpoint": str(ROOT / "examples" / "checkpoint-demo")})
    with pytest.raises(ParamsError, match=r"does not subclass runbook_lib.workload.checkpoint_set.CheckpointWorkload"):
        run_migration(params, reports_dir=tmp_path / "reports")
    assert not (tmp_path / "reports").exists()  # no run was opened, nothing rented
