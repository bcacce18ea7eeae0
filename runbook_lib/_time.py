"""Timestamps as every record writes them: UTC, ISO 8601, millisecond precision, ``Z`` suffix."""

from __future__ import annotations

import datetime as _dt


def iso(t: _dt.datetime) -> str:
    """UTC ISO 8601 with a ``Z`` suffix, to the millisecond (the format of every run timestamp)."""
    return t.astimezone(_dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(s: str) -> _dt.datetime:
    """Inverse of :func:`iso` (also accepts ``+00:00``, as provider APIs write); timezone-aware UTC."""
    t = _dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)


def utc_now() -> str:
    """Current UTC time as ISO 8601 with a ``Z`` suffix, to the millisecond."""
    return iso(_dt.datetime.now(_dt.timezone.utc))
