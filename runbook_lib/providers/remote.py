"""What the remote providers (Runpod, Vast.ai) share: plan then apply, capacity tries over ranked
offers within a wall-clock budget, readiness re-checks, labels, and teardown by label.

Destroying is planned and approved like launching (phase 06 lists by label, plans one destroy
per resource, applies each with its approval, and checks each is gone); the only destroy inside
a launch is of a resource that launch itself just created and could not make ready, which the
approved launch plan covers.

Two parts, each subclassed by an adapter: :class:`RemoteProvider` (the API connection and the
reads: ``fetch``, ``_list_raw`` and ``search_offers`` are the adapter's) and
:class:`RemoteLifecycle` (renting one machine: the tries, adoption after an unclear create,
readiness; ``create_on_offer``, ``create_endpoint``, ``stop``, ``start`` and ``destroy`` are the
adapter's). Polling uses an injected clock and sleep, so tests never wait.
"""

from __future__ import annotations

import json
import socket
import time
from abc import abstractmethod
from typing import Any, Callable

from runbook_lib import secret_refs as _secret_refs
from runbook_lib.errors import CreateOutcomeUnknown, NoCapacity, NotFound, ProviderError, ProviderTimeout
from runbook_lib.layout import POD_DEVICE_ENV
from runbook_lib.providers.api import ApiClient
from runbook_lib.providers.base import (
    Attempt,
    Endpoint,
    EndpointSpec,
    Lifecycle,
    Pod,
    PodSpec,
    Provider,
    Readiness,
)
from runbook_lib.providers.offers import VRAM_SLACK, Offer, canonical_gpu, version_tuple
from runbook_lib.workload.job import PARAMS_FROM_ENV

POLL_S = 10.0  # readiness poll interval, seconds (dstack polls Runpod every few seconds for up to 20 min); params: poll_s
LABEL_PREFIX = "runbook:"
PROBE_TIMEOUT_S = 5.0


def encode_labels(labels: dict[str, str]) -> str:
    """Labels as one compact string (Vast ``label`` <= 256 characters; Runpod env value)."""
    text = LABEL_PREFIX + json.dumps(dict(sorted(labels.items())), separators=(",", ":"))
    if len(text) > 256:
        raise ProviderError(f"labels encode to {len(text)} characters, above the 256 Vast allows; shorten the run "
                            "id or the migration name")
    return text


def decode_labels(text: str | None) -> dict[str, str]:
    """Inverse of :func:`encode_labels`; resources not made by the runbook have no labels."""
    if not text or not text.startswith(LABEL_PREFIX):
        return {}
    try:
        return {str(k): str(v) for k, v in json.loads(text[len(LABEL_PREFIX):]).items()}
    except ValueError:
        return {}


def http_ready(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True when ``GET url`` answers 200 within ``timeout_s`` seconds (a worker's ``/ping``
    behind a provider's HTTP proxy, which answers 502 until the worker listens)."""
    import httpx

    try:
        return httpx.get(url, timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def tcp_probe(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True when a TCP connection to ``host:port`` opens within ``timeout_s`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def launch_env(spec: PodSpec | EndpointSpec) -> dict[str, str]:
    """The environment a launch sends: ``spec.env`` plus ``spec.secret_refs`` resolved now (sent
    once, never stored)."""
    return {**dict(spec.env), **_secret_refs.resolve_refs(spec.secret_refs)}


def registry_login(spec: PodSpec) -> str | None:
    """The registry login of ``spec.registry_ref`` resolved now (sent once in the create request,
    never stored), or None for a public image.

    Raises:
        SecretError: the reference cannot be read (the message names it, never a value).
    """
    if spec.registry_ref is None:
        return None
    return _secret_refs.resolve_refs((spec.registry_ref,))[spec.registry_ref[0]]


def hardware_problems(req: Any, host: dict[str, Any], spec: PodSpec) -> list[str]:
    """What differs between the machine we got (``host``, as :attr:`Pod.host` reports it) and
    what the profile's offer requirements ``req`` (an ``OfferSpec``; None: nothing asked) and
    ``spec.disk_gb`` asked for."""
    problems: list[str] = []
    if req is not None:
        gpu = canonical_gpu(host.get("gpu_name", ""))
        if req.gpu_names and gpu not in {canonical_gpu(n) for n in req.gpu_names}:
            problems.append(f"got GPU {gpu!r}, asked for {list(req.gpu_names)}")
        count = host.get("gpu_count")
        if count is not None and not req.gpu_count_min <= count <= req.gpu_count_max:
            problems.append(f"got {count} GPUs, asked for {req.gpu_count_min}..{req.gpu_count_max}")
        vram = host.get("vram_mib")
        if vram is not None and vram < req.vram_gib_min * 1024 * (1 - VRAM_SLACK):
            problems.append(f"got {vram} MiB VRAM, asked for {req.vram_gib_min} GiB")
        disk = host.get("disk_gb")
        if disk is not None and disk < spec.disk_gb:
            problems.append(f"got {disk} GB disk, asked for {spec.disk_gb} GB")
        cuda = host.get("cuda_max", "")
        if req.cuda_min and (not cuda or version_tuple(cuda) < version_tuple(req.cuda_min)):
            problems.append(f"host CUDA {cuda or 'unknown'} below {req.cuda_min}")
    return problems


class RemoteProvider(Provider):
    """Shared behaviour of the HTTP providers: the API connection and the reads. The adapter's
    ``create()`` sets :attr:`lifecycle` (its :class:`RemoteLifecycle`).

    Args:
        api: the provider's :class:`ApiClient` (transport injected in tests and fixture mode).
        profile: the params profile (offer requirements, image, dry-run default).
        clock: monotonic seconds (injected in tests).
        sleep: injected in tests.
        probe: ``(host, port) -> bool`` reachability check (tests inject one).
        http_probe: ``url -> bool``, True when the URL answers 200 (a worker's health check
            behind an HTTP proxy; tests inject one).
        poll_s: status poll interval, seconds.
    """

    TERMINAL_BAD: tuple[str, ...] = ()
    """Words in a pod's status detail that mean its container is dead (waiting cannot help)."""
    PROBE_PATH = ""
    """A read-only request that any key may make (subclasses name one)."""

    def __init__(self, *, api: ApiClient, profile: Any = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, probe: Callable[[str, int], bool] = tcp_probe,
                 http_probe: Callable[[str], bool] = http_ready, poll_s: float = POLL_S) -> None:
        self.api = api
        self.poll_s = poll_s
        self.profile = profile
        self.clock = clock
        self.sleep = sleep
        self.probe = probe
        self.http_probe = http_probe
        self.attempts = []

    # -- primitives a provider supplies --------------------------------------------------------

    @abstractmethod
    def search_offers(self, req: Any, *, ports: int = 0) -> list[Offer]:
        """Offers the provider lists for requirement ranges ``req`` (an ``OfferSpec``) with at
        least ``ports`` directly mappable ports (read-only), normalized."""

    @abstractmethod
    def fetch(self, resource_id: str) -> Pod:
        """The pod or instance as the API reports it now.

        Raises:
            NotFound: it is gone (or was never created).
        """

    @abstractmethod
    def _list_raw(self) -> list[Pod | Endpoint]:
        """Everything the account has (all pages)."""

    # -- the connection --------------------------------------------------------------------------

    def close(self) -> None:
        """Close the API client's connections."""
        self.api.close()

    def simulator(self, *, ask: bool = False) -> str:
        """What the API's answers said about being a simulator; with ``ask`` and nothing asked
        yet, one read-only request (``PROBE_PATH``) first."""
        if ask and not self.api.simulator and self.PROBE_PATH:
            try:
                self.api.request("GET", self.PROBE_PATH)
            except ProviderError:
                pass  # an unreachable or refusing API is no simulator; the real call will say why
        return self.api.simulator

    # -- reads -----------------------------------------------------------------------------------

    def wait_exit(self, resource_id: str, *, timeout_s: float, poll_s: float | None = None,
                  finished: Callable[[], bool] | None = None) -> Pod:
        """Poll until the pod is no longer starting or running, or ``finished()`` says its work is
        done (the agent's completion marker in the store: a container's exit is not reported as
        a code, and a provider may restart it).

        Raises:
            ProviderTimeout: still running after ``timeout_s`` seconds.
        """
        deadline = self.clock() + timeout_s
        poll_s = self.poll_s if poll_s is None else poll_s
        while True:
            pod = self.fetch(resource_id)
            if pod.state not in ("CREATED", "RUNNING") or (finished is not None and finished()):
                return pod
            if self.clock() >= deadline:
                raise ProviderTimeout(f"{self.name}: {resource_id} still {pod.state} after {timeout_s:.0f} s",
                                      provider=self.name, resource_id=resource_id)
            self.sleep(poll_s)

    def log_tail(self, resource_id: str, n_bytes: int = 4000) -> str:
        """Remote logs are not fetched; the provider's status words are what we have."""
        try:
            return self.fetch(resource_id).status_detail[-n_bytes:]
        except NotFound:
            return ""

    def get(self, resource_id: str) -> Pod | Endpoint:
        return self.fetch(resource_id)

    def list(self, *, labels: dict[str, str]) -> list[Pod | Endpoint]:
        return [r for r in self._list_raw() if r.labels and all(r.labels.get(k) == v for k, v in labels.items())]


class RemoteLifecycle(Lifecycle):
    """Renting one machine for a remote provider: tries over ranked offers within the capacity
    budget, adoption of what an unclear create made, and readiness (running, ports reachable,
    hardware as asked). An adapter subclasses it with its own requests.

    Args:
        provider: the adapter it rents for (its reads, profile, clock, probes and
            ``attempts``).
    """

    def __init__(self, provider: RemoteProvider) -> None:
        self.provider = provider

    @abstractmethod
    def create_on_offer(self, spec: PodSpec, offer_id: str, env: dict[str, str]) -> str:
        """Send one create request for a pod / instance on ``offer_id`` and return its id, without
        waiting for readiness (:meth:`launch` waits, and tries the next offer).

        Raises:
            NoCapacity: the offer is gone.
            CreateOutcomeUnknown: the request got no clear answer (:meth:`launch` adopts).
        """

    def launch(self, spec: PodSpec) -> Pod:
        """Try ``spec.offers`` in rank order until one is ready or the budget is spent.

        A try that has no capacity, or whose machine fails readiness (wrong hardware, an exited
        container), is recorded in the provider's ``attempts``; a half-created resource is
        destroyed before the next try.

        Raises:
            NoCapacity: every try failed or the wall-clock budget ran out (the message lists the tries).
        """
        prov = self.provider
        if not spec.offers:
            raise NoCapacity(f"{prov.name}: the launch plan for {spec.name!r} names no offers; run phase 02 to rank "
                             "them", provider=prov.name)
        req = prov.profile.offer if prov.profile is not None else None
        budget = req.capacity_budget_s if req is not None else 900.0
        ready_timeout = req.ready_timeout_s if req is not None else 1200.0
        t0 = prov.clock()
        env = launch_env(spec)
        for offer_id in spec.offers:
            spent = prov.clock() - t0
            if spent > budget:
                prov.attempts.append(Attempt(offer_id, "not tried", f"capacity budget {budget} s spent", at_s=spent))
                break
            try:
                try:
                    rid = self.create_on_offer(spec, offer_id, env)
                except CreateOutcomeUnknown as exc:
                    rid = self.adopt(spec.name, dict(spec.labels), exc).id
                    prov.attempts.append(Attempt(offer_id, "adopted", f"{exc}; found {rid} by its labels and kept it",
                                                 rid, prov.clock() - t0))
            except NoCapacity as exc:
                prov.attempts.append(Attempt(offer_id, "no capacity", str(exc), getattr(exc, "resource_id", ""),
                                             prov.clock() - t0))
                if getattr(exc, "resource_id", ""):
                    self.destroy(exc.resource_id)  # a failed bid can leave a stopped, billing instance
                continue
            try:
                ready = self.wait_ready(rid, spec, timeout_s=min(ready_timeout, budget - (prov.clock() - t0)))
            except ProviderTimeout as exc:
                ready = Readiness(False, "timeout", [str(exc)])
            if ready.ready:
                prov.attempts.append(Attempt(offer_id, "ready", "running, ports reachable, hardware as asked", rid,
                                             prov.clock() - t0))
                return prov.fetch(rid)
            prov.attempts.append(Attempt(offer_id, "failed readiness", "; ".join(ready.problems), rid,
                                         prov.clock() - t0))
            self.destroy(rid)
        tries = "; ".join(f"{a.offer_id}: {a.outcome} ({a.detail})" for a in prov.attempts)
        raise NoCapacity(f"{prov.name}: no pod for {spec.name!r} became ready on any of {len(spec.offers)} ranked "
                         f"offers within {budget} s. Tries: {tries}. If every try had no capacity, widen the offer "
                         "requirements or raise offer.capacity_budget_s; if a machine failed readiness, the try says "
                         "why (wrong hardware, an unreachable port, a container error).", provider=prov.name)

    def launch_direct_worker(self, spec: EndpointSpec, port: str) -> Pod:
        """Launch (:meth:`launch`) a machine for a ``load_balancing`` endpoint: the ``direct``
        worker (:mod:`runbook_lib.providers.local.endpoint`) serving ``spec.port``, published as
        ``port`` (``"8000/tcp"``, ``"8000/http"``), on ``spec.offers`` at ``spec``'s price and bid.
        The run's params reach it in its environment (``RUNBOOK_PARAMS_YAML``).

        Raises:
            NoCapacity: no ranked offer became ready (the tries are in the provider's ``attempts``).
        """
        command = ("python", "-m", "runbook_lib.providers.local.endpoint", "direct", "--params", PARAMS_FROM_ENV,
                   "--side", spec.side, "--port", str(spec.port), "--execution-timeout-s", str(spec.execution_timeout_s))
        return self.launch(PodSpec(name=spec.name, command=command, device=dict(spec.env).get(POD_DEVICE_ENV, "cuda"),
                                   price_usd_per_hour=spec.price_usd_per_hour, labels=spec.labels, env=spec.env,
                                   secret_refs=spec.secret_refs, image=spec.image, ports=(port,), offers=spec.offers,
                                   disk_gb=spec.disk_gb,
                                   interruptible_bid_usd_per_hour=spec.interruptible_bid_usd_per_hour))

    def adopt(self, name: str, labels: dict[str, str], unclear: CreateOutcomeUnknown) -> Pod | Endpoint:
        """After a create got no clear answer, find what it created by ``name`` and ``labels`` (the
        run's labels make it unique) in the provider's own listing, instead of creating again.

        Raises:
            ProviderError: nothing carries those labels (nothing was created: run again), or more
                than one resource does (``runbook cleanup <run_dir>`` destroys them).
        """
        prov = self.provider
        found = [r for r in prov.list(labels=labels) if r.name == name and r.state != "DESTROYED"]
        if len(found) == 1:
            return found[0]
        where = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))
        if not found:
            raise ProviderError(f"{unclear}; the listing shows no {name!r} labelled {where}, so nothing was created "
                                "and nothing was retried. Run the phase again.", provider=prov.name) from unclear
        raise ProviderError(f"{unclear}; the listing shows {len(found)} resources named {name!r} labelled {where} "
                            f"({[r.id for r in found]}); destroy them with `runbook cleanup <run_dir>` before running "
                            "again", provider=prov.name) from unclear

    def readiness(self, pod: Pod, spec: PodSpec) -> Readiness:
        """Judge one snapshot: running, every port in ``spec.ports`` mapped and reachable, and the
        machine's GPU model, count, VRAM, disk and CUDA as the profile asked (offer searches can
        drop filters, so the machine is re-checked rather than trusted, :func:`hardware_problems`)."""
        prov = self.provider
        problems: list[str] = []
        host = pod.host
        if pod.state != "RUNNING":
            return Readiness(False, pod.state, [f"state {pod.state}: {pod.status_detail}"], host=host)
        wrong = hardware_problems(prov.profile.offer if prov.profile is not None else None, host, spec)
        if wrong:
            return Readiness(False, pod.state, wrong, host=host, final=True)
        ports: dict[str, str] = {}
        for p in spec.ports:
            addr = host.get("ports", {}).get(p)
            if not addr:
                problems.append(f"port {p} is not mapped yet")
                continue
            h, _, port = addr.rpartition(":")
            if not prov.probe(h, int(port)):
                problems.append(f"port {p} mapped to {addr} but not reachable")
            ports[p] = addr
        return Readiness(not problems, pod.state, problems, ports=ports, host=host)

    def wait_ready(self, resource_id: str, spec: PodSpec, *, timeout_s: float, poll_s: float | None = None) -> Readiness:
        """Poll until :meth:`readiness` holds; fail fast on a terminal bad state (an exited
        container, an OCI error, a host gone offline: ``TERMINAL_BAD``). ``poll_s`` None: the
        provider's poll interval, seconds.

        Raises:
            ProviderTimeout: not ready within ``timeout_s`` seconds (the last problems named).
        """
        prov = self.provider
        deadline = prov.clock() + timeout_s
        poll_s = prov.poll_s if poll_s is None else poll_s
        last: Readiness | None = None
        while True:
            pod = prov.fetch(resource_id)
            broken = any(w in pod.status_detail.lower() for w in prov.TERMINAL_BAD)
            if pod.state == "EXITED" and not spec.ports and not broken:
                # a job pod (no ports) may finish before we look: it ran on the machine it got,
                # which is re-checked; whether its work is complete is the store marker's to say
                wrong = hardware_problems(prov.profile.offer if prov.profile is not None else None, pod.host, spec)
                return Readiness(not wrong, pod.state, wrong, host=pod.host, final=True)
            if pod.state in ("EXITED", "STOPPED", "DESTROYED") or broken:
                return Readiness(False, pod.state, [f"{pod.state.lower()}: {pod.status_detail}"], host=pod.host,
                                 final=True)
            last = self.readiness(pod, spec)
            if last.ready or last.final:
                return last
            if prov.clock() >= deadline:
                raise ProviderTimeout(f"{prov.name}: {resource_id} not ready after {timeout_s:.0f} s: "
                                      f"{'; '.join(last.problems)}", provider=prov.name, resource_id=resource_id)
            prov.sleep(poll_s)
