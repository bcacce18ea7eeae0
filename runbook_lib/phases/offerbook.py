"""The offers a launch may rent and what it pays: phase 02's ranked target offers (and the
source's GPU type from phase 01), their prices with the planned disk, and the bid of an
interruptible rental."""

from __future__ import annotations

from dataclasses import dataclass

from runbook_lib.evidence.records import Chain, Offers
from runbook_lib.params import Migration, RemoteProfile


@dataclass(frozen=True)
class OfferBook:
    """Offers and prices from a run's earlier records.

    Attributes:
        mig: the run's params. records: the verified records of the phases before this one.
    """

    mig: Migration
    records: Chain

    @property
    def offers(self) -> Offers:
        """Phase 02's offers of the target these params name (an alternate's when they name one;
        an empty table when it searched none or has not run)."""
        mapping = self.records.mapping
        return (mapping.offers_of(self.mig.target.name) if mapping is not None else None) or Offers()

    def ids(self, side: str) -> tuple[str, ...]:
        """Ranked offer ids a launch on ``side`` may try: the target's from phase 02's record (at
        most ``target.offer.max_tries``); the source's is the GPU type its running pod uses (phase 01)."""
        if side == "target":
            ranked = self.offers.ranked
            tgt = self.mig.target
            return ranked[: tgt.offer.max_tries] if isinstance(tgt, RemoteProfile) else ranked
        freeze = self.records.freeze
        pod = freeze.freeze.source_pod if freeze is not None else None
        return (pod.gpu_name,) if pod is not None and pod.gpu_name else ()

    def price(self, side: str) -> float | None:
        """USD per hour of the first ranked target offer including the planned disk (phase 02's
        record), or None when there is none (the profile's price is used)."""
        first = self.offers.first if side == "target" else None
        return first.hourly_usd_with_disk if first is not None else None

    def bid(self, side: str, offers: tuple[str, ...]) -> float | None:
        """The bid of an interruptible rental on ``offers`` (``offer.interruptible``), USD per
        hour: the highest minimum bid among them in phase 02's offer table, so the one bid is
        valid on every offer a launch may try (a bid below an offer's minimum fails). None for
        on-demand rentals, or when phase 02 listed no interruptible price for them."""
        prof = self.mig.target if side == "target" else None
        if not isinstance(prof, RemoteProfile) or not prof.offer.interruptible:
            return None
        bids = [r.interruptible_usd_per_hour for r in self.offers.table
                if r.offer_id in offers and r.interruptible_usd_per_hour is not None]
        return max(bids) if bids else None

    def bid_price(self, bid: float | None, price: float) -> float:
        """What a rental at ``bid`` costs, USD per hour: the bid plus the planned disk (the first
        ranked offer's price with disk, less its minimum bid, from phase 02's table); ``price``
        itself when there is no bid."""
        first = self.offers.first
        if bid is None or first is None or first.interruptible_usd_per_hour is None:
            return price
        return round(bid + first.hourly_usd_with_disk - first.interruptible_usd_per_hour, 6)
