"""Interval estimates the gates share: seeded percentile bootstraps, over single observations
(scipy.stats.bootstrap) and over rounds (a two-stage block bootstrap). Samples are put in a
canonical order first, so no verdict depends on the order measurements arrived in."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

BOOTSTRAP_RESAMPLES = 2000

BOOTSTRAP_CONFIDENCE = 0.90  # two-sided; its upper/lower end is a one-sided 95 % bound

BOOTSTRAP_SEED = 0  # numpy.random.default_rng seed of every bootstrap: verdicts are reproducible

BOOTSTRAP_MAX_VALUES = 10_000_000  # resampled values held at once (80 MB of float64, plus indices)

MIN_ROUNDS_PER_SIDE = 2  # a block bootstrap needs at least two rounds to see between-round variation


def bootstrap_interval(samples: tuple[np.ndarray, ...], statistic: Any) -> tuple[float, float] | None:
    """Percentile bootstrap interval (scipy.stats.bootstrap, seeded). Samples are sorted first, so
    the interval, and every verdict built on it, does not depend on the order samples arrived in.

    Args:
        samples: one 1-D array per sample.
        statistic: ``statistic(*samples, axis=-1)``, vectorized as scipy.stats.bootstrap's
            ``vectorized=True`` asks: it reduces the last axis, so all resamples are computed in
            one call (the resamples drawn, and so the interval, are those of a per-resample loop).
    """
    from scipy import stats

    samples = tuple(np.sort(np.asarray(x, dtype=float)) for x in samples)
    values = sum(x.size for x in samples)
    # All resamples in one call while they fit in BOOTSTRAP_MAX_VALUES; beyond it, in batches
    # that do (scipy then draws them batch by batch: a different, still seeded, set of resamples).
    batch = None if values * BOOTSTRAP_RESAMPLES <= BOOTSTRAP_MAX_VALUES else max(1, BOOTSTRAP_MAX_VALUES // values)
    try:
        res = stats.bootstrap(samples, statistic, n_resamples=BOOTSTRAP_RESAMPLES, confidence_level=BOOTSTRAP_CONFIDENCE,
                              method="percentile", vectorized=True, paired=False, random_state=0, batch=batch)
    except ValueError:
        return None
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) else None


def as_rounds(x: Any) -> list[np.ndarray]:
    """Per-round samples in a canonical order: each round sorted, empty rounds dropped, rounds
    ordered by (size, values), so nothing built on them depends on the order samples or rounds
    arrived in. A 1-D numeric array is one round.

    Args:
        x: a sequence of per-round arrays (seconds), or one 1-D array.
    """
    if isinstance(x, np.ndarray) and x.ndim == 1:
        x = [x]
    arrs = [np.sort(np.asarray(r, dtype=float).ravel()) for r in x]
    return sorted((a for a in arrs if a.size), key=lambda a: (a.size, a.tolist()))


def _resample_rounds(rounds: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """One two-stage resample of a side: draw as many rounds as there are, with replacement; then,
    within each drawn round, as many requests as it holds, with replacement; pool them."""
    picks = rng.integers(0, len(rounds), size=len(rounds))
    return np.concatenate([rounds[i][rng.integers(0, rounds[i].size, size=rounds[i].size)] for i in picks])


def round_bootstrap(sides: Sequence[list[np.ndarray]], statistic: Any, *, n_resamples: int = BOOTSTRAP_RESAMPLES,
                    confidence: float = BOOTSTRAP_CONFIDENCE, seed: int = BOOTSTRAP_SEED) -> tuple[float, float] | None:
    """Percentile interval of ``statistic(*pooled_sides)`` under a hierarchical block bootstrap:
    each side is resampled independently, rounds first and then requests within each drawn round
    (the two-stage bootstrap for clustered data; Davison & Hinkley, *Bootstrap Methods and their
    Application*, 1997, section 3.8). scipy.stats.bootstrap resamples single observations only,
    so this is numpy with a fixed seed.

    Args:
        sides: per side, its rounds as from :func:`as_rounds` (each non-empty).
        statistic: function of one pooled 1-D array per side, returning a float.
        n_resamples: bootstrap resamples.
        confidence: two-sided level of the interval.

    Returns:
        ``(low, high)``, or None when a side has no rounds or the statistic is not finite.
    """
    if any(not rounds for rounds in sides):
        return None
    rng = np.random.default_rng(seed)
    stats_ = np.array([statistic(*(_resample_rounds(r, rng) for r in sides)) for _ in range(n_resamples)], float)
    if not np.all(np.isfinite(stats_)):
        return None
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(stats_, [alpha, 1 - alpha])
    return float(lo), float(hi)


HL_DIRECT_PAIRS = 4_000_000
"""Up to this many pairs the Hodges-Lehmann shift is the median of the full difference matrix
(32 MB of float64); above it, :func:`hodges_lehmann_shift` selects the median without the matrix."""


def _pairs_at_most(x: np.ndarray, y: np.ndarray, d: float) -> int:
    """Pairs ``(i, j)`` with ``y[j] - x[i] <= d``, for sorted ``x``: ``x[i] >= y[j] - d``."""
    return int(x.size * y.size - np.searchsorted(x, y - d, side="left").sum())


def _kth_difference(x: np.ndarray, y: np.ndarray, k: int) -> float:
    """The ``k``-th smallest (0-based) of the ``x.size * y.size`` differences ``y[j] - x[i]``
    (``x`` sorted), found without building them all: bisect on the value until the bracket
    ``(lo, hi]`` holds at most ``4 * (x.size + y.size)`` differences, then list just those and
    select (Monahan's approach to the Hodges-Lehmann estimate, ACM TOMS 10(3), 1984, 265-270, in
    a simpler bisecting form). Cost O((n + m) log n) per step, about 30-60 steps."""
    lo, hi = float(y[0] - x[-1]) - 1.0, float(y[-1] - x[0])  # every difference is in (lo, hi]
    below, upto = 0, x.size * y.size  # differences <= lo, <= hi
    budget = 4 * (x.size + y.size)
    while upto - below > budget:
        mid = lo + (hi - lo) / 2
        if mid in (lo, hi):  # adjacent floats: the differences left in the bracket are ties
            break
        at_mid = _pairs_at_most(x, y, mid)
        if at_mid > k:
            hi, upto = mid, at_mid
        else:
            lo, below = mid, at_mid
    start = np.searchsorted(x, y - hi, side="left")  # x[i] >= y[j] - hi  <=>  difference <= hi
    stop = np.searchsorted(x, y - lo, side="left")  # x[i] <  y[j] - lo  <=>  difference >  lo
    counts = stop - start
    if upto - below > budget:  # a bracket of ties: any one of them is the answer, as computed
        j = int(np.flatnonzero(counts)[0])
        return float(y[j] - x[start[j]])
    rows = np.repeat(np.arange(y.size), counts)
    cols = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts) + np.repeat(start, counts)
    diffs = y[rows] - x[cols]
    return float(np.partition(diffs, k - below)[k - below])


def hodges_lehmann_shift(target: np.ndarray, source: np.ndarray) -> float:
    """The Hodges-Lehmann estimate of the shift from ``source`` to ``target``: the median of all
    ``target[j] - source[i]`` (Hodges & Lehmann, Ann. Math. Statist. 34, 1963, 598-611), in the
    samples' unit. Exact: the full matrix for up to :data:`HL_DIRECT_PAIRS` pairs, else a
    selection that never builds it (:func:`_kth_difference`), so a million samples a side take
    seconds and megabytes, not terabytes.

    Args:
        target, source: 1-D float arrays, each non-empty.
    """
    x = np.sort(np.asarray(source, dtype=float).ravel())
    y = np.sort(np.asarray(target, dtype=float).ravel())
    total = x.size * y.size
    if total <= HL_DIRECT_PAIRS:
        return float(np.median(np.subtract.outer(y, x)))
    if total % 2:
        return _kth_difference(x, y, total // 2)
    return (_kth_difference(x, y, total // 2 - 1) + _kth_difference(x, y, total // 2)) / 2
