"""The spend limit as a guard: a step starts only when what is spent plus what it will bill fits
under the limit (hand-computed figures, a fake clock)."""

from __future__ import annotations

from runbook_lib import cost
from runbook_lib.phases.compare import guarded


def test_the_meter_accrues_each_rate_from_its_start_and_refuses_a_step_that_would_cross() -> None:
    now = [0.0]
    meter = cost.SpendMeter(0.01, clock=lambda: now[0])
    meter.start("source", 0.36)  # USD per hour
    now[0] = 30.0
    meter.start("target", cost.usd_per_hour(price_usd_per_hour=0.2, instances=2, storage_gb=73,
                                            storage_usd_per_gb_month=0.1))  # 0.4 + 73 * 0.1 / 730 = 0.41
    meter.charge(0.0005)  # egress
    now[0] = 60.0
    # 0.36 * 60 / 3600 + 0.41 * 30 / 3600 + 0.0005 = 0.006 + 0.0034167 + 0.0005
    assert abs(meter.accrued_usd() - 0.0099167) < 1e-6
    assert meter.check("short", 0.05) is None  # + 0.77 * 0.05 / 3600 = 0.0000107: fits
    stop = meter.check("round 4 target", 10.0)  # + 0.77 * 10 / 3600 = 0.0021389: does not
    assert stop is not None and stop["step"] == "round 4 target" and abs(stop["projected_usd"] - 0.0120556) < 1e-6
    ran: list[int] = []
    assert guarded(meter, "round 4 target", 10.0, lambda: ran.append(1)) == stop
    assert ran == []  # refused before it started
    assert cost.SpendMeter(None, clock=lambda: now[0]).check("anything", 1e9) is None  # no limit: never refused
    assert meter.check("a launch", 1.0, launches_usd_per_hour=100.0) is not None  # what it launches counts too
