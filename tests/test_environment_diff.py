"""Source versus canary inventories: every difference classified with its reason, and what this
host cannot tell recorded as not checked, never as a pass."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from runbook_lib.evidence.manifest import write_record
from runbook_lib.evidence.rundir import RunDir
from runbook_lib.params import dump_yaml
from runbook_lib.phases import mapping, open_phase
from runbook_lib.portability.gpus import bf16_tf32, compute_capability, offer_problem, reported_capability, runs_on
from runbook_lib.portability.inventory import CLASSES, diff, probe
from runbook_lib.providers.fixtures import ENV as FIXTURES_ENV

from .conftest import ROOT

GB = 10**9


def _inv(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "python": "3.11.9", "torch": "2.5.1+cu124", "device": "cuda",
        "cuda": {"available": True, "runtime": "12.4", "driver_version": "550.54.15", "arch_list": ["sm_80", "sm_90"],
                 "devices": [{"index": 0, "name": "NVIDIA A100-SXM4-80GB", "memory_bytes": 80 * GB,
                              "compute_capability": "8.0"}]},
        "cpu": {"model": "x", "logical": 16}, "memory_bytes": 128 * GB, "shm_bytes": 64 * GB,
        "disk_free_bytes": 500 * GB, "os": "Linux 5.15", "features": {"dev_fuse": True, "running_as_root": True},
        "credential_env_names": ["HF_TOKEN"],
    }
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = v
    return out


def _classes(rows: list[dict[str, Any]]) -> dict[str, str]:
    return {r["item"]: r["class"] for r in rows}


def test_the_same_environment_differs_in_nothing() -> None:
    assert diff(_inv(), _inv(), target_device="cuda", declared_credentials=frozenset({"HF_TOKEN"})) == []


def test_each_difference_gets_its_class_and_reason() -> None:
    tgt = _inv(python="3.12.4", torch="2.6.0+cu126", os="Linux 6.8", memory_bytes=64 * GB, shm_bytes=1 * GB,
               cpu={"model": "y", "logical": 8}, features={"dev_fuse": False, "running_as_root": True},
               credential_env_names=["HF_TOKEN", "AWS_SECRET_ACCESS_KEY"])
    tgt["cuda"] = {**tgt["cuda"], "runtime": "12.6", "driver_version": "560.35.03",
                   "devices": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 80 * GB,
                                "compute_capability": "9.0"}]}
    rows = diff(_inv(), tgt, target_device="cuda", shm_gb=2, declared_credentials=frozenset({"HF_TOKEN"}))
    got = _classes(rows)
    assert got == {"python": "risk", "torch": "risk", "cuda.runtime": "tolerance", "compute capability": "harmless",
                   "GPU": "tolerance", "cpu.logical": "risk", "memory_bytes": "risk", "shm_bytes": "blocker",
                   "os": "harmless", "features.dev_fuse": "risk", "credential_env_names": "risk"}
    reasons = {r["item"]: r["reason"] for r in rows}
    assert "weights_only=True" in reasons["torch"]  # 2.5 -> 2.6 crosses the unpickling default
    assert reasons["compute capability"] == "its sm_90 kernels run on compute capability 9.0"
    assert "AWS_SECRET_ACCESS_KEY" in next(r["target"] for r in rows if r["item"] == "credential_env_names")
    assert {r["class"] for r in rows} <= set(CLASSES)


def test_a_gpu_the_torch_build_lacks_and_too_little_disk_are_blockers() -> None:
    tgt = _inv(disk_free_bytes=3 * GB)
    tgt["cuda"] = {**tgt["cuda"], "arch_list": ["sm_80", "sm_86"],
                   "devices": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}]}
    rows = diff(_inv(), tgt, target_device="cuda", restore_bytes=4 * GB)
    got = _classes(rows)
    assert got["compute capability"] == "blocker" and got["disk_free_bytes"] == "blocker"
    two = _inv()
    two["cuda"] = {**two["cuda"], "devices": two["cuda"]["devices"] * 2}
    assert _classes(diff(two, _inv(), target_device="cuda", declared_credentials=frozenset({"HF_TOKEN"}))) == {
        "GPU count": "risk"}
    assert "carries sm_80, sm_86: none runs on compute capability 9.0" in next(
        r["reason"] for r in rows if r["item"] == "compute capability")


def test_a_build_runs_on_later_gpus_of_its_major_version_and_its_ptx_on_any_later_one() -> None:
    # CUDA's binary compatibility (cubins within a major version, PTX forward): the torch 2.5
    # cu121/cu124 wheels list sm_50 ... sm_90 without sm_89, and run on an RTX 4090 (8.9) through
    # their sm_86 cubins; an RTX 5090 (12.0) runs none of them, and runs a build with compute_90 PTX.
    wheel = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
    assert runs_on(compute_capability("RTX 4090") or "", wheel) == (True, "its sm_86 kernels run on compute capability 8.9")
    ok, why = runs_on(compute_capability("RTX 5090") or "", wheel)
    assert not ok and why.startswith("the torch build carries sm_50, sm_60")
    assert runs_on("12.0", [*wheel, "compute_90"])[0] and not runs_on("8.6", ["compute_90"])[0]
    assert not runs_on("8.9", ["sm_90a"])[0] and runs_on("9.0", ["sm_90a"])[0]  # architecture-specific: 9.0 only
    assert not runs_on("8.0", ["sm_86"])[0]  # a cubin never runs on an older minor version
    assert (bf16_tf32("8.0"), bf16_tf32("7.5")) == (True, False) and compute_capability("Not A GPU") is None
    # Vast.ai reports compute_cap itself (890 in its recorded search), preferred to the table
    assert (reported_capability(890), reported_capability(1200), reported_capability(None)) == ("8.9", "12.0", None)
    assert "compute capability 12.0" in offer_problem("RTX 4090", arch_list=wheel, reported_cc="12.0")
    # a host driver of an older CUDA major release cannot start the image's runtime; within one, minor
    # version compatibility runs it (the canary's driver check confirms the driver's floor)
    assert "older major release than the image's CUDA 13.0 runtime" in offer_problem(
        "RTX 4090", cuda_runtime="13.0", cuda_max="12.8")
    assert offer_problem("RTX 4090", cuda_runtime="12.8", cuda_max="12.2", arch_list=wheel) == ""
    assert "no bfloat16 math" in offer_problem("T4", dtype="bfloat16") and offer_problem("Unknown GPU", dtype="bfloat16") == ""
    tgt = _inv()  # the phase 03 check, on the canary's report: an RTX 4090 on those wheels is no blocker
    tgt["cuda"] = {**tgt["cuda"], "arch_list": wheel,
                   "devices": [{"index": 0, "name": "NVIDIA GeForce RTX 4090", "compute_capability": "8.9"}]}
    assert _classes(diff(_inv(), tgt, target_device="cuda", declared_credentials=frozenset({"HF_TOKEN"})))[
        "compute capability"] == "harmless"


def test_an_older_driver_is_a_risk_and_a_missing_one_is_not_checked() -> None:
    old = _inv()
    old["cuda"] = {**old["cuda"], "driver_version": "535.104.05"}
    assert _classes(diff(_inv(), old, target_device="cuda"))["cuda.driver_version"] == "risk"
    none = _inv()
    none["cuda"] = {**none["cuda"], "driver_version": None}
    assert _classes(diff(_inv(), none, target_device="cuda"))["cuda.driver_version"] == "not checked"


def test_a_driver_below_nvidia_s_floor_for_the_image_s_cuda_major_is_a_blocker() -> None:
    """NVIDIA's minor version compatibility table: CUDA 12.x needs a driver >= 525, 11.x >= 450.80.02,
    13.x >= 580 (docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html)."""
    cases = {("12.4", "520.61.05"): "blocker", ("12.4", "525.60.13"): "risk",  # risk: older than the source's
             ("11.8", "450.80.01"): "blocker", ("11.8", "450.80.02"): "risk",
             ("13.0", "575.57.08"): "blocker", ("13.0", "580.65.06"): None, ("14.0", "600.1"): "not checked"}
    for (runtime, driver), want in cases.items():
        tgt = _inv()
        tgt["cuda"] = {**tgt["cuda"], "runtime": runtime, "driver_version": driver}
        assert _classes(diff(_inv(), tgt, target_device="cuda")).get("cuda.driver_version") == want, (runtime, driver)


def test_a_cpu_target_records_driver_and_compute_capability_as_not_checked() -> None:
    here = probe(device="cpu")  # this host, as a CPU canary sees itself
    rows = diff(here, here, target_device="cpu")
    assert [(r["item"], r["class"]) for r in rows] == [("cuda.driver_version / compute capability", "not checked")]
    assert "CPU" in rows[0]["reason"]


def test_a_cuda_target_without_a_gpu_is_a_blocker() -> None:
    cpu = _inv(device="cuda")
    cpu["cuda"] = {"available": False, "runtime": "12.4", "driver_version": None, "devices": [], "arch_list": []}
    got = _classes(diff(_inv(), cpu, target_device="cuda"))
    assert got["cuda.available"] == "blocker" and got["compute capability"] == "not checked"


def test_bfloat16_on_a_gpu_without_it_blocks_and_tf32_on_one_side_only_is_a_tolerance() -> None:
    # An A100 (8.0) source, a T4 (7.5) canary: no bfloat16 or TF32 math below compute capability 8.0
    # (PyTorch's "TensorFloat-32 (TF32) on Ampere (and later) devices": cuDNN convolutions use it by default).
    t4 = _inv()
    t4["cuda"] = {**t4["cuda"], "arch_list": ["sm_75", "sm_80", "sm_86", "sm_90"],
                  "devices": [{"index": 0, "name": "Tesla T4", "compute_capability": "7.5"}]}
    bf16 = {r["item"]: r for r in diff(_inv(), t4, target_device="cuda", target_dtype="bfloat16")}
    assert bf16["bfloat16 math"]["class"] == "blocker" and "use float16 or float32" in bf16["bfloat16 math"]["reason"]
    fp32 = {r["item"]: r for r in diff(_inv(), t4, target_device="cuda", target_dtype="float32")}
    assert fp32["TF32 math"]["class"] == "tolerance" and "only the source GPU has TF32" in fp32["TF32 math"]["reason"]
    assert "bfloat16 math" not in fp32 and "TF32 math" not in {r["item"] for r in diff(
        _inv(), _inv(), target_device="cuda", target_dtype="bfloat16")}  # the same A100 both sides


def test_data_loader_workers_need_a_dev_shm() -> None:
    none = _inv(shm_bytes=0)
    rows = diff(_inv(), none, target_device="cuda", loader_workers=4, declared_credentials=frozenset({"HF_TOKEN"}))
    assert _classes(rows) == {"shm_bytes": "blocker"}
    assert "starts 4 data-loader workers" in rows[0]["reason"]
    # a container's default 64 MiB, the source's too, with no shm_gb declared: a risk named with its remedy
    docker = _inv(shm_bytes=64 * 2**20)
    rows = diff(docker, docker, target_device="cuda", loader_workers=8, declared_credentials=frozenset({"HF_TOKEN"}))
    assert _classes(rows) == {"shm_bytes": "risk"}
    assert "/dev/shm 64 MiB, a container's default, and 8 data-loader workers" in rows[0]["reason"]
    assert "--shm-size" in rows[0]["reason"]
    assert diff(docker, docker, target_device="cuda", declared_credentials=frozenset({"HF_TOKEN"})) == []  # no workers
    assert _classes(diff(docker, docker, target_device="cuda", loader_workers=8, shm_gb=0.05,
                         declared_credentials=frozenset({"HF_TOKEN"}))) == {}  # declared, and enough


@pytest.mark.parametrize(("arch", "runtime", "target_image", "kept", "why"), [
    (["sm_80", "sm_86", "sm_90"], "12.4", "", ["8812345", "8812501"], ""),  # the RTX 4090s run the sm_86 cubins
    (["sm_90"], "12.4", "", [], "RTX 4090 is compute capability 8.9: the torch build carries sm_90: none runs"),
    (["sm_86"], "13.0", "", [], "supports CUDA 12.8, an older major release than the image's CUDA 13.0 runtime"),
    (["sm_90"], "13.0", "ghcr.io/example/embed-api:2.4.0", ["8812345", "8812501"], ""),  # another image: unknown build
])
def test_phase_02_drops_an_offer_whose_gpu_the_source_image_cannot_run_before_renting_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arch: list[str], runtime: str, target_image: str,
        kept: list[str], why: str) -> None:
    # params/runpod-to-vast.yaml (the same image on both sides, on CUDA) against the recorded Vast.ai
    # search (the providers' fixtures, in process); phase 01's record carries the source image's build.
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "params").mkdir()
    data = yaml.safe_load((ROOT / "params" / "runpod-to-vast.yaml").read_text())
    if target_image:
        data["target"]["image"] = target_image
    params = tmp_path / "params" / "runpod-to-vast.yaml"
    params.write_text(dump_yaml(data))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(FIXTURES_ENV, str(tmp_path / ".runbook" / "fixtures"))
    run = RunDir.create(params)
    write_record(run.path, "01", status="completed",
                 data={"freeze": {"environment": {"cuda": {"arch_list": arch, "runtime": runtime}}}})
    ctx = open_phase("02", str(params), str(run.path), run_mode="headless")
    try:
        offers = mapping.target_offers(ctx)
        rows = {r.dependency: r for r in mapping.dependency_map(ctx, offers)}
    finally:
        for prov in ctx.resources.providers.values():
            prov.close()
    assert offers is not None and list(offers.ranked) == kept
    dropped = [r for r in offers.table if r.offer_id in ("8812345", "8812501") and not r.accepted]
    assert len(dropped) == 2 - len(kept)
    for r in dropped:  # the reason is in the offer table phase 02 writes, and no canary is planned on it
        assert why in r.reasons
    row = rows["target offer"]
    assert (row.status == "no equivalent") == (not kept)
    assert ("or use an image built for them" in row.reason) == (not kept)
    if kept:  # what the best offer's GPU runs, or why phase 02 cannot tell
        arch_row = rows["GPU architecture"]
        assert (arch_row.status, arch_row.reason) == (
            ("adapter needed", "not checked before renting: the target runs another image than the source, whose "
             "torch build is not known here; the canary checks it") if target_image else
            ("equivalent", "its sm_86 kernels run on compute capability 8.9"))
