"""Phase 04 under ``gates.method: sequential``: the latency p95 ratio and the throughput ratio
judged after each pair of rounds with anytime-valid confidence sequences
(:mod:`runbook_lib.gates.sequential`), and the rule that stops measuring.

Pair k is the k-th source round and the k-th target round with data, in round order (adjacent in
the S, T, T, S order). A gate whose threshold the operator set (so it blocks) must be decided for
the measurement to stop: measuring stops at the first look, from ``measure.min_rounds`` pairs on,
at which every blocking sequential gate has been decided (PASS or FAIL) or one has FAILed (the
target's error rate counts: :func:`error_trace`), or at ``measure.max_rounds`` pairs (the budget;
an undecided gate is then INCONCLUSIVE with the sequence it reached). The same functions judge the live looks and the raw samples afterwards, so
``runbook verify --recompute`` derives the same stopping pair, which the ``sequential_stop`` gate
checks against the pairs the run measured.

The other gates are judged once, on everything measured, as under the fixed method: the error
rate's count rule, the A/A noise floor, cold starts, cost per accepted unit (from the measured
throughput and prices), the SLO and the shift.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from runbook_lib import gates as g
from runbook_lib.gates import sequential as sq
from runbook_lib.gates.result import Verdict
from runbook_lib.params import Migration, operator_set
from runbook_lib.records import SequentialGate, SequentialLook, SequentialRecord

RATIO_GATES: dict[str, tuple[str, bool]] = {
    "latency_p95_ratio": ("gates.latency_p95_ratio_max", False),
    "throughput_ratio": ("gates.throughput_ratio_min", True),
}
"""The sequential gates: name -> (the params setting that is its threshold, whether higher is better)."""


@dataclass(frozen=True)
class Trace:
    """One sequential gate's looks. ``decided``: the first look from the minimum pairs on with a
    PASS or FAIL (None: undecided); ``blocking``: its threshold was set by the operator."""

    name: str
    threshold: float
    higher_is_better: bool
    blocking: bool
    looks: list[sq.Look]
    decided: sq.Look | None
    samples: tuple[int, int] = (0, 0)  # (source, target) samples behind the last look
    samples_from: int | None = 1  # the first look with enough samples to decide (None: not yet)


def per_round(samples: pd.DataFrame, throughput: pd.DataFrame) -> dict[str, tuple[list[float], list[float]]]:
    """Per gate, the (source, target) per-round values in round order: the p95 of each round's
    completed ``total_s`` (seconds) and each round's ``throughput_units_per_s``; and under
    ``"latency_samples"`` each of those rounds' completed samples. A round with no completed
    sample or no positive throughput gives no value."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    lat: dict[str, list[float]] = {"source": [], "target": []}
    count: dict[str, list[float]] = {"source": [], "target": []}
    if len(samples):
        done = samples[samples["status"] == "COMPLETED"]
        for (side, _r), grp in done.groupby(["side", "round"], sort=True):
            lat[str(side)].append(float(np.percentile(grp["total_s"].to_numpy(dtype=float), 95)))
            count[str(side)].append(float(len(grp)))
    out["latency_p95_ratio"] = (lat["source"], lat["target"])
    out["latency_samples"] = (count["source"], count["target"])
    thr: dict[str, list[float]] = {"source": [], "target": []}
    if len(throughput):
        for _, row in throughput.sort_values("round").iterrows():
            value = float(row["throughput_units_per_s"])
            if value > 0:
                thr[str(row["side"])].append(value)
    out["throughput_ratio"] = (thr["source"], thr["target"])
    return out


def traces(mig: Migration, samples: pd.DataFrame, throughput: pd.DataFrame) -> list[Trace]:
    """Every sequential gate's looks on the measurement so far."""
    values = per_round(samples, throughput)
    cs, ct = (np.cumsum(x) for x in values["latency_samples"])
    pairs = min(len(cs), len(ct))
    # The latency gate decides only once each side has gates.min_latency_samples, as the fixed one.
    enough = [n + 1 for n in range(pairs) if min(cs[n], ct[n]) >= mig.gates.min_latency_samples]
    latency_from = max(mig.measure.min_rounds, enough[0]) if enough else None
    out = []
    for name, (setting, higher) in RATIO_GATES.items():
        threshold = float(getattr(mig.gates, setting.split(".")[1]))
        src, tgt = values[name]
        looks = sq.ratio_looks(sq.paired_log_ratios(src, tgt), threshold=threshold, higher_is_better=higher)
        latency = name == "latency_p95_ratio"
        first = latency_from if latency else mig.measure.min_rounds
        seen = (int(cs[pairs - 1]), int(ct[pairs - 1])) if latency and pairs else (len(src), len(tgt))
        out.append(Trace(name, threshold, higher, operator_set(mig, setting), looks,
                         sq.decided(looks, first) if first is not None else None, seen, first))
    return [*out, error_trace(mig, samples, pairs)]


def error_trace(mig: Migration, samples: pd.DataFrame, pairs: int) -> Trace:
    """The target's failure rate after each pair, for the stop rule (``error_rate`` always blocks).
    With ``gates.error_rate_max`` 0 it is a count rule: a failure decides FAIL at once, and PASS
    needs ``gates.min_latency_samples`` target requests with none failed; with a positive maximum,
    the Bernoulli rate's confidence sequence (:func:`runbook_lib.gates.sequential.bernoulli_sequence`)
    decides. Each look's bounds are the sequence's. Only the rounds' requests count here; the
    final ``error_rate`` gate also counts the saturation bursts and scale-from-zero starts."""
    limit = mig.gates.error_rate_max
    target = samples[samples["side"] == "target"] if len(samples) else samples
    rounds = sorted(target["round"].unique()) if len(target) else []
    looks = []
    for n in range(1, pairs + 1):
        mine = target[target["round"].isin(rounds[:n])]
        failed, total = int((mine["status"] != "COMPLETED").sum()), len(mine)
        lower, upper = sq.bernoulli_sequence(failed, total)
        verdict: Verdict
        if limit == 0:
            verdict = "FAIL" if failed else "PASS" if total >= mig.gates.min_latency_samples else "INCONCLUSIVE"
        else:
            verdict = "PASS" if upper <= limit else "FAIL" if lower > limit else "INCONCLUSIVE"
        looks.append(sq.Look(n, failed / total if total else 0.0, lower, upper, verdict))
    first = next((lk for lk in looks if lk.verdict == "FAIL"), None) if limit == 0 else None
    return Trace("error_rate", limit, False, True, looks, first or sq.decided(looks, mig.measure.min_rounds))


def pairs_measured(found: list[Trace]) -> int:
    """Pairs of rounds the measurement holds (the latency gate's: every round has samples)."""
    return max((len(t.looks) for t in found), default=0)


def stop_pair(found: list[Trace], min_pairs: int) -> int | None:
    """The first look, from ``min_pairs`` on, at which every blocking gate is decided, or one is
    decided FAIL (the decision is then NO-GO whatever the others would read); None before.
    With no blocking sequential gate, ``min_pairs`` once that many pairs were measured."""
    blocking = [t for t in found if t.blocking]
    fails = [t.decided.pairs for t in blocking if t.decided is not None and t.decided.verdict == "FAIL"]
    if fails:
        at = max(min_pairs, min(fails))
    elif any(t.decided is None for t in blocking):
        return None
    else:
        at = max([min_pairs, *(t.decided.pairs for t in blocking if t.decided is not None)])
    return at if pairs_measured(found) >= at else None


def should_stop(mig: Migration, samples: pd.DataFrame, throughput: pd.DataFrame) -> bool:
    """Whether the measurement so far is enough: :func:`stop_pair` is reached."""
    return stop_pair(traces(mig, samples, throughput), mig.measure.min_rounds) is not None


class LiveLook:
    """The measurement so far, as phase 04 takes it, for the look after each pair of rounds
    (:func:`runbook_lib.phases.compare.protocol.schedule_rounds` calls it): each request's side,
    round, ``total_s`` and status (:meth:`add`), and the throughput rows (``throughput``, the
    same rows phase 04 writes to its throughput table)."""

    COLUMNS = ["side", "round", "total_s", "status"]

    def __init__(self, mig: Migration) -> None:
        self.mig = mig
        self.rows: list[dict[str, object]] = []
        self.throughput: list[dict[str, object]] = []

    def add(self, rows: list[dict[str, object]]) -> None:
        """Keep a round's request rows (only the columns a look reads)."""
        self.rows.extend({k: row.get(k) for k in self.COLUMNS} for row in rows)

    def __call__(self) -> bool:
        return should_stop(self.mig, pd.DataFrame(self.rows, columns=self.COLUMNS), pd.DataFrame(self.throughput))


METHOD = (f"t confidence sequence of the mean per-pair log ratio (anytime-valid; alpha {sq.ALPHA}, mixture "
          f"precision c {sq.LAI_C}; Wang and Ramdas 2023 after Lai 1976; runbook_lib.gates.sequential)")


def gate_result(t: Trace, mig: Migration) -> g.GateResult:
    """A sequential gate's verdict: the decided look's, or the last look's (INCONCLUSIVE) when
    undecided. Its observed value is the geometric mean of the per-pair ratios at that look."""
    look = t.decided or (t.looks[-1] if t.looks else None)
    what = "p95" if t.name == "latency_p95_ratio" else "throughput"
    method = f"{what} ratio, one per pair of rounds; {METHOD}"
    if t.name == "latency_p95_ratio" and t.samples_from is None:
        n = {"source": t.samples[0], "target": t.samples[1]}
        return g.GateResult(t.name, "INCONCLUSIVE", True, look.estimate if look else None, t.threshold, "ratio", method,
                            f"too few samples {n}; need >= {mig.gates.min_latency_samples} per side",
                            samples={"pairs": look.pairs if look else 0, **n}, phase="04")
    if look is None:
        return g.GateResult(t.name, "INCONCLUSIVE", True, None, t.threshold, "ratio", method,
                            "no pair of rounds with data on both sides", samples={"pairs": 0}, phase="04")
    bound = "min" if t.higher_is_better else "max"
    where = (f"decided at pair {look.pairs}" if t.decided is not None else
             f"undecided after {look.pairs} pair(s) (budget {mig.measure.max_rounds} a side): the sequence straddles "
             f"the {bound}")
    return g.GateResult(t.name, look.verdict if t.decided is not None else "INCONCLUSIVE", True, look.estimate,
                        t.threshold, "ratio", method,
                        f"{what} ratio {look.estimate:.3f}, sequence [{look.lower:.3f}, {look.upper:.3f}] vs {bound} "
                        f"{t.threshold}: {where}", samples={"pairs": look.pairs},
                        interval=(look.lower, look.upper) if np.isfinite(look.upper) else None, source="gates." + RATIO_GATES[t.name][0].split(".")[1],
                        phase="04")


def stop_gate(found: list[Trace], mig: Migration) -> g.GateResult:
    """``sequential_stop`` (blocking): the run measured exactly the pairs the stop rule allows,
    as re-derived from its samples. FAIL: it measured past the look at which every blocking gate
    was decided (the rule was not followed, or the samples were altered); INCONCLUSIVE: it ended
    before the budget with a blocking gate undecided (a spend stop or lost rounds)."""
    m = mig.measure
    measured, at = pairs_measured(found), stop_pair(found, m.min_rounds)
    method = "stop rule re-derived from the raw samples: the first look with every blocking sequential gate decided"
    if at is not None and measured > at:
        return g.GateResult("sequential_stop", "FAIL", True, measured, at, "pairs", method,
                            f"{measured} pairs measured, but every blocking gate was decided at pair {at}: the "
                            "measurement did not stop where its rule says; re-run phase 04", phase="04")
    if at is None and measured < m.max_rounds:
        return g.GateResult("sequential_stop", "INCONCLUSIVE", True, measured, m.max_rounds, "pairs", method,
                            f"{measured} of {m.max_rounds} pairs measured with a blocking gate undecided (stopped by "
                            "the spend limit or lost rounds); raise the limit or re-run phase 04", phase="04")
    how = f"decided at pair {at}" if at is not None else f"budget of {m.max_rounds} pairs reached"
    return g.GateResult("sequential_stop", "PASS", True, measured, at if at is not None else m.max_rounds, "pairs",
                        method, f"{measured} pairs measured: {how}", phase="04")


def record(found: list[Trace], mig: Migration) -> SequentialRecord:
    """What phase 04's record keeps of the sequential judgement: every look of every gate."""
    m = mig.measure
    at = stop_pair(found, m.min_rounds)
    return SequentialRecord(
        alpha=sq.ALPHA, mixture_c=sq.LAI_C, min_rounds=m.min_rounds, max_rounds=m.max_rounds,
        pairs_measured=pairs_measured(found), stopped_at_pair=at,
        gates={t.name: SequentialGate(
            threshold=t.threshold, higher_is_better=t.higher_is_better, blocking=t.blocking,
            decided_at_pair=t.decided.pairs if t.decided else None,
            looks=tuple(SequentialLook(pairs=lk.pairs, estimate=lk.estimate, lower=lk.lower,
                                       upper=lk.upper if np.isfinite(lk.upper) else None, verdict=lk.verdict)
                        for lk in t.looks)) for t in found})


def judged(mig: Migration, samples: pd.DataFrame, throughput: pd.DataFrame,
           results: list[g.GateResult]) -> list[g.GateResult]:
    """Phase 04's other gates (``results``) after the sequential ratio gates, with ``error_rate``
    judged on its Bernoulli sequence when its maximum is positive, and the ``sequential_stop``
    gate added."""
    found = traces(mig, samples, throughput)
    ratios = [gate_result(t, mig) for t in found if t.name in RATIO_GATES]
    if mig.gates.error_rate_max > 0:
        results = [bernoulli_error_gate(r) if r.name == "error_rate" else r for r in results]
    return [*ratios, *results, stop_gate(found, mig)]


def bernoulli_error_gate(fixed: g.GateResult) -> g.GateResult:
    """``error_rate`` with a positive maximum, judged on the Bernoulli rate's confidence sequence
    over every target request the fixed gate counted: PASS when the sequence is wholly at or
    below the maximum, FAIL when wholly above, else INCONCLUSIVE (the fixed rule compares the
    observed rate, which repeated looks would bias towards PASS)."""
    total = int(fixed.samples.get("requests", 0))
    if total == 0 or not isinstance(fixed.observed, float | int) or not isinstance(fixed.threshold, float | int):
        return fixed
    failed, limit = round(float(fixed.observed) * total), float(fixed.threshold)
    lower, upper = sq.bernoulli_sequence(failed, total)
    verdict: Verdict = "PASS" if upper <= limit else "FAIL" if lower > limit else "INCONCLUSIVE"
    return g.GateResult("error_rate", verdict, True, fixed.observed, limit, "fraction",
                        f"failures / requests; Bernoulli confidence sequence (beta-binomial mixture, alpha {sq.ALPHA})",
                        f"{failed} of {total} target requests failed: rate sequence [{lower:.3%}, {upper:.3%}] vs max "
                        f"{limit:.3%}", samples={"requests": total}, interval=(lower, upper), source=fixed.source,
                        phase="04")
