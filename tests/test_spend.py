"""The spend limit as a guard: a step starts only when what is spent plus what it will bill fits
under the limit (hand-computed figures, a fake clock)."""

from __future__ import annotations

from runbook_lib.measure import cost
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
    assert stop is not None and stop.step == "round 4 target" and abs(stop.projected_usd - 0.0120556) < 1e-6
    ran: list[int] = []
    assert guarded(meter, "round 4 target", 10.0, lambda: ran.append(1)) == stop
    assert ran == []  # refused before it started
    assert cost.SpendMeter(None, clock=lambda: now[0]).check("anything", 1e9) is None  # no limit: never refused
    assert meter.check("a launch", 1.0, launches_usd_per_hour=100.0) is not None  # what it launches counts too
    before = meter.accrued_usd()
    meter.stop("target")  # destroyed: what it accrued stays, it accrues no more
    now[0] = 3660.0
    assert abs(meter.accrued_usd() - (before + 0.36 * 3600 / 3600)) < 1e-9


def test_cost_at_traffic_bills_warm_workers_busy_or_idle() -> None:
    # 3 workers serve 30 requests/s at most (10 each); 5 requests/s keep half of one busy.
    warm = cost.at_traffic(traffic_per_s=5, capacity_per_s=30, workers=3, warm_workers=2, price_usd_per_hour=0.36,
                           acceptance=0.9)
    assert abs(warm.busy_workers - 0.5) < 1e-12 and warm.billed_workers == 2.0 and abs(warm.idle_workers - 1.5) < 1e-12
    assert abs(warm.usd_per_hour - 0.72) < 1e-12 and abs(warm.idle_usd_per_hour - 0.54) < 1e-12
    # 0.72 USD/h over 3600 * 5 * 0.9 = 16200 accepted requests an hour
    assert abs(warm.usd_per_accepted_unit - 0.72 / 16200) < 1e-15
    cold = cost.at_traffic(traffic_per_s=5, capacity_per_s=30, workers=3, warm_workers=0, price_usd_per_hour=0.36,
                           acceptance=0.9)  # scaled to zero: only busy time bills
    assert cold.billed_workers == 0.5 and cold.idle_usd_per_hour == 0.0
    assert abs(cold.usd_per_accepted_unit - 0.18 / 16200) < 1e-15
    over = cost.at_traffic(traffic_per_s=50, capacity_per_s=30, workers=3, warm_workers=1, price_usd_per_hour=0.36,
                           acceptance=1.0, egress_bytes_per_request=1e6, egress_usd_per_gb=0.01)
    assert over.served_per_s == 30 and over.busy_workers == 3.0  # it serves its capacity, not the traffic
    # 3 * 0.36 + 30 * 3600 * 1e6 / 1e9 * 0.01 = 1.08 + 1.08 USD/h over 108000 requests an hour
    assert abs(over.usd_per_hour - 2.16) < 1e-9 and abs(over.usd_per_accepted_unit - 2.16 / 108000) < 1e-15
    none = cost.at_traffic(traffic_per_s=5, capacity_per_s=30, workers=3, warm_workers=1, price_usd_per_hour=0.36,
                           acceptance=0.0)
    assert none.usd_per_accepted_unit == float("inf") and none.to_dict()["usd_per_accepted_unit"] is None
