"""A gate's verdict with its evidence, and where each threshold came from."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from runbook_lib.params import Gates

Verdict = Literal["PASS", "FAIL", "INCONCLUSIVE", "ERROR", "NOT_APPLICABLE"]
"""``NOT_APPLICABLE``: the property a gate judges does not exist for this workload or target (top-1
agreement on a single output column, a job drill against an endpoint with no job API). Never a
PASS: a blocking one must be covered by an applicable blocking gate on the same property
(``covered_by``), or the decision holds on the missing evidence (:func:`runbook_lib.gates.decide`)."""

Decision = Literal["GO", "NO-GO", "HOLD"]


@dataclass(frozen=True)
class GateResult:
    """One gate's verdict and the evidence behind it.

    Attributes:
        name: gate id (``output_parity``, ``latency_p95_ratio``, ...).
        verdict: PASS, FAIL, INCONCLUSIVE, ERROR or NOT_APPLICABLE (:data:`Verdict`).
        blocking: a blocking FAIL makes the decision NO-GO.
        observed: the measured value (None when there was none).
        threshold: the limit it was judged against.
        unit: unit of ``observed`` and ``threshold`` (``ratio``, ``s``, ``USD``...).
        method: how ``observed`` was computed.
        samples: sample counts per side.
        interval: confidence interval of ``observed``, when there is one.
        detail: one sentence a reader can act on.
        source: where the threshold's default comes from.
        phase: phase that evaluated the gate.
        covered_by: for a NOT_APPLICABLE gate, the gates that judge the same property in its
            place (names); empty when none does.
    """

    name: str
    verdict: Verdict
    blocking: bool
    observed: float | str | None
    threshold: float | str | None
    unit: str
    method: str
    detail: str
    samples: dict[str, int] = field(default_factory=dict)
    interval: tuple[float, float] | None = None
    source: str = ""
    phase: str = ""
    covered_by: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("observed", "threshold"):
            if isinstance(d[k], float) and not math.isfinite(d[k]):
                d[k] = str(d[k])
        return d


def from_dict(d: dict[str, Any]) -> GateResult:
    """Rebuild a :class:`GateResult` from :meth:`GateResult.to_dict` output (records)."""
    d = dict(d)
    if d.get("interval") is not None:
        d["interval"] = tuple(d["interval"])
    d["covered_by"] = tuple(d.get("covered_by") or ())
    return GateResult(**d)


def threshold_source(field: str, value: Any, doc: str) -> str:
    """Say where a threshold came from: the params default (with its basis ``doc``) or an
    operator's override of it, so an overridden value is visible in evidence."""
    default = Gates.model_fields[field].default
    if value != default:
        return f"params override: gates.{field} = {value} (default {default}; {doc})"
    return f"default gates.{field} = {default} ({doc})"


def boolean_gate(name: str, ok: bool | None, *, detail: str, blocking: bool = True, phase: str = "",
                 source: str = "") -> GateResult:
    """A yes/no check; ``None`` (not measured) is INCONCLUSIVE."""
    verdict: Verdict = "INCONCLUSIVE" if ok is None else ("PASS" if ok else "FAIL")
    return GateResult(name, verdict, blocking, None if ok is None else str(ok), "True", "bool", "check", detail,
                      phase=phase, source=source)


def not_applicable(name: str, blocking: bool, why: str, *, threshold: float | str | None, unit: str, method: str,
                   covered_by: tuple[str, ...] = (), phase: str = "", source: str = "") -> GateResult:
    """Gate ``name`` recorded NOT_APPLICABLE with ``why`` (what makes the property absent here),
    naming the gates ``covered_by`` that judge the same property in its place."""
    cover = f"; judged instead by {', '.join(covered_by)}" if covered_by else "; no other gate judges this property"
    return GateResult(name, "NOT_APPLICABLE", blocking, None, threshold, unit, method, f"not applicable: {why}{cover}",
                      phase=phase, source=source, covered_by=covered_by)
