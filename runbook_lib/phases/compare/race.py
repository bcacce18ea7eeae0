"""Phase 04's race of target candidates (issue 50), judged from each candidate's measurement beside
the one source: the per-pair log ratios the sequential gates read (:mod:`.sequential`), the race
on them (:func:`runbook_lib.gates.race.race`), and the pick explained: each candidate's p95
latency and USD per accepted unit with their sequences, its fate (picked, eliminated at which
pair and why, undecided), the provider's quoted price beside the billed one, and the Pareto front
of cost per accepted unit against p95 latency.

A candidate's view is a two-sided measurement as phase 04 judges one target: the source's rounds
and the candidate's, the candidate's rows labelled ``target``, pair k being the k-th source round
and the candidate's k-th round. When the candidates' rounds are interleaved with the same source
rounds, the source's round cancels in the difference of two candidates' log ratios (the race's
pairwise comparison); when each was measured beside source rounds of its own, the difference
still compares their ratios to a source measured beside each, with the spread of both.

The absolute figures shown are the source's (its pooled p95 over every completed request, and
the geometric mean of its rounds' USD per accepted unit) times the candidate's ratio: the
geometric mean of its per-pair ratios and the race's sequence at its level, so the intervals
drawn are the ones the race decided with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from runbook_lib.evidence.records import RaceEntry, RaceRecord
from runbook_lib.gates import race as rc
from runbook_lib.gates import sequential as sq
from runbook_lib.params import Migration, operator_set
from runbook_lib.phases.compare.sequential import RATIO_GATES, cost_log_ratios, per_round

OBJECTIVES: dict[str, tuple[str, bool]] = {
    "cost_per_accepted_unit": ("cost_per_accepted_unit", False),
    "latency_p95": ("latency_p95_ratio", False),
    "throughput": ("throughput_ratio", True),
}
"""The objectives a race may pick by: name -> (the per-pair trace it reads, whether higher is better)."""

CORRECTION = ("Bonferroni (C. E. Bonferroni 1936; O. J. Dunn, JASA 56(293), 1961): alpha split over K x G "
              "sequences against the source and K (K - 1) / 2 between candidates")


@dataclass(frozen=True)
class CandidateView:
    """One candidate's measurement beside the source.

    Attributes:
        name, provider: the candidate's profile.
        samples: one row per request: ``side`` (``source`` or ``target``, the candidate's rows
            as ``target``), ``round`` (int), ``status`` (``COMPLETED`` or a failure), ``total_s``
            (float seconds), ``accepted`` (bool).
        throughput: one row per round: ``side``, ``round``, ``throughput_units_per_s`` (float).
        costs: per side, USD per accepted unit priced round by round, in round order
            (:func:`runbook_lib.phases.compare.judge.round_costs`).
        quoted_usd_per_hour: the price the candidate's profile quotes; billed_usd_per_hour: what
            the provider billed per hour, where it reports it (None: not reported).
    """

    name: str
    samples: pd.DataFrame
    throughput: pd.DataFrame
    costs: Mapping[str, Sequence[float]] = field(default_factory=dict)
    provider: str = ""
    quoted_usd_per_hour: float | None = None
    billed_usd_per_hour: float | None = None


def traces(view: CandidateView) -> dict[str, np.ndarray]:
    """The candidate's per-pair log ratios against the source (1-D float arrays, pair order):
    ``latency_p95_ratio`` (each round's p95 of completed ``total_s``), ``throughput_ratio`` and
    ``cost_per_accepted_unit`` (USD per accepted unit; the pairs end at the first round priced at
    no finite positive cost, as the sequential cost gate's do)."""
    values = per_round(view.samples, view.throughput)
    return {**{name: sq.paired_log_ratios(*values[name]) for name in RATIO_GATES},
            "cost_per_accepted_unit": cost_log_ratios(view.costs)}


def criteria(mig: Migration) -> list[rc.Criterion]:
    """The blocking gates of the race: each ratio gate whose threshold the operator set
    (``gates.latency_p95_ratio_max``, ``gates.throughput_ratio_min``, ``gates.required_saving`` as
    a cost ratio of at most ``1 - required_saving``), as they block a single target."""
    out = [rc.Criterion(name, float(getattr(mig.gates, setting.split(".")[1])), higher)
           for name, (setting, higher) in RATIO_GATES.items() if operator_set(mig, setting)]
    if operator_set(mig, "gates.required_saving"):
        out.append(rc.Criterion("cost_per_accepted_unit", 1.0 - mig.gates.required_saving, False))
    return out


def pareto_front(points: Mapping[str, tuple[float, float]]) -> set[str]:
    """The names whose point (USD per accepted unit, p95 seconds: both lower is better) no other
    point dominates (at most as high on both and lower on one). Non-finite points are never on it."""
    finite = {n: p for n, p in points.items() if all(math.isfinite(v) for v in p)}
    return {n for n, (c, l) in finite.items()
            if not any(oc <= c and ol <= l and (oc < c or ol < l) for o, (oc, ol) in finite.items() if o != n)}


def _source_figures(views: Sequence[CandidateView]) -> tuple[float, float]:
    """The source's pooled p95 (seconds, every completed request of the views' source rounds, a
    row the views share counted once) and the geometric mean of its rounds' USD per accepted unit."""
    rows = pd.concat([v.samples[v.samples["side"] == "source"] for v in views]).drop_duplicates() \
        if views else pd.DataFrame()
    done = pd.to_numeric(rows["total_s"], errors="coerce")[rows["status"] == "COMPLETED"] if len(rows) else []
    p95 = float(np.percentile(done, 95)) if len(done) else math.nan
    costs = np.array([c for v in views for c in v.costs.get("source", []) if 0 < c < math.inf], dtype=float)
    usd = float(np.exp(np.log(costs).mean())) if costs.size else math.nan
    return p95, usd


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def _scaled(base: float, x: np.ndarray, alpha: float) -> tuple[float | None, float | None, float | None]:
    """``base`` times the geometric mean of the ratios ``x`` and its sequence (None where not finite)."""
    mean, lo, hi = rc.log_sequence(x, alpha)
    if not math.isfinite(base) or not x.size:
        return None, None, None
    return _finite(base * rc.as_ratio(mean)), _finite(base * rc.as_ratio(lo)), _finite(base * rc.as_ratio(hi))


def judge_race(mig: Migration, views: Sequence[CandidateView], *, objective: str = "cost_per_accepted_unit",
               final: bool = False) -> RaceRecord:
    """Race the candidates on their views and explain where the race stands.

    Args:
        mig: the migration (its blocking gates, :func:`criteria`; ``measure.min_rounds`` pairs
            before any elimination).
        views: one :class:`CandidateView` per candidate, in the order given; at least two.
        objective: one of :data:`OBJECTIVES`.
        final: the measurement budget is spent: a single survivor is the pick, several are undecided.

    Returns:
        The :class:`runbook_lib.evidence.records.RaceRecord`: the same views always give the same
        record, so ``runbook verify --recompute`` derives the race again from the sealed samples.

    Raises:
        ValueError: an unknown objective, fewer than two candidates, or two with one name.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r}: one of {', '.join(OBJECTIVES)}")
    names = [v.name for v in views]
    if len(names) < 2 or len(set(names)) != len(names):
        raise ValueError(f"a race needs two or more candidates with distinct names, got {names}")
    trace, higher = OBJECTIVES[objective]
    gates = criteria(mig)
    by = {v.name: traces(v) for v in views}
    obj = rc.Criterion(trace, None, higher)
    res = rc.race(by, gates, obj, min_pairs=mig.measure.min_rounds, final=final)
    src_p95, src_usd = _source_figures(views)
    exits = {e.candidate: e for e in res.exits}
    entries = []
    for v in views:
        x, e, st = by[v.name], exits.get(v.name), res.standings[v.name]
        p95 = _scaled(src_p95, x["latency_p95_ratio"], res.alpha_each)
        usd = _scaled(src_usd, x["cost_per_accepted_unit"], res.alpha_each)
        fate = ("picked" if res.pick == v.name else "eliminated" if e is not None
                else "undecided" if v.name in res.undecided else "racing")
        entries.append(RaceEntry(
            name=v.name, provider=v.provider, pairs=st.pairs, fate=fate, exit_pair=e.pair if e else None,
            exit_by=e.by if e else "", exit_reason=e.reason if e else "",
            objective_ratio=_finite(st.estimate), objective_lower=_finite(st.lower), objective_upper=_finite(st.upper),
            p95_s=p95[0], p95_lower_s=p95[1], p95_upper_s=p95[2],
            usd_per_accepted_unit=usd[0], usd_lower=usd[1], usd_upper=usd[2],
            quoted_usd_per_hour=v.quoted_usd_per_hour, billed_usd_per_hour=v.billed_usd_per_hour))
    front = pareto_front({e.name: (e.usd_per_accepted_unit if e.usd_per_accepted_unit is not None else math.nan,
                                   e.p95_s if e.p95_s is not None else math.nan) for e in entries})
    return RaceRecord(objective=objective, gates=tuple(q.name for q in gates), comparisons=res.comparisons,
                      alpha_each=res.alpha_each, correction=CORRECTION, pick=res.pick, undecided=res.undecided,
                      final=final, source_p95_s=_finite(src_p95), source_usd_per_accepted_unit=_finite(src_usd),
                      entries=tuple(e.model_copy(update={"on_front": e.name in front}) for e in entries))


def table(record: RaceRecord) -> pd.DataFrame:
    """The pick's table: one row per candidate (its fate, pairs, exit, p95 and USD per accepted
    unit with their sequences, the quoted and billed price per hour, whether it is on the front)."""

    def span(lo: float | None, hi: float | None, digits: int) -> str:
        return "" if lo is None and hi is None else \
            f"[{'0' if lo is None else f'{lo:.{digits}g}'}, {'inf' if hi is None else f'{hi:.{digits}g}'}]"

    return pd.DataFrame([{
        "candidate": e.name, "provider": e.provider, "fate": e.fate, "pairs": e.pairs,
        "out at pair": e.exit_pair, "why": e.exit_reason,
        "p95 (s)": e.p95_s, "p95 sequence (s)": span(e.p95_lower_s, e.p95_upper_s, 3),
        "USD per accepted unit": e.usd_per_accepted_unit,
        "USD sequence": span(e.usd_lower, e.usd_upper, 3),
        "quoted USD/h": e.quoted_usd_per_hour, "billed USD/h": e.billed_usd_per_hour,
        "Pareto front": e.on_front} for e in record.entries])
