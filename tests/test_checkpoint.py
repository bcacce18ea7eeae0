"""Checkpoint portability on small synthetic checkpoints: each kind of break a laptop hides ends
in its documented finding, and nothing a checkpoint names is ever run."""

from __future__ import annotations

import argparse
import collections
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from runbook_lib.portability.checkpoint import (
    CheckpointError,
    inspect,
    load_state,
    natural_key,
    pickle_globals,
    sha256_of,
)

from .conftest import retag_devices


class Planted:
    """Unpickling this runs ``os.system``: what an attacker with write access to a bucket plants."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {"enc.weight": torch.randn(4, 3), "enc.bias": torch.zeros(4), "head.weight": torch.randn(2, 4)}


def _checks(ins: Any) -> dict[str, str]:
    return {f.check: f.severity for f in ins.findings}


def test_a_plain_state_dict_has_no_findings_and_its_tensors_listed(tmp_path: Path) -> None:
    torch.save(_state(), tmp_path / "model.pt")
    ins = inspect(tmp_path / "model.pt")
    assert ins.findings == ()
    [f] = ins.files
    assert (f.format, f.devices, f.unsafe_globals) == ("torch-zip", ("cpu",), ())
    assert f.tensors["enc.weight"] == {"shape": [4, 3], "dtype": "float32"}
    assert f.tensor_bytes == (12 + 4 + 8) * 4  # float32, each storage once
    assert f.sha256 == sha256_of(tmp_path / "model.pt") and f.bytes == (tmp_path / "model.pt").stat().st_size
    assert "torch._utils._rebuild_tensor_v2" in f.globals  # how torch rebuilds a tensor: listed, and safe


def test_a_planted_pickle_is_named_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    torch.save({"w": torch.ones(2), "x": Planted(marker)}, tmp_path / "evil.pt")
    ins = inspect(tmp_path / "evil.pt")
    [f] = ins.files
    assert f.unsafe_globals == ("posix.system",) and _checks(ins) == {"unsafe_global": "blocker"}
    assert f.tensors == {}  # not loaded at all
    with pytest.raises(CheckpointError, match="posix.system"):
        load_state(tmp_path / "evil.pt")
    assert not marker.exists()


def test_a_non_tensor_global_is_allowed_only_by_name_and_only_for_the_frozen_bytes(tmp_path: Path) -> None:
    path = tmp_path / "ck.pt"
    # training scripts often save their argparse hyperparameters next to the weights
    torch.save({"w": torch.ones(2), "args": argparse.Namespace(lr=0.1)}, path)
    ins = inspect(path)
    assert ins.files[0].unsafe_globals == ("argparse.Namespace",) and _checks(ins) == {"unsafe_global": "blocker"}
    assert _checks(inspect(path, allow_globals=["argparse.Namespace"])) == {"allowed_global": "risk"}
    with pytest.raises(CheckpointError, match="argparse.Namespace"):
        load_state(path)
    with pytest.raises(CheckpointError, match="matches the frozen manifest"):
        load_state(path, allow_globals=["argparse.Namespace"], frozen_sha256="0" * 64)
    got = load_state(path, allow_globals=["argparse.Namespace"], frozen_sha256=sha256_of(path))
    assert got.allowed_globals == ("argparse.Namespace",) and got.state["args"].lr == 0.1


def test_allowlisting_the_globals_inspection_named_names_what_torch_still_needs(tmp_path: Path) -> None:
    """A numpy array saved beside the weights: the pickle names _reconstruct, ndarray and dtype;
    with exactly those allowlisted, torch still refuses to build numpy.dtypes.Int64DType, a class
    no GLOBAL names. The error names it and says to list it too (it said only "see torch message")."""
    import numpy as np

    path = tmp_path / "ck.pt"
    torch.save({"w": torch.ones(2), "ids": np.arange(3)}, path)
    named = list(inspect(path).files[0].globals)
    assert "numpy.dtypes.Int64DType" not in named
    with pytest.raises(CheckpointError, match=r"torch must also build numpy\.dtypes\.Int64DType.*list "
                                              r"numpy\.dtypes\.Int64DType in workload\.allow_globals too"):
        load_state(path, allow_globals=named, frozen_sha256=sha256_of(path))


def test_foreign_device_tags_are_found_and_remapped_explicitly(tmp_path: Path) -> None:
    torch.save(_state(), tmp_path / "cpu.pt")
    retag_devices(tmp_path / "cpu.pt", tmp_path / "gpu.pt", b"cuda:1")
    ins = inspect(tmp_path / "gpu.pt")
    assert ins.files[0].devices == ("cuda:1",) and _checks(ins) == {"device_tags": "info"}
    got = load_state(tmp_path / "gpu.pt", device="cpu")
    assert got.remap == {"cuda:1": "cpu"} and all(t.device.type == "cpu" for t in got.state.values())
    torch.testing.assert_close(got.state["enc.weight"], _state()["enc.weight"])


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod."])
def test_a_wrapper_prefix_on_every_key_is_stripped_when_every_shape_matches(tmp_path: Path, prefix: str) -> None:
    ref = _state()
    torch.save({prefix + k: v for k, v in ref.items()}, tmp_path / "w.pt")
    assert _checks(inspect(tmp_path / "w.pt")) == {"wrapper_prefix": "info"}
    got = load_state(tmp_path / "w.pt", reference=ref)
    assert got.stripped_prefix == prefix and set(got.state) == set(ref)
    wrong = {**ref, "head.weight": torch.zeros(3, 4)}  # another model's shape
    with pytest.raises(CheckpointError, match="another model"):
        load_state(tmp_path / "w.pt", reference=wrong)


def test_a_prefix_on_some_keys_only_is_a_blocker_and_never_stripped(tmp_path: Path) -> None:
    ref = _state()
    torch.save({("module." + k if k.startswith("enc") else k): v for k, v in ref.items()}, tmp_path / "p.pt")
    ins = inspect(tmp_path / "p.pt")
    assert _checks(ins) == {"partial_prefix": "blocker"} and "2 of 3 keys" in ins.findings[0].seen
    with pytest.raises(CheckpointError, match="some keys only"):
        load_state(tmp_path / "p.pt", reference=ref)


def test_tied_weights_are_found_and_stay_tied_through_prefix_stripping(tmp_path: Path) -> None:
    emb = torch.randn(5, 3)
    torch.save({"module.embed.weight": emb, "module.lm_head.weight": emb, "module.b": torch.zeros(5)},
               tmp_path / "t.pt")
    ins = inspect(tmp_path / "t.pt")
    assert ins.files[0].tied == (("module.embed.weight", "module.lm_head.weight"),)
    assert ins.files[0].tensor_bytes == (15 + 5) * 4  # the shared storage counted once
    assert _checks(ins) == {"wrapper_prefix": "info", "tied_weights": "info"}
    ref = {"embed.weight": (5, 3), "lm_head.weight": (5, 3), "b": (5,)}
    got = load_state(tmp_path / "t.pt", reference=ref)
    assert got.tied == (("embed.weight", "lm_head.weight"),)
    assert got.state["embed.weight"].data_ptr() == got.state["lm_head.weight"].data_ptr()


def test_a_legacy_format_file_is_disassembled_statically_and_loads_safely(tmp_path: Path) -> None:
    torch.save(_state(), tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    ins = inspect(tmp_path / "old.pt")
    [f] = ins.files
    assert f.format == "torch-legacy" and _checks(ins) == {"legacy_format": "risk"}
    assert {"collections.OrderedDict", "torch._utils._rebuild_tensor_v2", "torch.FloatStorage"} <= set(f.globals) \
        or {"torch._utils._rebuild_tensor_v2", "torch.FloatStorage"} <= set(f.globals)
    assert set(f.tensors) == set(_state())
    marker = tmp_path / "PWNED"
    torch.save({"x": Planted(marker)}, tmp_path / "old-evil.pt", _use_new_zipfile_serialization=False)
    evil = inspect(tmp_path / "old-evil.pt")
    assert "posix.system" in evil.files[0].globals and evil.files[0].unsafe_globals == ("posix.system",)
    assert "unsafe_global" in _checks(evil) and not marker.exists()


def test_a_truncated_shard_is_a_blocker_in_either_format(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    torch.save(_state(), tmp_path / "a.pt")
    save_file(_state(), str(tmp_path / "b.safetensors"))
    for name in ("a.pt", "b.safetensors"):
        p = tmp_path / name
        p.write_bytes(p.read_bytes()[: p.stat().st_size - 40])
    ins = inspect(tmp_path)
    assert sorted((f.file, f.check, f.severity) for f in ins.findings) == [
        ("a.pt", "truncated", "blocker"), ("b.safetensors", "truncated", "blocker")]
    with pytest.raises(CheckpointError, match="cannot be loaded"):
        load_state(tmp_path / "a.pt")


def test_a_missing_shard_named_by_the_index_is_a_blocker(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    st = _state()
    save_file({"enc.weight": st["enc.weight"]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    index = {"metadata": {}, "weight_map": {"enc.weight": "model-00001-of-00002.safetensors",
                                            "enc.bias": "model-00002-of-00002.safetensors",
                                            "head.weight": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    ins = inspect(tmp_path)
    [miss] = ins.findings
    assert (miss.check, miss.severity, miss.file) == ("missing_shard", "blocker", "model-00002-of-00002.safetensors")
    assert "2 tensors" in miss.seen
    assert {f.format for f in ins.files} == {"safetensors", "shard-index"}


def test_files_and_steps_are_ordered_by_number_not_by_name() -> None:
    names = ["step-10.pt", "step-9.pt", "step-100.pt", "step-2.pt"]
    assert sorted(names, key=natural_key) == ["step-2.pt", "step-9.pt", "step-10.pt", "step-100.pt"]


def test_stack_global_of_newer_pickle_protocols_is_resolved() -> None:
    import pickle

    data = pickle.dumps(collections.OrderedDict(a=1), protocol=5)
    assert pickle_globals(data) == ["collections.OrderedDict"]



def test_where_the_source_keeps_its_checkpoint_is_judged_from_the_pod_s_disks(tmp_path: Path) -> None:
    from runbook_lib.workload.checkpoint_set import location

    pod, vol = tmp_path / "pod", tmp_path / "vol"
    env = {"LOCAL_POD_VOLUME": str(vol)}
    assert location(vol / "ck", env=env, cwd=pod)["where"] == "volume"
    assert location(pod / "work" / "ck", env=env, cwd=pod)["where"] == "container disk"
    assert location(tmp_path / "data" / "ck", env=env, cwd=pod)["where"] == "outside the pod's disks"
    assert location(tmp_path / "data" / "ck", env={}, cwd=pod)["where"] == "not checked"


def _dcp(path: Path, state: dict[str, Any]) -> None:
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one process: DCP says it assumes so
        dcp.save(state, checkpoint_id=str(path), no_dist=True)


def test_a_distributed_checkpoint_is_inspected_from_its_metadata_and_loaded_safely(tmp_path: Path) -> None:
    from runbook_lib.portability.checkpoint import load_dcp

    state = {**_state(), "step": torch.tensor(7)}
    _dcp(tmp_path / "dcp", state)
    ins = inspect(tmp_path / "dcp")
    assert ins.findings == ()
    meta = next(f for f in ins.files if f.format == "dcp-metadata")
    assert meta.tensors["enc.weight"] == {"shape": [4, 3], "dtype": "float32"} and meta.unsafe_globals == ()
    assert "torch.distributed.checkpoint.metadata.Metadata" in meta.globals
    assert {f.format for f in ins.files} == {"dcp-metadata", "dcp-shard"}
    got = load_dcp(tmp_path / "dcp")
    assert set(got) == set(state)
    for k, v in state.items():
        torch.testing.assert_close(got[k], v)


def test_a_distributed_checkpoint_s_planted_metadata_missing_and_short_shards_are_blockers(tmp_path: Path) -> None:
    import pickle

    from runbook_lib.portability.checkpoint import load_dcp

    marker = tmp_path / "PWNED"
    _dcp(tmp_path / "evil", _state())
    (tmp_path / "evil" / ".metadata").write_bytes(pickle.dumps(Planted(marker)))
    ins = inspect(tmp_path / "evil")
    assert _checks(ins) == {"unsafe_global": "blocker"} and "posix.system" in ins.findings[0].seen
    with pytest.raises(CheckpointError, match="posix.system"):
        load_dcp(tmp_path / "evil")
    assert not marker.exists()

    _dcp(tmp_path / "short", _state())
    [shard] = (tmp_path / "short").glob("*.distcp")
    shard.write_bytes(shard.read_bytes()[:-64])
    assert _checks(inspect(tmp_path / "short")) == {"truncated": "blocker"}
    shard.unlink()
    assert _checks(inspect(tmp_path / "short")) == {"missing_shard": "blocker"}


def test_reserved_names_ambiguous_names_and_sparse_tensors_are_blockers_found_without_crashing(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "_SUCCESS").write_bytes(b"")  # what Spark and Hadoop leave beside their output
    torch.save({"layer.weight": torch.ones(2), "layer": {"weight": torch.zeros(2)}}, ck / "ambiguous.pt")
    torch.save({"w": torch.eye(3).to_sparse()}, ck / "sparse.pt")
    torch.save({"ok": torch.ones(1)}, ck / "ok.pt")
    ins = inspect(ck)
    assert sorted((f.file, f.check) for f in ins.blockers) == [
        ("_SUCCESS", "reserved_name"), ("ambiguous.pt", "ambiguous_names"), ("sparse.pt", "unsupported_layout")]


def test_a_distributed_checkpoint_s_pickled_items_are_hashed_and_reported_never_loaded(tmp_path: Path) -> None:
    # README: DCP "loads only its tensor items (torch loads pickled non-tensor items without
    # weights_only: they are copied, hashed and reported, never loaded)"
    from runbook_lib.portability.checkpoint import load_dcp

    state = {**_state(), "trainer": {"epoch": 3, "note": "non-tensor"}}
    _dcp(tmp_path / "dcp", state)
    ins = inspect(tmp_path / "dcp")
    assert _checks(ins) == {"non_tensor_items": "risk"} and "trainer" in ins.findings[0].seen
    shards = [f for f in ins.files if f.format == "dcp-shard"]
    assert shards and all(f.sha256 and len(f.sha256) == 64 for f in shards)  # every byte hashed
    meta = next(f for f in ins.files if f.format == "dcp-metadata")
    assert set(meta.tensors) == set(_state())  # the pickled item is no tensor
    got = load_dcp(tmp_path / "dcp")
    assert set(got) == set(_state())  # only the tensors were loaded
