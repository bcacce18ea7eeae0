"""Phase 04, compare production characteristics: cold start, latency, throughput, errors, cost.

Inference: a source and a target endpoint are created (and kept for phase 05). Cold start is
timed from the create call to the first served response. Rounds alternate source, target,
target, source (RMIT interleaving); each round sends an open-loop Poisson schedule (latency
from intended arrival) and then a saturation burst (throughput). Every response is checked
against the golden output of its input; an *accepted unit* is a request that completed within
the SLO and passed parity.

Training: each round is a pod running the job from the frozen checkpoint; samples are step
times, throughput is samples per second, and an accepted unit is a completed step.

Every measurement (a cold start, a round's open-loop schedule, its saturation burst, a training
round) is taken through :func:`runbook_lib.measure.with_retries`: when the measuring machinery
fails it is retried (``measure.error_retries``, ``measure.error_retry_interval_s``), every attempt
is kept in ``04/measurement_attempts.csv``, and a measurement lost after its retries makes the
gates it feeds INCONCLUSIVE (:data:`AFFECTS`), never FAIL or PASS.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from runbook_lib import cost, report
from runbook_lib import gates as g
from runbook_lib.measure import (
    SAMPLE_COLUMNS,
    Attempted,
    JobClient,
    Request,
    poisson_schedule,
    run_open_loop,
    run_saturation,
    with_retries,
)
from runbook_lib.phases import PhaseContext, PhaseResult, md, table
from runbook_lib.workload import make_workload

ROUND_PATTERN = ("source", "target", "target", "source")
THROUGHPUT_COLUMNS = ["side", "round", "requests", "completed", "failed", "elapsed_s", "throughput_units_per_s"]

AFFECTS: dict[str, tuple[str, ...]] = {
    "cold_start": ("cold_start_ratio",),
    "warmup": (),
    "open_loop": ("latency_p95_ratio", "latency_slo", "noise_floor", "latency_shift", "cost_per_accepted_unit"),
    "saturation": ("throughput_ratio",),
    "health": ("capacity",),
    "training_round": ("latency_p95_ratio", "noise_floor", "latency_shift", "throughput_ratio", "cold_start_ratio",
                       "cost_per_accepted_unit"),
}
"""Gates fed by each kind of measurement. A measurement lost on the target side (every attempt
failed) also makes ``error_rate`` INCONCLUSIVE, except a lost warm-up (discarded anyway)."""


OPERATOR_SETTINGS: dict[str, str] = {
    "latency_p95_ratio": "gates.latency_p95_ratio_max",
    "noise_floor": "gates.latency_p95_ratio_max",  # its margin is half the latency margin
    "throughput_ratio": "gates.throughput_ratio_min",
    "cold_start_ratio": "gates.cold_start_ratio_max",
    "cost_per_accepted_unit": "gates.required_saving",
    "latency_slo": "workload.requirements.max_request_s",
}
"""Performance and cost gates, and the params field whose explicit setting makes each blocking
(docs/reference/gates.md 5.1); without it they are scored. ``spend_limit`` is blocking exactly when
``gates.spend_limit_usd`` is set; parity and reliability gates are always blocking."""


def operator_set(mig: Any, setting: str) -> bool:
    """Whether the params file set ``setting`` (a dotted field path) explicitly, as pydantic's
    ``model_fields_set`` records it; a default is not a choice."""
    *parents, name = setting.split(".")
    model = mig
    for part in parents:
        if part not in model.model_fields_set:
            return False
        model = getattr(model, part)
    return name in model.model_fields_set


def measured_with_retries(ctx: PhaseContext, fn: Callable[[int], Any], log: list[Attempted[Any]], *, what: str, kind: str,
           side: str, sleep: Callable[[float], None]) -> Attempted[Any]:
    """Take one measurement through :func:`runbook_lib.measure.with_retries` with this run's
    settings (``measure.error_retries``, ``measure.error_retry_interval_s``); the attempt record
    is appended to ``log`` (phase 04 writes it to ``04/measurement_attempts.csv``)."""
    m = ctx.mig.measure
    a = with_retries(fn, what=what, kind=kind, side=side, retries=m.error_retries, interval_s=m.error_retry_interval_s,
                     sleep=sleep)
    log.append(a)
    return a


def lost_measurements(attempts: list[Attempted[Any]]) -> dict[str, list[str]]:
    """Gate name -> one line per measurement feeding it that failed every attempt."""
    out: dict[str, list[str]] = {}
    for a in attempts:
        if a.ok:
            continue
        line = f"{a.what}: {len(a.attempts)} attempts failed, last {a.error}"
        names = AFFECTS[a.kind] + (("error_rate",) if a.side == "target" and a.kind != "warmup" else ())
        for name in names:
            out.setdefault(name, []).append(line)
    return out


def round_sides(rounds: int) -> list[str]:
    """Interleaved sides: S, T, T, S, S, T, T, S, ... (``rounds`` entries)."""
    return [ROUND_PATTERN[i % 4] for i in range(rounds)]


def _short(ctx: PhaseContext, counts: dict[str, int]) -> bool:
    need = ctx.mig.gates.min_latency_samples
    if ctx.mig.workload.kind == "inference":  # the absolute SLO bound needs its own minimum on the target
        need_t = max(need, g.min_slo_samples())
        return counts.get("source", 0) < need or counts.get("target", 0) < need_t
    return min(counts.get("source", 0), counts.get("target", 0)) < need


def schedule_rounds(ctx: PhaseContext, run_round: Any) -> int:
    """Run the interleaved rounds, then extra ones while a side is short of samples and the
    extension budget (``measure.max_extra_rounds``) lasts. ``run_round(r, side)`` returns the
    number of completed samples it added. Returns the number of extra rounds run."""
    counts: dict[str, int] = {}
    sides = round_sides(ctx.mig.measure.rounds)
    for r, side in enumerate(sides):
        counts[side] = counts.get(side, 0) + run_round(r, side)
    extra = 0
    while _short(ctx, counts) and extra < ctx.mig.measure.max_extra_rounds:
        r = len(sides) + extra
        side = ROUND_PATTERN[r % 4]
        counts[side] = counts.get(side, 0) + run_round(r, side)
        extra += 1
    return extra


def measure_inference(ctx: PhaseContext, *, sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Create both endpoints, measure cold starts and interleaved rounds; keep the endpoints.

    Args:
        sleep: waits between retries of a failed measurement (injected in tests).

    Returns:
        ``{"endpoints", "cold_starts", "samples" (DataFrame), "throughput" (DataFrame),
        "billed_s", "egress_bytes", "attempts" (one :class:`Attempted` per measurement)}``.
    """
    m = ctx.mig.measure
    golden = np.load(ctx.run_dir / "01/golden_outputs.npy").astype(np.float64)
    wl = make_workload(ctx.mig.workload, ctx.mig.source)
    endpoints: dict[str, Any] = {}
    clients: dict[str, JobClient] = {}
    cold: list[dict[str, Any]] = []
    ready: dict[str, float] = {}
    log: list[Attempted[Any]] = []
    for side in ("source", "target"):
        t0 = time.perf_counter()
        ep = ctx.create_endpoint(side, f"endpoint-{side}")
        client = JobClient(ep.url, timeout_s=m.request_timeout_s * 4)
        payload0 = wl.request_inputs(1, seed=0)[0][1]
        def first_job(_k: int, c: JobClient = client, payload: Any = payload0) -> dict[str, Any]:
            return c.runsync(payload)

        def worker_report(_k: int, c: JobClient = client) -> dict[str, Any]:
            return c.health()

        first = measured_with_retries(ctx, first_job, log, what=f"cold start {side}", kind="cold_start", side=side, sleep=sleep)
        ready[side] = time.perf_counter()
        # Create to first served response; the waits between retries are not the target's time.
        cold_s = ready[side] - t0 - first.waited_s if first.ok else math.nan
        health = measured_with_retries(ctx, worker_report, log, what=f"cold start {side} worker report", kind="cold_start",
                        side=side, sleep=sleep)
        cold.append({"side": side, "endpoint": ep.id, "cold_start_s": cold_s,
                     "first_status": first.value["status"] if first.value is not None else "MEASUREMENT_ERROR",
                     "attempts": len(first.attempts),
                     "worker_init_s": [c["init_s"] for c in health.value["cold_starts"]]
                     if health.value is not None else []})
        endpoints[side], clients[side] = ep, client
    rows: list[dict[str, Any]] = []
    thr: list[dict[str, Any]] = []
    warm_rows: list[dict[str, Any]] = []
    for side in ("source", "target"):  # warm-up, discarded from the gates and recorded
        def warm(_k: int, side: str = side) -> list[dict[str, Any]]:
            out = []
            for i, (_, payload) in enumerate(wl.request_inputs(m.warmup_requests, seed=1)):
                t0 = time.perf_counter()
                job = clients[side].runsync(payload)
                out.append({"side": side, "request": i, "seconds": time.perf_counter() - t0, "status": job["status"]})
            return out

        w = measured_with_retries(ctx, warm, log, what=f"warm-up {side}", kind="warmup", side=side, sleep=sleep)
        warm_rows.extend(w.value or [])

    def one_round(r: int, side: str) -> int:
        picks = wl.request_inputs(m.requests_per_round, seed=1000 + r // 2)
        sched = poisson_schedule(len(picks), m.arrival_rate_per_s, seed=2000 + r // 2)
        reqs = [Request(i, float(sched[i]), payload, idx) for i, (idx, payload) in enumerate(picks)]
        got = measured_with_retries(ctx, lambda _k: run_open_loop(clients[side], reqs, side=side, round_id=r), log,
                     what=f"round {r} {side} open-loop", kind="open_loop", side=side, sleep=sleep)
        rows.extend(got.value or [])
        burst = wl.request_inputs(m.throughput_requests, seed=3000 + r // 2)
        sat = measured_with_retries(ctx, lambda _k: run_saturation(clients[side], [p for _, p in burst]), log,
                     what=f"round {r} {side} saturation", kind="saturation", side=side, sleep=sleep)
        if sat.value is not None:
            thr.append({"side": side, "round": r, **sat.value})
        return sum(1 for x in got.value or [] if x["status"] == "COMPLETED")

    extra_rounds = schedule_rounds(ctx, one_round)
    end = time.perf_counter()
    health_end = measured_with_retries(ctx, lambda _k: clients["target"].health()["workers"], log, what="target workers after rounds",
                        kind="health", side="target", sleep=sleep)
    workers_ready = (int(health_end.value["idle"] + health_end.value["running"]) if health_end.value is not None
                     else 0)
    egress: dict[str, float] = {"source": 0.0, "target": 0.0}
    for row in rows:
        row["accepted"] = ctx.accepted(golden, row)
        egress[row["side"]] += len(json.dumps(row.get("output"))) if row.get("output") is not None else 0
        row.pop("output", None)
    samples = pd.DataFrame(rows, columns=[*SAMPLE_COLUMNS, "accepted"]) if not rows else pd.DataFrame(rows)
    throughput = pd.DataFrame(thr, columns=THROUGHPUT_COLUMNS) if not thr else pd.DataFrame(thr)
    for c in clients.values():
        c.close()
    # Both sides are billed for their own cold start plus the same measurement window (from when
    # both were serving to the end), so creating one side first does not bill it for the other's
    # start-up.
    window = end - max(ready.values())
    billed = {c["side"]: c["cold_start_s"] + window for c in cold}
    return {"endpoints": {s: e.id for s, e in endpoints.items()}, "endpoint_urls": {s: e.url for s, e in endpoints.items()},
            "cold_starts": cold, "samples": samples, "throughput": throughput, "warmup": warm_rows,
            "billed_s": billed, "egress_bytes": egress, "extra_rounds": extra_rounds,
            "target_workers_ready": workers_ready, "attempts": log}


def measure_training(ctx: PhaseContext, *, sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Interleaved rounds of the training job on pods; step times are the latency samples. A
    round whose pod cannot be launched, waited on or read back is retried with a new pod (its
    own store prefix ``bench/<round>-retry<k>``); a pod whose job exits non-zero is not retried
    (that is the workload failing, not the measuring)."""
    frozen = ctx.records["01"].data["freeze"]["frozen"]["prefix"]
    rows, thr, cold, warm_rows = [], [], [], []
    log: list[Attempted[Any]] = []
    warmup = max(1, ctx.mig.measure.warmup_requests)
    billed = {"source": 0.0, "target": 0.0}

    def one_round(r: int, side: str) -> int:
        def attempt(k: int) -> tuple[Any, Any, dict[str, Any]]:
            tag = str(r) if k == 0 else f"{r}-retry{k}"
            pod = ctx.launched(ctx.launch_agent(side, f"bench-{tag}", "bench", prefix=ctx.store_prefix("bench", tag),
                                                frozen_prefix=frozen))
            try:
                done = ctx.wait_pod(side, pod)
            finally:
                ctx.destroy(side, pod.id)
            files = ctx.fetch(ctx.store_prefix("bench", tag, "result"), f"04/bench/{tag}")
            return pod, done, files

        got = measured_with_retries(ctx, attempt, log, what=f"round {r} {side} training pod", kind="training_round", side=side,
                     sleep=sleep)
        if got.value is None:
            return 0
        pod, done, files = got.value
        res = json.loads(files["result.json"].read_text())
        att = res["attempts"][0]
        billed[side] += (done.ended_at or time.time()) - done.created_at
        cold.append({"side": side, "round": r, "pod": pod.id,
                     "cold_start_s": (att["first_step_done_epoch"] or math.nan) - done.created_at})
        bs = ctx.profile(side).batch_size
        for i, (t, met) in enumerate(zip(att["step_times_s"], att["metrics"], strict=True)):
            if i < warmup:  # first steps pay allocation and cache warm-up: recorded, not judged
                warm_rows.append({"side": side, "round": r, "step": i, "seconds": t})
                continue
            rows.append({"side": side, "round": r, "request": i, "total_s": t, "queue_s": 0.0, "init_s": 0.0,
                         "execution_s": t, "status": "COMPLETED" if math.isfinite(met["loss"]) else "FAILED",
                         "loss": met["loss"], "accepted": math.isfinite(met["loss"])})
        timed = att["step_times_s"][warmup:]
        total = sum(timed)
        thr.append({"side": side, "round": r, "requests": float(len(timed)), "completed": float(len(timed)), "failed": 0.0,
                    "elapsed_s": total, "throughput_units_per_s": len(timed) * bs / total if total > 0 else 0.0})
        return len(timed)

    extra_rounds = schedule_rounds(ctx, one_round)
    samples = pd.DataFrame(rows) if rows else pd.DataFrame(columns=[*SAMPLE_COLUMNS, "loss", "accepted"])
    throughput = pd.DataFrame(thr) if thr else pd.DataFrame(columns=THROUGHPUT_COLUMNS)
    return {"endpoints": {}, "cold_starts": cold, "samples": samples, "throughput": throughput,
            "billed_s": billed, "egress_bytes": {"source": 0.0, "target": 0.0}, "warmup": warm_rows,
            "extra_rounds": extra_rounds, "attempts": log}


def measure(ctx: PhaseContext, *, sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Run the measurement protocol for this workload kind and save the raw samples and every
    measurement attempt (``04/measurement_attempts.csv``)."""
    kind = measure_inference if ctx.mig.workload.kind == "inference" else measure_training
    res = kind(ctx, sleep=sleep)
    pd.DataFrame([row for a in res["attempts"] for row in a.to_rows()],
                 columns=["what", "kind", "side", "attempt", "ok", "seconds", "error"]
                 ).to_csv(ctx.path("04/measurement_attempts.csv"), index=False)
    res["samples"].to_csv(ctx.path("04/samples.csv"), index=False)
    res["throughput"].to_csv(ctx.path("04/throughput.csv"), index=False)
    pd.DataFrame(res["cold_starts"]).to_csv(ctx.path("04/cold_starts.csv"), index=False)
    pd.DataFrame(res["warmup"]).to_csv(ctx.path("04/warmup_discarded.csv"), index=False)
    return res


def costs(ctx: PhaseContext, res: dict[str, Any]) -> dict[str, cost.CostBreakdown]:
    """Cost per accepted unit per side over the measurement window (billed from launch)."""
    out = {}
    for side in ("source", "target"):
        prof = ctx.profile(side)
        s = res["samples"]
        accepted = int(s[(s["side"] == side) & (s["accepted"])].shape[0]) if len(s) else 0
        instances = prof.workers if ctx.mig.workload.kind == "inference" else 1
        out[side] = cost.breakdown(price_usd_per_hour=prof.price_usd_per_hour, billed_s=res["billed_s"][side],
                                   instances=instances, accepted_units=accepted,
                                   storage_gb=ctx.mig.workload.requirements.disk_gb,
                                   storage_usd_per_gb_month=prof.storage_usd_per_gb_month,
                                   egress_bytes=res["egress_bytes"][side], egress_usd_per_gb=prof.egress_usd_per_gb)
    ctx.write_json("04/cost.json", {k: v.to_dict() for k, v in out.items()})
    return out


def summary(res: dict[str, Any]) -> pd.DataFrame:
    """p50/p95/p99 of total, queue, init and execution time per side, seconds."""
    s = res["samples"]
    rows = []
    for side in ("source", "target"):
        d = s[s["side"] == side]
        row: dict[str, Any] = {"side": side, "requests": len(d), "accepted": int(d["accepted"].sum()) if len(d) else 0,
                               "failed": int((d["status"] != "COMPLETED").sum()) if len(d) else 0}
        for col in ("total_s", "queue_s", "init_s", "execution_s"):
            vals = d[col].astype(float).dropna().to_numpy() if len(d) else np.array([])
            for q in (50, 95, 99):
                row[f"{col[:-2]} p{q} (s)"] = float(np.percentile(vals, q)) if vals.size else math.nan
        t = res["throughput"]
        row["throughput mean (units/s)"] = float(t[t["side"] == side]["throughput_units_per_s"].mean())
        rows.append(row)
    return pd.DataFrame(rows)


def compare_gates(ctx: PhaseContext, res: dict[str, Any], costs_: dict[str, cost.CostBreakdown]) -> list[g.GateResult]:
    """Latency p95 ratio, throughput ratio, cold start ratio, target error rate, cost per unit."""
    s, t, gc = res["samples"], res["throughput"], ctx.mig.gates
    lat = {side: s[(s["side"] == side) & (s["status"] == "COMPLETED")]["total_s"].astype(float).to_numpy()
           for side in ("source", "target")}
    thr = {side: t[t["side"] == side]["throughput_units_per_s"].astype(float).tolist() for side in ("source", "target")}
    cold = {side: [c["cold_start_s"] for c in res["cold_starts"] if c["side"] == side and math.isfinite(c["cold_start_s"])]
            for side in ("source", "target")}
    tgt = s[s["side"] == "target"]
    burst = t[t["side"] == "target"]
    failures = int((tgt["status"] != "COMPLETED").sum()) + int(burst.get("failed", pd.Series(dtype=float)).sum())
    total = len(tgt) + int(burst["requests"].sum()) if ctx.mig.workload.kind == "inference" else len(tgt)
    done = s[s["status"] == "COMPLETED"]
    lat_rounds = {side: [d["total_s"].astype(float).to_numpy() for _, d in done[done["side"] == side].groupby("round")]
                  for side in ("source", "target")}  # per round: the block bootstrap resamples rounds
    src_rounds = lat_rounds["source"]
    extra: list[g.GateResult] = []
    if ctx.mig.workload.kind == "inference":
        extra.append(g.capacity(res["target_workers_ready"], ctx.mig.target.workers, phase="04"))
        extra.append(g.latency_slo(tgt[tgt["status"] == "COMPLETED"]["total_s"].astype(float).to_numpy(),
                                   slo_s=ctx.mig.workload.requirements.max_request_s, phase="04"))
    if len(src_rounds) >= 2:
        aa = g.noise_floor(src_rounds[0], src_rounds[-1], max_ratio=gc.latency_p95_ratio_max,
                           q=95 if ctx.mig.workload.kind == "inference" else 50, phase="04")
        if ctx.mig.workload.kind == "training":
            # For training the A/A result is scored, not blocking: sub-millisecond steps of the demo
            # MLP drift with any host activity between pods. Training steps of hundreds of ms would
            # support a blocking check; no params setting asks for one yet.
            aa = g.from_dict({**aa.to_dict(), "blocking": False})
        extra.append(aa)
    else:
        extra.append(g.noise_floor(np.array([]), np.array([]), max_ratio=gc.latency_p95_ratio_max, phase="04"))
    extra.append(g.latency_shift(lat["source"], lat["target"], max_ratio=gc.latency_p95_ratio_max, phase="04"))
    extra.append(g.spend_limit(sum(c.total_usd for c in costs_.values()), limit_usd=gc.spend_limit_usd, phase="04"))
    acc_rounds = {side: [d["accepted"].astype(float).to_numpy() for _, d in s[s["side"] == side].groupby("round")]
                  for side in ("source", "target")}
    results = [
        g.latency_p95_ratio(lat_rounds["source"], lat_rounds["target"], max_ratio=gc.latency_p95_ratio_max,
                            min_samples=gc.min_latency_samples, phase="04"),
        g.throughput_ratio(thr["source"], thr["target"], min_ratio=gc.throughput_ratio_min, phase="04"),
        g.cold_start_ratio(cold["source"], cold["target"], max_ratio=gc.cold_start_ratio_max, phase="04"),
        g.error_rate(failures, total, max_rate=gc.error_rate_max, phase="04",
                     unit="requests" if ctx.mig.workload.kind == "inference" else "training steps"),
        g.cost_per_unit(_finite(costs_["source"].usd_per_accepted_unit), _finite(costs_["target"].usd_per_accepted_unit),
                        required_saving=gc.required_saving, accepted_rounds=(acc_rounds["source"], acc_rounds["target"]),
                        phase="04"),
        *extra,
    ]
    results = [g.scored_unless_set(r, setting=OPERATOR_SETTINGS[r.name], operator_set=operator_set(ctx.mig,
               OPERATOR_SETTINGS[r.name])) if r.name in OPERATOR_SETTINGS else r for r in results]
    lost = lost_measurements(res.get("attempts", []))
    return ctx.add_gates(*(g.measurement_lost(r, lost[r.name]) if r.name in lost else r for r in results))


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def record_data(res: dict[str, Any], costs_: dict[str, cost.CostBreakdown], summ: pd.DataFrame) -> dict[str, Any]:
    """What phase 04's record keeps (raw samples stay in the CSV files the record hashes)."""
    by_side = {r["side"]: {k: v for k, v in r.items() if k != "side"} for r in summ.to_dict("records")}
    cold = pd.DataFrame(res["cold_starts"])
    return {
        "endpoints": res["endpoints"],
        "endpoint_urls": res.get("endpoint_urls", {}),
        "summary": by_side,
        "cold_start_median_s": {s: float(cold[cold["side"] == s]["cold_start_s"].median()) for s in ("source", "target")},
        "usd_per_accepted_unit": {s: _finite(c.usd_per_accepted_unit) for s, c in costs_.items()},
        "cost": {s: c.to_dict() for s, c in costs_.items()},
        "billed_s": res["billed_s"],
        "extra_rounds": res.get("extra_rounds", 0),
        "measurement_attempts": len([x for a in res.get("attempts", []) for x in a.attempts]),
        "measurements_lost": [{"what": a.what, "kind": a.kind, "side": a.side, "attempts": len(a.attempts),
                               "error": a.error} for a in res.get("attempts", []) if not a.ok],
        "host_load_avg_1_5_15min": list(os.getloadavg()),  # a busy host explains a noisy A/A pair
    }


@dataclass(frozen=True)
class Measurement(PhaseResult):
    """Phase 04's raw measurement (:func:`measure`) and its p50/p95/p99 summary per side
    (:func:`summary`); judged by :func:`evaluate`. Not a record on its own."""

    raw: dict[str, Any]
    summary: pd.DataFrame

    def record(self) -> dict[str, Any]:
        raise NotImplementedError("a measurement is recorded through evaluate(): pass it there")

    def parts(self) -> list[Any]:
        return [md("**Cold starts** (create call to first served response, seconds)"), table(self.raw["cold_starts"]),
                md("**Latency and throughput per side** (seconds from intended arrival)"), self.summary]


@dataclass(frozen=True)
class CompareResult(PhaseResult):
    """Phase 04's judged evidence: cost per accepted unit per side, the comparison plots (PNG
    files in the run; shown from the files, whatever the kernel's plotting backend) and the gates
    (kept in the phase's context)."""

    measurement: Measurement
    costs: dict[str, cost.CostBreakdown]
    plots: tuple[Path, ...]

    def record(self) -> dict[str, Any]:
        return record_data(self.measurement.raw, self.costs, self.measurement.summary)

    def parts(self) -> list[Any]:
        from IPython.display import Image

        return [md("**Cost per accepted unit** (USD)"), table({s: c.to_dict() for s, c in self.costs.items()}),
                *(Image(filename=str(p)) for p in self.plots)]


def measure_sides(ctx: PhaseContext) -> Measurement:
    """Phase 04, first step: run the measurement protocol (:func:`measure`) and summarise it."""
    res = measure(ctx)
    return Measurement(raw=res, summary=summary(res))


def evaluate(ctx: PhaseContext, measured: Measurement) -> CompareResult:
    """Phase 04, second step: costs (``04/cost.json``), the latency CDF, throughput and cost plots
    (``04/*.png``), and the comparison gates."""
    import matplotlib.pyplot as plt

    res = measured.raw
    unit = "request" if ctx.mig.workload.kind == "inference" else "training step"
    costs_ = costs(ctx, res)
    figs = [report.latency_cdf(res["samples"], ctx.path("04/latency_cdf.png"), unit_label=unit),
            report.throughput_plot(res["throughput"], ctx.path("04/throughput.png"),
                                   unit="requests/s" if unit == "request" else "samples/s"),
            report.cost_plot(costs_, ctx.path("04/cost.png"), unit=unit)]
    for fig in figs:  # shown from the saved files, so an inline backend does not show them twice
        plt.close(fig)
    compare_gates(ctx, res, costs_)
    return CompareResult(measurement=measured, costs=costs_,
                         plots=tuple(ctx.run_dir / rel for rel in ("04/latency_cdf.png", "04/throughput.png",
                                                                   "04/cost.png")))
