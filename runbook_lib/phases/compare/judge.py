"""Phase 04's judgement of a measurement: cost per accepted unit per side, the p50/p95/p99
summary, the comparison gates (blocking when the operator set their threshold), and what the
record keeps."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from runbook_lib import gates as g
from runbook_lib.evidence.records import (
    CompareData,
    LoadGeneratorRound,
    Number,
    RaceRecord,
    SavingsForecast,
    SideSummary,
    StoreToPod,
)
from runbook_lib.measure import cost
from runbook_lib.measure.timing import INIT_PARTS
from runbook_lib.params import LiveProfile, Migration, operator_set
from runbook_lib.phases import PhaseContext, Shown, md, table
from runbook_lib.phases.compare import forecast, goodput, sequential
from runbook_lib.phases.compare.protocol import lost_measurements
from runbook_lib.phases.compare.raw import Measured
from runbook_lib.phases.serving import failures_named

OPERATOR_SETTINGS: dict[str, str] = {
    "latency_p95_ratio": "gates.latency_p95_ratio_max",
    "noise_floor": "gates.latency_p95_ratio_max",  # its margin is half the latency margin
    "throughput_ratio": "gates.throughput_ratio_min",
    "cold_start_ratio": "gates.cold_start_ratio_max",
    "cost_per_accepted_unit": "gates.required_saving",
    "latency_slo": "workload.requirements.max_request_s",
    "allreduce_busbw_ratio": "gates.allreduce_busbw_ratio_min",
}
"""Performance and cost gates, and the params field whose explicit setting makes each blocking
(docs/reference/gates.md 5.1); without it they are scored. ``spend_limit`` is blocking exactly when
``gates.spend_limit_usd`` is set; parity and reliability gates are always blocking."""


def window_costs(mig: Migration, res: Measured) -> dict[str, cost.CostBreakdown]:
    """Cost per accepted unit per side over the measurement window (billed from launch), USD: the
    profiles' prices (params), the billed seconds and egress bytes the measurement recorded, and
    the accepted samples counted from the raw samples."""
    out = {}
    for side in ("source", "target"):
        prof = getattr(mig, side)
        s = res.samples
        accepted = int(((s["side"] == side) & s["accepted"].astype(bool)).sum()) if len(s) else 0
        instances = prof.workers if mig.workload.kind == "inference" else 1  # a service pod is one instance
        out[side] = cost.breakdown(price_usd_per_hour=prof.price_usd_per_hour, billed_s=res.billed_s[side],
                                   instances=instances, accepted_units=accepted,
                                   storage_gb=mig.workload.requirements.disk_gb,
                                   storage_usd_per_gb_month=prof.storage_usd_per_gb_month,
                                   egress_bytes=res.egress_bytes[side], egress_usd_per_gb=prof.egress_usd_per_gb)
    return out


def costs(ctx: PhaseContext, res: Measured) -> dict[str, cost.CostBreakdown]:
    """:func:`window_costs`, written to ``04/cost.json``."""
    out = window_costs(ctx.mig, res)
    ctx.evidence.write_json("04/cost.json", {k: v.to_dict() for k, v in out.items()})
    return out


def traffic_terms(mig: Migration, res: Measured, side: str) -> tuple[cost.ServingTerms, np.ndarray] | None:
    """What :func:`runbook_lib.measure.cost.at_traffic` needs of ``side`` besides the traffic and the
    capacity (its workers, warm workers, price, accepted share of the open-loop requests, storage,
    egress per answer), and its per-round saturation throughputs (requests per second, the
    capacity's samples). None when the side measured no request or no throughput."""
    s, t = res.samples, res.throughput
    prof = getattr(mig, side)
    mine = s["accepted"].to_numpy(dtype=float)[(s["side"] == side).to_numpy(dtype=bool)] if len(s) else np.array([])
    thr = t[t["side"] == side]["throughput_units_per_s"].to_numpy(dtype=float) if len(t) else np.array([])
    if not mine.size or not thr.size or float(thr.mean()) <= 0:
        return None
    terms = cost.ServingTerms(workers=prof.workers, warm_workers=prof.warm_workers,
                              price_usd_per_hour=prof.price_usd_per_hour, acceptance=float(mine.mean()),
                              storage_gb=mig.workload.requirements.disk_gb,
                              storage_usd_per_gb_month=prof.storage_usd_per_gb_month,
                              egress_bytes_per_request=res.egress_bytes[side] / mine.size,
                              egress_usd_per_gb=prof.egress_usd_per_gb)
    return terms, thr


def costs_at_traffic(mig: Migration, res: Measured) -> dict[str, cost.TrafficCost] | None:
    """Inference: each side's cost per accepted unit at the declared traffic
    (``measure.traffic_per_s``, else ``arrival_rate_per_s``) with its warm workers billed busy or
    idle (:func:`runbook_lib.measure.cost.at_traffic`), from the measured saturation throughput (its mean
    over rounds), the accepted share of the open-loop requests and the bytes each answer sent.
    None for training, or when a side measured no throughput."""
    if not mig.workload.serves:
        return None
    out = {}
    for side in ("source", "target"):
        got = traffic_terms(mig, res, side)
        if got is None:
            return None
        terms, thr = got
        out[side] = terms.at(mig.measure.traffic_per_s or mig.measure.arrival_rate_per_s, float(thr.mean()))
    return out


def savings_forecast(mig: Migration, res: Measured) -> SavingsForecast | None:
    """Inference: the savings forecast at the declared traffic
    (:func:`runbook_lib.phases.compare.forecast.forecast`); None where :func:`costs_at_traffic` is."""
    sides = {side: traffic_terms(mig, res, side) for side in ("source", "target")} if mig.workload.serves else {}
    src, tgt = sides.get("source"), sides.get("target")
    if src is None or tgt is None:
        return None
    return forecast.forecast(src, tgt, mig.measure.traffic_per_s or mig.measure.arrival_rate_per_s)


def traffic_costs(ctx: PhaseContext, res: Measured) -> dict[str, cost.TrafficCost] | None:
    """:func:`costs_at_traffic`, written to ``04/cost_at_traffic.json`` when there is one."""
    out = costs_at_traffic(ctx.mig, res)
    if out is not None:
        ctx.evidence.write_json("04/cost_at_traffic.json", {k: v.to_dict() for k, v in out.items()})
    return out


def summary(res: Measured) -> pd.DataFrame:
    """p50/p95/p99 of total, queue, init and execution time per side over its completed requests
    (a failed request is never a latency sample: a fast error would lower the p95), seconds;
    requests, accepted and failed counted over all."""
    s = res.samples
    rows = []
    for side in ("source", "target"):
        d = s[s["side"] == side]
        ok = d[d["status"] == "COMPLETED"] if len(d) else d
        row: dict[str, float | int | str] = {"side": side, "requests": len(d), "accepted": int(d["accepted"].sum()) if len(d) else 0,
                               "failed": int((d["status"] != "COMPLETED").sum()) if len(d) else 0}
        for col in ("total_s", "queue_s", "init_s", "execution_s"):
            vals = ok[col].astype(float).dropna().to_numpy() if len(ok) else np.array([])
            for q in (50, 95, 99):
                row[f"{col[:-2]} p{q} (s)"] = float(np.percentile(vals, q)) if vals.size else math.nan
        t = res.throughput
        row["throughput mean (units/s)"] = float(t[t["side"] == side]["throughput_units_per_s"].mean())
        rows.append(row)
    return pd.DataFrame(rows)


def compare_gates(ctx: PhaseContext, res: Measured, costs_: dict[str, cost.CostBreakdown],
                  at_traffic: dict[str, cost.TrafficCost] | None = None) -> list[g.GateResult]:
    """:func:`judge`, its gates added to the phase's evidence."""
    return ctx.evidence.add_gates(*judge(ctx.mig, res, costs_, at_traffic))


def judge(mig: Migration, res: Measured, costs_: dict[str, cost.CostBreakdown],
          at_traffic: dict[str, cost.TrafficCost] | None = None) -> list[g.GateResult]:
    """Phase 04's comparison gates from a measurement alone (no provider, no kernel): latency p95
    ratio, throughput ratio, cold start ratio, target error rate, cost per unit (at the declared
    traffic, warm workers' idle time included, when ``at_traffic`` is given: inference; else over
    the measurement window: training), capacity, SLO, A/A noise floor, shift, baseline health and
    spend limit. Phase 04 and ``runbook verify --recompute`` both call this.

    Args:
        mig: the run's params.
        res: the measurement as :func:`runbook_lib.phases.compare.raw.load_measurement` rebuilds it.
        costs_: :func:`window_costs`; at_traffic: :func:`costs_at_traffic`.
    """
    s, t, gc = res.samples, res.throughput, mig.gates
    # Column first, then masks: a million samples are filtered as a few arrays, never copied as frames.
    total_s = s["total_s"].to_numpy(dtype=float)
    rounds = s["round"].to_numpy()
    done = (s["status"] == "COMPLETED").to_numpy(dtype=bool)
    on = {side: (s["side"] == side).to_numpy(dtype=bool) for side in ("source", "target")}
    lat = {side: total_s[on[side] & done] for side in on}
    thr = {side: t[t["side"] == side]["throughput_units_per_s"].astype(float).tolist() for side in ("source", "target")}
    cold, cold_what = cold_start_samples(res)
    burst = t[t["side"] == "target"]
    zero = res.cold_starts_from_zero if res.cold_starts_from_zero is not None else \
        pd.DataFrame(columns=["side", "status"])
    zero_t = zero[zero["side"] == "target"]
    n_tgt = int(on["target"].sum())
    failures = int((on["target"] & ~done).sum()) + int(burst.get("failed", pd.Series(dtype=float)).sum()) \
        + int((zero_t["status"] != "COMPLETED").sum())
    total = n_tgt + int(burst["requests"].sum()) + len(zero_t) if mig.workload.serves else n_tgt
    lat_rounds = {side: per_round(total_s, rounds, on[side] & done) for side in on}  # the block bootstrap resamples rounds
    src_rounds = lat_rounds["source"]
    extra: list[g.GateResult] = []
    if mig.workload.serves:
        extra.append(g.capacity(res.target_workers_ready or 0, 1 if mig.workload.kind == "service" else
                                mig.target.workers, phase="04"))
        extra.append(g.latency_slo(lat["target"], slo_s=mig.workload.requirements.max_request_s, phase="04"))
    extra += [aa_gate(mig, src_rounds, t), *([allreduce_gate(mig, res.allreduce)] if res.allreduce is not None else [])]
    extra.append(g.latency_shift(lat["source"], lat["target"], max_ratio=gc.latency_p95_ratio_max, phase="04"))
    if mig.workload.serves:
        extra.append(g.baseline_health(_source_statuses(res, on["source"], zero), max_rate=gc.error_rate_max,
                                       phase="04", live_url=getattr(mig.source, "url", "")))
    # a live source runs, and is paid for, whatever the run does: its declared price prices its
    # accepted units, and nothing of it is spent by the run
    live_src = isinstance(mig.source, LiveProfile)
    spent = sum(c.total_usd for side, c in costs_.items() if not (side == "source" and live_src))
    extra.append(g.spend_limit(spent, limit_usd=gc.spend_limit_usd, phase="04",
                               stopped=[stop.step for stop in res.spend.stops],
                               sides="the target (the live source is not the run's spend)" if live_src
                               else "both sides"))
    accepted = s["accepted"].to_numpy(dtype=float)
    # The sequential method judges cost per pair of rounds (sequential.cost_trace): the point
    # comparison here gives it the prices and basis, no bootstrap.
    acc_rounds = {side: per_round(accepted, rounds, on[side]) for side in on} if gc.method == "fixed" else None
    named = failures_named(s, on["target"] & ~done, burst)  # the target's failures, by kind and in its words
    results = [  # the sequential method judges these two ratios itself (sequential.judged)
        *([g.latency_p95_ratio(lat_rounds["source"], lat_rounds["target"], max_ratio=gc.latency_p95_ratio_max,
                               min_samples=gc.min_latency_samples, phase="04"),
           g.throughput_ratio(thr["source"], thr["target"], min_ratio=gc.throughput_ratio_min, phase="04")]
          if gc.method == "fixed" else []),
        g.cold_start_ratio(cold["source"], cold["target"], max_ratio=gc.cold_start_ratio_max, phase="04",
                           what=cold_what),
        g.error_rate(failures, total, max_rate=gc.error_rate_max, phase="04",
                     unit=f"{mig.workload.unit}s", named=named),
        g.cost_per_unit(*(_finite((at_traffic or costs_)[side].usd_per_accepted_unit) for side in ("source", "target")),
                        required_saving=gc.required_saving,
                        accepted_rounds=(acc_rounds["source"], acc_rounds["target"]) if acc_rounds else None,
                        phase="04", basis=_traffic_basis(at_traffic)),
        *extra,
    ]
    if gc.method == "sequential":  # it judges the ratio gates, token and goodput ones included, itself
        results = sequential.judged(mig, s, t, results, round_costs(mig, res, costs_, at_traffic), res.pair_s,
                                    failures=named)
    else:
        if mig.workload.kind == "service" and mig.workload.service is not None and mig.workload.service.stream:
            results += token_gates(mig, s, rounds, on, done)
        gp = goodput.goodput_gate(mig, s)
        results += [gp] if gp is not None else []
    results = live_source_gates(mig, results, thr["target"], cold["target"])
    return qualified(mig, res, [unmeasured_tpot(mig, s, r) for r in results])


def allreduce_gate(mig: Migration, table: pd.DataFrame) -> g.GateResult:
    """The all-reduce comparison of a data-parallel training job (:func:`runbook_lib.gates.allreduce_busbw_ratio`)
    from ``04/allreduce.csv`` (:data:`runbook_lib.phases.compare.raw.ALLREDUCE_COLUMNS`), judged at
    ``gates.allreduce_busbw_ratio_min``, or scored at ``gates.throughput_ratio_min`` when unset."""
    busbw = {side: table.loc[table["side"] == side, "busbw_bytes_per_s"].astype(float).tolist()
             for side in ("source", "target")}
    gc = mig.gates
    return g.allreduce_busbw_ratio(busbw["source"], busbw["target"],
                                   ranks={side: getattr(mig, side).world_size for side in ("source", "target")},
                                   min_ratio=gc.allreduce_busbw_ratio_min or gc.throughput_ratio_min,
                                   size_bytes=float(table["size_bytes"].max()) if len(table) else
                                   mig.measure.allreduce_mib * 2**20, phase="04")


def live_source_gates(mig: Migration, results: list[g.GateResult], target_thr: list[float],
                      target_cold: list[float]) -> list[g.GateResult]:
    """``throughput_ratio`` and ``cold_start_ratio`` when the source is live
    (``source.provider: live``): no saturation burst or cold start touches it, so the target's
    figures are compared with what params declare (``source.declared.throughput_units_per_s``,
    ``source.declared.cold_start_s``; marked declared in the method), or, where nothing is
    declared, shown target-only: NOT_APPLICABLE and not blocking, with the target's figure and
    the reason (never a PASS). Every other gate, and any source that is not live, as it is."""
    lp = mig.source if isinstance(mig.source, LiveProfile) else None
    if lp is None:
        return results
    gc, d = mig.gates, lp.declared
    out = []
    for r in results:
        if r.name == "throughput_ratio":
            if d.throughput_units_per_s is not None:
                got = g.throughput_ratio([d.throughput_units_per_s], target_thr, min_ratio=gc.throughput_ratio_min,
                                         phase="04")
                r = replace(got, method=got.method + "; the source's throughput is declared "
                            "(source.declared.throughput_units_per_s), not measured: it is live and never saturated")
            else:
                mean = f"{sum(target_thr) / len(target_thr):.3f} requests/s over {len(target_thr)} bursts" \
                    if target_thr else "not measured"
                r = g.not_applicable("throughput_ratio", False,
                                     f"the source is live (source.url): no saturation burst is sent to it, so there "
                                     f"is no source throughput to compare; target-only: {mean}. Declare "
                                     "source.declared.throughput_units_per_s to compare", threshold=gc.throughput_ratio_min,
                                     unit="ratio", method="target / source mean throughput", phase="04",
                                     source="params source.provider: live")
        elif r.name == "cold_start_ratio":
            if d.cold_start_s is not None:
                got = g.cold_start_ratio([d.cold_start_s], target_cold, max_ratio=gc.cold_start_ratio_max, phase="04",
                                         what="launch to first served response; the source's is declared "
                                              "(source.declared.cold_start_s), not measured")
                r = got
            else:
                med = f"target median {sorted(target_cold)[len(target_cold) // 2]:.2f} s" if target_cold \
                    else "not measured"
                r = g.not_applicable("cold_start_ratio", False,
                                     f"the source is live (source.url): it was running before the runbook came and is "
                                     f"never restarted, so it has no cold start to compare; target-only: {med}. "
                                     "Declare source.declared.cold_start_s to compare",
                                     threshold=gc.cold_start_ratio_max, unit="ratio", method="median cold start ratio",
                                     phase="04", source="params source.provider: live")
        out.append(r)
    return out


def unmeasured_tpot(mig: Migration, s: pd.DataFrame, r: g.GateResult) -> g.GateResult:
    """``tpot_p95_ratio`` as NOT_APPLICABLE, scored, with the reason, where output tokens are not
    measurable (:func:`runbook_lib.phases.compare.goodput.tokens_unmeasurable`): never a PASS, and
    not a HOLD for what the server does not report; every other gate as it is."""
    why = goodput.tokens_unmeasurable(mig, s) if r.name == "tpot_p95_ratio" else ""
    return replace(r, verdict="NOT_APPLICABLE", blocking=False, observed=None, interval=None,
                   detail=f"TPOT {why}") if why else r


def round_costs(mig: Migration, res: Measured, costs_: dict[str, cost.CostBreakdown],
                at_traffic: dict[str, cost.TrafficCost] | None) -> dict[str, list[float]]:
    """Each side's USD per accepted unit priced round by round, in round order, the way the whole
    measurement is priced: at the declared traffic (``at_traffic`` given: :func:`traffic_terms`
    with the round's saturation throughput as capacity and its accepted share) or over the
    measurement window (the side's billed cost per request over the round's accepted share). A
    round with no throughput row or no request gives no value; one with nothing accepted, ``inf``.
    Shapes: per side a list with one float per such round."""
    s, t = res.samples, res.throughput
    traffic = mig.measure.traffic_per_s or mig.measure.arrival_rate_per_s
    out: dict[str, list[float]] = {}
    # Columns, not sub-frames: a million samples are masked as arrays, never copied as frames.
    accepted = s["accepted"].to_numpy(dtype=float) if len(s) else np.array([])
    rounds = s["round"].to_numpy() if len(s) else np.array([])
    for side in ("source", "target"):
        on = (s["side"] == side).to_numpy(dtype=bool) if len(s) else np.zeros(0, dtype=bool)
        share = {int(r): float(acc.mean()) for r, acc in zip(np.unique(rounds[on]), per_round(accepted, rounds, on),
                                                             strict=True)}
        terms = traffic_terms(mig, res, side) if at_traffic else None
        rows = t[t["side"] == side].sort_values("round") if len(t) else t
        values = []
        for r, thr in zip(rows["round"] if len(rows) else [], rows["throughput_units_per_s"] if len(rows) else [], strict=True):
            acc = share.get(int(r))
            if acc is None or float(thr) <= 0:
                continue
            if terms is not None:
                values.append(replace(terms[0], acceptance=acc).at(traffic, float(thr)).usd_per_accepted_unit)
            else:  # the window's USD per accepted unit is billed / (requests x share)
                whole = costs_[side].usd_per_accepted_unit
                overall = float(accepted[on].mean())
                values.append(whole * overall / acc if acc > 0 and math.isfinite(whole) else math.inf)
        out[side] = values
    return out


NEAR_CAPACITY = 0.8
"""Offered load, as a share of the source's measured saturation throughput, above which open-loop
latency measures a queue's growth more than the service: in an M/M/1 queue the mean response
time is 1 / (mu - lambda), five service times at 0.8 and rising as 1 / (1 - rho)^2 with any
slowdown (Kleinrock, Queueing Systems, Vol. 1, 1975, section 3.2)."""


def aa_gate(mig: Migration, src_rounds: list[np.ndarray], t: pd.DataFrame) -> g.GateResult:
    """The A/A noise floor on two source rounds (:func:`runbook_lib.gates.noise_floor`; which two:
    the comment below):
    blocking. A serving workload's compares the rounds' p95 latency; a training job's the median
    step time and the mean (its inverse is the round's throughput: a stall moves the mean, not the
    median), so identical sides that a busy host made differ cannot read as a gain or a loss
    (issue 51). When it is INCONCLUSIVE and the open-loop rate is
    at least :data:`NEAR_CAPACITY` of the source's saturation throughput (requests completed per
    second of the closed-loop rounds, ``t``: the throughput table), its detail says so: that
    noise comes from the offered load, and a lower ``measure.arrival_rate_per_s`` is the remedy."""
    if len(src_rounds) < 2:
        return g.noise_floor(np.array([]), np.array([]), max_ratio=mig.gates.latency_p95_ratio_max, phase="04")
    # Fixed: the first and last source rounds. Sequential: the first block's two (pairs 1 and 2),
    # which every stopping point includes, so where the rule stopped cannot choose the rounds judged.
    last = src_rounds[1] if mig.gates.method == "sequential" else src_rounds[-1]
    aa = g.noise_floor(src_rounds[0], last, max_ratio=mig.gates.latency_p95_ratio_max,
                       q=95 if mig.workload.serves else 50, means=not mig.workload.serves, phase="04")
    if not mig.workload.serves:
        return aa
    src = t[t["side"] == "source"]
    elapsed = float(src["elapsed_s"].astype(float).sum()) if len(src) else 0.0
    capacity = float(src["completed"].astype(float).sum()) / elapsed if elapsed > 0 else math.nan
    offered = mig.measure.arrival_rate_per_s
    if aa.verdict == "INCONCLUSIVE" and capacity > 0 and offered >= NEAR_CAPACITY * capacity:
        note = (f"; the offered load, {offered:g} requests/s, is {offered / capacity:.0%} of the source's measured "
                f"saturation throughput ({capacity:.1f} requests/s), so open-loop latency there is mostly queue growth: "
                f"offer at most {NEAR_CAPACITY:.0%} of it (measure.arrival_rate_per_s)")
        return g.from_dict({**aa.to_dict(), "detail": aa.detail + note})
    return aa


def qualified(mig: Migration, res: Measured, results: list[g.GateResult]) -> list[g.GateResult]:
    """The gates as the evidence allows: scored unless the operator set their threshold, a gate
    whose measurement was lost INCONCLUSIVE, the latency gates INCONCLUSIVE when a round's
    load generator fell behind (with the ``load_generator`` gate that says so), and a relative
    gate's PASS INCONCLUSIVE while the A/A control is (:data:`RELATIVE_GATES`)."""
    s = res.samples
    pace = load_generator_rounds(s, mig.measure.max_send_lateness_s) if mig.workload.serves else []
    if pace:
        results.append(load_generator_gate(pace, mig.measure.max_send_lateness_s))
    results = [g.scored_unless_set(r, setting=OPERATOR_SETTINGS[r.name], operator_set=operator_set(mig,
               OPERATOR_SETTINGS[r.name])) if r.name in OPERATOR_SETTINGS else r for r in results]
    lost = lost_measurements(res.attempts)
    results = [g.measurement_lost(r, lost[r.name]) if r.name in lost else r for r in results]
    late = [f"{p.side} round {p.round}: {p.late} of {p.requests} requests sent more than "
            f"{mig.measure.max_send_lateness_s:g} s late (worst {p.lateness_max_s:.3f} s)" for p in pace if not p.on_time]
    results = [g.generator_behind(r, late) if late and r.name in LATENCY_GATES else r for r in results]
    aa = next((r for r in results if r.name == "noise_floor"), None)
    return [g.too_noisy(r, aa) if aa is not None and r.name in RELATIVE_GATES else r for r in results]


RELATIVE_GATES = ("latency_p95_ratio", "latency_shift", "throughput_ratio", "ttft_p95_ratio", "tpot_p95_ratio",
                  "cost_per_accepted_unit")
"""Gates that compare the sides over the measured rounds, which the A/A control's band bounds:
a PASS is INCONCLUSIVE while it is outside (:func:`runbook_lib.gates.too_noisy`). The cold-start
ratio is judged on launches of its own, outside those rounds."""


LATENCY_GATES = ("latency_p95_ratio", "latency_slo", "noise_floor", "latency_shift", "ttft_p95_ratio",
                 "tpot_p95_ratio")
"""Gates judged on request latencies: INCONCLUSIVE when any round's load generator fell behind."""


def load_generator_rounds(s: pd.DataFrame, bound_s: float) -> list[LoadGeneratorRound]:
    """Per open-loop round, how the load generator kept its schedule: requests, the offered
    arrival rate (requests over the last intended send time, per second), the achieved one
    (over the last actual send), and send lateness (actual minus intended send, seconds: p50, p99,
    max; how many exceeded ``bound_s``). A round is on time when none did."""
    out: list[LoadGeneratorRound] = []
    if not len(s) or "intended_s" not in s:
        return out
    all_intended, all_sent = s["intended_s"].to_numpy(dtype=float), s["sent_s"].to_numpy(dtype=float)
    # The groups' row positions only: a million samples are never copied as sub-frames.
    for (side, rnd), at in sorted(s.groupby(["side", "round"], observed=True).indices.items()):
        intended, sent = all_intended[at], all_sent[at]
        ok = np.isfinite(intended) & np.isfinite(sent)
        if not ok.any():
            continue
        late = sent[ok] - intended[ok]
        n = int(ok.sum())
        out.append(LoadGeneratorRound(
            side=str(side), round=int(rnd), requests=n,
            offered_per_s=n / float(intended[ok].max()) if intended[ok].max() > 0 else None,
            achieved_per_s=n / float(sent[ok].max()) if sent[ok].max() > 0 else None,
            lateness_p50_s=float(np.percentile(late, 50)), lateness_p99_s=float(np.percentile(late, 99)),
            lateness_max_s=float(late.max()), late=int((late > bound_s).sum()), on_time=bool((late <= bound_s).all())))
    return out


def load_generator_gate(rounds: list[LoadGeneratorRound], bound_s: float) -> g.GateResult:
    """Scored: PASS when every round's requests left within ``bound_s`` of their intended time,
    else INCONCLUSIVE naming the late rounds (their latency gates are INCONCLUSIVE too)."""
    late = [r for r in rounds if not r.on_time]
    worst = max(r.lateness_max_s for r in rounds)
    return g.GateResult("load_generator", "INCONCLUSIVE" if late else "PASS", False, round(worst, 4), bound_s, "s",
                        "max send lateness (actual minus intended send) per round", (
                            f"{len(late)} of {len(rounds)} rounds fell behind: " + ", ".join(
                                f"{r.side} {r.round} ({r.late} late, worst {r.lateness_max_s:.3f} s)" for r in late)
                            if late else f"every request of {len(rounds)} rounds left within {bound_s:g} s of its "
                            f"intended time (worst {worst * 1000:.1f} ms); offered vs achieved rate per round in the "
                            "record"), source="params measure.max_send_lateness_s", phase="04")


def token_gates(mig: Migration, s: pd.DataFrame, rounds: np.ndarray, on: dict[str, np.ndarray],
                done: np.ndarray) -> list[g.GateResult]:
    """Token-streaming services: the p95 ratio of time to first token and of time per output
    token, target over source, with the same block bootstrap over rounds as the latency gate
    (:func:`runbook_lib.gates.latency_p95_ratio`) and its margin (``gates.latency_p95_ratio_max``)."""
    out = []
    for col, name in (("ttft_s", "ttft_p95_ratio"), ("tpot_s", "tpot_p95_ratio")):
        vals = s[col].to_numpy(dtype=float)
        ok = done & np.isfinite(vals)
        r = g.latency_p95_ratio(per_round(vals, rounds, on["source"] & ok), per_round(vals, rounds, on["target"] & ok),
                                max_ratio=mig.gates.latency_p95_ratio_max, min_samples=mig.gates.min_latency_samples,
                                phase="04")
        out.append(replace(r, name=name, method=r.method.replace("queue+init+inference latency", col[:-2].upper())))
    return out


def token_summary(res: Measured, mig: Migration) -> dict[str, dict[str, Number]]:
    """Per side, vLLM ``bench serve``'s figures (docs/reference/gates.md 3.6) over the completed
    open-loop requests: TTFT, TPOT and pooled ITL p50/p95/p99 (seconds), E2E latency from send
    (seconds), output tokens per second (output tokens over the rounds' wall time) and goodput
    (requests per second meeting ``workload.service.ttft_slo_s`` and ``tpot_slo_s`` and accepted);
    {} unless the workload is a token-streaming service."""
    svc = mig.workload.service
    if mig.workload.kind != "service" or svc is None:
        return {}
    s, itl = res.samples, res.inter_token
    no_tokens = goodput.tokens_unmeasurable(mig, s)
    no_goodput = goodput.unmeasurable(mig, s)
    out: dict[str, dict[str, Number]] = {}
    for side in ("source", "target"):
        d = s[(s["side"] == side) & (s["status"] == "COMPLETED")]
        row: dict[str, Number] = {"requests": len(d)}
        cols = {"e2e": goodput.e2e_seconds(d)}
        if svc.stream:
            cols = {"ttft": d["ttft_s"], "tpot": d["tpot_s"], "itl": pd.Series(dtype=float), **cols}
            if itl is not None and len(itl):
                cols["itl"] = itl[itl["side"] == side]["itl_s"]
        for k, col in cols.items():
            vals = col.astype(float).dropna().to_numpy()
            for q in (50, 95, 99):
                row[f"{k} p{q} (s)"] = float(np.percentile(vals, q)) if vals.size else None
        wall = float(sum((g_["done_s"].max() if "done_s" in g_ else g_["sent_s"].max())
                         for _, g_ in s[s["side"] == side].groupby("round", observed=True))) if len(d) else 0.0
        if svc.stream:
            tokens = float(d["output_tokens"].astype(float).sum()) if len(d) else 0.0
            row["output tokens/s"] = tokens / wall if wall > 0 and not no_tokens else None
        ok = goodput.good(mig, d)
        row["goodput (req/s)"] = float(ok.sum()) / wall if wall > 0 and not no_goodput else None
        row["good share"] = float(ok.mean()) if len(d) and not no_goodput else None
        if no_tokens or no_goodput:
            row["not measurable"] = no_tokens or no_goodput
        out[side] = row
    return out


def _source_statuses(res: Measured, on_source: np.ndarray, zero: pd.DataFrame) -> dict[str, int]:
    """How the source's requests ended, by status: the rounds' samples, its first (cold-start)
    job unless that was never measured, its starts from zero, and its saturation bursts (each
    burst failure as ``<STATUS> (burst)``). The baseline health gate judges these counts."""
    s, t = res.samples, res.throughput
    src_burst = t[t["side"] == "source"]
    statuses = {str(k): int(v) for k, v in s.loc[on_source, "status"].value_counts().items() if v}
    for first in res.cold_starts[res.cold_starts["side"] == "source"].get("first_status", pd.Series(dtype=str)):
        if first != "MEASUREMENT_ERROR":
            statuses[str(first)] = statuses.get(str(first), 0) + 1
    for status, n_ in zero[zero["side"] == "source"]["status"].value_counts().items():
        statuses[str(status)] = statuses.get(str(status), 0) + int(n_)
    statuses["COMPLETED"] = statuses.get("COMPLETED", 0) + int(src_burst["completed"].sum() if len(src_burst) else 0)
    for row in src_burst.get("failed_by_status", pd.Series(dtype=object)).dropna():
        for status, n in json.loads(row).items():
            statuses[f"{status} (burst)"] = statuses.get(f"{status} (burst)", 0) + int(n)
    return statuses


def per_round(values: np.ndarray, rounds: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    """``values[mask]`` split by round, in round order: ``(n,)`` values, ``(n,)`` round numbers and
    ``(n,)`` bool mask -> one array per round that has a masked value."""
    picked, at = values[mask], rounds[mask]
    return [picked[at == r] for r in np.unique(at)]


def cold_start_samples(res: Measured) -> tuple[dict[str, list[float]], str]:
    """The cold starts the ``cold_start_ratio`` gate compares, seconds per side, and what they
    span: the scale-from-zero starts (submission to answer) when both sides have completed ones,
    else each side's creation (create call to first served response), so both sides are always
    judged on the same kind of start."""
    zero = res.cold_starts_from_zero
    if zero is not None and len(zero):
        done = zero[zero["status"] == "COMPLETED"]
        by_side = {side: done[done["side"] == side]["total_s"].astype(float).tolist() for side in ("source", "target")}
        if all(by_side.values()):
            return by_side, "scale from zero: submission to answer (queue + init + inference)"
    c = res.cold_starts
    return ({side: [float(x) for x in c[c["side"] == side]["cold_start_s"].astype(float) if math.isfinite(x)]
             for side in ("source", "target")}, "launch to first served response")


def cold_start_summary(res: Measured) -> list[dict[str, Number]]:
    """p50 and p95 per side of each scale-from-zero start's total, queue, init and inference
    seconds and of the worker's initialisation parts (completed starts only; NaN where the
    endpoint does not report a part)."""
    zero = res.cold_starts_from_zero
    if zero is None or not len(zero):
        return []
    rows = []
    for side in ("source", "target"):
        d = zero[(zero["side"] == side) & (zero["status"] == "COMPLETED")]
        row: dict[str, Number] = {"side": side, "starts": int((zero["side"] == side).sum()), "completed": len(d)}
        for col in ("total_s", "queue_s", "init_s", "execution_s", *INIT_PARTS):
            vals = d[col].astype(float).dropna().to_numpy()
            for q in (50, 95):
                row[f"{col[:-2]} p{q} (s)"] = float(np.percentile(vals, q)) if vals.size else math.nan
        rows.append(row)
    return rows


def _traffic_basis(at_traffic: dict[str, cost.TrafficCost] | None) -> str:
    if at_traffic is None:
        return "price x billed time (init and idle included) + storage + egress, / accepted units"
    tc = next(iter(at_traffic.values()))
    return (f"at the declared traffic of {tc.traffic_per_s:g} requests/s: warm workers billed busy or idle, the others "
            "while busy, + storage + egress, / accepted units (cost.at_traffic)")


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def store_to_pod_summary(res: Measured) -> dict[str, StoreToPod]:
    """Store-to-pod bandwidth per side, from each pod's verified download of the set it started
    from (MB: 10**6 bytes); a side with no fetch says why."""
    out: dict[str, StoreToPod] = {}
    for side in ("source", "target"):
        rows = [r for r in res.store_to_pod if r.side == side]
        rates = [r.bytes / r.seconds / 1e6 for r in rows if r.bytes and r.seconds]
        out[side] = StoreToPod(fetches=len(rates), bytes=sum(r.bytes for r in rows if r.bytes),
                               p50_MB_per_s=float(np.median(rates)) if rates else None,
                               min_MB_per_s=float(min(rates)) if rates else None,
                               source="; ".join(sorted({r.source.split(" pod-")[0] for r in rows})))
    return out


def record_data(res: Measured, costs_: dict[str, cost.CostBreakdown], summ: pd.DataFrame,
                at_traffic: dict[str, cost.TrafficCost] | None = None, mig: Migration | None = None) -> CompareData:
    """What phase 04's record keeps (raw samples stay in the files the record hashes)."""
    by_side = {str(r["side"]): SideSummary.model_validate({str(k): v for k, v in r.items() if k != "side"})
               for r in summ.to_dict("records")}
    cold, cold_kind = cold_start_samples(res)  # the cold starts the gate judged: from zero when both sides have them
    return CompareData(
        endpoints=res.endpoints, endpoint_urls=res.endpoint_urls, endpoint_modes=res.endpoint_modes,
        clocks=tuple(res.clocks), spend=res.spend, summary=by_side,
        cold_start_median_s={s: float(np.median(v)) if v else None for s, v in cold.items()},
        cold_start_kind=cold_kind, cold_starts_from_zero=tuple(_nan_free(cold_start_summary(res))),
        usd_per_accepted_unit={s: _finite(c.usd_per_accepted_unit) for s, c in (at_traffic or costs_).items()},
        usd_per_accepted_unit_basis="declared traffic" if at_traffic else "measurement window",
        cost_at_traffic={s: c.to_dict() for s, c in (at_traffic or {}).items()},
        cost={s: c.to_dict() for s, c in costs_.items()},
        billed_s=res.billed_s, egress_bytes=res.egress_bytes, store_to_pod=store_to_pod_summary(res),
        target_workers_ready=res.target_workers_ready, extra_rounds=res.extra_rounds,
        pair_seconds=tuple(res.pair_s),  # unrounded: sequential_stop re-derives a seconds stop from them
        measurement_attempts=len([x for a in res.attempts for x in a.attempts]),
        measurements_lost=tuple({"what": a.what, "kind": a.kind, "side": a.side, "attempts": len(a.attempts),
                                 "error": a.error} for a in res.attempts if not a.ok),
        host_load_avg_1_5_15min=tuple(os.getloadavg()),  # a busy host explains a noisy A/A pair
        # the measuring process's own collections while it measured (inference; frozen_heap)
        load_generator_gc=res.load_generator_gc,
        load_generator=tuple(load_generator_rounds(res.samples, mig.measure.max_send_lateness_s))
        if mig is not None and mig.workload.serves else (),
        token_metrics=token_summary(res, mig) if mig is not None else {},
        method=mig.gates.method if mig is not None else "fixed",
        sequential=sequential.record(sequential.traces(mig, res.samples, res.throughput,
                                                       round_costs(mig, res, costs_, at_traffic)), mig)
        if mig is not None and mig.gates.method == "sequential" else None,
        forecast=savings_forecast(mig, res) if mig is not None and at_traffic else None)


def _nan_free(rows: list[dict[str, Number]]) -> list[dict[str, Number]]:
    """Rows with NaN replaced by None (JSON has no NaN)."""
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()} for r in rows]


@dataclass(frozen=True)
class Measurement(Shown):
    """Phase 04's raw measurement (:func:`measure`) and its p50/p95/p99 summary per side
    (:func:`summary`), shown before it is judged; :func:`evaluate` judges it into the record."""

    raw: Measured
    summary: pd.DataFrame
    race: RaceRecord | None = None

    def parts(self) -> list[Any]:
        out = [md("**Cold starts** (create call to first served response, seconds)"), self.raw.cold_starts]
        if self.race is not None:
            out = [md(f"**The race** ({len(self.race.entries)} candidates on {self.race.objective}; the pick "
                      f"**{self.race.pick or 'none: HOLD'}** is measured below as the phase's target)"), *out]
        zero = cold_start_summary(self.raw)
        if zero and self.raw.cold_starts_from_zero is not None:
            out += [md(f"**Cold starts from zero** ({self.raw.cold_starts_from_zero.shape[0]} starts: submission to "
                       "answer, split into queue, init and inference; the worker's init into process start, imports, "
                       "device init and weight load; p50 and p95, seconds)"), table(zero)]
        out += [md("**Latency and throughput per side** (seconds from intended arrival)"), self.summary,
                md("**Store-to-pod bandwidth** (each pod's verified download of the set it starts from; MB = 10^6 "
                   "bytes)"), table({s: v.model_dump() for s, v in store_to_pod_summary(self.raw).items()}).T]
        if self.raw.clocks:
            out += [md("**Clocks** (each setting, and the requests it ended per side)"),
                    table([{**c.model_dump(exclude={"ended"}), **{f"ended {s}": n for s, n in c.ended.items()}}
                           for c in self.raw.clocks])]
        return out
