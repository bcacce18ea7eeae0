"""Cost: price x billed time, plus storage and egress; cost per accepted unit.

A month is 730 hours (the convention AWS, Runpod and Vast.ai price sheets use to turn per-hour
into per-month prices). Billed time includes init and idle: a worker bills from launch to
teardown, not only while it serves.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

HOURS_PER_MONTH = 730.0
BYTES_PER_GB = 1e9


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
        d = asdict(self)
        if not math.isfinite(d["usd_per_accepted_unit"]):
            d["usd_per_accepted_unit"] = None
        return d


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
