"""HTTP helpers shared by the provider adapters and the job clients (no third-party imports)."""

from __future__ import annotations

import re
from typing import Any


def retry_after_s(headers: Any) -> float | None:
    """Seconds to wait from ``Retry-After`` (delta-seconds form) or a ``RateLimit`` header's
    reset (``t=30`` structured-field form, or the older ``reset=30``); None when neither says."""
    ra = headers.get("retry-after")
    if ra is not None:
        try:
            return max(0.0, float(ra))
        except ValueError:
            pass  # an HTTP date: fall through to our own schedule rather than parse clocks
    rl = headers.get("ratelimit")
    if rl:  # one item per window: '"minute";r=0;t=30, "hour";r=2900;t=1800'
        waits = []
        for item in rl.split(","):
            r = re.search(r"(?:\br|remaining)=(\d+)", item)
            t = re.search(r"(?:\bt|reset)=(\d+(?:\.\d+)?)", item)
            if t and (r is None or int(r.group(1)) == 0):
                waits.append(float(t.group(1)))
        if waits:
            return max(waits)
    return None
