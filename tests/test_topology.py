"""The GPU interconnect read from `nvidia-smi topo -m` as public posts printed it
(tests/fixtures/topology/README.md names each), the probe's NCCL and process layout, and what a
change of interconnect means in the canary's environment diff."""

from __future__ import annotations

from pathlib import Path

import pytest

from runbook_lib.portability import inventory, topology

FIXTURES = Path(__file__).parent / "fixtures" / "topology"


def _matrix(name: str) -> dict:
    return topology.parse_matrix((FIXTURES / name).read_text())


def test_three_published_matrices_parse_into_their_interconnect() -> None:
    pcie2 = _matrix("rtx5090x2-pcie-phb.txt")
    assert pcie2["gpus"] == ["GPU0", "GPU1"] and pcie2["nics"] == []
    assert pcie2["links"] == {"GPU0": {"GPU1": "PHB"}, "GPU1": {"GPU0": "PHB"}}
    assert pcie2["cpu_affinity"] == {"GPU0": "0-63", "GPU1": "0-63"}
    assert topology.summary(pcie2) == {"gpus": 2, "interconnect": "PCIe", "weakest_link": "PHB"}

    hgx = _matrix("h100x8-nvlink-nv18.txt")
    assert len(hgx["gpus"]) == 8 and hgx["nics"] == ["NIC0", "NIC1", "NIC2", "NIC3"]
    assert {c for row in hgx["links"].values() for c in row.values()} == {"NV18"}  # NIC cells are not GPU links
    assert all(len(row) == 7 for row in hgx["links"].values())
    assert hgx["cpu_affinity"]["GPU4"] == "56-111,168-223"
    assert topology.summary(hgx) == {"gpus": 8, "interconnect": "NVLink", "weakest_link": "NV18"}

    sockets = _matrix("gpu8-pcie-two-sockets.txt")  # space-aligned, no NUMA columns, a NIC named mlx4_0
    assert sockets["nics"] == ["mlx4_0"] and sockets["links"]["GPU0"]["GPU1"] == "PIX"
    assert sockets["links"]["GPU0"]["GPU2"] == "PHB" and sockets["links"]["GPU3"]["GPU4"] == "SYS"
    assert topology.summary(sockets) == {"gpus": 8, "interconnect": "PCIe", "weakest_link": "SYS"}


def test_text_that_is_not_a_topo_matrix_is_named() -> None:
    with pytest.raises(ValueError, match="no nvidia-smi topo -m header row naming GPU0"):
        topology.parse_matrix("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    broken = (FIXTURES / "rtx5090x2-pcie-phb.txt").read_text().replace("\tPHB\t X ", "\tfast\t X ")
    with pytest.raises(ValueError, match="the GPU1 row has"):
        topology.parse_matrix(broken)


def test_the_probe_records_the_matrix_nccl_settings_and_torchrun_layout() -> None:
    text = (FIXTURES / "h100x8-nvlink-nv18.txt").read_text()
    seen: list[list[str]] = []

    def run(cmd: list[str]) -> str:
        seen.append(cmd)
        return text

    env = {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_DEBUG": "WARN", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8",
           "RANK": "3", "HF_TOKEN": "hf_secret_value", "PATH": "/usr/bin"}
    got = topology.probe(cuda_available=True, env=env, run=run)
    assert len(seen) == 1 and seen[0][0].endswith("nvidia-smi") and seen[0][1:] == ["topo", "-m"]
    assert (got["probe"], got["gpus"], got["interconnect"], got["weakest_link"]) == (
        "nvidia-smi topo -m", 8, "NVLink", "NV18")
    assert got["nccl_env"] == {"NCCL_DEBUG": "WARN", "NCCL_IB_HCA": "mlx5_0,mlx5_1"}  # NCCL_* only: no token
    assert got["process_layout"] == {"WORLD_SIZE": 8, "LOCAL_WORLD_SIZE": 8, "RANK": 3}
    cpu = topology.probe(cuda_available=False, env={})  # this machine: no GPU, nvidia-smi never run
    assert cpu["probe"].startswith("no CUDA device") and cpu["gpus"] == 0 and cpu["nccl_version"] is None
    garbled = topology.probe(cuda_available=True, env={}, run=lambda cmd: "Failed to initialize NVML")
    assert garbled["probe"].startswith("nvidia-smi topo -m printed no matrix") and garbled["gpus"] == 0


def _inv(matrix_file: str, **topo: object) -> dict:
    m = _matrix(matrix_file)
    return {"device": "cuda", "cuda": {"available": True, "devices": [{}] * len(m["gpus"])},
            "topology": {**topology.summary(m), "links": m["links"], **topo}}


def test_nvlink_replaced_by_pcie_is_a_risk_with_its_consequence_in_the_canary_diff() -> None:
    source = _inv("h100x8-nvlink-nv18.txt", nccl_version="2.21.5", nccl_env={"NCCL_IB_HCA": "mlx5_0"})
    target = _inv("gpu8-pcie-two-sockets.txt", nccl_version="2.26.2", nccl_env={})
    rows = {r["item"]: r for r in inventory.diff(source, target, target_device="cuda")}
    link = rows["GPU interconnect"]
    assert (link["source"], link["target"], link["class"]) == ("NVLink (NV18)", "PCIe (SYS)", "risk")
    assert "NVLink replaced by PCIe" in link["reason"] and "host bridge" in link["reason"]
    assert "all-reduce" in link["reason"] and "phase 04" in link["reason"]
    assert rows["NCCL version"]["class"] == "tolerance"
    env = rows["NCCL_* environment"]
    assert (env["source"], env["target"], env["class"]) == ("NCCL_IB_HCA=mlx5_0", "NCCL_IB_HCA=(unset)", "risk")
    # The same interconnect, or a faster one, is no finding; nor is anything on a one-GPU source.
    same = {r["item"] for r in inventory.diff(source, _inv("h100x8-nvlink-nv18.txt", nccl_version="2.21.5",
                                                                nccl_env={"NCCL_IB_HCA": "mlx5_0"}),
                                                 target_device="cuda")}
    assert not same & {"GPU interconnect", "NCCL version", "NCCL_* environment"}
    faster = {r["item"] for r in inventory.diff(_inv("gpu8-pcie-two-sockets.txt"), _inv("h100x8-nvlink-nv18.txt"),
                                                   target_device="cuda")}
    assert "GPU interconnect" not in faster
    one = {"topology": {"gpus": 1, "interconnect": "one GPU", "nccl_env": {"NCCL_IB_HCA": "x"}}}
    assert topology.rows(one["topology"], target["topology"]) == []


def test_phase_02_names_fewer_gpus_per_machine_before_renting() -> None:
    hgx = {**topology.summary(_matrix("h100x8-nvlink-nv18.txt"))}
    fewer = topology.offer_row(hgx, 4)
    assert fewer is not None and fewer[:3] == ("NVLink (NV18) between 8 GPUs", "4 GPU(s) per machine", False)
    assert "world size 4" in fewer[3] and "global batch" in fewer[3]
    same = topology.offer_row(hgx, 8)
    assert same is not None and same[2] and "canary's topology probe" in same[3]
    assert topology.offer_row({"gpus": 1, "interconnect": "one GPU"}, 1) is None
