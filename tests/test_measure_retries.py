"""A failed measurement (the machinery, not the target) is retried, recorded, then INCONCLUSIVE."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from runbook_lib import cost
from runbook_lib.errors import ProviderError, WorkloadError
from runbook_lib.measure import Attempted, with_retries
from runbook_lib.params import Measure, load_params
from runbook_lib.phases import compare

from .conftest import ROOT


class Sleeps:
    """Injected sleep: records the waits instead of waiting."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, s: float) -> None:
        self.calls.append(s)


def test_defaults_are_argos() -> None:
    # Argo Rollouts: DefaultConsecutiveErrorLimit 4, DefaultErrorRetryInterval 10 s.
    m = Measure()
    assert (m.error_retries, m.error_retry_interval_s) == (4, 10.0)


def test_every_attempt_failing_is_recorded_and_yields_no_value() -> None:
    sleeps, calls = Sleeps(), []

    def broken(k: int) -> float:
        calls.append(k)
        raise ProviderError("POST /runsync failed: ConnectError: [Errno 111] Connection refused")

    a = with_retries(broken, what="round 1 target open-loop", kind="open_loop", side="target", retries=4,
                     interval_s=10.0, sleep=sleeps)
    assert calls == [0, 1, 2, 3, 4]  # the first attempt and 4 retries
    assert sleeps.calls == [10.0] * 4 and a.waited_s == 40.0
    assert not a.ok and a.value is None and "Connection refused" in (a.error or "")
    assert [r["attempt"] for r in a.to_rows()] == [1, 2, 3, 4, 5]
    assert all(r["ok"] is False and r["what"] == "round 1 target open-loop" for r in a.to_rows())


def test_a_transient_failure_recovers() -> None:
    sleeps = Sleeps()

    def flaky(k: int) -> str:
        if k < 2:
            raise OSError("connection reset")
        return "measured"

    a = with_retries(flaky, what="x", kind="saturation", side="source", retries=4, interval_s=10.0, sleep=sleeps)
    assert a.ok and a.value == "measured" and a.error is None
    assert [r["ok"] for r in a.attempts] == [False, False, True] and sleeps.calls == [10.0, 10.0]


def test_a_target_failure_is_not_retried() -> None:
    sleeps = Sleeps()

    def crash(k: int) -> None:
        raise WorkloadError("pod exited with code 1")  # the workload failing is evidence, not machinery

    with pytest.raises(WorkloadError):
        with_retries(crash, what="x", kind="training_round", side="target", retries=4, interval_s=10.0, sleep=sleeps)
    assert sleeps.calls == []


def _ctx() -> SimpleNamespace:
    mig = load_params(ROOT / "params" / "demo.yaml")
    return SimpleNamespace(mig=mig, add_gates=lambda *r: list(r))


def test_a_lost_round_extends_and_is_kept_as_evidence() -> None:
    ctx, sleeps = _ctx(), Sleeps()
    log: list[Attempted[Any]] = []

    def run_round(r: int, side: str) -> int:
        def take(k: int) -> int:
            if r == 1:
                raise ProviderError("GET /health failed: ConnectError")
            return 60

        got = compare._retry(ctx, take, log, what=f"round {r} {side} open-loop", kind="open_loop", side=side,
                             sleep=sleeps)
        return got.value or 0

    extra = compare.schedule_rounds(ctx, run_round)
    # Losing round 1 left the target 60 samples short of the 90 the SLO bound needs: the two extra
    # rounds allowed (4 on the source, 5 on the target, in S,T,T,S order) were run.
    assert extra == 2
    assert [a.ok for a in log] == [True, False, True, True, True, True]
    assert len(log[1].attempts) == ctx.mig.measure.error_retries + 1 and len(sleeps.calls) == 4
    lost = compare.lost_measurements(log)
    assert set(lost) == {"latency_p95_ratio", "latency_slo", "noise_floor", "latency_shift",
                         "cost_per_accepted_unit", "error_rate"}
    assert "round 1 target open-loop: 5 attempts failed" in lost["latency_p95_ratio"][0]


def _res(attempts: list[Attempted[Any]]) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    rows = []
    for r, side in enumerate(compare.round_sides(4)):
        for i, v in enumerate(rng.lognormal(-2.0, 0.2, size=200) * (1.5 if side == "target" else 1.0)):
            rows.append({"side": side, "round": r, "request": i, "total_s": v, "status": "COMPLETED",
                         "accepted": True})
    thr = [{"side": side, "round": r, "requests": 48.0, "completed": 48.0, "failed": 0.0, "elapsed_s": 1.0,
            "throughput_units_per_s": 48.0} for r, side in enumerate(compare.round_sides(4))]
    return {"samples": pd.DataFrame(rows), "throughput": pd.DataFrame(thr), "target_workers_ready": 1,
            "cold_starts": [{"side": "source", "cold_start_s": 2.0}, {"side": "target", "cold_start_s": 2.1}],
            "attempts": attempts}


def _costs() -> dict[str, cost.CostBreakdown]:
    return {s: cost.breakdown(price_usd_per_hour=0.4, billed_s=60, instances=1, accepted_units=400)
            for s in ("source", "target")}


def test_a_lost_measurement_makes_its_gates_inconclusive_not_fail() -> None:
    ctx = _ctx()
    judged = {r.name: r for r in compare.compare_gates(ctx, _res([]), _costs())}
    assert judged["latency_p95_ratio"].verdict == "PASS"  # 1.5x within the demo's 2.0 margin
    lost = with_retries(lambda k: (_ for _ in ()).throw(ProviderError("connection refused")),
                        what="round 2 target saturation", kind="saturation", side="target", retries=2,
                        interval_s=10.0, sleep=Sleeps())
    gates = {r.name: r for r in compare.compare_gates(ctx, _res([lost]), _costs())}
    for name in ("throughput_ratio", "error_rate"):
        res = gates[name]
        assert res.verdict == "INCONCLUSIVE" and res.blocking
        assert "round 2 target saturation: 3 attempts failed, last ProviderError: connection refused" in res.detail
        assert "not evidence about the target" in res.detail and "On the remaining data it read PASS" in res.detail
    assert gates["latency_p95_ratio"].verdict == gates["cold_start_ratio"].verdict == "PASS"  # not fed by it
