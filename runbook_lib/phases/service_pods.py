"""Service pods: the team's image with its own command, planned, launched, waited for and read
back from the provider's own report.

On the embedded local provider a pod has no container runtime, so the image is stood in for by
``workload.service.stand_in.command``, run in the pod's own disk and environment and recorded as
a stand-in (its ``{project}`` and ``{NAME}`` placeholders are filled here, ``{port}`` by the
provider at launch). On Runpod and Vast.ai the image runs with its own command on a rented pod or
instance, reached on its published HTTP port (Runpod's proxy, a Vast.ai port mapping); in a
rehearsal the simulators run the same stand-in for the image (``rehearsal.stand_ins``).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from runbook_lib.errors import AuthError, ProviderError, ProviderTimeout
from runbook_lib.evidence.records import ServiceLaunch
from runbook_lib.layout import project_root
from runbook_lib.params import READINESS_PATHS, LiveProfile, Migration, RemoteProfile, Service
from runbook_lib.phases.access import pod_secret_refs
from runbook_lib.phases.resources import Resources
from runbook_lib.providers.base import Plan, Pod, PodSpec, http_port, http_url
from runbook_lib.secret_refs import resolve
from runbook_lib.service.pacing import Pacer, pacer_for
from runbook_lib.service.protocols import ServiceClient, client_for

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


def plan_service(res: Resources, side: str, role: str) -> Plan:
    """The launch plan of ``side``'s service pod in role ``role`` (pure: shown and approved by
    fingerprint): the image, its command (or stand-in), its environment values and secrets by
    reference, its API port as the provider publishes HTTP ports, the profile's price. On a
    remote provider also the ranked offers it may try (:meth:`~runbook_lib.phases.offerbook.OfferBook.ids`,
    a remote source's from :func:`source_offer_ids`), their price and bid, the container disk,
    and the registry login of a private image (``workload.service.registry_credential``, sent in
    the create request, not in the environment)."""
    mig = res.mig
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
    """A service pod that answered its readiness check: the pod, its base URL, the seconds from
    the launch call to the first ready answer, the checks made."""

    pod: Pod
    url: str
    ready_s: float
    checks: int


class NotReady(ProviderTimeout):
    """A service pod never answered its readiness check in time (its last answer is named)."""


def wait_ready(res: Resources, side: str, pod: Pod, *, started: float,
               clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep) -> Ready:
    """Poll ``GET readiness.path`` until it answers ``readiness.status``, at most
    ``readiness.timeout_s`` seconds from ``started`` (``clock`` seconds).

    Raises:
        NotReady: no ready answer in time, or the pod's process exited; the message has the last
            answer (status and body, or the connection error) and the pod's log tail.
    """
    svc = service_of(res.mig)
    r = svc.readiness
    prov = res.provider(side)
    url = http_url(prov, pod, svc.port)
    last = "no answer yet"
    checks = 0
    with client_for(svc, url, timeout_s=max(1.0, r.interval_s * 4)) as c:
        while True:
            checks += 1
            try:
                got = c.health()
                if got["status"] == r.status:
                    return Ready(pod, url, clock() - started, checks)
                last = f"HTTP {got['status']}: {got['body'][:120]!r}"
            except ProviderError as exc:
                last = str(exc)
            now = prov.get(pod.id)
            if now.state != "RUNNING" or clock() - started > r.timeout_s:
                why = (f"its process exited ({now.state})" if now.state != "RUNNING" else
                       f"no {r.status} within readiness.timeout_s = {r.timeout_s:g} s")
                if last.startswith("HTTP 404"):
                    why += (f"; GET {r.path} answers 404: the service serves no such path, set "
                            f"workload.service.readiness.path to one it serves (the {svc.protocol} default is "
                            f"{READINESS_PATHS[svc.protocol]})")
                raise NotReady(f"service pod {pod.id} ({side}) is not ready: {why}; GET {r.path} was checked {checks} "
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
    pod: Pod = res.apply_plan(side, plan_service(res, side, role))
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
    return client_for(service_of(res.mig), ready.url, timeout_s=res.mig.measure.request_timeout_s,
                      project=res.run.project)


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
    ``runbook_lib`` command line), where the provider reports processes.

    Raises:
        ProviderError: the provider cannot describe the pod.
    """
    mig = res.mig
    svc = service_of(mig)
    seen = res.provider(side).describe(ready.pod.id)
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
