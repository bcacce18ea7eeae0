"""How a host's GPUs talk to each other, and what a change of it means for multi-GPU training.

Seed 003 warns: "Multi-GPU training depends on interconnect, shared storage, and framework
behavior, not card count alone." Phase 01 records the source's interconnect (``nvidia-smi topo
-m``), its NCCL version and ``NCCL_*`` environment, and the process layout torchrun gave it;
phase 03 records the canary's, and :func:`rows` names what changed with its consequence.

The link classes and their order are ``nvidia-smi topo -m``'s own legend (printed under every
matrix; the outputs in tests/fixtures/topology/ carry it), from the fastest path between two GPUs
to the slowest::

    NV#  = Connection traversing a bonded set of # NVLinks
    PIX  = Connection traversing at most a single PCIe bridge
    PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
    PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
    NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
    SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
from typing import Any, Callable

PCIE_LINKS = ("PIX", "PXB", "PHB", "NODE", "SYS")
"""PCIe paths between two GPUs, fastest first (the legend in the module docstring). ``PHB``,
``NODE`` and ``SYS`` also cross the CPU's host bridge, so GPU peer-to-peer traffic goes through it."""

TORCHRUN_ENV = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK", "GROUP_RANK")
"""The process layout torchrun gives each worker in its environment (PyTorch's torchrun
documentation, "Environment Variables"): processes in the job and on this node, and this one's ranks."""

_CELL = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")


def _split(line: str) -> list[str]:
    """Columns of one matrix line: tab-separated in recent drivers, space-aligned in older ones
    (a header's ``CPU Affinity`` keeps its single space)."""
    return [c.strip() for c in re.split(r"\t| {2,}", line.strip()) if c.strip()]


def parse_matrix(text: str) -> dict[str, Any]:
    """Parse ``nvidia-smi topo -m``'s matrix.

    Args:
        text: the command's standard output, legend included.

    Returns:
        ``gpus`` (``["GPU0", ...]``), ``nics`` (the other device columns: ``NIC0``, ``mlx5_0``),
        ``links`` (``{"GPU0": {"GPU1": "NV18", ...}, ...}``, GPU to GPU only, ``SOC`` read as its
        newer name ``SYS``) and ``cpu_affinity`` (``{"GPU0": "0-55,112-167"}``, where printed).

    Raises:
        ValueError: no header row naming ``GPU0``, or a GPU row whose link cells do not match the
            header (the text is not this command's matrix).
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    # the header names GPU0 and, unlike every row, has no X (a device's link to itself)
    head = next((i for i, ln in enumerate(lines) if "GPU0" in _split(ln) and "X" not in ln.split()), None)
    if head is None:
        raise ValueError("no nvidia-smi topo -m header row naming GPU0 in the text")
    columns = _split(lines[head])
    devices = list(itertools.takewhile(lambda c: "Affinity" not in c and "NUMA" not in c, columns))
    gpus = [c for c in devices if c.startswith("GPU")]
    links: dict[str, dict[str, str]] = {}
    affinity: dict[str, str] = {}
    for ln in lines[head + 1:]:
        cells = ln.split()
        if not cells or cells[0].startswith("Legend"):
            break
        if cells[0] not in gpus:
            continue
        row = cells[1:1 + len(devices)]
        if len(row) != len(devices) or not all(_CELL.match(c) for c in row):
            raise ValueError(f"the {cells[0]} row has {row} under the columns {devices}: not a topo -m matrix")
        links[cells[0]] = {d: ("SYS" if c == "SOC" else c) for d, c in zip(devices, row, strict=True)
                           if d in gpus and d != cells[0]}
        if len(cells) > 1 + len(devices):
            affinity[cells[0]] = cells[1 + len(devices)]
    return {"gpus": gpus, "nics": [d for d in devices if d not in gpus], "links": links, "cpu_affinity": affinity}


def _rank(link: str) -> int:
    """Sort key of a link class, slowest highest: any NVLink bond before every PCIe path, a bond
    of more links before one of fewer."""
    if link.startswith("NV"):
        return -int(link[2:])
    return 1 + PCIE_LINKS.index(link) if link in PCIE_LINKS else len(PCIE_LINKS) + 1


def summary(matrix: dict[str, Any]) -> dict[str, Any]:
    """The interconnect in one line: ``gpus`` (count), ``interconnect`` (``NVLink`` when every GPU
    pair has NVLink, ``PCIe`` when none has, ``mixed``, or ``one GPU``) and ``weakest_link`` (the
    slowest class any pair uses, ``NV18`` or ``PHB``; "" for one GPU)."""
    pairs = [c for row in matrix["links"].values() for c in row.values()]
    if len(matrix["gpus"]) < 2 or not pairs:
        return {"gpus": len(matrix["gpus"]), "interconnect": "one GPU", "weakest_link": ""}
    nv = [c.startswith("NV") for c in pairs]
    kind = "NVLink" if all(nv) else ("PCIe" if not any(nv) else "mixed")
    return {"gpus": len(matrix["gpus"]), "interconnect": kind, "weakest_link": max(pairs, key=_rank)}


def _nvidia_smi_topo(run: Callable[[list[str]], str] | None = None) -> tuple[str | None, str]:
    """``nvidia-smi topo -m``'s output and how it was got, or None and why not."""
    exe = shutil.which("nvidia-smi")
    if not exe and run is None:
        return None, "no nvidia-smi on this host"
    try:
        out = (run or (lambda cmd: subprocess.run(cmd, capture_output=True, text=True, timeout=20,
                                                  check=True).stdout))([exe or "nvidia-smi", "topo", "-m"])
    except (subprocess.SubprocessError, OSError) as exc:
        return None, f"nvidia-smi topo -m failed: {type(exc).__name__}"
    return out, "nvidia-smi topo -m"


def probe(*, cuda_available: bool, env: dict[str, str] | None = None,
          run: Callable[[list[str]], str] | None = None) -> dict[str, Any]:
    """This host's interconnect, NCCL and process layout.

    Args:
        cuda_available: whether torch sees a CUDA device (without one there is no GPU link and no NCCL).
        env: the environment read for ``NCCL_*`` and :data:`TORCHRUN_ENV` (default ``os.environ``).
        run: runs ``["nvidia-smi", "topo", "-m"]`` and returns its stdout (default: subprocess);
            tests pass recorded outputs.

    Returns:
        ``probe`` (how the matrix was read, or why it was not), :func:`summary`'s fields,
        ``links`` (GPU to GPU), ``nccl_version`` (``torch.cuda.nccl.version()`` as ``"2.21.5"``, None
        without CUDA), ``nccl_env`` (every ``NCCL_*`` variable: tuning switches such as
        ``NCCL_P2P_DISABLE``, never credentials) and ``process_layout`` (the :data:`TORCHRUN_ENV`
        variables that are set, as integers).
    """
    env = dict(os.environ if env is None else env)
    out: dict[str, Any] = {"probe": "no CUDA device: no GPU interconnect", "gpus": 0, "interconnect": "",
                           "weakest_link": "", "links": {}, "nccl_version": None}
    if cuda_available:
        text, how = _nvidia_smi_topo(run)
        out["probe"] = how
        if text is not None:
            try:
                matrix = parse_matrix(text)
            except ValueError as exc:
                out["probe"] = f"nvidia-smi topo -m printed no matrix this parser reads ({exc})"
            else:
                out.update(summary(matrix), links=matrix["links"])
        out["nccl_version"] = _nccl_version()
    out["nccl_env"] = {k: v for k, v in sorted(env.items()) if k.startswith("NCCL_")}
    out["process_layout"] = {k: int(env[k]) for k in TORCHRUN_ENV if env.get(k, "").isdigit()}
    return out


def _nccl_version() -> str | None:
    """NCCL's version as torch reports it (``torch.cuda.nccl.version()``: a tuple in current
    releases), None where torch has no NCCL."""
    import torch

    try:
        v = torch.cuda.nccl.version()
    except (RuntimeError, AttributeError):
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def rows(source: dict[str, Any], target: dict[str, Any]) -> list[tuple[str, Any, Any, str, str]]:
    """What changed between two :func:`probe` results, as ``(item, source, target, class,
    reason)`` with the classes of :data:`runbook_lib.portability.inventory.CLASSES`: NVLink
    replaced by PCIe, a slower PCIe path, another NCCL version, and ``NCCL_*`` settings the
    source has and the target lacks. Nothing when the source has fewer than two GPUs (no
    collective crosses a GPU link there)."""
    if int(source.get("gpus") or 0) < 2:
        return []
    out: list[tuple[str, Any, Any, str, str]] = []
    ks, kt = source.get("interconnect"), target.get("interconnect")
    ws, wt = source.get("weakest_link") or "", target.get("weakest_link") or ""
    if int(target.get("gpus") or 0) >= 2 and ws and wt and _rank(wt) > _rank(ws):
        lost_nvlink = ks == "NVLink" and kt != "NVLink"
        out.append(("GPU interconnect", f"{ks} ({ws})", f"{kt} ({wt})", "risk",
                    ("NVLink replaced by PCIe between some GPU pairs: every all-reduce of the gradients crosses "
                     "PCIe" if lost_nvlink else "a slower PCIe path between some GPU pairs")
                    + (" and the CPU's host bridge" if wt in ("PHB", "NODE", "SYS") else "")
                    + ", so data-parallel steps wait longer on communication as the model grows; phase 04 compares "
                      "the step time and, with more than one process a side, an all-reduce's bus bandwidth"))
    if source.get("nccl_version") and target.get("nccl_version") and source["nccl_version"] != target["nccl_version"]:
        out.append(("NCCL version", source["nccl_version"], target["nccl_version"], "tolerance",
                    "another NCCL: its collective algorithms and defaults may differ; the loss band and the step "
                    "time judge the result"))
    env_s, env_t = source.get("nccl_env") or {}, target.get("nccl_env") or {}
    changed = sorted(k for k in env_s if env_t.get(k) != env_s[k])
    if changed:
        out.append(("NCCL_* environment", ", ".join(f"{k}={env_s[k]}" for k in changed),
                    ", ".join(f"{k}={env_t.get(k, '(unset)')}" for k in changed), "risk",
                    "the source sets these NCCL variables and the target does not set them the same: they choose "
                    "transports and algorithms (NCCL's environment variable documentation), so set them in the "
                    "target's image or template"))
    return out


def offer_row(source: dict[str, Any], gpu_count: int) -> tuple[str, str, bool, str] | None:
    """Phase 02's reading of an offer's GPU count against the source's frozen :func:`probe`, before
    renting: ``(source, target, equivalent, reason)``, or None when the source has fewer than
    two GPUs (no GPU link to keep). Fewer GPUs per machine is never equivalent: the job needs
    another world size, so each process's batch or the gradient accumulation must change to keep
    the global batch (the loss curve changes otherwise). The links themselves are not in offer
    data here; the canary's probe compares them in phase 03 (:func:`rows`)."""
    n = int(source.get("gpus") or 0)
    if n < 2:
        return None
    have = f"{source.get('interconnect')} ({source.get('weakest_link')}) between {n} GPUs"
    if gpu_count < n:
        return (have, f"{gpu_count} GPU(s) per machine", False,
                f"fewer GPUs per machine: a {n}-process data-parallel job runs with world size {gpu_count} here (or "
                "across machines, over the network), so keep the global batch by raising each process's batch or "
                "the gradient accumulation; the link between the GPUs is read by the canary's topology probe")
    return (have, f"{gpu_count} GPUs per machine", True,
            "as many GPUs per machine; whether they are linked as the source's are (NVLink or PCIe) is not in the "
            "offer data: the canary's topology probe compares it in phase 03")
