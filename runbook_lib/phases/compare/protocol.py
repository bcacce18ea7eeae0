"""Phase 04's measurement protocols: interleaved rounds (S, T, T, S) of an open-loop schedule
and a saturation burst on two endpoints (inference), or of training pods (training); every
measurement taken through retries that are kept as evidence."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from runbook_lib import gates as g
from runbook_lib.errors import ProviderTimeout
from runbook_lib.evidence.records import ClockRow, SpendRecord, StoreFetch
from runbook_lib.measure import cost
from runbook_lib.measure.timing import (
    INIT_PARTS,
    Attempted,
    Request,
    ServingClient,
    frozen_heap,
    job_clocks,
    job_timings,
    poisson_schedule,
    run_open_loop,
    run_saturation,
    served_status,
    with_retries,
)
from runbook_lib.params import Measure, Migration
from runbook_lib.phases import PhaseContext
from runbook_lib.phases import service_pods as pods
from runbook_lib.phases.compare import durability, sequential
from runbook_lib.phases.compare.raw import (
    ALLREDUCE_COLUMNS,
    ALLREDUCE_FILE,
    ATTEMPTS_FILE,
    COLD_STARTS_FILE,
    FROM_ZERO_FILE,
    INTER_TOKEN_FILE,
    SAMPLES_FILE,
    THROUGHPUT_COLUMNS,
    THROUGHPUT_FILE,
    WARMUP_FILE,
    Measured,
    SampleSink,
    TableRow,
    load_tables,
    write_tables,
)
from runbook_lib.phases.serving import LIVE_MODE, Served, Serving, creates, serving_for, source_gap_s
from runbook_lib.providers.base import Endpoint, Plan, Pod
from runbook_lib.service.pacing import spaced

ROUND_PATTERN = ("source", "target", "target", "source")


AFFECTS: dict[str, tuple[str, ...]] = {
    "cold_start": ("cold_start_ratio",),
    "warmup": (),
    "open_loop": ("latency_p95_ratio", "latency_slo", "noise_floor", "latency_shift", "cost_per_accepted_unit"),
    "saturation": ("throughput_ratio",),
    "health": ("capacity",),
    "training_round": ("latency_p95_ratio", "noise_floor", "latency_shift", "throughput_ratio", "cold_start_ratio",
                       "cost_per_accepted_unit"),
}
"""Gates fed by each kind of measurement. A measurement of requests or steps lost on the target
side (every attempt failed) also makes ``error_rate`` INCONCLUSIVE, and on the source side
``baseline_health``; a lost warm-up (discarded anyway) or worker report (it carries no requests)
does not."""
SENDS_REQUESTS = ("cold_start", "open_loop", "saturation", "training_round")


def clocks_record(m: Measure, res: Measured) -> list[ClockRow]:
    """Phase 04's evidence rows of the three clocks: each one's setting and, per side, how many
    requests it ended (latency rounds, bursts and the cold-start job)."""
    counts: dict[str, dict[str, int]] = {"source": {}, "target": {}}
    s, t, c = res.samples, res.throughput, res.cold_starts
    for side in counts:
        for status, n in (s[s["side"] == side]["status"].value_counts().items() if len(s) else []):
            counts[side][str(status)] = counts[side].get(str(status), 0) + int(n)
        for row in t[t["side"] == side].get("failed_by_status", []):
            for status, n in json.loads(row if isinstance(row, str) and row else "{}").items():
                counts[side][status] = counts[side].get(status, 0) + int(n)
        for first in (c[c["side"] == side].get("first_status", pd.Series(dtype=str)) if len(c) else []):
            if isinstance(first, str) and first:
                counts[side][first] = counts[side].get(first, 0) + 1
    rows = [("execution timeout", m.request_timeout_s, "the endpoint's, set when it was created", "TIMED_OUT"),
            ("job TTL", m.job_ttl_s, "each job's policy.ttl" if m.job_ttl_s is not None
             else "the endpoint's own (Runpod's default 24 h)", "EXPIRED"),
            ("client timeout", m.client_timeout_s, "the runbook's job client: it cancels and keeps the job id",
             "CLIENT_TIMEOUT")]
    return [ClockRow(clock=name, setting_s=setting, set_by=by, ends_as=status,
                     ended={side: counts[side].get(status, 0) for side in counts}) for name, setting, by, status in rows]


COLD_IDLE_TIMEOUT_S = 1.0
"""Idle timeout of the cold-start endpoints, seconds: a worker stops this long after its job, so
the next job starts from zero."""
SCALE_TO_ZERO_WAIT_S = 60.0
"""How long a cold-start endpoint may take to reach zero workers before that start is a lost
measurement, seconds."""
ITL_COLUMNS = ["side", "round", "request", "itl_s"]
"""Columns of ``04/inter_token_latency.csv`` (token-streaming services): one inter-token gap per row."""
COLD_COLUMNS = ["side", "start", "status", "total_s", "queue_s", "init_s", "execution_s", *INIT_PARTS]
"""Columns of ``04/cold_starts_from_zero.csv``: one scale-from-zero start per row, seconds."""


def wait_for_zero(workers_now: Callable[[], Mapping[str, int]], *, timeout_s: float = SCALE_TO_ZERO_WAIT_S,
                  sleep: Callable[[float], None] = time.sleep) -> None:
    """Wait until ``workers_now()`` (an endpoint's worker counts by state, as its job API's
    ``/health`` reports them) has no worker idle, running or initialising.

    Raises:
        ProviderTimeout: workers still up after ``timeout_s`` seconds (named, with their states).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        workers = workers_now()
        if workers.get("idle", 0) + workers.get("running", 0) + workers.get("initializing", 0) == 0:
            return
        if time.monotonic() > deadline:
            raise ProviderTimeout(f"the cold-start endpoint still had workers {workers} after {timeout_s:g} s; it "
                                  "did not scale to zero")
        sleep(0.1)


def measure_cold_starts(ctx: PhaseContext, payload: Any, log: list[Attempted[Any]], meter: cost.SpendMeter,
                        stops: list[cost.SpendStop], *, expected_s: dict[str, float] | None = None,
                        sleep: Callable[[float], None] = time.sleep) -> list[TableRow]:
    """``measure.cold_starts`` scale-from-zero starts per side when both sides scale to zero
    (:func:`cold_start_sides`), alternating sides (S, T, T, S, ...), on a dedicated endpoint per
    side (:func:`cold_start_plan`: one worker, none kept running), destroyed afterwards. Each start
    waits for zero workers, then times one job from submission to answer, split as the endpoint
    reports it (queue, init, inference) and, where its health report carries them, the worker's
    initialisation parts. A team's service reports no init of its own: its queue (Runpod's
    ``delayTime``; on Vast.ai the wait for ``/route/`` to name a worker) holds the worker's start,
    or, on a Runpod load-balancing endpoint, which reports no split, the request's whole time does;
    init is NaN. ``meter`` guards the spend limit: the endpoints are created only if
    every start, expected to take as long as that side's creation cold start (``expected_s``,
    seconds; a request timeout where unknown) plus the idle timeout, fits, and each start only if
    it still fits (refusals appended to ``stops``).

    Returns:
        One :data:`COLD_COLUMNS` row per start taken (a start lost after its retries is in
        ``log``, not here).
    """
    n = ctx.mig.measure.cold_starts
    sides = cold_start_sides(ctx)
    if not sides:
        return []
    rows: list[TableRow] = []
    endpoints: dict[str, Endpoint] = {}
    clients: dict[str, ServingClient] = {}
    m = ctx.mig.measure
    rates = {side: cost.usd_per_hour(price_usd_per_hour=ctx.resources.profile(side).price_usd_per_hour, instances=1)
             for side in sides}
    each = {side: (expected_s or {}).get(side, math.nan) for side in sides}
    each = {side: (v if math.isfinite(v) else m.request_timeout_s) + COLD_IDLE_TIMEOUT_S for side, v in each.items()}
    stop = meter.check("cold starts from zero", n * sum(each.values()), launches_usd_per_hour=sum(rates.values()))
    if stop is not None:
        stops.append(stop)
        return []
    took: list[float] = []
    counts: dict[str, Callable[[], Mapping[str, int]]] = {}
    try:
        for side in sides:
            ep = endpoints[side] = ctx.resources.apply_plan(side, cold_start_plan(ctx, side))
            meter.start(f"coldstart-{side}", rates[side])
            clients[side], counts[side] = _cold_client(ctx, side, ep)
        for k in range(n):
            for side in (("source", "target") if k % 2 == 0 else ("target", "source")):
                stop = meter.check(f"cold start {k} {side}", max(took, default=each[side]))
                if stop is not None:
                    stops.append(stop)
                    continue

                def start(_a: int, side: str = side, k: int = k) -> TableRow:
                    c = clients[side]
                    wait_for_zero(counts[side], sleep=sleep)
                    t0 = time.perf_counter()
                    job = c.runsync(payload)
                    total = time.perf_counter() - t0
                    service = ctx.mig.workload.kind == "service"  # its health report has no init parts
                    reported = ([{}] if service else c.health().get("cold_starts")) or [{}]
                    return {"side": side, "start": k, "status": served_status(job), "total_s": total,
                            **job_timings(job), **{p: float(reported[-1].get(p, math.nan)) for p in INIT_PARTS}}

                got = measured_with_retries(ctx, start, log, what=f"cold start {k} {side} from zero", kind="cold_start",
                                            side=side, sleep=sleep)
                if got.value is not None:
                    rows.append(got.value)
                    took.append(got.value["total_s"] + COLD_IDLE_TIMEOUT_S)
    finally:
        for c in clients.values():
            c.close()
        for side, ep in endpoints.items():
            ctx.resources.destroy(side, ep.id)
            if f"coldstart-{side}" in meter.rates:
                meter.stop(f"coldstart-{side}")
    return rows


def spend_meter(ctx: PhaseContext) -> cost.SpendMeter:
    """Phase 04's meter against ``gates.spend_limit_usd`` (:class:`runbook_lib.measure.cost.SpendMeter`)."""
    return cost.SpendMeter(ctx.mig.gates.spend_limit_usd, clock=time.perf_counter)


def spend_record(meter: cost.SpendMeter, stops: list[cost.SpendStop]) -> SpendRecord:
    """Evidence of the spend limit as enforced: the limit, what was spent when measuring ended
    and each step refused because it could have crossed the limit."""
    return SpendRecord(limit_usd=meter.limit_usd, accrued_usd=meter.accrued_usd(), stops=tuple(stops))


def measured_with_retries(ctx: PhaseContext, fn: Callable[[int], Any], log: list[Attempted[Any]], *, what: str, kind: str,
           side: str, sleep: Callable[[float], None]) -> Attempted[Any]:
    """Take one measurement through :func:`runbook_lib.measure.timing.with_retries` with this run's
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
        sent = a.kind in SENDS_REQUESTS
        names = AFFECTS[a.kind] + (("error_rate",) if a.side == "target" and sent else ()) \
            + (("baseline_health",) if a.side == "source" and sent else ())
        for name in names:
            out.setdefault(name, []).append(line)
    return out


def cold_start_sides(ctx: PhaseContext) -> list[str]:
    """The sides whose cold starts from zero are measured: both, when ``measure.cold_starts`` is
    above 0 and both sides scale to zero: queue endpoints for an inference workload, Serverless
    endpoints (Runpod queue or load-balancing, Vast.ai) for a service (the runbook's own
    load-balancing worker, a pod or a live service does not scale to zero, so there would be
    nothing to compare with); else none."""
    if ctx.mig.workload.kind == "service":
        sides = [side for side in ("source", "target") if pods.serverless(ctx.mig, side) is not None]
    elif ctx.mig.workload.kind == "inference":
        sides = [side for side in ("source", "target") if ctx.resources.profile(side).endpoint_mode == "queue"]
    else:
        return []
    return sides if ctx.mig.measure.cold_starts > 0 and len(sides) == 2 else []


def cold_start_plan(ctx: PhaseContext, side: str) -> Plan:
    """The plan of ``side``'s cold-start endpoint: one worker, none kept running, idle timeout
    :data:`COLD_IDLE_TIMEOUT_S` seconds (a service's: :func:`runbook_lib.phases.service_pods.plan_endpoint`
    with ``scale_to_zero_s``)."""
    sv = pods.serverless(ctx.mig, side)
    if ctx.mig.workload.kind == "service" and sv is not None:
        return pods.plan_endpoint(ctx.resources, side, f"coldstart-{side}", sv, scale_to_zero_s=COLD_IDLE_TIMEOUT_S)
    return ctx.endpoints.plan(side, f"coldstart-{side}", workers=1, active_workers=0,
                                       idle_timeout_s=COLD_IDLE_TIMEOUT_S)


def _cold_client(ctx: PhaseContext, side: str, ep: Endpoint) -> tuple[ServingClient, Callable[[], Mapping[str, int]]]:
    """The client of ``side``'s cold-start endpoint and what counts its workers: the job API and
    its ``/health`` for the runbook's own endpoint; the service's protocol client
    (:func:`runbook_lib.phases.service_pods.side_client`) and
    :func:`runbook_lib.phases.service_pods.endpoint_workers` for a service's."""
    m = ctx.mig.measure
    if ctx.mig.workload.kind == "service":
        c: ServingClient = pods.side_client(ctx.resources, side, ep.url, timeout_s=m.request_timeout_s * 4,
                                            project=ctx.resources.run.project, endpoint_id=ep.id)
        return c, lambda: pods.endpoint_workers(ctx.resources, side, ep)
    job = ctx.resources.provider(side).job_client(ep.id, ep.url, timeout_s=m.request_timeout_s * 4,
                                                  clocks=job_clocks(m), mode=ep.mode)
    return job, lambda: job.health()["workers"]


def bench_plan(ctx: PhaseContext, side: str, tag: str) -> Plan:
    """The launch plan of training round ``tag``'s pod on ``side`` (``<round>`` or
    ``<round>-retry<k>``): the acceptance agent in ``bench`` mode from phase 01's frozen set."""
    frozen = ctx.records.need_freeze().frozen().prefix
    return ctx.agents.plan(side, f"bench-{tag}", "bench", prefix=ctx.store_prefix("bench", tag),
                                    frozen_prefix=frozen)


def planned(ctx: PhaseContext) -> list[tuple[str, Plan, str]]:
    """Every plan phase 04's measurement applies, as ``(side, plan, when)`` in the order it
    applies them, built by the same functions the measurement calls, so their fingerprints are
    the ones it applies: for an inference workload the cold-start endpoints
    (:func:`cold_start_plan`) and the measured endpoints (``endpoint-<side>``); for a training
    workload one pod per interleaved round (:func:`bench_plan`) and one per extra round
    ``measure.max_extra_rounds`` allows, applied only when a side is short of samples, and the
    ``checkpoint_durability`` drill's two pods (:func:`runbook_lib.phases.compare.durability.planned`). A retry
    of a round after a machinery failure is a new rental and is approved on its own. Tearing
    down what these plans create is covered by their approval."""
    m = ctx.mig.measure
    if ctx.mig.workload.serves:
        serving = serving_for(ctx)
        return ([(side, cold_start_plan(ctx, side), f"cold starts from zero ({m.cold_starts} per side)")
                 for side in cold_start_sides(ctx)]
                + [(side, serving.plan(side, f"endpoint-{side}"), "always")
                   for side in ("source", "target") if creates(ctx, side)])
    if ctx.mig.gates.method == "sequential":
        return [(ROUND_PATTERN[r % 4], bench_plan(ctx, ROUND_PATTERN[r % 4], str(r)),
                 "always" if r < 2 * m.min_rounds else "only while a blocking gate is undecided (gates.method: "
                 "sequential, up to measure.max_rounds a side)") for r in range(2 * m.max_rounds)] + durability.planned(ctx)
    sides = round_sides(m.rounds)
    out = [(side, bench_plan(ctx, side, str(r)), "always") for r, side in enumerate(sides)]
    out += [(ROUND_PATTERN[r % 4], bench_plan(ctx, ROUND_PATTERN[r % 4], str(r)),
             "only if a side is short of samples (measure.max_extra_rounds)")
            for r in range(len(sides), len(sides) + m.max_extra_rounds)]
    return out + durability.planned(ctx)


def round_sides(rounds: int) -> list[str]:
    """Interleaved sides: S, T, T, S, S, T, T, S, ... (``rounds`` entries)."""
    return [ROUND_PATTERN[i % 4] for i in range(rounds)]


def round_block(r: int) -> int:
    """The S, T, T, S block round ``r`` belongs to; its inputs, arrival schedule and saturation
    burst are drawn with seeds of the block. Every round of a block sends the same inputs on the
    same schedule, so the block's source/target comparison and its A/A pair (its two source
    rounds, the noise floor) each compare like with like: what differs between them is the host
    and the server, not which inputs were drawn or how their arrivals clustered."""
    return r // len(ROUND_PATTERN)


def _short(ctx: PhaseContext, counts: dict[str, int]) -> bool:
    need = ctx.mig.gates.min_latency_samples
    if ctx.mig.workload.serves:  # the absolute SLO bound needs its own minimum on the target
        need_t = max(need, g.min_slo_samples())
        return counts.get("source", 0) < need or counts.get("target", 0) < need_t
    return min(counts.get("source", 0), counts.get("target", 0)) < need


def schedule_rounds(ctx: PhaseContext, run_round: Any, look: Callable[[], bool] | None = None,
                    pair_s: list[float] | None = None) -> int:
    """Run the interleaved rounds, then extra ones while a side is short of samples and the
    extension budget (``measure.max_extra_rounds``) lasts. ``run_round(r, side)`` returns the
    number of completed samples it added. Returns the number of extra rounds run.

    Under ``gates.method: sequential`` it runs pairs of rounds instead (S,T then T,S, ...), up to
    ``measure.max_rounds`` pairs, and after each pair from ``measure.min_rounds`` on asks
    ``look()`` (:func:`runbook_lib.phases.compare.sequential.should_stop` on the measurement so
    far) whether every blocking gate is decided (or one FAILed); it stops when so, after a pair that measured
    nothing (the spend limit refused its rounds, or every request failed), or before a pair that
    could take the rounds past ``measure.max_seconds`` (:func:`runbook_lib.phases.compare.sequential.over_seconds`);
    each pair's wall seconds go to ``pair_s``. No extra rounds: 0."""
    m = ctx.mig.measure
    if ctx.mig.gates.method == "sequential":
        took = pair_s if pair_s is not None else []
        for pair in range(m.max_rounds):
            if sequential.over_seconds(took, m.max_seconds):
                break
            t0 = time.perf_counter()
            added = sum(run_round(r, ROUND_PATTERN[r % 4]) for r in (2 * pair, 2 * pair + 1))
            took.append(time.perf_counter() - t0)
            if added == 0 or (pair + 1 >= m.min_rounds and look is not None and look()):
                break
        return 0
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


def measure_inference(ctx: PhaseContext, *, sleep: Callable[[float], None] = time.sleep) -> Measured:
    """Create both endpoints, measure cold starts and interleaved rounds; keep the endpoints.
    This process is the load generator: its heap is frozen while it measures
    (:func:`runbook_lib.measure.timing.frozen_heap`), so its own garbage collection does not land in
    one round's latencies and not another's.

    Args:
        sleep: waits between retries of a failed measurement (injected in tests).

    Returns:
        The measurement, with the endpoints and the load generator's garbage collections.
    """
    with frozen_heap() as pauses:
        out = _measure_endpoints(ctx, sleep=sleep)
    return dataclasses.replace(out, load_generator_gc=pauses)


def start_endpoint(ctx: PhaseContext, side: str, serving: Serving, meter: cost.SpendMeter,
                   log: list[Attempted[Any]], *, sleep: Callable[[float], None],
                   lane: str = "") -> tuple[Served, ServingClient, TableRow, float, float]:
    """Create ``side``'s endpoint (or service pod), start its spend meter, and time its cold
    start: create call to the first served answer, split into the first job's queue, init and
    inference and the first worker's initialisation parts (seconds; NaN when the first job was
    not served, or a part the side does not report). ``lane``: the name the meter and the row
    give it (a raced candidate's; default ``side``).

    Returns:
        ``(served, client, cold-start row, created_at, first_answer_at)``, times from
        :func:`time.perf_counter`.
    """
    m = ctx.mig.measure
    lane = lane or side
    t0 = time.perf_counter()
    ep = serving.create(side, f"endpoint-{side}")
    prof = ctx.resources.profile(side)
    if ep.mode != LIVE_MODE:  # a live source is the team's, paid for whatever the run does: not the run's spend
        meter.start(lane, cost.usd_per_hour(price_usd_per_hour=prof.price_usd_per_hour, instances=prof.workers,
                                            storage_gb=ctx.mig.workload.requirements.disk_gb,
                                            storage_usd_per_gb_month=prof.storage_usd_per_gb_month), at=t0)
    client = serving.client(side, ep, timeout_s=m.request_timeout_s * 4)
    payload0 = serving.request_inputs(1, seed=0)[0][1]
    first = measured_with_retries(ctx, lambda _k: client.runsync(payload0), log, what=f"cold start {side}",
                                  kind="cold_start", side=side, sleep=sleep)
    ready = time.perf_counter()
    status = served_status(first.value) if first.value is not None else "MEASUREMENT_ERROR"
    # Create to first served response (a job that expired or failed was not served); the
    # waits between retries are not the side's own time. A live source was running before the
    # runbook came: it has no cold start here.
    cold_s = ready - t0 - first.waited_s if first.ok and status == "COMPLETED" and ep.mode != LIVE_MODE else math.nan
    health = measured_with_retries(ctx, lambda _k: client.health(), log, what=f"cold start {side} worker report",
                                   kind="cold_start", side=side, sleep=sleep)
    starts = health.value.get("cold_starts", []) if health.value is not None else []
    split = job_timings(first.value) if first.value is not None else {}
    row = {"side": lane, "endpoint": ep.id, "cold_start_s": cold_s, "first_status": status,
           "attempts": len(first.attempts), "ready_s": ep.ready_s if ep.ready_s is not None else math.nan,
           **{f"first_job_{k}": split.get(k, math.nan) for k in ("queue_s", "init_s", "execution_s")},
           **{f"worker_{k}": float(starts[0].get(k, math.nan)) if starts else math.nan for k in INIT_PARTS},
           "worker_init_s": [c["init_s"] for c in starts]}
    return ep, client, row, t0, ready


def warm_up(ctx: PhaseContext, side: str, client: ServingClient, serving: Serving, log: list[Attempted[Any]],
             *, sleep: Callable[[float], None]) -> list[TableRow]:
    """``measure.warmup_requests`` requests to ``side``, one at a time, each row its seconds and
    served status; recorded, and left out of every gate."""
    def warm(_k: int) -> list[TableRow]:
        out = []
        for i, (_, payload) in enumerate(serving.request_inputs(ctx.mig.measure.warmup_requests, seed=1)):
            t0 = time.perf_counter()
            job = client.runsync(payload)
            out.append({"side": side, "request": i, "seconds": time.perf_counter() - t0, "status": served_status(job)})
        return out

    w = measured_with_retries(ctx, warm, log, what=f"warm-up {side}", kind="warmup", side=side, sleep=sleep)
    return w.value or []


def settle(client: ServingClient) -> None:
    """Before an open-loop round: wait until a paced client (a live source's) could send at once,
    so the round's first arrival does not queue behind the round before it; others go at once."""
    pacer = getattr(client, "pacer", None)
    if pacer is not None:
        pacer.settle()


def saturate(ctx: PhaseContext, serving: Serving, client: ServingClient, side: str, r: int,
              log: list[Attempted[Any]], *, sleep: Callable[[float], None]) -> list[TableRow]:
    """Round ``r``'s saturation burst on ``side`` (``measure.throughput_requests`` at once, drawn
    with the round's block seed): one throughput row, or none when every attempt failed (the
    attempts are in ``log``)."""
    burst = serving.request_inputs(ctx.mig.measure.throughput_requests, seed=3000 + round_block(r))
    sat = measured_with_retries(ctx, lambda _k: run_saturation(client, [p for _, p in burst]), log,
                                what=f"round {r} {side} saturation", kind="saturation", side=side, sleep=sleep)
    return [{"side": side, "round": r, **sat.value}] if sat.value is not None else []


def _measure_endpoints(ctx: PhaseContext, *, sleep: Callable[[float], None]) -> Measured:
    m = ctx.mig.measure
    serving = serving_for(ctx)
    endpoints: dict[str, Served] = {}
    clients: dict[str, ServingClient] = {}
    cold: list[TableRow] = []
    ready: dict[str, float] = {}
    created: dict[str, float] = {}
    log: list[Attempted[Any]] = []
    pair_s: list[float] = []  # each pair of rounds' seconds (sequential)
    meter = spend_meter(ctx)
    for side in ("source", "target"):
        ep, client, row, created[side], ready[side] = start_endpoint(ctx, side, serving, meter, log, sleep=sleep)
        cold.append(row)
        endpoints[side], clients[side] = ep, client
    sink = SampleSink(ctx.evidence.path(SAMPLES_FILE))
    egress: dict[str, float] = {"source": 0.0, "target": 0.0}
    live = sequential.LiveLook(ctx.mig)  # what the sequential looks read; its throughput rows are the table's
    gaps: list[TableRow] = []
    warm_rows = [row for side in ("source", "target")  # warm-up, discarded from the gates and recorded
                 for row in warm_up(ctx, side, clients[side], serving, log, sleep=sleep)]
    round_s: list[float] = []
    stops: list[cost.SpendStop] = []
    gap_s = source_gap_s(ctx)  # a live source's pacing: both sides get the same spaced schedule

    def one_round(r: int, side: str) -> int:
        picks = serving.request_inputs(m.requests_per_round, seed=1000 + round_block(r))
        sched = spaced(poisson_schedule(len(picks), m.arrival_rate_per_s, seed=2000 + round_block(r)), gap_s)
        # Stop before a round that could cross gates.spend_limit_usd: expected to last as long as
        # the longest so far, or, before any, its schedule plus one request timeout.
        stop = meter.check(f"round {r} {side}", max(round_s, default=float(sched[-1]) + m.request_timeout_s))
        if stop is not None:
            stops.append(stop)
            return 0
        settle(clients[side])
        started = time.perf_counter()
        reqs = [Request(i, float(sched[i]), payload, idx) for i, (idx, payload) in enumerate(picks)]
        got = measured_with_retries(ctx, lambda _k: run_open_loop(clients[side], reqs, side=side, round_id=r), log,
                     what=f"round {r} {side} open-loop", kind="open_loop", side=side, sleep=sleep)
        rows = got.value or []
        sent = 0
        for row in rows:  # judged and written as the round ends; the answers are not kept
            row["accepted"] = serving.accepted(row)
            sent += len(json.dumps(row.get("output"))) if row.get("output") is not None else 0
            row.pop("output", None)
            gaps.extend({"side": side, "round": r, "request": row["request"], "itl_s": x} for x in row.pop("itl_s", ()))
        egress[side] += sent
        live.add(rows)
        sink.write(rows)
        if endpoints[side].mode != LIVE_MODE:  # a live source is never saturated, and is not the run's spend
            live.throughput.extend(saturate(ctx, serving, clients[side], side, r, log, sleep=sleep))
            meter.charge(sent / cost.BYTES_PER_GB * ctx.resources.profile(side).egress_usd_per_gb)
        round_s.append(time.perf_counter() - started)
        return sum(1 for x in got.value or [] if x["status"] == "COMPLETED")

    extra_rounds = schedule_rounds(ctx, one_round, look=live, pair_s=pair_s)
    end = time.perf_counter()
    health_end = measured_with_retries(ctx, lambda _k: clients["target"].health()["workers"], log, what="target workers after rounds",
                        kind="health", side="target", sleep=sleep)
    workers_ready = int(health_end.value["idle"] + health_end.value["running"]) if health_end.value is not None else 0
    from_zero = measure_cold_starts(ctx, serving.request_inputs(1, seed=5000)[0][1], log, meter, stops, sleep=sleep,
                                    expected_s={c["side"]: c["cold_start_s"] for c in cold})
    sink.close()
    throughput = pd.DataFrame(live.throughput, columns=THROUGHPUT_COLUMNS) if not live.throughput else pd.DataFrame(live.throughput)
    for c in clients.values():
        c.close()
    # Both sides are billed from their create call to their first answer (the cold start, served
    # or not) plus the same measurement window (from when both had answered to the end), so
    # creating one side first does not bill it for the other's start-up.
    window = end - max(ready.values())
    billed = {side: ready[side] - created[side] + window for side in ready}
    return Measured(
        endpoints={s: e.id for s, e in endpoints.items()}, endpoint_urls={s: e.url for s, e in endpoints.items()},
        endpoint_modes={s: e.mode for s, e in endpoints.items()}, samples=pd.DataFrame(),
        cold_starts=pd.DataFrame(cold), throughput=throughput, warmup=pd.DataFrame(warm_rows), billed_s=billed,
        egress_bytes=egress, extra_rounds=extra_rounds, pair_s=pair_s, target_workers_ready=workers_ready, attempts=log,
        spend=spend_record(meter, stops), meter=meter,
        cold_starts_from_zero=pd.DataFrame(from_zero, columns=COLD_COLUMNS), store_to_pod=store_to_pod_canary(ctx),
        inter_token=pd.DataFrame(gaps, columns=ITL_COLUMNS) if ctx.mig.workload.kind == "service" else None)


def round_attempt(ctx: PhaseContext, side: str, r: int) -> Callable[[int], tuple[Pod, Pod, dict[str, Path]]]:
    """Attempt ``k`` of training round ``r`` on ``side`` (for :func:`measured_with_retries`): rent
    the round's bench pod, run the acceptance agent, destroy the pod and fetch its result set to
    ``04/bench/<tag>``; returns ``(pod, its final state, {file name: local path})``. Attempt 0 applies
    :func:`bench_plan` tag ``<r>``, which :func:`planned` lists and the phase's approval covers.
    A retry after a machinery failure (attempt ``k`` >= 1, tag ``<r>-retry<k>``) is another
    rental: its plan is in no earlier approval, so it is applied only under its own.

    Raises:
        ApprovalRequired: the attempt's plan is not approved (a retry's, until someone approves
            it); nothing is created and its plan is left pending in ``approvals/``.
        WorkloadError, NoCapacity, ProviderError, StorageError: as :meth:`Agents.run` and the
            fetch raise them (the last two are retried by :func:`measured_with_retries`)."""
    def attempt(k: int) -> tuple[Pod, Pod, dict[str, Path]]:
        tag = str(r) if k == 0 else f"{r}-retry{k}"
        run = ctx.agents.run(side, bench_plan(ctx, side, tag), result_prefix=ctx.store_prefix("bench", tag, "result"))
        files = ctx.evidence.fetch(ctx.store, ctx.store_prefix("bench", tag, "result"), f"04/bench/{tag}")
        return run.pod, run.done, files

    return attempt


def measure_training(ctx: PhaseContext, *, sleep: Callable[[float], None] = time.sleep) -> Measured:
    """Interleaved rounds of the training job on pods; step times are the latency samples. A
    round whose pod cannot be launched, waited on or read back is retried with a new pod (its
    own store prefix ``bench/<round>-retry<k>``); a pod whose job exits non-zero is not retried
    (that is the workload failing, not the measuring)."""
    cold: list[TableRow] = []
    warm_rows: list[TableRow] = []
    fetched: list[StoreFetch] = []
    sink = SampleSink(ctx.evidence.path(SAMPLES_FILE))
    log: list[Attempted[Any]] = []
    warmup = max(1, ctx.mig.measure.warmup_requests)
    billed = {"source": 0.0, "target": 0.0}
    meter = spend_meter(ctx)
    stops: list[cost.SpendStop] = []
    round_s: list[float] = []
    live = sequential.LiveLook(ctx.mig)  # every step so far: what the sequential looks read
    thr = live.throughput
    reduced: list[list[Any]] = []

    def one_round(r: int, side: str) -> int:
        # Stop before launching a round's pod that could cross gates.spend_limit_usd: expected to
        # bill as long as the longest round so far, or, before any, the acceptance budget.
        price = ctx.resources.profile(side).price_usd_per_hour
        stop = meter.check(f"round {r} {side}", max(round_s, default=ctx.mig.run.acceptance_budget_s),
                           launches_usd_per_hour=price)
        if stop is not None:
            stops.append(stop)
            return 0

        got = measured_with_retries(ctx, round_attempt(ctx, side, r), log, what=f"round {r} {side} training pod", kind="training_round", side=side,
                     sleep=sleep)
        if got.value is None:
            return 0
        pod, done, files = got.value
        res = json.loads(files["result.json"].read_text())
        if res.get("fetch"):
            fetched.append(StoreFetch(side=side, round=r, source=f"bench pod {pod.id}", **res["fetch"]))
        att = res["attempts"][0]
        pod_s = (done.ended_at or time.time()) - done.created_at
        billed[side] += pod_s
        round_s.append(pod_s)
        meter.charge(price * pod_s / 3600.0)
        cold.append({"side": side, "round": r, "pod": pod.id,
                     "cold_start_s": (att["first_step_done_epoch"] or math.nan) - done.created_at})
        prof = ctx.resources.profile(side)
        if res.get("allreduce"):  # a row of ALLREDUCE_COLUMNS
            reduced.append([side, r, *(res["allreduce"][k] for k in ALLREDUCE_COLUMNS[2:])])
        rows = []
        for i, (t, met) in enumerate(zip(att["step_times_s"], att["metrics"], strict=True)):
            if i < warmup:  # first steps pay allocation and cache warm-up: recorded, not judged
                warm_rows.append({"side": side, "round": r, "step": i, "seconds": t})
                continue
            # a training step is accepted when its loss is finite; a restore when every file verified
            ok = math.isfinite(met["loss"]) if "loss" in met else bool(met.get("verified", 0.0))
            rows.append({"side": side, "round": r, "request": i, "total_s": t, "queue_s": 0.0, "init_s": 0.0,
                         "execution_s": t, "status": "COMPLETED" if ok else "FAILED",
                         "loss": met.get("loss", math.nan), "accepted": ok})
        sink.write(rows)
        live.add(rows)
        thr.append(round_throughput(side, r, att, warmup, default_rows=prof.batch_size * prof.world_size))
        return len(att["step_times_s"][warmup:])

    pair_s: list[float] = []
    extra_rounds = schedule_rounds(ctx, one_round, look=live, pair_s=pair_s)
    sink.close()
    throughput = pd.DataFrame(thr) if thr else pd.DataFrame(columns=THROUGHPUT_COLUMNS)
    return Measured(samples=pd.DataFrame(), cold_starts=pd.DataFrame(cold), throughput=throughput, billed_s=billed,
                    egress_bytes={"source": 0.0, "target": 0.0}, warmup=pd.DataFrame(warm_rows),
                    extra_rounds=extra_rounds, pair_s=pair_s, attempts=log, spend=spend_record(meter, stops), meter=meter,
                    store_to_pod=fetched,
                    allreduce=pd.DataFrame(reduced, columns=ALLREDUCE_COLUMNS) if _data_parallel(ctx.mig) else None)


def _data_parallel(mig: Migration) -> bool:
    """Whether a side of a training job runs more than one process (phase 04 then times all-reduces)."""
    return max(mig.source.world_size, mig.target.world_size) > 1


def round_throughput(side: str, r: int, att: Mapping[str, Any], warmup: int, *, default_rows: int) -> TableRow:
    """A training round's throughput row (:data:`THROUGHPUT_COLUMNS`): rows trained per second of
    step time after the ``warmup`` steps, each step's rows as it reports them (``samples``: its
    global batch, over every process of the pod), else ``default_rows``."""
    timed = att["step_times_s"][warmup:]
    total = sum(timed)
    units = sum(m.get("samples", default_rows) for m in att["metrics"][warmup:])
    return {"side": side, "round": r, "requests": float(len(timed)), "completed": float(len(timed)), "failed": 0.0,
            "elapsed_s": total, "throughput_units_per_s": units / total if total > 0 else 0.0}


def store_to_pod_canary(ctx: PhaseContext) -> list[StoreFetch]:
    """Store-to-pod transfer for an inference workload, whose endpoints fetch nothing from the
    store: the canary's verified download of the frozen artifact in phase 03 (target side); the
    source side is not measured (its workers load from their own image)."""
    rec = ctx.records.parity
    fetch = rec.result.fetch if rec is not None and rec.result is not None else None
    rows = [StoreFetch(side="target", source=f"phase 03 canary {rec.canary_pod}", **fetch.model_dump())] \
        if fetch is not None and rec is not None else []
    return rows + [StoreFetch(side="source", source="not measured: the source's endpoint workers fetch nothing from "
                              "the store")]


def measure(ctx: PhaseContext, *, sleep: Callable[[float], None] = time.sleep) -> Measured:
    """Run the measurement protocol for this workload kind and save the raw measurement
    (:mod:`runbook_lib.phases.compare.raw`: samples streamed to ``04/samples.parquet`` round by
    round, every measurement attempt to ``04/measurement_attempts.csv``). The tables returned are
    those read back from the files, so the gates judge exactly what
    ``runbook verify --recompute`` will read.

    Raises:
        ApprovalRequired: a plan of :func:`planned` is not approved (checked before anything is
            created).
    """
    ctx.resources.require_all([(side, plan) for side, plan, _ in planned(ctx)])
    kind = measure_inference if ctx.mig.workload.serves else measure_training
    return tabled(ctx, kind(ctx, sleep=sleep))


def tabled(ctx: PhaseContext, res: Measured) -> Measured:
    """``res`` (its samples already in ``04/samples.parquet``) with its small tables written
    (:func:`runbook_lib.phases.compare.raw.write_tables`) and every table read back from the
    files, as the gates and ``runbook verify --recompute`` read them."""
    for rel in (ATTEMPTS_FILE, THROUGHPUT_FILE, COLD_STARTS_FILE, WARMUP_FILE,
                *((ALLREDUCE_FILE,) if res.allreduce is not None else ()),
                *((FROM_ZERO_FILE,) if res.cold_starts_from_zero is not None else ()),
                *((INTER_TOKEN_FILE,) if res.inter_token is not None else ())):
        ctx.evidence.path(rel)  # registered as evidence of the phase
    write_tables(ctx.run_dir, res)
    t = load_tables(ctx.run_dir)  # the live measurements keep their attempts: they carry their values too
    res = dataclasses.replace(res, samples=t.samples, throughput=t.throughput, cold_starts=t.cold_starts,
                              cold_starts_from_zero=t.cold_starts_from_zero, inter_token=t.inter_token,
                              allreduce=t.allreduce)
    if ctx.mig.workload.serves:
        res = dataclasses.replace(res, clocks=clocks_record(ctx.mig.measure, res))
    return res
