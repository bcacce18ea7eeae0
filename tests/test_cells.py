"""Table cells as an auditor reads them (runbook_lib/evidence/cells.py): money as currency, epoch
times as ISO 8601 UTC, flags and missing values in words, no exponents; the expected strings are
written out by hand (the epoch's date from `date -u -d @1796478000`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from runbook_lib.evidence.cells import readable, readable_frame
from runbook_lib.phases.results import table_bundle


def test_money_times_flags_and_missing_values_read_as_words_and_units() -> None:
    assert readable(6.336e-06, "compute_usd") == "$0.00000634"
    assert readable(0.002317423, "cost_usd_per_hour") == "$0.00232"
    assert readable(1234.5, "saving_usd_per_month") == "$1,234.50"
    assert readable(1.796478e9, "created_at") == "2026-12-05T13:40:00Z"
    assert readable(18.96074, "ended_at") == "18.96"  # a duration in a time column stays a number
    assert readable(True, "blocking") == "yes" and readable(np.bool_(False), "match") == "no"
    assert readable(None) == readable(float("nan")) == readable(pd.NaT) == "none"
    assert readable({"port": 8000, "protocol": "http"}) == "port: 8000, protocol: http"
    assert readable(({"port": 8000},), "ports") == "port: 8000"
    assert readable(1.896074e01) == "18.96" and readable(123456.7) == "123,457" and readable(90868376) == "90868376"


def test_a_labelled_table_reads_each_row_by_its_label() -> None:
    cost = pd.DataFrame({"source": [18.96074, 0.002317423], "target": [19.01445, 6.336e-06]},
                        index=["billed_s", "compute_usd"])
    text = table_bundle(cost)["text/plain"]
    assert "e-0" not in text and "e+0" not in text
    assert "$0.00232" in text and "$0.00000634" in text and "18.96" in text and "compute_usd" in text
    frame = readable_frame(pd.DataFrame([{"item": "compute_usd", "value": 2.5}]))
    assert frame.iat[0, 1] == "$2.50"


def test_the_throughput_plots_band_is_the_90_percent_t_interval_over_rounds() -> None:
    from runbook_lib.evidence.report import mean_interval

    # n = 3, mean 2, s = 1: t(0.95; 2) = 2.920 (Student-t table), so 2 +/- 2.920 / sqrt(3) = 2 +/- 1.686
    mean, lo, hi = mean_interval(np.array([1.0, 2.0, 3.0]))
    assert mean == 2.0 and abs(lo - 0.314) < 1e-3 and abs(hi - 3.686) < 1e-3
    assert mean_interval(np.array([5.0])) == (5.0, 5.0, 5.0)  # one round: no interval to draw
