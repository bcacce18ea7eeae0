"""Phase 04's raw samples file: rows as they come from a measurement (missing numbers, failed
requests) round-trip through Parquet with the documented schema."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from runbook_lib.errors import EvidenceError
from runbook_lib.phases.compare.raw import JUDGED_COLUMNS, SampleSink, read_samples, sample_schema


def test_rows_with_missing_numbers_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "samples.parquet"
    with SampleSink(path) as sink:
        sink.write([{"side": "target", "round": 0, "request": 1, "total_s": 0.25, "status": "FAILED",
                     "batch_size": math.nan, "input_index": None, "accepted": False, "output": [1, 2]}])
        sink.write([])
        sink.write_frame(pd.DataFrame({"side": ["source"], "round": [1], "request": [0], "total_s": [0.125],
                                       "status": ["COMPLETED"], "accepted": [True], "input_index": [3.0]}))
    df = read_samples(path)
    assert list(df.columns) == sample_schema().names and sink.rows == 2
    assert df["total_s"].tolist() == [0.25, 0.125] and df["input_index"].isna().tolist() == [True, False]
    judged = read_samples(path, JUDGED_COLUMNS)
    assert list(judged.columns) == list(JUDGED_COLUMNS) and judged["side"].tolist() == ["target", "source"]


def test_an_empty_measurement_is_a_valid_file_and_a_missing_one_is_an_error(tmp_path: Path) -> None:
    SampleSink(tmp_path / "empty.parquet").close()
    assert len(read_samples(tmp_path / "empty.parquet")) == 0
    with pytest.raises(EvidenceError, match="missing"):
        read_samples(tmp_path / "none.parquet")
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(EvidenceError, match="not a readable Parquet"):
        read_samples(tmp_path / "bad.parquet")
