"""Numbers as people read them: plain decimals without exponents, and US dollars as currency.
The evidence's tables (:mod:`runbook_lib.evidence.cells`) and the gates' details use them."""

from __future__ import annotations

import numpy as np


def number(x: float) -> str:
    """A float without an exponent: 4 significant digits (``0.1511``, ``18.96``, ``321.3``),
    thousands separated from 10,000 up (``18,961``), trailing zeros dropped."""
    if x == 0:
        return "0"
    if abs(x) >= 1e4:
        return f"{x:,.0f}"
    return str(np.format_float_positional(x, precision=4, unique=False, fractional=False, trim="-"))


def money(x: float) -> str:
    """US dollars: cents from a dollar up (``$1,234.56``), else 3 significant digits
    (``$0.00232``, ``$0.00000634``), never an exponent."""
    if abs(x) >= 1 or x == 0:
        return f"${x:,.2f}"
    return "$" + str(np.format_float_positional(x, precision=3, unique=False, fractional=False, trim="-"))
