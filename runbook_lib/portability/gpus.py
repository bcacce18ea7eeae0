"""What a GPU model can run, known before renting it: its compute capability, whether a torch
build's kernels run on it, and whether it computes in bfloat16 and TF32.

Phase 02 asks these of a marketplace offer's GPU (its canonical name,
:func:`runbook_lib.providers.offers.canonical_gpu`) against the source image's frozen torch build,
so an offer the image cannot run is dropped before anything is rented; phase 03 asks the same of
the canary's own ``nvidia-smi`` report (:func:`runbook_lib.portability.inventory.diff`).
"""

from __future__ import annotations

from typing import Iterable

COMPUTE_CAPABILITY: dict[str, str] = {
    # Volta, Turing
    "V100": "7.0", "T4": "7.5", "RTX 2080 Ti": "7.5", "Quadro RTX 6000": "7.5", "Quadro RTX 8000": "7.5",
    # Ampere
    "A100 SXM": "8.0", "A100 PCIe": "8.0", "A30": "8.0",
    "A10": "8.6", "A10G": "8.6", "A16": "8.6", "A40": "8.6", "RTX A4000": "8.6", "RTX A4500": "8.6",
    "RTX A5000": "8.6", "RTX A6000": "8.6", "RTX 3060": "8.6", "RTX 3070": "8.6", "RTX 3080": "8.6",
    "RTX 3080 Ti": "8.6", "RTX 3090": "8.6", "RTX 3090 Ti": "8.6",
    # Ada Lovelace
    "L4": "8.9", "L40": "8.9", "L40S": "8.9", "RTX 4000 Ada": "8.9", "RTX 5000 Ada": "8.9", "RTX 6000 Ada": "8.9",
    "RTX 4060 Ti": "8.9", "RTX 4070": "8.9", "RTX 4070 Ti": "8.9", "RTX 4080": "8.9", "RTX 4080 SUPER": "8.9",
    "RTX 4090": "8.9",
    # Hopper, Blackwell
    "H100 SXM": "9.0", "H100 PCIe": "9.0", "H100 NVL": "9.0", "H200": "9.0", "H200 NVL": "9.0", "GH200": "9.0",
    "B200": "10.0", "RTX 5080": "12.0", "RTX 5090": "12.0", "RTX PRO 6000": "12.0",
}
"""Compute capability (``"major.minor"``) by canonical GPU name, from NVIDIA's "CUDA GPU Compute
Capability" page (https://developer.nvidia.com/cuda-gpus). A model missing here is not checked
before renting; the canary's own report checks it in phase 03."""

BF16_TF32_MIN = (8, 0)
"""The first compute capability with bfloat16 and TF32 tensor-core math (NVIDIA Ampere: "NVIDIA
A100 Tensor Core GPU Architecture" whitepaper, 2020; ``torch.cuda.is_bf16_supported()`` checks the
same capability)."""


def compute_capability(gpu: str) -> str | None:
    """The compute capability of canonical GPU name ``gpu`` (``"RTX 4090"`` -> ``"8.9"``); None
    when :data:`COMPUTE_CAPABILITY` does not list it."""
    return COMPUTE_CAPABILITY.get(gpu)


def _cc(v: str) -> tuple[int, int]:
    major, _, minor = v.partition(".")
    return int(major), int(minor or 0)


def _arch(entry: str) -> tuple[str, tuple[int, int], bool] | None:
    """``"sm_86"`` -> ``("sm", (8, 6), False)``; ``"compute_90"`` -> ``("compute", (9, 0), False)``;
    an architecture-specific ``"sm_90a"`` -> ``("sm", (9, 0), True)``; None for anything else."""
    kind, _, num = entry.partition("_")
    specific = num[-1:] in ("a", "f")
    digits = num[:-1] if specific else num
    if kind not in ("sm", "compute") or not digits.isdigit() or len(digits) < 2:
        return None
    return kind, (int(digits[:-1]), int(digits[-1])), specific


def runs_on(cc: str, arch_list: Iterable[str]) -> tuple[bool, str]:
    """Whether a torch build whose ``torch.cuda.get_arch_list()`` is ``arch_list`` runs its kernels
    on a GPU of compute capability ``cc``, and which entry lets it (or what the build carries).

    The rule is CUDA's binary compatibility (CUDA C++ Programming Guide, "Binary Compatibility" and
    "PTX Compatibility"): a cubin for ``sm_XY`` runs on compute capability X.Z with Z >= Y (the same
    major version only); PTX for ``compute_XY`` is compiled by the driver for any capability >= X.Y;
    an architecture-specific ``sm_XYa`` runs on X.Y alone. An RTX 4090 (8.9) runs a build that
    carries ``sm_86``; an RTX 5090 (12.0) runs none that stops at ``sm_90`` without PTX.

    Returns:
        ``(ok, why)``: ``why`` names the entry that runs, or lists what the build carries.
    """
    have = _cc(cc)
    entries = [e for e in arch_list if _arch(e) is not None]
    cubins, ptx = [], []
    for e in entries:
        kind, (major, minor), specific = _arch(e)  # type: ignore[misc]
        if kind == "sm" and (((major, minor) == have) if specific else (major == have[0] and minor <= have[1])):
            cubins.append(((major, minor), e))
        elif kind == "compute" and not specific and (major, minor) <= have:
            ptx.append(((major, minor), e))
    if cubins:  # the runtime loads the newest cubin the GPU runs
        return True, f"its {max(cubins)[1]} kernels run on compute capability {cc}"
    if ptx:
        return True, f"its {max(ptx)[1]} PTX is compiled by the driver for compute capability {cc}"
    return False, (f"the torch build carries {', '.join(entries) or 'no GPU architecture'}: none runs on compute "
                   f"capability {cc} (a cubin runs only on its own major version, PTX only on a newer GPU)")


def bf16_tf32(cc: str) -> bool:
    """Whether compute capability ``cc`` has bfloat16 and TF32 math (:data:`BF16_TF32_MIN`)."""
    return _cc(cc) >= BF16_TF32_MIN


def bf16_problem(cc: str) -> str:
    """Why a ``bfloat16`` target cannot compute on compute capability ``cc``; ``""`` when it can."""
    if bf16_tf32(cc):
        return ""
    return (f"compute capability {cc} has no bfloat16 math ({'.'.join(map(str, BF16_TF32_MIN))} or later has it) "
            "and target.dtype is bfloat16: use float16 or float32 there, or another GPU")


def reported_capability(compute_cap: object) -> str | None:
    """A compute capability from a marketplace's own field: Vast.ai's ``compute_cap``, major times
    100 plus minor times 10 (``890`` -> ``"8.9"``, ``1200`` -> ``"12.0"``, as its offer search
    returns it: runbook_lib/providers/vast/recorded/bundles_search_ondemand.json); None when absent."""
    if isinstance(compute_cap, bool) or not isinstance(compute_cap, int | float) or compute_cap <= 0:
        return None
    v = int(compute_cap)
    return f"{v // 100}.{(v % 100) // 10}"


def offer_problem(gpu: str, *, arch_list: Iterable[str] = (), dtype: str = "", cuda_runtime: str = "",
                  cuda_max: str = "", reported_cc: str | None = None) -> str:
    """Why an offer of canonical GPU model ``gpu`` cannot run the workload, known before renting
    it; ``""`` when nothing known stops it (a model missing from :data:`COMPUTE_CAPABILITY` is left
    to the canary).

    Args:
        arch_list: the torch build's ``get_arch_list()`` the target will run (empty: unknown, not
            checked). dtype: the target's compute dtype (``bfloat16`` needs :data:`BF16_TF32_MIN`).
        cuda_runtime: the CUDA runtime of that build (``"12.4"``; empty: unknown); cuda_max: the
            newest CUDA the offer's host driver supports. A driver of an older CUDA major release
            cannot run the runtime at all; within one major release minor version compatibility
            runs it (https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html),
            which the canary's driver check confirms.
        reported_cc: the compute capability the marketplace reports for the offer
            (:func:`reported_capability`), used before :data:`COMPUTE_CAPABILITY`'s.
    """
    if cuda_runtime and cuda_max and _cc(cuda_max)[0] < _cc(cuda_runtime)[0]:
        return (f"the host driver supports CUDA {cuda_max}, an older major release than the image's CUDA "
                f"{cuda_runtime} runtime, which cannot start on it")
    cc = reported_cc or compute_capability(gpu)
    if cc is None:
        return ""
    arch = list(arch_list)
    if arch:
        ok, why = runs_on(cc, arch)
        if not ok:
            return f"{gpu} is compute capability {cc}: {why}"
    return f"{gpu}: {bf16_problem(cc)}" if dtype == "bfloat16" and bf16_problem(cc) else ""
