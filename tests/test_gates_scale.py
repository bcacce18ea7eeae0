"""Gates on production-sized measurements: the binned (Poisson) bootstrap against the exact
bootstrap on data small enough for both, and the binning against numpy's own quantiles."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runbook_lib import gates as g


def _rounds(seed: int, n: int, rounds: int, scale: float = 1.0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.lognormal(-2.0, 0.4, n) * scale * (1 + 0.01 * r) for r in range(rounds)]


def test_counts_quantile_by_value_equals_numpy_quantile() -> None:
    rng = np.random.default_rng(3)
    values = rng.integers(1, 60, size=(5, 400)).astype(float) / 1000  # whole milliseconds: few distinct values
    binned = g.bin_rounds(list(values))
    assert binned.rel_error == 0.0
    for q in (0.0, 0.5, 0.95, 0.99, 1.0):
        got = g.counts_quantile(binned.grid, binned.counts, q)
        assert got == pytest.approx([np.quantile(v, q) for v in values], rel=1e-12)
    assert g.counts_mean(binned.grid, binned.counts) == pytest.approx(values.mean(axis=1), rel=1e-12)


def test_log_bins_hold_every_value_within_the_stated_relative_error() -> None:
    rounds = _rounds(4, 3000, 3)
    binned = g.bin_rounds(rounds, max_value_bins=100)
    assert binned.rel_error == pytest.approx(np.sqrt(1 + g.stats.BIN_RELATIVE_WIDTH) - 1)
    assert binned.samples == 9000 and binned.counts.shape == (3, binned.grid.size)
    every = np.sort(np.concatenate(rounds))
    # the quantiles of the binned data are within the bound of numpy's on the raw values
    for q in (0.05, 0.5, 0.95, 0.99):
        exact = np.quantile(every, q)
        approx = g.counts_quantile(binned.grid, binned.counts.sum(axis=0, keepdims=True), q)[0]
        assert abs(approx / exact - 1) <= binned.rel_error * (1 + 1e-9)


def test_bin_rounds_refuses_what_it_cannot_bin() -> None:
    with pytest.raises(ValueError, match="NaN"):
        g.bin_rounds([np.array([1.0, np.nan])])
    with pytest.raises(ValueError, match="positive"):
        g.bin_rounds([np.linspace(-1, 1, 50)], max_value_bins=10)


@pytest.mark.parametrize("slower", [1.0, 1.05, 1.2])
def test_the_binned_bootstrap_agrees_with_the_exact_one(slower: float) -> None:
    src, tgt = _rounds(5, 2500, 4), _rounds(6, 2500, 4, scale=slower)
    exact = g.round_bootstrap((g.as_rounds(src), g.as_rounds(tgt)), lambda s, t: np.percentile(t, 95) / np.percentile(s, 95))
    bs, bt = g.bin_rounds(src, max_value_bins=100), g.bin_rounds(tgt, max_value_bins=100)
    fast = g.binned_bootstrap((bs, bt), lambda s, t: g.counts_quantile(*t, 0.95) / g.counts_quantile(*s, 0.95))
    assert exact is not None and fast is not None
    width = exact[1] - exact[0]
    bound = g.ratio_error_bound(bs.rel_error, bt.rel_error)
    # Two bootstraps of 2,000 resamples: their interval ends differ by Monte-Carlo error (a few
    # per cent of the width) and by the binning bound; a quarter of the width is far beyond both.
    for e, f in zip(exact, fast, strict=True):
        assert abs(e - f) <= 0.25 * width + bound * e


def test_large_measurements_take_the_binned_path_and_keep_their_verdicts() -> None:
    per_round = (g.EXACT_BOOTSTRAP_MAX_SAMPLES // 4) + 1
    src = _rounds(7, per_round, 4)
    same, slower = _rounds(8, per_round, 4), _rounds(9, per_round, 4, scale=1.3)
    ok = g.latency_p95_ratio(src, same, max_ratio=1.10, min_samples=100)
    bad = g.latency_p95_ratio(src, slower, max_ratio=1.10, min_samples=100)
    assert (ok.verdict, bad.verdict) == ("PASS", "FAIL")
    assert "logarithmic bins" in ok.method and "within" in ok.method
    a, b = _rounds(10, g.EXACT_BOOTSTRAP_MAX_SAMPLES // 2 + 1, 2)
    aa = g.noise_floor(a, b, max_ratio=1.10)
    assert aa.verdict == "PASS" and "bins" in aa.method
    accepted = [[(np.arange(per_round) % 50 != 0).astype(float) for _ in range(4)] for _ in range(2)]
    cost = g.cost_per_unit(1.0, 0.8, required_saving=0.0, accepted_rounds=(accepted[0], accepted[1]))
    assert cost.verdict == "PASS" and "no binning error" in cost.method


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), min_size=0, max_size=4), min_size=1, max_size=6))
def test_rounds_are_ordered_by_size_then_values(rounds: list[list[int]]) -> None:
    got = [r.tolist() for r in g.as_rounds([np.array(r, float) for r in rounds])]
    want = sorted((sorted(map(float, r)) for r in rounds if r), key=lambda r: (len(r), r))
    assert got == want
