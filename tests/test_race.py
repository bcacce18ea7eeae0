"""The race of target candidates (runbook_lib/gates/race.py): eliminations by a gate and by the
objective, the pick, HOLD when the budget ends undecided, and the error level split over every
comparison. The expected looks come from the mixture statistic itself (a sequence excludes a
value exactly when log B_n of it reaches log(1 / alpha): gates/sequential.py), not from the
closed-form half-width the race uses."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from runbook_lib.gates.race import Criterion, comparisons, race
from runbook_lib.gates.sequential import ALPHA, lai_log_bayes_factor
from runbook_lib.phases.compare.race import CandidateView

from .conftest import ROOT

LATENCY = Criterion("latency_p95_ratio", 2.0, higher_is_better=False)
THROUGHPUT = Criterion("throughput_ratio", 0.5, higher_is_better=True)
COST = Criterion("cost_per_accepted_unit", None, higher_is_better=False)
NOISE = np.array([0.02, -0.015, 0.01, -0.02, 0.015, -0.01, 0.005, -0.005])
"""Per-pair deviations, the same for every candidate's every criterion: fixed, so the looks are exact."""


def _candidate(latency: float, throughput: float, cost: float, pairs: int = 8, shift: int = 0) -> dict[str, list[float]]:
    """Per-pair log ratios around the given ratios; ``shift`` rolls the cost's deviations, so two
    candidates' costs differ by more than a constant."""
    n = NOISE[:pairs]
    return {"latency_p95_ratio": list(math.log(latency) + n), "throughput_ratio": list(math.log(throughput) - n),
            "cost_per_accepted_unit": list(math.log(cost) + np.roll(NOISE, shift)[:pairs])}


def _first_excluding(x: np.ndarray, value: float, *, above: bool, alpha: float, start: int = 2) -> int:
    """The first look n >= ``start`` at which the sequence lies wholly above (or below) ``value``:
    the mean is on that side and ``value`` is excluded (log B_n(value) >= log(1 / alpha))."""
    for n in range(start, x.size + 1):
        head = x[:n]
        side = head.mean() > value if above else head.mean() < value
        if side and lai_log_bayes_factor(head, value) >= math.log(1 / alpha):
            return n
    return -1


def test_the_error_level_is_split_over_every_comparison_the_race_may_make() -> None:
    # 3 candidates, 2 gates: 6 sequences against the source and 3 between candidates
    assert comparisons(3, 2) == 9 and comparisons(1, 2) == 2 and comparisons(4, 1) == 10
    res = race({"a": _candidate(1, 1, 1), "b": _candidate(1, 1, 1)}, [LATENCY, THROUGHPUT], COST, final=True)
    assert res.comparisons == 5 and math.isclose(res.alpha_each, ALPHA / 5)


def test_a_slow_candidate_fails_its_gate_and_a_pricey_one_is_beaten_on_cost_then_the_best_is_picked() -> None:
    # the slow one stops being measured once out (its traces end there), as in phase 04
    traces = {"slow": _candidate(3.0, 1.0, 0.7, pairs=4), "pricey": _candidate(1.0, 1.0, 1.5, shift=3),
              "best": _candidate(1.0, 1.0, 0.7)}
    res = race(traces, [LATENCY, THROUGHPUT], COST)
    a = ALPHA / 9
    slow, pricey = (next(e for e in res.exits if e.candidate == c) for c in ("slow", "pricey"))
    assert slow.by == "latency_p95_ratio" and "FAIL" in slow.reason
    assert slow.pair == _first_excluding(np.asarray(traces["slow"]["latency_p95_ratio"]), math.log(2.0), above=True,
                                         alpha=a)
    assert slow.lower > 2.0
    # "best" must first have passed both gates; then pricey over best on cost excludes 1
    passed_at = max(_first_excluding(np.asarray(traces["best"]["latency_p95_ratio"]), math.log(2.0), above=False, alpha=a),
                    _first_excluding(np.asarray(traces["best"]["throughput_ratio"]), math.log(0.5), above=True, alpha=a))
    diff = np.asarray(traces["pricey"]["cost_per_accepted_unit"]) - np.asarray(traces["best"]["cost_per_accepted_unit"])
    assert pricey.by == "best"
    assert pricey.pair == max(passed_at, _first_excluding(diff, 0.0, above=True, alpha=a))
    assert pricey.lower > 1.0 and res.pick == "best" and res.survivors == ("best",)
    assert res.standings["best"].estimate < 1 < res.standings["pricey"].estimate


def test_identical_candidates_leave_the_race_undecided_at_the_end_of_the_budget() -> None:
    res = race({"a": _candidate(1, 1, 0.8), "b": _candidate(1, 1, 0.8)}, [LATENCY, THROUGHPUT], COST)
    assert res.pick is None and res.undecided == () and res.survivors == ("a", "b")  # the budget is not spent
    res = race({"a": _candidate(1, 1, 0.8), "b": _candidate(1, 1, 0.8)}, [LATENCY, THROUGHPUT], COST, final=True)
    assert res.pick is None and res.undecided == ("a", "b") and res.exits == ()


def test_a_candidate_that_has_not_passed_the_gates_eliminates_no_one_on_cost() -> None:
    # "cheap" sits on the latency limit (never decided), far cheaper than "good": it cannot beat
    # "good" on cost, and "good" cannot be picked over it at the end: HOLD with both.
    res = race({"cheap": _candidate(2.0, 1.0, 0.3), "good": _candidate(1.0, 1.0, 0.9)}, [LATENCY, THROUGHPUT], COST,
               final=True)
    assert res.exits == () and res.pick is None and res.undecided == ("cheap", "good")
    assert res.passed["good"] == ("latency_p95_ratio", "throughput_ratio") and "latency_p95_ratio" not in res.passed["cheap"]


def test_equal_candidates_are_not_eliminated_on_noise_more_often_than_the_level_allows() -> None:
    # 400 races of three candidates equal on every criterion, Gaussian per-pair noise (the
    # sequences' model), 8 pairs: the share of races that eliminate anyone stays under alpha.
    rng = np.random.default_rng(0)
    eliminated = 0
    for _ in range(400):
        traces = {c: {"latency_p95_ratio": list(rng.normal(0.0, 0.05, 8)),
                      "throughput_ratio": list(rng.normal(0.0, 0.05, 8)),
                      "cost_per_accepted_unit": list(rng.normal(0.0, 0.05, 8))} for c in ("a", "b", "c")}
        eliminated += bool(race(traces, [LATENCY, THROUGHPUT], COST).exits)
    assert eliminated / 400 < ALPHA


# -- phase 04's race judged from candidate views (runbook_lib/phases/compare/race.py) ----------

def _view(name: str, latency: float, throughput: float, cost: float, pairs: int = 8) -> CandidateView:
    """A candidate measured beside the source for ``pairs`` pairs of rounds (source round 2k,
    candidate round 2k + 1): 60 requests a round whose latencies are the source's times
    ``latency`` (with the fixed deviations of NOISE), throughput and USD per accepted unit
    likewise. The source's rows are the same in every view (one shared source)."""
    grid = np.linspace(0.05, 0.15, 60)  # seconds; p95 of a round is np.percentile of these, scaled
    rows, thr = [], []
    costs: dict[str, list[float]] = {"source": [], "target": []}
    for k in range(pairs):
        for side, r, scale, t, c in (("source", 2 * k, 1.0, 100.0, 1e-5),
                                     ("target", 2 * k + 1, latency * math.exp(NOISE[k]),
                                      throughput * 100.0 * math.exp(-NOISE[k]), cost * 1e-5 * math.exp(NOISE[k]))):
            rows += [{"side": side, "round": r, "request": i, "status": "COMPLETED", "total_s": v * scale,
                      "accepted": True} for i, v in enumerate(grid)]
            thr.append({"side": side, "round": r, "throughput_units_per_s": t})
            costs[side].append(c)
    return CandidateView(name=name, samples=pd.DataFrame(rows), throughput=pd.DataFrame(thr), costs=costs,
                         provider="local", quoted_usd_per_hour=0.3, billed_usd_per_hour=None)


def test_phase_04s_race_reads_each_candidates_rounds_and_explains_the_pick(tmp_path) -> None:
    from runbook_lib.evidence.report import race_plot
    from runbook_lib.params import load_params
    from runbook_lib.phases.compare.race import judge_race, table, traces

    mig = load_params(ROOT / "params" / "demo.yaml")  # latency 2.0, throughput 0.5 and a cost ratio of 1 block
    views = [_view("slow", 3.0, 1.0, 0.5), _view("pricey", 1.0, 1.0, 0.8), _view("best", 1.0, 1.0, 0.5)]
    # the traces, computed here from the raw rounds with numpy alone
    grid_p95 = np.percentile(np.linspace(0.05, 0.15, 60), 95)
    want_lat = {}
    for v, lat, cst in zip(views, (3.0, 1.0, 1.0), (0.5, 0.8, 0.5), strict=True):
        got = traces(v)
        want_lat[v.name] = [math.log(np.percentile(np.linspace(0.05, 0.15, 60) * lat * math.exp(d), 95) / grid_p95)
                            for d in NOISE]
        assert np.allclose(got["latency_p95_ratio"], want_lat[v.name])
        assert np.allclose(got["throughput_ratio"], -NOISE)
        assert np.allclose(got["cost_per_accepted_unit"], math.log(cst) + NOISE)
    rec = judge_race(mig, views, final=True)
    # the same as the race itself on those traces, with the blocking gates the params set
    direct = race({v.name: traces(v) for v in views}, [LATENCY, THROUGHPUT,
                                                        Criterion("cost_per_accepted_unit", 1.0, False)],
                  COST, min_pairs=mig.measure.min_rounds, final=True)
    assert rec.pick == direct.pick == "best" and rec.comparisons == comparisons(3, 3) == 12
    by = {e.name: e for e in rec.entries}
    assert (by["slow"].fate, by["slow"].exit_by) == ("eliminated", "latency_p95_ratio")
    assert (by["pricey"].fate, by["pricey"].exit_by) == ("eliminated", "best")
    assert [(e.candidate, e.pair) for e in direct.exits] == [(n, by[n].exit_pair) for n in ("slow", "pricey")]
    assert by["slow"].exit_pair <= by["pricey"].exit_pair < 8  # the slow one leaves first, both early
    # absolute figures: the source's pooled p95 and geometric-mean cost times each ratio
    assert rec.source_p95_s == pytest.approx(grid_p95) and rec.source_usd_per_accepted_unit == pytest.approx(1e-5)
    assert by["best"].usd_per_accepted_unit == pytest.approx(0.5e-5 * math.exp(NOISE.mean()))
    assert by["slow"].p95_s == pytest.approx(grid_p95 * math.exp(np.mean(want_lat["slow"])))
    assert by["best"].usd_lower < by["best"].usd_per_accepted_unit < by["best"].usd_upper
    # the Pareto front of (USD, p95): "slow" is as cheap as "best" but slower, "pricey" as fast but dearer
    assert [e.name for e in rec.entries if e.on_front] == ["best"]
    shown = table(rec)
    assert list(shown["candidate"]) == ["slow", "pricey", "best"]
    assert list(shown["fate"]) == ["eliminated", "eliminated", "picked"]
    assert shown.loc[0, "why"].startswith("latency_p95_ratio FAIL after")
    race_plot(rec, tmp_path / "race.png")
    assert (tmp_path / "race.png").stat().st_size > 10_000
    with pytest.raises(ValueError, match="objective 'speed'"):
        judge_race(mig, views, objective="speed")
    with pytest.raises(ValueError, match="distinct names"):
        judge_race(mig, [views[0], views[0]])


def test_the_pareto_front_keeps_every_point_no_other_beats_on_both() -> None:
    from runbook_lib.phases.compare.race import pareto_front

    points = {"a": (1.0, 3.0), "b": (2.0, 2.0), "c": (3.0, 1.0), "d": (3.0, 3.0), "e": (1.0, 3.0),
              "f": (math.nan, 0.1)}
    assert pareto_front(points) == {"a", "b", "c", "e"}  # d is beaten by b; a tie beats neither; nan is never on it
