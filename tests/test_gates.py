"""Gates: known answers from independent sources (torch.testing, hand calculation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from runbook_lib import cost, gates as g


@pytest.mark.parametrize("scale", [0.0, 1e-7, 5e-6, 1e-4, 1e-2])
def test_output_parity_agrees_with_torch_testing(scale: float) -> None:
    rng = np.random.default_rng(1)
    ref = rng.normal(size=(32, 384)).astype(np.float32)
    obs = (ref + rng.normal(scale=scale, size=ref.shape)).astype(np.float32)
    try:
        torch.testing.assert_close(torch.from_numpy(obs), torch.from_numpy(ref))  # fp32 defaults
        torch_ok = True
    except AssertionError:
        torch_ok = False
    res = g.output_parity(ref, obs, dtype="float32")
    assert (res.verdict == "PASS") == torch_ok
    assert res.observed == pytest.approx(float(np.abs(obs.astype(np.float64) - ref).max()))


def test_output_parity_shape_and_missing() -> None:
    a = np.zeros((2, 3), np.float32)
    assert g.output_parity(a, np.zeros((3, 2), np.float32), dtype="float32").verdict == "FAIL"
    assert g.output_parity(a, None, dtype="float32").verdict == "INCONCLUSIVE"
    nan = a.copy()
    nan[0, 0] = np.nan
    assert g.output_parity(a, nan, dtype="float32").verdict == "FAIL"


def test_tolerances_are_torch_defaults() -> None:
    # torch.testing documents these (rtol, atol) for each dtype.
    assert g.TOLERANCES == {"float32": (1.3e-6, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float16": (1e-3, 1e-5)}
    rt, at, src = g.tolerance_for("float32", rtol=1e-3)
    assert (rt, at) == (1e-3, 1e-5) and src.startswith("params override")


def _lat(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(mean=-2.0, sigma=0.3, size=n)


def test_latency_identical_small_n_is_inconclusive_large_n_passes() -> None:
    assert g.latency_p95_ratio(_lat(30, 1), _lat(30, 2), max_ratio=1.10, min_samples=50).verdict == "INCONCLUSIVE"
    assert g.latency_p95_ratio(_lat(6000, 1), _lat(6000, 2), max_ratio=1.10, min_samples=50).verdict == "PASS"


def test_latency_20_percent_slower_fails() -> None:
    res = g.latency_p95_ratio(_lat(6000, 1), _lat(6000, 2) * 1.2, max_ratio=1.10, min_samples=50)
    assert res.verdict == "FAIL" and res.interval is not None and res.interval[0] > 1.10
    assert res.observed == pytest.approx(1.2, rel=0.05)


def test_no_data_is_never_pass() -> None:
    assert g.latency_p95_ratio(np.array([]), np.array([]), max_ratio=1.1, min_samples=1).verdict == "INCONCLUSIVE"
    assert g.throughput_ratio([], [1.0], min_ratio=0.95).verdict == "INCONCLUSIVE"
    assert g.cold_start_ratio([], [], max_ratio=1.25).verdict == "INCONCLUSIVE"
    assert g.error_rate(0, 0, max_rate=0.0).verdict == "INCONCLUSIVE"
    assert g.checksum_exact("c", []).verdict == "INCONCLUSIVE"
    assert g.decide([])[0] == "HOLD"


def test_error_rate_upper_bound_is_clopper_pearson() -> None:
    # Zero failures in n: the exact two-sided 95 % upper bound is 1 - 0.025 ** (1 / n).
    res = g.error_rate(0, 120, max_rate=0.0)
    assert res.verdict == "PASS"
    assert res.interval[1] == pytest.approx(1 - 0.025 ** (1 / 120), rel=1e-9)
    assert g.error_rate(1, 120, max_rate=0.0).verdict == "FAIL"


def test_checksum_names_mismatching_keys() -> None:
    rows = [{"key": "a", "expected_sha256": "1", "observed_sha256": "1"},
            {"key": "b", "expected_sha256": "2", "observed_sha256": "3"}]
    res = g.checksum_exact("artifact_checksum", rows)
    assert res.verdict == "FAIL" and "['b']" in res.detail


def test_decision_rules() -> None:
    ok = g.boolean_gate("a", True, detail="")
    bad = g.boolean_gate("b", False, detail="broke")
    unsure = g.boolean_gate("c", None, detail="")
    assert g.decide([ok])[0] == "GO"
    assert g.decide([ok, unsure])[0] == "HOLD"
    decision, reasons = g.decide([ok, unsure, bad])
    assert decision == "NO-GO" and reasons == ["b FAIL (phase ): broke"]


def test_cost_breakdown_by_hand() -> None:
    # 2 workers x 0.36 USD/h for 30 min = 0.36 USD; 10 GB at 0.073 USD/GB-month for 0.5 h of a
    # 730 h month = 0.0005 USD; 2e9 bytes out at 0.05 USD/GB = 0.10 USD.
    c = cost.breakdown(price_usd_per_hour=0.36, billed_s=1800, instances=2, accepted_units=1000,
                       storage_gb=10, storage_usd_per_gb_month=0.073, egress_bytes=2e9, egress_usd_per_gb=0.05)
    assert c.compute_usd == pytest.approx(0.36)
    assert c.storage_usd == pytest.approx(0.0005)
    assert c.egress_usd == pytest.approx(0.10)
    assert c.usd_per_accepted_unit == pytest.approx(0.4605 / 1000)
    assert math.isinf(cost.breakdown(price_usd_per_hour=1, billed_s=1, instances=1, accepted_units=0).usd_per_accepted_unit)
    assert g.cost_per_unit(1.0, None, required_saving=0.1).verdict == "INCONCLUSIVE"
    assert g.cost_per_unit(1.0, 0.95, required_saving=0.1).verdict == "FAIL"
    assert g.cost_per_unit(1.0, 0.85, required_saving=0.1).verdict == "PASS"
