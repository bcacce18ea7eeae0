"""The decision: GO / NO-GO / HOLD from every gate, and the rules that turn a gate scored or
INCONCLUSIVE, or find a NOT_APPLICABLE one uncovered."""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from runbook_lib.gates.result import Decision, GateResult

CAPACITY_GATE = "target_capacity"
"""The gate that is INCONCLUSIVE (a HOLD with a retry time) when no candidate target got the
machines it needs (:mod:`runbook_lib.phases.candidates`); a person may not resolve such a HOLD to
GO (:func:`runbook_lib.evidence.resolve.go_refusal`)."""


def scored_unless_set(result: GateResult, *, setting: str, operator_set: bool) -> GateResult:
    """Performance and cost gates decide only when the operator chose their threshold: "every
    parity and reliability gate is blocking; performance and cost gates are blocking when the
    operator set an SLO or a budget, otherwise scored" (docs/reference/gates.md 5.1).

    Args:
        result: the gate as judged.
        setting: the params field holding its threshold (``gates.latency_p95_ratio_max``).
        operator_set: whether the params file set that field explicitly.

    Returns:
        ``result`` unchanged when the operator set it; otherwise the same verdict, scored
        (``blocking=False``), with the detail saying how to make it blocking.
    """
    if operator_set:
        return result
    return replace(result, blocking=False,
                   detail=f"{result.detail}; scored: threshold not set by the operator; set {setting} in params to "
                          "make it blocking")


def measurement_lost(result: GateResult, failures: Sequence[str]) -> GateResult:
    """The gate ``result`` with some of its inputs lost to a measurement-machinery failure that
    outlasted its retries: INCONCLUSIVE, never FAIL or PASS, because an ERROR is "never evidence
    about the target" (docs/reference/gates.md 5.1, after Argo Rollouts' Error verdict). What the
    remaining data said is kept in the detail.

    Args:
        result: the gate as judged on the data that was measured.
        failures: one line per lost measurement (what, attempts, last error).
    """
    return replace(result, verdict="INCONCLUSIVE",
                   method=f"{result.method}; a measurement it needs failed after retries (ERROR -> INCONCLUSIVE)",
                   detail=f"measurement machinery failed, not evidence about the target: {'; '.join(failures)}. "
                          f"On the remaining data it read {result.verdict} ({result.detail}). Fix the provider or "
                          "endpoint connection and measure again.")


def missing_evidence(results: Sequence[GateResult]) -> list[GateResult]:
    """The blocking NOT_APPLICABLE gates in ``results`` that no applicable blocking gate covers
    (none of their ``covered_by`` is among the blocking gates judged PASS, FAIL, INCONCLUSIVE or
    ERROR): the property they were to judge has no evidence, so the decision cannot be GO."""
    judged = {r.name for r in results if r.blocking and r.verdict != "NOT_APPLICABLE"}
    return [r for r in results if r.blocking and r.verdict == "NOT_APPLICABLE" and not judged & set(r.covered_by)]


def holds(results: Sequence[GateResult]) -> bool:
    """True when ``results`` hold the migration: a blocking INCONCLUSIVE or ERROR gate, or a
    blocking NOT_APPLICABLE one that nothing covers (:func:`missing_evidence`)."""
    return any(r.blocking and r.verdict in ("INCONCLUSIVE", "ERROR") for r in results) or \
        bool(missing_evidence(results))


def decide(results: Sequence[GateResult]) -> tuple[Decision, list[str]]:
    """GO / NO-GO / HOLD and the reasons, from every gate result.

    Any blocking FAIL is NO-GO; else any blocking INCONCLUSIVE or ERROR, a blocking
    NOT_APPLICABLE gate no applicable blocking gate covers (:func:`missing_evidence`), or no gates
    at all, is HOLD; else GO. A NOT_APPLICABLE gate never counts as a PASS: a covered one is named
    in the reasons with the gates that judged its property. Scored (non-blocking) gates are
    reported but do not decide. The reasons name each gate that drove the decision.
    """
    if not results:
        return "HOLD", ["no gate was evaluated"]
    fails = [r for r in results if r.blocking and r.verdict == "FAIL"]
    if fails:
        return "NO-GO", [f"{r.name} FAIL (phase {r.phase}): {r.detail}" for r in fails]
    unsure = [f"{r.name} {r.verdict} (phase {r.phase}): {r.detail}"
              for r in results if r.blocking and r.verdict in ("INCONCLUSIVE", "ERROR")]
    missing = [f"{r.name} NOT_APPLICABLE (phase {r.phase}) and blocking, and no applicable blocking gate judges its "
               f"property, so that evidence is missing: {r.detail}. Make a gate that applies blocking, or take "
               f"{r.name} out of the blocking set if the property does not matter here"
               for r in missing_evidence(results)]
    if unsure or missing:
        return "HOLD", unsure + missing
    passed = sum(r.blocking and r.verdict == "PASS" for r in results)
    covered = [f"not applicable (blocking, covered): {r.name}: {r.detail}"
               for r in results if r.blocking and r.verdict == "NOT_APPLICABLE"]
    scored = [r for r in results if not r.blocking and r.verdict != "PASS"]
    return "GO", [f"all {passed} blocking gates PASS"] + covered + \
        [f"scored (not blocking): {r.name} {r.verdict}: {r.detail}" for r in scored]


def generator_behind(result: GateResult, rounds: Sequence[str]) -> GateResult:
    """The latency gate ``result`` when the load generator fell behind its schedule in some
    rounds: INCONCLUSIVE, never PASS or FAIL. A request sent late was not offered at its
    intended time, so the latency it measured hides the wait the schedule asked for
    (coordinated omission: docs/reference/gates.md 3.5, MLPerf's intended-start latency). What
    the data said is kept in the detail.

    Args:
        result: the gate as judged on every round.
        rounds: one line per late round (side, round, worst lateness against the bound).
    """
    return replace(result, verdict="INCONCLUSIVE",
                   method=f"{result.method}; rounds whose load generator fell behind are not a latency result",
                   detail=f"the load generator fell behind its schedule, so these rounds are not a latency result: "
                          f"{'; '.join(rounds)}. On all rounds it read {result.verdict} ({result.detail}). Measure "
                          "again on a quieter host, or lower measure.arrival_rate_per_s.")


def too_noisy(result: GateResult, aa: GateResult) -> GateResult:
    """A comparison gate's PASS when its A/A control ``aa`` (``noise_floor``) is blocking and
    INCONCLUSIVE: INCONCLUSIVE, since two rounds of the same source differ by more than half its
    margin, so a difference between the sides that passes could be the host's (docs/reference/
    gates.md 5.3: "failing => INCONCLUSIVE for all relative gates (setup too noisy)"). A FAIL is
    kept: it can only move the decision to NO-GO, which cuts nothing over. What the data said is
    kept in the detail."""
    if result.verdict != "PASS" or not aa.blocking or aa.verdict != "INCONCLUSIVE":
        return result
    return replace(result, verdict="INCONCLUSIVE",
                   method=f"{result.method}; not a result while the A/A noise floor is outside its band",
                   detail=f"not judged: the A/A control (two source rounds) is outside its band ({aa.detail}), so a "
                          f"pass here could be the host's noise. On these rounds it read PASS ({result.detail}). "
                          "Measure again on a quieter host.")
