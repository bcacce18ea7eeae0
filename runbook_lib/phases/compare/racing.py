"""Phase 04's race of several candidates (``targets``; issue 50): every candidate phase 03 proved
is measured beside one source endpoint in interleaved rounds, and leaves the race, its endpoint
destroyed at once, as soon as it confidently fails a blocking gate or is confidently worse than
another on ``race.objective`` (:func:`runbook_lib.phases.compare.race.judge_race`).

* One source endpoint and one endpoint per candidate, each created, timed to its first answer
  and warmed up as phase 04 does for one target (:func:`~.protocol.start_endpoint`,
  :func:`~.protocol.warm_up`); each candidate's through its own context
  (:meth:`~runbook_lib.phases.context.PhaseContext.for_candidate`), so its plans, labels and
  store records are its own.
* Pair ``k`` measures the source, then every candidate still racing, in that order for an even
  ``k`` and reversed for an odd one (the S, T, T, S balance of one target, over several): each an
  open-loop round of ``measure.requests_per_round`` requests on the same inputs and arrival
  schedule, then a saturation burst. A candidate's view of the race (its pair ``k``) is the
  source's round of pair ``k`` and its own, so the source's round cancels when two candidates
  are compared.
* After each pair from ``measure.min_rounds`` on, the race is judged on every candidate's view;
  an eliminated candidate's endpoint is destroyed before the next pair. The race ends when one
  candidate is left, at ``measure.max_rounds`` pairs, before a pair that could pass
  ``measure.max_seconds`` or the spend limit; then it is judged once more as final.
* Every sample goes to ``04/race_samples.parquet`` (``side`` the lane: ``source`` or the
  candidate's name) and every burst to ``04/race_throughput.csv``, so ``runbook verify
  --recompute`` derives the race again (:func:`race_from_files`). The pick's view is written as
  phase 04's own measurement (``04/samples.parquet``, ...), and the rest of the phase (cold
  starts from zero, drills, costs, gates) runs on the pick as on a single target.

A candidate's USD per accepted unit in a round is priced at its measured capacity: what it bills
per hour (``price_usd_per_hour`` x ``workers``, plus storage) over the accepted units it serves
in an hour at the round's saturation throughput, ``usd_per_hour / 3600 / throughput /
accepted share`` (the cost per accepted unit of docs/explanation/measurement.md, at full use: no
idle time counted, so the race compares the machines, not the traffic declared for one).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from runbook_lib.evidence.records import RaceRecord
from runbook_lib.measure import cost
from runbook_lib.measure.timing import Attempted, Request, ServingClient, frozen_heap, poisson_schedule, run_open_loop
from runbook_lib.params import Migration
from runbook_lib.phases import PhaseContext
from runbook_lib.phases.compare.protocol import (
    COLD_COLUMNS,
    ITL_COLUMNS,
    cold_start_plan,
    cold_start_sides,
    measure_cold_starts,
    measured_with_retries,
    saturate,
    settle,
    spend_meter,
    spend_record,
    start_endpoint,
    store_to_pod_canary,
    warm_up,
)
from runbook_lib.phases.compare.race import CandidateView, judge_race
from runbook_lib.phases.compare.raw import SAMPLES_FILE, THROUGHPUT_COLUMNS, Measured, SampleSink, TableRow
from runbook_lib.phases.compare.sequential import over_seconds
from runbook_lib.phases.serving import LIVE_MODE, Served, serving_for, source_gap_s
from runbook_lib.providers.base import Plan
from runbook_lib.service.pacing import spaced

RACE_SAMPLES = "04/race_samples.parquet"
"""Every request of the race, one row per request; ``side`` is the lane (``source`` or a candidate)."""
RACE_THROUGHPUT = "04/race_throughput.csv"
"""Every saturation burst of the race, one row per lane and round; ``side`` is the lane."""
SOURCE = "source"


def proven(ctx: PhaseContext) -> list[str]:
    """The candidates phase 03 proved, in the params' order: the ones that race."""
    rec = ctx.records.parity
    done = {f.name for f in (rec.candidates if rec is not None else ()) if f.outcome == "proved"}
    return [t.name for t in ctx.mig.targets if t.name in done]


def planned(ctx: PhaseContext) -> list[tuple[str, Plan, str]]:
    """Phase 04's plans in a race, as ``(side, plan, when)``: the source's measured endpoint, each
    proven candidate's (destroyed as soon as it is out of the race), and the scale-from-zero
    endpoints each candidate would get as the pick."""
    out = [(SOURCE, serving_for(ctx).plan(SOURCE, "endpoint-source"), "always")]
    for name in proven(ctx):
        cand = ctx.for_candidate(name)
        out.append(("target", serving_for(cand).plan("target", "endpoint-target"),
                    f"candidate {name}: until it is out of the race (then destroyed at once)"))
        out += [(side, cold_start_plan(cand, side), f"cold starts from zero, only if {name} is the pick")
                for side in cold_start_sides(cand)]
    return out


def lane_costs(samples: pd.DataFrame, throughput: pd.DataFrame, usd_per_hour: float) -> list[float]:
    """One lane's USD per accepted unit per round, in round order, priced at its measured capacity
    (module docstring): ``usd_per_hour / 3600 / throughput_units_per_s / accepted share``; ``inf``
    for a round with nothing accepted. A round without a positive burst gives no value.
    Shapes: ``samples`` one row per request (``round``, ``accepted``), ``throughput`` one row
    per round (``round``, ``throughput_units_per_s``)."""
    out = []
    for _, row in throughput.sort_values("round").iterrows():
        thr = float(row["throughput_units_per_s"])
        mine = samples[samples["round"] == row["round"]]
        if not thr > 0 or not len(mine):
            continue
        share = float(mine["accepted"].astype(float).mean())
        out.append(usd_per_hour / 3600.0 / thr / share if share > 0 else math.inf)
    return out


def lane_usd_per_hour(mig: Migration, name: str) -> float:
    """What lane ``name`` (the source or a candidate) bills per hour while it serves, USD:
    :func:`runbook_lib.measure.cost.usd_per_hour` of its profile."""
    prof = mig.source if name == SOURCE else next(t for t in mig.targets if t.name == name)
    return cost.usd_per_hour(price_usd_per_hour=prof.price_usd_per_hour, instances=prof.workers,
                             storage_gb=mig.workload.requirements.disk_gb,
                             storage_usd_per_gb_month=prof.storage_usd_per_gb_month)


def views(mig: Migration, samples: pd.DataFrame, throughput: pd.DataFrame,
          names: list[str]) -> list[CandidateView]:
    """Each candidate's view of the race (:class:`CandidateView`): the source's rows and its own,
    its own labelled ``target``, with both lanes' costs per round (:func:`lane_costs`)."""
    out = []
    src_s, src_t = samples[samples["side"] == SOURCE], throughput[throughput["side"] == SOURCE]
    for name in names:
        own_s, own_t = samples[samples["side"] == name], throughput[throughput["side"] == name]
        prof = next(t for t in mig.targets if t.name == name)
        s = pd.concat([src_s, own_s.assign(side="target")], ignore_index=True)
        t = pd.concat([src_t, own_t.assign(side="target")], ignore_index=True)
        out.append(CandidateView(
            name=name, samples=s, throughput=t, provider=prof.provider, quoted_usd_per_hour=prof.price_usd_per_hour,
            costs={"source": lane_costs(src_s, src_t, lane_usd_per_hour(mig, SOURCE)),
                   "target": lane_costs(own_s, own_t, lane_usd_per_hour(mig, name))}))
    return out


def race_from_files(mig: Migration, run_dir: Path, names: list[str], *, final: bool = True) -> RaceRecord:
    """The race judged again from its files (:data:`RACE_SAMPLES`, :data:`RACE_THROUGHPUT`) and
    the params' prices: what ``runbook verify --recompute`` compares with the record."""
    samples = pd.read_parquet(run_dir / RACE_SAMPLES, columns=["side", "round", "status", "total_s", "accepted"])
    samples["side"] = samples["side"].astype(str)
    throughput = pd.read_csv(run_dir / RACE_THROUGHPUT)
    return judge_race(mig, views(mig, samples, throughput, names), objective=mig.race.objective, final=final)


@dataclass
class Lane:
    """One endpoint of the race: the source, or one candidate through its own context."""

    name: str
    ctx: PhaseContext
    side: str
    served: Served
    client: ServingClient
    cold: TableRow
    created: float
    ready: float
    out_after: int | None = None
    destroyed: bool = False


@dataclass
class Race:
    """The race as it is measured (module docstring): its lanes, its rows, its looks."""

    ctx: PhaseContext
    sleep: Callable[[float], None]
    lanes: dict[str, Lane] = field(default_factory=dict)
    log: list[Attempted[Any]] = field(default_factory=list)
    rows: list[TableRow] = field(default_factory=list)
    bursts: list[TableRow] = field(default_factory=list)
    warm: list[TableRow] = field(default_factory=list)
    gaps: list[TableRow] = field(default_factory=list)
    egress: dict[str, float] = field(default_factory=dict)
    stops: list[cost.SpendStop] = field(default_factory=list)
    pair_s: list[float] = field(default_factory=list)
    meter: cost.SpendMeter = field(init=False)

    def __post_init__(self) -> None:
        self.meter = spend_meter(self.ctx)

    def open(self, names: list[str]) -> None:
        """Create, time and warm up the source's endpoint and every candidate's."""
        for name in [SOURCE, *names]:
            c = self.ctx if name == SOURCE else self.ctx.for_candidate(name)
            side = SOURCE if name == SOURCE else "target"
            serving = serving_for(c)
            ep, client, row, t0, ready = start_endpoint(c, side, serving, self.meter, self.log, sleep=self.sleep,
                                                        lane=name)
            self.lanes[name] = Lane(name, c, side, ep, client, row, t0, ready)
            self.warm += [{**r, "side": name} for r in warm_up(c, side, client, serving, self.log, sleep=self.sleep)]
            self.egress[name] = 0.0

    def racing(self) -> list[str]:
        return [n for n, lane in self.lanes.items() if n != SOURCE and lane.out_after is None]

    def one_round(self, lane: Lane, pair: int) -> int:
        """Lane ``lane``'s round of pair ``pair``: its open-loop schedule, then its burst. Returns
        the completed requests (0 when the spend limit refused the round)."""
        m, c = self.ctx.mig.measure, lane.ctx
        serving = serving_for(c)
        r = 2 * pair + (0 if lane.name == SOURCE else 1)
        picks = serving.request_inputs(m.requests_per_round, seed=1000 + pair)
        sched = spaced(poisson_schedule(len(picks), m.arrival_rate_per_s, seed=2000 + pair), source_gap_s(c))
        stop = self.meter.check(f"pair {pair} {lane.name}", float(sched[-1]) + m.request_timeout_s)
        if stop is not None:
            self.stops.append(stop)
            return 0
        settle(lane.client)
        reqs = [Request(i, float(sched[i]), payload, idx) for i, (idx, payload) in enumerate(picks)]
        got = measured_with_retries(c, lambda _k: run_open_loop(lane.client, reqs, side=lane.side, round_id=r),
                                    self.log, what=f"pair {pair} {lane.name} open-loop", kind="open_loop",
                                    side=lane.side, sleep=self.sleep)
        sent = 0
        for row in got.value or []:
            row["accepted"] = serving.accepted(row)
            sent += len(json.dumps(row.get("output"))) if row.get("output") is not None else 0
            row.pop("output", None)
            self.gaps += [{"side": lane.name, "round": r, "request": row["request"], "itl_s": x}
                          for x in row.pop("itl_s", ())]
            self.rows.append({**row, "side": lane.name})
        self.egress[lane.name] += sent  # the answers' bytes out, billed as phase 04 bills one target's
        if lane.served.mode != LIVE_MODE:
            self.meter.charge(sent / cost.BYTES_PER_GB * c.resources.profile(lane.side).egress_usd_per_gb)
        self.bursts += [{**b, "side": lane.name} for b in
                        saturate(c, serving, lane.client, lane.side, r, self.log, sleep=self.sleep)]
        return sum(1 for x in got.value or [] if x["status"] == "COMPLETED")

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        s = pd.DataFrame(self.rows) if self.rows else pd.DataFrame(columns=["side", "round", "status", "total_s",
                                                                            "accepted"])
        t = pd.DataFrame(self.bursts) if self.bursts else pd.DataFrame(columns=THROUGHPUT_COLUMNS)
        return s, t

    def look(self, *, final: bool) -> RaceRecord:
        """The race judged on every candidate's view so far; a newly eliminated one is destroyed."""
        s, t = self.frames()
        names = [n for n in self.lanes if n != SOURCE]
        rec = judge_race(self.ctx.mig, views(self.ctx.mig, s, t, names), objective=self.ctx.mig.race.objective,
                         final=final)
        for e in rec.entries:
            lane = self.lanes[e.name]
            if e.fate == "eliminated" and lane.out_after is None:
                lane.out_after = e.exit_pair
                self.close(lane)
        return rec

    def close(self, lane: Lane) -> None:
        """Destroy ``lane``'s endpoint now and stop its meter (its machines are not kept for phase 05)."""
        lane.client.close()
        lane.ctx.resources.destroy(lane.side, lane.served.id)
        lane.destroyed = True
        if lane.name in self.meter.rates:
            self.meter.stop(lane.name)

    def run_pairs(self) -> RaceRecord:
        """Pairs until one candidate is left or the budget ends (module docstring); the final look."""
        m = self.ctx.mig.measure
        rec = None
        for pair in range(m.max_rounds):
            if over_seconds(self.pair_s, m.max_seconds):
                break
            t0 = time.perf_counter()
            order = [SOURCE, *self.racing()]
            added = sum(self.one_round(self.lanes[n], pair) for n in (order if pair % 2 == 0 else order[::-1]))
            self.pair_s.append(time.perf_counter() - t0)
            if added == 0:
                break
            if pair + 1 >= m.min_rounds:
                rec = self.look(final=False)
                if len(self.racing()) <= 1:
                    break
        return self.look(final=True) if rec is None or rec.pick is None else rec


def _write(ctx: PhaseContext, race: Race) -> None:
    """The race's own files (:data:`RACE_SAMPLES`, :data:`RACE_THROUGHPUT`), registered as evidence."""
    s, t = race.frames()
    with SampleSink(ctx.evidence.path(RACE_SAMPLES)) as sink:
        sink.write(s.to_dict("records"))
    t.to_csv(ctx.evidence.path(RACE_THROUGHPUT), index=False)


def measure_race(ctx: PhaseContext, *, sleep: Callable[[float], None] = time.sleep) -> tuple[Measured, RaceRecord]:
    """Race the candidates phase 03 proved (module docstring), then go on with the pick as the
    phase's target (:meth:`~runbook_lib.phases.context.PhaseContext.take_target`): its view of the
    race is phase 04's measurement of one target, its endpoint and the source's are kept for phase
    05, and its scale-from-zero starts are measured as a single target's. The load generator's
    heap is frozen while it measures, as for one target.

    Returns:
        ``(measurement, race record)``: the measurement as :func:`~.protocol.measure_inference`
        returns it, before its tables are written.

    Raises:
        ApprovalRequired: a plan of :func:`planned` is not approved (checked before anything is created).
    """
    ctx.resources.require_all([(side, plan) for side, plan, _ in planned(ctx)])
    names = proven(ctx)
    race = Race(ctx, sleep)
    with frozen_heap() as pauses:
        race.open(names)
        rec = race.run_pairs() if len(names) > 1 else None
    end = time.perf_counter()
    _write(ctx, race)
    if rec is None:
        rec = RaceRecord(objective=ctx.mig.race.objective, pick=names[0], final=True)
    pick = rec.goes_on()
    src, own = race.lanes[SOURCE], race.lanes[pick]
    health = measured_with_retries(own.ctx, lambda _k: own.client.health()["workers"], race.log,
                                   what="target workers after rounds", kind="health", side="target", sleep=sleep)
    ready = int(health.value["idle"] + health.value["running"]) if health.value is not None else 0
    ctx.take_target(pick)
    s, t = race.frames()
    keep = {SOURCE: SOURCE, pick: "target"}
    from_zero = measure_cold_starts(ctx, serving_for(ctx).request_inputs(1, seed=5000)[0][1], race.log, race.meter,
                                    race.stops, sleep=sleep, expected_s={"source": src.cold["cold_start_s"],
                                                                         "target": own.cold["cold_start_s"]})
    window = end - max(src.ready, own.ready)
    frame = pd.DataFrame([{**r, "side": keep[r["side"]]} for r in race.rows if r["side"] in keep])
    with SampleSink(ctx.evidence.path(SAMPLES_FILE)) as sink:
        sink.write(frame.to_dict("records"))
    measured = Measured(
        endpoints={"source": src.served.id, "target": own.served.id},
        endpoint_urls={"source": src.served.url, "target": own.served.url},
        endpoint_modes={"source": src.served.mode, "target": own.served.mode}, samples=pd.DataFrame(),
        cold_starts=pd.DataFrame([{**src.cold, "side": "source"}, {**own.cold, "side": "target"}]),
        throughput=t[t["side"].isin(list(keep))].replace({"side": keep}).reset_index(drop=True),
        warmup=pd.DataFrame([{**w, "side": keep[w["side"]]} for w in race.warm if w["side"] in keep]),
        billed_s={"source": src.ready - src.created + window, "target": own.ready - own.created + window},
        egress_bytes={"source": race.egress[SOURCE], "target": race.egress[pick]}, pair_s=race.pair_s,
        attempts=race.log, spend=spend_record(race.meter, race.stops), meter=race.meter,
        target_workers_ready=ready, load_generator_gc=pauses,
        cold_starts_from_zero=pd.DataFrame(from_zero, columns=COLD_COLUMNS), store_to_pod=store_to_pod_canary(ctx),
        inter_token=pd.DataFrame([{**x, "side": keep[x["side"]]} for x in race.gaps if x["side"] in keep],
                                 columns=ITL_COLUMNS) if ctx.mig.workload.kind == "service" else None)
    for lane in race.lanes.values():
        if not lane.destroyed:
            lane.client.close()
    return measured, rec
