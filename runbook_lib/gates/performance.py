"""Performance and cost gates: latency (p95 ratio, SLO, shift, A/A noise floor), throughput,
cold start, error rate, cost per accepted unit, spend limit and worker capacity."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from runbook_lib._fmt import money
from runbook_lib.gates.result import GateResult, Verdict, threshold_source
from runbook_lib.gates.stats import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    EXACT_BOOTSTRAP_MAX_SAMPLES,
    MIN_ROUNDS_PER_SIDE,
    Binned,
    as_rounds,
    bin_rounds,
    binned_bootstrap,
    bootstrap_interval,
    counts_mean,
    counts_quantile,
    hodges_lehmann_shift,
    ratio_error_bound,
    round_bootstrap,
)


def binned_method(a: Binned, b: Binned, what: str) -> str:
    """The method note of a gate whose interval came from :func:`binned_bootstrap`, with its error
    bound (recorded in the gate's evidence)."""
    err = max(a.rel_error, b.rel_error)
    bins = f"{a.grid.size} and {b.grid.size} bins"
    if err == 0:
        return (f"; above {EXACT_BOOTSTRAP_MAX_SAMPLES} samples resampled as counts per distinct value ({bins}; "
                "Poisson bootstrap, Chamandy et al. 2012): no binning error")
    return (f"; above {EXACT_BOOTSTRAP_MAX_SAMPLES} samples resampled as counts in logarithmic bins ({bins}; "
            f"Poisson bootstrap, Chamandy et al. 2012): each resampled {what} within {err:.2%} of the exact one, "
            f"the ratio within {ratio_error_bound(err):.2%}")


def latency_p95_ratio(source: Any, target: Any, *, max_ratio: float, min_samples: int,
                      min_rounds: int = MIN_ROUNDS_PER_SIDE, phase: str = "") -> GateResult:
    """p95(target) / p95(source) of total latency from intended arrival; PASS when the upper end of
    a 90 % interval from a block bootstrap over rounds (:func:`round_bootstrap`) is <=
    ``max_ratio``, FAIL when its lower end is above it, else INCONCLUSIVE.

    Requests of one round share the host state of that round, so they are not independent: the
    rounds are resampled, then requests within them (docs/reference/gates.md 5.3, "block bootstrap
    over rounds").

    Args:
        source, target: per-round total latencies in seconds (a sequence of 1-D arrays, one per
            round; a single 1-D array is one round).
        min_samples: fewest requests per side.
        min_rounds: fewest non-empty rounds per side (two, to see between-round variation).
    """
    rs, rt = as_rounds(source), as_rounds(target)
    n = {"source": int(sum(r.size for r in rs)), "target": int(sum(r.size for r in rt)),
         "source_rounds": len(rs), "target_rounds": len(rt)}
    method = (f"p95 ratio of queue+init+inference latency; 90 % percentile interval of a block bootstrap over "
              f"rounds (rounds resampled within each side, then requests within each drawn round; "
              f"{BOOTSTRAP_RESAMPLES} resamples, numpy seed {BOOTSTRAP_SEED})")
    src = threshold_source("latency_p95_ratio_max", max_ratio, "Spinnaker/Kayenta canary analysis example: fail at +10 %")
    if min(n["source"], n["target"]) < max(min_samples, 1):
        return GateResult("latency_p95_ratio", "INCONCLUSIVE", True, None, max_ratio, "ratio", method,
                          f"too few samples {n}; need >= {min_samples} per side", samples=n, source=src, phase=phase)
    ratio = float(np.percentile(np.concatenate(rt), 95) / np.percentile(np.concatenate(rs), 95))
    if min(n["source_rounds"], n["target_rounds"]) < min_rounds:
        return GateResult("latency_p95_ratio", "INCONCLUSIVE", True, ratio, max_ratio, "ratio", method,
                          f"only {n['source_rounds']} source and {n['target_rounds']} target round(s) with samples; "
                          f"need >= {min_rounds} per side to see between-round variation (measure.rounds)",
                          samples=n, source=src, phase=phase)
    if n["source"] + n["target"] <= EXACT_BOOTSTRAP_MAX_SAMPLES:
        ci = round_bootstrap((rs, rt), lambda s, t: np.percentile(t, 95) / np.percentile(s, 95))
    else:
        bs, bt = bin_rounds(rs), bin_rounds(rt)
        ci = binned_bootstrap((bs, bt), lambda s, t: counts_quantile(t[0], t[1], 0.95) / counts_quantile(s[0], s[1], 0.95))
        method += binned_method(bs, bt, "p95")
    if ci is None:
        return GateResult("latency_p95_ratio", "ERROR", True, ratio, max_ratio, "ratio", method,
                          "bootstrap interval could not be computed", samples=n, source=src, phase=phase)
    verdict: Verdict = "PASS" if ci[1] <= max_ratio else ("FAIL" if ci[0] > max_ratio else "INCONCLUSIVE")
    return GateResult("latency_p95_ratio", verdict, True, ratio, max_ratio, "ratio", method,
                      f"p95 ratio {ratio:.3f}, 90 % interval [{ci[0]:.3f}, {ci[1]:.3f}] over {n['source_rounds']} "
                      f"source and {n['target_rounds']} target rounds vs max {max_ratio}",
                      samples=n, interval=ci, source=src, phase=phase)


def throughput_ratio(source: Sequence[float], target: Sequence[float], *, min_ratio: float,
                     phase: str = "") -> GateResult:
    """Throughput target / source (units per second, one value per round); PASS when the lower end
    of the 90 % bootstrap interval over rounds is >= ``min_ratio`` (one round per side: point
    estimate, marked as such)."""
    s, t = np.asarray(source, float), np.asarray(target, float)
    n = {"source_rounds": int(s.size), "target_rounds": int(t.size)}
    if s.size == 0 or t.size == 0 or np.mean(s) <= 0:
        return GateResult("throughput_ratio", "INCONCLUSIVE", True, None, min_ratio, "ratio", "mean ratio",
                          "no throughput measured", samples=n, phase=phase)
    ratio = float(np.mean(t) / np.mean(s))
    ci = bootstrap_interval((s, t), lambda a, b, axis: np.mean(b, axis=axis) / np.mean(a, axis=axis)) if min(s.size, t.size) >= 2 else None
    lo = ci[0] if ci else ratio
    verdict: Verdict = "PASS" if lo >= min_ratio else ("FAIL" if (ci[1] if ci else ratio) < min_ratio else "INCONCLUSIVE")
    return GateResult("throughput_ratio", verdict, True, ratio, min_ratio, "ratio",
                      "mean throughput ratio, one value per round" + (
                          "; 90 % percentile bootstrap over rounds (scipy.stats.bootstrap, seed 0)" if ci
                          else "; point estimate (one round on a side)"),
                      f"throughput ratio {ratio:.3f}" + (f", 90 % interval [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""),
                      samples=n, interval=ci, source=threshold_source("throughput_ratio_min", min_ratio, "5 % non-inferiority margin"),
                      phase=phase)


COLD_START_MIN_FOR_INTERVAL = 3
"""Cold starts per side from which the ratio carries a bootstrap interval (fewer: a point estimate)."""


def cold_start_ratio(source: Sequence[float], target: Sequence[float], *, max_ratio: float, phase: str = "",
                     what: str = "launch to first served response") -> GateResult:
    """median(target cold starts) / median(source cold starts), seconds. With at least
    :data:`COLD_START_MIN_FOR_INTERVAL` per side the ratio has a 90 % percentile bootstrap
    interval (scipy.stats.bootstrap, seed 0): PASS when its upper end is <= ``max_ratio``, FAIL when
    its lower end is above, else INCONCLUSIVE; with fewer, the point estimate decides (said so).
    ``what`` names what a cold start spans (recorded as the method)."""
    n = {"source": len(source), "target": len(target)}
    if not source or not target:
        return GateResult("cold_start_ratio", "INCONCLUSIVE", True, None, max_ratio, "ratio", "median ratio",
                          "no cold starts measured", samples=n, phase=phase)
    s, t = np.asarray(source, float), np.asarray(target, float)
    r = float(np.median(t) / np.median(s))
    ci = (bootstrap_interval((s, t), lambda a, b, axis: np.median(b, axis=axis) / np.median(a, axis=axis))
          if min(s.size, t.size) >= COLD_START_MIN_FOR_INTERVAL else None)
    lo, hi = ci if ci else (r, r)
    verdict: Verdict = "PASS" if hi <= max_ratio else ("FAIL" if lo > max_ratio else "INCONCLUSIVE")
    p95 = {side: float(np.percentile(x, 95)) for side, x in (("source", s), ("target", t))}
    return GateResult("cold_start_ratio", verdict, True, r, max_ratio, "ratio",
                      f"median cold start ratio ({what})" + (
                          "; 90 % percentile bootstrap (scipy.stats.bootstrap, seed 0)" if ci
                          else f"; point estimate (fewer than {COLD_START_MIN_FOR_INTERVAL} cold starts on a side)"),
                      f"cold start p50 source {np.median(s):.2f} s, target {np.median(t):.2f} s; p95 source "
                      f"{p95['source']:.2f} s, target {p95['target']:.2f} s"
                      + (f"; ratio interval [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""),
                      samples=n, interval=ci,
                      source=threshold_source("cold_start_ratio_max", max_ratio, "median cold start within 25 %"),
                      phase=phase)


def allreduce_busbw_ratio(source: Sequence[float], target: Sequence[float], *, ranks: dict[str, int],
                          min_ratio: float, size_bytes: float, phase: str = "") -> GateResult:
    """median(target all-reduce bus bandwidth) / median(source's), one benchmark per round
    (bytes per second, nccl-tests' busbw: :func:`runbook_lib.workload.ddp.bus_bandwidth`): PASS
    when the ratio is at least ``min_ratio``. NOT_APPLICABLE, not blocking, when a side runs one
    process (``ranks``: processes per side): no all-reduce crosses its interconnect, and the
    step-time and throughput gates compare the sides; the other side's figures are in the detail.
    INCONCLUSIVE when a side with more than one process has no benchmark."""
    gb = {side: float(np.median(x)) / 1e9 if len(x) else math.nan for side, x in (("source", source), ("target", target))}
    seen = "; ".join(f"{side} {ranks[side]} process(es): busbw {gb[side]:.2f} GB/s over {len(x)} round(s)"
                     for side, x in (("source", source), ("target", target)) if len(x))
    size = f"{size_bytes / 2**20:g} MiB float32 sum"
    n = {"source": len(source), "target": len(target)}
    method = f"median bus bandwidth ratio, nccl-tests busbw = size/time * 2(n-1)/n ({size})"
    single = [side for side in ("source", "target") if ranks[side] < 2]
    if single:
        return GateResult("allreduce_busbw_ratio", "NOT_APPLICABLE", False, None, min_ratio, "ratio", method,
                          f"not applicable: the {' and the '.join(single)} runs{'' if len(single) > 1 else ' only'} one "
                          "process, so no all-reduce crosses its interconnect; step time and throughput compare the "
                          f"sides instead" + (f". Measured: {seen}" if seen else ""), samples=n, phase=phase,
                          covered_by=("latency_p95_ratio", "throughput_ratio"))
    if not source or not target:
        return GateResult("allreduce_busbw_ratio", "INCONCLUSIVE", True, None, min_ratio, "ratio", method,
                          f"no all-reduce benchmark on the {'source' if not source else 'target'}"
                          + (f"; {seen}" if seen else ""), samples=n, phase=phase)
    r = gb["target"] / gb["source"]
    return GateResult("allreduce_busbw_ratio", "PASS" if r >= min_ratio else "FAIL", True, r, min_ratio, "ratio",
                      method, seen, samples=n, phase=phase,
                      source=threshold_source("allreduce_busbw_ratio_min", min_ratio,
                                              "unset: judged at gates.throughput_ratio_min and scored"))


def error_rate(failures: int, total: int, *, max_rate: float, phase: str = "", unit: str = "requests",
               named: str = "") -> GateResult:
    """Target failure rate (FAILED, TIMED_OUT, client errors, a service's named failures) must be
    <= ``max_rate``; the upper end of the exact (Clopper-Pearson) two-sided 95 % interval, i.e. a
    one-sided 97.5 % upper bound (scipy.stats.binomtest), is reported. ``named`` (the failures by
    kind with the first one's error, :func:`runbook_lib.phases.compare.judge.failures_named`)
    ends the detail."""
    from scipy import stats

    if total == 0:
        return GateResult("error_rate", "INCONCLUSIVE", True, None, max_rate, "fraction", "failures / requests",
                          "no requests were made", phase=phase)
    rate = failures / total
    hi = float(stats.binomtest(failures, total).proportion_ci(0.95, method="exact").high)
    return GateResult("error_rate", "PASS" if rate <= max_rate else "FAIL", True, rate, max_rate, "fraction",
                      f"failures / {unit}; upper end of the exact (Clopper-Pearson) 95 % interval reported",
                      f"{failures} of {total} target {unit} failed (one-sided 97.5 % upper bound {hi:.3%})"
                      + (f": {named}" if named else ""),
                      samples={"requests": total}, interval=(0.0, hi), source=threshold_source("error_rate_max", max_rate, "no failed request"),
                      phase=phase)


def baseline_health(statuses: dict[str, int], *, max_rate: float, phase: str = "", live_url: str = "") -> GateResult:
    """The source's own failures during the measurement (its cold-start job, warm rounds and
    bursts), by status, against the same limit as the target's ``error_rate``. A baseline that
    fails requests (jobs that outlived their TTL, timed out or crashed) flatters every comparison
    made against it, so beyond the limit the evidence is INCONCLUSIVE (a HOLD, not a FAIL: the
    target did nothing wrong).

    Args:
        statuses: served status -> count over the source's requests (``COMPLETED`` counts as served).
        max_rate: ``gates.error_rate_max`` (fraction).
        live_url: the source is a live service at this URL (``source.provider: live``): beyond the
            limit the detail says the team's running service failed, not a job of the runbook's.
    """
    total = sum(statuses.values())
    failed = {k: v for k, v in sorted(statuses.items()) if k != "COMPLETED" and v}
    n = sum(failed.values())
    what = ", ".join(f"{k} x{v}" for k, v in failed.items()) or "none"
    if total == 0:
        return GateResult("baseline_health", "INCONCLUSIVE", True, None, max_rate, "fraction", "source failures / requests",
                          "the source served no request during the measurement", phase=phase)
    rate = n / total
    ok = rate <= max_rate
    return GateResult("baseline_health", "PASS" if ok else "INCONCLUSIVE", True, rate, max_rate, "fraction",
                      "source failures / source requests, by status",
                      f"{n} of {total} source requests failed ({what})" if ok else
                      f"{n} of {total} source requests failed ({what}): a comparison against a failing baseline "
                      "proves nothing. " + (f"The live source at {live_url} is the team's running service, not the "
                                           "runbook's: check that it answers (CLIENT_ERROR: it refused connections; "
                                           "TIMED_OUT: it stalled), then measure again" if live_url else
                                           "Fix the source (an EXPIRED job outlived its TTL: raise the job TTL above "
                                           "the cold start and the queue wait; TIMED_OUT: its execution timeout) and "
                                           "measure again"),
                      samples={"requests": total}, source=threshold_source("error_rate_max", max_rate, "no failed request"),
                      phase=phase)


def cost_per_unit(source_usd: float | None, target_usd: float | None, *, required_saving: float,
                  accepted_rounds: tuple[Any, Any] | None = None, phase: str = "",
                  basis: str = "price x billed time (init and idle included) + storage + egress, / accepted units",
                  ) -> GateResult:
    """Cost per accepted unit: target <= source x (1 - required_saving). USD per unit.

    With ``accepted_rounds`` (per side, per round, one 0/1 flag per request: accepted or not) the
    ratio T/S of USD per accepted unit gets a 90 % interval from the block bootstrap over rounds
    (:func:`round_bootstrap`; docs/reference/gates.md 5.3 "bootstrap the ratio jointly over rounds"):
    billed cost is fixed, the accepted share is resampled. PASS when the interval's upper end is
    <= 1 - required_saving, FAIL when its lower end is above, INCONCLUSIVE when it straddles.
    Without rounds it is a point comparison. ``basis`` says how the USD per unit were priced
    (recorded as the method).
    """
    thr = None if source_usd is None else source_usd * (1 - required_saving)
    src = threshold_source("required_saving", required_saving, "target no more expensive per accepted unit")
    if source_usd is None or target_usd is None or not math.isfinite(target_usd):
        return GateResult("cost_per_accepted_unit", "INCONCLUSIVE", True, target_usd, thr, "USD/unit",
                          "billed cost / accepted units", "no accepted units on a side", phase=phase)
    assert thr is not None
    detail = (f"source {money(source_usd)} per unit, target {money(target_usd)} per unit, required saving "
              f"{required_saving:.0%}")
    if accepted_rounds is None:
        return GateResult("cost_per_accepted_unit", "PASS" if target_usd <= thr else "FAIL", True, target_usd, thr,
                          "USD/unit", basis, detail, source=src, phase=phase)
    rs, rt = (as_rounds(x) for x in accepted_rounds)
    n_s, n_t = sum(r.size for r in rs), sum(r.size for r in rt)
    acc_s, acc_t = sum(float(r.sum()) for r in rs), sum(float(r.sum()) for r in rt)
    cost_s, cost_t = source_usd * acc_s, target_usd * acc_t  # the windows' billed totals
    limit = 1 - required_saving
    ratio = target_usd / source_usd

    def stat(s: np.ndarray, t: np.ndarray) -> float:
        return (cost_t / (t.mean() * n_t)) / (cost_s / (s.mean() * n_s)) if s.mean() > 0 and t.mean() > 0 else np.inf

    how = f"block bootstrap over rounds ({BOOTSTRAP_RESAMPLES} resamples, seed {BOOTSTRAP_SEED}) of the accepted share"
    if len(rs) < 2 or len(rt) < 2:
        ci = None
    elif n_s + n_t <= EXACT_BOOTSTRAP_MAX_SAMPLES:
        ci = round_bootstrap((rs, rt), stat)
    else:
        bs, bt = bin_rounds(rs), bin_rounds(rt)

        def counts_stat(s_: tuple[np.ndarray, np.ndarray], t_: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
            ms, mt = counts_mean(*s_), counts_mean(*t_)
            with np.errstate(divide="ignore", invalid="ignore"):
                out = (cost_t / (mt * n_t)) / (cost_s / (ms * n_s))
            return np.where((ms > 0) & (mt > 0), out, np.inf)

        ci = binned_bootstrap((bs, bt), counts_stat)
        how += binned_method(bs, bt, "accepted share")
    if ci is None:
        verdict: Verdict = "INCONCLUSIVE"
        why = "fewer than 2 rounds per side, or a resample with no accepted unit: no interval"
    else:
        verdict = "PASS" if ci[1] <= limit else ("FAIL" if ci[0] > limit else "INCONCLUSIVE")
        why = f"ratio T/S {ratio:.3f}, 90 % interval [{ci[0]:.3f}, {ci[1]:.3f}] against {limit:.3f}"
    return GateResult("cost_per_accepted_unit", verdict, True, ratio, limit, "ratio T/S of USD per accepted unit",
                      f"{basis}; {how}", f"{detail}; {why}", samples={"source_rounds": len(rs), "target_rounds": len(rt),
                                                           "source_units": n_s, "target_units": n_t},
                      interval=ci, source=src, phase=phase)

SLO_PERCENTILE = 0.95  # P(latency <= SLO) must be at least this (MLPerf LoadGen server scenario)

SLO_CONFIDENCE = 0.99  # one-sided confidence of that claim (MLPerf early-stopping criterion)

SHIFT_FLOOR_S = 0.005  # shifts smaller than 5 ms are never called a regression (absolute floor)


def min_slo_samples(percentile: float = SLO_PERCENTILE, confidence: float = SLO_CONFIDENCE) -> int:
    """Fewest requests that can PASS :func:`latency_slo` (all within the SLO): the smallest n with
    ``percentile ** n <= 1 - confidence``; 90 for p95 at 99 %."""
    import math

    return math.ceil(math.log(1 - confidence) / math.log(percentile))


def latency_slo(latencies: np.ndarray, *, slo_s: float, percentile: float = SLO_PERCENTILE,
                confidence: float = SLO_CONFIDENCE, phase: str = "") -> GateResult:
    """Absolute latency SLO with a binomial guarantee, as MLPerf LoadGen's early stopping does:
    PASS when the one-sided ``confidence`` upper bound of the share of requests over ``slo_s``
    (Clopper-Pearson, ``scipy.stats.beta.ppf(confidence, k + 1, n - k)``) is at most
    ``1 - percentile``; FAIL when the observed share already exceeds it; else INCONCLUSIVE.

    With p = 0.95 at 99 % confidence this needs 90 requests with none over the SLO, 130 with one,
    398 with ten (the table in MLPerf's inference rules, "Early Stopping Criterion").

    Args:
        latencies: total latency per request, seconds, shape ``(n,)``.
        slo_s: the latency objective, seconds.
    """
    from scipy import stats

    n = int(latencies.size)
    allowed = 1 - percentile
    if n == 0:
        return GateResult("latency_slo", "INCONCLUSIVE", True, None, slo_s, "s", "binomial upper bound",
                          "no latency samples", phase=phase)
    k = int((latencies > slo_s).sum())
    upper = float(stats.beta.ppf(confidence, k + 1, n - k)) if k < n else 1.0
    verdict: Verdict = "PASS" if upper <= allowed else ("FAIL" if k / n > allowed else "INCONCLUSIVE")
    est = float(np.quantile(latencies, percentile))
    return GateResult("latency_slo", verdict, True, est, slo_s, "s",
                      f"p{percentile * 100:.0f} with a one-sided {confidence:.0%} Clopper-Pearson bound on requests "
                      "over the SLO (MLPerf early stopping)",
                      f"{k} of {n} target requests over {slo_s} s; upper bound of the share over {upper:.3%} "
                      f"(allowed {allowed:.0%})" + ("" if verdict != "INCONCLUSIVE" else "; collect more requests"),
                      samples={"requests": n}, interval=(0.0, upper),
                      source="MLPerf inference rules, early stopping (p95 at 99 % confidence); SLO from "
                             "workload.requirements.max_request_s", phase=phase)


def latency_shift(source: np.ndarray, target: np.ndarray, *, max_ratio: float, floor_s: float = SHIFT_FLOOR_S,
                  phase: str = "") -> GateResult:
    """Secondary, scored (non-blocking) check in the manner of Kayenta's Mann-Whitney classifier:
    FAIL when target latencies are stochastically greater (one-sided Mann-Whitney U,
    ``scipy.stats.mannwhitneyu``, p < 0.02), the Hodges-Lehmann shift exceeds ``floor_s`` seconds
    and the mean ratio is at least ``max_ratio``."""
    from scipy import stats

    n = {"source": int(source.size), "target": int(target.size)}
    if min(n.values()) < 2:
        return GateResult("latency_shift", "INCONCLUSIVE", False, None, max_ratio, "s", "Mann-Whitney U",
                          "too few samples", samples=n, phase=phase)
    p = float(stats.mannwhitneyu(target, source, alternative="greater").pvalue)
    shift = hodges_lehmann_shift(target, source)  # seconds
    ratio = float(np.mean(target) / np.mean(source))
    bad = p < 0.02 and shift > floor_s and ratio >= max_ratio
    return GateResult("latency_shift", "FAIL" if bad else "PASS", False, shift, floor_s, "s",
                      "Hodges-Lehmann shift; one-sided Mann-Whitney U; mean ratio",
                      f"shift {shift * 1e3:.1f} ms, p = {p:.3g}, mean ratio {ratio:.3f} (regression needs p < 0.02, "
                      f"shift > {floor_s * 1e3:.0f} ms and ratio >= {max_ratio})", samples=n,
                      source="Kayenta MannWhitneyClassifier, with an absolute floor", phase=phase)


def aa_band(max_ratio: float) -> tuple[float, float]:
    """The band an A/A ratio (two rounds of the same source) must lie in for a comparison margin
    ``max_ratio``: ``[1 / (1 + h), 1 + h]`` with ``h = (max_ratio - 1) / 2``, half the margin
    (docs/reference/gates.md 5.3, the gate catalogue: "within ± half the smallest comparison
    margin"). Symmetric in the ratio's logarithm, since which of the two rounds is the numerator is arbitrary; for small
    ``h`` it is ``1 +/- h`` to first order, and for ``h >= 1`` it keeps a lower end, where
    ``1 - h`` would let one round be any number of times faster than the other."""
    h = (max_ratio - 1) / 2
    return 1 / (1 + h), 1 + h


def _outside_band(ci: tuple[float, float], band: tuple[float, float]) -> str:
    """How an interval misses ``band``: wider than it (both ends out), or partly or wholly above or
    below it; the words :func:`noise_floor` puts before the band."""
    (lo, hi), (b_lo, b_hi) = ci, band
    if lo < b_lo and hi > b_hi:
        return "wider than"
    if lo > b_hi:
        return "wholly above"
    if hi < b_lo:
        return "wholly below"
    return "reaching above" if hi > b_hi else "reaching below"


def _aa_interval(round_a: np.ndarray, round_b: np.ndarray, q: float | None) -> tuple[float, tuple[float, float] | None, str]:
    """The A/A ratio round b over round a of the ``q``-th percentile (``q`` None: the mean), its
    90 % bootstrap interval (exact up to :data:`EXACT_BOOTSTRAP_MAX_SAMPLES` samples, else the
    binned Poisson bootstrap) and the words naming the method."""
    label = "mean" if q is None else f"p{q:g}"

    def stat(x: np.ndarray, axis: int = -1) -> Any:
        return np.mean(x, axis=axis) if q is None else np.percentile(x, q, axis=axis)

    ratio = float(stat(round_b) / stat(round_a))
    method = f"{label} ratio of two source rounds (A/A); 90 % percentile bootstrap"
    if round_a.size + round_b.size <= EXACT_BOOTSTRAP_MAX_SAMPLES:
        return ratio, bootstrap_interval((round_a, round_b), lambda a, b, axis: stat(b, axis) / stat(a, axis)), method
    ba, bb = bin_rounds([round_a]), bin_rounds([round_b])

    def binned(c: np.ndarray, counts: np.ndarray) -> np.ndarray:
        return counts_mean(c, counts) if q is None else counts_quantile(c, counts, q / 100)

    ci = binned_bootstrap((ba, bb), lambda a, b: binned(b[0], b[1]) / binned(a[0], a[1]))
    return ratio, ci, method + binned_method(ba, bb, label)


def noise_floor(round_a: np.ndarray, round_b: np.ndarray, *, max_ratio: float, q: float = 95,
                means: bool = False, phase: str = "") -> GateResult:
    """A/A check on two source rounds: the 90 % bootstrap interval of the ratio of their ``q``-th
    percentiles (p95 for request latency; p50 for sub-millisecond training steps, whose tails are
    scheduler jitter) must lie within :func:`aa_band` (half the comparison margin
    ``max_ratio - 1``); otherwise the setup is too noisy to judge a difference that small, and the
    gate is INCONCLUSIVE (not FAIL).

    ``means``: also the ratio of the rounds' mean sample, judged the same way. For training steps
    of a fixed batch it is the rounds' throughput ratio inverted (units/s = batch / mean step
    time), which stalls move while the median does not; observed and interval are then those of
    the ratio that left the band, else of the percentile's."""
    n = {"round_a": int(round_a.size), "round_b": int(round_b.size)}
    half = (max_ratio - 1) / 2
    band = aa_band(max_ratio)
    label = f"p{q:g}"
    if min(n.values()) < 2:
        return GateResult("noise_floor", "INCONCLUSIVE", True, None, half, "ratio - 1", f"A/A {label} ratio",
                          "fewer than two source rounds with samples", samples=n, phase=phase)
    judged = [(f"{label}", *_aa_interval(round_a, round_b, q))]
    if means:
        judged.append(("mean (throughput)", *_aa_interval(round_a, round_b, None)))
    method = "; ".join(m for *_, m in judged)
    if any(ci is None for _, _, ci, _ in judged):
        return GateResult("noise_floor", "ERROR", True, judged[0][1], half, "ratio - 1", method,
                          "bootstrap interval could not be computed", samples=n, phase=phase)
    intervals = [(w, r, ci) for w, r, ci, _ in judged if ci is not None]  # all of them: none was None
    out = [(w, r, ci) for w, r, ci in intervals if not band[0] <= ci[0] <= ci[1] <= band[1]]
    what, ratio, ci = (out or intervals)[0]
    words = "; ".join(f"A/A {w} ratio {r:.3f}, interval [{c[0]:.3f}, {c[1]:.3f}]" for w, r, c in intervals)
    in_band = f"[{band[0]:.3f}, {band[1]:.3f}] (half the margin, {half:.3f}, either way)"
    return GateResult("noise_floor", "INCONCLUSIVE" if out else "PASS", True, ratio, half, "ratio - 1", method,
                      f"{words}: within {in_band}" if not out
                      else f"{words}: the {what} interval is {_outside_band(ci, band)} {in_band}: two rounds of the "
                           "same source differ by more than this margin allows, so the setup is too noisy to judge "
                           "it; measure more or on quieter hosts",
                      samples=n, interval=ci, source="A/A noise floor: half the comparison margin", phase=phase)


def spend_limit(total_usd: float, *, limit_usd: float | None, phase: str = "",
                stopped: list[str] | None = None, sides: str = "both sides") -> GateResult:
    """What the measurement cost (``sides``: both, or the target alone beside a live source the
    run does not pay for), USD, must stay within the operator's limit.
    ``stopped``: the steps the run refused to start because they could have crossed the limit
    (:class:`runbook_lib.measure.cost.SpendMeter`); the gates those steps would have fed judge fewer samples."""
    if limit_usd is None:
        return GateResult("spend_limit", "PASS", False, total_usd, None, "USD", "sum of billed cost",
                          f"spent {total_usd:.5f} USD; no limit set (gates.spend_limit_usd)", phase=phase)
    cut = (f"; stopped before {', '.join(stopped)} to stay within it (raise the limit or measure less to take "
           "them)") if stopped else ""
    return GateResult("spend_limit", "PASS" if total_usd <= limit_usd else "FAIL", True, total_usd, limit_usd, "USD",
                      f"sum of billed cost of {sides}; each round is started only if it fits",
                      f"spent {total_usd:.5f} USD of {limit_usd} USD allowed{cut}",
                      source="params gates.spend_limit_usd", phase=phase)


def acceptance_budget(wall_s: float | None, *, budget_s: float, phase: str = "") -> GateResult:
    """The canary's acceptance job, launch to completion marker (seconds), within ``budget_s``:
    a job too slow to run before every provider change stops being run (the portability
    guidance's ten-minute acceptance job, docs/reference/portability.md)."""
    if wall_s is None:
        return GateResult("acceptance_budget", "INCONCLUSIVE", True, None, budget_s, "s", "launch to completion marker",
                          "the acceptance job did not finish, so its time is unknown", source="params run.acceptance_budget_s",
                          phase=phase)
    ok = wall_s <= budget_s
    return GateResult("acceptance_budget", "PASS" if ok else "FAIL", True, round(wall_s, 3), budget_s, "s",
                      "launch to completion marker, measured by the runbook", f"the acceptance job took {wall_s:.1f} s "
                      f"of {budget_s:g} s allowed" + ("" if ok else "; make it smaller (fewer steps or inputs) or set "
                                                                 "run.acceptance_budget_s"),
                      source="params run.acceptance_budget_s (default: ten minutes, docs/reference/portability.md)",
                      phase=phase)


def capacity(ready: int, required: int, *, phase: str = "") -> GateResult:
    """Target capacity against policy: ``ready`` workers serving versus the ``required`` count.
    Short capacity is INCONCLUSIVE (delay, or document an approved alternative in params), never a
    silently weakened PASS."""
    ok = ready >= required
    return GateResult("capacity", "PASS" if ok else "INCONCLUSIVE", True, ready, required, "workers",
                      "workers serving after warm-up / workers the target profile requires",
                      f"{ready} of {required} target workers serving" if ok else
                      f"only {ready} of {required} target workers came up: delay the migration or document an "
                      "approved alternative (change target.workers in params); the policy is not weakened silently",
                      source="params target.workers", phase=phase)
