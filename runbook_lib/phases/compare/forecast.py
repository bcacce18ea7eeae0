"""The savings forecast of an inference migration (receipt and report): each side's monthly cost
at the declared traffic, the saving with its interval from the measured rounds, and the traffic
at which the two sides' costs per accepted unit cross (the break-even).

Every figure is :func:`runbook_lib.measure.cost.at_traffic`'s, as the cost gate's: warm workers bill
busy or idle, the others only while busy; a month is :data:`runbook_lib.measure.cost.HOURS_PER_MONTH`
hours. The saving's interval is a 90 % percentile bootstrap over rounds of each side's measured
saturation throughput (the capacity the costs depend on; :func:`runbook_lib.gates.stats.bootstrap_interval`).
"""

from __future__ import annotations

import math

import numpy as np

from runbook_lib.evidence.records import SavingsForecast
from runbook_lib.gates.stats import bootstrap_interval
from runbook_lib.measure import cost

BREAK_EVEN_GRID = 400
"""Points of the geometric traffic grid searched for a sign change of the cost difference, from a
thousandth of the declared traffic to the most both sides can serve (then refined by Brent's method)."""


def _unit_cost(terms: cost.ServingTerms, traffic: float, capacity: float) -> float:
    return terms.at(traffic, capacity).usd_per_accepted_unit


def break_even(source: tuple[cost.ServingTerms, float], target: tuple[cost.ServingTerms, float],
               declared_per_s: float) -> float | None:
    """The traffic (requests per second) nearest ``declared_per_s`` at which the two sides' costs
    per accepted unit are equal, within what both can serve; None when one side is cheaper at
    every such traffic. ``source``/``target``: (:func:`~runbook_lib.phases.compare.judge.traffic_terms`'
    terms, capacity in requests per second)."""
    top = min(source[1], target[1])
    if top <= 0:
        return None

    from scipy import optimize  # on first use: a kernel that never forecasts never pays scipy's import

    def diff(x: float) -> float:
        return _unit_cost(target[0], x, target[1]) - _unit_cost(source[0], x, source[1])

    grid = np.geomspace(min(declared_per_s, top) / 1000.0, top, BREAK_EVEN_GRID)
    values = np.array([diff(float(x)) for x in grid])
    crossings = []
    for i in range(len(grid) - 1):
        a, b = values[i], values[i + 1]
        if a == 0:
            crossings.append(float(grid[i]))
        elif a * b < 0:
            crossings.append(float(optimize.brentq(diff, float(grid[i]), float(grid[i + 1]), xtol=1e-9)))
    if values[-1] == 0:
        crossings.append(float(grid[-1]))
    return min(crossings, key=lambda x: abs(math.log(x / declared_per_s))) if crossings else None


def forecast(source: tuple[cost.ServingTerms, np.ndarray], target: tuple[cost.ServingTerms, np.ndarray],
             declared_per_s: float) -> SavingsForecast:
    """The forecast at ``declared_per_s`` requests per second. ``source``/``target``: (the
    side's :func:`~runbook_lib.phases.compare.judge.traffic_terms` terms, its per-round saturation
    throughputs in requests per second, shape ``(rounds,)``)."""
    caps = {"source": float(np.mean(source[1])), "target": float(np.mean(target[1]))}
    at = {side: terms.at(declared_per_s, caps[side]) for side, (terms, _) in (("source", source), ("target", target))}

    def saving(cap_s: np.ndarray, cap_t: np.ndarray, axis: int = -1) -> np.ndarray:
        ms, mt = np.mean(cap_s, axis=axis), np.mean(cap_t, axis=axis)
        out: np.ndarray = np.vectorize(lambda a, b: 1.0 - _unit_cost(target[0], declared_per_s, b)
                                       / _unit_cost(source[0], declared_per_s, a))(ms, mt)
        return out

    fraction = 1.0 - at["target"].usd_per_accepted_unit / at["source"].usd_per_accepted_unit
    interval = bootstrap_interval((source[1], target[1]), saving) if min(source[1].size, target[1].size) >= 2 else None
    even = break_even((source[0], caps["source"]), (target[0], caps["target"]), declared_per_s)
    monthly = {side: at[side].usd_per_hour * cost.HOURS_PER_MONTH for side in at}
    return SavingsForecast(
        traffic_per_s=declared_per_s, source_usd_per_month=monthly["source"], target_usd_per_month=monthly["target"],
        saving_usd_per_month=monthly["source"] - monthly["target"],
        saving_fraction=fraction if math.isfinite(fraction) else None, saving_interval=interval,
        cheaper_at_traffic="target" if fraction > 0 else "source" if fraction < 0 else "neither",
        break_even_per_s=even)
