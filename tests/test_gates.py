"""Gates: known answers from independent sources (torch.testing, hand calculation)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from runbook_lib import gates as g
from runbook_lib.measure import cost


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


def test_output_parity_treats_non_finite_and_empty_outputs_as_torch_isclose_does() -> None:
    """torch.isclose (equal_nan=False, its default): equal infinities match, NaN matches nothing."""
    ref = np.array([[np.inf, -np.inf, np.nan, 1.0]], np.float32)
    obs = np.array([[np.inf, -np.inf, np.nan, 1.0]], np.float32)
    want = torch.isclose(torch.from_numpy(obs), torch.from_numpy(ref)).numpy()
    assert want.tolist() == [[True, True, False, True]]
    res = g.output_parity(ref, obs, dtype="float32")
    assert res.verdict == "FAIL" and "1 of 4 values" in res.detail
    allnan = np.full((3, 4), np.nan, np.float32)
    assert g.output_parity(allnan, np.ones((3, 4), np.float32), dtype="float32").verdict == "FAIL"
    infs = np.full((3, 4), np.inf, np.float32)
    assert g.output_parity(infs, infs.copy(), dtype="float32").verdict == "PASS"
    assert g.output_parity(infs, -infs, dtype="float32").observed == np.inf
    empty = np.zeros((0, 10), np.float32)
    assert g.output_parity(empty, empty.copy(), dtype="float32").verdict == "INCONCLUSIVE"


def test_tolerances_are_torch_defaults() -> None:
    # torch.testing documents these (rtol, atol) for each dtype.
    assert g.TOLERANCES == {"float32": (1.3e-6, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float16": (1e-3, 1e-5)}
    rt, at, src = g.tolerance_for("float32", rtol=1e-3)
    assert (rt, at) == (1e-3, 1e-5) and src.startswith("params override")


def _lat(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(mean=-2.0, sigma=0.3, size=n)


def _rounds(k: int, n: int, seed: int, scale: float = 1.0) -> list[np.ndarray]:
    return [_lat(n, seed * 100 + i) * scale for i in range(k)]


def test_latency_identical_small_n_is_inconclusive_large_n_passes() -> None:
    small = g.latency_p95_ratio(_rounds(2, 15, 1), _rounds(2, 15, 2), max_ratio=1.10, min_samples=50)
    assert small.verdict == "INCONCLUSIVE" and "too few samples" in small.detail
    wide = g.latency_p95_ratio(_rounds(2, 15, 1), _rounds(2, 15, 2), max_ratio=1.10, min_samples=20)
    assert wide.verdict == "INCONCLUSIVE" and wide.interval[0] < 1.10 < wide.interval[1]  # the interval straddles
    big = g.latency_p95_ratio(_rounds(6, 1000, 1), _rounds(6, 1000, 2), max_ratio=1.10, min_samples=50)
    assert big.verdict == "PASS" and big.samples == {"source": 6000, "target": 6000, "source_rounds": 6,
                                                     "target_rounds": 6}
    assert "block bootstrap over rounds" in big.method


def test_latency_20_percent_slower_fails() -> None:
    res = g.latency_p95_ratio(_rounds(6, 1000, 1), _rounds(6, 1000, 2, 1.2), max_ratio=1.10, min_samples=50)
    assert res.verdict == "FAIL" and res.interval is not None and res.interval[0] > 1.10
    assert res.observed == pytest.approx(1.2, rel=0.05)


def test_latency_bootstrap_resamples_rounds_not_just_requests() -> None:
    # Hand calculation. The source is 1.0 s in both its rounds; the target's two rounds are 1.0 s
    # and 1.3 s throughout (100 requests each). Resampling rounds draws {1.0, 1.0} with
    # probability 1/4 (pooled p95 1.0) and otherwise a pool that is at least half 1.3 s (p95
    # 1.3), so the ratio is 1.0 with probability 1/4 and 1.3 with 3/4: its 5th and 95th
    # percentiles are exactly 1.0 and 1.3, and a margin of 1.10 cannot be judged.
    src = [np.full(100, 1.0), np.full(100, 1.0)]
    tgt = [np.full(100, 1.0), np.full(100, 1.3)]
    res = g.latency_p95_ratio(src, tgt, max_ratio=1.10, min_samples=50)
    assert res.interval == pytest.approx((1.0, 1.3)) and res.verdict == "INCONCLUSIVE"
    # Pooling the requests (scipy.stats.bootstrap over single observations) hides that the two
    # target rounds disagree: every resample's p95 is 1.3 and the gate would FAIL on one round.
    from scipy import stats

    pooled = stats.bootstrap((np.concatenate(src), np.concatenate(tgt)),
                             lambda s, t, axis=-1: np.percentile(t, 95, axis=axis) / np.percentile(s, 95, axis=axis),
                             n_resamples=2000, confidence_level=0.90, method="percentile", random_state=0)
    assert pooled.confidence_interval.low == pytest.approx(1.3)


def test_latency_needs_two_rounds_per_side() -> None:
    res = g.latency_p95_ratio([_lat(500, 1)], _rounds(2, 250, 2), max_ratio=1.10, min_samples=50)
    assert res.verdict == "INCONCLUSIVE" and "need >= 2 per side" in res.detail
    assert res.observed is not None  # the point estimate is still reported
    one = g.latency_p95_ratio(_lat(500, 1), _lat(500, 2), max_ratio=1.10, min_samples=50)  # a 1-D array is one round
    assert one.verdict == "INCONCLUSIVE" and one.samples["source_rounds"] == 1


def test_no_data_is_never_pass() -> None:
    assert g.latency_p95_ratio(np.array([]), np.array([]), max_ratio=1.1, min_samples=1).verdict == "INCONCLUSIVE"
    assert g.latency_p95_ratio([[], []], [[], []], max_ratio=1.1, min_samples=0).verdict == "INCONCLUSIVE"
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


@pytest.mark.parametrize("n,over,verdict", [(90, 0, "PASS"), (89, 0, "INCONCLUSIVE"), (130, 1, "PASS"),
                                            (129, 1, "INCONCLUSIVE"), (398, 10, "PASS"), (397, 10, "INCONCLUSIVE"),
                                            (100, 6, "FAIL")])
def test_latency_slo_matches_mlperf_early_stopping_table(n: int, over: int, verdict: str) -> None:
    # MLPerf inference rules, "Early Stopping Criterion": at p95 and 99 % confidence a run needs
    # 90 queries with none over the bound, 130 with one, 398 with ten.
    lat = np.full(n, 0.1)
    lat[:over] = 2.0
    assert g.latency_slo(lat, slo_s=1.0).verdict == verdict


def test_min_slo_samples_is_mlperf_90() -> None:
    assert g.min_slo_samples() == 90


def test_noise_floor_and_shift() -> None:
    a, b = _lat(3000, 1), _lat(3000, 2)
    assert g.noise_floor(a, b, max_ratio=1.5).verdict == "PASS"
    assert g.noise_floor(a[:20], b[:20] * 1.3, max_ratio=1.1).verdict == "INCONCLUSIVE"  # too noisy, not FAIL
    # A narrow interval that lies outside the band is said to lie outside it, not to be wider than it
    below = g.noise_floor(a, b * 0.27, max_ratio=2.0)
    assert below.verdict == "INCONCLUSIVE" and below.interval is not None and below.interval[1] < 0.5
    assert "wholly below [0.667, 1.500]" in below.detail and "wider" not in below.detail, below.detail
    assert "wholly above" in g.noise_floor(a, b * 2, max_ratio=1.5).detail
    # The band is symmetric in the ratio's logarithm: with a margin of 3.0 (half: 1.0) one round may be
    # up to twice the other's, either way. 1 - 1.0 = 0 would have let round b be any number of times faster.
    assert g.aa_band(3.0) == (0.5, 2.0) and g.aa_band(1.1) == pytest.approx((1 / 1.05, 1.05))
    assert g.noise_floor(a, b / 431, max_ratio=3.0).verdict == "INCONCLUSIVE"
    assert g.noise_floor(a, b / 1.8, max_ratio=3.0).verdict == "PASS"
    shifted = g.latency_shift(a, b * 1.5, max_ratio=1.1)
    assert shifted.verdict == "FAIL" and not shifted.blocking and shifted.observed > 0.005
    assert g.latency_shift(a, b, max_ratio=1.1).verdict == "PASS"
    assert g.latency_shift(a, b + 0.001, max_ratio=1.0).verdict == "PASS"  # 1 ms is under the absolute floor


def test_a_training_noise_floor_also_judges_the_rounds_mean_step_time_which_stalls_move() -> None:
    # Two rounds of the same steps; in round b one step in ten stalls for 40 medians (another process
    # took the core). The medians agree, so the p50 check alone passes; the means, whose inverse is
    # the round's throughput (batch / mean step time), differ about fivefold.
    rng = np.random.default_rng(7)
    a = rng.lognormal(np.log(0.0005), 0.1, 2000)
    b = rng.lognormal(np.log(0.0005), 0.1, 2000)
    b[::10] *= 40
    assert g.noise_floor(a, b, max_ratio=3.0, q=50).verdict == "PASS"
    both = g.noise_floor(a, b, max_ratio=3.0, q=50, means=True)
    assert both.verdict == "INCONCLUSIVE" and both.blocking
    assert both.interval is not None and both.interval[0] > 2.0 and both.observed == pytest.approx(np.mean(b) / np.mean(a))
    assert "the mean (throughput) interval is wholly above [0.500, 2.000]" in both.detail, both.detail
    assert "A/A p50 ratio" in both.detail  # the percentile's figures stay in the detail
    assert g.noise_floor(a, a[::-1].copy(), max_ratio=3.0, q=50, means=True).verdict == "PASS"


def test_scored_gates_do_not_decide() -> None:
    ok = g.boolean_gate("a", True, detail="")
    scored = g.GateResult("s", "FAIL", False, 1.0, 0.5, "s", "m", "slower")
    decision, reasons = g.decide([ok, scored])
    assert decision == "GO" and any("scored" in r for r in reasons)


def test_top1_agreement_on_one_output_column_is_not_applicable_never_a_pass() -> None:
    # A regression's single column: argmax is 0 on every row, so "agreement" would read 1.0 for
    # any two models whatever they answer (the two columns below disagree everywhere).
    src, tgt = np.array([[0.1], [2.0], [-3.0]]), np.array([[9.0], [-9.0], [0.0]])
    for ref, obs in ((src, tgt), (src[:, 0], tgt[:, 0])):
        res = g.top1_agreement(ref, obs, minimum=1.0, phase="03")
        assert res.verdict == "NOT_APPLICABLE" and res.observed is None and res.blocking
        assert res.covered_by == ("loss_band",) and "single output has no argmax" in res.detail
    two = g.top1_agreement(np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[0.0, 1.0], [0.0, 1.0]]), minimum=1.0)
    assert two.verdict == "FAIL" and two.observed == 0.5  # two classes still decide


def test_a_blocking_not_applicable_gate_needs_an_applicable_blocking_gate_on_its_property() -> None:
    na = g.top1_agreement(np.zeros((3, 1)), np.ones((3, 1)), minimum=1.0, phase="03")
    band = g.loss_band([1.0] * 10, [1.0] * 10, rel=0.01, replicate=[1.0] * 10, phase="03")
    ok = g.boolean_gate("canary_destroyed", True, detail="", phase="03")
    decision, reasons = g.decide([ok, na, band])
    assert decision == "GO" and reasons[0] == "all 2 blocking gates PASS"  # the N/A one is not counted
    assert any(r.startswith("not applicable (blocking, covered): top1_agreement") for r in reasons)
    decision, reasons = g.decide([ok, na])  # nothing judges the training outcome
    assert decision == "HOLD" and len(reasons) == 1 and "evidence is missing" in reasons[0]
    assert g.missing_evidence([ok, na]) == [na] and g.holds([ok, na]) and not g.holds([ok, na, band])
    scored_band = g.GateResult(**{**band.__dict__, "blocking": False})
    assert g.decide([ok, na, scored_band])[0] == "HOLD"  # a scored gate covers nothing
    unsure = g.GateResult(**{**band.__dict__, "verdict": "INCONCLUSIVE"})
    assert g.decide([ok, na, unsure]) == ("HOLD", [f"loss_band INCONCLUSIVE (phase 03): {band.detail}"])
    drill = g.not_applicable("drill_redeliver", True, "a load_balancing endpoint has no job API", threshold="x",
                             unit="", method="fault drill", phase="04")
    assert drill.covered_by == () and "no other gate judges this property" in drill.detail
    assert g.decide([ok, drill])[0] == "HOLD"
    scored_drill = g.GateResult(**{**drill.__dict__, "blocking": False})
    decision, reasons = g.decide([ok, scored_drill])
    assert decision == "GO" and reasons[1].startswith("scored (not blocking): drill_redeliver NOT_APPLICABLE")
    assert g.from_dict(json.loads(json.dumps(na.to_dict()))) == na  # the record keeps what covers it


def test_loss_band_needs_a_replicate_and_widens_with_its_spread() -> None:
    s = [1.0] * 10
    assert g.loss_band(s, [1.005] * 10, rel=0.01).verdict == "INCONCLUSIVE"
    assert g.loss_band(s, [1.005] * 10, rel=0.01, replicate=s).verdict == "PASS"
    assert g.loss_band(s, [1.05] * 10, rel=0.01, replicate=s).verdict == "FAIL"
    noisy = g.loss_band(s, [1.05] * 10, rel=0.01, replicate=[1.02] * 10)  # A/A spread 2 % -> band 6 %
    assert noisy.verdict == "PASS" and noisy.threshold == pytest.approx(0.06)


def test_capacity_short_is_a_delay_not_a_pass() -> None:
    assert g.capacity(2, 2).verdict == "PASS"
    short = g.capacity(1, 2)
    assert short.verdict == "INCONCLUSIVE" and short.blocking and "approved alternative" in short.detail


def test_spend_limit() -> None:
    assert g.spend_limit(2.0, limit_usd=1.0).verdict == "FAIL"
    assert g.spend_limit(0.5, limit_usd=1.0).verdict == "PASS"
    assert not g.spend_limit(0.5, limit_usd=None).blocking


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=12, deadline=None, derandomize=True)  # each example runs 4 bootstraps of 2,000 resamples
@given(st.lists(st.floats(0.001, 5.0), min_size=25, max_size=60), st.lists(st.floats(0.001, 5.0), min_size=25,
                                                                             max_size=60), st.randoms())
def test_verdicts_do_not_depend_on_sample_order(src: list[float], tgt: list[float], rnd) -> None:
    s, t = np.array(src), np.array(tgt)
    s2, t2 = s.copy(), t.copy()
    rnd.shuffle(s2)
    rnd.shuffle(t2)
    for fn in (lambda a, b: g.latency_slo(b, slo_s=1.0),
               lambda a, b: g.latency_shift(a, b, max_ratio=1.1),
               lambda a, b: g.error_rate(int((b > 4).sum()), b.size, max_rate=0.0)):
        assert fn(s, t).verdict == fn(s2, t2).verdict
    # Per-round latencies: shuffling requests within each round and the order of the rounds
    # changes neither the interval nor the verdict.
    rs, rt = np.array_split(s, 3), np.array_split(t, 2)
    rs2 = [rnd.sample(list(r), len(r)) for r in rs]
    rt2 = [rnd.sample(list(r), len(r)) for r in rt]
    rnd.shuffle(rs2)
    rnd.shuffle(rt2)
    a = g.latency_p95_ratio(rs, rt, max_ratio=1.1, min_samples=20)
    b = g.latency_p95_ratio(rs2, rt2, max_ratio=1.1, min_samples=20)
    assert (a.verdict, a.interval) == (b.verdict, b.interval)


def test_scored_unless_set() -> None:
    res = g.GateResult("throughput_ratio", "FAIL", True, 0.5, 0.95, "ratio", "m", "throughput ratio 0.500")
    assert g.scored_unless_set(res, setting="gates.throughput_ratio_min", operator_set=True) == res
    scored = g.scored_unless_set(res, setting="gates.throughput_ratio_min", operator_set=False)
    assert (scored.verdict, scored.blocking) == ("FAIL", False)
    assert scored.detail == ("throughput ratio 0.500; scored: threshold not set by the operator; set "
                             "gates.throughput_ratio_min in params to make it blocking")


def test_cost_ratio_interval_over_rounds() -> None:
    ones = [np.ones(10), np.ones(10)]
    # everything accepted: the bootstrap has nothing to vary, so the interval is the point ratio
    cheaper = g.cost_per_unit(1.0, 0.8, required_saving=0.1, accepted_rounds=(ones, ones))
    assert cheaper.verdict == "PASS" and cheaper.interval == pytest.approx((0.8, 0.8))
    dearer = g.cost_per_unit(1.0, 0.95, required_saving=0.1, accepted_rounds=(ones, ones))
    assert dearer.verdict == "FAIL" and dearer.observed == pytest.approx(0.95) and dearer.threshold == 0.9
    # target accepts 10 of 10 in one round and 5 of 10 in the other (15 of 20; billed 0.85 x 15).
    # A resample whose share is 1 gives 0.85 x 15/20 = 0.6375; drawing the half round twice gives a
    # share near 1/2 (less, with requests resampled inside it), so the ratio reaches past
    # 0.85 x 15/10 = 1.275. The interval spans the 0.9 limit: INCONCLUSIVE, not a pass on the point
    half = np.r_[np.ones(5), np.zeros(5)]
    unsure = g.cost_per_unit(1.0, 0.85, required_saving=0.1, accepted_rounds=(ones, [np.ones(10), half]))
    lo, hi = unsure.interval
    assert unsure.verdict == "INCONCLUSIVE" and lo < 0.9 < hi
    assert lo == pytest.approx(0.85 * 15 / 20) and hi >= 0.85 * 15 / 10
    one_round = g.cost_per_unit(1.0, 0.5, required_saving=0.0, accepted_rounds=([np.ones(10)], ones))
    assert one_round.verdict == "INCONCLUSIVE" and one_round.interval is None


def test_acceptance_budget_judges_the_jobs_wall_time() -> None:
    # hand values: 412.5 s of a 600 s budget passes, 601 s fails, an unknown time is never a pass
    ok = g.acceptance_budget(412.5, budget_s=600.0, phase="03")
    assert (ok.verdict, ok.observed, ok.threshold, ok.unit) == ("PASS", 412.5, 600.0, "s")
    assert g.acceptance_budget(601.0, budget_s=600.0).verdict == "FAIL"
    assert g.acceptance_budget(None, budget_s=600.0).verdict == "INCONCLUSIVE"
    scored = g.scored_unless_set(g.acceptance_budget(601.0, budget_s=600.0), setting="run.acceptance_budget_s",
                                 operator_set=False)
    assert scored.verdict == "FAIL" and not scored.blocking and "run.acceptance_budget_s" in scored.detail


def test_a_failing_baseline_holds_rather_than_flatters_the_target() -> None:
    ok = g.baseline_health({"COMPLETED": 240}, max_rate=0.0)
    assert (ok.verdict, ok.observed, ok.blocking) == ("PASS", 0.0, True)
    held = g.baseline_health({"COMPLETED": 239, "EXPIRED": 1}, max_rate=0.0)
    assert held.verdict == "INCONCLUSIVE" and held.observed == 1 / 240  # a HOLD: the target did nothing wrong
    assert "1 of 240 source requests failed (EXPIRED x1)" in held.detail and "TTL" in held.detail
    within = g.baseline_health({"COMPLETED": 999, "TIMED_OUT": 1}, max_rate=0.001)
    assert within.verdict == "PASS"  # 1/1000 is within the operator's error_rate_max
    assert g.baseline_health({}, max_rate=0.0).verdict == "INCONCLUSIVE"


@pytest.mark.parametrize("shape", ["lognormal", "quantized", "all equal", "odd pairs"])
def test_the_hodges_lehmann_shift_without_the_matrix_equals_the_matrix_median(shape: str, monkeypatch) -> None:
    from runbook_lib.gates import stats

    rng = np.random.default_rng(7)
    n, m = (1201, 999) if shape == "odd pairs" else (1500, 1300)
    x, y = rng.lognormal(-2.0, 0.4, n), rng.lognormal(-1.95, 0.5, m)
    if shape == "quantized":  # millisecond timings: many tied differences
        x, y = np.round(x, 3), np.round(y, 3)
    if shape == "all equal":
        x, y = np.full(n, 0.1), np.full(m, 0.1)
    exact = float(np.median(np.subtract.outer(y, x)))  # the definition, on data small enough for it
    monkeypatch.setattr(stats, "HL_DIRECT_PAIRS", 0)  # force the selection path
    assert g.hodges_lehmann_shift(y, x) == pytest.approx(exact, rel=1e-12, abs=1e-15)
