"""Probe the environment a workload runs in, and compare two such inventories.

The probe records what silently decides whether a container runs on a host (seed 000): CUDA
and driver (or their absence), torch, Python, CPU, RAM, ``/dev/shm``, disk, and host features.
Sizes are bytes; the GPU's compute capability is ``"major.minor"``.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from typing import Any

from runbook_lib.portability import topology
from runbook_lib.portability.gpus import bf16_problem, bf16_tf32, runs_on
from runbook_lib.secret_refs import names_present


def _nvidia_smi() -> dict[str, str]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {}
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version,name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout.strip().splitlines()
    except (subprocess.SubprocessError, OSError):
        return {}
    if not out:
        return {}
    driver, name, mem = (s.strip() for s in out[0].split(",", 2))
    return {"driver_version": driver, "name": name, "memory_total": mem}


def probe(*, device: str = "cpu", disk_path: str | os.PathLike[str] = ".") -> dict[str, Any]:
    """Describe this host as the workload sees it.

    Args:
        device: the device the workload will use (``cpu``, ``cuda``, ``cuda:N``).
        disk_path: a directory on the disk whose free bytes are reported (where the work is written).

    Returns:
        JSON-serialisable dict: ``python``, ``torch``, ``cuda`` (``available``, ``runtime``,
        ``driver_version``, ``devices`` with name, total memory bytes and compute capability,
        ``arch_list``: ``torch.cuda.get_arch_list()``, e.g. ``["sm_80", "sm_90"]``),
        ``cpu`` (model, logical count), ``memory_bytes``, ``shm_bytes``, ``disk_free_bytes``,
        ``os``, ``features`` (UDP sockets, ``/dev/fuse``, running as root), ``topology``
        (:func:`runbook_lib.portability.topology.probe`: the GPU interconnect, NCCL and the
        process layout).
    """
    import psutil
    import torch

    cuda: dict[str, Any] = {"available": torch.cuda.is_available(), "runtime": torch.version.cuda,
                            "driver_version": None, "devices": [], "arch_list": []}
    if cuda["available"]:
        cuda["arch_list"] = list(torch.cuda.get_arch_list())  # the GPU architectures this torch build carries
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            cuda["devices"].append({"index": i, "name": p.name, "memory_bytes": int(p.total_memory),
                                    "compute_capability": f"{p.major}.{p.minor}"})
        cuda["driver_version"] = _nvidia_smi().get("driver_version")
    cpu_model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu_model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu_model)
    except OSError:
        pass
    shm = shutil.disk_usage("/dev/shm").total if os.path.isdir("/dev/shm") else 0
    return {
        "python": platform.python_version(),
        "python_executable_prefix": sys.prefix == sys.base_prefix and "system" or "venv",
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "cuda": cuda,
        "cpu": {"model": cpu_model, "logical": psutil.cpu_count(logical=True) or 0},
        "memory_bytes": int(psutil.virtual_memory().total),
        "shm_bytes": int(shm),
        "disk_free_bytes": int(shutil.disk_usage(disk_path).free),
        "os": f"{platform.system()} {platform.release()}",
        "features": {"udp_sockets": True, "dev_fuse": os.path.exists("/dev/fuse"),
                     "running_as_root": hasattr(os, "geteuid") and os.geteuid() == 0},
        "credential_env_names": _credential_names(),
        "topology": topology.probe(cuda_available=bool(cuda["available"])),
    }


def _credential_names() -> list[str]:
    """Names (never values) of environment variables that look like credentials."""
    return names_present()


COMPARED_KEYS = ("python", "torch", "device", "cuda.available", "cuda.runtime", "cuda.driver_version",
                 "cpu.logical", "memory_bytes", "shm_bytes")


def _get(d: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        d = d.get(part, {}) if isinstance(d, dict) else {}
    return None if d == {} else d


def compare(source: dict[str, Any], target: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows ``{"key", "source", "target", "same"}`` for :data:`COMPARED_KEYS`."""
    return [{"key": k, "source": _get(source, k), "target": _get(target, k),
             "same": _get(source, k) == _get(target, k)} for k in COMPARED_KEYS]


CLASSES = ("harmless", "tolerance", "risk", "blocker", "not checked")
"""How :func:`diff` classifies a difference: ``harmless`` (no effect on the workload),
``tolerance`` (changes numerics or speed, judged by the parity and performance gates),
``risk`` (may break the workload; a person should know), ``blocker`` (the workload cannot run
as declared), ``not checked`` (this host cannot tell, with the reason; never a pass)."""

WEIGHTS_ONLY_DEFAULT = (2, 6)
"""The torch release whose ``torch.load`` defaults to ``weights_only=True``
(https://pytorch.org/docs/stable/notes/serialization.html)."""


def _version(v: Any) -> tuple[int, ...]:
    nums = []
    for part in str(v or "").split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        nums.append(int(digits))
    return tuple(nums)


def _row(item: str, source: Any, target: Any, cls: str, reason: str) -> dict[str, Any]:
    return {"item": item, "source": source, "target": target, "class": cls, "reason": reason}


def _gpu(inv: dict[str, Any]) -> dict[str, Any]:
    devs = (inv.get("cuda") or {}).get("devices") or []
    return devs[0] if devs else {}


DOCKER_DEFAULT_SHM_BYTES = 64 * 2**20
"""A container's /dev/shm when nothing sets it: Docker's ``--shm-size`` default, 64 MiB
(https://docs.docker.com/reference/cli/docker/container/run/). PyTorch's README ("Using pre-built
images") says data-loader workers share data through it and the default "is not enough"."""

CUDA_MINOR_COMPAT_DRIVER: dict[int, tuple[int, ...]] = {11: (450, 80, 2), 12: (525,), 13: (580,)}
"""Lowest Linux host driver on which an application built with any CUDA ``<major>.x`` runtime
runs (minor version compatibility), by CUDA major release: NVIDIA's "CUDA Toolkit 11.x, 12.x, and
13.x Driver Version Ranges" (11.x: >= 450, with 450.80.02 named for the whole 11.x family; 12.x:
>= 525; 13.x: >= 580),
https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html, Table 1.
Below it the runtime cannot initialise on that host."""


def diff(source: dict[str, Any], target: dict[str, Any], *, target_device: str, memory_gb: float = 0.0,
         shm_gb: float = 0.0, disk_gb: float = 0.0, restore_bytes: int = 0, loader_workers: int = 0,
         declared_credentials: frozenset[str] = frozenset(), target_dtype: str = "") -> list[dict[str, Any]]:
    """Classify every difference between the source's inventory and the target's (both
    :func:`probe` results, the target's taken inside the canary), one row per item:
    ``{"item", "source", "target", "class", "reason"}`` with ``class`` in :data:`CLASSES`.

    Args:
        target_device: the target profile's device (``cpu``, ``cuda``, ``cuda:N``).
        memory_gb, shm_gb, disk_gb: the workload's declared needs, GB of 10**9 bytes (0: not declared).
        restore_bytes: bytes the target must restore (the frozen set), checked against its free disk.
        loader_workers: data-loader worker processes the workload starts (each needs /dev/shm).
        declared_credentials: credential names the params inject; others found in the target's
            environment are a risk.
        target_dtype: the target profile's compute dtype: ``bfloat16`` on a GPU without bfloat16
            math (:func:`runbook_lib.portability.gpus.bf16_tf32`) is a blocker.

    The GPU interconnect, NCCL version and ``NCCL_*`` settings are compared when the source has
    more than one GPU (:func:`runbook_lib.portability.topology.rows`). The compute-capability check asks whether the torch build's ``torch.cuda.get_arch_list()``
    runs on the GPU under CUDA's binary and PTX compatibility rules
    (:func:`runbook_lib.portability.gpus.runs_on`); the driver check is a blocker below the
    minimum driver of the image's CUDA major release (:data:`CUDA_MINOR_COMPAT_DRIVER`) and a
    risk when it is older than the source's.
    """
    return [*_software_rows(source, target), *_gpu_rows(source, target, target_device),
            *_math_rows(source, target, target_device, target_dtype),
            *_host_rows(source, target, memory_gb=memory_gb, shm_gb=shm_gb, disk_gb=disk_gb,
                        restore_bytes=restore_bytes, loader_workers=loader_workers),
            *[_row(*r) for r in topology.rows(source.get("topology") or {}, target.get("topology") or {})],
            *_environment_rows(source, target, declared_credentials)]


def _software_rows(source: dict[str, Any], target: dict[str, Any]) -> list[dict[str, Any]]:
    """Python and torch versions."""
    rows: list[dict[str, Any]] = []
    py_s, py_t = _version(source.get("python")), _version(target.get("python"))
    if py_s != py_t:
        rows.append(_row("python", source.get("python"), target.get("python"),
                         "risk" if py_s[:2] != py_t[:2] else "harmless",
                         "another minor version: wheels and pickles built for one may not load on the other"
                         if py_s[:2] != py_t[:2] else "a patch release"))
    t_s, t_t = _version(source.get("torch")), _version(target.get("torch"))
    if t_s != t_t:
        crosses = (t_s[:2] < WEIGHTS_ONLY_DEFAULT) != (t_t[:2] < WEIGHTS_ONLY_DEFAULT)
        rows.append(_row("torch", source.get("torch"), target.get("torch"),
                         "risk" if crosses else ("tolerance" if t_s[:2] != t_t[:2] else "harmless"),
                         "crosses torch 2.6, which made torch.load default to weights_only=True: a checkpoint "
                         "holding non-tensor objects loads on one side only" if crosses else
                         "kernels and numerics may differ; the output parity gate judges them" if t_s[:2] != t_t[:2]
                         else "a patch release"))
    return rows


def _gpu_rows(source: dict[str, Any], target: dict[str, Any], target_device: str) -> list[dict[str, Any]]:
    """CUDA availability, device, runtime, host driver, compute capability, GPU model and count."""
    rows: list[dict[str, Any]] = []
    want_cuda = target_device.startswith("cuda")
    cuda_t = target.get("cuda") or {}
    if want_cuda and not cuda_t.get("available"):
        rows.append(_row("cuda.available", (source.get("cuda") or {}).get("available"), cuda_t.get("available"),
                         "blocker", f"the target profile asks for {target_device} and torch sees no CUDA device"))
    if source.get("device") != target.get("device"):
        rows.append(_row("device", source.get("device"), target.get("device"), "tolerance",
                         "another device type or index: numerics may differ; the output parity gate judges them"))
    rt_s, rt_t = (source.get("cuda") or {}).get("runtime"), cuda_t.get("runtime")
    if rt_s != rt_t:
        rows.append(_row("cuda.runtime", rt_s, rt_t, "tolerance",
                         "another CUDA runtime in the image: kernels may differ; the parity gate judges them"))
    gs, gt = _gpu(source), _gpu(target)
    if want_cuda and cuda_t.get("available"):
        drv_s, drv_t = (source.get("cuda") or {}).get("driver_version"), cuda_t.get("driver_version")
        floor = CUDA_MINOR_COMPAT_DRIVER.get(_version(rt_t)[0]) if _version(rt_t) else None
        if not drv_t:
            rows.append(_row("cuda.driver_version", drv_s, drv_t, "not checked",
                             "nvidia-smi gave no driver version inside the canary"))
        elif floor is not None and _version(drv_t) < floor:
            need = ".".join(map(str, floor))
            rows.append(_row("cuda.driver_version", drv_s, drv_t, "blocker",
                             f"the image's CUDA {rt_t} runtime needs a host driver >= {need} (NVIDIA's minor "
                             f"version compatibility table); this host has {drv_t}. Rent a host with a newer driver "
                             "(offer.cuda_min) or use an image built for an older CUDA"))
        elif floor is None and rt_t:
            rows.append(_row("cuda.driver_version", drv_s, drv_t, "not checked",
                             f"no minimum driver is recorded here for CUDA {rt_t} (CUDA_MINOR_COMPAT_DRIVER)"))
        elif drv_s and _version(drv_t) < _version(drv_s):
            rows.append(_row("cuda.driver_version", drv_s, drv_t, "risk",
                             f"an older host driver than the source's: the image's CUDA {rt_t} runtime needs at "
                             "least the driver NVIDIA's compatibility table lists for it"))
        cc = str(gt.get("compute_capability", ""))
        arch = list(cuda_t.get("arch_list") or [])
        if cc and arch:
            ok, why = runs_on(cc, arch)
            if not ok or cc != str(gs.get("compute_capability", "")):
                rows.append(_row("compute capability", gs.get("compute_capability"), cc,
                                 "harmless" if ok else "blocker",
                                 why if ok else f"{why}: its kernels cannot run on this GPU; use an image whose torch "
                                                "build lists this architecture"))
        elif not cc or not arch:
            rows.append(_row("compute capability", gs.get("compute_capability"), cc or None, "not checked",
                             "the canary reported no GPU architecture list"))
        if gs.get("name") != gt.get("name"):
            rows.append(_row("GPU", gs.get("name"), gt.get("name"), "tolerance",
                             "another GPU model: speed and numerics differ; phase 04 and the parity gate judge them"))
    elif want_cuda:
        rows.append(_row("compute capability", gs.get("compute_capability"), None, "not checked",
                         "the target shows no CUDA device, so neither the driver nor the compute capability can be "
                         "checked"))
    else:
        rows.append(_row("cuda.driver_version / compute capability", (source.get("cuda") or {}).get("driver_version"),
                         None, "not checked", "the target runs on CPU: there is no driver or compute capability to "
                                              "check"))
    n_s, n_t = len((source.get("cuda") or {}).get("devices") or []), len(cuda_t.get("devices") or [])
    if want_cuda and cuda_t.get("available") and n_s != n_t:
        rows.append(_row("GPU count", n_s, n_t, "risk",
                         "another number of GPUs: a job sharded over the source's GPUs needs another world size, and "
                         "its sharded checkpoints resharding on load (torch.distributed.checkpoint does; a plain "
                         "per-rank state dict does not)"))
    return rows


def _math_rows(source: dict[str, Any], target: dict[str, Any], target_device: str,
               target_dtype: str) -> list[dict[str, Any]]:
    """bfloat16 and TF32 math on the two GPUs (compute capability 8.0 or later has both)."""
    cc_s, cc_t = str(_gpu(source).get("compute_capability", "")), str(_gpu(target).get("compute_capability", ""))
    if not target_device.startswith("cuda") or not cc_t:
        return []
    if target_dtype == "bfloat16" and bf16_problem(cc_t):
        return [_row("bfloat16 math", cc_s or None, cc_t, "blocker", bf16_problem(cc_t))]
    if cc_s and target_dtype in ("float32", "") and bf16_tf32(cc_s) != bf16_tf32(cc_t):
        has = "the source" if bf16_tf32(cc_s) else "the target"
        return [_row("TF32 math", cc_s, cc_t, "tolerance",
                     f"only {has} GPU has TF32: float32 convolutions (torch.backends.cudnn.allow_tf32 is on by "
                     "default) and any matmul the workload allows TF32 for round to a 10-bit mantissa there; the "
                     "output parity gate's float32 tolerance judges the difference")]
    return []


def _host_rows(source: dict[str, Any], target: dict[str, Any], *, memory_gb: float, shm_gb: float, disk_gb: float,
               restore_bytes: int, loader_workers: int) -> list[dict[str, Any]]:
    """CPU threads, memory, /dev/shm and free disk against the source and the declared needs (GB of 10**9 bytes)."""
    rows: list[dict[str, Any]] = []
    gb = 10**9
    cpu_s, cpu_t = (source.get("cpu") or {}).get("logical", 0), (target.get("cpu") or {}).get("logical", 0)
    if cpu_t < cpu_s:
        rows.append(_row("cpu.logical", cpu_s, cpu_t, "risk", "fewer CPU threads: data loading and CPU-bound steps "
                                                             "slow down; phase 04 measures it"))
    mem_s, mem_t = int(source.get("memory_bytes", 0)), int(target.get("memory_bytes", 0))
    if memory_gb and mem_t < memory_gb * gb:
        rows.append(_row("memory_bytes", mem_s, mem_t, "blocker", f"{mem_t / gb:.1f} GB visible, the workload "
                                                                 f"declares {memory_gb} GB"))
    elif mem_t < mem_s:
        rows.append(_row("memory_bytes", mem_s, mem_t, "risk", "less RAM than the source (on a shared host the "
                                                              "share may be smaller still)"))
    shm_s, shm_t = int(source.get("shm_bytes", 0)), int(target.get("shm_bytes", 0))
    if (shm_gb and shm_t < shm_gb * gb) or (loader_workers and shm_t == 0):
        rows.append(_row("shm_bytes", shm_s, shm_t, "blocker",
                         f"/dev/shm {shm_t / gb:.2f} GB; the workload declares {shm_gb} GB"
                         + (f" and starts {loader_workers} data-loader workers, which pass batches through it"
                            if loader_workers else "")))
    elif loader_workers and not shm_gb and shm_t <= DOCKER_DEFAULT_SHM_BYTES:
        rows.append(_row("shm_bytes", shm_s, shm_t, "risk",
                         f"/dev/shm {shm_t / 2**20:.0f} MiB, a container's default, and {loader_workers} data-loader "
                         "workers pass batches through it: PyTorch's README says the default segment is not enough "
                         "for them (bus errors). Declare workload.requirements.shm_gb to have it checked, and run "
                         "the container with a larger --shm-size"))
    elif shm_t < shm_s:
        rows.append(_row("shm_bytes", shm_s, shm_t, "risk", "a smaller /dev/shm: data-loader workers can fail "
                                                           "with bus errors"))
    disk_t = int(target.get("disk_free_bytes", 0))
    if restore_bytes and disk_t < restore_bytes:
        rows.append(_row("disk_free_bytes", source.get("disk_free_bytes"), disk_t, "blocker",
                         f"{disk_t} bytes free, the frozen set to restore is {restore_bytes} bytes"))
    elif disk_gb and disk_t < disk_gb * gb:
        rows.append(_row("disk_free_bytes", source.get("disk_free_bytes"), disk_t, "risk",
                         f"{disk_t / gb:.1f} GB free, the workload declares {disk_gb} GB"))
    return rows


def _environment_rows(source: dict[str, Any], target: dict[str, Any],
                      declared_credentials: frozenset[str]) -> list[dict[str, Any]]:
    """The OS, host features, and credential-looking variables the params do not inject."""
    rows: list[dict[str, Any]] = []
    if source.get("os") != target.get("os"):
        rows.append(_row("os", source.get("os"), target.get("os"), "harmless", "the kernel release differs; the "
                                                                             "container's userland is the image's"))
    f_s, f_t = source.get("features") or {}, target.get("features") or {}
    for feat in sorted(set(f_s) | set(f_t)):
        if f_s.get(feat) and not f_t.get(feat):
            rows.append(_row(f"features.{feat}", f_s.get(feat), f_t.get(feat), "risk",
                             "the source has it and the target does not: a workload relying on it breaks"))
    extra = sorted(set(target.get("credential_env_names") or []) - set(declared_credentials))
    if extra:
        rows.append(_row("credential_env_names", None, ", ".join(extra), "risk",
                         "credential-looking variables the params do not inject: a key baked into the image or "
                         "exported by the provider"))
    return rows
