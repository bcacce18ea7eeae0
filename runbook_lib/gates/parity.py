"""Parity gates: checksums, outputs within the dtype's tolerance, top-1 agreement, loss band.

Tolerances per dtype are ``torch.testing.assert_close``'s documented defaults
(https://pytorch.org/docs/stable/testing.html)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import numpy as np

from runbook_lib.gates.result import GateResult, not_applicable, threshold_source

TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1.3e-6, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float16": (1e-3, 1e-5),
}
"""dtype -> (rtol, atol), from torch.testing.assert_close's documented defaults."""


def tolerance_for(dtype: str, rtol: float | None = None, atol: float | None = None) -> tuple[float, float, str]:
    """(rtol, atol, source) for ``dtype``; overrides from params win and are labelled as such."""
    d_rtol, d_atol = TOLERANCES[dtype]
    src = f"torch.testing.assert_close defaults for {dtype}"
    if rtol is not None or atol is not None:
        src = f"params override (default {dtype}: rtol {d_rtol}, atol {d_atol})"
    return (rtol if rtol is not None else d_rtol), (atol if atol is not None else d_atol), src


def checksum_exact(name: str, checks: Sequence[dict[str, Any]], *, phase: str = "") -> GateResult:
    """Every object's sha256 must equal its manifest's; no objects is INCONCLUSIVE.

    Args:
        checks: rows with ``key``, ``expected_sha256``, ``observed_sha256``.
    """
    if not checks:
        return GateResult(name, "INCONCLUSIVE", True, None, "all match", "objects", "sha256",
                          "no objects were checked", phase=phase)
    bad = [c["key"] for c in checks if c["expected_sha256"] != c["observed_sha256"]]
    return GateResult(
        name, "FAIL" if bad else "PASS", True, len(checks) - len(bad), len(checks), "objects matching",
        "sha256 of every byte, compared exactly",
        f"sha256 mismatch for {bad}: stop the migration and reconcile the data" if bad
        else f"all {len(checks)} object(s) match their manifest",
        samples={"objects": len(checks)}, source="bytes at rest must match exactly (sha256, FIPS 180-4)", phase=phase)


def output_parity(reference: np.ndarray | None, observed: np.ndarray | None, *, dtype: str,
                  rtol: float | None = None, atol: float | None = None, phase: str = "") -> GateResult:
    """Elementwise ``|obs - ref| <= atol + rtol * |ref|`` (``torch.isclose`` rule, ``equal_nan``
    False: equal infinities match, a NaN on either side does not) on golden inputs.

    Args:
        reference: golden outputs from the source, float32, any shape.
        observed: outputs from the target, same shape.
        dtype: the reference (source) dtype, which picks the default tolerance.

    Returns:
        PASS when every element is within tolerance; ``observed`` is the max abs error (inf when a
        non-finite value does not match). INCONCLUSIVE with no outputs or empty ones.
    """
    rt, at, src = tolerance_for(dtype, rtol, atol)
    thr = f"rtol {rt:g}, atol {at:g}"
    if reference is None or observed is None:
        return GateResult("output_parity", "INCONCLUSIVE", True, None, thr, "abs error", "elementwise tolerance",
                          "no outputs to compare", phase=phase, source=src)
    if reference.shape != observed.shape:
        return GateResult("output_parity", "FAIL", True, f"shape {observed.shape}", f"shape {reference.shape}",
                          "shape", "shape check", "output shape differs from the golden outputs",
                          phase=phase, source=src)
    if reference.size == 0:
        return GateResult("output_parity", "INCONCLUSIVE", True, None, thr, "abs error", "elementwise tolerance",
                          f"no values to compare (shape {reference.shape})", phase=phase, source=src)
    ref64, obs64 = reference.astype(np.float64), observed.astype(np.float64)
    # torch.isclose's rule with its default equal_nan=False: equal infinities match, NaN matches nothing
    bad = ~np.isclose(obs64, ref64, rtol=rt, atol=at, equal_nan=False)
    finite = np.isfinite(ref64) & np.isfinite(obs64)
    with np.errstate(invalid="ignore"):
        err = np.where(finite, np.abs(obs64 - ref64), np.where(bad, np.inf, 0.0))
    allowance = at + rt * np.abs(np.where(finite, ref64, 0.0))
    used = float(np.max(err / allowance))  # share of its allowance the worst element used
    frac = float(bad.mean())
    nonfinite = int((~finite & bad).sum())
    return GateResult(
        "output_parity", "FAIL" if bad.any() else "PASS", True, float(err.max()), thr, "max abs error",
        f"elementwise |T-S| <= atol + rtol*|S| over {reference.size} values",
        f"{int(bad.sum())} of {bad.size} values ({frac:.2%}) outside tolerance"
        + (f", {nonfinite} of them NaN or an infinity on one side only" if nonfinite else "")
        + f"; the worst used {used:.3g}x its allowance" if bad.any() else
        f"all {bad.size} values within tolerance; the worst used {used:.1%} of its allowance atol + rtol*|S|",
        samples={"values": int(reference.size)}, source=src, phase=phase)


def inference_parity(reference: np.ndarray | None, observed: np.ndarray | None, *, dtype: str, entry_point: str,
                     rtol: float | None = None, atol: float | None = None, phase: str = "") -> GateResult:
    """:func:`output_parity` of a ``kind: checkpoint`` entry point's answers to fixed inputs
    (``reference``: the source's, ``observed``: the canary's, float32 ``(n, dims)``), named
    ``inference_parity``: the tensors loading the same does not prove the model answers the same."""
    res = output_parity(reference, observed, dtype=dtype, rtol=rtol, atol=atol, phase=phase)
    return replace(res, name="inference_parity", detail=f"{entry_point} answers to fixed inputs: {res.detail}")


def top1_agreement(reference: np.ndarray | None, observed: np.ndarray | None, *, minimum: float,
                   phase: str = "") -> GateResult:
    """Share of rows whose argmax class agrees (classifiers): ``reference`` and ``observed``
    float ``(rows, classes)``; must be >= ``minimum``.

    With one output column (or 1-D outputs) there is no class to choose, so every row would
    "agree": the gate is NOT_APPLICABLE, covered by ``loss_band`` (the training outcome the final
    loss judges), never a PASS."""
    if reference is not None and observed is not None and (reference.ndim < 2 or reference.shape[1] < 2):
        return not_applicable("top1_agreement", True, f"the trained model's outputs have "
                              f"{1 if reference.ndim < 2 else reference.shape[1]} column: a single output has no argmax to "
                              "agree on (a regression, not a classifier)", threshold=minimum, unit="fraction",
                              method="argmax agreement", covered_by=("loss_band",), phase=phase,
                              source=threshold_source("top1_agreement_min", minimum, "every class decision unchanged"))
    if reference is None or observed is None or reference.shape != observed.shape:
        return GateResult("top1_agreement", "INCONCLUSIVE", True, None, minimum, "fraction", "argmax agreement",
                          "no comparable classifier outputs", phase=phase)
    agree = float((reference.argmax(axis=1) == observed.argmax(axis=1)).mean())
    return GateResult("top1_agreement", "PASS" if agree >= minimum else "FAIL", True, agree, minimum, "fraction",
                      "share of rows with equal argmax", f"top-1 agreement {agree:.4f} (minimum {minimum})",
                      samples={"rows": int(reference.shape[0])},
                      source=threshold_source("top1_agreement_min", minimum, "every class decision unchanged"),
                      phase=phase)


def loss_band(reference: Sequence[float], observed: Sequence[float], *, rel: float, last_k: int = 10,
              replicate: Sequence[float] | None = None, phase: str = "") -> GateResult:
    """Mean training loss over the last ``last_k`` steps: ``|T - S| / S <= band``, where the band
    is ``max(rel, 3 x A/A spread)`` and the A/A spread is the same relative difference between
    two source runs (``replicate``); without a replicate the gate is INCONCLUSIVE."""
    if len(reference) < 1 or len(observed) < 1:
        return GateResult("loss_band", "INCONCLUSIVE", True, None, rel, "relative difference", "mean of last steps",
                          "no loss values", phase=phase)
    k = min(last_k, len(reference), len(observed))
    s, t = float(np.mean(reference[-k:])), float(np.mean(observed[-k:]))
    d = abs(t - s) / max(abs(s), 1e-12)
    if replicate is None or len(replicate) < k:
        return GateResult("loss_band", "INCONCLUSIVE", True, d, rel, "relative difference", "mean of last steps",
                          "no A/A replicate of the source run: the band's noise floor is unknown", phase=phase)
    spread = abs(float(np.mean(replicate[-k:])) - s) / max(abs(s), 1e-12)
    band = max(rel, 3 * spread)
    return GateResult("loss_band", "PASS" if d <= band else "FAIL", True, d, band, "relative difference",
                      f"mean loss over the last {k} steps: source {s:.6f}, target {t:.6f}; band = max(rel, 3 x A/A "
                      f"spread {spread:.3g})",
                      f"loss differs by {d:.3%} (band {band:.2%})", samples={"steps": k},
                      source=threshold_source("loss_band_rel", rel, "1 % band on the mean loss of the last steps"),
                      phase=phase)


def artifact_parity(checks: Sequence[dict[str, Any]], golden: np.ndarray | None, outputs: np.ndarray | None,
                    golden_answers: np.ndarray | None, answers: np.ndarray | None, *, dtype: str,
                    rtol: float | None, atol: float | None, entry_point: str = "") -> list[GateResult]:
    """Phase 03's gates on what the canary returned, as phase 03 judges them and ``verify
    --recompute`` judges them again from the run's files: the artifact checksum
    (:func:`checksum_exact` over the canary's checksum rows), output parity of ``outputs`` against
    phase 01's ``golden`` (both ``(inputs, dims)`` arrays; judged when phase 01 saved golden
    outputs), and a checkpoint entry point's inference parity (``golden_answers`` against
    ``answers``; judged when either side has answers), each within the dtype's tolerance."""
    out = [checksum_exact("artifact_checksum", checks, phase="03")]
    if golden is not None:
        out.append(output_parity(golden, outputs, dtype=dtype, rtol=rtol, atol=atol, phase="03"))
    if golden_answers is not None or answers is not None:
        out.append(inference_parity(golden_answers, answers, dtype=dtype, entry_point=entry_point, rtol=rtol,
                                    atol=atol, phase="03"))
    return out
