"""Phase 01, freeze source truth: what exactly runs today, and what it silently depends on.

Evidence: this host's inventory; the source pod's own environment; immutable identities (weights
or dataset sha256); the frozen artifact (weights or checkpoint) as a verified set with its
manifest; golden outputs for fixed inputs; declared ports, protocols and host needs; secret
*names*; the SLOs the later gates hold the target to.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runbook_lib import gates as g
from runbook_lib import secret_refs
from runbook_lib.errors import StorageError
from runbook_lib.evidence.records import (
    CheckpointInput,
    CopiedObject,
    CredentialFinding,
    DeclaredRequirements,
    FreezeData,
    FreezePod,
    FreezeSource,
    Frozen,
    Golden,
    GoldenRun,
    Inspection,
    Inventory,
    PortRow,
    ScheduleRow,
    SecretRow,
    SourcePod,
    StoredObject,
)
from runbook_lib.layout import GOLDEN_OUTPUTS
from runbook_lib.params import Migration, RemoteProfile, Storage
from runbook_lib.phases import PhaseContext, PhaseResult, PlanShown, md, schedules, service, table
from runbook_lib.phases import service_pods as pods
from runbook_lib.portability import checkpoint
from runbook_lib.portability.checkpoint import Finding
from runbook_lib.portability.inventory import probe
from runbook_lib.providers.base import Plan
from runbook_lib.storage import MANIFEST_KEY, MARKER_KEY, ObjectInfo, credential_env, store_from_params
from runbook_lib.storage.s3 import S3Store
from runbook_lib.workload import make_workload


def host_inventory(ctx: PhaseContext) -> Inventory:
    """Probe the machine the runbook runs on (device from the source profile)."""
    inv = probe(device=ctx.mig.source.device, disk_path=ctx.run_dir)
    ctx.evidence.write_json("01/host_inventory.json", inv)
    return Inventory.model_validate(inv)


def describe_source(ctx: PhaseContext) -> SourcePod | None:
    """What the source provider reports about the pod that runs today (a remote source with
    ``pod_id``): image, GPU, CUDA, disk, ports, price, environment variable *names*. None for a
    local source. Read-only; allowed in dry-run.

    Raises:
        AuthError: the provider key is missing (the message names the reference) or refused.
        NotFound: ``source.pod_id`` does not exist.
    """
    prof = ctx.mig.source
    if not isinstance(prof, RemoteProfile) or not prof.pod_id:
        return None
    if "source_pod" not in ctx.cache:
        described = ctx.resources.provider("source").describe(prof.pod_id)
        ctx.evidence.write_json("01/source_pod.json", described)
        ctx.cache["source_pod"] = SourcePod.model_validate(described)
    pod: SourcePod = ctx.cache["source_pod"]
    return pod


def plan_freeze(ctx: PhaseContext) -> Plan:
    """The launch plan of the source-side freeze pod (shown, approved by fingerprint, applied by
    :func:`freeze_source`). A remote source's pod is planned on the GPU type it runs on today."""
    src = describe_source(ctx)
    offers = (src.gpu_name,) if src and src.gpu_name else None
    price = src.price_usd_per_hour if src else None  # what the running source pod costs
    return ctx.agents.plan("source", "source-freeze", "freeze", prefix=ctx.store_prefix("source"), offers=offers,
                                    price_usd_per_hour=price or None, frozen_prefix=input_prefix(ctx))


def input_prefix(ctx: PhaseContext) -> str:
    """The store prefix phase 01 copies an ``s3://`` checkpoint into (:func:`copy_in_checkpoint`),
    which the freeze pod reads through its grant; empty for any other workload."""
    wl = ctx.mig.workload
    return ctx.store_prefix("source", "input") if wl.kind == "checkpoint" and wl.checkpoint.startswith("s3://") else ""


def checkpoint_bucket(mig: Migration) -> S3Store:
    """The store at ``workload.checkpoint`` (an ``s3://`` URL), reached with
    ``workload.checkpoint_store`` or, when that is unset, the ``storage`` section's endpoint,
    region and key references (resolved here, on the runbook host, and never given to a pod).

    Raises:
        AuthError: a key reference does not resolve. StorageError: a bad URL.
    """
    access = mig.workload.checkpoint_store or mig.storage
    fields = ("endpoint_url", "region", "checksum_mode", "access_key_id_ref", "secret_access_key_ref")
    store = store_from_params(Storage(url=mig.workload.checkpoint, **{f: getattr(access, f) for f in fields}))
    assert isinstance(store, S3Store)  # workload.checkpoint is an s3:// URL here
    return store


def copy_in_checkpoint(ctx: PhaseContext, dest: Path) -> CheckpointInput:
    """Copy an ``s3://`` checkpoint (one object, or every object under the prefix) to ``dest`` on
    this host, each checked against what S3 records for it
    (:meth:`runbook_lib.storage.s3.S3Store.copy_foreign`), then into the run's store as the
    verified set :func:`input_prefix` with the sha256 of every file. Zero-byte keys ending in
    ``/`` (folder placeholders some tools write) are listed and not copied.

    Returns:
        The URL, the prefix, every object (file, key, bytes, ETag, version, last modified,
        sha256, what its copy was checked against), placeholders skipped, bytes and seconds.

    Raises:
        StorageError: nothing at the URL, a key that cannot be a file of the checkpoint
            (:func:`checkpoint_key_problems`), not enough free disk here for the copy, or an
            object whose bytes differ from S3's records. AuthError: the bucket refused the
            credentials.
    """
    import shutil

    url = ctx.mig.workload.checkpoint
    bucket = checkpoint_bucket(ctx.mig)
    t0 = time.perf_counter()
    keys = bucket.list("")
    if not keys:  # one object: its parent as the store, its name as the key
        parent, _, name = url.rstrip("/").rpartition("/")
        if parent.rstrip("/") in ("s3:", "s3:/") or not name:
            raise StorageError(f"workload.checkpoint {url} holds no object; name a checkpoint file or a prefix of shards")
        bucket = checkpoint_bucket(ctx.mig.model_copy(update={"workload": ctx.mig.workload.model_copy(
            update={"checkpoint": parent})}))
        if bucket.head(name) is None:
            raise StorageError(f"workload.checkpoint {url}: no object at that key and none under it as a prefix; "
                               "check the URL (s3://<bucket>/<key or prefix>)")
        keys = [name]
    sizes = {k: (bucket.head(k) or ObjectInfo(k, 0, None)).size_bytes for k in keys}
    placeholders = [k or "(the prefix itself)" for k in keys if (k == "" or k.endswith("/")) and sizes[k] == 0]
    keys = [k for k in keys if k and not k.endswith("/")]
    refused = checkpoint_key_problems(keys, {k: n for k, n in sizes.items() if k.endswith("/") and n})
    if refused:
        raise StorageError(f"workload.checkpoint {url}: " + "; ".join(refused) + ". Rename or remove those objects in "
                           "the bucket (each key becomes a file path of the checkpoint), or name a narrower prefix")
    total = sum(sizes[k] for k in keys)
    free = shutil.disk_usage(dest if dest.exists() else dest.parent).free
    if total > free:
        raise StorageError(f"workload.checkpoint {url} is {total} bytes; this host has {free} bytes free at {dest}. "
                           "Free disk here (phase 01 inspects the checkpoint before anything is rented)")
    objects, infos = [], []
    for k in sorted(keys, key=checkpoint.natural_key):
        got = bucket.copy_foreign(k, dest / k, progress=sizes[k] >= 64 << 20)
        infos.append(ctx.store.put_file(dest / k, f"{input_prefix(ctx)}/{k}", sha256=got.sha256))
        objects.append(CopiedObject(file=k, key=bucket.url(k), bytes=got.size_bytes, etag=got.etag,
                                    version_id=got.version_id, last_modified=got.last_modified, sha256=got.sha256,
                                    verified_by=", ".join(got.verified_by) or "size only"))
    about = ctx.set_about("checkpoint_input", {"copied_from": url, "objects": len(objects), "bytes": total,
                                               "verified_by": sorted({o.verified_by for o in objects})},
                          checkpoint=url)
    manifest = ctx.store.commit_set(input_prefix(ctx), infos, run_id=ctx.run_id, about=about)
    out = CheckpointInput(url=url, prefix=input_prefix(ctx), manifest_sha256=manifest.sha256, objects=tuple(objects),
                          placeholders=tuple(placeholders), total_bytes=total,
                          seconds=round(time.perf_counter() - t0, 4))
    ctx.evidence.write_json("01/checkpoint_input.json", out)
    return out


NAME_MAX_BYTES = 255
"""Longest file name (one path segment) Linux file systems take, bytes (``NAME_MAX``)."""


def checkpoint_key_problems(keys: list[str], non_empty_dirs: dict[str, int] | None = None) -> list[str]:
    """Why object keys (relative to the checkpoint's prefix) cannot all be files of one
    checkpoint directory, one sentence each; empty when they can. Refused: an absolute key, a
    ``.``, ``..`` or empty segment (it would alias another file or climb out), a segment longer
    than :data:`NAME_MAX_BYTES`, a key that is also the folder of another key, a top-level name
    the store's set layout keeps for itself (``MANIFEST.json``, ``_SUCCESS``), and
    ``non_empty_dirs``: keys ending in ``/`` that hold bytes (``{key: size}``), which no file
    system path can."""
    out = [f"{k!r} ends in '/' but holds {n} bytes" for k, n in (non_empty_dirs or {}).items()]
    for k in keys:
        parts = k.split("/")
        if k.startswith("/") or any(p in ("", ".", "..") for p in parts):
            out.append(f"{k!r} has an empty, '.' or '..' segment")
        elif any(len(p.encode()) > NAME_MAX_BYTES for p in parts):
            out.append(f"{k!r} has a segment longer than {NAME_MAX_BYTES} bytes")
        elif k in (MANIFEST_KEY, MARKER_KEY):
            out.append(f"{k!r} is a name the run's store keeps for a set's manifest or completion marker")
    folders = {"/".join(k.split("/")[:i]) for k in keys for i in range(1, k.count("/") + 1)}
    out += [f"{k!r} is both an object and the folder of other objects" for k in keys if k in folders]
    return out


def largest_payloads(mig: Migration, golden: np.ndarray) -> dict[str, int]:
    """The workload's largest golden request and output as JSON, bytes: ``{"request_bytes",
    "output_bytes"}`` (a request as the job API's ``{"input": ...}`` body, from
    :meth:`runbook_lib.workload.AcceptanceWorkload.golden_requests`; an output as the JSON list
    an endpoint returns for one row of ``golden``, float32 ``(n, dims)``). Phase 02 compares
    them with each endpoint mode's declared payload limits."""
    wl = make_workload(mig.workload, mig.source)
    return {"request_bytes": max((len(json.dumps({"input": r}).encode()) for r in wl.golden_requests()), default=0),
            "output_bytes": max((len(json.dumps(row.tolist()).encode()) for row in golden), default=0)}


def freeze_source(ctx: PhaseContext, pre: Inspection | None = None) -> FreezeSource:
    """Run the source profile's agent in a pod: freeze the artifact, compute golden outputs.

    ``pre``: :func:`preflight_checkpoint`'s result; with a blocker, nothing is launched.
    The pod is destroyed afterwards and verified gone. In dry-run (a remote source left in
    dry-run) the plan is recorded and nothing runs: the result says ``dry_run`` and carries the
    source pod's description and the plan.

    Returns:
        The freeze pod, the source pod's description, its environment, the identities, the
        frozen artifact, the golden outputs and run; or, in dry-run, the source pod's
        description and the plan; or, when :func:`preflight_checkpoint` finds a blocker,
        ``blocked`` with the preflight and no pod launched.

    Raises:
        WorkloadError: the agent failed (log tail in the message). StorageError: a set does
            not verify. ApprovalRequired: the plan has no approval record (HOLD).
    """
    copied = pre.input if pre is not None else None
    if pre is not None and pre.blockers:  # nothing is rented for a checkpoint that cannot load safely
        return FreezeSource(blocked=True, source_pod=describe_source(ctx), preflight=pre, input=copied)
    plan = plan_freeze(ctx)
    if plan.dry_run:
        ctx.resources.apply_plan("source", plan)
        return FreezeSource(dry_run=True, source_pod=describe_source(ctx), plan=plan.to_dict(), input=copied)
    # the freeze pod is disposable: destroyed whatever happens (phase 06 re-checks by label)
    run = ctx.agents.run("source", plan, result_prefix=ctx.store_prefix("source", "result"))
    frozen = ctx.store.verify_set(ctx.store_prefix("source", "frozen"), run_id=ctx.run_id)
    result_objs = ctx.store.verify_set(ctx.store_prefix("source", "result"), run_id=ctx.run_id)
    files = ctx.evidence.fetch(ctx.store, ctx.store_prefix("source", "result"), "01/source_result")
    result = json.loads(files["result.json"].read_text())
    golden = np.load(files["outputs.npy"])
    np.save(ctx.evidence.path(GOLDEN_OUTPUTS), golden)
    for name in ("final_outputs", "inference_outputs"):
        if f"{name}.npy" in files:
            np.save(ctx.evidence.path(f"01/golden_{name}.npy"), np.load(files[f"{name}.npy"]))
    attempt = result["attempts"][0]
    inspection = _with_input_findings(inspect_frozen(ctx, ctx.store_prefix("source", "frozen")), pre)
    return FreezeSource(
        pod=FreezePod(id=run.pod.id, state_after_destroy="DESTROYED" if run.destroyed else "STILL PRESENT",
                      interruptions=run.interruptions),
        source_pod=describe_source(ctx), environment=result["environment"], identity=result["identity"],
        store=ctx.store.settings(),
        frozen=Frozen(prefix=ctx.store_prefix("source", "frozen"), manifest_sha256=result["frozen_manifest_sha256"],
                      objects={k: StoredObject(size_bytes=o.size_bytes, sha256=o.sha256 or "") for k, o in frozen.items()}),
        inspection=with_location(inspection, result["identity"].get("location")), input=copied,
        golden=Golden(prefix=ctx.store_prefix("source", "result"), shape=list(golden.shape), dtype=str(golden.dtype),
                      inference_shape=list(np.load(files["inference_outputs.npy"]).shape)
                      if "inference_outputs.npy" in files else None,
                      outputs_sha256=result_objs["outputs.npy"].sha256),
        payloads=largest_payloads(ctx.mig, golden) if ctx.mig.workload.kind == "inference" else None,
        golden_run=GoldenRun(losses=[m["loss"] for m in attempt["metrics"] if "loss" in m],
                             aa_losses=result.get("aa_losses"), step_times_s=attempt["step_times_s"],
                             load_s=attempt["load_s"], tensors=attempt.get("tensors")))


def preflight_checkpoint(ctx: PhaseContext) -> Inspection | None:
    """Before any pod is rented: inspect a ``kind: checkpoint`` workload's checkpoint where this
    host can read it (:func:`runbook_lib.portability.checkpoint.inspect`, which runs nothing the files name).
    A blocker fails the blocking gate ``checkpoint_safety`` here and phase 01 launches nothing.
    An ``s3://`` checkpoint is first copied in (:func:`copy_in_checkpoint`) and inspected as
    copied; an object S3 keeps no whole-object digest for is a risk finding. None when the
    workload is not a checkpoint or its path is not on this host (a remote source's volume: the
    frozen copy is inspected after the freeze instead, :func:`inspect_frozen`).

    Returns:
        The inspection with ``blockers`` (their count), ``download_s`` and, for an ``s3://``
        checkpoint, ``input`` (:func:`copy_in_checkpoint`).

    Raises:
        StorageError, AuthError: from :func:`copy_in_checkpoint`.
    """
    wl = ctx.mig.workload
    if wl.kind == "checkpoint" and wl.checkpoint.startswith("s3://"):
        with tempfile.TemporaryDirectory(prefix="checkpoint-input-") as tmp:
            copied = copy_in_checkpoint(ctx, Path(tmp))
            out = _preflight(ctx, Path(tmp))
        findings = [Finding("input_size_only", "risk", o.file, f"ETag {o.etag} (multipart) and no whole-object checksum",
                            "S3 keeps no whole-object digest of this object, so its copy was checked by size only",
                            "upload it with a whole-object checksum (aws s3 cp --checksum-algorithm SHA256 in one "
                            "part, or x-amz-meta-sha256); its sha256 is fixed from here on")
                    for o in copied.objects if o.verified_by == "size only"]
        return out.model_copy(update={"findings": (*out.findings, *findings), "input": copied,
                                      "download_s": copied.seconds})
    path = Path(wl.checkpoint.removeprefix("file://")) if wl.kind == "checkpoint" else None
    if path is None or not path.exists():
        return None
    return _preflight(ctx, path)


def _preflight(ctx: PhaseContext, path: Path) -> Inspection:
    ins = checkpoint.inspect(path, allow_globals=ctx.mig.workload.allow_globals)
    if ins.blockers:
        ctx.evidence.add_gates(g.boolean_gate(
            "checkpoint_safety", False, phase="01", source="runbook_lib/portability/checkpoint.py",
            detail="before any pod was rented: " + "; ".join(f"{f.check} in {f.file}: {f.seen}" for f in ins.blockers)))
    return Inspection(root=ins.root, total_bytes=ins.total_bytes, files=ins.files, findings=ins.findings,
                      blockers=len(ins.blockers))


def _with_input_findings(ins: Inspection, pre: Inspection | None) -> Inspection:
    """``ins`` with the preflight's copy-in findings (an ``s3://`` checkpoint's size-only objects)."""
    extra = [f for f in (pre.findings if pre is not None else ()) if f.check == "input_size_only"]
    return ins.model_copy(update={"findings": (*ins.findings, *extra)}) if extra else ins


def inspect_frozen(ctx: PhaseContext, prefix: str) -> Inspection:
    """Inspect the frozen artifact as the target will read it: download the verified set from
    the store (every object re-hashed while it streams) and run
    :func:`runbook_lib.portability.checkpoint.inspect` on it, which runs nothing the files name. Adds the
    blocking gate ``checkpoint_safety``: FAIL on any blocker (an unsafe global, a truncated or
    missing shard, a prefix on some keys only, an unknown format), else PASS naming the risks.

    Returns:
        The inspection, rooted at ``prefix``, with ``download_s`` (seconds to fetch the set from
        the store to this host).
    """
    with tempfile.TemporaryDirectory(prefix="frozen-") as tmp:
        t0 = time.perf_counter()
        ctx.store.fetch_set(prefix, tmp, run_id=ctx.run_id)
        took = time.perf_counter() - t0
        ins = checkpoint.inspect(tmp, allow_globals=ctx.mig.workload.allow_globals)
    out = Inspection(root=prefix, total_bytes=ins.total_bytes, files=ins.files, findings=ins.findings,
                     download_s=round(took, 4))
    blockers = ins.blockers
    risks = [f for f in ins.findings if f.severity == "risk"]
    detail = ("; ".join(f"{f.check} in {f.file}: {f.seen}" for f in blockers) if blockers else
              f"{len(ins.files)} files, {ins.total_bytes} bytes; nothing runs on load"
              + (f"; risks: {', '.join(f'{f.check} ({f.file})' for f in risks)}" if risks else ""))
    ctx.evidence.add_gates(g.boolean_gate("checkpoint_safety", not blockers, phase="01", detail=detail,
                                          source="runbook_lib/portability/checkpoint.py"))
    return out


def secrets_table(ctx: PhaseContext) -> list[SecretRow]:
    """Secret names and references of both sides, whether each resolves here (never values),
    and credential-looking variable names in this environment (a finding, by name only)."""
    rows = []
    for side in ("source", "target"):
        for s in ctx.resources.profile(side).secrets:
            present = secret_refs.resolve(s.name, s.ref, required=False) is not None
            rows.append(SecretRow(side=side, name=s.name, ref=s.ref, required=s.required, resolves_here=present))
    lp = pods.live(ctx.mig)
    if lp is not None and lp.auth_ref:  # the live source's own token, sent as a bearer header, never to a pod
        rows.append(SecretRow(side="source", name="source.auth_ref", ref=lp.auth_ref, required=True,
                              resolves_here=secret_refs.resolve("source.auth_ref", lp.auth_ref, required=False)
                              is not None))
    ambient = [n for n in secret_refs.names_present() if not (lp is not None and lp.auth_ref == f"env:{n}")]
    for name in ambient:
        rows.append(SecretRow(side="environment", name=name, ref="(ambient, not injected into pods)", required=False,
                              resolves_here=True))
    return rows


def credential_findings(ctx: PhaseContext, source_env: Inventory | None) -> list[CredentialFinding]:
    """Credential-looking variables inside the source pod (names only): in the agent's process
    environment and, for a remote source, in the environment the provider reports for the
    running pod. A name the source profile or the storage section does not declare is a finding:
    a key baked into the image or exported into the container, which the target must not inherit."""
    declared = {s.name for s in ctx.mig.source.secrets} | {n for n, _ in credential_env(ctx.mig.storage)}
    rows = [CredentialFinding(variable=n, where="source pod process", declared=n in declared,
                              finding="" if n in declared else "undeclared credential in the source environment")
            for n in (source_env.credential_env_names if source_env is not None else ())]
    described = describe_source(ctx) or SourcePod()
    for n in secret_refs.names_present(dict.fromkeys(described.env_names, "")):
        rows.append(CredentialFinding(
            variable=n, where=f"{described.provider} pod {described.id} environment", declared=n in declared,
            finding="" if n in declared else "credential exported into the source container by the provider"))
    return rows


def requirements(ctx: PhaseContext) -> DeclaredRequirements:
    """Declared host needs and SLOs of the workload (from params)."""
    req = ctx.mig.workload.requirements
    return DeclaredRequirements(
        ports=tuple(PortRow(port=p.port, protocol=p.protocol) for p in req.ports),
        shm_gb=req.shm_gb, disk_gb=req.disk_gb, memory_gb=req.memory_gb, gpu_memory_gb=req.gpu_memory_gb,
        max_request_s=req.max_request_s, docker_compose=req.docker_compose, privileged=req.privileged,
        persistent_volume=req.persistent_volume, device=ctx.mig.source.device, dtype=ctx.mig.source.dtype)


def inventory_rows(host: Inventory, source_env: Inventory) -> list[dict[str, object]]:
    """A display table: host vs the source pod's environment (GiB are 2**30 bytes)."""
    def flat(d: Inventory) -> dict[str, object]:
        return {
            "python": d.python, "torch": d.torch, "torch threads": d.torch_threads, "device": d.device,
            "CUDA available": d.cuda.available, "CUDA runtime": d.cuda.runtime, "driver": d.cuda.driver_version,
            "GPUs": ", ".join(f"{g.name} (cc {g.compute_capability}, {g.memory_bytes / 2**30:.1f} GiB)"
                              for g in d.cuda.devices) or "none",
            "GPU interconnect": (f"{d.topology.interconnect} ({d.topology.weakest_link}), NCCL "
                                 f"{d.topology.nccl_version or '?'}" if d.topology.gpus > 1 else d.topology.probe or "-"),
            "CPU": f"{d.cpu.model} x{d.cpu.logical}", "RAM GiB": round(d.memory_bytes / 2**30, 1),
            "/dev/shm GiB": round(d.shm_bytes / 2**30, 2), "disk free GiB": round(d.disk_free_bytes / 2**30, 1),
            "OS": d.os,
        }
    h, s = flat(host), flat(source_env)
    return [{"item": k, "this host": h[k], "source pod": s[k]} for k in h]


def plan(ctx: PhaseContext) -> PlanShown:
    """The freeze pod's launch plan (a service: the source service pod's), for display before its
    approval cell."""
    if ctx.mig.workload.kind == "service" and pods.live(ctx.mig) is not None:
        return PlanShown((), (), note="The source is a live service (source.provider live): phase 01 launches nothing; "
                                      "it asks the running service every sample input twice, paced at "
                                      "source.max_rate_per_s.")
    if ctx.mig.workload.kind == "service":
        return PlanShown((service.plan_freeze(ctx),), ("source",),
                         note="Phase 01 launches the source image as it runs today, asks it every sample input twice "
                              "and destroys it.")
    return PlanShown((plan_freeze(ctx),), ("source",))


@dataclass(frozen=True)
class FreezeResult(PhaseResult):
    """Phase 01's evidence.

    Attributes:
        host: :func:`host_inventory`. source: :func:`freeze_source` (or its dry-run form).
        requirements: :func:`requirements`. secrets: :func:`secrets_table`.
        credential_findings: :func:`credential_findings`. dry_run: the freeze pod was only planned.
        schedules: ``source.schedules`` as read (:func:`runbook_lib.phases.schedules.freeze`).
    """

    host: Inventory
    source: FreezeSource
    requirements: DeclaredRequirements
    secrets: tuple[SecretRow, ...]
    credential_findings: tuple[CredentialFinding, ...]
    dry_run: bool
    schedules: tuple[ScheduleRow, ...] = ()

    def record(self) -> FreezeData:
        return FreezeData(host=self.host, freeze=self.source, requirements=self.requirements, secrets=self.secrets,
                          credential_findings=self.credential_findings, dry_run=self.dry_run,
                          schedules=self.schedules)

    def parts(self) -> list[Any]:
        src = self.source
        out: list[Any] = []
        if src.blocked:
            out += [md("**Blocked before any pod was rented**: the checkpoint cannot be loaded safely or completely; "
                       "nothing was launched. Fix each blocker below on the source and run again."),
                    *input_parts(src.input), *inspection_parts(src.preflight)]
        elif src.service is not None:
            host = [{"item": r["item"], "this host (the runbook's, not the service's)": r["this host"]}
                    for r in inventory_rows(self.host, self.host)]
            out += [table(host), *service.service_freeze_parts(src.service)]
        elif self.dry_run:
            pod = src.source_pod.model_dump() if src.source_pod else {}
            out += [md("**Dry-run**: the freeze pod is planned above and recorded; nothing was launched."),
                    table({"source pod (provider report)": pod}, dtype=object)]
        else:
            frozen, golden = self.source.require_frozen()
            out += [table(inventory_rows(self.host, src.environment or Inventory())),
                    md("**Immutable identities**"), table({"value": src.identity or {}}),
                    *input_parts(src.input),
                    md(f"**Frozen artifact** `{frozen.prefix}` manifest sha256 `{frozen.manifest_sha256}`"),
                    table({k: o.model_dump() for k, o in frozen.objects.items()}).T,
                    *inspection_parts(src.inspection),
                    md(f"**Golden outputs** shape {golden.shape} {golden.dtype}, sha256 `{golden.outputs_sha256}`"
                       + (f"; the entry point's answers to fixed inputs, shape {golden.inference_shape}"
                          if golden.inference_shape else ""))]
        return out + [md("**Declared requirements**"), table({"declared": self.requirements.model_dump()}, dtype=object),
                      md("**Secrets** (names and references, never values)"), table(self.secrets),
                      md("**Credential findings**"),
                      table(self.credential_findings, columns=["variable", "where", "declared", "finding"]),
                      *([md("**Schedules** (what starts the workload, and which side it starts)"),
                         table(self.schedules)] if self.schedules else [])]


LOCATION_FINDINGS = {
    "container disk": ("ephemeral_disk", "risk", "the pod's container disk is wiped when the pod stops or is "
                       "replaced, so a checkpoint kept there is lost with it",
                       "keep checkpoints on the volume (Runpod: /workspace) or in the store"),
    "outside the pod's disks": ("host_path", "info", "a host path or network mount outside the pod's container disk "
                                "and volume: it outlives the pod", "none needed; the target reads the frozen copy"),
    "not checked": ("location_not_checked", "info", "the source pod names no volume directory, so whether the "
                    "checkpoint sits on ephemeral disk is not known", "check where it is mounted on the source"),
}
"""Finding per :func:`runbook_lib.workload.checkpoint_set.location` (``volume``: none)."""


def with_location(ins: Inspection, loc: dict[str, str] | None) -> Inspection:
    """``ins`` with a finding for where the source kept the checkpoint (``kind: checkpoint``;
    ``loc``: ``{"where", "path"}``, :func:`runbook_lib.workload.checkpoint_set.location`), from
    the freeze pod's own view of its disks; unchanged for other workloads or a volume."""
    if not loc or loc.get("where") not in LOCATION_FINDINGS:
        return ins
    check, severity, reason, fix = LOCATION_FINDINGS[loc["where"]]
    seen = f"{loc['path']} is on the {loc['where']}" if loc["where"] != "not checked" else f"{loc['path']}"
    return ins.model_copy(update={"location": loc,
                                  "findings": (*ins.findings, Finding(check, severity, "", seen, reason, fix))})


def input_parts(copied: CheckpointInput | None) -> list[Any]:
    """Where an ``s3://`` checkpoint came from: every object with its ETag, version, sha256 and
    what S3 record its copy matched (:func:`copy_in_checkpoint`)."""
    if not copied:
        return []
    rows = [{"file": o.file, "bytes": o.bytes, "etag": o.etag, "version": o.version_id or "(unversioned)",
             "last modified": o.last_modified, "sha256": o.sha256[:16], "checked against": o.verified_by}
            for o in copied.objects]
    skipped = (f"; {len(copied.placeholders)} folder placeholder(s) not copied: "
               + ", ".join(copied.placeholders)) if copied.placeholders else ""
    return [md(f"**Checkpoint copied in** from `{copied.url}` to `{copied.prefix}` before anything was rented "
               f"({copied.total_bytes} bytes in {copied.seconds} s{skipped})"), table(rows)]


def inspection_parts(ins: Inspection | None) -> list[Any]:
    """The inspection table of the frozen artifact and its findings, each with why it matters
    and the fix (:func:`inspect_frozen`)."""
    if not ins:
        return []
    files = [{"file": f.file, "format": f.format, "bytes": f.bytes, "sha256": f.sha256[:16],
              "tensors": len(f.tensors), "saved on": ", ".join(f.devices), "globals": ", ".join(f.globals),
              "unsafe globals": ", ".join(f.unsafe_globals) or "none",
              "tied": "; ".join(" = ".join(t) for t in f.tied)} for f in ins.files]
    return [md(f"**Checkpoint inspection** (nothing in it was run; {ins.total_bytes} bytes fetched from the store "
               f"in {ins.download_s} s)"), table(files),
            md("**Checkpoint findings**" + ("" if ins.findings else ": none")),
            *([table([asdict(f) for f in ins.findings], columns=["severity", "check", "file", "seen", "reason", "fix"])]
              if ins.findings else [])]


def run(ctx: PhaseContext) -> FreezeResult:
    """Phase 01: probe this host, freeze the source (pod, artifact, golden outputs), declare the
    requirements, the secrets and what looks like an undeclared credential.

    The host probe (which imports torch, about 2 s on 2 cores) runs in a thread while the freeze
    pod works; both are done, or have raised, before this returns."""
    from concurrent.futures import ThreadPoolExecutor

    if ctx.mig.workload.kind == "service":  # judged from outside: nothing of the runbook runs in the source
        src = service.freeze_service(ctx).model_copy(update={"source_pod": describe_source(ctx)})
        host = host_inventory(ctx)
        return FreezeResult(host=host, source=src, requirements=requirements(ctx), secrets=tuple(secrets_table(ctx)),
                            credential_findings=tuple(credential_findings(ctx, None)), dry_run=src.dry_run,
                            schedules=schedules.freeze(ctx))
    # The checkpoint preflight runs first, alone: it imports torch, and torch's first import must
    # not race the probe thread's (a concurrent first import can abort the interpreter).
    pre = preflight_checkpoint(ctx)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="host-probe") as pool:
        probing = pool.submit(host_inventory, ctx)
        src = freeze_source(ctx, pre)
        host = probing.result()
    return FreezeResult(host=host, source=src, requirements=requirements(ctx), secrets=tuple(secrets_table(ctx)),
                        credential_findings=tuple(credential_findings(ctx, src.environment)), dry_run=src.dry_run,
                        schedules=schedules.freeze(ctx))
