"""The sequential gates' confidence sequences (runbook_lib/gates/sequential.py), checked against
the properties their sources state: the sequence is the inverted mixture martingale, it covers
the true mean at every n at once with probability at least 1 - alpha (Ville's inequality), it is
scale-free, and the Bernoulli sequence's bounds match a hand calculation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from runbook_lib.gates import sequential as sq


def test_the_sequence_is_where_the_mixture_martingale_stays_below_one_over_alpha() -> None:
    # At each bound, log B_n(mu) = log(1 / alpha) exactly; inside it is below, outside above.
    x = np.random.default_rng(1).normal(0.3, 0.2, size=8)
    lo, hi = sq.t_confidence_sequence(x)
    assert np.isinf(hi[0]) and np.isinf(hi[1])  # one observation shows no spread; two at c = 0.1 are not enough
    for n in range(3, 9):
        for bound in (lo[n - 1], hi[n - 1]):
            assert sq.lai_log_bayes_factor(x[:n], bound) == pytest.approx(math.log(1 / sq.ALPHA), rel=1e-9)
        mid = x[:n].mean()
        assert sq.lai_log_bayes_factor(x[:n], mid) < math.log(10) < sq.lai_log_bayes_factor(x[:n], hi[n - 1] + 0.01)


def test_it_covers_the_mean_at_every_look_at_once_with_probability_at_least_1_minus_alpha() -> None:
    # Ville's inequality: P(exists n <= 40: mu outside C_n) <= alpha, whatever sigma (the
    # sequence is scale-free). 4,000 Gaussian paths of scales from 0.001 to 1000: the miss rate's
    # 99.9 % Monte Carlo bound stays under alpha, and one side alone misses about half as often.
    rng = np.random.default_rng(7)
    sims, n_max = 4000, 40
    x = rng.normal(0.0, 1.0, size=(sims, n_max)) * rng.uniform(0.001, 1000.0, size=(sims, 1))
    n = np.arange(1, n_max + 1)
    mean = np.cumsum(x, axis=1) / n
    ss = np.maximum(np.cumsum(x * x, axis=1) - n * mean ** 2, 0.0)
    unit = np.array([sq.t_halfwidth(int(k), 1.0) for k in n])
    finite = np.isfinite(unit)
    half = np.full_like(ss, np.inf)
    half[:, finite] = unit[finite] * np.sqrt(ss[:, finite])
    miss = np.abs(mean) > half
    rate = miss.any(axis=1).mean()
    assert rate + 3.3 * math.sqrt(rate * (1 - rate) / sims) <= sq.ALPHA  # its 99.9 % Monte Carlo bound too
    assert (mean - half > 0).any(axis=1).mean() <= sq.ALPHA / 2 + 0.01  # one side: about half of it


def test_the_sequence_is_scale_free_and_centred_on_the_mean() -> None:
    x = np.array([0.12, 0.05, 0.2, 0.08, 0.15])
    lo, hi = sq.t_confidence_sequence(x)
    lo2, hi2 = sq.t_confidence_sequence(1000 * x)
    assert np.allclose(lo2[2:], 1000 * lo[2:]) and np.allclose(hi2[2:], 1000 * hi[2:])
    assert np.allclose((lo[2:] + hi[2:]) / 2, np.cumsum(x)[2:] / np.arange(3, 6))


def test_looks_pass_fail_and_wait_on_the_right_side_of_the_margin() -> None:
    slow = np.log([1.9, 2.1, 2.0, 1.95])  # the target about twice the source
    looks = sq.ratio_looks(slow, threshold=1.1, higher_is_better=False)
    first = sq.decided(looks, min_pairs=2)
    assert first is not None and first.verdict == "FAIL" and first.pairs == 3 and first.lower > 1.1
    fast = np.log([1.0, 0.98, 1.01, 1.0])
    assert sq.decided(sq.ratio_looks(fast, threshold=1.5, higher_is_better=False), 2).verdict == "PASS"
    noisy = np.log([0.8, 1.4, 0.9, 1.3])  # straddles the margin: undecided at every look
    assert sq.decided(sq.ratio_looks(noisy, threshold=1.1, higher_is_better=False), 2) is None
    thr = sq.ratio_looks(np.log([1.2, 1.22, 1.19, 1.21]), threshold=0.95, higher_is_better=True)
    assert sq.decided(thr, 2).verdict == "PASS"  # throughput: higher is better
    assert sq.decided(looks, min_pairs=4).pairs == 4  # not before the minimum


def test_the_bernoulli_sequence_matches_a_hand_calculation_and_covers() -> None:
    # With no failure, M_n(p) = 1 / ((n + 1) (1 - p)^n) (Beta(1, 1) mixture), so the upper bound
    # solves (n + 1)(1 - p)^n = alpha: p = 1 - (alpha / (n + 1))^(1 / n).
    for n in (10, 1000, 100_000):
        lower, upper = sq.bernoulli_sequence(0, n)
        assert lower == 0.0 and upper == pytest.approx(1 - (sq.ALPHA / (n + 1)) ** (1 / n), rel=1e-6)
    lower, upper = sq.bernoulli_sequence(50, 100)
    assert lower < 0.5 < upper and upper - 0.5 == pytest.approx(0.5 - lower, rel=1e-6)  # symmetric at one half
    # Time-uniform coverage at p = 0.01 over 3,000 trials, 2,000 paths.
    rng = np.random.default_rng(3)
    p, n_max, sims = 0.01, 3000, 2000
    k = np.cumsum(rng.random((sims, n_max)) < p, axis=1)
    n = np.arange(1, n_max + 1)
    log_m = special.betaln(1 + k, 1 + n - k) - k * math.log(p) - (n - k) * math.log1p(-p)
    assert (log_m >= math.log(1 / sq.ALPHA)).any(axis=1).mean() <= sq.ALPHA


def test_paired_log_ratios_pair_the_kth_round_of_each_side() -> None:
    assert np.allclose(sq.paired_log_ratios([1.0, 2.0, 4.0], [2.0, 2.0]), np.log([2.0, 1.0]))
