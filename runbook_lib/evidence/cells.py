"""Table cells as an auditor reads them: money as currency, epoch times as ISO 8601 UTC, flags and
missing values in words, mappings as ``key: value`` text, and numbers without exponents.

A notebook's tables (:func:`runbook_lib.phases.results.table_bundle`) and the gates table
(:func:`runbook_lib.evidence.report.gates_table`) pass their cells through :func:`readable` before
rendering; the records keep the raw values, so nothing judged or recomputed reads these strings.
What a cell is, is told by its column's name, or in a two-column ``item``/value table by its
row's label (``source_usd_per_month``), since such a table holds one quantity per row.
"""

from __future__ import annotations

import datetime as _dt
import math
from typing import Any

import numpy as np
import pandas as pd

from runbook_lib._fmt import money, number

MISSING = "none"
"""What a missing value (None, NaN, NaT) reads as."""

_MONEY_WORDS = ("usd", "cost", "price", "saving", "spend", "$")
_TIME_NAMES = ("at", "time", "started", "ended", "ts")
EPOCH_MIN, EPOCH_MAX = 1.0e9, 4.2e9
"""Seconds since 1970 a time column's value must lie in to be shown as a date (2001-09-09 to
2103-02-04): outside it, a number in such a column is a duration or a count, shown as a number."""


def is_money(key: str) -> bool:
    """A column (or row label) that holds US dollars: its name says ``usd``, ``cost``, ``price``,
    ``saving``, ``spend`` or ``$``."""
    k = key.lower()
    return any(w in k for w in _MONEY_WORDS)


def is_time(key: str) -> bool:
    """A column that holds a point in time: ``at``, ``time``, ``started``, ``ended``, ``ts``, or a
    name ending ``_at``."""
    k = key.lower().strip()
    return k in _TIME_NAMES or k.endswith("_at")


def when(x: float) -> str:
    """Seconds since 1970 as ISO 8601 UTC to the second (``2026-12-05T13:44:33Z``)."""
    return _dt.datetime.fromtimestamp(x, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def readable(value: Any, key: str = "") -> str:
    """One cell as text (``key``: its column's name or its row's label).

    Returns:
        ``yes``/``no`` for a flag; :data:`MISSING` for None, NaN or NaT (or an empty, ``None`` or
        ``nan`` string, a missing value already written as text); ``key: value`` pairs for
        a mapping and ``; ``-joined items for a list or tuple; :func:`money` for a number under a
        money key; :func:`when` for a number under a time key within :data:`EPOCH_MIN` ..
        :data:`EPOCH_MAX`; :func:`number` for any other float; anything else as ``str``.
    """
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, str) and value.strip() in ("", "None", "nan", "NaN"):  # a missing value written as text
        return MISSING
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NaT:
        return MISSING
    if isinstance(value, dict):
        return ", ".join(f"{k}: {readable(v, str(k))}" for k, v in value.items()) or MISSING
    if isinstance(value, (list, tuple)):
        return "; ".join(readable(v, key) for v in value) or MISSING
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
        x = float(value)
        if math.isnan(x):
            return MISSING
        if is_money(key):
            return money(x)
        if is_time(key) and EPOCH_MIN <= x <= EPOCH_MAX:
            return when(x)
        if isinstance(value, (int, np.integer)):
            return str(int(value))
        return number(x)
    return str(value)


def readable_frame(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with every cell :func:`readable`, as strings; in a table whose first column is
    ``item`` (row labels, one quantity per row), each row's cells are read by its label."""
    out = df.astype(object).copy()
    by_row = len(df.columns) > 1 and str(df.columns[0]) == "item"
    for j, col in enumerate(df.columns):
        for i in range(len(df)):
            key = str(df.iat[i, 0]) if by_row and j > 0 else str(col)
            out.iat[i, j] = readable(df.iat[i, j], key)
    return out
