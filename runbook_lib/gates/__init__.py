"""Gates: pure functions from measurements and thresholds to verdicts, and the decision.

Every gate returns PASS, FAIL, INCONCLUSIVE, ERROR or NOT_APPLICABLE with its evidence
(observed value, threshold, unit, method, sample counts, source of the default). Missing data is
never a PASS, and neither is a gate that does not apply. GO needs every blocking gate PASS, or
NOT_APPLICABLE and covered by an applicable blocking gate on the same property; any blocking FAIL
is NO-GO; otherwise anything INCONCLUSIVE or ERROR, or an uncovered NOT_APPLICABLE, is HOLD.

Default thresholds and their sources:

* float tolerances per dtype: ``torch.testing.assert_close`` defaults
  (https://pytorch.org/docs/stable/testing.html): float32 rtol 1.3e-6 atol 1e-5, bfloat16 rtol
  1.6e-2 atol 1e-5, float16 rtol 1e-3 atol 1e-5;
* latency p95 ratio <= 1.10: Kayenta's documented "fail at +10 %" example; its interval is a
  block bootstrap over rounds (docs/reference/gates.md 5.3, ``latency_p95_rel``), because requests
  within one round share its host state and are not independent;
* throughput ratio >= 0.95: a 5 % non-inferiority margin;
* cold start median ratio <= 1.25 (the runbook's default; set yours in params).

Every result's ``source`` says whether the threshold is the default or a params override.

The package is cut by responsibility: :mod:`.result` (the verdict record), :mod:`.stats`
(bootstrap intervals), :mod:`.parity`, :mod:`.performance` (latency, throughput, cost) and
:mod:`.decision` (GO / NO-GO / HOLD). Everything is re-exported here.
"""

from runbook_lib.gates.decision import (
    CAPACITY_GATE,
    decide,
    generator_behind,
    holds,
    measurement_lost,
    missing_evidence,
    scored_unless_set,
    too_noisy,
)
from runbook_lib.gates.parity import (
    TOLERANCES,
    artifact_parity,
    checksum_exact,
    inference_parity,
    loss_band,
    output_parity,
    tolerance_for,
    top1_agreement,
)
from runbook_lib.gates.performance import (
    SHIFT_FLOOR_S,
    SLO_CONFIDENCE,
    SLO_PERCENTILE,
    aa_band,
    acceptance_budget,
    allreduce_busbw_ratio,
    baseline_health,
    capacity,
    cold_start_ratio,
    cost_per_unit,
    error_rate,
    latency_p95_ratio,
    latency_shift,
    latency_slo,
    min_slo_samples,
    noise_floor,
    spend_limit,
    throughput_ratio,
)
from runbook_lib.gates.result import (
    Decision,
    GateResult,
    Verdict,
    boolean_gate,
    from_dict,
    not_applicable,
    threshold_source,
)
from runbook_lib.gates.stats import (
    BOOTSTRAP_CONFIDENCE,
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

__all__ = [
    "BOOTSTRAP_CONFIDENCE", "CAPACITY_GATE", "BOOTSTRAP_RESAMPLES", "BOOTSTRAP_SEED", "EXACT_BOOTSTRAP_MAX_SAMPLES", "MIN_ROUNDS_PER_SIDE",
    "Binned", "bin_rounds", "binned_bootstrap", "counts_mean", "counts_quantile", "ratio_error_bound", "SHIFT_FLOOR_S",
    "SLO_CONFIDENCE", "SLO_PERCENTILE", "TOLERANCES", "Decision", "GateResult", "Verdict", "aa_band", "acceptance_budget", "allreduce_busbw_ratio", "artifact_parity", "as_rounds",
    "baseline_health", "bootstrap_interval", "boolean_gate", "capacity", "checksum_exact", "cold_start_ratio", "cost_per_unit", "decide",
    "error_rate", "from_dict", "hodges_lehmann_shift", "latency_p95_ratio", "latency_shift", "latency_slo", "loss_band", "measurement_lost", "generator_behind",
    "min_slo_samples", "noise_floor", "output_parity", "inference_parity", "round_bootstrap", "scored_unless_set", "spend_limit",
    "threshold_source", "throughput_ratio", "too_noisy", "tolerance_for", "top1_agreement", "holds", "missing_evidence",
    "not_applicable",
]
