"""One offer model over every provider's catalog, requirement ranges to filter it, and a ranking.

Runpod's v2 catalog (``GET /v2/catalog/gpus``) and Vast.ai's offer search (``POST
/api/v0/bundles/``) describe the same thing differently: GPU names ("NVIDIA GeForce RTX 4090" vs
"RTX 4090"), per-GPU vs per-machine prices, host RAM vs our share of it. :class:`Offer` is the
normalized record (after dstack's offer and SkyPilot's catalog columns; see
``docs/reference/providers.md`` section 1), and :func:`filter_offers` re-checks every
requirement on our side, because provider searches can drop filters silently (SkyPilot PR #9892,
vast-cli #391, gpuhunt #142).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

GIB_PER_MIB = 1 / 1024
VRAM_SLACK = 0.02
"""Drivers reserve a little memory: nvidia-smi shows 24564 MiB on a 24 GiB RTX 4090 and 81559 MiB
on an 80 GB H100, so a VRAM requirement accepts up to 2 % less than nominal (gpuhunt tolerates 7 %)."""

_ALIASES = {
    "A100 SXM4": "A100 SXM", "A100 SXM4 80GB": "A100 SXM", "A100 SXM4 40GB": "A100 SXM",
    "A100 80GB PCIE": "A100 PCIe", "A100 PCIE": "A100 PCIe",
    "H100 80GB HBM3": "H100 SXM", "H100 SXM5": "H100 SXM", "H100 PCIE": "H100 PCIe", "H100 NVL": "H100 NVL",
    "TESLA V100": "V100", "TESLA T4": "T4", "RTX 6000 ADA GENERATION": "RTX 6000 Ada", "RTX 6000ADA": "RTX 6000 Ada",
}


def canonical_gpu(name: str) -> str:
    """Canonical GPU model name: vendor and product-line prefixes dropped, spellings unified.

    ``"NVIDIA GeForce RTX 4090"`` and ``"RTX 4090"`` -> ``"RTX 4090"``; ``"NVIDIA A100-SXM4-80GB"``
    and Vast's ``"A100 SXM4"`` -> ``"A100 SXM"``; underscores (the Vast CLI's spaces) become spaces.
    """
    s = re.sub(r"\s+", " ", name.replace("_", " ").replace("-", " ")).strip()
    s = re.sub(r"^(NVIDIA )?(GEFORCE )?", "", s, flags=re.IGNORECASE)
    return _ALIASES.get(s.upper(), s)


def version_tuple(v: str | float | None) -> tuple[int, ...]:
    """``"12.4"`` -> ``(12, 4)``; None or "" -> ``()`` (compares below every version)."""
    if v is None or v == "":
        return ()
    return tuple(int(x) for x in re.findall(r"\d+", str(v))[:3])


@dataclass(frozen=True)
class Offer:
    """One rentable configuration, normalized.

    Attributes:
        provider: registry name.
        offer_id: what to rent: a Runpod GPU type id (``"NVIDIA GeForce RTX 4090"``) or a Vast ask id.
        gpu_name: canonical model name (:func:`canonical_gpu`); ``gpu_name_raw`` is the provider's.
        gpu_count: GPUs per pod / instance.
        vram_mib: memory per GPU, MiB.
        vcpu: vCPUs that are ours (Vast ``cpu_cores_effective``); None when the catalog does not say.
        ram_gib: RAM that is ours, GiB (Vast: host RAM pro-rated by effective/total cores).
        disk_gb: disk available to allocate, GB; None when it is chosen freely at create (Runpod).
        cuda_max: highest CUDA version the host driver supports (``"12.8"``); "" unknown.
        usd_per_hour: on-demand compute price of the whole machine (all GPUs), USD per hour.
        interruptible_usd_per_hour: lowest bid / spot price, USD per hour; None if not offered.
        storage_usd_per_gb_month: disk price, USD per GB-month (0 where the price includes it).
        egress_usd_per_gb: data-out price, USD per GB (Runpod: none, per its pricing page).
        region: data center, country code or ``"City, CC"``.
        reliability: provider's 0..1 score; None when not published.
        availability: stock level as the provider states it (``HIGH``/``LOW``/``NONE``/``listed``).
        unverified: requirement names the catalog cannot show; the canary re-checks them.
    """

    provider: str
    offer_id: str
    gpu_name: str
    gpu_name_raw: str
    gpu_count: int
    vram_mib: int
    vcpu: float | None
    ram_gib: float | None
    disk_gb: float | None
    cuda_max: str
    usd_per_hour: float
    interruptible_usd_per_hour: float | None
    storage_usd_per_gb_month: float
    egress_usd_per_gb: float
    region: str
    reliability: float | None
    availability: str
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def hourly_usd(self, disk_gb: float, *, interruptible: bool = False) -> float:
        """Price per hour including ``disk_gb`` of storage (gpuhunt: ``dph_base + disk x
        storage_cost / 30 / 24``), USD per hour."""
        base = self.interruptible_usd_per_hour if interruptible else self.usd_per_hour
        return float(base or 0.0) + disk_gb * self.storage_usd_per_gb_month / 30 / 24

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra")
        return d


def check(offer: Offer, req: Any) -> tuple[list[str], list[str]]:
    """Judge one offer against requirement ranges ``req`` (a :class:`runbook_lib.params.OfferSpec`).

    Returns:
        ``(reasons_rejected, unverified)``: empty ``reasons_rejected`` means the offer qualifies;
        ``unverified`` names requirements the catalog cannot show (re-checked on the canary).
    """
    bad: list[str] = []
    unknown: list[str] = []
    if req.gpu_names and offer.gpu_name not in {canonical_gpu(n) for n in req.gpu_names}:
        bad.append(f"GPU {offer.gpu_name!r} is not one of {list(req.gpu_names)}")
    if not req.gpu_count_min <= offer.gpu_count <= req.gpu_count_max:
        bad.append(f"{offer.gpu_count} GPUs outside {req.gpu_count_min}..{req.gpu_count_max}")
    if offer.vram_mib < req.vram_gib_min * 1024 * (1 - VRAM_SLACK):
        bad.append(f"VRAM {offer.vram_mib} MiB below {req.vram_gib_min} GiB")
    for name, have, need in (("vCPU", offer.vcpu, req.vcpu_min), ("RAM GiB", offer.ram_gib, req.ram_gib_min),
                             ("disk GB", offer.disk_gb, req.disk_gb)):
        if need <= 0:
            continue
        if have is None:
            unknown.append(name)
        elif have < need:
            bad.append(f"{name} {have:g} below {need:g}")
    if req.cuda_min:
        if not offer.cuda_max:
            unknown.append("CUDA")
        elif version_tuple(offer.cuda_max) < version_tuple(req.cuda_min):
            bad.append(f"host CUDA {offer.cuda_max} below {req.cuda_min}")
    price = offer.hourly_usd(req.disk_gb, interruptible=req.interruptible)
    if req.interruptible and offer.interruptible_usd_per_hour is None:
        bad.append("no interruptible price")
    if req.max_usd_per_hour is not None and price > req.max_usd_per_hour:
        bad.append(f"{price:.3f} USD/h above {req.max_usd_per_hour}")
    if req.regions and not any(r.lower() in offer.region.lower() for r in req.regions):
        bad.append(f"region {offer.region!r} not in {list(req.regions)}")
    if req.reliability_min > 0:
        if offer.reliability is None:
            unknown.append("reliability")
        elif offer.reliability < req.reliability_min:
            bad.append(f"reliability {offer.reliability:.3f} below {req.reliability_min}")
    if offer.availability.upper() == "NONE":
        bad.append("no stock")
    return bad, unknown


def filter_offers(offers: list[Offer], req: Any) -> tuple[list[Offer], list[dict[str, Any]]]:
    """Keep the offers that meet ``req`` and rank them: cheapest hourly price (with the planned
    disk) first, then higher reliability, then offer id (a stable order).

    Returns:
        ``(ranked, table)``: ``table`` has one row per offer seen, with ``accepted``, ``reasons``
        and ``unverified`` (evidence of what the search returned and why each was dropped).
    """
    table = []
    ok = []
    for o in offers:
        bad, unknown = check(o, req)
        table.append({**o.to_dict(), "hourly_usd_with_disk": round(o.hourly_usd(req.disk_gb,
                                                                                 interruptible=req.interruptible), 6),
                      "accepted": not bad, "reasons": "; ".join(bad), "unverified": ", ".join(unknown)})
        if not bad:
            ok.append(o)
    ok.sort(key=lambda o: (o.hourly_usd(req.disk_gb, interruptible=req.interruptible),
                           -(o.reliability or 0.0), str(o.offer_id)))
    return ok, table
