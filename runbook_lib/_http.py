"""HTTP helpers shared by the provider adapters and the job clients (no third-party imports)."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import Any


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


@dataclass(frozen=True)
class Backoff:
    """The one retry policy of the runbook's HTTP clients, for an answer that says the server did
    not process the request (429, or 502/503/504 where the caller allows it) or a connection that
    failed before anything was sent: up to ``retries`` retries, each after the server's own
    ``Retry-After`` / ``RateLimit`` reset when it names one (:func:`retry_after_s`), else after
    ``start_s * factor ** attempt``, and never longer than ``max_s`` (seconds).

    Attributes:
        retries: retries after the first try (0: none). start_s, factor: the schedule.
        max_s: the longest single wait, seconds.
    """

    retries: int
    start_s: float
    factor: float
    max_s: float = 60.0

    def wait_s(self, attempt: int, headers: Any = None) -> float:
        """Seconds to wait before retry ``attempt + 1`` (``attempt`` 0 is the first try)."""
        told = retry_after_s(headers) if headers is not None else None
        return min(told if told is not None else self.start_s * self.factor ** attempt, self.max_s)
