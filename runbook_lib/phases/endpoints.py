"""Endpoints: a side's serving endpoint (a queue endpoint whose workers take jobs, or a
load-balancing endpoint reached over HTTP) planned for approval and created through the phase's
:class:`~runbook_lib.phases.resources.Resources`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runbook_lib.layout import KEPT_PARAMS, POD_CANDIDATE_ENV, POD_DEVICE_ENV, POD_PARAMS_ENV, POD_SIDE_ENV
from runbook_lib.params import RemoteProfile
from runbook_lib.phases.access import pod_secret_refs
from runbook_lib.phases.resources import Resources
from runbook_lib.providers.base import Endpoint, EndpointSpec, Plan
from runbook_lib.workload.records import DRILLS_ENV, RECORDS_ENV, STORE_ENV


@dataclass(frozen=True)
class Endpoints:
    """One phase's endpoints, planned and created through its :class:`Resources`."""

    res: Resources

    def create(self, side: str, role: str, *, workers: int | None = None, active_workers: int | None = None,
               idle_timeout_s: float = 5.0) -> Endpoint:
        """Apply :meth:`plan`'s plan once approved (:meth:`Resources.apply_plan`); returns the endpoint
        (None in dry-run).

        Raises:
            ApprovalRequired: no approval record names the plan's fingerprint (HOLD).
        """
        ep: Endpoint = self.res.apply_plan(side, self.plan(side, role, workers=workers, active_workers=active_workers,
                                                           idle_timeout_s=idle_timeout_s))
        return ep

    def plan(self, side: str, role: str, *, workers: int | None = None, active_workers: int | None = None,
             idle_timeout_s: float = 5.0) -> Plan:
        """The creation plan of ``side``'s endpoint in its profile's ``endpoint_mode`` (pure: shown in
        notebooks and approved by fingerprint before :meth:`create` applies it). Its workers
        keep idempotency records under ``runs/<run_id>/jobs/<side>`` in the run's store; the target
        obeys drill requests when ``drills.run`` is not empty. A remote
        worker gets the run's params in :data:`~runbook_lib.layout.POD_PARAMS_ENV` (params hold no
        secrets), its side and device in ``POD_SIDE_ENV`` and ``POD_DEVICE_ENV``; a ``load_balancing`` worker on a
        remote target is rented on phase 02's ranked offers at the first one's price.

        ``workers`` (default: the profile's) are all kept running unless ``active_workers`` says
        fewer (0: the endpoint scales to zero after ``idle_timeout_s`` seconds idle, so each job
        after an idle spell pays a cold start)."""
        res = self.res
        prof = res.profile(side)
        # The handler's idempotency records (runbook_lib.workload.records) live in the run's store;
        # the target obeys phase 04's drill requests only when drills run.
        records = "/".join(("runs", res.run_id, *([res.scope] if res.scope else []), "jobs", side))
        env: tuple[tuple[str, str], ...] = ((RECORDS_ENV, records), (STORE_ENV, res.access.url()))
        if side == "target":  # the candidate it serves as: its own profile, not the params' first target
            env += ((POD_CANDIDATE_ENV, prof.name),)
        if side == "target" and res.mig.drills.run:
            env += ((DRILLS_ENV, "1"),)
        extra: dict[str, Any] = {}
        price = prof.price_usd_per_hour
        if isinstance(prof, RemoteProfile):
            env += ((POD_PARAMS_ENV, (res.run_dir / KEPT_PARAMS).read_text()), (POD_SIDE_ENV, side),
                    (POD_DEVICE_ENV, prof.device))
            extra = {"image": prof.image, "disk_gb": prof.offer.disk_gb, "gpu_types": prof.gpu_priority}
            if prof.endpoint_mode == "load_balancing":
                extra["offers"] = res.offers.ids(side)
                extra["interruptible_bid_usd_per_hour"] = res.offers.bid(side, extra["offers"])
                price = res.offers.bid_price(extra["interruptible_bid_usd_per_hour"], res.offers.price(side) or price)
        # queue workers keep idempotency records (read by any worker): a session grant on that prefix;
        # a load-balancing worker keeps none, so it reaches nothing in the store
        scope = (res.access.scope("session", write_prefix=records, ttl_s=res.access.endpoint_ttl_s())
                 if prof.endpoint_mode == "queue" else None)
        spec = EndpointSpec(name=f"{res.mig.migration}-{role}", params_path=str(res.params_path), side=side,
                            workers=workers or prof.workers, price_usd_per_hour=price,
                            labels=res.labels(side, role), execution_timeout_s=res.mig.measure.request_timeout_s,
                            secret_refs=pod_secret_refs(res.mig, side), store_grant=scope,
                            env=env, mode=prof.endpoint_mode,
                            active_workers=workers or prof.workers if active_workers is None else active_workers,
                            idle_timeout_s=idle_timeout_s, **extra)
        return res.provider(side).plan_endpoint(spec, dry_run=res.dry_run(side))

