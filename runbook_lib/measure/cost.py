"""Cost: price x billed time, plus storage and egress; cost per accepted unit.

A month is 730 hours (the convention AWS, Runpod and Vast.ai price sheets use to turn per-hour
into per-month prices). Billed time includes init and idle: a worker bills from launch to
teardown, not only while it serves.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

HOURS_PER_MONTH = 730.0
BYTES_PER_GB = 1e9


def _json_ready(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` with an infinite USD per accepted unit (nothing accepted) as None: JSON has no inf."""
    if not math.isfinite(d["usd_per_accepted_unit"]):
        d["usd_per_accepted_unit"] = None
    return d


@dataclass(frozen=True)
class CostBreakdown:
    """USD amounts of one side over one measurement window.

    Attributes:
        compute_usd: price_usd_per_hour x billed_s / 3600 x instances.
        storage_usd: volume GB x USD per GB-month, pro-rated over the window.
        egress_usd: bytes sent out / 1e9 x USD per GB.
        accepted_units: requests or steps that passed parity and their SLO.
        usd_per_accepted_unit: total / accepted units (inf when none was accepted).
    """

    billed_s: float
    instances: int
    compute_usd: float
    storage_usd: float
    egress_usd: float
    total_usd: float
    accepted_units: int
    usd_per_accepted_unit: float

    def to_dict(self) -> dict[str, Any]:
        return _json_ready(asdict(self))


def breakdown(*, price_usd_per_hour: float, billed_s: float, instances: int, accepted_units: int,
              storage_gb: float = 0.0, storage_usd_per_gb_month: float = 0.0, egress_bytes: float = 0.0,
              egress_usd_per_gb: float = 0.0) -> CostBreakdown:
    """Price one side's measurement window.

    Args:
        price_usd_per_hour: per instance (pod or worker), USD per hour.
        billed_s: wall time each instance billed, seconds (launch to teardown).
        instances: number of instances billed.
        accepted_units: units that passed parity and SLO.
        storage_gb: persistent storage held over the window, GB.
        storage_usd_per_gb_month: USD per GB-month (730 h).
        egress_bytes: bytes sent out of the provider.
        egress_usd_per_gb: USD per GB (1e9 bytes).
    """
    compute = price_usd_per_hour * billed_s / 3600.0 * instances
    storage = storage_gb * storage_usd_per_gb_month * (billed_s / 3600.0) / HOURS_PER_MONTH
    egress = egress_bytes / BYTES_PER_GB * egress_usd_per_gb
    total = compute + storage + egress
    per_unit = total / accepted_units if accepted_units > 0 else math.inf
    return CostBreakdown(billed_s, instances, compute, storage, egress, total, accepted_units, per_unit)


def usd_per_hour(*, price_usd_per_hour: float, instances: int, storage_gb: float = 0.0,
                 storage_usd_per_gb_month: float = 0.0) -> float:
    """What one side bills per hour while it exists: instances x price, plus its storage
    (GB x USD per GB-month / 730 h), USD per hour."""
    return price_usd_per_hour * instances + storage_gb * storage_usd_per_gb_month / HOURS_PER_MONTH


@dataclass
class SpendMeter:
    """Spend so far of resources billed by the hour, and the guard that stops work *before* a
    limit is crossed (``gates.spend_limit_usd`` enforced during a run, not only judged after it).

    Args:
        limit_usd: the limit, USD; None: no limit (:meth:`check` always lets work go on).
        clock: seconds, monotonic (injected in tests).

    Resources are added with :meth:`start` (USD per hour from :func:`usd_per_hour`) and, once
    destroyed, :meth:`stop`; per-use charges such as egress with :meth:`charge`.
    """

    limit_usd: float | None
    clock: Callable[[], float] = time.monotonic
    rates: dict[str, tuple[float, float]] = field(default_factory=dict)
    charged_usd: float = 0.0

    def start(self, name: str, usd_per_hour_: float, *, at: float | None = None) -> None:
        """``name`` bills ``usd_per_hour_`` from ``at`` (the clock's now by default)."""
        self.rates[name] = (usd_per_hour_, self.clock() if at is None else at)

    def stop(self, name: str) -> None:
        """``name`` stops billing now: what it accrued is kept as a charge."""
        rate, t0 = self.rates.pop(name)
        self.charged_usd += rate * (self.clock() - t0) / 3600.0

    def charge(self, usd: float) -> None:
        """Add a per-use charge (egress), USD."""
        self.charged_usd += usd

    def usd_per_hour(self) -> float:
        """What everything started bills per hour, USD."""
        return sum(rate for rate, _ in self.rates.values())

    def accrued_usd(self) -> float:
        """Spent so far: each resource's rate x hours since it started, plus charges, USD."""
        now = self.clock()
        return sum(rate * (now - t0) / 3600.0 for rate, t0 in self.rates.values()) + self.charged_usd

    def check(self, step: str, est_s: float, *, launches_usd_per_hour: float = 0.0) -> SpendStop | None:
        """None when ``step`` (expected to take ``est_s`` seconds, everything started still billing,
        plus what it launches at ``launches_usd_per_hour``) fits under the limit; otherwise the
        stop record: the caller must not start the step."""
        if self.limit_usd is None:
            return None
        accrued = self.accrued_usd()
        projected = accrued + (self.usd_per_hour() + launches_usd_per_hour) * est_s / 3600.0
        if projected <= self.limit_usd:
            return None
        return SpendStop(step, accrued, projected, self.limit_usd, est_s)


@dataclass(frozen=True)
class SpendStop:
    """A step :meth:`SpendMeter.check` refused: what was spent (USD), what the step would have
    brought it to (USD), the limit (USD) and how long the step was expected to take (seconds)."""

    step: str
    accrued_usd: float
    projected_usd: float
    limit_usd: float
    est_s: float


@dataclass(frozen=True)
class TrafficCost:
    """One endpoint side's cost at a declared steady traffic (:func:`at_traffic`).

    Attributes:
        traffic_per_s: declared requests per second.
        served_per_s: requests per second it can serve of those: min(traffic, capacity).
        capacity_per_s: its measured saturation throughput with all its workers, requests per second.
        busy_workers: workers busy on average: served / (capacity / workers).
        warm_workers: workers kept running whatever the traffic (active workers).
        billed_workers: max(warm, busy): warm workers bill busy or idle, others only while busy.
        idle_workers: warm workers with nothing to do on average: max(0, warm - busy).
        usd_per_hour: billed workers x price + storage + egress at that traffic, USD per hour.
        idle_usd_per_hour: what the idle warm workers cost, USD per hour (part of ``usd_per_hour``).
        acceptance: share of requests accepted (completed within the SLO and parity) in phase 04.
        usd_per_accepted_unit: usd_per_hour / (3600 x served x acceptance), USD (inf with none).
    """

    traffic_per_s: float
    served_per_s: float
    capacity_per_s: float
    busy_workers: float
    warm_workers: int
    billed_workers: float
    idle_workers: float
    usd_per_hour: float
    idle_usd_per_hour: float
    acceptance: float
    usd_per_accepted_unit: float

    def to_dict(self) -> dict[str, Any]:
        return _json_ready(asdict(self))


@dataclass(frozen=True)
class ServingTerms:
    """What an endpoint side's cost at a steady traffic depends on besides the traffic and its
    capacity (the other arguments of :func:`at_traffic`, same units)."""

    workers: int
    warm_workers: int
    price_usd_per_hour: float
    acceptance: float
    storage_gb: float = 0.0
    storage_usd_per_gb_month: float = 0.0
    egress_bytes_per_request: float = 0.0
    egress_usd_per_gb: float = 0.0

    def at(self, traffic_per_s: float, capacity_per_s: float) -> TrafficCost:
        """:func:`at_traffic` of these terms at ``traffic_per_s`` with ``capacity_per_s`` (requests per second)."""
        return at_traffic(traffic_per_s=traffic_per_s, capacity_per_s=capacity_per_s, **asdict(self))


def at_traffic(*, traffic_per_s: float, capacity_per_s: float, workers: int, warm_workers: int,
               price_usd_per_hour: float, acceptance: float, storage_gb: float = 0.0,
               storage_usd_per_gb_month: float = 0.0, egress_bytes_per_request: float = 0.0,
               egress_usd_per_gb: float = 0.0) -> TrafficCost:
    """Cost per accepted unit of an endpoint serving a steady ``traffic_per_s`` (requests per
    second): warm workers bill all the time, busy or idle; the others only while busy (per-second
    billing, the idle timeout's tail after each burst not counted); a side whose capacity is below
    the traffic serves only its capacity. The serverless guidance's trade-off ("warm workers reduce
    latency but create idle cost", docs/reference/providers.md 2.3a) in one figure.

    Args:
        capacity_per_s: measured saturation throughput of the endpoint with ``workers`` workers.
        acceptance: accepted share of requests, 0..1.
        egress_bytes_per_request: bytes each answer sends out.
    """
    per_worker = capacity_per_s / workers if workers > 0 else 0.0
    served = min(traffic_per_s, capacity_per_s)
    busy = served / per_worker if per_worker > 0 else 0.0
    billed = max(float(warm_workers), busy)
    idle = max(0.0, warm_workers - busy)
    egress_per_hour = served * 3600.0 * egress_bytes_per_request / BYTES_PER_GB * egress_usd_per_gb
    per_hour = billed * price_usd_per_hour + storage_gb * storage_usd_per_gb_month / HOURS_PER_MONTH + egress_per_hour
    units_per_hour = 3600.0 * served * acceptance
    return TrafficCost(traffic_per_s, served, capacity_per_s, busy, warm_workers, billed, idle, per_hour,
                       idle * price_usd_per_hour, acceptance,
                       per_hour / units_per_hour if units_per_hour > 0 else math.inf)
