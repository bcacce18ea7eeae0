"""Phase 05, cut over reversibly: move a bounded slice at a time, check gates per step, keep the
way back.

Inference: a route (``route.json`` in the run directory: live state of the local provider's
router; each phase that changes it snapshots its history as evidence) sends
each request to the target with the step's probability; after each step the target's
responses must all pass parity, none may fail, and its p95 must stay within the phase 04 bound.
A failed step sets the route back to 0 % target at once (rollback) and stops.

Training: the job moves by slices. Each slice is a target pod that resumes from the newest
verified checkpoint set and writes a new one (objects, manifest, marker); its losses must stay in
the band of the source's own continuation. The rollback point is the frozen source checkpoint.
After the last slice the source profile reloads the target's checkpoint (reversibility).
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from runbook_lib import gates as g
from runbook_lib._time import utc_now
from runbook_lib.errors import EvidenceError, ProviderError
from runbook_lib.evidence.records import (
    CheckpointStep,
    Cutover,
    CutoverData,
    Drain,
    InferenceStep,
    RollbackPoint,
    RoutedCutover,
    RoutedWindow,
    SliceStep,
    TrainingStep,
)
from runbook_lib.layout import GOLDEN_OUTPUTS, ROLLBACK_POINT, ROUTE
from runbook_lib.measure.timing import Request, ServingClient, frozen_heap, poisson_schedule, run_open_loop
from runbook_lib.phases import PhaseContext, PhaseResult, PlanShown, md, schedules, table
from runbook_lib.phases.routed import routed_cutover
from runbook_lib.phases.serving import Served, failures_named, serving_for, source_gap_s
from runbook_lib.providers.base import Plan
from runbook_lib.service.pacing import spaced
from runbook_lib.traffic.route import Route
from runbook_lib.traffic.router import ClientRouter
from runbook_lib.workload import make_workload

MIN_STEP_LATENCY_SAMPLES = 5  # target responses in a step before its p95 is judged


def actor(ctx: PhaseContext) -> str:
    """Who moves traffic in phase 05: the runbook, headless or stepped through by a person, under
    the approvals recorded for this run."""
    return f"runbook phase 05 ({ctx.run_mode} run {ctx.run_id})"


def rollback_point(ctx: PhaseContext) -> RollbackPoint:
    """What restoring the source needs: the source endpoint or checkpoint, and when the window closes."""
    rec01 = ctx.records.need_freeze()
    if ctx.mig.workload.kind == "service":  # the service's state is its image: nothing was frozen in the store
        svc = rec01.freeze.service
        manifest_sha, prefix = (svc.golden_sha256 if svc else ""), "image " + (ctx.mig.workload.service.image
                                                                            if ctx.mig.workload.service else "")
    else:
        frozen = rec01.frozen()
        manifest_sha, prefix = frozen.manifest_sha256, frozen.prefix
    point = RollbackPoint(
        recorded_at=utc_now(), route="100 % source", source_release=ctx.mig.source.release,
        frozen_manifest_sha256=manifest_sha, frozen_prefix=prefix,
        window_s=ctx.mig.cutover.rollback_window_s, window_closes_epoch=time.time() + ctx.mig.cutover.rollback_window_s,
        source_provider=ctx.mig.source.provider,
        rollback_owner=ctx.mig.cutover.rollback_owner or "not named (set cutover.rollback_owner)",
        source_endpoint=ctx.records.need_compare().endpoints.get("source")
        if ctx.mig.workload.serves else None)
    ctx.evidence.write_json(ROLLBACK_POINT, point.model_dump(exclude_none=True))
    return point


@dataclass(frozen=True)
class Slice:
    """One cutover slice step as planned before phase 05 moves anything.

    Attributes:
        step: 1-based step number. target_percent: the share of traffic (inference) or of the
            training steps (training) on the target once the step is done, percent.
        plan: its approval plan: a route change (action ``route``, nothing rented) for an
            inference workload; for a training workload the slice pod's launch plan.
        first_step, until_step: training steps ``first_step..until_step-1`` run in the slice (0, 0
            for inference). prefix: the slice's store prefix (training). resume_from: the
            checkpoint prefix the slice resumes from, the previous slice's when it passes.
    """

    step: int
    target_percent: int
    plan: Plan
    first_step: int = 0
    until_step: int = 0
    prefix: str = ""
    resume_from: str = ""


def slices(ctx: PhaseContext) -> list[Slice]:
    """Every slice step phase 05 may apply, in order, each with the plan that approves it. A
    step after a failed one is never applied (the route goes back to the source and the phase
    stops). A training step that adds no training step (the percent rounds to the previous
    step's) is left out. Rolling back (route to 0 % target) needs no approval: it only restores
    the source."""
    prov = ctx.mig.target.provider
    out: list[Slice] = []
    if ctx.mig.workload.serves:
        for k, pct in enumerate(ctx.mig.cutover.steps_percent):
            plan = Plan(provider=prov, action="route", spec=None, cost_usd_per_hour=0.0, dry_run=False,
                        target=f"{ctx.mig.migration}: {pct} % of requests to the target ({ctx.mig.cutover_mode}, "
                               f"step {k + 1})")
            out.append(Slice(k + 1, pct, plan))
        return out
    if ctx.mig.workload.kind == "checkpoint":  # one step: the target's verified copy becomes authoritative
        frozen, pfx = ctx.records.need_freeze().frozen().prefix, ctx.store_prefix("cutover", "0")
        plan = ctx.agents.plan("target", "promote", "slice", prefix=pfx, frozen_prefix=frozen,
                                        extra=("--steps", "1"))
        return [Slice(1, 100, plan, 0, 1, pfx, frozen)]
    total = ctx.mig.workload.train_steps
    resume, done = ctx.records.need_freeze().frozen().prefix, 0
    for k, pct in enumerate(ctx.mig.cutover.steps_percent):
        until = math.ceil(total * pct / 100)
        if until - done <= 0:
            continue
        pfx = ctx.store_prefix("cutover", str(k))
        plan = ctx.agents.plan("target", f"slice-{k}", "slice", prefix=pfx, frozen_prefix=resume,
                                        extra=("--steps", str(until - done)))
        out.append(Slice(k + 1, pct, plan, done, until, pfx, resume))
        resume, done = f"{pfx}/checkpoint", until
    return out


def plan(ctx: PhaseContext) -> PlanShown:
    """Phase 05's slice steps (:func:`slices`), for display before its approval cell."""
    what = {"inference": "route changes through the run's router on phase 04's endpoints (nothing rented)",
            "service": "route changes through the run's router on phase 04's service pods (nothing rented)",
            "training": "one target pod per training slice"}.get(
        ctx.mig.workload.kind, "one target pod that restores the frozen checkpoint and writes the target's verified "
                               "copy, which then becomes authoritative")
    steps = slices(ctx)
    moving = schedules.plan(ctx)
    extra = (moving,) if moving is not None else ()
    return PlanShown(tuple(s.plan for s in steps) + extra, tuple("target" for _ in (*steps, *extra)),
                     tuple("if every earlier step passed" if i else "always" for i in range(len(steps)))
                     + tuple("if every step passed" for _ in extra),
                     note=f"Phase 05 applies {what}; a failed step sets the route back to the source at once."
                          + (" Then it points the source's schedules at the target and reads them back; one that "
                             "does not move puts them all back on the source." if extra else ""))


def drained(clients: Mapping[str, ServingClient], timeout_s: float, *,
            sleep: Callable[[float], None] = time.sleep) -> Drain:
    """Wait until every endpoint reports no job queued or in progress (``/health``), at most
    ``timeout_s`` seconds; returns what each reported last, the endpoints that could not be
    reached (their requests then fail the step's gate), and the seconds waited."""
    t0 = time.monotonic()
    while True:
        busy: dict[str, int] = {}
        unreachable: dict[str, str] = {}
        for side, c in clients.items():
            try:
                jobs = c.health()["jobs"]
                busy[side] = int(jobs.get("inQueue", 0) + jobs.get("inProgress", 0))
            except ProviderError as exc:
                unreachable[side] = str(exc)
        if not any(busy.values()) or time.monotonic() - t0 > timeout_s:
            return Drain(in_flight=busy, unreachable=unreachable, waited_s=round(time.monotonic() - t0, 3))
        sleep(0.05)


@dataclass(frozen=True)
class Moved:
    """What one workload kind's cutover did: the steps it ran, the route it left, the checkpoint
    the work continues from, and the reverse-reload gate (the source loads the target's state)."""

    steps: list[SliceStep]
    route: Route
    checkpoint_moved: str | None = None
    reverse_reload: g.GateResult | None = None
    router: RoutedCutover | None = None


def cutover_inference(ctx: PhaseContext) -> Moved:
    """Route growing slices of requests to the target with a gate check per step, in the
    params' cutover mode (:attr:`runbook_lib.params.Migration.cutover_mode`): ``drain`` sends each
    request to the side the route picks and moves the route only once both endpoints are idle;
    ``dual_run`` sends every request to both sides (the route picks whose answer is served, the
    other is a shadow) and judges the target on all of its answers.

    Each step's p95 is judged, so this process keeps its own garbage collection out of the
    windows as phase 04's load generator does (:func:`runbook_lib.measure.timing.frozen_heap`):
    a full collection of a kernel that imported torch and pandas takes a core for 0.1-0.2 s,
    while the servers being judged share the host (a routed step at 100 % read 3.06 times the
    steady window's p95 in a CI run on 2 cores, 2026-12-07)."""
    with frozen_heap():
        return _slices_inference(ctx)


def _slices_inference(ctx: PhaseContext) -> Moved:
    rec04 = ctx.records.need_compare()
    urls = rec04.endpoint_urls
    src_p95 = rec04.summary["source"].p95_s
    if src_p95 is None:
        raise EvidenceError("phase 04's record has no source p95 latency to bound the cutover's slices by; "
                            "re-run phase 04")
    bound = src_p95 * ctx.mig.gates.latency_p95_ratio_max
    if ctx.mig.cutover.router.kind != "client":  # a real router carries a replay the whole phase
        routed = routed_cutover(ctx, slices(ctx), route=Route(ctx.run_dir / ROUTE, actor=actor(ctx)), bound_s=bound)
        return Moved(list(routed.steps), routed.route, router=routed.evidence)
    serving, modes = serving_for(ctx), rec04.endpoint_modes
    clients = {s: serving.client(s, Served(rec04.endpoints[s], u, modes.get(s, "queue")),
                                 timeout_s=ctx.mig.measure.request_timeout_s * 4) for s, u in urls.items()}
    route = Route(ctx.run_dir / ROUTE, actor=actor(ctx))
    route.set(0, "cutover start: all traffic on source")
    steps: list[SliceStep] = []
    rows = []
    router = ClientRouter(seed=ctx.mig.workload.seed)  # the split; its counters are what it picked
    n = ctx.mig.cutover.requests_per_step
    dual = ctx.mig.cutover_mode == "dual_run"
    for k, sl in enumerate(slices(ctx)):
        pct = sl.target_percent
        drain = None if dual else drained(clients, ctx.mig.measure.request_timeout_s)
        ctx.resources.approve_change("target", sl.plan)
        route.set(pct, f"slice step {k + 1}" + (" (dual run: both sides serve, the target's answer served for this "
                                                  "share)" if dual else " (drained: nothing in flight)"))
        picks = serving.request_inputs(n, seed=5000 + k)
        sched = spaced(poisson_schedule(n, ctx.mig.measure.arrival_rate_per_s, seed=6000 + k), source_gap_s(ctx))
        router.set_weights(100 - pct, pct)
        to_target = router.pick(n)
        step_rows = []
        if dual:  # every request to both sides at once; the route picks the served answer
            reqs = [Request(i, float(sched[i]), picks[i][1], picks[i][0]) for i in range(n)]
            with ThreadPoolExecutor(max_workers=2) as pool:
                done = {side: pool.submit(run_open_loop, clients[side], reqs, side=side, round_id=k)
                        for side in ("source", "target")}
            for side, fut in done.items():
                for r in fut.result():
                    r["served"] = bool(to_target[r["request"]]) == (side == "target")
                    step_rows.append(r)
        else:
            for side in ("source", "target"):
                idx = [i for i in range(n) if to_target[i] == (side == "target")]
                reqs = [Request(j, float(sched[i] - (sched[idx[0]] if idx else 0)), picks[i][1], picks[i][0])
                        for j, i in enumerate(idx)]
                if reqs:
                    step_rows += [{**r, "served": True} for r in run_open_loop(clients[side], reqs, side=side,
                                                                                round_id=k)]
        for r in step_rows:
            r["accepted"] = serving.accepted(r)
            r.pop("output", None)
            r.pop("itl_s", None)
            r["step"] = k
            r["target_percent"] = pct
        rows += step_rows
        steps.append(judge_step([r for r in step_rows if r["side"] == "target"], step=k + 1, pct=pct,
                                mode=ctx.mig.cutover_mode, requests=n, drain=drain, bound=bound))
        if not steps[-1].passed:
            router.set_weights(100, 0)
            route.set(0, f"rollback: step {k + 1} failed its gate check")
            break
    for c in clients.values():
        c.close()
    pd.DataFrame(rows).to_csv(ctx.evidence.path("05/cutover_samples.csv"), index=False)
    return Moved(steps, route)


def judge_step(tgt: list[dict[str, Any]], *, step: int, pct: int, mode: str, requests: int, drain: Drain | None,
               bound: float) -> InferenceStep:
    """One inference slice step from the target's rows (``status``, ``accepted``, ``total_s``,
    ``served``, ``stage``, ``error``): it passes with no failed request, no answer rejected, and
    (from :data:`MIN_STEP_LATENCY_SAMPLES` completed requests) a p95 within ``bound`` seconds; a
    failed request is never a latency sample, and the failures are named as phase 04 names them."""
    failed = np.array([r["status"] != "COMPLETED" for r in tgt], dtype=bool)
    rejected = sum(1 for r in tgt if r["status"] == "COMPLETED" and not r["accepted"])
    completed = [float(r["total_s"]) for r in tgt if r["status"] == "COMPLETED"]
    p95 = float(np.percentile(completed, 95)) if completed else math.nan
    lat_ok = len(completed) < MIN_STEP_LATENCY_SAMPLES or p95 <= bound
    return InferenceStep(step=step, target_percent=pct, mode=mode, requests=requests, to_target=len(tgt),
                         served_by_target=sum(1 for r in tgt if r["served"]),
                         shadow_to_target=sum(1 for r in tgt if not r["served"]), drained_before=drain,
                         target_failures=int(failed.sum()), target_not_accepted=rejected,
                         target_failed_as=failures_named(pd.DataFrame(tgt), failed) if failed.any() else "",
                         target_p95_s=p95, p95_bound_s=bound, passed=not failed.any() and rejected == 0 and lat_ok)


def cutover_training(ctx: PhaseContext) -> Moved:
    """Move the training job slice by slice from the newest verified checkpoint."""
    import torch  # noqa: F401 - imported here: the reverse-reload check runs in this kernel

    rec01 = ctx.records.need_freeze()
    golden_run = rec01.golden_run()
    golden_losses = golden_run.losses
    route = Route(ctx.run_dir / ROUTE, actor=actor(ctx))
    route.set(0, "cutover start: job runs on source")
    ckpt_prefix, done_steps, moved = rec01.frozen().prefix, 0, False
    steps: list[SliceStep] = []
    for sl in slices(ctx):
        k, pct, until, pfx = sl.step - 1, sl.target_percent, sl.until_step, sl.prefix
        route.set(pct, f"slice {k + 1} (quiesced: the source stopped at verified checkpoint {ckpt_prefix}): target "
                       f"runs steps {done_steps}..{until - 1}")
        ctx.agents.run("target", sl.plan, result_prefix=f"{pfx}/result")
        res = json.loads(ctx.evidence.fetch(ctx.store, f"{pfx}/result", f"05/slice/{k}")["result.json"].read_text())
        checkpoint = ctx.store.verify_set(f"{pfx}/checkpoint", run_id=ctx.run_id)
        losses = [m["loss"] for m in res["attempts"][0]["metrics"]]
        aa = golden_run.aa_losses
        band = g.loss_band(golden_losses[done_steps:until], losses, rel=ctx.mig.gates.loss_band_rel,
                           last_k=len(losses), replicate=aa[done_steps:until] if aa else None, phase="05")
        ok = band.verdict == "PASS" and all(c["match"] for c in res["artifact_checksums"])
        steps.append(TrainingStep(step=k + 1, target_percent=pct, steps=f"{done_steps}..{until - 1}",
                                  checkpoint_prefix=f"{pfx}/checkpoint",
                                  checkpoint_manifest_sha256=res.get("checkpoint_manifest_sha256"),
                                  checkpoint_sha256={key: o.sha256 for key, o in checkpoint.items()},
                                  loss_rel_diff=band.observed, passed=ok))
        if not ok:
            route.set(0, f"rollback: slice {k + 1} failed ({band.detail}); resume on source from the rollback point")
            break
        ckpt_prefix, done_steps, moved = f"{pfx}/checkpoint", until, True
    reverse = None
    if moved:  # reversibility: the source profile reloads the target's newest checkpoint
        with tempfile.TemporaryDirectory() as tmp:
            last_dir = Path(tmp)
            ctx.store.fetch_set(ckpt_prefix, last_dir, run_id=ctx.run_id)
            wl_t = make_workload(ctx.mig.workload, ctx.mig.target)
            wl_t.load(last_dir)
            wl_s = make_workload(ctx.mig.workload, ctx.mig.source)
            wl_s.load(last_dir)
            reverse = g.output_parity(wl_t.outputs(), wl_s.outputs(), dtype=ctx.mig.source.dtype, phase="05")
    return Moved(steps, route, ckpt_prefix, reverse)


def cutover_checkpoint(ctx: PhaseContext) -> Moved:
    """Make the target's copy of the checkpoint authoritative, keeping the source's frozen copy
    as the rollback point: a target pod restores the frozen set (every file verified and loaded)
    and writes it back as the target's versioned prefix ``cutover/0/checkpoint`` (objects,
    manifest, completion marker). The switch happens only when every file of that copy has the
    frozen sha256 and the pod's restore verified; the pointer ``05/authoritative.json`` and the
    route (0 % -> 100 % target) record it. Reversibility: the source profile loads the target's
    copy and must reproduce the golden tensor digest."""
    frozen = ctx.records.need_freeze().frozen()
    route = Route(ctx.run_dir / ROUTE, actor=actor(ctx))
    route.set(0, f"cutover start: the source's frozen checkpoint {frozen.prefix} is authoritative")
    [sl] = slices(ctx)
    ctx.agents.run("target", sl.plan, result_prefix=f"{sl.prefix}/result")
    files = ctx.evidence.fetch(ctx.store, f"{sl.prefix}/result", "05/slice/0")
    res = json.loads(files["result.json"].read_text())
    copy_prefix = f"{sl.prefix}/checkpoint"
    copy = ctx.store.verify_set(copy_prefix, run_id=ctx.run_id)
    want = {k: o.sha256 for k, o in frozen.objects.items()}
    got = {k: o.sha256 for k, o in copy.items()}
    restored = [m for a in res.get("attempts", []) for m in a.get("metrics", [])]
    ok = got == want and bool(restored) and all(m.get("verified") for m in restored) \
        and all(c["match"] for c in res["artifact_checksums"])
    step = CheckpointStep(step=1, target_percent=100, authoritative_prefix=copy_prefix, files=len(got),
                          bytes_identical_to_frozen=got == want, restores_verified=len(restored),
                          checkpoint_manifest_sha256=res.get("checkpoint_manifest_sha256"), passed=ok)
    if ok:
        route.set(100, f"authoritative checkpoint: the target's verified copy {copy_prefix} (version 1); the source's "
                       f"frozen copy {frozen.prefix} is the rollback point")
    else:
        differ = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        route.set(0, f"rollback: the target's copy does not match the frozen checkpoint ({differ or 'restore failed'}); "
                     "the source's frozen copy stays authoritative")
    ctx.evidence.write_json("05/authoritative.json", {
        "authoritative_prefix": copy_prefix if ok else frozen.prefix, "version": 1 if ok else 0,
        "rollback_prefix": frozen.prefix, "frozen_manifest_sha256": frozen.manifest_sha256,
        "files_sha256": got, "switched": ok})
    reverse = None
    if ok:  # reversibility: the source profile loads the target's copy
        golden = np.load(ctx.run_dir / GOLDEN_OUTPUTS)
        with tempfile.TemporaryDirectory() as tmp:
            ctx.store.fetch_set(copy_prefix, tmp, run_id=ctx.run_id)
            wl_s = make_workload(ctx.mig.workload, ctx.mig.source)
            wl_s.load(Path(tmp))
            reverse = g.output_parity(golden, wl_s.outputs(), dtype=ctx.mig.source.dtype, phase="05")
    return Moved([step], route, copy_prefix if ok else frozen.prefix, reverse)


def cutover(ctx: PhaseContext) -> Cutover:
    """Check that every slice step is approved (:func:`slices`), and the schedule change if the
    source declares schedules; record the rollback point, run the slices for this workload kind,
    then, when every step passed, point the schedules at the target
    (:func:`runbook_lib.phases.schedules.move`); add gates.

    Raises:
        ApprovalRequired: a slice step or the schedule change has no approval (checked before
            anything moves).
    """
    moving = schedules.plan(ctx)
    ctx.resources.require_all([("target", sl.plan) for sl in slices(ctx)]
                              + ([("target", moving)] if moving is not None else []))
    point = rollback_point(ctx)
    moved = {"inference": cutover_inference, "service": cutover_inference,
             "training": cutover_training}.get(ctx.mig.workload.kind, cutover_checkpoint)(ctx)
    windows = moved.router.windows if moved.router is not None else ()
    all_ok = slices_verdict(moved.steps, windows)
    done = bool(all_ok) and moved.route.target_percent == 100
    if moving is not None and done:
        ctx.resources.approve_change("target", moving)
    res = Cutover(mode=ctx.mig.cutover_mode, rollback_point=point, steps=tuple(moved.steps),
                  checkpoint_moved=moved.checkpoint_moved, final_target_percent=moved.route.target_percent,
                  route=moved.route.state, router=moved.router, routing=routing(ctx),
                  schedules=schedules.move(ctx, done))
    ctx.evidence.write_json("05/route_history.json", res.route)
    steady = windows[0] if windows else None
    failing = [w for w in windows if not w.passed]
    why = (f"; the steady window before the first step failed, so no weight moved: {'; '.join(steady.problems)}"
           if steady is not None and not steady.passed else "")
    failed_as = next((s.target_failed_as for s in res.steps if isinstance(s, InferenceStep) and s.target_failed_as), "")
    why += f"; the target's failed requests: {failed_as}" if failed_as else ""
    why += (f"; not judged: {failing[0].window}: {failing[0].replay_behind}" if all_ok is None
            else first_failure(res.steps, windows))
    ctx.evidence.add_gates(g.boolean_gate(
        "cutover_slices", all_ok, phase="05",
        detail=f"{sum(s.passed for s in res.steps)} of {len(slices(ctx))} slice steps passed; "
               f"route now {res.final_target_percent} % target{why}"))
    if moved.router is not None:
        ctx.evidence.add_gates(*_router_gates(moved.router))
    rev = moved.reverse_reload
    if rev is not None:
        ctx.evidence.add_gates(g.from_dict({**rev.to_dict(), "name": "reverse_reload",
                                   "detail": "source reloads the target's checkpoint: " + rev.detail}))
    ctx.evidence.write_json("05/cutover.json", res)
    return res


def first_failure(steps: Sequence[SliceStep], windows: Sequence[RoutedWindow]) -> str:
    """What made the first failing slice step fail, as ``cutover_slices``' detail ends: a routed
    window's problems (:func:`runbook_lib.phases.routed.judge_window`), or a client-split inference
    step's p95 against its bound; empty when no step failed or its failed requests are named
    already (``target_failed_as``)."""
    window = next((w for w in windows[1:] if not w.passed), None)
    if window is not None:
        return f"; {window.window} failed: {'; '.join(window.problems)}"
    step = next((s for s in steps if not s.passed), None)
    if (isinstance(step, InferenceStep) and not step.target_failed_as and step.target_p95_s is not None
            and step.p95_bound_s is not None and not step.target_p95_s <= step.p95_bound_s):
        return (f"; step {step.step} failed: the target's p95 {step.target_p95_s:.3f} s is above the bound "
                f"{step.p95_bound_s:.3f} s")
    return ""


def slices_verdict(steps: Sequence[SliceStep], windows: Sequence[RoutedWindow]) -> bool | None:
    """``cutover_slices``: True when there were steps and every one passed; None (INCONCLUSIVE,
    HOLD) when every routed window that failed did so only because the replay fell behind its
    schedule (:func:`runbook_lib.phases.routed.behind`): the load generator, not the target, so
    nothing shows either way; else False."""
    failing = [w for w in windows if not w.passed]
    if failing and all(w.replay_behind and w.problems == (w.replay_behind,) for w in failing):
        return None
    return bool(steps) and all(s.passed for s in steps)


def routing(ctx: PhaseContext) -> str:
    """What moves the traffic in this cutover, for its record: the client split of the runbook's
    own test requests, a real router, or none (training and checkpoint cutovers move pods, not
    requests: ``cutover.router`` does not apply to them)."""
    rp = ctx.mig.cutover.router
    if ctx.mig.workload.kind not in ("inference", "service"):
        return (f"no router: a {ctx.mig.workload.kind} cutover moves pods, not requests (cutover.router does not "
                "apply)")
    if rp.kind == "client":
        return "client split: the runbook's own test requests, each sent to the side the weights pick"
    return f"{rp.kind} router at {rp.url or 'a loopback front the runbook started'}: real traffic through it"


def _router_gates(router: RoutedCutover) -> list[g.GateResult]:
    """``routed_requests_lost``: every request the replay sent through the router was answered
    (blocking; the first lost one is named with its time and window); and after a failing step,
    ``routed_rollback``: the rollback under load lost nothing, left the weights all-source and
    the source serving everything within ``cutover.router.rollback_within_s`` (blocking)."""
    lost = [(w.window, w.lost) for w in router.windows if w.lost]
    at = router.first_lost_at_s
    detail = (f"{router.lost} of {router.requests} replayed requests lost (the first sent {at or 0:.2f} s into the "
              f"replay, in the window '{router.first_lost_window}'; by window: {lost})" if router.lost else
              f"0 of {router.requests} replayed requests lost through the {router.kind} router")
    out = [g.GateResult("routed_requests_lost", "PASS" if router.lost == 0 else "FAIL", True, router.lost, 0,
                        "requests", "replayed requests never answered", detail, samples={"requests": router.requests},
                        phase="05", source="runbook_lib/phases/routed.py: nothing lost is the cutover's contract")]
    back = next((w for w in router.windows if w.window == "rollback"), None)
    if back is not None:
        served = back.source_serves_all_after_s
        out.append(g.GateResult(
            "routed_rollback", "PASS" if back.passed else "FAIL", True, served, back.rollback_within_s, "s",
            "seconds from the rollback to the target's last answer, under the replay",
            (f"the source served every request sent from {served:.2f} s after the rollback (limit "
             f"{back.rollback_within_s:g} s), {back.sent} sent, {back.lost} lost, weights read back {back.weights_read}")
            + ("" if back.passed else "; " + "; ".join(back.problems)),
            samples={"requests": back.sent}, phase="05", source="params cutover.router.rollback_within_s"))
    return out


@dataclass(frozen=True)
class CutoverResult(PhaseResult):
    """Phase 05's evidence: the rollback point, each slice step and the route's history
    (:func:`cutover`)."""

    cutover: Cutover

    def record(self) -> CutoverData:
        return CutoverData(cutover=self.cutover)

    def parts(self) -> list[Any]:
        c = self.cutover
        point = c.rollback_point.model_dump(exclude_none=True) if c.rollback_point else {}
        routed = ([md(f"**Through the {c.router.kind} router** ({c.router.requests} replayed requests, "
                      f"{c.router.lost} lost): each window"),
                   table([w.model_dump(exclude={"router_requests", "states", "weights_read"})
                          for w in c.router.windows])] if c.router else [])
        moved = [md("**Schedules** pointed at the target after the last step (and back, if one did not move)"),
                 table(c.schedules)] if c.schedules else []
        return [md("**Rollback point**"), table({"rollback point": point}, dtype=object),
                md("**Slice steps**"), table(list(c.steps)), *routed, md("**Route history**"),
                table(c.route["history"]), *moved]


def run(ctx: PhaseContext) -> CutoverResult:
    """Phase 05: record the rollback point, move the slices, judge each (:func:`cutover`)."""
    return CutoverResult(cutover(ctx))
