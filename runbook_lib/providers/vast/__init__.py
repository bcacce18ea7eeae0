"""Vast.ai over its REST API (``https://console.vast.ai/api/v0``; instance list on ``/api/v1``).

Sources (paraphrased in ``docs/reference/providers.md`` section 3): vast-ai/docs
``api-reference`` pages, vast-cli ``vastai/api/offers.py`` / ``query.py`` / ``instances.py``,
dstack ``backends/vastai``. Where the docs and the working clients disagree (``env`` format,
``ports`` shape, ``type`` spelling) this module follows the clients:

* offers: ``POST /api/v0/bundles/`` with the CLI's defaults (verified, rentable, not rented, not
  external); ``type: "on-demand"`` or ``"bid"``;
* create: ``PUT /api/v0/asks/{offer_id}/`` with object-form ``env`` (``{"K": "V",
  "-p 8000:8000": "1"}``); ``price`` present makes it interruptible; an error body that still
  carries ``new_contract`` means an instance exists and must be destroyed (dstack);
* poll ``GET /api/v0/instances/{id}/`` (``{"instances": {...} | null}``): ``ports`` is a Docker map
  whose ``HostPort`` is a string; ``public_ipaddr`` may carry whitespace;
* 429 is often plain text without ``Retry-After``: the client backs off itself.
"""

from __future__ import annotations

import json
import shlex
import time
from typing import Any

from runbook_lib.errors import NoCapacity, NotFound, ProviderError
from runbook_lib.offer_query import parse_query
from runbook_lib.providers.api import ApiClient, KeySource, api_url
from runbook_lib.providers.base import (
    Capabilities,
    Capability,
    Endpoint,
    EndpointSpec,
    Pod,
    PodSpec,
    payload_capabilities,
)
from runbook_lib.providers.offers import VRAM_SLACK, Offer, canonical_gpu
from runbook_lib.providers.remote import (
    RemoteLifecycle,
    RemoteProvider,
    decode_labels,
    encode_labels,
    launch_env,
    registry_login,
)
from runbook_lib.providers.vast.wire import BASE_URL, VastWire, docker_env

BASE_URL_ENV = "RUNBOOK_VAST_API_URL"  # overrides BASE_URL unless params set api_url
AUTOSCALER_URL = "https://run.vast.ai"
"""The Serverless autoscaler: ``/route/``, ``/pubkey/``, ``/get_endpoint_workers/`` (vastai 1.9.1
``api/endpoints.py``, ``serverless/client/endpoint.py``)."""
AUTOSCALER_URL_ENV = "RUNBOOK_VAST_AUTOSCALER_URL"  # overrides AUTOSCALER_URL unless params set autoscaler_url
ENDPOINT_PREFIX = "ept-"
"""A Serverless endpoint's id in the runbook (``ept-<endptjob id>``): apart from instance ids,
which are numbers too."""
NAME_LABELS_SEP = " | "
"""A service endpoint carries the run's labels in its ``endpoint_name`` after this separator
(endpoints have no label field) [unverified: which characters Vast.ai accepts in a name]."""
PYWORKER_ENV = ("PYWORKER_REPO", "PYWORKER_ROUTE", "PYWORKER_HEALTHCHECK")
"""The adapter's variables a Serverless worker gets beside the service's own (the template's
``env``): the PyWorker repository Vast's start script runs, and the route and health check its
``worker.py`` configures."""
NAME_LABEL = "name"  # Vast instances have no name field: the runbook keeps the pod name among its labels
OFFER_LIMIT = 64
SEARCH_DEFAULTS: dict[str, Any] = {"verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True},
                                   "rented": {"eq": False}}
"""What the vast CLI adds to every search (vastai/api/offers.py); sent explicitly (vast-cli #391:
the CLI once dropped ``rentable`` silently)."""

STATUS = {None: "CREATED", "created": "CREATED", "loading": "CREATED", "running": "RUNNING", "exited": "EXITED",
          "stopped": "STOPPED", "frozen": "STOPPED", "offline": "EXITED", "unknown": "EXITED", "rebooting": "CREATED"}
"""Vast ``actual_status`` -> runbook pod state (vast-ai/docs cli/reference/show-instance.mdx)."""


def default_key(ref: str = "") -> KeySource:
    """``ref`` if given, else vast-cli's order: ``VAST_API_KEY``, ``~/.config/vastai/vast_api_key``,
    the legacy ``~/.vast_api_key`` (vast-cli ``vastai/_base.py``)."""
    refs = (ref,) if ref else ("env:VAST_API_KEY", "file:~/.config/vastai/vast_api_key", "file:~/.vast_api_key")
    return KeySource("vast", refs)


def search_body(req: Any, *, ports: int = 0) -> dict[str, Any]:
    """The ``/bundles/`` body for requirement ranges ``req``: explicit defaults, our ranges,
    then the operator's query (which wins on the fields it names)."""
    q: dict[str, Any] = json.loads(json.dumps(SEARCH_DEFAULTS))
    q["num_gpus"] = {"gte": req.gpu_count_min, "lte": req.gpu_count_max}
    if req.gpu_names:
        q["gpu_name"] = {"in": list(req.gpu_names)}
    if req.vram_gib_min:
        q["gpu_ram"] = {"gte": int(req.vram_gib_min * 1024 * (1 - VRAM_SLACK))}
    if req.cuda_min:
        q["cuda_max_good"] = {"gte": float(req.cuda_min)}
    if req.disk_gb:
        q["disk_space"] = {"gte": req.disk_gb}
    if req.vcpu_min:
        q["cpu_cores_effective"] = {"gte": req.vcpu_min}
    if req.reliability_min:
        q["reliability2"] = {"gte": req.reliability_min}
    if ports:
        q["direct_port_count"] = {"gte": ports}
    q.update(parse_query(req.query) if req.query else {})
    q["order"] = [["dph_total", "asc"]]
    q["limit"] = OFFER_LIMIT
    q["type"] = "bid" if req.interruptible else "on-demand"
    q["allocated_storage"] = req.disk_gb
    return q


def search_params(req: Any) -> str:
    """A workergroup's ``search_params`` for requirement ranges ``req``, in the CLI's query
    language (vast-ai/docs ``cli/reference/search-offers``: ``field op value``, space-separated;
    a GPU name's spaces become underscores), then the operator's ``query``. The autoscaler rents
    workers on offers that match it (the CLI appends ``verified=True rentable=True
    rented=False``, as this does)."""
    parts = [f"num_gpus>={req.gpu_count_min}", f"num_gpus<={req.gpu_count_max}"]
    if req.gpu_names:
        names = [canonical_gpu(n).replace(" ", "_") for n in req.gpu_names]
        parts.append(f"gpu_name={names[0]}" if len(names) == 1 else f"gpu_name in [{','.join(names)}]")
    if req.vram_gib_min:
        parts.append(f"gpu_ram>={req.vram_gib_min:g}")
    if req.cuda_min:
        parts.append(f"cuda_max_good>={req.cuda_min}")
    if req.reliability_min:
        parts.append(f"reliability>={req.reliability_min:g}")
    if req.max_usd_per_hour:
        parts.append(f"dph_total<={req.max_usd_per_hour:g}")
    if req.query:
        parts.append(req.query)
    return " ".join([*parts, "verified=True rentable=True rented=False"])


def _classify(status: int, body: Any, text: str) -> ProviderError | None:
    """``no_such_ask`` (404/410) means the offer is gone: try the next one. An error that still
    names ``new_contract`` left an instance behind (a failed bid): the caller destroys it."""
    body = body if isinstance(body, dict) else {}
    contract = str(body.get("new_contract") or "")
    if contract:
        return NoCapacity(f"create failed ({body.get('error')}: {body.get('msg', '')}) but left instance {contract}; "
                          "it is destroyed before the next try", provider="vast", resource_id=contract)
    if status in (404, 410) and body.get("error") == "no_such_ask":
        return NoCapacity(f"offer no longer available (HTTP {status} no_such_ask)", provider="vast")
    return None


VAST_MB_PER_GB = 1000  # vast-cli: cpu_ram is shown as x / 1000 GB and queried as GB x 1000 (vastai/api/query.py)


def _offer(o: dict[str, Any]) -> Offer:
    cores, eff = o.get("cpu_cores"), o.get("cpu_cores_effective")
    ram = o.get("cpu_ram")
    # Host RAM pro-rated to the offer's cores (gpuhunt), in GB as Vast.ai counts them: its MB / 1000,
    # the unit vast-cli shows and its query language takes (offer_query._GB_TO_MB), so ram_gib_min: 32
    # and query cpu_ram>=32 accept the same whole-host offers.
    ram_gib = (ram * (eff / cores) / VAST_MB_PER_GB) if ram and eff and cores else None
    return Offer(
        provider="vast", offer_id=str(o["id"]), gpu_name=canonical_gpu(o.get("gpu_name", "")),
        gpu_name_raw=o.get("gpu_name", ""), gpu_count=int(o.get("num_gpus", 0)), vram_mib=int(o.get("gpu_ram", 0)),
        vcpu=eff, ram_gib=ram_gib, disk_gb=o.get("disk_space"),
        cuda_max=str(o["cuda_max_good"]) if o.get("cuda_max_good") is not None else "",
        usd_per_hour=float(o.get("dph_base") or 0.0), interruptible_usd_per_hour=o.get("min_bid"),
        storage_usd_per_gb_month=float(o.get("storage_cost") or 0.0),
        egress_usd_per_gb=float(o.get("inet_up_cost") or 0.0), region=str(o.get("geolocation") or ""),
        reliability=o.get("reliability2", o.get("reliability")), availability="listed" if o.get("rentable") else "NONE",
        extra={"machine_id": o.get("machine_id"), "host_id": o.get("host_id"), "compute_cap": o.get("compute_cap"),
               "driver_version": o.get("driver_version")})


def pod_from_api(i: dict[str, Any], rid: str = "") -> Pod:
    """An instance as ``GET /api/v0/instances/{id}/`` answers it (``rid``: its id when the answer
    leaves it out); an outbid interruptible instance is ``interrupted``, its data kept."""
    ports: dict[str, str] = {}
    ip = (i.get("public_ipaddr") or "").strip()  # Vast pads it with whitespace (dstack strips it)
    for key, maps in (i.get("ports") or {}).items():
        if maps and ip:
            ports[key] = f"{ip}:{int(maps[0]['HostPort'])}"  # HostPort is a string
    status = i.get("actual_status")
    detail = f"{status or 'provisioning'}: {i.get('status_msg') or ''}".strip()
    outbid = status == "stopped" and i.get("intended_status") == "stopped" and "outbid" in (i.get("status_msg") or "")
    if outbid:
        detail = f"interrupted (outbid; data kept): {i.get('status_msg')}"
    host = {"gpu_name": i.get("gpu_name", ""), "gpu_count": i.get("num_gpus"), "vram_mib": i.get("gpu_ram"),
            "disk_gb": i.get("disk_space"),
            "cuda_max": str(i["cuda_max_good"]) if i.get("cuda_max_good") is not None else "",
            "public_ip": ip, "ports": ports, "image": i.get("image_uuid", ""),
            "command": [str(a) for a in i.get("image_args") or []],
            "env_names": sorted(k for k, _ in (i.get("extra_env") or []))}
    labels = decode_labels(i.get("label"))
    name = labels.pop(NAME_LABEL, "") or str(i.get("label") or "")
    return Pod(str(i.get("id", rid)), name, STATUS.get(status, "EXITED"),  # type: ignore[arg-type]
               labels, float(i.get("dph_total") or 0.0), float(i.get("start_date") or 0.0),
               i.get("end_date"), None, "", "", status_detail=detail, host=host, interrupted=outbid)


ENDPOINT_FIELDS = ("max_workers", "cold_workers", "min_load", "min_cold_load", "target_util", "cold_mult")
"""A Serverless endpoint's scaling parameters, as ``POST /api/v0/endptjobs/`` takes and lists them."""


class VastProvider(RemoteProvider):
    """Vast.ai instances rented from offers; what creates, stops and destroys them is its
    :attr:`lifecycle` (:class:`VastLifecycle`)."""

    name = "vast"
    http_port_protocol = "tcp"  # container ports are published as TCP mappings (-p N:N, read back as N/tcp)
    PROBE_PATH = "/api/v0/users/current/"
    TERMINAL_BAD = ("oci runtime", "error response from daemon", "unsatisfied condition")
    wire: VastWire  # every Vast.ai request (providers/vast/wire.py); create() builds it over the adapter's api
    autoscaler_url = AUTOSCALER_URL  # the Serverless autoscaler; create() sets it from params or the environment

    def capabilities(self) -> Capabilities:
        src = "vast-ai/docs guides/instances; docs/reference/providers.md 3.8"
        return Capabilities(
            provider=self.name,
            udp=Capability(True, "ports published with -p host:container; UDP mappings allowed", src),
            docker_compose=Capability(False, "the instance is one container without a Docker daemon", src),
            privileged=Capability(False, "containers are not privileged", src),
            persistent_volume=Capability(True, "container disk survives stop and is fixed at create; local volumes are "
                                               "tied to one machine", src),
            max_request_s=None,
            gpu=Capability(True, "NVIDIA (and some AMD) GPUs per offer", "POST /api/v0/bundles/"),
            billing="per second while running; storage bills while stopped; bandwidth billed per GB both ways",
            queue_endpoints=Capability(False, "no queue endpoint in this runbook; serve from an instance", src),
            load_balancing=Capability(True, "a worker's HTTP server on an instance's mapped port: requests go straight "
                                            "to it, with no queue and no retries in front",
                                      "docs.vast.ai/guides/instances/connect/networking"),
            restart=Capability(True, "a stopped instance starts again once its GPU is free", src),
            lifecycle="stop keeps the container disk, which still bills; start waits for the GPU; an interruptible "
                      f"instance is stopped when outbid and keeps its data ({src})",
            network=f"direct ports: each internal port mapped to a random external port on the host's IP, read "
                    f"from the instance's port map; SSH; no HTTP proxy ({src})",
            extra={
                "max_ports": Capability(True, "at most 64 open ports per container", src, limit=64),
                "disk_resize": Capability(False, "disk size is fixed at creation; resizing means recreating", src),
                "interruptible": Capability(True, "bids at or above min_bid; outbid instances stop and keep data",
                                            "vast-ai/docs guides/instances/choosing/instance-types.mdx"),
                "cross_host_volumes": Capability(False, "move data through object storage", src),
                "serverless": Capability(True, "a service on a Serverless endpoint and workergroup: clients ask the "
                                               "autoscaler's /route/ for a worker, whose PyWorker checks the signed "
                                               "route and forwards to the service (an adapter the image must run)",
                                         "docs.vast.ai serverless/overview (The PyWorker), serverless/route"),
                **payload_capabilities(queue=False, load_balancing=False,
                                       lb_detail="the worker's own HTTP server on a mapped port: no platform limit"),
            },
        )

    def search_offers(self, req: Any, *, ports: int = 0) -> list[Offer]:
        """``POST /api/v0/bundles/`` with :func:`search_body`; results normalized (RAM pro-rated,
        names canonical). Callers still filter: the server can drop filters silently."""
        return [_offer(o) for o in self.wire.search(search_body(req, ports=ports))]

    def fetch(self, resource_id: str) -> Pod:
        inst = self.wire.instance(resource_id)
        if inst is None:
            raise NotFound(f"vast: no instance {resource_id} (destroyed or never created)", provider=self.name,
                           resource_id=resource_id)
        return pod_from_api(inst, resource_id)

    def _list_raw(self) -> list[Pod | Endpoint]:
        """Every instance, following ``next_token`` pages of ``/api/v1/instances/``, then every
        Serverless endpoint (``GET /api/v0/endptjobs/``)."""
        out: list[Pod | Endpoint] = [pod_from_api(i) for i in self.wire.instances()]
        return out + [self._endpoint(e) for e in self.wire.serverless.endpoints()]

    def _endpoint(self, e: dict[str, Any]) -> Endpoint:
        name, _, in_name = str(e.get("endpoint_name", "")).partition(NAME_LABELS_SEP)
        return Endpoint(f"{ENDPOINT_PREFIX}{e['id']}", name, "RUNNING", self.autoscaler_url,
                        int(e.get("max_workers") or 0), decode_labels(in_name), 0.0, float(e.get("created_at") or 0),
                        mode="serverless")

    def _endpoint_row(self, resource_id: str) -> dict[str, Any]:
        eid = resource_id.removeprefix(ENDPOINT_PREFIX)
        row = next((e for e in self.wire.serverless.endpoints() if str(e.get("id")) == eid), None)
        if row is None:
            raise NotFound(f"vast: no Serverless endpoint {eid} (deleted or never created)", provider=self.name,
                           resource_id=resource_id)
        return row

    def get(self, resource_id: str) -> Pod | Endpoint:
        """An instance, or a Serverless endpoint (``ept-<id>``).

        Raises:
            NotFound: no such instance or endpoint.
        """
        if resource_id.startswith(ENDPOINT_PREFIX):
            return self._endpoint(self._endpoint_row(resource_id))
        return self.fetch(resource_id)

    def describe(self, resource_id: str) -> dict[str, Any]:
        """As :meth:`Provider.describe` for an instance; for a Serverless endpoint, what the
        console reports of it under ``endpoint`` (its scaling parameters; its workergroup's
        template, offer search and GPU memory; the template's image and environment names, the
        PyWorker adapter's variables among them) and no command or ports (it is reached through
        ``/route/``).

        Raises:
            NotFound: no such instance or endpoint.
        """
        if not resource_id.startswith(ENDPOINT_PREFIX):
            return super().describe(resource_id)
        row = self._endpoint_row(resource_id)
        group = next((w for w in self.wire.serverless.workergroups() if str(w.get("endpoint_id")) == str(row["id"])), {})
        template = self.wire.serverless.template(str(group.get("template_hash"))) if group else {}
        env, _ = docker_env(str(template.get("env", "")))
        env_names = sorted(env)
        settings = {"type": "vast serverless", **{k: row.get(k) for k in ENDPOINT_FIELDS},
                    "workergroup": group.get("id"), "template_hash": group.get("template_hash"),
                    "search_params": group.get("search_params"), "gpu_ram": group.get("gpu_ram"),
                    "image": template.get("image"), "env_names": env_names,
                    "pyworker": {"repo": env.get("PYWORKER_REPO"), "route": env.get("PYWORKER_ROUTE"),
                                 "healthcheck": env.get("PYWORKER_HEALTHCHECK")}}
        return {"provider": self.name, "id": resource_id, "name": self._endpoint(row).name, "state": "RUNNING",
                "price_usd_per_hour": 0.0, "image": template.get("image", ""), "command": [], "env_names": env_names,
                "ports": {}, "url": self.autoscaler_url, "endpoint": settings}

    def route_auth(self, resource_id: str) -> tuple[str, str]:
        """What ``/route/`` takes for a Serverless endpoint: its ``endpoint_name`` and its own
        ``api_key`` (the row's, not the account's: vastai 1.9.1 ``serverless/client/endpoint.py``),
        read now and never recorded.

        Raises:
            NotFound: no such endpoint.
        """
        row = self._endpoint_row(resource_id)
        return str(row["endpoint_name"]), str(row.get("api_key") or "")

    def endpoint_workers(self, resource_id: str) -> list[dict[str, Any]]:
        """The workers of a Serverless endpoint, each with its instance ``id`` and ``status``."""
        return self.wire.serverless.endpoint_workers(self.autoscaler_url, resource_id.removeprefix(ENDPOINT_PREFIX))


class VastLifecycle(RemoteLifecycle):
    """What creates, stops, starts and destroys Vast.ai instances (``load_balancing`` endpoints
    are instances too)."""

    provider: VastProvider

    def create_on_offer(self, spec: PodSpec, offer_id: str, env: dict[str, str]) -> str:
        """``PUT /api/v0/asks/{offer_id}/`` for ``spec``: its labels and name in ``label``, each port
        published ``-p N:N``, a bid making it interruptible. Returns the instance id.

        Raises:
            NoCapacity: the offer is gone, or the create failed (an instance it left is named, to
                be destroyed).
        """
        body: dict[str, Any] = {"client_id": "me", "image": spec.image, "disk": spec.disk_gb,
                                "label": encode_labels({**dict(spec.labels), NAME_LABEL: spec.name}), "runtype": "args",
                                "args": list(spec.command), "cancel_unavail": True,
                                "env": {**env, **{f"-p {p.split('/')[0]}:{p.split('/')[0]}": "1" for p in spec.ports}}}
        if spec.interruptible_bid_usd_per_hour is not None:
            body["price"] = spec.interruptible_bid_usd_per_hour
        login = registry_login(spec)
        if login is not None:  # a private image: "-u user -p password registry"
            body["image_login"] = login
        out = self.provider.wire.rent(offer_id, body)
        if not out.get("success") or not out.get("new_contract"):
            contract = str(out.get("new_contract") or "")
            raise NoCapacity(f"offer {offer_id}: create answered {out.get('error') or out}",
                             provider=self.provider.name, resource_id=contract)
        return str(out["new_contract"])

    def create_endpoint(self, spec: EndpointSpec) -> Endpoint:
        """A ``load_balancing`` endpoint: an instance, on the first ranked offer that becomes ready,
        running the ``direct`` worker (:mod:`runbook_lib.providers.local.endpoint`) on container
        port ``spec.port``. Its URL is that port's mapping: a random external port on the host's
        IP, read from the instance's port map (docs.vast.ai/guides/instances/connect/networking).
        Readiness probes the mapped port, which the worker binds once its model is loaded.

        Raises:
            NoCapacity: no ranked offer became ready (the tries are in the provider's ``attempts``).
        """
        if spec.service:
            return self._create_serverless(spec)
        port = f"{spec.port}/tcp"
        pod = self.launch_direct_worker(spec, port)
        return Endpoint(pod.id, pod.name, pod.state, f"http://{pod.host['ports'][port]}", 1, pod.labels,
                        pod.price_usd_per_hour, pod.created_at, mode="load_balancing")

    def stop(self, resource_id: str) -> dict[str, Any]:
        """``PUT /api/v0/instances/{id}/ {"state": "stopped"}``: its disk kept, and still billed."""
        self.provider.wire.set_state(resource_id, "stopped")
        return {"request": f"PUT /api/v0/instances/{resource_id}/ state=stopped", "answer": "accepted"}

    def start(self, resource_id: str) -> None:
        """``PUT /api/v0/instances/{id}/ {"state": "running"}``; it may wait if the GPU went to a
        higher-priority renter."""
        self.provider.wire.set_state(resource_id, "running")

    def _create_serverless(self, spec: EndpointSpec) -> Endpoint:
        """A service's Vast.ai Serverless endpoint: a private template of ``spec.image`` whose
        environment is the service's plus the PyWorker adapter's (:data:`PYWORKER_ENV`) with its
        port published, the endpoint with ``spec.settings``' scaling parameters (the run's labels
        in its name), and a workergroup of that template on offers matching the settings'
        ``search_params`` (docs.vast.ai "Create Endpoints and Workergroups"). What an earlier step
        made is deleted when a later one fails. Unverified: Vast.ai's docs tie ``onstart`` to the
        SSH and Jupyter launch modes, and a template of Vast.ai's own serverless images provides
        the script that starts the PyWorker from ``PYWORKER_REPO``; whether a team's image started
        in ``args`` mode runs both is not checked by any simulator.

        Raises:
            ProviderError: a create was refused (what was made is deleted), or its answer
                carried no id.
        """
        prov, wire = self.provider, self.provider.wire
        s = dict(spec.settings)
        adapter = dict(s["pyworker"])
        env = {**launch_env(spec), "PYWORKER_REPO": adapter["repo"], "PYWORKER_ROUTE": adapter["route"],
               "PYWORKER_HEALTHCHECK": adapter["healthcheck"]}
        flags = " ".join([*(f"-e {shlex.quote(f'{k}={v}')}" for k, v in env.items()), f"-p {spec.port}:{spec.port}"])
        made = wire.serverless.create_template({"name": spec.name, "image": spec.image, "env": flags, "runtype": "args",
                                     "onstart": s["onstart"], "private": True, "docker_login_repo": "",
                                     "docker_login_user": "", "docker_login_pass": "",
                                     "recommended_disk_space": spec.disk_gb})
        template = made.get("template") or {}
        if not made.get("success") or not template.get("hash_id"):
            raise ProviderError(f"vast: creating the template of {spec.name!r} answered {made.get('msg') or made}",
                                provider=prov.name)
        try:
            name = f"{spec.name}{NAME_LABELS_SEP}{encode_labels(dict(spec.labels))}"
            ep = wire.serverless.create_endpoint({"client_id": "me", "endpoint_name": name, "autoscaler_instance": "prod",
                                       **{k: s[k] for k in ENDPOINT_FIELDS}})
            eid = ep.get("result") or ep.get("id")
            if not ep.get("success") or not eid:
                raise ProviderError(f"vast: creating endpoint {spec.name!r} answered {ep.get('msg') or ep}",
                                    provider=prov.name)
        except ProviderError:
            wire.serverless.delete_template(str(template["hash_id"]))
            raise
        try:
            group = wire.serverless.create_workergroup({"client_id": "me", "endpoint_id": int(eid),
                                             "template_hash": template["hash_id"], "search_params": s["search_params"],
                                             "gpu_ram": s["gpu_ram"], "autoscaler_instance": "prod"})
            if not group.get("success") or not (group.get("id") or group.get("result")):
                raise ProviderError(f"vast: creating the workergroup of {spec.name!r} answered "
                                    f"{group.get('msg') or group}", provider=prov.name)
        except ProviderError:
            self.destroy(f"{ENDPOINT_PREFIX}{eid}")
            try:
                wire.serverless.delete_template(str(template["hash_id"]))
            except NotFound:
                pass
            raise
        return Endpoint(f"{ENDPOINT_PREFIX}{eid}", spec.name, "RUNNING", prov.autoscaler_url, int(s["max_workers"]),
                        dict(spec.labels), spec.price_usd_per_hour, time.time(), mode="serverless")

    def _destroy_serverless(self, eid: str) -> dict[str, Any]:
        """A Serverless endpoint's teardown (:meth:`destroy`)."""
        wire = self.provider.wire
        hashes = [str(w.get("template_hash")) for w in wire.serverless.workergroups() if str(w.get("endpoint_id")) == eid]
        req = f"DELETE /api/v0/endptjobs/{eid}/"
        try:
            out = wire.serverless.delete_endpoint(eid)
            answer = f"deleted, with workers {out.get('deleted_workers') or []}"
        except NotFound:
            answer = "404: already gone"
        for h in hashes:
            try:
                wire.serverless.delete_template(h)
            except NotFound:
                pass
        return {"request": req + (f", DELETE /api/v0/template/ {hashes}" if hashes else ""), "answer": answer}

    def destroy(self, resource_id: str) -> dict[str, Any]:
        """``DELETE /api/v0/instances/{id}/``; a 404 means it is already gone. A Serverless
        endpoint (``ept-<id>``): ``DELETE /api/v0/endptjobs/{id}/``, which deletes its workergroups
        and their workers (the answer's ``deleted_workers``), then its templates."""
        if resource_id.startswith(ENDPOINT_PREFIX):
            return self._destroy_serverless(resource_id.removeprefix(ENDPOINT_PREFIX))
        req = f"DELETE /api/v0/instances/{resource_id}/"
        try:
            self.provider.wire.destroy(resource_id)
        except NotFound:  # 404 no_such_instance: already gone (dstack treats it so too)
            return {"request": req, "answer": "404: already gone"}
        return {"request": req, "answer": "deleted"}


def create(*, root: Any = None, profile: Any = None, transport: Any = None, key: KeySource | None = None,
           **kwargs: Any) -> VastProvider:
    """Registry factory: the key comes from ``profile.api_key_ref`` or vast-cli's standard places."""
    key = key or default_key(profile.api_key_ref if profile else "")
    api = ApiClient(provider="vast", base_url=api_url(getattr(profile, "api_url", ""), BASE_URL_ENV, BASE_URL), key=key,
                    transport=transport, classify=_classify, sleep=kwargs.get("sleep", time.sleep))
    prov = VastProvider(api=api, profile=profile, **kwargs)
    prov.wire = VastWire(api)
    prov.lifecycle = VastLifecycle(prov)
    prov.autoscaler_url = api_url(getattr(profile, "autoscaler_url", ""), AUTOSCALER_URL_ENV, AUTOSCALER_URL)
    return prov

