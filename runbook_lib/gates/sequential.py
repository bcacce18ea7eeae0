"""Anytime-valid gates: confidence sequences that stay valid however often they are looked at and
whenever measuring stops (``gates.method: sequential``).

Rounds stay the unit of dependence, as in the fixed-horizon gates: requests of one round share
the host's state. Phase 04 interleaves rounds S, T, T, S, S, T, T, S, ..., so the k-th source round
and the k-th target round are adjacent: they form pair k, and one pair gives one observation,
the log of a per-round ratio (target p95 over source p95, or target throughput over source
throughput). Alternating the order within pairs (S,T then T,S) turns a linear drift of the host
into alternating signs: it widens the sequence rather than moving it.

The sequence for the mean log ratio is a t confidence sequence for Gaussian observations of
unknown variance: the mixture Bayes factor with a N(0, 1/c) prior on the standardized effect
(mean shift over sigma) and the right-Haar prior d(sigma)/sigma on the scale,

    B_n(mu) = sqrt(c / (n + c)) * ((1 + r) / (1 + r c / (n + c))) ** (n / 2),
    r = n (mean - mu)^2 / SS,   SS = sum of squared deviations from the mean,

is a test martingale under mu in the filtration of the scale-invariant statistics, so by Ville's
inequality P(exists n: B_n(mu) >= 1/alpha) <= alpha, and {mu: B_n(mu) < 1/alpha} is a
(1 - alpha) confidence sequence. Sources: H. Wang and A. Ramdas, "Anytime-valid t-tests and
confidence sequences for Gaussian means with unknown variance", arXiv:2310.03722, 2023 (this is
their test martingale in the reduced filtration: Lai's construction with a Gaussian mixture in
place of his flat one); T. L. Lai, "On confidence sequences", Annals of Statistics 4(2), 1976,
265-280; Ville's inequality as in S. R. Howard, A. Ramdas, J. McAuliffe and J. Sekhon,
"Time-uniform, nonparametric, nonasymptotic confidence sequences", Annals of Statistics 49(2),
2021. Inverting the inequality in closed form (``q = (sqrt(u) / alpha) ** (2 / n)``,
``u = (n + c) / c``): the sequence is ``mean +/- sqrt(R * SS / n)`` with ``R = (q - 1) / (1 - q / u)``
when ``q < u``, and the whole line otherwise (at n = 1 always: one observation shows no spread).

A positive error-rate maximum is judged on a Bernoulli rate with the beta-binomial mixture
martingale (H. Robbins, "Statistical methods related to the law of the iterated logarithm",
Annals of Mathematical Statistics 41(5), 1970).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from runbook_lib.gates.result import Verdict

ALPHA = 0.10
"""Level of every sequence: the fixed-horizon gates' intervals are 90 % two-sided, and a sequence
at alpha = 0.10 errs on either side with probability at most 0.10 over all looks together."""

LAI_C = 0.1
"""Prior precision of the standardized effect in Lai's mixture. Any value fixed before the data
keeps the guarantee; 0.1 gives the narrowest sequence at 3 to 4 pairs (half-widths of about 4.1
and 2.6 sample standard deviations; 0.25 gives 6.4 and 2.5, 0.05 gives 4.1 and 2.7, and below
0.01 the sequence is finite at 2 pairs but 15 deviations wide), where a clear case should stop
(benchmarks/sequential.py)."""


def t_halfwidth(n: int, ss: float, *, alpha: float = ALPHA, c: float = LAI_C) -> float:
    """Half-width of Lai's t confidence sequence after ``n`` observations with sum of squared
    deviations ``ss`` (module docstring); ``inf`` while the sequence is the whole line."""
    if n < 2:
        return math.inf
    u = (n + c) / c
    log_q = (0.5 * math.log(u) - math.log(alpha)) * 2.0 / n
    q = math.exp(log_q)
    if q >= u:
        return math.inf
    big_r = (q - 1.0) / (1.0 - q / u)
    return math.sqrt(big_r * max(ss, 0.0) / n)


def t_confidence_sequence(x: Sequence[float] | np.ndarray, *, alpha: float = ALPHA,
                          c: float = LAI_C) -> tuple[np.ndarray, np.ndarray]:
    """Lai's t confidence sequence for the mean of ``x`` (1-D, float64), after each observation:
    ``(lower, upper)``, each of shape ``(len(x),)``, ``-inf``/``inf`` where it is the whole line.
    Simultaneously over every n, the mean is inside with probability at least ``1 - alpha`` for
    i.i.d. Gaussian observations (module docstring)."""
    a = np.asarray(x, dtype=float)
    lo, hi = np.full(a.size, -np.inf), np.full(a.size, np.inf)
    for n in range(1, a.size + 1):
        head = a[:n]
        mean = float(head.mean())
        w = t_halfwidth(n, float(((head - mean) ** 2).sum()), alpha=alpha, c=c)
        lo[n - 1], hi[n - 1] = mean - w, mean + w
    return lo, hi


def lai_log_bayes_factor(x: Sequence[float] | np.ndarray, mu: float, *, c: float = LAI_C) -> float:
    """``log B_n(mu)`` of the module docstring for all of ``x``: the statistic the sequence
    inverts (``mu`` is outside the sequence exactly when it is ``>= log(1 / alpha)``)."""
    a = np.asarray(x, dtype=float)
    n = a.size
    y = a - mu
    sy, syy = float(y.sum()), float((y ** 2).sum())
    if syy == 0.0:
        return 0.0
    return 0.5 * math.log(c / (n + c)) + 0.5 * n * (math.log(syy) - math.log(syy - sy ** 2 / (n + c)))


@dataclass(frozen=True)
class Look:
    """One look at a sequential gate, after ``pairs`` pairs of rounds.

    Attributes:
        pairs: pairs of rounds seen (also rounds per side).
        estimate: ``exp`` of the mean log ratio (a geometric mean of per-pair ratios).
        lower, upper: the sequence at this look, as ratios (0 and inf while unbounded).
        verdict: PASS when the sequence is wholly on the passing side of the threshold, FAIL
            when wholly on the other, else INCONCLUSIVE.
    """

    pairs: int
    estimate: float
    lower: float
    upper: float
    verdict: Verdict


def ratio_looks(log_ratios: Sequence[float] | np.ndarray, *, threshold: float, higher_is_better: bool,
                alpha: float = ALPHA, c: float = LAI_C) -> list[Look]:
    """Every look at a ratio gate whose observations are per-pair log ratios (1-D float): PASS
    once the sequence is wholly at or below ``threshold`` (a maximum: latency), or wholly at or
    above it when ``higher_is_better`` (a minimum: throughput); FAIL once wholly beyond it."""
    lo, hi = t_confidence_sequence(log_ratios, alpha=alpha, c=c)
    a = np.asarray(log_ratios, dtype=float)
    out = []
    for n in range(1, a.size + 1):
        lower, upper = math.exp(lo[n - 1]), math.exp(hi[n - 1])
        if higher_is_better:
            verdict: Verdict = "PASS" if lower >= threshold else ("FAIL" if upper < threshold else "INCONCLUSIVE")
        else:
            verdict = "PASS" if upper <= threshold else ("FAIL" if lower > threshold else "INCONCLUSIVE")
        out.append(Look(n, math.exp(float(a[:n].mean())), lower, upper, verdict))
    return out


def decided(looks: list[Look], min_pairs: int) -> Look | None:
    """The first look at or after ``min_pairs`` with a PASS or FAIL: the gate's decision, which
    later looks do not change (the sequence was valid at that stopping time). None: undecided."""
    return next((lk for lk in looks if lk.pairs >= min_pairs and lk.verdict != "INCONCLUSIVE"), None)


def paired_log_ratios(source: Sequence[float], target: Sequence[float]) -> np.ndarray:
    """``log(target[k] / source[k])`` for each pair k both sides have (per-round values, in round
    order; positive floats). Shape ``(min(len(source), len(target)),)``."""
    n = min(len(source), len(target))
    s, t = np.asarray(source[:n], dtype=float), np.asarray(target[:n], dtype=float)
    out: np.ndarray = np.log(t) - np.log(s)
    return out


def bernoulli_log_mixture(failures: int, n: int, p: float, *, a: float = 1.0, b: float = 1.0) -> float:
    """Log of the beta-binomial mixture martingale for a Bernoulli rate ``p`` after ``failures``
    in ``n`` trials, with a Beta(``a``, ``b``) mixing prior (Robbins 1970): ``log B(a + k, b + n - k)
    - log B(a, b) - k log p - (n - k) log(1 - p)``."""
    # imported on first use: most phase kernels never need scipy, and its import delays each start
    from scipy import special

    k = failures
    if not 0.0 < p < 1.0:
        return math.inf
    return float(special.betaln(a + k, b + n - k) - special.betaln(a, b) - k * math.log(p) - (n - k) * math.log1p(-p))


def bernoulli_sequence(failures: int, n: int, *, alpha: float = ALPHA) -> tuple[float, float]:
    """The ``(lower, upper)`` bounds of the Bernoulli rate's confidence sequence after ``failures``
    in ``n`` trials: the rates whose mixture martingale is below ``1 / alpha``. (0, 1) when n = 0."""
    from scipy import optimize  # on first use, as in bernoulli_log_mixture

    if n == 0:
        return 0.0, 1.0
    limit = math.log(1.0 / alpha)
    centre = min(max(failures / n, 1e-12), 1 - 1e-12)

    def f(p: float) -> float:
        return bernoulli_log_mixture(failures, n, p) - limit

    lower = 0.0 if f(1e-15) < 0 else float(optimize.brentq(f, 1e-15, centre)) if f(centre) < 0 else centre
    upper = 1.0 if f(1 - 1e-15) < 0 else float(optimize.brentq(f, centre, 1 - 1e-15)) if f(centre) < 0 else centre
    return lower, upper
