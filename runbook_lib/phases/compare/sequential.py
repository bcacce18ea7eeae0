"""Phase 04 under ``gates.method: sequential``: the latency p95 ratio and the throughput ratio
judged after each pair of rounds with anytime-valid confidence sequences
(:mod:`runbook_lib.gates.sequential`), and the rule that stops measuring.

Pair k is the k-th source round and the k-th target round with data, in round order (adjacent in
the S, T, T, S order). A gate whose threshold the operator set (so it blocks) must be decided for
the measurement to stop: measuring stops at the first look, from ``measure.min_rounds`` pairs on,
at which every blocking sequential gate has been decided (PASS or FAIL) or one has FAILed (the
target's error rate counts: :func:`error_trace`), or at ``measure.max_rounds`` pairs or
``measure.max_seconds`` (the budgets; an undecided gate is then INCONCLUSIVE with the sequence it
reached). The same functions judge the live looks and the raw samples afterwards, so
``runbook verify --recompute`` derives the same stopping pair, which the ``sequential_stop`` gate
checks against the pairs the run measured.

What each of phase 04's other gates becomes (its level must not depend on when the rule stopped):

- ``ttft_p95_ratio`` and ``tpot_p95_ratio`` (a token-streaming service): per-pair log ratios of
  per-round p95s with the same sequence as the latency ratio, in the stop rule.
- ``error_rate``: a count rule with a maximum of 0, else the Bernoulli rate's sequence; in the
  stop rule (:func:`error_trace`).
- ``latency_slo``: the share of the target's answers slower than the SLO, on the Bernoulli
  sequence against ``1 - SLO_PERCENTILE``; in the stop rule when the operator set the SLO
  (:func:`slo_trace`).
- ``cost_per_accepted_unit``: each round priced as the whole measurement is, from that round's
  throughput and accepted share and the side's prices; per-pair log ratios of USD per accepted unit
  on the t sequence (:func:`cost_trace`). It does not hold the measurement open (its egress term is
  known only once the measurement ends); a confidence sequence is valid at any stopping time, so
  judged where the others stopped it keeps its level.
- ``noise_floor`` (A/A): the first block's two source rounds, which every stopping point includes,
  so its fixed-sample interval keeps its level (``judge.aa_gate``).
- ``cold_start_ratio``: ``measure.cold_starts`` starts a side, measured after the rounds whatever
  the stop, so its fixed-sample interval keeps its level.
- ``latency_shift`` (scored), ``capacity``, ``baseline_health`` and ``spend_limit``: rules on counts
  and totals, not inferences; as under the fixed method.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from runbook_lib import gates as g
from runbook_lib.evidence.records import SequentialGate, SequentialLook, SequentialRecord
from runbook_lib.gates import sequential as sq
from runbook_lib.gates.performance import SLO_PERCENTILE
from runbook_lib.gates.result import Verdict
from runbook_lib.params import Migration, operator_set
from runbook_lib.phases.compare import goodput

RATIO_GATES: dict[str, tuple[str, bool]] = {
    "latency_p95_ratio": ("gates.latency_p95_ratio_max", False),
    "throughput_ratio": ("gates.throughput_ratio_min", True),
}
"""The sequential gates: name -> (the params setting that is its threshold, whether higher is better)."""

TOKEN_GATES: dict[str, str] = {"ttft_p95_ratio": "ttft_s", "tpot_p95_ratio": "tpot_s"}
"""A token-streaming service's sequential p95 ratio gates: name -> the sample column they read
(seconds); their margin is ``gates.latency_p95_ratio_max`` and they always block, as under the
fixed method."""


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
    stops: bool = True  # takes part in the stop rule (the cost gate does not)


def round_p95s(samples: pd.DataFrame, column: str) -> tuple[tuple[list[float], list[float]], tuple[list[float], list[float]]]:
    """The (source, target) p95 of ``column`` (seconds) over each round's completed samples with a
    finite value, in round order, and how many samples each of those rounds had. A round with
    none gives no value."""
    p95: dict[str, list[float]] = {"source": [], "target": []}
    count: dict[str, list[float]] = {"source": [], "target": []}
    if len(samples) and column in samples:
        # Columns and each round's row positions: a million samples are never copied as frames.
        vals = pd.to_numeric(samples[column], errors="coerce").to_numpy(dtype=float)
        keep = (samples["status"] == "COMPLETED").to_numpy(dtype=bool) & np.isfinite(vals)
        for (side, _r), at in sorted(samples.groupby(["side", "round"], observed=True).indices.items()):
            mine = vals[at][keep[at]]
            if mine.size:
                p95[str(side)].append(float(np.percentile(mine, 95)))
                count[str(side)].append(float(mine.size))
    return (p95["source"], p95["target"]), (count["source"], count["target"])


def per_round(samples: pd.DataFrame, throughput: pd.DataFrame) -> dict[str, tuple[list[float], list[float]]]:
    """Per gate, the (source, target) per-round values in round order: the p95 of each round's
    completed ``total_s`` (seconds) and each round's ``throughput_units_per_s``; and under
    ``"latency_samples"`` each of those rounds' completed samples. A round with no completed
    sample or no positive throughput gives no value."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    out["latency_p95_ratio"], out["latency_samples"] = round_p95s(samples, "total_s")
    thr: dict[str, list[float]] = {"source": [], "target": []}
    if len(throughput):
        for _, row in throughput.sort_values("round").iterrows():
            value = float(row["throughput_units_per_s"])
            if value > 0:
                thr[str(row["side"])].append(value)
    out["throughput_ratio"] = (thr["source"], thr["target"])
    return out


def traces(mig: Migration, samples: pd.DataFrame, throughput: pd.DataFrame,
           costs: dict[str, list[float]] | None = None) -> list[Trace]:
    """Every sequential gate's looks on the measurement so far; with ``costs`` (each side's USD
    per accepted unit per round, :func:`runbook_lib.phases.compare.judge.round_costs`) the cost
    gate's too."""
    values = per_round(samples, throughput)
    src, tgt = values["throughput_ratio"]
    threshold = mig.gates.throughput_ratio_min
    looks = sq.ratio_looks(sq.paired_log_ratios(src, tgt), threshold=threshold, higher_is_better=True)
    out = [p95_trace(mig, "latency_p95_ratio", values["latency_p95_ratio"], values["latency_samples"],
                     blocking=operator_set(mig, "gates.latency_p95_ratio_max")),
           Trace("throughput_ratio", threshold, True, operator_set(mig, "gates.throughput_ratio_min"), looks,
                 sq.decided(looks, mig.measure.min_rounds), (len(src), len(tgt)), mig.measure.min_rounds)]
    pairs = len(out[0].looks)  # rounds with completed samples on both sides
    svc = mig.workload.service
    if mig.workload.kind == "service" and svc is not None and svc.stream:
        no_tokens = goodput.tokens_unmeasurable(mig, samples)  # TPOT then scored, NOT_APPLICABLE (judge)
        out += [p95_trace(mig, name, *round_p95s(samples, col), blocking=not (no_tokens and name == "tpot_p95_ratio"))
                for name, col in TOKEN_GATES.items()]
    if mig.workload.kind == "service" and mig.gates.goodput_ratio_min is not None \
            and not goodput.unmeasurable(mig, samples):
        per = goodput.round_goodputs(mig, samples)
        src, tgt = ([max(v, goodput.GOODPUT_FLOOR) for v in per[k]] for k in ("source", "target"))
        gl = sq.ratio_looks(sq.paired_log_ratios(src, tgt), threshold=mig.gates.goodput_ratio_min,
                            higher_is_better=True)
        out.append(Trace("goodput_ratio", mig.gates.goodput_ratio_min, True, True, gl,
                         sq.decided(gl, mig.measure.min_rounds), (len(src), len(tgt)), mig.measure.min_rounds))
    out.append(error_trace(mig, samples, pairs))
    if mig.workload.serves:
        out.append(slo_trace(mig, samples, pairs))
    if costs is not None:
        out.append(cost_trace(mig, costs))
    return out


def p95_trace(mig: Migration, name: str, values: tuple[list[float], list[float]],
              counts: tuple[list[float], list[float]], *, blocking: bool) -> Trace:
    """A p95 ratio gate (target over source, at most ``gates.latency_p95_ratio_max``) on per-pair
    log ratios of per-round p95s. It decides only once each side has
    ``gates.min_latency_samples`` samples, as the fixed gate."""
    cs, ct = (np.cumsum(x) for x in counts)
    pairs = min(len(cs), len(ct))
    enough = [n + 1 for n in range(pairs) if min(cs[n], ct[n]) >= mig.gates.min_latency_samples]
    first = max(mig.measure.min_rounds, enough[0]) if enough else None
    threshold = mig.gates.latency_p95_ratio_max
    looks = sq.ratio_looks(sq.paired_log_ratios(*values), threshold=threshold, higher_is_better=False)
    seen = (int(cs[pairs - 1]), int(ct[pairs - 1])) if pairs else (0, 0)
    return Trace(name, threshold, False, blocking, looks, sq.decided(looks, first) if first is not None else None,
                 seen, first)


def slo_trace(mig: Migration, samples: pd.DataFrame, pairs: int) -> Trace:
    """``latency_slo``: the share of the target's completed requests slower than
    ``workload.requirements.max_request_s`` after each pair, on the Bernoulli rate's confidence
    sequence against ``1 - SLO_PERCENTILE`` (the fixed gate's MLPerf percentile): PASS once the
    sequence is wholly at or below it, FAIL once wholly above. Blocking (and in the stop rule)
    when the operator set the SLO."""
    slo, allowed = mig.workload.requirements.max_request_s, 1.0 - SLO_PERCENTILE
    target = samples[(samples["side"] == "target") & (samples["status"] == "COMPLETED")] if len(samples) else samples
    rounds = sorted(target["round"].unique()) if len(target) else []
    looks = []
    for n in range(1, min(pairs, len(rounds)) + 1):
        mine = target[target["round"].isin(rounds[:n])]["total_s"].to_numpy(dtype=float)
        over, total = int((mine > slo).sum()), int(mine.size)
        lower, upper = sq.bernoulli_sequence(over, total)
        verdict: Verdict = "PASS" if upper <= allowed else "FAIL" if lower > allowed else "INCONCLUSIVE"
        looks.append(sq.Look(n, over / total if total else 0.0, lower, upper, verdict))
    return Trace("latency_slo", allowed, False, operator_set(mig, "workload.requirements.max_request_s"), looks,
                 sq.decided(looks, mig.measure.min_rounds), (0, int(len(target))))


def cost_trace(mig: Migration, costs: dict[str, list[float]]) -> Trace:
    """``cost_per_accepted_unit``: per-pair log ratios of USD per accepted unit, target over
    source, on the t sequence against ``1 - gates.required_saving``. Not in the stop rule (module
    docstring); blocking when the operator set ``gates.required_saving``. A round priced at no
    finite positive cost (no accepted unit) ends the usable pairs there."""
    src, tgt = costs.get("source", []), costs.get("target", [])
    threshold = 1.0 - mig.gates.required_saving
    looks = sq.ratio_looks(cost_log_ratios(costs), threshold=threshold, higher_is_better=False)
    return Trace("cost_per_accepted_unit", threshold, False, operator_set(mig, "gates.required_saving"), looks,
                 sq.decided(looks, mig.measure.min_rounds), (len(src), len(tgt)), mig.measure.min_rounds, stops=False)


def cost_log_ratios(costs: Mapping[str, Sequence[float]]) -> np.ndarray:
    """Per-pair log ratios of USD per accepted unit, target over source (each side's rounds in
    order, :func:`runbook_lib.phases.compare.judge.round_costs`), up to the first pair with a round
    priced at no finite positive cost (no accepted unit). Shape ``(usable pairs,)``."""
    src, tgt = list(costs.get("source", [])), list(costs.get("target", []))
    n = min(len(src), len(tgt))
    usable = next((k for k in range(n) if not (0 < src[k] < math.inf and 0 < tgt[k] < math.inf)), n)
    return sq.paired_log_ratios(src[:usable], tgt[:usable])


def error_trace(mig: Migration, samples: pd.DataFrame, pairs: int) -> Trace:
    """The target's failure rate after each pair, for the stop rule (``error_rate`` always blocks).
    With ``gates.error_rate_max`` 0 it is a count rule: a failure decides FAIL at once, and PASS
    needs ``gates.min_latency_samples`` target requests with none failed; with a positive maximum,
    the Bernoulli rate's confidence sequence (:func:`runbook_lib.gates.sequential.bernoulli_sequence`)
    decides. Each look's bounds are the sequence's. Only the rounds' requests count here; the
    final ``error_rate`` gate also counts the saturation bursts and scale-from-zero starts."""
    limit = mig.gates.error_rate_max
    on = (samples["side"] == "target").to_numpy(dtype=bool) if len(samples) else np.zeros(0, dtype=bool)
    rnd = samples["round"].to_numpy() if len(samples) else np.zeros(0)
    bad = (samples["status"] != "COMPLETED").to_numpy(dtype=bool) if len(samples) else np.zeros(0, dtype=bool)
    rounds = sorted(np.unique(rnd[on]).tolist())
    looks = []
    for n in range(1, pairs + 1):
        mine = on & np.isin(rnd, rounds[:n])
        failed, total = int((bad & mine).sum()), int(mine.sum())
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
    blocking = [t for t in found if t.blocking and t.stops]
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

    COLUMNS = ["side", "round", "total_s", "status", *TOKEN_GATES.values()]

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


LABELS: dict[str, tuple[str, str]] = {
    "latency_p95_ratio": ("p95", "gates.latency_p95_ratio_max"),
    "throughput_ratio": ("throughput", "gates.throughput_ratio_min"),
    "ttft_p95_ratio": ("TTFT p95", "gates.latency_p95_ratio_max"),
    "tpot_p95_ratio": ("TPOT p95", "gates.latency_p95_ratio_max"),
    "goodput_ratio": ("goodput", "gates.goodput_ratio_min"),
    "cost_per_accepted_unit": ("USD per accepted unit", "gates.required_saving"),
}
"""What each ratio gate's sequence is a ratio of, and the setting that is its threshold."""


def gate_result(t: Trace, mig: Migration) -> g.GateResult:
    """A sequential ratio gate's verdict: the decided look's, or the last look's (INCONCLUSIVE) when
    undecided. Its observed value is the geometric mean of the per-pair ratios at that look."""
    look = t.decided or (t.looks[-1] if t.looks else None)
    what, setting = LABELS[t.name]
    method = f"{what} ratio, one per pair of rounds; {METHOD}"
    if t.name in ("latency_p95_ratio", *TOKEN_GATES) and t.samples_from is None:
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
                        f"{t.threshold:g}: {where}", samples={"pairs": look.pairs},
                        interval=(look.lower, look.upper) if np.isfinite(look.upper) else None, source=setting,
                        phase="04")


def slo_result(t: Trace, mig: Migration, fixed: g.GateResult) -> g.GateResult:
    """``latency_slo`` from its sequence (:func:`slo_trace`): the decided look's verdict, else
    INCONCLUSIVE at the last look. Observed: the target's p95 over everything measured (seconds),
    as the fixed gate reports it."""
    look = t.decided or (t.looks[-1] if t.looks else None)
    slo = mig.workload.requirements.max_request_s
    if look is None:
        return replace(fixed, verdict="INCONCLUSIVE", detail="no target request completed")
    where = (f"decided at pair {look.pairs}" if t.decided is not None else
             f"undecided after {look.pairs} pair(s): the sequence straddles {t.threshold:.0%}")
    return g.GateResult("latency_slo", look.verdict if t.decided is not None else "INCONCLUSIVE", True, fixed.observed,
                        slo, "s", f"p{SLO_PERCENTILE * 100:.0f}: share of requests over the SLO on a Bernoulli "
                        f"confidence sequence (beta-binomial mixture, alpha {sq.ALPHA}; runbook_lib.gates.sequential)",
                        f"share of target requests over {slo:g} s {look.estimate:.3%}, sequence [{look.lower:.3%}, "
                        f"{look.upper:.3%}] vs at most {t.threshold:.0%}: {where}",
                        samples={"requests": t.samples[1], "pairs": look.pairs}, interval=(look.lower, look.upper),
                        source=fixed.source, phase="04")


def over_seconds(pair_s: list[float], max_seconds: float | None) -> bool:
    """Whether another pair of rounds could take the rounds past ``max_seconds`` (None: no
    limit): the seconds spent (``pair_s``, each pair's) plus the longest pair so far. Before any
    pair, never."""
    return max_seconds is not None and bool(pair_s) and sum(pair_s) + max(pair_s) > max_seconds


def stop_gate(found: list[Trace], mig: Migration, pair_s: list[float] | None = None) -> g.GateResult:
    """``sequential_stop`` (blocking): the run measured exactly the pairs the stop rule allows,
    as re-derived from its samples (and, for ``measure.max_seconds``, from the recorded seconds
    of each pair, ``pair_s``). FAIL: it measured past the look at which every blocking gate was
    decided (the rule was not followed, or the samples were altered); INCONCLUSIVE: it ended
    before the budget with a blocking gate undecided (a spend stop or lost rounds)."""
    m = mig.measure
    measured, at = pairs_measured(found), stop_pair(found, m.min_rounds)
    method = "stop rule re-derived from the raw samples: the first look with every blocking sequential gate decided"
    if at is not None and measured > at:
        return g.GateResult("sequential_stop", "FAIL", True, measured, at, "pairs", method,
                            f"{measured} pairs measured, but every blocking gate was decided at pair {at}: the "
                            "measurement did not stop where its rule says; re-run phase 04", phase="04")
    took = list(pair_s or [])[:measured]
    if at is None and measured < m.max_rounds and len(took) == measured and over_seconds(took, m.max_seconds):
        return g.GateResult("sequential_stop", "PASS", True, measured, m.max_rounds, "pairs", method,
                            f"{measured} pairs measured in {sum(took):.1f} s: the next, as long as the longest "
                            f"({max(took):.1f} s), would pass measure.max_seconds ({m.max_seconds:g} s); the "
                            "undecided gates are INCONCLUSIVE with the sequences reached", phase="04")
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


def judged(mig: Migration, samples: pd.DataFrame, throughput: pd.DataFrame, results: list[g.GateResult],
           costs: dict[str, list[float]] | None = None, pair_s: list[float] | None = None,
           failures: str = "") -> list[g.GateResult]:
    """Phase 04's gates under the sequential method: the ratio gates from their sequences first;
    then ``results`` (the gates judged as under the fixed method, :func:`runbook_lib.phases.compare.judge.judge`)
    with ``error_rate`` on its Bernoulli sequence when its maximum is positive, ``latency_slo`` and
    ``cost_per_accepted_unit`` (with ``costs``) from their sequences; and the ``sequential_stop``
    gate (``pair_s``: each pair's wall seconds, for ``measure.max_seconds``; ``failures``: the target's
    failures named, which ``error_rate`` says). ``results`` must not
    hold the ratio gates."""
    found = traces(mig, samples, throughput, costs)
    by_name = {t.name: t for t in found}
    ratios = [gate_result(t, mig) for t in found if t.name in (*RATIO_GATES, *TOKEN_GATES, "goodput_ratio")]
    gp = goodput.goodput_gate(mig, samples)  # not measurable: NOT_APPLICABLE, as under the fixed method
    ratios += [gp] if gp is not None and gp.verdict == "NOT_APPLICABLE" else []
    out = []
    for r in results:
        if r.name == "error_rate" and mig.gates.error_rate_max > 0:
            r = bernoulli_error_gate(r, named=failures)
        elif r.name == "latency_slo" and "latency_slo" in by_name:
            r = slo_result(by_name["latency_slo"], mig, r)
        elif r.name == "cost_per_accepted_unit" and "cost_per_accepted_unit" in by_name:
            r = cost_result(by_name["cost_per_accepted_unit"], mig, r)
        out.append(r)
    return [*ratios, *out, race_stop_gate(found, mig) if mig.racing else stop_gate(found, mig, pair_s)]


def race_stop_gate(found: list[Trace], mig: Migration) -> g.GateResult:
    """``sequential_stop`` of a race's pick: its pairs were measured under the race's stop rule
    (one candidate left, or the budget), not its own, so it may have measured past the look that
    decided its gates; FAIL only past ``measure.max_rounds``. The race's stops are derived again
    from its samples by ``runbook verify --recompute`` (:mod:`runbook_lib.phases.compare.racing`)."""
    m, measured = mig.measure, pairs_measured(found)
    return g.GateResult("sequential_stop", "PASS" if measured <= m.max_rounds else "FAIL", True, measured,
                        m.max_rounds, "pairs", "the race's stop rule (runbook_lib.gates.race): pairs until one "
                        "candidate is left or the budget ends",
                        f"{measured} pairs measured under the race's stop rule (race_pick judges the race)", phase="04")


def cost_result(t: Trace, mig: Migration, fixed: g.GateResult) -> g.GateResult:
    """``cost_per_accepted_unit`` from its sequence (:func:`cost_trace`), with the fixed gate's
    basis (its method) and prices (its detail: under this method a point comparison, no
    interval); INCONCLUSIVE as the fixed gate is when a side accepted nothing."""
    if fixed.observed is None:
        return fixed
    r = gate_result(t, mig)
    return replace(r, method=f"{fixed.method}; {r.method}", detail=f"{fixed.detail}; {r.detail}", source=fixed.source,
                   unit="ratio T/S of USD per accepted unit")


def bernoulli_error_gate(fixed: g.GateResult, named: str = "") -> g.GateResult:
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
                        f"{limit:.3%}" + (f": {named}" if named else ""), samples={"requests": total},
                        interval=(lower, upper), source=fixed.source,
                        phase="04")
