"""Torch set-up shared by the workloads: device checks, thread count, dtype, timing sync."""

from __future__ import annotations

from typing import Any

from runbook_lib.errors import WorkloadError

DTYPES = ("float32", "bfloat16", "float16")


def configure(device: str, threads: int, dtype: str) -> tuple[Any, Any]:
    """Set torch's intra-op threads and resolve ``device`` and ``dtype``.

    Args:
        device: ``cpu``, ``cuda`` or ``cuda:N``.
        threads: intra-op threads (``torch.set_num_threads``).
        dtype: ``float32``, ``bfloat16`` or ``float16``.

    Returns:
        ``(torch.device, torch.dtype)``.

    Raises:
        WorkloadError: a CUDA device was asked for and is not present.
    """
    import torch

    torch.set_num_threads(threads)
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise WorkloadError(
                f"device {device!r} was asked for, but torch {torch.__version__} sees no CUDA device "
                "on this host. Set device: cpu in params or run on a GPU host."
            )
        index = dev.index or 0
        if index >= torch.cuda.device_count():
            raise WorkloadError(
                f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) present (0-based)"
            )
    return dev, getattr(torch, dtype)


def synchronize(device: Any) -> None:
    """Wait for queued kernels on a CUDA device before reading a clock (no-op on CPU)."""
    import torch

    if getattr(device, "type", str(device)).startswith("cuda"):
        torch.cuda.synchronize(device)
