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

from runbook_lib.secrets import names_present


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
        ``driver_version``, ``devices`` with name, total memory bytes and compute capability),
        ``cpu`` (model, logical count), ``memory_bytes``, ``shm_bytes``, ``disk_free_bytes``,
        ``os``, ``features`` (UDP sockets, ``/dev/fuse``, running as root).
    """
    import psutil
    import torch

    cuda: dict[str, Any] = {"available": torch.cuda.is_available(), "runtime": torch.version.cuda,
                            "driver_version": None, "devices": []}
    if cuda["available"]:
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
