"""Pacing: at most a declared number of requests a second to a live source.

A live source (``source.provider: live``) is a service the team's users hit; the runbook may load
it only up to ``source.max_rate_per_s``. Every request a client sends it, readiness checks
included, first takes a slot from one :class:`Pacer` per URL in this process: request starts are
spaced at least ``PACE_MARGIN / max_rate_per_s`` seconds apart, so no window of one second holds
more than ``max_rate_per_s`` of them even as the server sees them, after the network's jitter.
Phases run one at a time, so one pacer per process is the whole run's.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterable

PACE_MARGIN = 1.05
"""Gap between two request starts, in units of ``1 / max_rate_per_s``: 5 % wider than the bare
minimum, so a request that reaches the server a few milliseconds late (scheduling, loopback or
network jitter) does not make the server count one more in a window than the declared rate."""
SCHEDULE_MARGIN = 1.10
"""Least gap of an open-loop schedule sent to a paced service, in units of ``1 / max_rate_per_s``:
wider than :data:`PACE_MARGIN`, so a request the pacer held back a little does not hold back
every later one of a run of closely spaced arrivals (each gap gives back 5 % of one)."""


class Pacer:
    """Request starts at least ``PACE_MARGIN / rate_per_s`` seconds apart, across threads.

    Args:
        rate_per_s: the most requests a second (> 0).
        clock, sleep: injected in tests (seconds).

    Raises:
        ValueError: ``rate_per_s`` is not positive.
    """

    def __init__(self, rate_per_s: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if not rate_per_s > 0:
            raise ValueError(f"a pacer needs a positive rate, got {rate_per_s!r}")
        self.rate_per_s = rate_per_s
        self.gap_s = PACE_MARGIN / rate_per_s
        self._clock, self._sleep = clock, sleep
        self._next = -float("inf")
        self._lock = threading.Lock()
        self.sent = 0
        self.waited_s = 0.0

    def settle(self) -> float:
        """Block until a request could start without waiting (before an open-loop round, whose
        first arrival must not queue behind the round before it); takes no slot. Returns the
        seconds waited."""
        with self._lock:
            left = self._next - self._clock()
        if left > 0:
            self._sleep(left)
        return max(0.0, left)

    def wait(self) -> float:
        """Block until this request may start; returns the seconds waited."""
        with self._lock:
            now = self._clock()
            at = max(now, self._next)
            self._next = at + self.gap_s
            self.sent += 1
            self.waited_s += at - now
        if at > now:
            self._sleep(at - now)
        return at - now


_PACERS: dict[str, Pacer] = {}
_PACERS_LOCK = threading.Lock()


def pacer_for(url: str, rate_per_s: float) -> Pacer:
    """The process's one pacer of ``url`` (created at ``rate_per_s``; a later call with a lower
    rate lowers it, never raises it)."""
    key = url.rstrip("/")
    with _PACERS_LOCK:
        p = _PACERS.get(key)
        if p is None:
            p = _PACERS[key] = Pacer(rate_per_s)
        elif rate_per_s < p.rate_per_s:
            p.rate_per_s, p.gap_s = rate_per_s, PACE_MARGIN / rate_per_s
        return p


def spaced(schedule: Iterable[float], min_gap_s: float) -> list[float]:
    """An arrival schedule (seconds from the start, ascending) with each arrival moved later, when
    needed, to come at least ``min_gap_s`` after the one before: the same order and the same
    arrivals where they are already that far apart. ``min_gap_s`` 0 returns it unchanged."""
    out: list[float] = []
    for t in schedule:
        out.append(float(t) if not out or min_gap_s <= 0 else max(float(t), out[-1] + min_gap_s))
    return out
