"""The savings forecast's arithmetic (runbook_lib/phases/compare/forecast.py) against a hand
calculation, and where it lands: phase 04's record, the receipt and the report's first page."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from runbook_lib.measure.cost import ServingTerms
from runbook_lib.phases.compare import forecast as fc

# Source: 4 workers of 10 requests/s each, 1 kept warm, 1.00 USD an hour a worker. Target: 4
# workers of 6 requests/s each, 2 kept warm, 0.55 USD an hour. Every answer accepted; no storage
# or egress. At 20 requests/s the source keeps 20 / 10 = 2 workers busy (2.00 USD an hour) and the
# target 20 / 6 = 3.33 (3.33 x 0.55 = 1.8333 USD an hour).
SOURCE = ServingTerms(workers=4, warm_workers=1, price_usd_per_hour=1.0, acceptance=1.0)
TARGET = ServingTerms(workers=4, warm_workers=2, price_usd_per_hour=0.55, acceptance=1.0)


def test_the_forecast_matches_a_hand_calculation() -> None:
    f = fc.forecast((SOURCE, np.array([38.0, 42.0])), (TARGET, np.array([23.0, 25.0])), 20.0)
    assert f.traffic_per_s == 20.0
    assert f.source_usd_per_month == pytest.approx(2.0 * 730)  # 1,460.00
    assert f.target_usd_per_month == pytest.approx(20 / 6 * 0.55 * 730)  # 1,338.33
    assert f.saving_usd_per_month == pytest.approx(1460 - 1338.3333, abs=1e-3)  # 121.67
    assert f.saving_fraction == pytest.approx(1 - 1.8333333 / 2.0)  # 8.33 % per accepted unit
    assert f.cheaper_at_traffic == "target"
    # Both costs are capacity-bound here: the saving is 1 - 0.55 x cap_s / cap_t, so resampled
    # round means (38 to 42 and 23 to 25) keep it between 1 - 0.55 x 42 / 23 and 1 - 0.55 x 38 / 25.
    lo, hi = f.saving_interval
    assert 1 - 0.55 * 42 / 23 - 1e-12 <= lo <= f.saving_fraction <= hi <= 1 - 0.55 * 38 / 25 + 1e-12
    # Below 10 requests/s the source's one warm worker (1.00) beats the target's two (1.10); from 10
    # the source pays 0.1 x traffic, equal to 1.10 at 11 requests/s; above 12 the target pays
    # 0.0917 x traffic: the costs per accepted unit cross at 11.
    assert f.break_even_per_s == pytest.approx(11.0, rel=1e-6)


def test_no_break_even_when_one_side_is_cheaper_at_every_traffic() -> None:
    cheaper = replace(TARGET, warm_workers=0, price_usd_per_hour=0.1)
    f = fc.forecast((SOURCE, np.array([40.0, 40.0])), (cheaper, np.array([24.0, 24.0])), 20.0)
    assert f.break_even_per_s is None and f.cheaper_at_traffic == "target" and f.saving_fraction > 0
    one = fc.forecast((SOURCE, np.array([40.0])), (TARGET, np.array([24.0])), 20.0)
    assert one.saving_interval is None  # one round a side shows no between-round variation
