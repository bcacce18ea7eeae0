"""Runpod over REST v2 (pods, catalog, serverless management) and the job API.

Sources (paraphrased in ``docs/reference/providers.md`` section 2):

* REST v2, ``https://api.runpod.io/v2/...``: GA 2026-08-18; REST v1 was retired 2026-11-15
  (runpod/docs ``release-notes.mdx``, ``api-reference-v2/migrate-from-v1.mdx``). Errors are RFC
  9457 problem JSON; 429 carries ``Retry-After`` and ``RateLimit`` (``openapi.json``).
* Job API, ``https://api.runpod.ai/v2/{endpoint_id}/run|runsync|status|cancel|retry|purge-queue|health``
  (runpod/docs ``serverless/endpoints/operation-reference.mdx``). A job whose TTL expired answers
  404 on ``/status``: that is *expired*, not a crash.
* GraphQL is deprecated (retiring early 2027) and used only for spot pods, which REST v2 lacks,
  behind ``runpod_graphql_spot`` with a warning (skypilot ``sky/provision/runpod/utils.py``).
* The no-capacity answer is a 400 problem (GraphQL: ``extensions.code = SUPPLY_CONSTRAINT``)
  saying "There are no longer any instances available..." [unverified: third-party fixtures].
"""

from __future__ import annotations

import math
import shlex
import time
import warnings
from dataclasses import replace
from typing import Any

from runbook_lib._time import parse_iso
from runbook_lib.errors import (
    CreateOutcomeUnknown,
    NoCapacity,
    NotFound,
    ProviderError,
    ProviderTimeout,
    WorkloadError,
)
from runbook_lib.measure.timing import JobClient, JobClocks, WorkerClient
from runbook_lib.params import RUNPOD_LB_ENV_NAMES
from runbook_lib.providers.api import ApiClient, KeySource, api_url
from runbook_lib.providers.base import (
    Capabilities,
    Capability,
    Endpoint,
    EndpointSpec,
    Plan,
    Pod,
    PodSpec,
    payload_capabilities,
)
from runbook_lib.providers.offers import Offer, canonical_gpu
from runbook_lib.providers.remote import (
    RemoteLifecycle,
    RemoteProvider,
    decode_labels,
    encode_labels,
    launch_env,
    registry_login,
)
from runbook_lib.providers.runpod.wire import CAPACITY_WORDS, JOB_URL, REST_URL, RunpodWire, classify

PROXY_URL = "https://{pod_id}-{port}.proxy.runpod.net"
"""A pod's HTTP port through Runpod's proxy (runpod/docs pods/configuration/expose-ports.mdx)."""
REST_URL_ENV = "RUNBOOK_RUNPOD_API_URL"  # overrides REST_URL unless params set runpod api_url
JOB_URL_ENV = "RUNBOOK_RUNPOD_JOB_API_URL"  # overrides JOB_URL unless params set job_api_url
PROXY_URL_ENV = "RUNBOOK_RUNPOD_PROXY_URL"  # overrides PROXY_URL unless params set proxy_url
LB_URL = "https://{endpoint_id}.api.runpod.ai"
"""A load-balancing endpoint's base URL; a request to ``<it>/<path>`` goes to a worker's server
(docs.runpod.io/serverless/load-balancing/overview)."""
LB_URL_ENV = "RUNBOOK_RUNPOD_LB_URL"  # overrides LB_URL unless params set lb_url
LABELS_ENV = "RUNBOOK_LABELS"
NAME_LABELS_SEP = " | "
"""A service pod (:attr:`PodSpec.service`) carries its labels in its name after this separator
instead of in ``RUNBOOK_LABELS``: Runpod pods have no label field, and a team's service runs with
none of the runbook's variables."""
DISK_USD_PER_GB_MONTH = 0.10
"""Container and volume disk on a running pod, USD per GB-month (runpod.io/pricing; the API does
not publish it) [unverified]."""
PROXY_LIMIT_S = 100.0  # HTTP proxy response limit (Cloudflare 524), runpod/docs pods/configuration/expose-ports.mdx
HTTP_PORT_PROTOCOL = "http"
"""How a pod's HTTP port is declared (``8000/http``): served through Runpod's HTTP proxy
(runpod/docs pods/configuration/expose-ports.mdx)."""
STATE = {"PROVISIONING": "CREATED", "STARTING": "CREATED", "RUNNING": "RUNNING", "EXITED": "EXITED",
         "ERROR": "EXITED", "TERMINATED": "DESTROYED"}
"""Runpod pod status -> runbook pod state."""


SERVERLESS_POOLS: dict[str, tuple[str, ...]] = {
    "AMPERE_16": ("RTX A4000", "RTX 4000 Ada", "RTX 2000 Ada"),
    "AMPERE_24": ("RTX A4500", "RTX A5000", "RTX 3090"),
    "ADA_24": ("L4", "RTX 4090"),
    "ADA_32_PRO": ("RTX 5090",),
    "AMPERE_48": ("A40", "RTX A6000"),
    "ADA_48_PRO": ("L40S", "L40", "RTX 6000 Ada"),
    "AMPERE_80": ("A100 PCIe", "A100 SXM"),
}
"""Runpod Serverless GPU pools and the GPU models in each (canonical names,
:func:`~runbook_lib.providers.offers.canonical_gpu`), from Runpod's pool table
(https://docs.runpod.io/flash/configuration/gpu-types, "Available GPU pools"). Serverless endpoints
select hardware by pool: a GPU model stands for its pool
(https://docs.runpod.io/sdk/configuration/gpu-types). Pools this table does not list are still
accepted by name in ``gpu_priority``."""


def serverless_pools(priority: tuple[str, ...], gpu_names: tuple[str, ...]) -> tuple[str, ...]:
    """The ``gpu.pools`` of a queue endpoint, most preferred first: ``priority`` (the profile's
    ``gpu_priority``: pool ids such as ``ADA_24``, or GPU models, each standing for its pool), else
    the pools of the offer's ``gpu_names``. Duplicates are dropped, order kept.

    Raises:
        ProviderError: a GPU model no listed pool holds (name its pool in ``gpu_priority``), or
            nothing to choose a pool from.
    """
    by_gpu = {gpu.upper(): pool for pool, gpus in SERVERLESS_POOLS.items() for gpu in gpus}
    out: list[str] = []
    for name in priority or gpu_names:
        if name.upper() in SERVERLESS_POOLS or (name.isupper() and "_" in name):  # a pool id
            pool = name.upper()
        else:
            pool = by_gpu.get(canonical_gpu(name).upper(), "")
            if not pool:
                raise ProviderError(f"runpod: GPU {name!r} is in no Serverless pool this runbook knows "
                                    f"({', '.join(SERVERLESS_POOLS)}); name its pool in the profile's gpu_priority "
                                    "(https://docs.runpod.io/flash/configuration/gpu-types)", provider="runpod")
        if pool not in out:
            out.append(pool)
    if not out:
        raise ProviderError("runpod: a queue endpoint needs GPU pools and the profile names none; set gpu_priority "
                            "(e.g. [ADA_24]) or offer.gpu_names", provider="runpod")
    return tuple(out)


def default_key(ref: str = "") -> KeySource:
    """``ref`` if given, else ``env:RUNPOD_API_KEY`` (runpodctl) then ``~/.runpod/config.toml``
    (runpod-python ``runpod/cli/groups/config/functions.py``)."""
    refs = (ref,) if ref else ("env:RUNPOD_API_KEY", "file:~/.runpod/config.toml")
    return KeySource("runpod", refs)


def _epoch(ts: str | None) -> float:
    return parse_iso(ts).timestamp() if ts else 0.0


def pod_from_api(p: dict[str, Any], proxy_url: str) -> Pod:
    """A pod as ``GET /v2/pods/{id}`` answers it; an HTTP port's address is its ``proxy_url``
    address (``host:port``; its whole URL in ``urls``), a TCP port's the public IP and port."""
    rt = p.get("runtime") or {}
    ports: dict[str, str] = {}
    urls: dict[str, str] = {}
    for m in rt.get("ports") or []:
        if m.get("type") == "http":
            urls[f"{m['private']}/http"] = proxy_url.format(pod_id=str(p["id"]), port=int(m["private"]))
            ports[f"{m['private']}/http"] = _netloc(urls[f"{m['private']}/http"])
        elif m.get("public") and m.get("ip"):
            ports[f"{m['private']}/tcp"] = f"{m['ip']}:{m['public']}"
    gpu = p.get("gpu") or {}
    host = {"gpu_name": gpu.get("id", ""), "gpu_count": gpu.get("count"), "cuda_max": p.get("cudaVersion") or "",
            "disk_gb": p.get("disk"), "ports": ports, "urls": urls, "data_center": p.get("dataCenterId"),
            "image": p.get("image", ""), "command": shlex.split(p.get("args") or ""),
            "env_names": sorted((p.get("env") or {}).keys()), "registry": p.get("registry")}
    status = str(p.get("status", ""))
    name, _, in_name = str(p.get("name", "")).partition(NAME_LABELS_SEP)
    labels = decode_labels((p.get("env") or {}).get(LABELS_ENV)) or decode_labels(in_name)
    return Pod(str(p["id"]), name, STATE.get(status, "CREATED"), labels,  # type: ignore[arg-type]
               float(p.get("cost") or 0.0), _epoch(p.get("createdAt")), None, None, "", "",
               status_detail=status.lower(), host=host)


def endpoint_from_api(e: dict[str, Any], job_url: str, lb_url: str = LB_URL) -> Endpoint:
    """An endpoint as ``GET /v2/serverless/{id}`` answers it. A queue endpoint's URL is
    ``<job_url>/v2/{id}``, the job API's base as the adapter reaches it (``requestUrls`` name
    Runpod's own address, which params or the environment may replace, as for
    :meth:`RunpodProvider.job_client`); a ``LOAD_BALANCER`` one's is ``lb_url`` with its id
    (:data:`LB_URL`). Its labels are in ``RUNBOOK_LABELS``, or (a service's endpoint) in its name
    after :data:`NAME_LABELS_SEP`."""
    lb = e.get("type") == "LOAD_BALANCER"
    url = lb_url.format(endpoint_id=e["id"]) if lb else f"{job_url}/v2/{e['id']}"
    name, _, in_name = str(e.get("name", "")).partition(NAME_LABELS_SEP)
    labels = decode_labels((e.get("env") or {}).get(LABELS_ENV)) or decode_labels(in_name)
    workers = int((e.get("workers") or {}).get("max", 0))
    return Endpoint(str(e["id"]), name, "RUNNING", url, workers, labels, 0.0, _epoch(e.get("createdAt")),
                    mode="load_balancing" if lb else "queue")


LB_ENV = RUNPOD_LB_ENV_NAMES
"""What a load-balancing endpoint's worker is told in its environment (docs.runpod.io/serverless/
load-balancing/overview)."""


def lb_env(port: int) -> dict[str, str]:
    """:data:`LB_ENV` for a service that listens on ``port``: both on it."""
    return {name: str(port) for name in LB_ENV}


def endpoint_settings(e: dict[str, Any]) -> dict[str, Any]:
    """What ``GET /v2/serverless/{id}`` reports of an endpoint's settings, in the runbook's words
    (values as Runpod gives them; environment variable *names* only): type, template and its
    version, image, workers min and max, idle timeout (s), GPU pools and count, network volumes,
    execution timeout (ms), flashboot, scaling, data centers. A field Runpod does not report is
    None (docs/reference/providers.md 2.2, "Endpoint management (v2)")."""
    workers = e.get("workers") or {}
    gpu = e.get("gpu") or {}
    return {"type": e.get("type"), "template": e.get("templateId") or e.get("template"),
            "template_version": e.get("version"), "image": e.get("image"),
            "workers_min": workers.get("min"), "workers_max": workers.get("max"),
            "idle_timeout_s": workers.get("idleTimeout"), "gpu_pools": list(gpu.get("pools") or []),
            "gpu_count": gpu.get("count"), "network_volumes": list(e.get("networkVolumes") or []),
            "execution_timeout_ms": e.get("timeout"), "flashboot": e.get("flashboot"),
            "scaling": e.get("scaling"), "data_centers": list(e.get("dataCenterIds") or []),
            "env_names": sorted((e.get("env") or {}).keys())}


class RunpodProvider(RemoteProvider):
    """Runpod pods, queue endpoints, and load_balancing endpoints.

    A ``load_balancing`` endpoint of the runbook's own worker is served by a pod through its HTTP
    proxy: the worker is ours, and a pod gives it the same single-hop HTTP path at a per-minute
    price. A team's service (``EndpointSpec.service``) gets a real Serverless ``LOAD_BALANCER``
    endpoint instead (REST v2, reached at :data:`LB_URL`): when the team's production runs on one,
    what the migration must be judged against is that endpoint's own behaviour (workers that
    scale from ``workers.min`` to ``workers.max`` and stop after the idle timeout, routing only
    to workers whose ``/ping`` answers 200, no queue and no retries, requests cut at 5.5 min),
    which a pod behind the proxy does not have.

    Args:
        api: REST v2 client (base ``https://api.runpod.io``); its transport and key also serve
            the job API and GraphQL. Every Runpod request goes through :attr:`wire`
            (:class:`~runbook_lib.providers.runpod.wire.RunpodWire`); what creates, stops and
            destroys resources is its :attr:`lifecycle` (:class:`RunpodLifecycle`).
        **kwargs: see :class:`RemoteProvider`.
    """

    name = "runpod"
    TERMINAL_BAD = ("error",)
    job_url = JOB_URL  # the serverless job API's base; create() sets it from params or the environment
    proxy_url = PROXY_URL  # a pod's HTTP port through the proxy; create() sets it likewise
    lb_url = LB_URL  # a load-balancing endpoint's base; create() sets it likewise
    PROBE_PATH = "/v2/pods"
    wire: RunpodWire  # every Runpod request; create() builds it over the adapter's api

    def capabilities(self) -> Capabilities:
        src = "runpod/docs pods/overview.mdx, pods/configuration/expose-ports.mdx"
        return Capabilities(
            provider=self.name,
            udp=Capability(False, "TCP and HTTP ports only", src),
            docker_compose=Capability(False, "no Docker daemon inside a pod: the image is the pod", src),
            privileged=Capability(False, "containers are not privileged", src),
            persistent_volume=Capability(True, "volume disk at /workspace survives stop, dies on terminate; network "
                                               "volumes must be attached at create, same data center",
                                         "runpod/docs pods/storage/types.mdx"),
            max_request_s=PROXY_LIMIT_S,
            gpu=Capability(True, "NVIDIA and AMD GPUs by type id", "GET /v2/catalog/gpus"),
            billing="per minute; no ingress or egress fees (runpod/docs pods/overview.mdx)",
            queue_endpoints=Capability(True, "serverless queue endpoints and the job API",
                                       "runpod/docs serverless/endpoints/operation-reference.mdx"),
            load_balancing=Capability(True, "the runbook's worker: a pod running its HTTP server, reached through the "
                                            "pod's HTTP proxy (<pod>-<port>.proxy.runpod.net), which cuts a request "
                                            "longer than 100 s with a 524; a team's service: a Serverless "
                                            "LOAD_BALANCER endpoint (<id>.api.runpod.ai, /ping routing, cut at 5.5 "
                                            "min)", "runpod/docs pods/configuration/expose-ports.mdx; "
                                            "docs.runpod.io/serverless/load-balancing/overview"),
            restart=Capability(True, "a stopped pod starts again on its machine, possibly with zero GPUs "
                                     "(readiness re-checks)", "runpod/docs pods/troubleshooting/zero-gpus.mdx"),
            lifecycle="stop keeps the /workspace volume and wipes the container disk; start on the same machine, "
                      "possibly with zero GPUs; spot pods can be interrupted (runpod/docs pods/storage/types.mdx)",
            network="HTTP ports through the proxy (<pod>-<port>.proxy.runpod.net, cut at 100 s), TCP ports on a "
                    "public IP and port; SSH (runpod/docs pods/configuration/expose-ports.mdx)",
            http_port_protocol=HTTP_PORT_PROTOCOL,
            extra={
                "ports_after_create": Capability(False, "ports are fixed at creation; changing them recreates the pod "
                                                        "and loses data", "skypilot PR #3748"),
                "interruptible": Capability(bool(self.profile is not None and self.profile.runpod_graphql_spot),
                                            "spot pods only via deprecated GraphQL podRentInterruptable",
                                            "skypilot sky/provision/runpod/utils.py"),
                "stopped_keeps_gpu": Capability(False, "a stopped pod may restart with zero GPUs",
                                                "runpod/docs pods/troubleshooting/zero-gpus.mdx"),
                **payload_capabilities(queue=True, load_balancing=False,
                                       lb_detail="a pod behind its HTTP proxy: no payload limit documented; requests "
                                                 "are cut at 100 s"),
            },
        )

    # -- offers ----------------------------------------------------------------------------------

    def search_offers(self, req: Any, *, ports: int = 0) -> list[Offer]:
        """``GET /v2/catalog/gpus`` with availability, for ``req.gpu_count_min`` GPUs in ``req.cloud``.

        Prices in the catalog are per GPU; an offer's price is for all of its GPUs. The catalog has
        no vCPU, RAM or spot price, so those stay unknown (re-checked on the canary).
        """
        params: dict[str, Any] = {"include": "AVAILABILITY", "product": "POD", "count": max(1, req.gpu_count_min),
                                  "cloud": req.cloud}
        if req.cuda_min:
            params["minCudaVersion"] = req.cuda_min
        gpus = self.wire.catalog_gpus(params)
        cloud = req.cloud.lower()
        count = max(1, req.gpu_count_min)
        offers = []
        for g in gpus:
            if not g.get(cloud):
                continue
            cudas = [c["version"] for c in g.get("cudaVersions") or [] if c.get("available")]
            dcs = [d["id"] for d in g.get("dataCenters") or [] if d.get("availability", "NONE") != "NONE"]
            offers.append(Offer(
                provider=self.name, offer_id=g["id"], gpu_name=canonical_gpu(g.get("name") or g["id"]),
                gpu_name_raw=g["id"], gpu_count=count, vram_mib=int(g.get("memory", 0)) * 1024, vcpu=None,
                ram_gib=None, disk_gb=None, cuda_max=max(cudas, key=lambda v: tuple(map(int, v.split(".")))) if cudas
                else "", usd_per_hour=float(g["price"][cloud]) * count, interruptible_usd_per_hour=None,
                storage_usd_per_gb_month=DISK_USD_PER_GB_MONTH, egress_usd_per_gb=0.0, region=",".join(dcs),
                reliability=None, availability=str(g.get("availability", "listed")),
                extra={"pool": g.get("pool"), "max_count": g.get("maxCount", {}).get(cloud)}))
        return offers

    # -- reads -----------------------------------------------------------------------------------

    def fetch(self, resource_id: str) -> Pod:
        try:
            return pod_from_api(self.wire.get_pod(resource_id), self.proxy_url)
        except NotFound:
            raise NotFound(f"runpod: no pod {resource_id} (terminated or never created)", provider=self.name,
                           resource_id=resource_id) from None

    def _list_raw(self) -> list[Pod | Endpoint]:
        out: list[Pod | Endpoint] = [pod_from_api(p, self.proxy_url) for p in self.wire.list_pods()]
        return out + [endpoint_from_api(e, self.job_url, self.lb_url) for e in self.wire.list_endpoints()]

    def get(self, resource_id: str) -> Pod | Endpoint:
        """A pod, else a queue endpoint, with that id.

        Raises:
            NotFound: neither exists (terminated or never created).
        """
        try:
            return self.fetch(resource_id)
        except NotFound:
            pass
        try:
            return endpoint_from_api(self.wire.get_endpoint(resource_id), self.job_url, self.lb_url)
        except NotFound:
            raise NotFound(f"runpod: no pod or endpoint {resource_id} (terminated or never created)",
                           provider=self.name, resource_id=resource_id) from None

    def describe(self, resource_id: str) -> dict[str, Any]:
        """As :meth:`Provider.describe` for a pod; for a serverless endpoint, what
        ``GET /v2/serverless/{id}`` reports (:func:`endpoint_settings`) under ``endpoint``, its
        image and environment names beside the pod keys, and no command or ports (an endpoint
        runs its image's entry point and is reached over the job API).

        Raises:
            NotFound: neither a pod nor an endpoint has that id.
        """
        try:
            pod = self.fetch(resource_id)
        except NotFound:
            pass
        else:
            return {"provider": self.name, "id": pod.id, "name": pod.name, "state": pod.state,
                    "price_usd_per_hour": pod.price_usd_per_hour, **pod.host}
        try:
            e = self.wire.get_endpoint(resource_id)
        except NotFound:
            raise NotFound(f"runpod: no pod or endpoint {resource_id} (terminated or never created)",
                           provider=self.name, resource_id=resource_id) from None
        ep = endpoint_from_api(e, self.job_url, self.lb_url)
        settings = endpoint_settings(e)
        return {"provider": self.name, "id": ep.id, "name": ep.name, "state": ep.state, "price_usd_per_hour": 0.0,
                "image": settings["image"] or "", "command": [], "env_names": settings["env_names"],
                "ports": {}, "url": ep.url, "endpoint": settings}

    # -- endpoints -------------------------------------------------------------------------------

    def proxy(self, pod_id: str, port: int) -> str:
        """The URL of ``pod_id``'s HTTP ``port`` through Runpod's proxy (``proxy_url`` in params,
        else ``RUNBOOK_RUNPOD_PROXY_URL``, else :data:`PROXY_URL`; ``{pod_id}`` and ``{port}``
        are filled in)."""
        return self.proxy_url.format(pod_id=pod_id, port=port)

    def plan_endpoint(self, spec: EndpointSpec, *, dry_run: bool | None = None) -> Plan:
        """As :meth:`Provider.plan_endpoint`; a queue endpoint's GPU pools (and a service's
        load-balancing endpoint's) are resolved here (:func:`serverless_pools` from
        ``spec.gpu_types``, else the profile's ``offer.gpu_names``), so the plan shows, and its
        approval covers, the pools the endpoint is created with.

        Raises:
            ProviderError: as :func:`serverless_pools`, or the provider cannot serve ``spec.mode``.
        """
        if spec.mode == "queue" or (spec.mode == "load_balancing" and spec.service):
            names = tuple(self.profile.offer.gpu_names) if self.profile is not None else ()
            spec = replace(spec, gpu_types=serverless_pools(spec.gpu_types, names))
        return super().plan_endpoint(spec, dry_run=dry_run)

    def workers(self, endpoint_id: str) -> list[dict[str, Any]]:
        """``GET /v2/serverless/{id}/workers``: each worker's id and status (RUNNING, IDLE,
        INITIALIZING, THROTTLED, UNHEALTHY)."""
        return self.wire.endpoint_workers(endpoint_id)

    def diagnose_queue(self, endpoint_id: str) -> str:
        """Why jobs sit IN_QUEUE, from worker states rather than assumed capacity (in runpod-mcp
        PR #62, 4 of 5 "capacity" timeouts were crash-looping workers).

        Returns:
            ``"serving"`` when some worker runs or idles.

        Raises:
            WorkloadError: workers are UNHEALTHY (crash-looping: the image or handler is broken).
            NoCapacity: workers are THROTTLED or none exist (no GPU to start them on).
        """
        states = [w.get("status", "") for w in self.workers(endpoint_id)]
        if any(s in ("RUNNING", "IDLE") for s in states):
            return "serving"
        if "UNHEALTHY" in states:
            raise WorkloadError(f"runpod endpoint {endpoint_id}: {states.count('UNHEALTHY')} worker(s) UNHEALTHY "
                                "(crash-looping), not a capacity problem; read the worker logs and fix the image")
        if "INITIALIZING" in states:
            return "initializing"
        raise NoCapacity(f"runpod endpoint {endpoint_id}: jobs queued and workers {states or 'none'}: no GPU capacity "
                         "in the endpoint's pools; widen gpu pools or wait", provider=self.name,
                         resource_id=endpoint_id)

    def job_api_headers(self) -> dict[str, str]:
        """The job API's auth: the Runpod API key as Bearer (runpod/docs
        ``serverless/endpoints/send-requests.mdx``), resolved now; never recorded.

        Raises:
            AuthError: the key is not set (named by reference, never by value).
        """
        return {"Authorization": f"Bearer {self.api.key.resolve()}"}

    def job_client(self, endpoint_id: str, url: str = "", *, timeout_s: float = 120.0,
                   mode: str = "queue", clocks: JobClocks | None = None) -> JobClient | WorkerClient:
        """A :class:`runbook_lib.measure.timing.JobClient` for ``<job API>/v2/{endpoint_id}`` (the job
        API's base: ``https://api.runpod.ai`` unless params or the environment name another) with
        the API key as Bearer auth, over this provider's transport. ``url`` is not used: the job
        API's address follows from the endpoint id."""
        import httpx

        if mode != "queue":
            return super().job_client(endpoint_id, url, timeout_s=timeout_s, mode=mode)

        base = f"{self.job_url}/v2/{endpoint_id}"
        http = httpx.Client(base_url=base, transport=self.api.transport, timeout=timeout_s,
                            headers=self.job_api_headers(),
                            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))
        return JobClient(base, http=http, **(clocks or {}))


class RunpodLifecycle(RemoteLifecycle):
    """What creates, stops, starts and destroys Runpod resources: pods (REST v2, or spot pods over
    GraphQL), queue endpoints (serverless), and ``load_balancing`` endpoints served by a pod."""

    provider: RunpodProvider

    def create_on_offer(self, spec: PodSpec, offer_id: str, env: dict[str, str]) -> str:
        """``POST /v2/pods`` for ``spec`` on GPU type ``offer_id`` (the profile's GPU count, cloud,
        CUDA floor and data centers), its labels in ``RUNBOOK_LABELS`` (a service pod's in its
        name, after :data:`NAME_LABELS_SEP`); with a bid, a spot pod (:meth:`_create_spot`).
        Returns the pod id.

        Raises:
            NoCapacity: no instance of that GPU type is free. ProviderError: a spot bid without
                ``runpod_graphql_spot``.
        """
        name = spec.name
        if spec.service:
            name = f"{spec.name}{NAME_LABELS_SEP}{encode_labels(dict(spec.labels))}"
        else:
            env = {**env, LABELS_ENV: encode_labels(dict(spec.labels))}
        req = self.provider.profile.offer if self.provider.profile is not None else None
        count = max(1, req.gpu_count_min) if req is not None else 1
        if spec.interruptible_bid_usd_per_hour is not None:
            return self._create_spot(replace(spec, name=name), offer_id, env, count)
        gpu: dict[str, Any] = {"id": offer_id, "count": count}
        if req is not None and req.cuda_min:
            gpu["minCudaVersion"] = req.cuda_min
        body: dict[str, Any] = {"name": name, "image": spec.image, "args": shlex.join(spec.command),
                                "disk": int(round(spec.disk_gb)), "env": env, "ports": list(spec.ports),
                                "cloud": req.cloud if req is not None else "SECURE", "gpu": gpu, "startSsh": False}
        login = registry_login(spec)
        if login is not None:  # a private image: the container registry credential id it is pulled with
            body["registry"] = login
        if spec.volume_gb > 0:  # the volume disk at /workspace survives a stop; Runpod's minimum is 10 GB
            body["mounts"] = {"persistent": {"size": max(10, math.ceil(spec.volume_gb)), "path": "/workspace"}}
        if req is not None and req.regions:
            body["dataCenterIds"] = list(req.regions)
        return str(self.provider.wire.create_pod(body)["id"])

    def _create_spot(self, spec: PodSpec, offer_id: str, env: dict[str, str], count: int) -> str:
        """Spot pod over the deprecated GraphQL ``podRentInterruptable`` (REST v2 has none).
        GraphQL reports client errors as HTTP 200 with ``errors``."""
        prov = self.provider
        if prov.profile is None or not prov.profile.runpod_graphql_spot:
            raise ProviderError("Runpod spot pods need the deprecated GraphQL API; set runpod_graphql_spot: true",
                                provider=prov.name)
        warnings.warn("Runpod GraphQL is deprecated and retires in early 2027; spot pods may then be unavailable "
                      "through the API", DeprecationWarning, stacklevel=2)
        bid = float(spec.interruptible_bid_usd_per_hour or 0) / count
        query = ("mutation($input: PodRentInterruptableInput!) { podRentInterruptable(input: $input) "
                 "{ id desiredStatus imageName machineId } }")
        variables = {"input": {"name": spec.name, "imageName": spec.image, "gpuTypeId": offer_id, "bidPerGpu": bid,
                               "cloudType": prov.profile.offer.cloud, "gpuCount": count,
                               "containerDiskInGb": int(round(spec.disk_gb)), "ports": ",".join(spec.ports),
                               "dockerArgs": shlex.join(spec.command),
                               "env": [{"key": k, "value": v} for k, v in env.items()]}}
        out = prov.wire.rent_spot(query, variables)
        errors = out.get("errors") or []
        if errors:
            codes = {str((e.get("extensions") or {}).get("code", "")) for e in errors}
            msg = "; ".join(str(e.get("message", "")) for e in errors)[:300]
            if "SUPPLY_CONSTRAINT" in codes or any(w in msg.lower() for w in CAPACITY_WORDS):
                raise NoCapacity(f"no spot capacity for {offer_id}: {msg}", provider=prov.name)
            raise ProviderError(f"GraphQL podRentInterruptable failed: {msg}", provider=prov.name)
        return str(out["data"]["podRentInterruptable"]["id"])

    def stop(self, resource_id: str) -> dict[str, Any]:
        """``POST /v2/pods/{id}/action {"action": "stop"}``."""
        self.provider.wire.pod_action(resource_id, "stop")
        return {"request": f"POST /v2/pods/{resource_id}/action stop", "answer": "accepted"}

    def start(self, resource_id: str) -> None:
        """``POST /v2/pods/{id}/action {"action": "start"}``; a stopped pod is tied to its machine and
        may come back with zero GPUs (runpod/docs pods/troubleshooting/zero-gpus.mdx): readiness re-checks."""
        self.provider.wire.pod_action(resource_id, "start")

    def destroy(self, resource_id: str) -> dict[str, Any]:
        """``DELETE /v2/pods/{id}``, else ``DELETE /v2/serverless/{id}``; 404 on both means gone."""
        for path in (f"/v2/pods/{resource_id}", f"/v2/serverless/{resource_id}"):
            try:
                self.provider.wire.delete(path)
                return {"request": f"DELETE {path}", "answer": "deleted"}
            except NotFound:
                continue
        return {"request": f"DELETE /v2/pods/{resource_id}, /v2/serverless/{resource_id}",
                "answer": "404 on both: already gone"}

    def create_endpoint(self, spec: EndpointSpec) -> Endpoint:
        """A queue endpoint (``POST /v2/serverless``, workers on ``spec.gpu_types`` pools), adopted
        by its labels after an unclear answer; a ``load_balancing`` one is a pod (:meth:`_create_direct`).
        A service's endpoint (``spec.service``) gets the service's environment only, its labels
        in its name after :data:`NAME_LABELS_SEP` (as a service pod's).

        Raises:
            ProviderError: what an unclear answer left is not one endpoint (:meth:`adopt`).
        """
        prov = self.provider
        lb = spec.mode == "load_balancing"
        if lb and not spec.service:  # the runbook's own load-balancing worker runs on a pod
            return self._create_direct(spec)
        name = spec.name
        if spec.service:  # a team's service gets its own environment only; its labels go in its name
            name, env = f"{spec.name}{NAME_LABELS_SEP}{encode_labels(dict(spec.labels))}", launch_env(spec)
        else:
            env = {**launch_env(spec), LABELS_ENV: encode_labels(dict(spec.labels))}
        body: dict[str, Any] = {
            "name": name, "type": "LOAD_BALANCER" if lb else "QUEUE", "image": spec.image,
            "gpu": {"pools": list(spec.gpu_types), "count": 1},
            "workers": {"min": spec.active_workers or 0, "max": spec.workers,
                        "idleTimeout": max(1, round(spec.idle_timeout_s))},
            "timeout": int(spec.execution_timeout_s * 1000), "env": env}
        if lb:  # the worker's server and its /ping on the service's port, published (load-balancing overview)
            body["env"] = {**env, **lb_env(spec.port)}
            body["ports"] = [f"{spec.port}/{HTTP_PORT_PROTOCOL}"]
        if spec.flashboot:
            body["flashboot"] = spec.flashboot
        try:
            return endpoint_from_api(prov.wire.create_endpoint(body), prov.job_url, prov.lb_url)
        except CreateOutcomeUnknown as exc:
            found = self.adopt(spec.name, dict(spec.labels), exc)
            if not isinstance(found, Endpoint):
                raise ProviderError(f"{prov.name}: after an unclear answer to creating endpoint {spec.name!r}, "
                                    f"{found.id} carries its labels but is not an endpoint; run `runbook cleanup`",
                                    provider=prov.name) from exc
            return found

    def _create_direct(self, spec: EndpointSpec) -> Endpoint:
        """A ``load_balancing`` endpoint: a pod, on the first ranked GPU type that becomes ready,
        running the ``direct`` worker (:mod:`runbook_lib.providers.local.endpoint`) on HTTP port
        ``spec.port``, reached through the pod's proxy URL. The proxy answers 502 until the worker
        listens (it binds once its model is loaded), so the endpoint is ready when ``GET /ping``
        answers 200, within ``offer.ready_timeout_s``; a pod that never answers is destroyed.

        Raises:
            NoCapacity: no ranked GPU type gave a pod. ProviderTimeout: the worker never answered.
        """
        prov = self.provider
        pod = self.launch_direct_worker(spec, f"{spec.port}/{HTTP_PORT_PROTOCOL}")
        url = prov.proxy(pod.id, spec.port)
        wait_s = prov.profile.offer.ready_timeout_s if prov.profile is not None else 1200.0
        deadline = prov.clock() + wait_s
        while not prov.http_probe(f"{url}/ping"):
            if prov.clock() >= deadline:
                self.destroy(pod.id)
                raise ProviderTimeout(f"{prov.name}: the worker on pod {pod.id} did not answer GET {url}/ping with 200 "
                                      f"within {wait_s:.0f} s (its model may not load, or it does not listen on port "
                                      f"{spec.port}); the pod was destroyed", provider=prov.name, resource_id=pod.id)
            prov.sleep(prov.poll_s)
        return Endpoint(pod.id, pod.name, pod.state, url, 1, pod.labels, pod.price_usd_per_hour, pod.created_at,
                        mode="load_balancing")


def create(*, root: Any = None, profile: Any = None, transport: Any = None, key: KeySource | None = None,
           **kwargs: Any) -> RunpodProvider:
    """Registry factory: the key comes from ``profile.api_key_ref`` or Runpod's standard places."""
    key = key or default_key(profile.api_key_ref if profile else "")
    rest = api_url(getattr(profile, "api_url", ""), REST_URL_ENV, REST_URL)
    api = ApiClient(provider="runpod", base_url=rest, key=key, transport=transport, classify=classify,
                    sleep=kwargs.get("sleep", time.sleep))
    prov = RunpodProvider(api=api, profile=profile, **kwargs)
    prov.wire = RunpodWire(api)
    prov.lifecycle = RunpodLifecycle(prov)
    prov.job_url = api_url(getattr(profile, "job_api_url", ""), JOB_URL_ENV, JOB_URL)
    prov.proxy_url = api_url(getattr(profile, "proxy_url", ""), PROXY_URL_ENV, PROXY_URL)
    prov.lb_url = api_url(getattr(profile, "lb_url", ""), LB_URL_ENV, LB_URL)
    return prov


def _netloc(url: str) -> str:
    """``host:port`` of a URL (443 for https, 80 for http when it names none)."""
    from urllib.parse import urlsplit

    u = urlsplit(url)
    return f"{u.hostname}:{u.port or (443 if u.scheme == 'https' else 80)}"
