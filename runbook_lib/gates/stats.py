"""Interval estimates the gates share: seeded percentile bootstraps, over single observations
(scipy.stats.bootstrap) and over rounds (a two-stage block bootstrap). Samples are put in a
canonical order first, so no verdict depends on the order measurements arrived in."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
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
    return sorted((a for a in arrs if a.size), key=functools.cmp_to_key(_compare_rounds))


def _compare_rounds(a: np.ndarray, b: np.ndarray) -> int:
    """Order of two sorted rounds: by size, then by their values in order (lexicographic), as
    ``(a.size, a.tolist())`` would order them, without building Python lists of every value."""
    if a.size != b.size:
        return -1 if a.size < b.size else 1
    differ = np.flatnonzero(a != b)
    if not differ.size:
        return 0
    i = int(differ[0])
    return -1 if a[i] < b[i] else 1


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
    ``(lo, hi]`` holds at most ``min(4 * (n + m), HL_DIRECT_PAIRS)`` differences, then list just those and
    select (Monahan's approach to the Hodges-Lehmann estimate, ACM TOMS 10(3), 1984, 265-270, in
    a simpler bisecting form). Cost O((n + m) log n) per step, about 30-60 steps."""
    lo, hi = float(y[0] - x[-1]) - 1.0, float(y[-1] - x[0])  # every difference is in (lo, hi]
    below, upto = 0, x.size * y.size  # differences <= lo, <= hi
    budget = min(4 * (x.size + y.size), HL_DIRECT_PAIRS)  # differences listed at the end: memory stays bounded
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


EXACT_BOOTSTRAP_MAX_SAMPLES = 50_000
"""Up to this many samples (both sides together) a bootstrap draws every sample again; above it
the gates use :func:`binned_bootstrap`, whose cost grows with the number of occupied bins, not
with the number of samples."""

BIN_RELATIVE_WIDTH = 0.002
"""Width of a logarithmic bin, relative (a bin spans ``[v, v * 1.002)``): every value binned this
way is represented by its bin's geometric midpoint, within ``sqrt(1.002) - 1`` (0.1 %) of it."""

MAX_VALUE_BINS = 4096
"""Data with at most this many distinct values (accepted flags, whole-millisecond timings) are
binned by value: no binning error at all."""

BINNED_BATCH_VALUES = 2_000_000
"""Resampled counts held at once by :func:`binned_bootstrap` (16 MB of int64 per array)."""


@dataclass(frozen=True)
class Binned:
    """One side's samples as counts per round over a shared grid of values.

    Attributes:
        grid: representative value of each occupied bin, ascending, shape ``(K,)``, float64, in the
            samples' unit.
        counts: samples per round and bin, shape ``(R, K)``, int64.
        rel_error: largest relative distance between a sample and its bin's representative (0.0
            when binned by value).
    """

    grid: np.ndarray
    counts: np.ndarray
    rel_error: float

    @property
    def samples(self) -> int:
        return int(self.counts.sum())


def bin_rounds(rounds: Sequence[np.ndarray], *, rel_width: float = BIN_RELATIVE_WIDTH,
               max_value_bins: int = MAX_VALUE_BINS) -> Binned:
    """Counts per round over a grid: the distinct values themselves when there are at most
    ``max_value_bins`` of them (exact), else logarithmic bins of relative width ``rel_width``
    (positive data only), each represented by its geometric midpoint. The bins are those of an
    HdrHistogram-style log-linear histogram with one sub-bucket per bin (Tene, HdrHistogram,
    https://hdrhistogram.github.io/HdrHistogram/; DDSketch, Masson et al., VLDB 12(12), 2019, uses
    the same log bins and the same relative-error argument).

    Args:
        rounds: per-round 1-D float arrays (seconds, or any positive unit), at least one value in all.

    Raises:
        ValueError: no values, a non-finite value, or more distinct values than ``max_value_bins``
            with one of them <= 0 (logarithmic bins need positive data).
    """
    arrs = [np.asarray(r, dtype=float).ravel() for r in rounds]
    every = np.concatenate(arrs) if arrs else np.array([])
    if not every.size or not np.all(np.isfinite(every)):
        raise ValueError(f"cannot bin {every.size} values (empty, or a NaN/inf among them)")
    distinct = np.unique(every)
    if distinct.size <= max_value_bins:
        counts = np.stack([np.bincount(np.searchsorted(distinct, a), minlength=distinct.size) for a in arrs])
        return Binned(distinct, counts.astype(np.int64), 0.0)
    if distinct[0] <= 0:
        raise ValueError(f"{distinct.size} distinct values including {distinct[0]} <= 0: logarithmic bins need "
                         "positive values")
    step = math.log1p(rel_width)
    lo = math.log(float(distinct[0]))
    index = [np.floor((np.log(a) - lo) / step).astype(np.int64) for a in arrs]
    occupied = np.unique(np.concatenate(index))
    grid = np.exp(lo + (occupied + 0.5) * step)
    counts = np.stack([np.bincount(np.searchsorted(occupied, i), minlength=occupied.size) for i in index])
    return Binned(grid, counts.astype(np.int64), math.sqrt(1 + rel_width) - 1)


def counts_quantile(grid: np.ndarray, counts: np.ndarray, q: float) -> np.ndarray:
    """The ``q``-quantile (0..1) of each row of ``counts`` over ``grid``, as ``numpy.quantile``'s
    default (linear) method would give for the values those counts stand for.

    Args:
        grid: ``(K,)`` ascending values.
        counts: ``(B, K)`` non-negative counts, each row with at least one.

    Returns:
        ``(B,)`` float64; NaN for a row with no count.
    """
    cum = np.cumsum(counts, axis=1)
    total = cum[:, -1]
    h = (total - 1) * q
    k0 = np.floor(h)
    k1 = np.minimum(k0 + 1, total - 1)
    i0 = np.minimum((cum <= k0[:, None]).sum(axis=1), grid.size - 1)
    i1 = np.minimum((cum <= k1[:, None]).sum(axis=1), grid.size - 1)
    out = grid[i0] + (h - k0) * (grid[i1] - grid[i0])
    return np.where(total > 0, out, np.nan)


def counts_mean(grid: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Mean of each row of ``counts`` over ``grid``: ``(B, K)`` counts -> ``(B,)`` (NaN for an empty row)."""
    total = counts.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray((counts @ grid) / total)


def binned_bootstrap(sides: Sequence[Binned], statistic: Any, *, n_resamples: int = BOOTSTRAP_RESAMPLES,
                     confidence: float = BOOTSTRAP_CONFIDENCE, seed: int = BOOTSTRAP_SEED,
                     batch_values: int = BINNED_BATCH_VALUES) -> tuple[float, float] | None:
    """Percentile interval of ``statistic`` under the two-stage bootstrap of :func:`round_bootstrap`
    (rounds with replacement, then requests within each drawn round), drawn on counts: within a
    drawn round every sample gets a Poisson(1) weight, so a bin holding ``c`` samples is drawn as
    Poisson(``c``) (the Poisson bootstrap; Hanley & MacGibbon, Comput. Methods Programs Biomed.
    83(1), 2006, 57-62; Chamandy et al., "Estimating uncertainty for massive data streams", Google,
    2012). Cost: rounds x resamples x occupied bins, whatever the number of samples.

    Args:
        sides: per side, its :class:`Binned` rounds.
        statistic: ``statistic(*((grid, counts) per side))`` with ``counts`` of shape ``(b, K)``
            (one resample per row), returning ``(b,)`` values.
        batch_values: resampled counts held at once (bounds memory).

    Returns:
        ``(low, high)``, or None when a side has no rounds or a statistic is not finite.
    """
    if any(s.counts.shape[0] == 0 for s in sides):
        return None
    rng = np.random.default_rng(seed)
    widest = max(s.counts.shape[1] for s in sides)
    batch = max(1, batch_values // widest)
    values: list[np.ndarray] = []
    for start in range(0, n_resamples, batch):
        b = min(batch, n_resamples - start)
        drawn = []
        for s in sides:
            rounds = s.counts.shape[0]
            pooled = np.zeros((b, s.grid.size), dtype=np.int64)
            for _ in range(rounds):  # one slot per round of the side, each filled by a drawn round
                pooled += rng.poisson(s.counts[rng.integers(0, rounds, size=b)])
            drawn.append((s.grid, pooled))
        values.append(np.asarray(statistic(*drawn), dtype=float))
    stats_ = np.concatenate(values)
    if not np.all(np.isfinite(stats_)):
        return None
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(stats_, [alpha, 1 - alpha])
    return float(lo), float(hi)


def ratio_error_bound(*rel_errors: float) -> float:
    """Relative error bound of a ratio of two binned statistics whose values are each within
    ``rel_error`` of the exact ones: ``(1 + e1) / (1 - e2) - 1`` with the larger error for both."""
    e = max(rel_errors, default=0.0)
    return (1 + e) / (1 - e) - 1
