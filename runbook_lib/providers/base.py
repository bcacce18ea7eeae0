"""The provider interface: typed launch specs, plans that are shown before they are applied,
declared capabilities, and idempotent teardown.

Every action that creates, changes, funds or destroys a resource goes through
``plan_*`` (pure: returns a frozen :class:`Plan`) and :meth:`Provider.apply` (needs an
:class:`~runbook_lib.evidence.approvals.Approval` whose fingerprint matches the plan).
"""

from __future__ import annotations

import hashlib
import json
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal

from runbook_lib.errors import ApprovalRequired, NotFound, ProviderError
from runbook_lib.layout import POD_PARAMS_ENV
from runbook_lib.measure.timing import JobClient, JobClocks, WorkerClient
from runbook_lib.storage.grants import GRANT_ENV, GrantScope

if TYPE_CHECKING:
    from runbook_lib.providers.offers import Offer

PodState = Literal["CREATED", "RUNNING", "EXITED", "STOPPED", "DESTROYED"]
GRANT_SHOWN = "<store grant: short-lived URLs or credentials, built at launch; never shown>"


@dataclass(frozen=True)
class PodSpec:
    """What to launch as one pod.

    Attributes:
        name: pod name, unique within a run.
        command: argv run inside the pod.
        device: ``cpu``, ``cuda`` or ``cuda:N``.
        price_usd_per_hour: billed price while the pod exists, USD per hour.
        env: environment for the pod; values of secrets are injected by the provider at launch
            from ``secret_refs`` and never stored in the spec.
        secret_refs: ``NAME -> reference`` (``env:VAR`` / ``file:/path``) resolved at launch.
        labels: ``key -> value`` used to find what a run created (``run_id`` always set).
        volume_gb: persistent volume size, GB.
        image: container image (remote providers; the local provider runs ``command`` directly).
        ports: ports to publish, ``"8000/http"`` / ``"22/tcp"`` (remote providers).
        offers: ranked offer ids to try in order when one has no capacity (remote providers);
            part of what an approval covers.
        disk_gb: container disk to allocate, GB (remote providers; fixed at create on Vast.ai).
        interruptible_bid_usd_per_hour: bid per machine for an interruptible instance, USD per
            hour; None rents on demand.
        store_grant: what the pod may reach in the run's S3 store; the runbook turns it into a
            short-lived grant at launch, passed in ``RUNBOOK_STORE_GRANT``
            (:mod:`runbook_lib.storage.grants`). None: no grant (a ``file://`` store, or none used).
        service: the pod runs a team's own service unchanged (``workload.kind: service``): the
            provider injects none of the runbook's variables (``RUNBOOK_*``) and reports what it
            launched (image, command, environment names, ports). On the local provider
            ``command`` is the service's stand-in, and ``{port}`` in it becomes the host port
            that publishes ``ports[0]``.
        registry_ref: ``(NAME, ref)`` of the registry login a private ``image`` is pulled with,
            resolved at launch and sent in the create request's own registry field (Runpod
            ``registry``, a container registry credential id; Vast.ai ``image_login``,
            ``-u user -p password registry``: docs/reference/providers.md), never in the pod's
            environment. None: a public image.
    """

    name: str
    command: tuple[str, ...]
    device: str
    price_usd_per_hour: float
    labels: tuple[tuple[str, str], ...]
    env: tuple[tuple[str, str], ...] = ()
    secret_refs: tuple[tuple[str, str], ...] = ()
    volume_gb: float = 1.0
    image: str = ""
    ports: tuple[str, ...] = ()
    offers: tuple[str, ...] = ()
    disk_gb: float = 20.0
    interruptible_bid_usd_per_hour: float | None = None
    store_grant: GrantScope | None = None
    service: bool = False
    registry_ref: tuple[str, str] | None = None


@dataclass(frozen=True)
class EndpointSpec:
    """An endpoint served by ``workers`` worker processes, in one of two modes: ``queue`` (a
    front door with the job API) or ``load_balancing`` (one worker's own HTTP contract,
    :class:`runbook_lib.measure.timing.WorkerClient`, reached straight, on container port ``port``).

    Attributes:
        name: endpoint name, unique within a run.
        params_path: migration params file (workers build the workload from it).
        side: ``source`` or ``target`` profile in params.
        workers: number of worker processes (each loads the model once).
        execution_timeout_s: a job IN_PROGRESS longer than this is TIMED_OUT and its worker
            replaced, seconds.
        ttl_s: a job is forgotten this long after submission (status then answers 404), seconds.
        price_usd_per_hour: per worker, USD per hour.
        labels: as for :class:`PodSpec`.
        image: worker container image (remote providers).
        gpu_types: GPU pools / type ids workers may run on (Runpod serverless ``gpu.pools``).
        mode: ``queue`` or ``load_balancing``.
        port: the worker's HTTP port inside its container (``load_balancing``).
        offers: ranked offer ids a ``load_balancing`` worker's instance may be rented on.
        disk_gb: container disk of that instance, GB.
        interruptible_bid_usd_per_hour: that instance's bid (interruptible rental), USD per hour;
            None rents it on demand.
        active_workers: ``queue``: workers kept running (Runpod's ``workers.min``); the others
            start when jobs wait and stop after ``idle_timeout_s`` idle. None: the provider's
            default (local: all ``workers``; Runpod: 0, scale to zero).
        idle_timeout_s: seconds an idle worker beyond the active ones keeps running (Runpod's
            ``idleTimeout``, default 5 s).
        store_grant: what the workers may reach in the run's S3 store (as for :class:`PodSpec`).
        service: the endpoint runs a team's own handler image unchanged (``workload.kind:
            service`` on a Runpod Serverless endpoint, :class:`runbook_lib.params.RunpodServerless`):
            its environment is the service's alone (no ``RUNBOOK_*`` variable; the labels go in
            its name), and it runs the image's own entry point.
        flashboot: the provider's ``flashboot`` setting (Runpod: ``OFF``, ``FLASHBOOT``,
            ``PRIORITY_FLASHBOOT``); empty: the provider's default.
        settings: a service endpoint's provider-specific settings as ``(name, value)`` pairs,
            shown in the plan and sent as they are (Vast.ai Serverless: the endpoint's scaling
            parameters, the workergroup's offer search and GPU memory, the PyWorker adapter).
    """

    name: str
    params_path: str
    side: str
    workers: int
    price_usd_per_hour: float
    labels: tuple[tuple[str, str], ...]
    execution_timeout_s: float = 600.0
    ttl_s: float = 86_400.0
    env: tuple[tuple[str, str], ...] = ()
    secret_refs: tuple[tuple[str, str], ...] = ()
    image: str = ""
    gpu_types: tuple[str, ...] = ()
    mode: str = "queue"
    port: int = 8000
    offers: tuple[str, ...] = ()
    disk_gb: float = 20.0
    interruptible_bid_usd_per_hour: float | None = None
    active_workers: int | None = None
    idle_timeout_s: float = 5.0
    store_grant: GrantScope | None = None
    service: bool = False
    flashboot: str = ""
    settings: tuple[tuple[str, Any], ...] = ()


NEWER_SPEC_FIELDS: dict[str, dict[str, Any]] = {
    "PodSpec": {"store_grant": None},
    "EndpointSpec": {"store_grant": None, "service": False, "flashboot": "", "settings": ()},
}
"""Spec fields added after plans were first approved, with their defaults, by spec type: a spec
that leaves one at its default fingerprints as it did before the field existed, so earlier
approvals still name it."""


@dataclass(frozen=True)
class Plan:
    """A pending action on a provider, shown before it is applied.

    Attributes:
        provider: registry name.
        action: ``launch_pod``, ``create_endpoint``, ``stop``, ``destroy``.
        target: resource name or id the action applies to.
        spec: the launch spec, or ``None`` for stop/destroy.
        cost_usd_per_hour: what the resource will bill while it exists, USD per hour.
        dry_run: when True, :meth:`Provider.apply` only records what it would do.
    """

    provider: str
    action: str
    target: str
    spec: PodSpec | EndpointSpec | None
    cost_usd_per_hour: float
    dry_run: bool

    def to_dict(self) -> dict[str, Any]:
        """The plan as shown and recorded, with its fingerprint. A store grant's value (added to
        the environment only when the plan is applied) is never shown: it is replaced by a note."""
        d = asdict(self)
        if d["spec"] is not None:
            d["spec"]["env"] = [(k, GRANT_SHOWN if k == GRANT_ENV else v) for k, v in d["spec"]["env"]]
        d["fingerprint"] = self.fingerprint
        return d

    @property
    def fingerprint(self) -> str:
        """sha256 of what the plan creates, changes or destroys and what it costs; an approval
        names it.

        Left out, so that a plan shown in a dry run, or in an earlier run of the same params, is
        approved by the same fingerprint: ``dry_run`` (the mode, not the action), the run id
        (replaced by ``<run_id>`` wherever it appears), the params copy a remote pod carries
        in ``RUNBOOK_PARAMS_YAML`` (it holds ``dry_run`` itself), and the store grant in
        ``RUNBOOK_STORE_GRANT`` (its URLs differ per launch and per second; the approved
        ``store_grant`` scope it is built from is fingerprinted). A spec that leaves a field of
        :data:`NEWER_SPEC_FIELDS` at its default fingerprints as it did before the field existed.
        """
        d = asdict(self)
        d.pop("dry_run")
        run_id = ""
        if d["spec"] is not None:
            run_id = dict(self.spec.labels).get("run_id", "") if self.spec else ""
            d["spec"]["env"] = [kv for kv in d["spec"]["env"] if kv[0] not in (POD_PARAMS_ENV, GRANT_ENV)]
            for name, default in NEWER_SPEC_FIELDS[type(self.spec).__name__].items():
                if name in d["spec"] and d["spec"][name] == default:
                    d["spec"].pop(name)
        text = json.dumps(d, sort_keys=True, default=str)
        if run_id:
            text = text.replace(run_id, "<run_id>")
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Pod:
    """A pod as the provider reports it. ``created_at``/``ended_at`` are epoch seconds.

    ``status_detail`` is the provider's own status words (``"exited: OCI runtime create failed"``);
    ``host`` what the provider reports about the machine (GPU, count, CUDA, disk, address, ports).
    ``interrupted``: the provider took the machine back (an interruptible instance outbid, a spot
    pod preempted), so its work stopped through no fault of its own.
    """

    id: str
    name: str
    state: PodState
    labels: dict[str, str]
    price_usd_per_hour: float
    created_at: float
    ended_at: float | None = None
    exit_code: int | None = None
    volume_dir: str = ""
    container_dir: str = ""
    status_detail: str = ""
    host: dict[str, Any] = field(default_factory=dict)
    interrupted: bool = False


@dataclass(frozen=True)
class Endpoint:
    """A serving endpoint. ``mode`` ``queue``: ``url`` answers the job API (``/run``,
    ``/runsync``, ``/status/{id}``, ``/cancel/{id}``, ``/health``); ``load_balancing``: ``url``
    is one worker's HTTP contract (:class:`runbook_lib.measure.timing.WorkerClient`)."""

    id: str
    name: str
    state: PodState
    url: str
    workers: int
    labels: dict[str, str]
    price_usd_per_hour: float
    created_at: float
    ended_at: float | None = None
    mode: str = "queue"


@dataclass(frozen=True)
class Teardown:
    """What one stop or destroy found and did (evidence for phase 06 and ``runbook cleanup``).

    Attributes:
        resource_id: the pod, instance or endpoint.
        action: ``stop`` or ``destroy``.
        found: the state the resource was in when the action began (``"gone"`` when the
            provider no longer knew it: already destroyed, which is success).
        detail: provider-specific steps (local: processes found, signalled, killed; remote: the
            request made and the answer, e.g. ``404 already gone``).
        seconds: wall time of the action, seconds.
    """

    resource_id: str
    action: str
    found: str
    detail: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class Readiness:
    """Whether a launched resource is usable: state, ports reachable, hardware as asked."""

    ready: bool
    state: str
    problems: list[str] = field(default_factory=list)
    ports: dict[str, str] = field(default_factory=dict)
    host: dict[str, Any] = field(default_factory=dict)
    final: bool = False  # waiting cannot help (wrong hardware, a dead container)


PAYLOAD_LIMITS: dict[str, dict[str, int]] = {
    "queue": {"run_request_bytes": 10_000_000, "runsync_request_bytes": 20_000_000, "response_bytes": 20_000_000},
    "load_balancing": {"request_bytes": 30_000_000, "response_bytes": 30_000_000},
}
"""Payload limits in bytes, as Runpod declares them: ``/run`` 10 MB and ``/runsync`` 20 MB per
request (docs/reference/providers.md 2.4, job API); a load-balancing worker 30 MB
(runpod/docs pull request 443, "Payload limits"). Runpod states no separate result limit for
queue jobs, so a result is held to the larger request limit; a load-balancing response to the
same 30 MB. The local endpoint enforces them (:mod:`runbook_lib.providers.local.endpoint`); phase 02
compares them with the workload's largest golden request and output
(:func:`payload_capabilities`). Sources: docs/reference/providers.md 2.3a."""


@dataclass(frozen=True)
class Capability:
    """One declared capability: ``supported`` plus the reason and source when it is not, and a
    numeric ``limit`` where the capability is a bound (``max_ports``: ports per container)."""

    supported: bool
    detail: str = ""
    source: str = ""
    limit: float | None = None


@dataclass(frozen=True)
class Capabilities:
    """What a provider offers, as data (phase 02 reads it to build the dependency map).

    ``lifecycle`` says what a stop, a restart and an interruption do and what survives each;
    ``network`` how ports are published and reached. Phase 02 maps both, side against side.
    ``http_port_protocol`` is the suffix a pod's HTTP port is declared with in a spec's
    ``ports``: ``http`` where the provider serves it through its HTTP proxy (Runpod's
    ``<id>-<port>.proxy.runpod.net``), ``tcp`` where it is published directly (Vast.ai, local)."""

    provider: str
    udp: Capability
    docker_compose: Capability
    privileged: Capability
    persistent_volume: Capability
    max_request_s: float | None
    gpu: Capability
    billing: str
    queue_endpoints: Capability
    load_balancing: Capability
    restart: Capability
    lifecycle: str
    network: str
    extra: dict[str, Capability] = field(default_factory=dict)
    http_port_protocol: str = "tcp"


def payload_capabilities(*, queue: bool, load_balancing: bool, lb_detail: str = "", source: str = "") -> dict[str, Capability]:
    """Declared payload limits per endpoint mode (``Capabilities.extra``): ``queue_request_bytes``,
    ``queue_response_bytes``, ``load_balancing_request_bytes``, ``load_balancing_response_bytes``,
    each a :class:`Capability` whose ``limit`` is in bytes (None: no limit declared). ``queue``:
    the provider's queue endpoints hold Runpod's limits (:data:`PAYLOAD_LIMITS`); ``load_balancing``:
    its load-balancing workers hold Runpod serverless' 30 MB, else ``lb_detail`` says why none is
    declared."""
    q, lb = PAYLOAD_LIMITS["queue"], PAYLOAD_LIMITS["load_balancing"]
    src = source or "docs/reference/providers.md 2.3a"
    out = {"queue_request_bytes": Capability(queue, "/run 10 MB (/runsync 20 MB) per request", src,
                                             limit=q["run_request_bytes"] if queue else None),
           "queue_response_bytes": Capability(queue, "a larger result is a FAILED job", src,
                                              limit=q["response_bytes"] if queue else None)}
    if load_balancing:
        out["load_balancing_request_bytes"] = Capability(True, "30 MB per request (a larger one is refused, 413)", src,
                                                         limit=lb["request_bytes"])
        out["load_balancing_response_bytes"] = Capability(True, "30 MB per response", src, limit=lb["response_bytes"])
    else:
        for k in ("load_balancing_request_bytes", "load_balancing_response_bytes"):
            out[k] = Capability(True, lb_detail or "no payload limit declared", src, limit=None)
    return out


@dataclass
class Attempt:
    """One try at renting an offer (evidence of the capacity search).

    Attributes:
        offer_id: the offer tried. outcome: ``ready``, ``no capacity``, ``failed readiness``,
            ``adopted``, ``not tried``, ``interrupted`` or ``error``. detail: what happened.
        resource_id: the machine it made, if any. at_s: seconds since the search began.
    """

    offer_id: str
    outcome: str
    detail: str
    resource_id: str = ""
    at_s: float = 0.0


class Lifecycle(ABC):
    """The primitives behind :meth:`Provider.apply`: what creates, changes and destroys one
    provider's resources, called only with an approved, non-dry-run plan; and whether a pod it
    launched is usable. Each adapter supplies one, as its provider's ``lifecycle``.

    Contract of stop and destroy: idempotent and bounded in time. A resource that disappears while
    it is being stopped or destroyed (listed, then gone before its status is read, before it is
    signalled, or before it is waited on) is a success, never an error; each returns what it did
    (the ``detail`` of the :class:`Teardown` record), once the resource no longer bills and its
    container disk is gone.
    """

    @abstractmethod
    def launch(self, spec: PodSpec) -> Pod:
        """Create and start one pod.

        Raises:
            NoCapacity: no machine could be had for it (remote providers, after their tries).
        """

    @abstractmethod
    def create_endpoint(self, spec: EndpointSpec) -> Endpoint:
        """Create an endpoint in ``spec.mode`` (a mode the provider cannot serve is refused when
        it is planned, :meth:`Provider.plan_endpoint`)."""

    @abstractmethod
    def stop(self, resource_id: str) -> dict[str, Any] | None:
        """Stop: compute released, storage kept (and, on some providers, still billed); returns
        what it did (evidence)."""

    @abstractmethod
    def start(self, resource_id: str) -> None:
        """Start a stopped pod again.

        Raises:
            ProviderError: the provider cannot restart a stopped resource (``capabilities().restart``).
        """

    @abstractmethod
    def destroy(self, resource_id: str) -> dict[str, Any] | None:
        """Destroy; a resource already gone is not an error; returns what it did (evidence)."""

    def readiness(self, pod: Pod, spec: PodSpec) -> Readiness:
        """Whether a launched pod is usable now. Here: it is RUNNING (a remote provider also
        re-checks ports and hardware)."""
        ok = pod.state == "RUNNING"
        return Readiness(ok, pod.state, [] if ok else [f"state {pod.state}: {pod.status_detail}"], host=pod.host)


class Provider(ABC):
    """One GPU provider, as the runbook calls it: capabilities, plans, :meth:`apply`, reads and
    offers. Public calls are idempotent.

    An adapter implements the abstract methods and its constructor (or ``create()`` factory) sets
    :attr:`lifecycle` (what :meth:`apply` calls) and :attr:`attempts` (an empty list).
    """

    name: str = ""
    dry_run_default: bool = True
    """What a plan is when its caller does not say: a dry run (the local provider never dry-runs)."""
    http_port_protocol: str = "http"
    """How a container's HTTP port is named in :attr:`PodSpec.ports` and :attr:`Pod.host` ``ports``
    (``8000/http``; Vast.ai maps TCP ports, ``8000/tcp``): :func:`http_port`."""
    lifecycle: Lifecycle
    """The primitives that create, change and destroy this provider's resources."""
    attempts: list[Attempt]
    """Every try of this provider's capacity searches so far, in order (a provider that rents no
    marketplace offers makes none); a phase records them and adds the interruptions it handles."""

    def simulator(self, *, ask: bool = False) -> str:
        """The name a simulator gave for this provider's API in its answers so far (``runpod``),
        or ``""`` for a real one; ``ask``: make one read-only request first if none was made. A
        run that talked to a simulator is a rehearsal (:mod:`runbook_lib.providers.simulator`)."""
        return ""

    def is_gone(self, resource_id: str) -> bool:
        """True when the resource is destroyed or the provider no longer knows it."""
        try:
            return self.get(resource_id).state == "DESTROYED"
        except NotFound:
            return True

    @abstractmethod
    def capabilities(self) -> Capabilities:
        """Declared capabilities."""

    def plan_launch(self, spec: PodSpec, *, dry_run: bool | None = None) -> Plan:
        """Plan a pod launch (pure); ``dry_run`` None: :attr:`dry_run_default`."""
        return Plan(self.name, "launch_pod", spec.name, spec, spec.price_usd_per_hour, _dry(self, dry_run))

    def plan_endpoint(self, spec: EndpointSpec, *, dry_run: bool | None = None) -> Plan:
        """Plan an endpoint creation (pure); it bills ``workers`` times the worker price.

        Raises:
            ProviderError: the provider cannot serve ``spec.mode`` (``capabilities().queue_endpoints``
                or ``capabilities().load_balancing``).
        """
        caps = self.capabilities()
        if spec.mode == "serverless":  # a service's endpoint behind the provider's own router (Vast.ai)
            cap = caps.extra.get("serverless") or Capability(False, "no Serverless endpoint for a service", "")
            if not cap.supported:
                raise ProviderError(f"{self.name} cannot serve a service on a Serverless endpoint in this runbook "
                                    f"({cap.detail}); run it on a pod", provider=self.name)
            return Plan(self.name, "create_endpoint", spec.name, spec, spec.price_usd_per_hour * spec.workers,
                        _dry(self, dry_run))
        cap = caps.load_balancing if spec.mode == "load_balancing" else caps.queue_endpoints
        if not cap.supported:
            other = "queue" if spec.mode == "load_balancing" else "load_balancing"
            raise ProviderError(f"{self.name} cannot serve a {spec.mode} endpoint in this runbook ({cap.detail}); set "
                                f"endpoint_mode: {other} for this side, or choose a provider that has it",
                                provider=self.name)
        return Plan(self.name, "create_endpoint", spec.name, spec, spec.price_usd_per_hour * spec.workers,
                    _dry(self, dry_run))

    def plan_destroy(self, resource_id: str, *, dry_run: bool | None = None) -> Plan:
        """Plan the destruction of a pod or endpoint (pure)."""
        return Plan(self.name, "destroy", resource_id, None, 0.0, _dry(self, dry_run))

    def job_client(self, endpoint_id: str, url: str, *, timeout_s: float = 120.0,
                   mode: str = "queue", clocks: JobClocks | None = None) -> JobClient | WorkerClient:
        """A client of endpoint ``endpoint_id`` (``url`` as the endpoint reported it), with
        whatever authentication the provider needs; ``timeout_s`` per request, seconds. ``mode``
        ``queue``: its job API, with ``clocks`` (:class:`runbook_lib.measure.timing.JobClient`'s
        ``execution_timeout_s``, ``ttl_s``, ``client_timeout_s``); ``load_balancing``: its
        worker's own HTTP contract (no job ids: ``timeout_s`` is the only clock)."""
        if mode == "load_balancing":
            return WorkerClient(url, timeout_s=timeout_s)
        return JobClient(url, timeout_s=timeout_s, **(clocks or {}))

    def apply(self, plan: Plan, approval: Any) -> Pod | Endpoint | Teardown | None:
        """Carry out ``plan`` once ``approval`` matches its fingerprint, through :attr:`lifecycle`;
        a dry-run plan calls nothing and returns None.

        Returns:
            The pod or endpoint for ``launch_pod``, ``create_endpoint`` and ``start``; the
            :class:`Teardown` record for ``stop`` and ``destroy`` (:func:`teardown`).

        Raises:
            ApprovalRequired: the approval is missing or names another plan (before any call).
            ProviderError: an action this provider does not support, or the plan names another
                provider (before any call).
        """
        require_approval(plan, approval, self.name)
        if plan.dry_run:
            return None
        if plan.action == "launch_pod" and isinstance(plan.spec, PodSpec):
            return self.lifecycle.launch(plan.spec)
        if plan.action == "create_endpoint" and isinstance(plan.spec, EndpointSpec):
            return self.lifecycle.create_endpoint(plan.spec)
        if plan.action in ("destroy", "stop"):
            return teardown(self, plan.action, plan.target)
        if plan.action == "start":
            self.lifecycle.start(plan.target)
            return self.get(plan.target)
        raise ProviderError(f"unknown plan action {plan.action!r}", provider=self.name)

    @abstractmethod
    def wait_exit(self, resource_id: str, *, timeout_s: float, finished: Callable[[], bool] | None = None) -> Pod:
        """Wait until a pod no longer runs, or ``finished()`` says its work is done (a store
        completion marker), whichever comes first.

        Raises:
            ProviderTimeout: still running after ``timeout_s`` seconds.
        """

    @abstractmethod
    def log_tail(self, resource_id: str, n_bytes: int = 4000) -> str:
        """The last ``n_bytes`` of what the pod printed, or what the provider says about it ("" if
        nothing)."""

    def describe(self, resource_id: str) -> dict[str, Any]:
        """What the provider reports about an existing (source) pod: state, price and the machine
        (GPU, CUDA, disk, ports, environment variable *names*; values are never kept).

        Raises:
            NotFound: no such pod.
        """
        pod = self.get(resource_id)
        host = pod.host if isinstance(pod, Pod) else {}
        return {"provider": self.name, "id": pod.id, "name": pod.name, "state": pod.state,
                "price_usd_per_hour": pod.price_usd_per_hour, **host}

    def search_offers(self, req: Any, *, ports: int = 0) -> list[Offer]:
        """Offers matching requirement ranges ``req`` (an ``OfferSpec``) with at least ``ports``
        mappable ports, normalized (read-only).

        Raises:
            ProviderError: the provider has no marketplace (a local pod's machine is its profile).
        """
        raise ProviderError(f"{self.name} has no offer marketplace: its pods run on the machine the profile names; "
                            "offer requirements apply to remote targets", provider=self.name)

    def withdraw_offer(self, offer_id: str) -> None:
        """Make ``offer_id`` unavailable to later searches (a drill). Only a provider whose offers
        this runbook owns (the local provider's declared machines) can.

        Raises:
            ProviderError: always here: a marketplace's offers are not ours to withdraw.
        """
        raise ProviderError(f"{self.name} cannot withdraw offer {offer_id!r}: its offers are the marketplace's",
                            provider=self.name)

    @abstractmethod
    def get(self, resource_id: str) -> Pod | Endpoint:
        """Current state of a pod or endpoint.

        Raises:
            NotFound: no such resource was ever created here.
        """

    @abstractmethod
    def list(self, *, labels: dict[str, str]) -> list[Pod | Endpoint]:
        """Every resource (any state) whose labels include ``labels``."""


def http_port(provider: Provider, port: int) -> str:
    """How ``provider`` publishes a container's HTTP ``port`` (``"8000/http"``, ``"8000/tcp"``)."""
    return f"{port}/{provider.http_port_protocol}"


def http_url(provider: Provider, pod: Pod, port: int) -> str:
    """The base URL that reaches ``pod``'s HTTP ``port`` as the provider published it, no trailing
    slash: the URL its report gives (``host["urls"]``: Runpod's proxy, which may carry a path),
    else ``http://`` and the published address.

    Raises:
        ProviderError: the provider published no address for that port (yet).
    """
    key = http_port(provider, port)
    url = (pod.host.get("urls") or {}).get(key)
    if url:
        return str(url).rstrip("/")
    addr = (pod.host.get("ports") or {}).get(key)
    if not addr:
        raise ProviderError(f"{provider.name} pod {pod.id} has no published address for port {key} (ports: "
                            f"{pod.host.get('ports')})", provider=provider.name, resource_id=pod.id)
    return f"http://{addr}".rstrip("/")


def _dry(provider: Provider, dry_run: bool | None) -> bool:
    return provider.dry_run_default if dry_run is None else dry_run


def plan_stop(provider: Provider, resource_id: str, *, dry_run: bool | None = None) -> Plan:
    """Plan stopping a pod of ``provider``: compute released, its volume kept (pure)."""
    return Plan(provider.name, "stop", resource_id, None, 0.0, _dry(provider, dry_run))


def plan_start(provider: Provider, resource_id: str, *, dry_run: bool | None = None,
               price_usd_per_hour: float = 0.0) -> Plan:
    """Plan restarting a stopped pod of ``provider`` (it bills ``price_usd_per_hour``, USD per
    hour, again once running).

    Raises:
        ProviderError: the provider cannot restart a stopped resource (``capabilities().restart``).
    """
    restart = provider.capabilities().restart
    if not restart.supported:
        raise ProviderError(f"{provider.name} cannot start a stopped resource: {restart.detail}; launch a new pod "
                            "instead", provider=provider.name)
    return Plan(provider.name, "start", resource_id, None, price_usd_per_hour, _dry(provider, dry_run))


def require_approval(plan: Plan, approval: Any, provider: str) -> None:
    """Refuse a plan that is not approved or belongs to another provider than ``provider`` (the
    registry name), before any call.

    Raises:
        ApprovalRequired: ``approval`` is missing or names another fingerprint.
        ProviderError: the plan names another provider.
    """
    if approval is None or getattr(approval, "fingerprint", None) != plan.fingerprint:
        raise ApprovalRequired(
            f"plan {plan.action} {plan.target!r} (fingerprint {plan.fingerprint[:16]}...) is not approved")
    if plan.provider != provider:
        raise ProviderError(f"plan is for provider {plan.provider!r}, not {provider!r}", provider=provider)


def teardown(provider: Provider, action: str, resource_id: str) -> Teardown:
    """Run ``provider.lifecycle``'s ``stop`` or ``destroy`` on ``resource_id`` and time it, in
    seconds; what :meth:`Provider.apply` does with an approved stop or destroy plan. A resource the
    provider no longer knows is found ``"gone"`` and left alone: nothing bills.

    Raises:
        ProviderError: ``action`` is neither, or the resource still runs after the bounded
            teardown (the message names what survived).
    """
    if action not in ("stop", "destroy"):
        raise ProviderError(f"teardown action must be 'stop' or 'destroy', got {action!r}", provider=provider.name)
    t0 = time.monotonic()
    found: str
    try:
        found = provider.get(resource_id).state
    except NotFound:
        found = "gone"
    if found == "gone":
        detail: dict[str, Any] = {"note": "the provider no longer knows it: already destroyed"}
    else:
        life = provider.lifecycle
        detail = (life.stop if action == "stop" else life.destroy)(resource_id) or {}
    return Teardown(resource_id, action, found, detail, round(time.monotonic() - t0, 3))
