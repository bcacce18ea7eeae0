"""A race of target candidates against one source baseline: each candidate eliminated as soon as
it confidently fails a blocking gate, or is confidently worse than a candidate that passes them
on the declared objective; the pick is the last one standing. When the budget ends with several,
none was confidently better than every other on the objective (it would have eliminated them at
the last look), so there is no pick: HOLD, naming them.

Observations are per pair of rounds, as in :mod:`runbook_lib.gates.sequential`: for candidate c
and criterion q (a blocking gate's ratio: the latency p95 ratio, the throughput ratio; or the
objective, USD per accepted unit), ``x[c][q][k] = log(value of c's round in pair k / value of the
source's round in pair k)``. Against the source, candidate c fails gate q once the t confidence
sequence of ``x[c][q]`` lies wholly beyond the gate's threshold, and passes it once it lies
wholly on the passing side. Between candidates i and j, ``x[i][obj][k] - x[j][obj][k]`` is the
log ratio of their objectives in pair k (the source's round cancels); i is worse once that
difference's sequence lies wholly on the worse side of 0. A candidate eliminates another on the
objective only when it has itself passed every blocking gate: the objective is compared subject
to the gates, never traded against them.

The error level is split over every comparison the race may make with the Bonferroni correction
(C. E. Bonferroni, 1936; O. J. Dunn, "Multiple comparisons among means", Journal of the American
Statistical Association 56(293), 1961, 52-64): with K candidates and G gate criteria there are
K x G sequences against the source and K (K - 1) / 2 pairwise ones, m in all, and each sequence
runs at level ``alpha / m``. Each is a confidence sequence, valid at every look and at any
stopping time (Ville's inequality), so by the union bound all m hold simultaneously over the
whole race with probability at least ``1 - alpha``, whatever their dependence (they share the
source's rounds). Eliminating as soon as the evidence is conclusive is racing in the spirit of
O. Maron and A. W. Moore, "Hoeffding races: accelerating model selection search for
classification and function approximation", Advances in Neural Information Processing Systems 6,
1994, with anytime-valid t sequences (Wang and Ramdas 2023, as in :mod:`.sequential`) in place
of Hoeffding's bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from runbook_lib.gates.sequential import ALPHA, LAI_C, t_halfwidth


@dataclass(frozen=True)
class Criterion:
    """One ratio the race judges every candidate on against the source.

    Attributes:
        name: the gate's name (``latency_p95_ratio``), or the objective's.
        threshold: the gate's limit as a ratio (target over source); None for the objective.
        higher_is_better: True for a minimum (throughput), False for a maximum (latency, cost).
    """

    name: str
    threshold: float | None
    higher_is_better: bool


@dataclass(frozen=True)
class Exit:
    """One elimination: ``candidate`` left the race after ``pair`` pairs, ``by`` a gate's name or
    the candidate that beat it, with the decisive sequence as a ratio (``lower``, ``upper``) and
    the sentence the evidence shows."""

    candidate: str
    pair: int
    by: str
    lower: float
    upper: float
    reason: str


@dataclass(frozen=True)
class Standing:
    """A candidate's objective ratio against the source after its last pair: the geometric mean
    ``estimate`` and the sequence ``lower`` .. ``upper`` at the race's level (0 and inf while
    unbounded), over ``pairs`` pairs."""

    pairs: int
    estimate: float
    lower: float
    upper: float


@dataclass(frozen=True)
class RaceResult:
    """Where the race stands.

    Attributes:
        candidates: every candidate, in the order given.
        comparisons: m, the sequences the error level is split over.
        alpha_each: ``alpha / comparisons``, the level of each sequence.
        exits: the eliminations, in the order they happened.
        survivors: the candidates still in the race.
        pick: the winner, or None.
        undecided: at the end of the budget without a pick, the survivors none beat.
        standings: each candidate's objective against the source, by name.
        passed: each candidate's gates it has confidently passed, by name.
    """

    candidates: tuple[str, ...]
    comparisons: int
    alpha_each: float
    exits: tuple[Exit, ...]
    survivors: tuple[str, ...]
    pick: str | None
    undecided: tuple[str, ...]
    standings: dict[str, Standing] = field(default_factory=dict)
    passed: dict[str, tuple[str, ...]] = field(default_factory=dict)


def comparisons(k: int, gates: int) -> int:
    """m of the Bonferroni split: ``k * gates`` sequences against the source plus ``k (k - 1) / 2``
    between candidates (module docstring)."""
    return k * gates + k * (k - 1) // 2


def log_sequence(x: np.ndarray, alpha: float) -> tuple[float, float, float]:
    """(mean, lower, upper) of the t confidence sequence at level ``alpha`` for the mean of the
    log ratios ``x`` (1-D floats); (nan, -inf, inf) for none."""
    n = x.size
    if n == 0:
        return math.nan, -math.inf, math.inf
    mean = float(x.mean())
    w = t_halfwidth(n, float(((x - mean) ** 2).sum()), alpha=alpha, c=LAI_C)
    return mean, mean - w, mean + w


def as_ratio(v: float) -> float:
    """A log ratio as a ratio, with -inf and inf as 0 and inf."""
    return 0.0 if v == -math.inf else math.inf if v == math.inf else math.exp(v)


def _gate_look(x: np.ndarray, q: Criterion, alpha: float) -> tuple[str, float, float]:
    """``PASS``, ``FAIL`` or ``INCONCLUSIVE`` for gate ``q`` on log ratios ``x``, with the sequence
    as ratios."""
    assert q.threshold is not None
    _, lo, hi = log_sequence(x, alpha)
    t = math.log(q.threshold)
    if q.higher_is_better:
        verdict = "PASS" if lo >= t else "FAIL" if hi < t else "INCONCLUSIVE"
    else:
        verdict = "PASS" if hi <= t else "FAIL" if lo > t else "INCONCLUSIVE"
    return verdict, as_ratio(lo), as_ratio(hi)


def race(traces: Mapping[str, Mapping[str, Sequence[float] | np.ndarray]], criteria: Sequence[Criterion], objective: Criterion, *,
         min_pairs: int = 2, final: bool = False, alpha: float = ALPHA) -> RaceResult:
    """Replay the race over ``traces`` look by look and say where it stands after the last pair.

    Args:
        traces: candidate -> criterion name -> per-pair log ratios against the source (1-D
            float sequences, pair order; a candidate's traces end where it stopped being measured).
            Every criterion of ``criteria`` and the objective must be present for each candidate.
        criteria: the blocking gates judged against the source (each with a threshold).
        objective: what the pick minimises or maximises (``threshold`` None).
        min_pairs: no look eliminates before this many pairs (``measure.min_rounds``).
        final: the budget is spent: pick among several survivors, or name them undecided.
        alpha: the race's error level, split over :func:`comparisons`.

    Returns:
        The :class:`RaceResult`; the same traces always give the same result, so a run's race is
        derived again from its samples by ``runbook verify --recompute``.

    Raises:
        ValueError: a candidate lacks a criterion's trace, or a gate criterion has no threshold.
    """
    names = tuple(traces)
    gates = [q for q in criteria if q.threshold is not None]
    if len(gates) != len(criteria):
        raise ValueError("every gate criterion of a race needs its threshold")
    for c in names:
        missing = [q.name for q in (*criteria, objective) if q.name not in traces[c]]
        if missing:
            raise ValueError(f"candidate {c!r} has no trace for {missing}")
    m = comparisons(len(names), len(gates))
    a = alpha / max(m, 1)
    x = {c: {q: np.asarray(v, dtype=float) for q, v in traces[c].items()} for c in names}
    alive = list(names)
    exits: list[Exit] = []
    passed: dict[str, tuple[str, ...]] = {c: () for c in names}
    longest = max((x[c][objective.name].size for c in names), default=0)
    for n in range(min_pairs, longest + 1):
        for c in list(alive):  # a blocking gate confidently failed
            if x[c][objective.name].size < n:
                continue
            looks = {q.name: _gate_look(x[c][q.name][:n], q, a) for q in gates}
            passed[c] = tuple(q for q, lk in looks.items() if lk[0] == "PASS")
            failed = next(((q, lk) for q, lk in looks.items() if lk[0] == "FAIL"), None)
            if failed is not None:
                q, (_, lo, hi) = failed
                crit = next(g for g in gates if g.name == q)
                exits.append(Exit(c, n, q, lo, hi, f"{q} FAIL after {n} pairs: [{lo:.3f}, {hi:.3f}] is wholly "
                                                   f"{'below' if crit.higher_is_better else 'above'} {crit.threshold:g}"))
                alive.remove(c)
        for c in list(alive):  # confidently worse than a candidate that passed every gate
            beaten = _beaten(x, c, [o for o in alive if o != c and len(passed[o]) == len(gates)], objective, n, a)
            if beaten is not None:
                exits.append(beaten)
                alive.remove(c)
    standings = {}
    for c in names:
        v = x[c][objective.name]
        mean, lo, hi = log_sequence(v, a)
        standings[c] = Standing(int(v.size), as_ratio(mean) if v.size else math.nan, as_ratio(lo), as_ratio(hi))
    pick, undecided = _pick(alive, final)
    return RaceResult(candidates=names, comparisons=m, alpha_each=a, exits=tuple(exits), survivors=tuple(alive),
                      pick=pick, undecided=undecided, standings=standings, passed=passed)


def _beaten(x: Mapping[str, Mapping[str, np.ndarray]], c: str, rivals: Sequence[str], objective: Criterion, n: int,
            alpha: float) -> Exit | None:
    """The elimination of ``c`` at look ``n`` by the first of ``rivals`` (candidates that passed
    every gate) it is confidently worse than on the objective, over the pairs both measured; None."""
    for other in rivals:
        k = min(n, x[c][objective.name].size, x[other][objective.name].size)
        if k < n:
            continue
        _, lo, hi = log_sequence(x[c][objective.name][:k] - x[other][objective.name][:k], alpha)
        if hi < 0 if objective.higher_is_better else lo > 0:
            return Exit(c, n, other, as_ratio(lo), as_ratio(hi),
                        f"{objective.name} after {n} pairs: {c} over {other} is [{as_ratio(lo):.3f}, {as_ratio(hi):.3f}], "
                        f"wholly {'below' if objective.higher_is_better else 'above'} 1")
    return None


def _pick(alive: list[str], final: bool) -> tuple[str | None, tuple[str, ...]]:
    """The last one standing is the pick. Several survivors when the budget is spent (``final``)
    are undecided: none is confidently better than every other (that would have eliminated them
    at the last look), so the race HOLDs naming them."""
    if len(alive) == 1:
        return alive[0], ()
    return None, tuple(alive) if final else ()
