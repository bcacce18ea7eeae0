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
    try:
        res = stats.bootstrap(samples, statistic, n_resamples=BOOTSTRAP_RESAMPLES, confidence_level=BOOTSTRAP_CONFIDENCE,
                              method="percentile", vectorized=True, paired=False, random_state=0)
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
