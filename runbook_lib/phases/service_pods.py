"""Service pods: the team's image with its own command, planned, launched, waited for and read
back from the provider's own report.

On the embedded local provider a pod has no container runtime, so the image is stood in for by
``workload.service.stand_in.command``, run in the pod's own disk and environment and recorded as
a stand-in (its ``{project}`` and ``{NAME}`` placeholders are filled here, ``{port}`` by the
provider at launch). On Runpod and Vast.ai the image runs with its own command on a rented pod or
instance, reached on its published HTTP port (Runpod's proxy, a Vast.ai port mapping); in a
rehearsal the simulators run the same stand-in for the image (``rehearsal.stand_ins``).

A side with ``serverless`` runs the service on a Serverless endpoint instead of a pod, planned,
created, waited for and read back the same way (:func:`plan_endpoint`, :func:`launched_endpoint`):
a Runpod queue endpoint reached through its job API with the Runpod key, or a Vast.ai endpoint and
workergroup reached through the autoscaler's ``/route/`` and the PyWorker adapter
(:func:`side_client`).
"""

from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from runbook_lib.errors import AuthError, ProviderError, ProviderTimeout
from runbook_lib.evidence.records import ServiceLaunch
from runbook_lib.layout import project_root
from runbook_lib.params import (
    LB_MAX_REQUEST_S,
    LB_PING,
    READINESS_PATHS,
    RUNPOD_LB_ENV_NAMES,
    LiveProfile,
    Migration,
    RemoteProfile,
    RunpodServerless,
    Service,
    VastServerless,
)
from runbook_lib.phases.access import pod_secret_refs
from runbook_lib.phases.resources import Resources
from runbook_lib.providers.base import Endpoint, EndpointSpec, Plan, Pod, PodSpec, http_port, http_url
from runbook_lib.providers.vast import PYWORKER_ENV
from runbook_lib.providers.vast import search_params as vast_search_params
from runbook_lib.secret_refs import resolve
from runbook_lib.service.pacing import Pacer, pacer_for
from runbook_lib.service.protocols import JOB_API_HEALTH, JobPolicy, ServiceClient, VastRouted, client_for, peek

SERVICE_ROLE_PREFIX = "service-"
"""Role label prefix of the pods phases 01 and 03 launch (phase 04's are ``endpoint-<side>``)."""


def service_of(mig: Migration) -> Service:
    """``workload.service``.

    Raises:
        ProviderError: the workload is not ``kind: service`` (a caller's mistake).
    """
    if mig.workload.service is None:
        raise ProviderError(f"workload.kind is {mig.workload.kind!r}; service pods are for kind 'service'")
    return mig.workload.service


def service_env(mig: Migration, side: str) -> dict[str, str]:
    """The environment values ``side``'s service gets: ``workload.service.env``, then the
    profile's ``service_env``."""
    prof = mig.source if side == "source" else mig.target
    return {**service_of(mig).env, **prof.service_env}


def command_for(mig: Migration, side: str, params_path: Any) -> tuple[tuple[str, ...], bool]:
    """The argv ``side``'s pod runs and whether it is a stand-in: the image's own command on a
    remote provider (a stand-in runs for it when a rehearsal's simulators declare one); on the
    local provider the stand-in with ``{project}`` and ``{NAME}`` filled
    (``{port}`` is left for the provider).

    Raises:
        ProviderError: a local side with no ``stand_in`` (nothing can run the image there), or a
            placeholder naming no service variable.
    """
    svc = service_of(mig)
    prof = mig.source if side == "source" else mig.target
    if isinstance(prof, RemoteProfile):
        return svc.command, mig.rehearsal is not None and svc.image in mig.rehearsal.stand_ins
    if svc.stand_in is None:
        raise ProviderError(f"{side} runs on the local provider, which has no container runtime to run image "
                            f"{svc.image!r}: declare workload.service.stand_in.command, a local command that serves "
                            "the same API (it is recorded as a stand-in)")
    values = {"project": str(project_root(params_path)), **service_env(mig, side)}
    out = []
    for arg in svc.stand_in.command:
        try:
            out.append(arg.format_map(_Keep(values)))
        except (KeyError, ValueError, IndexError) as exc:
            raise ProviderError(f"workload.service.stand_in.command argument {arg!r}: {exc}; placeholders are "
                                f"{{port}}, {{project}} and service environment names {sorted(values)[1:]}") from exc
    return tuple(out), True


class _Keep(dict[str, str]):
    """Format values that leave ``{port}`` for the provider and refuse any other unknown name."""

    def __missing__(self, key: str) -> str:
        if key == "port":
            return "{port}"
        raise KeyError(f"no service variable {key!r}")


def serverless(mig: Migration, side: str) -> RunpodServerless | VastServerless | None:
    """``side``'s Serverless settings when its service runs on a Runpod Serverless endpoint
    (:class:`~runbook_lib.params.RunpodServerless`) or a Vast.ai one
    (:class:`~runbook_lib.params.VastServerless`), else None (a pod, or a live source)."""
    prof = mig.source if side == "source" else mig.target
    return getattr(prof, "serverless", None)


def serving_shown(prof: Any) -> str:
    """Where one side's service runs, as phase 02 shows it: a pod, a live URL, or a Runpod
    Serverless endpoint with its scaling and limits."""
    sv = getattr(prof, "serverless", None)
    if sv is None:
        return "a live service (not ours)" if isinstance(prof, LiveProfile) else f"a {prof.provider} pod"
    if isinstance(sv, VastServerless):
        return (f"Vast.ai Serverless endpoint: workers {sv.cold_workers} cold of {sv.max_workers} max, min load "
                f"{sv.min_load:g}, target utilisation {sv.target_util:g}, cold multiple {sv.cold_mult:g}, behind the "
                f"PyWorker of {sv.pyworker.repo} (route {sv.pyworker.route}, health check {sv.pyworker.healthcheck})")
    limit = (f"requests routed to workers whose {LB_PING} answers 200 and cut at {LB_MAX_REQUEST_S / 60:g} min"
             if sv.type == "LOAD_BALANCER" else f"execution timeout {sv.execution_timeout_s:g} s")
    return (f"Runpod Serverless {sv.type}: workers {prof.active_workers or 0} min of {prof.workers} max, idle timeout "
            f"{prof.idle_timeout_s:g} s, {limit}, flashboot {sv.flashboot}, "
            f"GPU pools {list(prof.gpu_priority) or 'of offer.gpu_names'}")


VAST_ENTRY_POINT = ("the template's onstart runs workload.service.command in the background; the PyWorker from "
                    "PYWORKER_REPO must be started in front of it (Vast.ai's serverless images do; for another image, "
                    "how is unverified and no simulator checks it)")
"""What a service's Vast.ai Serverless worker runs, as its launch record says."""
ENTRY_POINT = "the image's entry point (a Runpod Serverless endpoint takes no command)"
"""What a service's endpoint runs, as its launch record says: ``POST /v2/serverless`` has no
command field, so ``workload.service.command`` applies to pod sides only."""


def vast_settings(res: Resources, side: str, sv: VastServerless) -> tuple[tuple[str, Any], ...]:
    """A Vast.ai Serverless endpoint's settings as its plan shows them and the adapter sends them:
    the endpoint's scaling parameters, the workergroup's offer search (the profile's ``offer``,
    :func:`~runbook_lib.providers.vast.search_params`) and GPU memory, the template's ``onstart``
    (the service's command, in the background) and the PyWorker adapter."""
    svc = service_of(res.mig)
    prof = res.profile(side)
    assert isinstance(prof, RemoteProfile)  # serverless is a Vast.ai profile's field
    onstart = f"{shlex.join(svc.command)} &" if svc.command else ""
    return (("max_workers", sv.max_workers), ("cold_workers", sv.cold_workers), ("min_load", sv.min_load),
            ("min_cold_load", sv.min_cold_load), ("target_util", sv.target_util), ("cold_mult", sv.cold_mult),
            ("search_params", vast_search_params(prof.offer)), ("gpu_ram", sv.gpu_ram_gb), ("onstart", onstart),
            ("pyworker", (("repo", sv.pyworker.repo), ("route", sv.pyworker.route),
                          ("healthcheck", sv.pyworker.healthcheck))))


def plan_vast_endpoint(res: Resources, side: str, role: str, sv: VastServerless) -> Plan:
    """The creation plan of ``side``'s Vast.ai Serverless endpoint (pure): the image, the
    service's environment and secrets by reference, its API port, and :func:`vast_settings`,
    priced per worker at the profile's price."""
    mig = res.mig
    svc = service_of(mig)
    prof = res.profile(side)
    assert isinstance(prof, RemoteProfile)  # serverless is a Vast.ai profile's field
    spec = EndpointSpec(name=f"{mig.migration}-{role}", params_path="", side=side, workers=sv.max_workers,
                        price_usd_per_hour=prof.price_usd_per_hour, labels=res.labels(side, role),
                        env=tuple(sorted(service_env(mig, side).items())), secret_refs=pod_secret_refs(mig, side),
                        image=svc.image, mode="serverless", port=svc.port, disk_gb=prof.offer.disk_gb,
                        active_workers=sv.cold_workers, service=True, settings=vast_settings(res, side, sv))
    return res.provider(side).plan_endpoint(spec, dry_run=res.dry_run(side))


def plan_endpoint(res: Resources, side: str, role: str, sv: RunpodServerless | VastServerless, *,
                  scale_to_zero_s: float | None = None) -> Plan:
    """The creation plan of ``side``'s service endpoint in role ``role`` (pure). A Vast.ai one is
    :func:`plan_vast_endpoint`'s. A Runpod one (a queue endpoint, or a load-balancing one whose
    worker serves on the service's port): the image, the service's environment values and
    secrets by reference, the side's scaling (``workers`` as ``workers.max``, ``active_workers``
    as ``workers.min``, 0 when unset: scale to zero; ``idle_timeout_s``), its GPU pools
    (``gpu_priority``, else the pools of ``offer.gpu_names``, resolved by the provider's
    :meth:`plan_endpoint`), ``sv.execution_timeout_s`` and ``sv.flashboot``, priced per worker
    at the profile's price.

    Args:
        scale_to_zero_s: None: the side's own scaling. Else the endpoint of phase 04's cold starts
            from zero, one worker that nothing keeps running: on Runpod ``workers.max`` 1,
            ``workers.min`` 0 and this idle timeout (seconds); on Vast.ai ``max_workers`` 1,
            ``cold_workers`` 1 (one stopped worker to start), ``min_load`` and ``min_cold_load``
            0 (Vast.ai's engine decides when an idle worker stops; no timeout is sent).
    """
    if isinstance(sv, VastServerless):
        if scale_to_zero_s is not None:
            sv = sv.model_copy(update={"max_workers": 1, "cold_workers": 1, "min_load": 0.0, "min_cold_load": 0.0})
        return plan_vast_endpoint(res, side, role, sv)
    mig = res.mig
    svc = service_of(mig)
    prof = res.profile(side)
    zero = scale_to_zero_s is not None
    spec = EndpointSpec(name=f"{mig.migration}-{role}", params_path="", side=side, workers=1 if zero else prof.workers,
                        price_usd_per_hour=prof.price_usd_per_hour, labels=res.labels(side, role),
                        execution_timeout_s=sv.execution_timeout_s, env=tuple(sorted(service_env(mig, side).items())),
                        secret_refs=pod_secret_refs(mig, side), image=svc.image, gpu_types=prof.gpu_priority,
                        mode="load_balancing" if sv.type == "LOAD_BALANCER" else "queue", port=svc.port,
                        active_workers=0 if zero else prof.active_workers or 0,
                        idle_timeout_s=prof.idle_timeout_s if scale_to_zero_s is None else scale_to_zero_s,
                        service=True, flashboot=sv.flashboot)
    return res.provider(side).plan_endpoint(spec, dry_run=res.dry_run(side))


VAST_WORKERS_UP = {"idle": "idle", "running": "running", "loading": "initializing", "model_loading": "initializing",
                   "creating": "initializing", "starting": "initializing", "rebooting": "initializing",
                   "updating": "initializing"}
"""Vast.ai Serverless worker states (docs.vast.ai "Worker states", the CLI's names, lowercased)
that hold a worker up, as the job API's worker counts name them; ``stopped`` (Inactive),
``destroying`` and ``error`` hold none."""


def endpoint_workers(res: Resources, side: str, ep: Endpoint) -> dict[str, int]:
    """How many workers of ``side``'s service endpoint are ``idle``, ``running`` and
    ``initializing`` now: a Runpod queue endpoint's job API ``GET /health`` ``workers`` (with the
    Runpod key), a Runpod load-balancing endpoint's ``GET /v2/serverless/{id}/workers`` states,
    a Vast.ai endpoint's ``/get_endpoint_workers/`` states (:data:`VAST_WORKERS_UP`).

    Raises:
        ProviderError: the provider could not be asked (its message says why).
    """
    counts = {"idle": 0, "running": 0, "initializing": 0}
    sv = serverless(res.mig, side)
    prov: Any = res.provider(side)
    listed = prov.endpoint_workers(ep.id) if isinstance(sv, VastServerless) else \
        prov.workers(ep.id) if isinstance(sv, RunpodServerless) and sv.type == "LOAD_BALANCER" else None
    if listed is not None:  # a worker list (a load-balancing endpoint has no job API)
        for w in listed:
            said = str(w.get("status", "")).lower()
            state = VAST_WORKERS_UP.get(said, "") if isinstance(sv, VastServerless) else said
            if state in counts:
                counts[state] += 1
        return counts
    with side_client(res, side, ep.url, timeout_s=10.0, endpoint_id=ep.id) as c:
        status, _, body = peek(c, ENDPOINT_READINESS)
    try:
        seen = json.loads(body).get("workers") or {}
    except (ValueError, AttributeError) as exc:
        raise ProviderError(f"{ep.url}{ENDPOINT_READINESS} answered HTTP {status} without a workers report: "
                            f"{body[:200]!r}", resource_id=ep.id) from exc
    return {k: int(seen.get(k) or 0) for k in counts}


def plan_service(res: Resources, side: str, role: str) -> Plan:
    """The launch plan of ``side``'s service pod in role ``role`` (pure: shown and approved by
    fingerprint): the image, its command (or stand-in), its environment values and secrets by
    reference, its API port as the provider publishes HTTP ports, the profile's price. On a
    remote provider also the ranked offers it may try (:meth:`~runbook_lib.phases.offerbook.OfferBook.ids`,
    a remote source's from :func:`source_offer_ids`), their price and bid, the container disk,
    and the registry login of a private image (``workload.service.registry_credential``, sent in
    the create request, not in the environment). A side on a Serverless endpoint (Runpod or
    Vast.ai) plans the endpoint instead (:func:`plan_endpoint`)."""
    mig = res.mig
    sv = serverless(mig, side)
    if sv is not None:
        return plan_endpoint(res, side, role, sv)
    svc = service_of(mig)
    prof = res.profile(side)
    prov = res.provider(side)
    command, _ = command_for(mig, side, res.params_path)
    refs = pod_secret_refs(mig, side)
    spec = PodSpec(name=f"{mig.migration}-{role}", command=command, device=prof.device,
                   price_usd_per_hour=prof.price_usd_per_hour, labels=res.labels(side, role),
                   env=tuple(sorted(service_env(mig, side).items())),
                   secret_refs=tuple(r for r in refs if r[0] != svc.registry_credential),
                   volume_gb=mig.workload.requirements.disk_gb, image=svc.image, ports=(http_port(prov, svc.port),),
                   service=True, registry_ref=next((r for r in refs if r[0] == svc.registry_credential), None))
    if isinstance(prof, RemoteProfile):
        ids = res.offers.ids(side)
        if side == "source" and not ids:
            ids = source_offer_ids(res, prof)
        bid = res.offers.bid(side, ids)
        price = res.offers.price(side) or prof.price_usd_per_hour
        spec = replace(spec, offers=ids, disk_gb=prof.offer.disk_gb, interruptible_bid_usd_per_hour=bid,
                       price_usd_per_hour=res.offers.bid_price(bid, price))
    return prov.plan_launch(spec, dry_run=res.dry_run(side))


def source_offer_ids(res: Resources, prof: RemoteProfile) -> tuple[str, ...]:
    """The offers a remote source's service pod may rent (read-only): the GPU type of the pod
    that runs today (``source.pod_id``, as the provider describes it), else the first
    ``source.offer.max_tries`` offers matching ``source.offer``, in the provider's order.

    Raises:
        NotFound: ``source.pod_id`` does not exist. ProviderError: the search failed.
    """
    prov = res.provider("source")
    if prof.pod_id:
        gpu = str(prov.describe(prof.pod_id).get("gpu_name") or "")
        if gpu:
            return (gpu,)
    return tuple(o.offer_id for o in prov.search_offers(prof.offer, ports=1))[: prof.offer.max_tries]


@dataclass(frozen=True)
class Ready:
    """A service pod (or a service's serverless endpoint) that answered its readiness check: the
    pod or endpoint, its base URL (an endpoint's: its job API, ``.../v2/{endpoint_id}``), the
    seconds from the launch call to the first ready answer, the checks made."""

    pod: Pod | Endpoint
    url: str
    ready_s: float
    checks: int


class NotReady(ProviderTimeout):
    """A service pod never answered its readiness check in time (its last answer is named)."""


ENDPOINT_READINESS = JOB_API_HEALTH
"""A service endpoint's readiness check: the job API's ``GET /health`` (docs/reference/providers.md
2.2) answering 200 means the endpoint accepts jobs. A scale-to-zero endpoint has no worker yet;
the first job pays its cold start, which the first answer's latency carries."""


def endpoint_readiness(sv: RunpodServerless | VastServerless | None) -> tuple[str, int]:
    """``(path, status)`` that says a service endpoint is ready: a Runpod load-balancing
    endpoint's ``GET /ping`` answering 200 (:data:`~runbook_lib.params.LB_PING`: a worker is
    healthy and routed to), else the job API's :data:`ENDPOINT_READINESS`."""
    if isinstance(sv, RunpodServerless) and sv.type == "LOAD_BALANCER":
        return LB_PING, 200
    return ENDPOINT_READINESS, 200


def job_api_headers(res: Resources, side: str) -> dict[str, str]:
    """The headers of ``side``'s service endpoint's job API: the provider's API key as Bearer
    auth, resolved now and never recorded (empty for a pod side, reached over its own port).

    Raises:
        ProviderError: the side's provider has no job API (only Runpod's adapter has one).
        AuthError: the provider's key is not set.
    """
    if serverless(res.mig, side) is None:
        return {}
    prov = res.provider(side)
    headers = getattr(prov, "job_api_headers", None)
    if headers is None:
        raise ProviderError(f"{prov.name} has no serverless job API a service runs behind ({side}.serverless); "
                            "run the service on a pod there", provider=prov.name)
    return dict(headers())


def side_client(res: Resources, side: str, url: str, *, timeout_s: float, project: Any = None,
                endpoint_id: str = "", policy: JobPolicy | None = None) -> ServiceClient:
    """The protocol's client of ``side``'s service at ``url``: a pod's port, a Runpod Serverless
    endpoint's job API with the provider's key (:func:`job_api_headers`), or a Vast.ai Serverless
    endpoint ``endpoint_id`` through its autoscaler and PyWorker
    (:class:`~runbook_lib.service.protocols.VastRouted`, with the endpoint's own key, read now).
    ``policy``: Runpod's per-job execution policy (a Runpod Serverless side only).

    Raises:
        NotFound: the Vast.ai endpoint is gone. AuthError: the provider's key is not set.
        ProviderError: ``policy`` for a side that is not a Runpod Serverless endpoint.
    """
    sv = serverless(res.mig, side)
    if policy is not None and not isinstance(sv, RunpodServerless):
        raise ProviderError(f"the {side}'s service has no job execution policy (only a Runpod Serverless endpoint's "
                            "job API takes one)")
    if isinstance(sv, VastServerless):
        prov = res.provider(side)
        name, key = prov.route_auth(endpoint_id)  # type: ignore[attr-defined]
        return VastRouted(service_of(res.mig), url, endpoint_name=name, endpoint_key=key,
                          worker_route=sv.pyworker.route, timeout_s=timeout_s, project=project)
    endpoint = sv is not None
    return client_for(service_of(res.mig), url, timeout_s=timeout_s, project=project,
                      headers=job_api_headers(res, side) or None,
                      readiness=endpoint_readiness(sv) if endpoint else None, policy=policy)


def wait_ready(res: Resources, side: str, pod: Pod | Endpoint, *, started: float,
               clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep) -> Ready:
    """Poll ``GET readiness.path`` until it answers ``readiness.status``, at most
    ``readiness.timeout_s`` seconds from ``started`` (``clock`` seconds); a serverless endpoint's
    job API is polled at :data:`ENDPOINT_READINESS` for 200 instead.

    Raises:
        NotReady: no ready answer in time, or the pod's process exited; the message has the last
            answer (status and body, or the connection error) and the pod's log tail.
    """
    svc = service_of(res.mig)
    r = svc.readiness
    prov = res.provider(side)
    endpoint = isinstance(pod, Endpoint)
    url = pod.url if isinstance(pod, Endpoint) else http_url(prov, pod, svc.port)
    path, status = endpoint_readiness(serverless(res.mig, side)) if endpoint else (r.path, r.status)
    last = "no answer yet"
    checks = 0
    with side_client(res, side, url, timeout_s=max(1.0, r.interval_s * 4), endpoint_id=pod.id) as c:
        while True:
            checks += 1
            try:
                got = c.health()
                if got["status"] == status:
                    return Ready(pod, url, clock() - started, checks)
                last = f"HTTP {got['status']}: {got['body'][:120]!r}"
            except ProviderError as exc:
                last = str(exc)
            now = prov.get(pod.id)
            if now.state != "RUNNING" or clock() - started > r.timeout_s:
                why = (f"its process exited ({now.state})" if now.state != "RUNNING" else
                       f"no {status} on GET {path} within readiness.timeout_s = {r.timeout_s:g} s")
                if last.startswith("HTTP 404") and not endpoint:
                    why += (f"; GET {r.path} answers 404: the service serves no such path, set "
                            f"workload.service.readiness.path to one it serves (the {svc.protocol} default is "
                            f"{READINESS_PATHS[svc.protocol]})")
                raise NotReady(f"service {'endpoint' if endpoint else 'pod'} {pod.id} ({side}) is not ready: {why}; GET {path} was checked {checks} "
                               f"times, the last answer: {last}. Log tail:\n{prov.log_tail(pod.id, 1200)}",
                               provider=prov.name, resource_id=pod.id)
            sleep(r.interval_s)


def launch_ready(res: Resources, side: str, role: str) -> Ready:
    """Apply ``side``'s service pod plan (approved) and wait until it is ready; a pod that never
    gets ready is destroyed before the error is raised (nothing is left running).

    Raises:
        ApprovalRequired: the plan is not approved.
        NotReady: as :func:`wait_ready` (the pod destroyed).
    """
    t0 = time.perf_counter()
    pod: Pod | Endpoint = res.apply_plan(side, plan_service(res, side, role))
    try:
        return wait_ready(res, side, pod, started=t0)
    except NotReady:
        res.destroy(side, pod.id, labels=pod.labels)
        raise


def client(res: Resources, ready: Ready) -> ServiceClient:
    """The protocol's client of a ready service pod (each request's deadline:
    ``measure.request_timeout_s``; ``workload.service.tokenizer`` relative to the project).

    Raises:
        ParamsError: ``workload.service.tokenizer`` names no ``tokenizer.json``.
    """
    side = ready.pod.labels.get("side", "")
    return side_client(res, side, ready.url, timeout_s=res.mig.measure.request_timeout_s, project=res.run.project,
                       endpoint_id=ready.pod.id)


LIVE_ID = "live"
"""The id a live source's serving side is recorded under (it has no pod or endpoint id)."""


def live(mig: Migration, side: str = "source") -> LiveProfile | None:
    """``side``'s profile when it is a live service (``provider: live``), else None."""
    prof = mig.source if side == "source" else mig.target
    return prof if isinstance(prof, LiveProfile) else None


def live_pacer(prof: LiveProfile) -> Pacer:
    """The process's pacer of the live source (:func:`runbook_lib.service.pacing.pacer_for`)."""
    return pacer_for(prof.url, prof.max_rate_per_s)


TOKEN_CHARS = re.compile(r"[!-~]+")
"""What a bearer token may hold: visible ASCII, no space or control character (RFC 6750's
``b64token`` is narrower still); anything else cannot go in a header and is refused by name."""


def bearer_token(prof: LiveProfile) -> str:
    """The live source's bearer token (``source.auth_ref``), resolved now.

    Raises:
        AuthError: the reference is not set here, or its value holds a character a header cannot
            carry (a second line, a space, a control or non-ASCII character); named by reference,
            never by value.
    """
    value = str(resolve("source.auth_ref", prof.auth_ref))
    if not TOKEN_CHARS.fullmatch(value):
        raise AuthError(f"source.auth_ref ({prof.auth_ref}) holds a value that cannot be a bearer token: it has a "
                        "space, a second line, a control or a non-ASCII character. Put the token alone on one line "
                        "(the value is not shown)")
    return value


def live_client(mig: Migration, prof: LiveProfile, *, timeout_s: float, project: Any = None) -> ServiceClient:
    """The protocol's client of a live source: paced at ``max_rate_per_s``, with its bearer token
    (``auth_ref``, resolved now and never recorded) when it needs one.

    Raises:
        AuthError: ``auth_ref`` is not set on this machine (named, never its value).
    """
    headers = {"Authorization": f"Bearer {bearer_token(prof)}"} if prof.auth_ref else None
    return client_for(service_of(mig), prof.url, timeout_s=timeout_s, project=project, pacer=live_pacer(prof),
                      headers=headers)


def live_ready(res: Resources, prof: LiveProfile, *, clock: Callable[[], float] = time.perf_counter,
               sleep: Callable[[float], None] = time.sleep) -> float:
    """Wait until the live source answers ``GET readiness.path`` with ``readiness.status`` (paced
    like every request to it), at most ``readiness.timeout_s``; nothing is launched.

    Returns:
        Seconds until it answered ready.

    Raises:
        NotReady: no ready answer in time (the last answer named).
        AuthError: it answered 401 or 403 (its token is missing or refused): at once, not retried.
    """
    svc = service_of(res.mig)
    r = svc.readiness
    where = prof.url.rstrip("/") + r.path
    t0 = clock()
    last, checks = "no answer yet", 0
    with live_client(res.mig, prof, timeout_s=max(1.0, r.interval_s * 4)) as c:
        while True:
            checks += 1
            try:
                got = c.health()
                if got["status"] == r.status:
                    return clock() - t0
                last = f"HTTP {got['status']}: {got['body'][:120]!r}"
            except ProviderError as exc:
                last = str(exc)
            if last.startswith(("HTTP 401", "HTTP 403")):  # asking again would only knock again
                raise AuthError(f"the live source answered {last[:8]} to GET {where}: "
                                + (f"its token, source.auth_ref ({prof.auth_ref}), is refused; check the token"
                                   if prof.auth_ref else "it needs a token: set source.auth_ref (env:VAR or file:/path)")
                                + f"; nothing more was sent. Its answer: {last[10:]}")
            if clock() - t0 > r.timeout_s:
                raise NotReady(f"the live source at {prof.url} is not ready: no {r.status} on GET {where} within "
                               f"readiness.timeout_s = {r.timeout_s:g} s ({checks} checks); the last answer: {last}. "
                               "It is the team's running service: check source.url and workload.service.readiness",
                               provider="live", resource_id=prof.url)
            sleep(r.interval_s)


def launched(res: Resources, side: str, ready: Ready) -> ServiceLaunch:
    """What the provider reports the pod runs (:meth:`runbook_lib.providers.base.Provider.describe`)
    against what params declare: the image, the command (the stand-in's on the local provider),
    the environment names (``workload.service.env``, the side's ``service_env`` and its secrets)
    and the API port; and any runbook code found in its processes (a ``RUNBOOK_*`` variable or a
    ``runbook_lib`` command line), where the provider reports processes. A service's serverless
    endpoint is read as :func:`launched_endpoint` reads it.

    Raises:
        ProviderError: the provider cannot describe the pod.
    """
    mig = res.mig
    svc = service_of(mig)
    seen = res.provider(side).describe(ready.pod.id)
    sv = serverless(mig, side)
    if sv is not None:
        return launched_endpoint(res, side, ready, seen, sv)
    want_cmd, stand_in = command_for(mig, side, res.params_path)
    want_env = sorted(set(service_env(mig, side)) | {k for k, _ in pod_secret_refs(mig, side)} -
                      {svc.registry_credential})
    cmd = tuple(seen.get("command") or ())
    key = http_port(res.provider(side), svc.port)
    port = (seen.get("ports") or {}).get(key, "")
    mismatches = []
    if seen.get("image") != svc.image:
        mismatches.append(f"image {seen.get('image')!r} != params {svc.image!r}")
    expected_cmd = tuple(a.replace("{port}", port.rsplit(":", 1)[-1]) for a in want_cmd) if not \
        isinstance(res.profile(side), RemoteProfile) else want_cmd
    if cmd != expected_cmd:
        mismatches.append(f"command {list(cmd)} != params {list(expected_cmd)}")
    if sorted(seen.get("env_names") or ()) != want_env:
        mismatches.append(f"environment names {sorted(seen.get('env_names') or ())} != params {want_env}")
    if key not in (seen.get("ports") or {}):
        mismatches.append(f"port {key} not published ({seen.get('ports')})")
    env_inside = [n for n in seen.get("env_names") or () if n.startswith("RUNBOOK_")]
    procs_seen = tuple(seen.get("processes") or ())
    inside = [f"environment: {', '.join(env_inside)}"] if env_inside else []
    inside += [f"pid {p['pid']}: {', '.join(p['runbook_env'])}" for p in procs_seen if p.get("runbook_env")]
    inside += [f"pid {p['pid']}: runs {' '.join(p['cmdline'])[:120]}" for p in procs_seen
               if any("runbook_lib" in a for a in p.get("cmdline") or ())]
    return ServiceLaunch(pod=ready.pod.id, image=str(seen.get("image") or ""), digest=seen.get("digest"),
                         stand_in=stand_in, command=cmd, env_names=tuple(sorted(seen.get("env_names") or ())),
                         ports=dict(seen.get("ports") or {}), processes=procs_seen,
                         processes_reported="processes" in seen, as_declared=not mismatches,
                         mismatches=tuple(mismatches), runbook_inside=tuple(inside), ready_s=round(ready.ready_s, 3))


def endpoint_asked(res: Resources, side: str, sv: RunpodServerless | VastServerless) -> dict[str, Any]:
    """The endpoint settings ``side``'s params ask for, in the words the provider's describe reports
    them: Runpod (:func:`~runbook_lib.providers.runpod.endpoint_settings`) type, workers min and
    max, idle timeout (whole seconds, as Runpod takes it), execution timeout (ms) and flashboot;
    Vast.ai (:meth:`~runbook_lib.providers.vast.VastProvider.describe`) the endpoint's scaling
    parameters, the workergroup's offer search and GPU memory, and the PyWorker adapter."""
    prof = res.profile(side)
    if isinstance(sv, VastServerless):
        s = dict(vast_settings(res, side, sv))
        return {"type": "vast serverless", **{k: s[k] for k in ("max_workers", "cold_workers", "min_load",
                                                                 "min_cold_load", "target_util", "cold_mult",
                                                                 "search_params")},
                "gpu_ram": sv.gpu_ram_gb, "pyworker": dict(s["pyworker"])}
    return {"type": sv.type, "workers_min": prof.active_workers or 0, "workers_max": prof.workers,
            "idle_timeout_s": max(1, round(prof.idle_timeout_s)), "execution_timeout_ms": int(sv.execution_timeout_s * 1000),
            "flashboot": sv.flashboot}


def launched_endpoint(res: Resources, side: str, ready: Ready, seen: dict[str, Any],
                      sv: RunpodServerless | VastServerless) -> ServiceLaunch:
    """What the provider reports a service's serverless endpoint runs (Runpod ``GET
    /v2/serverless/{id}``; Vast.ai its endpoint, workergroup and template), against what params
    declare: the image, the environment names (the PyWorker adapter's too on Vast.ai), and the
    endpoint's settings (:func:`endpoint_asked`), each mismatch named. No command is compared
    (:data:`ENTRY_POINT`, :data:`VAST_ENTRY_POINT` say what runs); an endpoint reports no processes."""
    mig = res.mig
    svc = service_of(mig)
    adapter_env = set(PYWORKER_ENV) if isinstance(sv, VastServerless) else \
        set(RUNPOD_LB_ENV_NAMES) if sv.type == "LOAD_BALANCER" else set()
    want_env = sorted(set(service_env(mig, side)) | {k for k, _ in pod_secret_refs(mig, side)} | adapter_env)
    settings = dict(seen.get("endpoint") or {})
    mismatches = []
    if seen.get("image") != svc.image:
        mismatches.append(f"image {seen.get('image')!r} != params {svc.image!r}")
    if sorted(seen.get("env_names") or ()) != want_env:
        mismatches.append(f"environment names {sorted(seen.get('env_names') or ())} != params {want_env}")
    for key, want in endpoint_asked(res, side, sv).items():
        if settings.get(key) != want:
            mismatches.append(f"endpoint {key} {settings.get(key)!r} != params {want!r}")
    env_inside = [n for n in seen.get("env_names") or () if n.startswith("RUNBOOK_")]
    stand_in = mig.rehearsal is not None and svc.image in mig.rehearsal.stand_ins
    return ServiceLaunch(pod=ready.pod.id, image=str(seen.get("image") or ""), digest=seen.get("digest"),
                         stand_in=stand_in, command=(), env_names=tuple(sorted(seen.get("env_names") or ())),
                         ports={}, processes=(), processes_reported=False, as_declared=not mismatches,
                         mismatches=tuple(mismatches),
                         runbook_inside=(f"environment: {', '.join(env_inside)}",) if env_inside else (),
                         ready_s=round(ready.ready_s, 3), endpoint=settings,
                         entry_point=VAST_ENTRY_POINT if isinstance(sv, VastServerless) else ENTRY_POINT,
                         url=ready.url)
