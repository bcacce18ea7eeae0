"""Phase 02, map target equivalents: what each source dependency becomes on the target.

Every row is ``equivalent``, ``adapter needed`` (a known change that later phases test) or
``no equivalent`` (blocks cutover: design and test an adapter first). The target's
provider capabilities are declared data (:class:`runbook_lib.providers.base.Capabilities`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

from runbook_lib import secret_refs
from runbook_lib.errors import RunbookError
from runbook_lib.evidence.records import (
    ADAPTER,
    EQUIVALENT,
    NONE,
    AlternateMap,
    DeclaredRequirements,
    DependencyRow,
    FreezeData,
    FreezeSource,
    MappingData,
    OfferDetail,
    OfferRow,
    Offers,
    SourcePod,
)
from runbook_lib.gates import GateResult
from runbook_lib.params import (
    LB_MAX_REQUEST_S,
    LiveProfile,
    Migration,
    Profile,
    RemoteProfile,
    RunpodServerless,
    VastServerless,
    profile_differences,
)
from runbook_lib.phases import PhaseContext, PhaseResult, md, schedules, table
from runbook_lib.phases.service_pods import serving_shown
from runbook_lib.portability import topology
from runbook_lib.portability.gpus import compute_capability, offer_problem, reported_capability, runs_on
from runbook_lib.providers import REMOTE
from runbook_lib.providers.base import Capabilities, Capability
from runbook_lib.providers.offers import Offer, filter_offers, version_tuple
from runbook_lib.storage import GrantScope, build_grant
from runbook_lib.workload.durable import LOST

GIB = 2**30


def _row(dep: str, source: object, target: object, status: str, reason: str) -> DependencyRow:
    return DependencyRow(dependency=dep, source=str(source), target=str(target), status=status, reason=reason)


ENDPOINT_ADAPTERS = {
    ("queue", "load_balancing"):
        "request/response contract: each request goes straight to the worker's HTTP port (POST /infer) and its "
        "answer comes back in the response. The target has no job ids, /status, backlog or automatic retries, so "
        "callers own retries, timeouts and back-pressure, and a busy or dead worker is their error to handle; no "
        "/stream. Phase 04 measures the target through this contract",
    ("load_balancing", "queue"):
        "job API in front: callers submit /run or /runsync and poll /status with the job id; requests wait in the "
        "queue instead of reaching a busy worker, and failed jobs are retried by the endpoint. Phase 04 measures "
        "the target through the job API",
}
"""Phase 02's named design for each change of endpoint mode (docs.runpod.io/serverless/endpoints
"Endpoint types": queue-based endpoints queue and retry, load-balancing endpoints do neither)."""


def endpoint_mode_row(source_mode: str, target_mode: str, caps: Capabilities) -> DependencyRow:
    """How the source's endpoint mode maps to the target's: the same mode is equivalent; a
    changed mode is an adapter with its design named (:data:`ENDPOINT_ADAPTERS`), decided here
    rather than discovered in phase 04; a mode the target cannot serve has no equivalent."""
    cap = caps.load_balancing if target_mode == "load_balancing" else caps.queue_endpoints
    if not cap.supported:
        other = "queue" if target_mode == "load_balancing" else "load_balancing"
        return _row("endpoint mode", source_mode, f"{target_mode}: unsupported", NONE,
                    f"{cap.detail}; set target.endpoint_mode: {other} if the target serves it (phase 04 needs an "
                    "endpoint on each side)")
    if source_mode == target_mode:
        return _row("endpoint mode", source_mode, target_mode, EQUIVALENT, f"{target_mode} on both sides: {cap.detail}")
    return _row("endpoint mode", source_mode, target_mode, ADAPTER, ENDPOINT_ADAPTERS[(source_mode, target_mode)])


def target_offers(ctx: PhaseContext, where: str = "02/offers.json") -> Offers | None:
    """Search, re-check and rank the target's offers against ``target.offer`` (read-only,
    allowed in dry-run): a remote target's marketplace offers, or a local target's declared
    machines (``target.offers``). None for a local target that declares none.

    Returns:
        The offer ids ranked cheapest first, the best offer (None when none qualifies), one row
        per offer seen (accepted, reasons, unverified; also written to ``where`` in the run) and
        ``target.offer`` as judged.
    """
    prof = ctx.mig.target
    if isinstance(prof, LiveProfile) or (not isinstance(prof, RemoteProfile) and not getattr(prof, "offers", ())):
        return None  # a live target is refused in params; a local one without offers is this host
    req = prof.offer
    offers = ctx.resources.provider("target").search_offers(req, ports=len(ctx.mig.workload.requirements.ports))
    ranked, table = filter_offers(offers, req)
    if isinstance(prof, RemoteProfile) and prof.device.startswith("cuda"):
        ranked = runnable(ctx, ranked, table)
    ctx.evidence.write_json(where, table)
    return Offers(ranked=tuple(o.offer_id for o in ranked),
                  best=OfferDetail.model_validate(ranked[0].to_dict()) if ranked else None,
                  table=tuple(OfferRow.model_validate(r) for r in table), requirements=req.model_dump())


@dataclass(frozen=True)
class FrozenBuild:
    """The torch build the target will run, as phase 01 froze it from the source: its GPU
    architectures (``torch.cuda.get_arch_list()``) and CUDA runtime, or why they are unknown here
    (``unknown``: another image on the target, no frozen inventory, a CPU build)."""

    arch_list: tuple[str, ...] = ()
    cuda_runtime: str = ""
    unknown: str = ""


def frozen_build(ctx: PhaseContext) -> FrozenBuild:
    """The :class:`FrozenBuild` of the target: known only when the target runs the source's image
    (the same build) and phase 01 froze the source's inventory."""
    src, tgt = ctx.mig.source, ctx.mig.target
    freeze = ctx.records.freeze
    env = freeze.freeze.environment if freeze is not None else None
    if not (isinstance(src, RemoteProfile) and isinstance(tgt, RemoteProfile) and src.image and src.image == tgt.image):
        return FrozenBuild(unknown="the target runs another image than the source, whose torch build is not known here")
    if env is None:
        return FrozenBuild(unknown="phase 01 froze no inventory of the source (a dry-run freeze)")
    if not env.cuda.arch_list:
        return FrozenBuild(cuda_runtime=env.cuda.runtime or "",
                           unknown="the source's torch build lists no GPU architectures (a CPU build, or no GPU seen)")
    return FrozenBuild(tuple(env.cuda.arch_list), env.cuda.runtime or "")


def _architecture_row(build: FrozenBuild, gpu: str) -> DependencyRow:
    """Whether the source image's torch build runs on the best offer's GPU, as far as phase 02 can
    tell (offers it cannot run were already dropped: :func:`runnable`)."""
    cc = compute_capability(gpu)
    source = ", ".join(build.arch_list) or "unknown"
    if cc is None or build.unknown:
        why = build.unknown or f"{gpu} is not in NVIDIA's compute capability table here (portability.gpus)"
        return _row("GPU architecture", source, gpu, ADAPTER, f"not checked before renting: {why}; the canary checks it")
    _, how = runs_on(cc, build.arch_list)
    return _row("GPU architecture", source, f"{gpu} (compute capability {cc})", EQUIVALENT, how)


def runnable(ctx: PhaseContext, ranked: list[Offer], table: list[dict[str, Any]]) -> list[Offer]:
    """The ranked offers whose GPU the workload can run on, known before renting
    (:func:`runbook_lib.portability.gpus.offer_problem`: the source image's torch build and its CUDA
    runtime against the offer's GPU and host driver, from :func:`frozen_build`, and bfloat16 math
    when ``target.dtype`` asks for it). Each offer dropped has its row in ``table`` marked not
    accepted, with the reason, so no canary is ever rented on it."""
    build = frozen_build(ctx)
    keep = []
    rows = {str(r["offer_id"]): r for r in table}
    for o in ranked:
        why = offer_problem(o.gpu_name, arch_list=build.arch_list, dtype=ctx.mig.target.dtype,
                            cuda_runtime=build.cuda_runtime,
                            cuda_max=o.cuda_max, reported_cc=reported_capability(o.extra.get("compute_cap")))
        if not why:
            keep.append(o)
            continue
        row = rows[str(o.offer_id)]
        row.update(accepted=False, reasons="; ".join(x for x in (row["reasons"], why) if x))
    return keep


@dataclass(frozen=True)
class SourceFacts:
    """Python, torch, CUDA runtime and driver of the source as phase 02 compares them."""

    python: str
    torch: str
    cuda: str | None
    driver: str | None


def _source_facts(freeze: FreezeSource) -> SourceFacts:
    """Python, torch and CUDA of the source: frozen from its pod, else (dry-run) what the provider
    reports, else unknown."""
    env = freeze.environment
    if env:
        return SourceFacts(env.python, env.torch, env.cuda.runtime, env.cuda.driver_version)
    pod = freeze.source_pod or SourcePod()
    unknown = "not frozen (dry-run)"
    return SourceFacts(unknown, unknown, pod.cuda_max or unknown, unknown)


def dependency_map(ctx: PhaseContext, offers: Offers | None = None) -> list[DependencyRow]:
    """Build the dependency / control map from phase 01's record, the target's declared
    capabilities and, for a remote target, the best qualifying offer (``offers`` from
    :func:`target_offers`): one row per dependency (``dependency``, ``source``, ``target``,
    ``status``, ``reason``), in the order a reader checks them: the offer, compute, provider
    semantics, the endpoint, ports and host features, capacity, storage and secrets, billing, and
    the source's schedules (:func:`runbook_lib.phases.schedules.mapping_rows`)."""
    rec = ctx.records.need_freeze()
    caps = ctx.resources.provider("target").capabilities()
    best = offers.best if offers is not None and ctx.mig.target.provider in REMOTE else None
    compute = service_rows(ctx, caps) if ctx.mig.workload.kind == "service" else _compute_rows(ctx, rec, caps, best)
    return [*_offer_rows(ctx, offers), *compute, *_semantics_rows(ctx, rec, caps),
            *_port_rows(ctx, rec.requirements, caps), *_capacity_rows(ctx, rec, best), *_access_rows(ctx, caps, best),
            *schedules.mapping_rows(ctx, rec)]


def _offer_rows(ctx: PhaseContext, offers: Offers | None) -> list[DependencyRow]:
    """The target offer phase 02 chose, or why none qualified."""
    src, tgt = ctx.mig.source, ctx.mig.target
    if tgt.provider in REMOTE:
        offers = offers or Offers()
        best, seen = offers.best, len(offers.table)
        if best is None:
            image = any(m in r for r in offers.reasons() for m in ("is compute capability", "older major release"))
            return [_row("target offer", "running today", f"{seen} offers seen", NONE,
                         f"no {tgt.provider} offer meets target.offer: {offers.reasons()[:3]}; widen the requirements"
                         + ("; for offers the image cannot run (their GPU or host driver), ask for other "
                            "target.offer.gpu_names or a higher cuda_min, or use an image built for them" if image
                            else ""))]
        row = offers.row(best.offer_id)
        return [_row("target offer", src.release, f"{best.gpu_count} x {best.gpu_name} "
                     f"({best.offer_id}, {best.region or 'any region'})", EQUIVALENT,
                     f"cheapest of {len(offers.ranked)} qualifying offers out of {seen}; "
                     f"unverified until the canary: {(row.unverified if row else '') or 'none'}")]
    if offers is None:
        return []
    first = offers.best  # a local target's declared machines
    if first is None:
        return [_row("target offer", "this host", f"{len(offers.table)} local machines", NONE,
                     f"no machine in target.offers meets target.offer: {offers.reasons()[:3]}")]
    return [_row("target offer", "this host", f"{first.vcpu or 0:g} vCPU, {first.ram_gib or 0:g} GiB ({first.offer_id})",
                 EQUIVALENT, f"first of {len(offers.ranked)} qualifying local machines; every local pod and "
                 "worker runs on this host at target.price_usd_per_hour")]


@dataclass(frozen=True)
class GlobalBatch:
    """A training side's rows per optimizer step: ``batch_size`` per process times ``world_size``."""

    batch_size: int
    world_size: int

    @classmethod
    def of(cls, profile: Profile) -> "GlobalBatch":
        return cls(profile.batch_size, profile.world_size)

    @property
    def rows(self) -> int:
        return self.batch_size * self.world_size

    def __str__(self) -> str:
        return f"{self.world_size} process(es) x {self.batch_size} = {self.rows} rows"


def global_batch_problem(mig: Migration, target: Profile | None = None) -> str:
    """Why the target's global batch is not the source's, with the remedy; empty when it is.

    A data-parallel step averages the gradient over every process's rows, so the rows per
    optimizer step are ``batch_size * world_size`` (PyTorch's DistributedDataParallel notes: the
    gradients are averaged over the processes). Changing the world size without the per-process
    batch changes that product, and with the same ``workload.learning_rate`` the training itself."""
    tgt = target or mig.target
    s, t = GlobalBatch.of(mig.source), GlobalBatch.of(tgt)
    if s.rows == t.rows:
        return ""
    fit = (f"set target.batch_size to {s.rows // t.world_size} to keep {s.rows} rows a step"
           if s.rows % t.world_size == 0 else
           f"no whole target.batch_size keeps {s.rows} rows over {t.world_size} processes: change target.world_size")
    return (f"the global batch changes from {s} (source) to {t} (target): every optimizer step averages over "
            f"{t.rows} rows instead of {s.rows} at the same learning_rate {mig.workload.learning_rate:g}, so the "
            f"training changes silently; {fit}, or scale learning_rate with the batch and migrate that as a change")


def global_batch_gate(mig: Migration) -> GateResult | None:
    """Phase 02's ``global_batch`` gate for a training job where a side runs more than one process
    or the global batches differ (None otherwise): blocking, FAIL with
    :func:`global_batch_problem`, else PASS naming both sides' layout and the learning rate."""
    if mig.workload.kind != "training":
        return None
    s, t = GlobalBatch.of(mig.source), GlobalBatch.of(mig.target)
    if max(s.world_size, t.world_size) == 1 and s.rows == t.rows:
        return None
    why = global_batch_problem(mig)
    return GateResult("global_batch", "FAIL" if why else "PASS", True, t.rows, s.rows, "rows per optimizer step",
                      "batch_size x world_size on each side (params), learning rate from workload.learning_rate",
                      why or f"source {s}, target {t}; learning rate {mig.workload.learning_rate:g} on both "
                      "(workload.learning_rate)", phase="02",
                      source="PyTorch DistributedDataParallel: gradients are averaged over the processes")


def _batch_rows(mig: Migration, tgt: Profile) -> list[DependencyRow]:
    """A training job's processes and global batch, source against target."""
    s, t = GlobalBatch.of(mig.source), GlobalBatch.of(tgt)
    rows = [_row("global batch", str(s), str(t), NONE if s.rows != t.rows else EQUIVALENT,
                 global_batch_problem(mig, tgt) or f"the same {s.rows} rows per optimizer step")]
    if s.world_size != t.world_size:
        rows.append(_row("data-parallel processes", s.world_size, t.world_size, ADAPTER,
                         "the gradient is averaged over a different number of processes; phase 03 proves the "
                         "checkpoint reloads and the loss curve stays in its band, phase 04 compares step time"
                         + (" and all-reduce" if min(s.world_size, t.world_size) > 1 else "")))
    rows.append(checkpoint_row(mig))
    return rows


def checkpoint_row(mig: Migration) -> DependencyRow:
    """Where the training job keeps its checkpoints (``workload.checkpoint_location``) against
    what outlives a destroyed pod, before anything is rented: the container disk never does (no
    equivalent: the job could only start again), the pod's volume outlives a stop but not a
    destroy (adapter: the ``checkpoint_durability`` drill shows it), the run's store outlives
    every pod."""
    where = mig.workload.checkpoint_location
    target = {"container": "lost with the pod", "volume": "kept on stop, lost on destroy",
              "store": "kept in the run's store"}[where]
    status = {"container": NONE, "volume": ADAPTER, "store": EQUIVALENT}[where]
    drill = "the checkpoint_durability drill destroys a pod and resumes on a new one" \
        if "checkpoint_durability" in mig.drills.run else "add checkpoint_durability to drills.run to prove it"
    reason = f"{LOST[where]}, so a destroyed or reclaimed pod's job starts again from step 0; keep them in the " \
        "run's store (workload.checkpoint_location: store)" if where in LOST else \
        "each checkpoint is committed to the run's store as a set before the job goes on"
    return _row("checkpoint location", where, target, status, f"{reason}; {drill}")


def _compute_rows(ctx: PhaseContext, rec: FreezeData, caps: Capabilities,
                  best: OfferDetail | None) -> list[DependencyRow]:
    """Device, dtype, a training job's processes and global batch, and the image, interpreter,
    framework and CUDA each side runs."""
    src, tgt = ctx.mig.source, ctx.mig.target
    sf = _source_facts(rec.freeze)
    rows: list[DependencyRow] = []
    if tgt.device.startswith("cuda") and not caps.gpu.supported:
        rows.append(_row("device", src.device, tgt.device, NONE, f"target asks for {tgt.device}: {caps.gpu.detail}"))
    elif src.device.split(":")[0] != tgt.device.split(":")[0]:
        rows.append(_row("device", src.device, tgt.device, ADAPTER, "device type changes; parity is proven in phase 03"))
    else:
        rows.append(_row("device", src.device, tgt.device, EQUIVALENT, caps.gpu.detail))
    rows.append(_row("dtype", src.dtype, tgt.dtype, EQUIVALENT if src.dtype == tgt.dtype else ADAPTER,
                     "same compute dtype" if src.dtype == tgt.dtype else
                     "numerics change; outputs are held to the source dtype's tolerance in phase 03"))
    if ctx.mig.workload.kind == "training":
        rows += _batch_rows(ctx.mig, tgt)
    if isinstance(tgt, RemoteProfile):
        src_image = src.image if isinstance(src, RemoteProfile) else ""
        same = bool(src_image) and src_image == tgt.image
        rows.append(_row("image / python / torch", src_image or f"{sf.python} / {sf.torch}", tgt.image,
                         EQUIVALENT if same else ADAPTER, "the same image on both sides" if same else
                         "the image changes; parity decides in phase 03"))
        # What the image needs is target.offer.cuda_min (the source host's driver maximum is only
        # what that host offers, recorded for comparison)
        need = tgt.offer.cuda_min
        have = best.cuda_max if best is not None else ""
        if not need or not have:
            rows.append(_row("CUDA (host driver)", f"source host supports {sf.cuda}", have or "unknown", ADAPTER,
                             "set target.offer.cuda_min to the CUDA version the image is built for; the canary "
                             "re-checks the host driver" if not need else "the offer does not say; the canary re-checks"))
        else:
            ok = version_tuple(have) >= version_tuple(need)
            rows.append(_row("CUDA (host driver)", f"image needs {need} (source host supports {sf.cuda})", have,
                             EQUIVALENT if ok else NONE,
                             f"target host driver supports CUDA {have} >= {need}" if ok else
                             f"target host driver supports CUDA {have} < {need}: images built for {need} fail to start"))
        if tgt.device.startswith("cuda") and best is not None:
            rows.append(_architecture_row(frozen_build(ctx), best.gpu_name))
            env = rec.freeze.environment
            linked = topology.offer_row(env.topology.model_dump(), best.gpu_count) if env is not None else None
            if linked is not None:
                rows.append(_row("GPU interconnect", linked[0], linked[1], EQUIVALENT if linked[2] else ADAPTER,
                                 linked[3]))
    else:
        host = rec.host
        rows.append(_row("python / torch", f"{sf.python} / {sf.torch}", f"{host.python} / {host.torch}",
                         EQUIVALENT if (sf.python, sf.torch) == (host.python, host.torch) else ADAPTER,
                         "same interpreter and framework build" if sf.torch == host.torch else
                         "framework version differs; parity decides"))
        rows.append(_row("CUDA runtime / driver", f"{sf.cuda} / {sf.driver}",
                         f"{host.cuda.runtime} / {host.cuda.driver_version}",
                         EQUIVALENT if sf.cuda == host.cuda.runtime else ADAPTER,
                         "recorded; must satisfy the image's CUDA build"))
    return rows


def service_rows(ctx: PhaseContext, caps: Capabilities) -> list[DependencyRow]:
    """A service's image, protocol and registry login on the target: the same image and command
    run on both sides; a streamed or long answer must fit the target's HTTP proxy limit (Runpod's
    proxy ends a request after 100 s, docs/reference/providers.md); a private image needs its
    registry credential on the target (seed 001: "separate storage/registry credentials"), else
    nothing can pull it and the map blocks, naming the credential."""
    svc = ctx.mig.workload.service
    assert svc is not None
    src, tgt = ctx.mig.source, ctx.mig.target
    rows = [_row("device", src.device, tgt.device, EQUIVALENT if src.device.split(":")[0] == tgt.device.split(":")[0]
                 else ADAPTER, "the service's own device selection runs on both; parity decides in phase 03"),
            _row("image and command", svc.image, svc.image, EQUIVALENT,
                 "the same image on both sides, unchanged (no runbook code inside); workload.service.command is a "
                 "pod's command, a Vast.ai Serverless template's onstart, and not run on a Runpod Serverless "
                 "endpoint, which runs the image's entry point (POST /v2/serverless takes no command)"
                 if _on_serverless(src) or _on_serverless(tgt) else
                 "the same image and command on both sides, unchanged (no runbook code inside)"),
            serving_row(src, tgt), *vast_settings_rows(src, tgt)]
    limit, need = caps.max_request_s, ctx.mig.workload.requirements.max_request_s
    if _load_balanced(tgt):  # Runpod's load balancer cuts a request at 5.5 min
        limit = LB_MAX_REQUEST_S
    elif _on_serverless(tgt):  # no pod proxy: a Runpod endpoint's execution timeout bounds a job, a Vast.ai worker none
        limit = getattr(tgt.serverless, "execution_timeout_s", None)  # type: ignore[union-attr]
    how = "streamed (server-sent events)" if svc.protocol == "openai-chat" and svc.stream else "one answer per request"
    if limit is not None and need > limit:
        rows.append(_row(f"protocol {svc.protocol}", f"{how}, answers within {need:g} s", f"proxy ends requests "
                         f"after {limit:g} s", NONE, "answers can outlive the target's HTTP proxy: lower "
                         "workload.requirements.max_request_s or serve through a direct port"))
    elif _on_serverless(tgt):
        rows.append(_row(f"protocol {svc.protocol}", how, "the same paths behind the load balancer" if _load_balanced(tgt)
                         else "the same job contract behind the endpoint", EQUIVALENT,
                         "requests reach the service through the endpoint's front door (the serving row says how)"
                         + ("" if limit is None else f", each ended at {limit:g} s") + "; the canary's answers are "
                         "compared with the golden in phase 03"))
    else:
        rows.append(_row(f"protocol {svc.protocol}", how, "the same protocol over HTTP", EQUIVALENT,
                         f"requests reach the service directly{'' if limit is None else f' through a {limit:g} s proxy'}; "
                         "the canary's answers are compared with the golden in phase 03"))
    names = {x.name for x in tgt.secrets}
    if svc.private_image and not svc.registry_credential:
        rows.append(_row("registry credential", "private image", "none declared", NONE,
                         f"image {svc.image!r} is private (workload.service.private_image) but "
                         "workload.service.registry_credential names no secret: the target cannot pull it. Name the "
                         "registry login secret there and declare it in target.secrets"))
    elif svc.registry_credential and svc.registry_credential not in names:
        rows.append(_row("registry credential", svc.registry_credential, "not in target.secrets", NONE,
                         f"workload.service.registry_credential {svc.registry_credential!r} is not declared in "
                         "target.secrets: declare it there by reference (env: or file:)"))
    elif svc.registry_credential:
        rows.append(_row("registry credential", svc.registry_credential, f"{svc.registry_credential} (target.secrets)",
                         EQUIVALENT, "the registry login is the target's own secret, separate from storage keys"))
    else:
        rows.append(_row("registry credential", "public image", "public image", EQUIVALENT, "no registry login needed"))
    return rows


def _on_serverless(prof: Any) -> bool:
    return getattr(prof, "serverless", None) is not None


POD_HAS_NO = ("scale to zero and min/max workers (one pod, always on, billed while it exists)",
              "idle timeout", "the execution timeout (a pod has no per-job limit: each request's deadline, "
              "measure.request_timeout_s, and any HTTP proxy's limit bound it)",
              "flashboot", "the job queue and its retries")
"""What a pod has no equivalent for when a service leaves a Runpod Serverless endpoint
(docs/reference/providers.md 2.2, "Endpoint management (v2)")."""


POD_HAS_NO_LB = ("scale to zero and min/max workers (one pod, always on, billed while it exists)",
                 "idle timeout", "routing by /ping health (a pod's proxy forwards whatever answers)", "flashboot")
"""What a pod has no equivalent for when a service leaves a Runpod load-balancing endpoint
(docs.runpod.io/serverless/load-balancing/overview)."""


def _load_balanced(prof: Any) -> bool:
    sv = getattr(prof, "serverless", None)
    return isinstance(sv, RunpodServerless) and sv.type == "LOAD_BALANCER"


def vast_adapter(src: Any, sv: VastServerless) -> str:
    """The adapter a service needs on a Vast.ai Serverless endpoint, named: which PyWorker fronts
    which server, and what changes in the request path (seed 001: "Source dependency has no target
    equivalent: design and test an adapter before cutover"; docs.vast.ai "The PyWorker")."""
    p = sv.pyworker
    was = ("Runpod's job API (POST https://api.runpod.ai/v2/{endpoint}/runsync with the Runpod key)"
           if _on_serverless(src) else "the service's own port")
    lost = ("; no equivalent on Vast.ai for Runpod's execution timeout, flashboot, the job queue's /status and "
            "retries (a worker answers one request at a time in order; a failed call is the client's to retry)"
            if _on_serverless(src) else "")
    return (f"the image does not run there unchanged: Vast.ai's PyWorker (from {p.repo}, a WorkerConfig whose "
            f"HandlerConfig route is {p.route} and whose model_healthcheck_url is {p.healthcheck}) fronts the "
            f"service's own server on workload.service.port inside the worker. Callers leave {was} "
            f"for two calls: POST https://run.vast.ai/route/ (the endpoint name and its own key) for a worker, then "
            f"POST {{the worker's URL}}{p.route} with the signed route as auth_data and the job as payload, forwarded to the "
            f"server's {p.route}{lost}. Phase 03 proves the image with this adapter against the golden")


def vast_settings_rows(src: Any, tgt: Any) -> list[DependencyRow]:
    """A Runpod Serverless source endpoint's settings mapped to the Vast.ai Serverless target's, one
    row each (``endpoint setting: <name>``); what has no equivalent on Vast.ai is named with what
    stands closest, as an adapter (the PyWorker adapter carries the service there, and phases 03
    and 04 measure it), never silently dropped. Empty unless the source is a Runpod Serverless
    endpoint and the target a Vast.ai one (docs.vast.ai "Serverless architecture" and "Worker
    states"; docs/reference/providers.md 2.2)."""
    sv, tv = getattr(src, "serverless", None), getattr(tgt, "serverless", None)
    if not isinstance(sv, RunpodServerless) or not isinstance(tv, VastServerless):
        return []
    kept = "min_load 0: scales to zero (idle workers stopped, Inactive)" if tv.min_load == 0 else \
        f"min_load {tv.min_load:g}: capacity kept for that load"
    rows = [
        ("type", f"{sv.type} (jobs queued, retried by Runpod)", "routed per request (POST /route/ for a worker)",
         "no queue on Vast.ai: a request waits in /route/ until a worker is ready, and a failed call is the caller's "
         "to retry"),
        ("max workers", f"workers.max {src.workers}", f"max_workers {tv.max_workers}",
         "the same ceiling" if src.workers == tv.max_workers else "a different ceiling: saturation throughput follows"),
        ("min workers and scale to zero", f"workers.min {src.active_workers or 0}"
         + (" (scale to zero)" if not src.active_workers else ""), f"{kept}; cold_workers {tv.cold_workers}",
         "Vast.ai keeps capacity by load, not by a count of running workers; cold_workers are stopped workers kept "
         "ready to start"),
        ("idle timeout", f"workers.idleTimeout {src.idle_timeout_s:g} s", "none",
         "no equivalent: Vast.ai's engine stops an idle worker from its own load history (target_util, cold_mult); "
         "phase 04's cold starts from zero show what a start costs"),
        ("execution timeout", f"timeout {sv.execution_timeout_s:g} s", "none",
         "no equivalent: a request runs until its caller gives up (measure.request_timeout_s), so the hung_worker "
         "drill does not apply"),
        ("flashboot", sv.flashboot, "none", "no equivalent: cold_workers (stopped, image loaded) stand closest"),
    ]
    return [_row(f"endpoint setting: {name}", a, b, EQUIVALENT if why == "the same ceiling" else ADAPTER, why)
            for name, a, b, why in rows]


def serving_row(src: Any, tgt: Any) -> DependencyRow:
    """Where the service runs on each side (:func:`serving_shown`): a pod on both is equivalent;
    a Runpod Serverless endpoint on both maps its settings one to one (an adapter naming each that
    changes: cold starts and idle cost follow them); an endpoint against a pod is an adapter that
    names what the other side has no equivalent for (:data:`POD_HAS_NO`) and how the request path
    changes (the job API with the Runpod key, against the handler's ``--rp_serve_api`` on the
    pod's port: the same ``/runsync`` contract)."""
    a, b = serving_shown(src), serving_shown(tgt)
    on_a, on_b = _on_serverless(src), _on_serverless(tgt)
    if isinstance(getattr(tgt, "serverless", None), VastServerless):
        return _row("serving", a, b, ADAPTER, vast_adapter(src, tgt.serverless))
    if not on_a and not on_b:
        return _row("serving", a, b, EQUIVALENT, "the service runs the same way on both sides")
    if on_a and on_b:
        changed = [name for name, x, y in (
            ("min workers", src.active_workers or 0, tgt.active_workers or 0), ("max workers", src.workers, tgt.workers),
            ("idle timeout", src.idle_timeout_s, tgt.idle_timeout_s),
            ("execution timeout", src.serverless.execution_timeout_s, tgt.serverless.execution_timeout_s),
            ("flashboot", src.serverless.flashboot, tgt.serverless.flashboot),
            ("GPU pools", src.gpu_priority, tgt.gpu_priority)) if x != y]
        if not changed:
            return _row("serving", a, b, EQUIVALENT, "the same endpoint type and settings on both sides")
        return _row("serving", a, b, ADAPTER, f"{', '.join(changed)} change: cold starts and idle cost follow them; "
                    "phase 04 measures the target as configured")
    lb = _load_balanced(src) or _load_balanced(tgt)
    if lb and on_a:
        return _row("serving", a, b, ADAPTER,
                    "the service's server leaves Runpod's load balancer (https://{endpoint}.api.runpod.ai/<path> with "
                    "the Runpod key, routed to workers whose /ping answers 200) for the pod's HTTP port: the same paths, "
                    "requested straight. No equivalent on a pod: " + "; ".join(POD_HAS_NO_LB)
                    + ". Callers must be pointed at the new URL; phase 03 proves the answers")
    if lb:
        return _row("serving", a, b, ADAPTER,
                    "the service's server moves behind Runpod's load balancer: callers send the same paths to "
                    "https://{endpoint}.api.runpod.ai with the Runpod key, each to a worker whose /ping on PORT_HEALTH "
                    "answers 200 (the image must serve it), no queue and no retries, requests cut at 5.5 min, workers "
                    "scale as configured, and the image's entry point runs (workload.service.command does not); "
                    "phase 03 proves the answers")
    if on_a:
        return _row("serving", a, b, ADAPTER,
                    "the handler leaves Runpod's job API (https://api.runpod.ai/v2/{endpoint}/runsync with the Runpod "
                    "key) for its own --rp_serve_api on the pod's HTTP port: the same /runsync contract, requested "
                    "straight. No equivalent on a pod: " + "; ".join(POD_HAS_NO)
                    + ". Callers must be pointed at the new URL; phase 03 proves the answers")
    return _row("serving", a, b, ADAPTER,
                "the handler moves behind Runpod's job API: callers send /runsync to https://api.runpod.ai/v2/{endpoint} "
                "with the Runpod key, jobs queue and are retried by Runpod, workers scale as configured, and the image's "
                "entry point runs (workload.service.command does not); phase 03 proves the answers")


def _semantics_rows(ctx: PhaseContext, rec: FreezeData, caps: Capabilities) -> list[DependencyRow]:
    """What a stop keeps and how ports are reached on each provider, and for an inference
    workload the endpoint mode, payload limits and endpoint settings."""
    src, tgt = ctx.mig.source, ctx.mig.target
    rows: list[DependencyRow] = []
    src_caps = ctx.resources.provider("source").capabilities()
    for dep, src_v, tgt_v, consequence in (
            ("lifecycle (stop, restart, interruption)", src_caps.lifecycle, caps.lifecycle,
             "what survives a stop differs: state must live in the store (phase 03 proves resume from it) and the "
             "rollback point must not rely on a disk"),
            ("network mode", src_caps.network, caps.network,
             "ports are published and reached differently: the canary checks each declared port is reachable")):
        same = src_v == tgt_v
        rows.append(_row(dep, src_v, tgt_v, EQUIVALENT if same else ADAPTER,
                         "the same provider semantics on both sides" if same else consequence))
    if ctx.mig.workload.kind == "inference":
        rows.append(endpoint_mode_row(ctx.mig.source.endpoint_mode, tgt.endpoint_mode, caps))
        rows.append(payload_row(rec.freeze.payloads, tgt.endpoint_mode, caps))
        rows.append(endpoint_settings_row(src, tgt))
    return rows


def _port_rows(ctx: PhaseContext, req: DeclaredRequirements, caps: Capabilities) -> list[DependencyRow]:
    """Each declared port, and the host features the workload requires (compose, privileged, a
    persistent volume)."""
    remote = ctx.mig.target.provider in REMOTE
    rows: list[DependencyRow] = []
    max_ports = caps.extra.get("max_ports")
    if max_ports is not None and max_ports.limit is not None and len(req.ports) > max_ports.limit:
        rows.append(_row("port count", len(req.ports), f"{max_ports.limit:g} at most", NONE, max_ports.detail))
    for p in req.ports:
        label = f"port {p.port}/{p.protocol}"
        if p.protocol == "udp" and not caps.udp.supported:
            rows.append(_row(label, "listens", "-", NONE, f"UDP not supported: {caps.udp.detail} ({caps.udp.source})"))
        elif p.protocol == "http" and caps.max_request_s is not None and req.max_request_s > caps.max_request_s:
            rows.append(_row(label, f"requests up to {req.max_request_s} s", f"proxy limit {caps.max_request_s} s",
                             NONE, "requests can outlive the target's HTTP proxy timeout"))
        else:
            rows.append(_row(label, "listens", "reachable", EQUIVALENT, caps.udp.detail if p.protocol == "udp" else
                             ("published at create; the canary checks it is reachable" if remote else "loopback/TCP")))
    for need, wanted, cap in (("docker_compose", req.docker_compose, caps.docker_compose),
                              ("privileged", req.privileged, caps.privileged)):
        if wanted:
            rows.append(_row(need, "required", "supported" if cap.supported else "unsupported",
                             EQUIVALENT if cap.supported else NONE, cap.detail))
    if req.persistent_volume:
        rows.append(_row("persistent volume", "required", caps.persistent_volume.detail,
                         EQUIVALENT if caps.persistent_volume.supported else NONE, "checkpoints survive a stop"))
    return rows


def _capacity_rows(ctx: PhaseContext, rec: FreezeData, best: OfferDetail | None) -> list[DependencyRow]:
    """Shared memory, memory, disk and GPU memory the workload needs against what the target
    offers (a remote offer) or has (this host), all in GB (10**9 bytes)."""
    tgt, req = ctx.mig.target, rec.requirements
    rows: list[DependencyRow] = []
    if isinstance(tgt, RemoteProfile):  # offers publish GiB (RAM, VRAM in MiB) and GB (disk)
        ram_gib, vram_mib = (best.ram_gib, best.vram_mib) if best is not None else (None, None)
        have_gb: dict[str, float | None] = {
            "/dev/shm": None, "memory": ram_gib * GIB / 1e9 if ram_gib is not None else None,
            "disk": (best.disk_gb if best is not None else None) or tgt.offer.disk_gb,
            "GPU memory": vram_mib * 2**20 / 1e9 if vram_mib else None}
    else:  # this host, in bytes
        host = rec.host
        have_gb = {"/dev/shm": host.shm_bytes / 1e9, "memory": host.memory_bytes / 1e9,
                   "disk": host.disk_free_bytes / 1e9}
    needs = {"/dev/shm": req.shm_gb, "memory": req.memory_gb, "disk": req.disk_gb, "GPU memory": req.gpu_memory_gb}
    for key, have in have_gb.items():  # every figure in GB (10**9 bytes), as the requirements are
        need_gb = needs[key]
        if have is None:
            rows.append(_row(key, f"{need_gb} GB needed", "not published by the provider", ADAPTER,
                             "re-checked on the canary"))
            continue
        ok = have >= need_gb
        rows.append(_row(key, f"{need_gb} GB needed", f"{have:.1f} GB available", EQUIVALENT if ok else NONE,
                         "enough" if ok else "target host is too small"))
    return rows


def _access_rows(ctx: PhaseContext, caps: Capabilities, best: OfferDetail | None) -> list[DependencyRow]:
    """How pods reach the store, each target secret, the serving configuration and billing."""
    src, tgt = ctx.mig.source, ctx.mig.target
    rows: list[DependencyRow] = []
    access = ("pods get a short-lived store grant (presigned URLs for the sets they read and a POST policy for "
              "their prefix; endpoint workers: STS credentials scoped to their records prefix), never the keys"
              if ctx.mig.storage.url.startswith("s3://") else "a local pod shares the directory")
    rows.append(_row("storage route", ctx.mig.storage.url, ctx.mig.storage.url, EQUIVALENT,
                     f"same store on both sides; objects moved with sha256 manifests; {access}"))
    worker_grant = session_grant_row(ctx)
    if worker_grant is not None:
        rows.append(worker_grant)
    for s in tgt.secrets:
        ok = secret_refs.resolve(s.name, s.ref, required=False) is not None
        status = EQUIVALENT if ok or not s.required else NONE
        rows.append(_row(f"secret {s.name}", "by reference", s.ref, status,
                         "injected at launch, scoped to the pod" if ok else
                         ("not set here, optional" if not s.required else f"required and {s.ref} is not set")))
    if src.batch_size != tgt.batch_size or src.threads != tgt.threads or src.workers != tgt.workers:
        rows.append(_row("serving config", f"threads {src.threads}, batch {src.batch_size}, workers {src.workers}",
                         f"threads {tgt.threads}, batch {tgt.batch_size}, workers {tgt.workers}", ADAPTER,
                         "changes throughput and latency; measured in phase 04"))
    price = f"{best.usd_per_hour:.3f} USD/h (offer)" if best else f"{tgt.price_usd_per_hour} USD/h"
    rows.append(_row("billing", f"{src.price_usd_per_hour} USD/h", f"{price} ({caps.billing})",
                     EQUIVALENT, "cost per accepted unit is compared in phase 04"))
    return rows


def endpoint_settings(prof: Any) -> str:
    """One side's endpoint settings as phase 02 shows them."""
    return (f"workers {prof.warm_workers} active of {prof.workers} max, idle timeout {prof.idle_timeout_s:g} s, "
            f"model cache {prof.model_cache or 'none'}, GPU priority {list(prof.gpu_priority) or 'any'}")


def endpoint_settings_row(src: Profile, tgt: Profile) -> DependencyRow:
    """Active and maximum workers, idle timeout, model cache and GPU priority, side against side
    (the serverless guidance, docs/reference/providers.md 2.3a: warm workers cut cold starts and
    cost idle time). The same settings are equivalent; changed ones are an adapter whose effects
    phase 04 measures: the scale-from-zero cold starts, and the cost per accepted unit at the
    declared traffic with the warm workers billed idle or not. A declared ``model_cache`` is said
    to be declared only: no adapter applies it. (``gpu_priority`` is applied: a Runpod queue
    endpoint's ``gpu.pools``, :func:`runbook_lib.providers.runpod.serverless_pools`.)"""
    a, b = endpoint_settings(src), endpoint_settings(tgt)
    cache = ("; model cache is declared, not applied: no adapter sets it (Runpod's cached models are chosen on the "
             "endpoint, docs.runpod.io/serverless/endpoints/model-caching), so set it on the provider; phase 04 "
             "measures the cold starts as they are" if src.model_cache or tgt.model_cache else "")
    if a == b:
        return _row("endpoint settings", a, b, EQUIVALENT, "the same scaling, cache and GPU order on both sides" + cache)
    changed = [name for name, x, y in (("active workers", src.warm_workers, tgt.warm_workers),
                                        ("max workers", src.workers, tgt.workers),
                                        ("idle timeout", src.idle_timeout_s, tgt.idle_timeout_s),
                                        ("model cache", src.model_cache, tgt.model_cache),
                                        ("GPU priority", src.gpu_priority, tgt.gpu_priority)) if x != y]
    return _row("endpoint settings", a, b, ADAPTER,
                f"{', '.join(changed)} change: cold starts (measured from zero in phase 04) and idle cost (warm "
                "workers are billed in phase 04's cost per accepted unit at the declared traffic)" + cache)


def session_grant_row(ctx: PhaseContext) -> DependencyRow | None:
    """Whether the run's store can give queue endpoint workers their session grant (STS
    credentials scoped to the records prefix, :mod:`runbook_lib.storage.grants`), tried here by
    asking for one and discarding it, so a store without STS (Cloudflare R2, many MinIO setups)
    stops the run in phase 02, before phase 03 rents a canary, not at phase 04's endpoint. Not
    asked when every queue side is in dry-run (nothing will be created, and the store may not be
    reachable yet). None when no side serves a queue endpoint from an S3 store."""
    queue = [side for side in ("source", "target") if getattr(ctx.mig, side).endpoint_mode == "queue"]
    if ctx.mig.workload.kind != "inference" or not queue or not ctx.mig.storage.url.startswith("s3://"):
        return None
    if all(ctx.resources.dry_run(side) for side in queue):
        return _row("queue workers' store grant", f"{', '.join(queue)} queue endpoint", "not checked (dry-run)",
                    ADAPTER, "endpoint workers need an STS session grant from the store; it is asked for here once "
                    "the endpoint would really be created (dry_run: false)")
    prefix = ctx.store_prefix("jobs", "grant-check")
    try:
        build_grant(ctx.store, GrantScope("session", write_prefix=prefix, ttl_s=900.0))
    except RunbookError as exc:
        return _row("queue workers' store grant", f"{', '.join(queue)} queue endpoint", "refused", NONE,
                    f"{exc}. Serve those sides as load_balancing endpoints, or use a store with STS")
    return _row("queue workers' store grant", f"{', '.join(queue)} queue endpoint", "STS session grant issued",
                EQUIVALENT, "a session grant scoped to a records prefix was issued and discarded: endpoint workers "
                "can keep idempotency records without the store's keys")


def payload_row(sizes: dict[str, int] | None, mode: str, caps: Capabilities) -> DependencyRow:
    """The workload's largest request and output (phase 01's ``payloads``,
    :func:`runbook_lib.phases.freeze.largest_payloads`) against the target mode's declared payload
    limits (``Capabilities.extra`` ``<mode>_request_bytes`` / ``<mode>_response_bytes``): within
    both is equivalent; above either has no equivalent (a result that cannot be returned would be
    a FAILED job): pass large data through the store and send its URL. Sizes phase 01 did not
    record are an adapter to check, never assumed to fit."""
    if sizes is None:
        return _row("payload size", "not recorded by phase 01", mode, ADAPTER,
                    "largest request and output unknown: phase 04's jobs show whether they fit")
    req_cap, resp_cap = caps.extra.get(f"{mode}_request_bytes"), caps.extra.get(f"{mode}_response_bytes")
    src = f"largest request {sizes['request_bytes']} B, largest output {sizes['output_bytes']} B"

    def limit(cap: Capability | None) -> str:
        return "not declared" if cap is None or cap.limit is None else f"{cap.limit:.0f} B"

    tgt = f"{mode}: request {limit(req_cap)}, response {limit(resp_cap)}"
    over = [f"{what} of {n} B exceeds {cap.limit:.0f} B ({cap.detail})"
            for what, n, cap in (("a request", sizes["request_bytes"], req_cap),
                                 ("an output", sizes["output_bytes"], resp_cap))
            if cap is not None and cap.limit is not None and n > cap.limit]
    if over:
        return _row("payload size", src, tgt, NONE, "; ".join(over) + ": put large inputs and results in the store "
                    "and send their URLs")
    undeclared = [k for k, cap in (("request", req_cap), ("response", resp_cap)) if cap is None or cap.limit is None]
    declared = req_cap or resp_cap
    why = declared.detail if declared is not None else "the provider declares none"
    return _row("payload size", src, tgt, EQUIVALENT, "within the target's declared limits"
                + (f"; no {' or '.join(undeclared)} limit declared: {why}" if undeclared else ""))


def dependency_gate(rows: Sequence[DependencyRow], *, phase: str = "02") -> GateResult:
    """FAIL when any dependency has no target equivalent (seed 001: block cutover)."""
    blocked = [r.dependency for r in rows if r.status == NONE]
    return GateResult("dependency_map", "FAIL" if blocked else "PASS", True, len(blocked), 0, "rows without equivalent",
                      "dependency map over declared requirements and provider capabilities",
                      f"no target equivalent for {blocked}: design and test an adapter before cutover" if blocked
                      else f"all {len(rows)} dependencies have an equivalent or a tested adapter path",
                      samples={"rows": len(rows)}, source="failure responses (README): no target equivalent blocks cutover", phase=phase)


def raced_dependency_gate(first: str, rows: Sequence[DependencyRow], others: Sequence[AlternateMap], *,
                          phase: str = "02") -> GateResult:
    """The dependency gate of a race (``targets``): a candidate with a dependency that has no
    equivalent is out of the race; the gate FAILs only when every candidate is (seed 001: no
    target equivalent blocks cutover), naming each one out and why.

    Args:
        first: the first candidate's name (the target); ``rows`` its dependency rows.
        others: the other candidates as :func:`map_alternate` mapped them.
    """
    out = {first: [r.dependency for r in rows if r.status == NONE],
           **{a.name: [r.dependency for r in a.dependency_map if r.status == NONE] for a in others}}
    gone = {n: deps for n, deps in out.items() if deps}
    left = [n for n in out if n not in gone]
    said = "; ".join(f"{n} out: no target equivalent for {deps}" for n, deps in gone.items())
    detail = (f"every candidate has a dependency without an equivalent ({said}): design and test an adapter before "
              "cutover" if not left else
              f"{len(left)} of {len(out)} candidates have an equivalent or a tested adapter path for every dependency "
              f"({', '.join(left)})" + (f"; {said}" if said else ""))
    return GateResult("dependency_map", "PASS" if left else "FAIL", True, len(gone), len(out) - 1,
                      "candidates out", "dependency map of every raced candidate over declared requirements and "
                      "provider capabilities", detail, samples={"candidates": len(out)},
                      source="failure responses (README): no target equivalent blocks cutover", phase=phase)


OFFER_COLUMNS = ["offer_id", "gpu_name", "gpu_count", "hourly_usd_with_disk", "region", "accepted", "reasons",
                 "unverified"]


@dataclass(frozen=True)
class MappingResult(PhaseResult):
    """Phase 02's evidence.

    Attributes:
        offers: :func:`target_offers` (None for a local target).
        rows: :func:`dependency_map` rows. capabilities: the target's declared capabilities.
        gate: :func:`dependency_gate`.
    """

    offers: Offers | None
    rows: tuple[DependencyRow, ...]
    capabilities: Capabilities
    gate: GateResult
    alternates: tuple[AlternateMap, ...] = ()
    raced: tuple[AlternateMap, ...] = ()

    def record(self) -> MappingData:
        return MappingData(dependency_map=self.rows, target_capabilities=asdict(self.capabilities), offers=self.offers,
                           alternates=self.alternates, raced=self.raced)

    def parts(self) -> list[Any]:
        out: list[Any] = []
        if self.offers is not None:
            out += [md(f"**Offers**: {len(self.offers.ranked)} of {len(self.offers.table)} qualify; ranked: "
                       f"{list(self.offers.ranked)}"),
                    table(self.offers.table, columns=OFFER_COLUMNS)]
        out.append(table(self.rows))
        if self.alternates:
            out += [md("**Documented alternates**, proposed in this order in phase 03 when a candidate has no "
                       "capacity (each used only under an approval with a reason; one with a dependency that has no "
                       "equivalent is never proposed)"),
                    table([{"alternate": a.name, "provider": a.provider,
                            "ranked offers": len(a.offers.ranked) if a.offers is not None else "this host",
                            "no equivalent": sum(r.status == NONE for r in a.dependency_map),
                            "changes against the target": "; ".join(a.differences)} for a in self.alternates])]
        if self.raced:
            out += [md("**The race's other candidates** (`targets`), mapped as the first; one with a dependency that "
                       "has no equivalent is out of the race, and phase 03 proves each of the others on its own canary"),
                    table([{"candidate": a.name, "provider": a.provider,
                            "ranked offers": len(a.offers.ranked) if a.offers is not None else "this host",
                            "no equivalent": sum(r.status == NONE for r in a.dependency_map),
                            "changes against the first": "; ".join(a.differences)} for a in self.raced])]
        return out


def map_alternate(ctx: PhaseContext, name: str, *, under: str = "alternates") -> AlternateMap:
    """Phase 02 for the documented alternate (or raced candidate) ``name``: its offers
    (``02/<under>/<name>/offers.json``) and dependency map, as the target's, and what it changes
    against the target. Its rows judge no gate of the run: an alternate with a dependency that
    has no equivalent is only never proposed (:mod:`runbook_lib.phases.candidates`), a raced
    candidate is out of the race (:func:`raced_dependency_gate`)."""
    alt = ctx.for_candidate(name)
    offers = target_offers(alt, where=f"02/{under}/{name}/offers.json")
    rows = dependency_map(alt, offers)
    return AlternateMap(name=name, provider=alt.mig.target.provider, offers=offers, dependency_map=tuple(rows),
                        blocked=any(r.status == NONE for r in rows),
                        differences=tuple(profile_differences(ctx.mig.target, alt.mig.target)))


def run(ctx: PhaseContext) -> MappingResult:
    """Phase 02: a remote target's offers (searched, re-checked, ranked), the dependency map
    (``02/dependency_map.json``) and its gate; each documented alternate mapped the same way
    (:func:`map_alternate`)."""
    caps = ctx.resources.provider("target").capabilities()
    offers = target_offers(ctx)
    rows = dependency_map(ctx, offers)
    ctx.evidence.write_json("02/dependency_map.json", rows)
    gate = dependency_gate(rows)
    alternates = tuple(map_alternate(ctx, a.name) for a in ctx.mig.alternates)
    raced = tuple(map_alternate(ctx, c.name, under="raced") for c in ctx.mig.targets[1:])
    if raced:  # a race: a candidate with a dependency that has no equivalent is out, not the run
        gate = raced_dependency_gate(ctx.mig.target.name, rows, raced)
    ctx.evidence.add_gates(gate)
    batch = global_batch_gate(ctx.mig)
    if batch is not None:
        ctx.evidence.add_gates(batch)
    return MappingResult(offers=offers, rows=tuple(rows), capabilities=caps, gate=gate, alternates=alternates,
                         raced=raced)
