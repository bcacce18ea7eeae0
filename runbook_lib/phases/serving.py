"""What phases 04 and 05 serve requests through, for a workload that answers requests: an
inference endpoint the runbook's worker serves (``kind: inference``), or a team's own service
pod judged over its protocol (``kind: service``).

Both are :class:`Serving`: create the side's serving resource, open a client on it (one that
answers ``runsync`` and ``health`` as :data:`runbook_lib.measure.timing.ServingClient` does), draw
request payloads, and judge an answer against the golden. Phase 04's open-loop rounds,
saturation bursts and warm-up, and phase 05's slices, are written once against this.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from runbook_lib.layout import GOLDEN_OUTPUTS, SERVICE_GOLDEN
from runbook_lib.measure.timing import ServingClient, job_clocks
from runbook_lib.phases import PhaseContext
from runbook_lib.phases import service_pods as pods
from runbook_lib.providers.base import Plan
from runbook_lib.service import compare, samples
from runbook_lib.service.pacing import SCHEDULE_MARGIN
from runbook_lib.workload import make_workload

LIVE_MODE = "live"
"""The mode of a live source's serving side: a running service the runbook did not create."""


@dataclass(frozen=True)
class Served:
    """A side's serving resource as phase 04 created it: id, base URL, mode (``queue``,
    ``load_balancing``, ``service`` or ``live``), and the seconds from the create call to ready
    (a service pod's readiness; None for endpoints, which report ready when created)."""

    id: str
    url: str
    mode: str
    ready_s: float | None = None


class Serving(ABC):
    """How phases 04 and 05 reach and judge one workload's serving side."""

    def __init__(self, ctx: PhaseContext) -> None:
        self.ctx = ctx

    @abstractmethod
    def plan(self, side: str, role: str) -> Plan:
        """The creation plan of ``side``'s serving resource in role ``role`` (pure)."""

    @abstractmethod
    def create(self, side: str, role: str) -> Served:
        """Apply :meth:`plan` (approved) and return the resource once it serves."""

    @abstractmethod
    def client(self, side: str, served: Served, *, timeout_s: float) -> ServingClient:
        """A client of ``served`` (per request ``timeout_s`` seconds)."""

    @abstractmethod
    def request_inputs(self, n: int, seed: int) -> list[tuple[int, Any]]:
        """``n`` payloads drawn with ``seed``, as ``(golden index, payload)``."""

    @abstractmethod
    def accepted(self, row: dict[str, Any]) -> bool:
        """An accepted unit: ``row`` (``status``, ``total_s``, ``output``, ``input_index``)
        completed within the SLO and its output matches golden row ``input_index``."""


class EndpointServing(Serving):
    """``kind: inference``: the runbook's worker behind a queue or load-balancing endpoint,
    judged against ``01/golden_outputs.npy`` within the dtype's tolerance."""

    def __init__(self, ctx: PhaseContext) -> None:
        super().__init__(ctx)
        self.workload = make_workload(ctx.mig.workload, ctx.mig.source)
        self._golden: np.ndarray | None = None

    def plan(self, side: str, role: str) -> Plan:
        return self.ctx.endpoints.plan(side, role)

    def create(self, side: str, role: str) -> Served:
        ep = self.ctx.endpoints.create(side, role)
        return Served(ep.id, ep.url, ep.mode)

    def client(self, side: str, served: Served, *, timeout_s: float) -> ServingClient:
        return self.ctx.resources.provider(side).job_client(served.id, served.url, timeout_s=timeout_s,
                                                            clocks=job_clocks(self.ctx.mig.measure), mode=served.mode)

    def request_inputs(self, n: int, seed: int) -> list[tuple[int, Any]]:
        return self.workload.request_inputs(n, seed=seed)

    def accepted(self, row: dict[str, Any]) -> bool:
        if self._golden is None:
            self._golden = np.load(self.ctx.run_dir / GOLDEN_OUTPUTS).astype(np.float64)
        return self.ctx.accepted(self._golden, row)


class ServiceServing(Serving):
    """``kind: service``: the team's image (or its stand-in) in a pod, reached over its protocol
    and judged against phase 01's golden answers (``01/service_golden.json``) by the protocol's
    comparator (:func:`runbook_lib.service.compare.compare`)."""

    def __init__(self, ctx: PhaseContext) -> None:
        super().__init__(ctx)
        self.service = pods.service_of(ctx.mig)
        self.samples = samples.load_samples(self.service, ctx.params_path)
        self._golden: list[Any] | None = None

    def plan(self, side: str, role: str) -> Plan:
        return pods.plan_service(self.ctx.resources, side, role)

    def create(self, side: str, role: str) -> Served:
        """``side``'s service pod, launched and ready; a live source (``source.provider: live``)
        is only waited for (:func:`~runbook_lib.phases.service_pods.live_ready`): nothing is
        launched, and its ``ready_s`` is None (it was running before the runbook came)."""
        lp = pods.live(self.ctx.mig, side)
        if lp is not None:
            pods.live_ready(self.ctx.resources, lp)
            return Served(pods.LIVE_ID, lp.url, LIVE_MODE, None)
        ready = pods.launch_ready(self.ctx.resources, side, role)
        return Served(ready.pod.id, ready.url, "service", ready.ready_s)

    def client(self, side: str, served: Served, *, timeout_s: float) -> ServingClient:
        """The protocol's client; each request's deadline is ``measure.request_timeout_s`` whatever
        ``timeout_s`` (an endpoint client's per-call wait) says: a service answers a request
        whole or fails it. A live source's client is paced at ``source.max_rate_per_s``; a
        serverless endpoint's speaks its job API with the provider's key
        (:func:`~runbook_lib.phases.service_pods.side_client`)."""
        lp = pods.live(self.ctx.mig, side)
        if lp is not None:
            return pods.live_client(self.ctx.mig, lp, timeout_s=self.ctx.mig.measure.request_timeout_s,
                                    project=self.ctx.run.project)
        return pods.side_client(self.ctx.resources, side, served.url, timeout_s=self.ctx.mig.measure.request_timeout_s,
                                project=self.ctx.run.project, endpoint_id=served.id)

    def request_inputs(self, n: int, seed: int) -> list[tuple[int, Any]]:
        return samples.draw(self.samples, n, seed)

    def golden(self) -> list[Any]:
        """Phase 01's golden answers, one per sample input (None where the source failed)."""
        if self._golden is None:
            self._golden = list(json.loads((self.ctx.run_dir / SERVICE_GOLDEN).read_text())["answers"])
        return self._golden

    def accepted(self, row: dict[str, Any]) -> bool:
        if row["status"] != "COMPLETED" or row["total_s"] > self.ctx.mig.workload.requirements.max_request_s:
            return False
        return compare.compare(self.service, self.golden()[int(row["input_index"])], row.get("output")).match


def failures_named(s: pd.DataFrame, mask: np.ndarray, bursts: pd.DataFrame | None = None) -> str:
    """The failed requests ``mask`` picks from samples ``s``, by status, most frequent first, then
    the first one's stage and error (the server's own words, as the client kept them), and the
    saturation bursts' failures by status: ``ERROR_BODY x32, TIMED_OUT x1; first (round 1, at
    mid-stream): POST http://.../v1/chat/completions: CUDA error: out of memory``. Empty when
    nothing failed."""
    parts = []
    if mask.any():
        failed_ = s[mask]
        counts = failed_["status"].astype(str).value_counts()
        parts.append(", ".join(f"{k} x{int(v)}" for k, v in counts.items()))
        first = failed_.sort_values(["round", "intended_s"]).iloc[0] if "intended_s" in failed_ else failed_.iloc[0]
        err, stage = first.get("error"), first.get("stage")
        if isinstance(err, str) and err:
            at = f", at {stage}" if isinstance(stage, str) and stage else ""
            parts.append(f"first (round {int(first['round'])}{at}): {err}")
    if bursts is not None and len(bursts):
        by: dict[str, int] = {}
        for row in bursts.get("failed_by_status", pd.Series(dtype=object)).dropna():
            for status, n in json.loads(row).items():
                by[status] = by.get(status, 0) + int(n)
        if by:
            parts.append("saturation bursts: " + ", ".join(f"{k} x{v}" for k, v in sorted(by.items())))
    return "; ".join(parts)


def creates(ctx: PhaseContext, side: str) -> bool:
    """Whether phases 04 and 05 create ``side``'s serving resource (False for a live source)."""
    return pods.live(ctx.mig, side) is None


def source_gap_s(ctx: PhaseContext, *, reserved_per_s: float = 0.0) -> float:
    """The least gap between two arrivals of an open-loop schedule, seconds: for a live source
    :data:`runbook_lib.service.pacing.SCHEDULE_MARGIN` / (``max_rate_per_s`` less
    ``reserved_per_s``, requests a second something else sends it: HAProxy's health checks), a
    little wider than its pacing gap; else 0. Both sides get the same spaced schedule, so they are
    still compared like with like."""
    lp = pods.live(ctx.mig)
    return SCHEDULE_MARGIN / (lp.max_rate_per_s - reserved_per_s) if lp is not None else 0.0


def serving_for(ctx: PhaseContext) -> Serving:
    """The :class:`Serving` of this run's workload (``service`` or ``inference``)."""
    return ServiceServing(ctx) if ctx.mig.workload.kind == "service" else EndpointServing(ctx)
