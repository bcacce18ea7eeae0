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
round) is taken through :func:`runbook_lib.measure.timing.with_retries`: when the measuring machinery
fails it is retried (``measure.error_retries``, ``measure.error_retry_interval_s``), every attempt
is kept in ``04/measurement_attempts.csv``, and a measurement lost after its retries makes the
gates it feeds INCONCLUSIVE (:data:`AFFECTS`), never FAIL or PASS.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runbook_lib import gates as g
from runbook_lib.evidence import report
from runbook_lib.evidence.manifest import PHASE_PLOTS, PLOT_METADATA_KEY
from runbook_lib.evidence.records import CompareData, RaceRecord
from runbook_lib.measure import cost
from runbook_lib.params import Migration
from runbook_lib.phases import PhaseContext, PhaseResult, PlanShown, md, table
from runbook_lib.phases.compare import race as racejudge
from runbook_lib.phases.compare import racing
from runbook_lib.phases.compare.drills import EXPECTATIONS, DrillsResult, guarded, run_drills
from runbook_lib.phases.compare.judge import (
    OPERATOR_SETTINGS,
    Measurement,
    cold_start_samples,
    cold_start_summary,
    compare_gates,
    costs,
    record_data,
    round_costs,
    store_to_pod_summary,
    summary,
    traffic_costs,
)
from runbook_lib.phases.compare.protocol import (
    AFFECTS,
    ROUND_PATTERN,
    clocks_record,
    lost_measurements,
    measure,
    measure_cold_starts,
    measure_inference,
    measure_training,
    measured_with_retries,
    planned,
    round_sides,
    schedule_rounds,
    tabled,
    wait_for_zero,
)
from runbook_lib.phases.compare.raw import THROUGHPUT_COLUMNS, Measured
from runbook_lib.phases.serving import creates

RACE_PLOT = "04/race.png"
"""The race's plot (:func:`runbook_lib.evidence.report.race_plot`), beside the phase's three."""
RACE_GATE = "race_pick"
"""Phase 04's blocking gate of a race: a candidate was picked (HOLD when the budget ended undecided)."""

__all__ = [
    "EXPECTATIONS", "DrillsResult", "guarded", "run_drills", "cold_start_samples", "cold_start_summary",
    "measure_cold_starts", "wait_for_zero", "traffic_costs",
    "AFFECTS", "Measured", "OPERATOR_SETTINGS", "ROUND_PATTERN", "THROUGHPUT_COLUMNS", "CompareResult", "Measurement",
    "clocks_record", "compare_gates", "costs", "evaluate", "lost_measurements", "measure", "measure_inference", "measure_sides",
    "measure_training", "measured_with_retries", "plan", "planned", "record_data", "round_sides", "schedule_rounds",
    "store_to_pod_summary", "summary",
]


@dataclass(frozen=True)
class CompareResult(PhaseResult):
    """Phase 04's judged evidence: cost per accepted unit per side, the comparison plots (PNG
    files in the run; shown from the files, whatever the kernel's plotting backend) and the gates
    (kept in the phase's context)."""

    measurement: Measurement
    costs: dict[str, cost.CostBreakdown]
    plots: tuple[Path, ...]
    drills: DrillsResult | None = None
    at_traffic: dict[str, cost.TrafficCost] | None = None
    mig: Migration | None = None

    def record(self) -> CompareData:
        data = record_data(self.measurement.raw, self.costs, self.measurement.summary, self.at_traffic, self.mig)
        return data.model_copy(update={"drills": self.drills.rows if self.drills is not None else (),
                                       "race": self.measurement.race})

    def parts(self) -> list[Any]:
        from IPython.display import Image

        traffic = [md("**Cost per accepted unit at the declared traffic** (USD; warm workers billed busy or idle; "
                      "the cost gate judges this)"), table({s: c.to_dict() for s, c in self.at_traffic.items()})] \
            if self.at_traffic else []
        rec = self.record()
        tokens = [md("**Service latency per side** (vLLM bench serve's definitions: TTFT, TPOT and ITL p50/p95/p99, "
                     "E2E from send to last byte, seconds; output tokens per second; goodput, accepted requests "
                     "within workload.service's SLOs per second)"),
                   table([{"figure": k, **{side: m.get(k) for side, m in rec.token_metrics.items()}}
                          for k in dict.fromkeys(k for m in rec.token_metrics.values() for k in m)])] \
            if rec.token_metrics else []
        forecast = rec.forecast
        ahead = [md("**Savings forecast at the declared traffic** (USD a month of 730 hours; the saving's interval "
                    "is a 90 % bootstrap over rounds; break-even: the traffic at which the costs per accepted unit "
                    "cross)"), table({"forecast": forecast.model_dump()})] if forecast is not None else []
        race = self.measurement.race
        raced = [md(f"**The race** on {race.objective}, subject to the blocking gates {list(race.gates)} "
                    f"({race.comparisons} comparisons, each at alpha {race.alpha_each:.2g}: {race.correction}); "
                    f"the pick: **{race.pick or 'none'}**" + (f", undecided: {list(race.undecided)}" if race.undecided
                                                              else "")),
                 table(racejudge.table(race))] if race is not None and race.entries else []
        return [*raced, *tokens, *traffic, *ahead, md("**Cost over the measurement window** (USD)"),
                table({s: c.to_dict() for s, c in self.costs.items()}),
                *(Image(filename=str(p), metadata={PLOT_METADATA_KEY: f"{p.parent.name}/{p.name}"})
                  for p in self.plots)]


def plan(ctx: PhaseContext) -> PlanShown:
    """Phase 04's plans (:func:`planned`), for display before its approval cell: the endpoints or
    round pods the measurement rents, with when each is applied."""
    if ctx.mig.racing:
        return PlanShown.of(racing.planned(ctx), note="Phase 04 races the candidates phase 03 proved beside one source "
                            "endpoint; a candidate out of the race is destroyed at once, the pick's endpoint and the "
                            "source's are kept for phase 05 and torn down in phase 06.")
    live = ctx.mig.workload.kind == "service" and not creates(ctx, "source")
    kind = ("the target's measured service pod (the live source is measured as it runs, paced at "
            "source.max_rate_per_s)" if live else
            "the measured service pods of both sides" if ctx.mig.workload.kind == "service" else
            "the cold-start and measured endpoints of both sides" if ctx.mig.workload.kind == "inference"
            else f"one pod per measured round, both sides ({ctx.mig.workload.unit}s timed in each)")
    return PlanShown.of(planned(ctx), note=f"Phase 04 rents {kind}; each is torn down when measured (the measured "
                                           "endpoints are kept for phase 05 and torn down in phase 06).")


def measure_sides(ctx: PhaseContext) -> Measurement:
    """Phase 04, first step: run the measurement protocol (:func:`measure`) and summarise it; in a
    race (``targets``), race the proven candidates (:func:`runbook_lib.phases.compare.racing.measure_race`)
    and go on with the pick as the phase's target."""
    if ctx.mig.racing:
        raw, race = racing.measure_race(ctx)
        res = tabled(ctx, raw)
        return Measurement(raw=res, summary=summary(res), race=race)
    res = measure(ctx)
    return Measurement(raw=res, summary=summary(res))


def evaluate(ctx: PhaseContext, measured: Measurement, drills: DrillsResult | None = None) -> CompareResult:
    """Phase 04, last step: costs (``04/cost.json``), the latency CDF, throughput and cost plots
    (``04/*.png``), and the comparison gates; ``drills`` (:func:`run_drills`, whose gates are
    already in the context) go into the record."""
    import matplotlib.pyplot as plt

    res = measured.raw
    unit = ctx.mig.workload.unit
    costs_ = costs(ctx, res)
    at_traffic = traffic_costs(ctx, res)
    latency_png, throughput_png, cost_png = PHASE_PLOTS["04"]
    figs = [report.latency_cdf(res.samples, ctx.evidence.path(latency_png), unit_label=unit),
            report.throughput_plot(res.throughput, ctx.evidence.path(throughput_png),
                                   unit={"request": "requests/s", "restore": "restores/s"}.get(unit, "samples/s")),
            report.cost_plot(costs_, ctx.evidence.path(cost_png), unit=unit,
                             judged={s: c.usd_per_accepted_unit for s, c in at_traffic.items()} if at_traffic else None,
                             rounds=round_costs(ctx.mig, res, costs_, at_traffic),
                             basis=(f"at the declared traffic ({at_traffic['source'].traffic_per_s:g} requests/s)"
                                    if at_traffic else "over the measurement window"))]
    race = measured.race
    if race is not None:
        figs.append(report.race_plot(race, ctx.evidence.path(RACE_PLOT)))
    for fig in figs:  # shown from the saved files, so an inline backend does not show them twice
        plt.close(fig)
    compare_gates(ctx, res, costs_, at_traffic)
    if race is not None:
        ctx.evidence.add_gates(race_gate(race))
    return CompareResult(measurement=measured, costs=costs_, drills=drills, at_traffic=at_traffic, mig=ctx.mig,
                         plots=tuple(ctx.run_dir / rel for rel in (*PHASE_PLOTS["04"],
                                                                   *((RACE_PLOT,) if race is not None else ()))))


def race_gate(race: RaceRecord) -> g.GateResult:
    """:data:`RACE_GATE`: PASS with a pick, naming it and every candidate's fate; INCONCLUSIVE (a
    HOLD) when the budget ended with several candidates none was confidently better than."""
    fates = "; ".join(f"{e.name} {e.fate}" + (f" at pair {e.exit_pair} ({e.exit_reason})" if e.exit_pair else "")
                      for e in race.entries)
    detail = (f"{race.pick} picked on {race.objective} ({fates})" if race.pick else
              f"the budget ended with {list(race.undecided)} undecided: none is confidently better than every other on "
              f"{race.objective} ({fates}); measure longer (measure.max_rounds, measure.max_seconds) or pick by hand")
    return g.boolean_gate(RACE_GATE, True if race.pick else None, phase="04", detail=detail,
                          source="issue 50; O. Maron and A. W. Moore, Hoeffding races, NIPS 6, 1994 "
                                 "(runbook_lib.gates.race)")
