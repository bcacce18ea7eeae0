"""The routed cutover's step rule (runbook_lib.phases.routed.StepRule): what each step's target
p95 is held to. The windows and the moves through a real HAProxy are tests/test_router.py's."""

from __future__ import annotations

import pytest

from runbook_lib.phases.routed import StepRule, Window


def test_the_steps_p95_bound_is_the_margin_times_the_sources_p95_in_the_steady_window() -> None:
    # Like for like: the steps are held to the latency margin times what the source answered in
    # the steady window (the same replay, rate and router), not phase 04's p95 at its own rate.
    rows = [{"request": i, "input_index": 0, "sent_s": 0.01 * i, "total_s": 0.01 * (i + 1), "server": "source",
             "status": "COMPLETED"} for i in range(100)]  # 0.01 .. 1.00 s: p95 (linear) 0.95 + 0.05 * 0.01
    steady = Window("steady state before the first step", 0, 0.0, 10.0, rows,  # type: ignore[arg-type]
                    {"source": 100, "target": 0}, {"source": "UP", "target": "UP"}, {"source": 100, "target": 0})
    rule = StepRule(window_s=10.0, tolerance=0.05, bound_s=0.2, accepted=lambda r: True, rollback_within_s=2.0,
                    timeout_s=10.0, ratio=3.0)
    assert rule.after_steady(steady).bound_s == pytest.approx(3.0 * 0.9505)
    assert StepRule(**{**rule.__dict__, "ratio": None}).after_steady(steady).bound_s == 0.2  # no margin: as given
    short = Window(**{**steady.__dict__, "rows": rows[:4]})  # too few answers to hold a p95 to: phase 04's bound
    assert rule.after_steady(short).bound_s == 0.2
