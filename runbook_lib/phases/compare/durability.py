"""Phase 04's ``checkpoint_durability`` drill for a training job: the pod is destroyed, not
stopped, and a new pod resumes the job from what outlived it.

A stop keeps a pod's disks; a destroy (Runpod's terminate, Vast.ai's destroy, a reclaimed
interruptible machine) takes them with the pod: the container disk always, and the pod's
volume on Runpod ("volume disk at /workspace survives stop, dies on terminate",
docs/reference/providers.md) and on the local provider (removed on destroy). What survives is
the run's store, where ``workload.checkpoint_location: store`` commits every checkpoint as a set
(:mod:`runbook_lib.workload.durable`).

The drill rents two pods on the target, both in phase 04's plans and so under its approval
(:func:`planned`), each priced against the spend limit before it is launched:

1. a ``hold`` pod runs the job from the frozen set past its first checkpoint and waits there,
   mid-run; once its result set says where it is, the pod is destroyed and verified gone;
2. a ``resume`` pod runs the job with ``resume``: from its own disks (which start empty on a
   new pod), or, with ``store``, from the newest checkpoint set that verifies under the first
   pod's prefix.

A destroy stops the pod's processes first (SIGTERM, then SIGKILL after the provider's grace), so a
job that saves on SIGTERM leaves one checkpoint newer than the one it held. PASS: the new pod
resumed from the checkpoint the destroyed pod held, or a newer one. FAIL: it found none, so
the job would start again from step 0; the observation names where the checkpoints were kept.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Mapping

from runbook_lib.errors import WorkloadError
from runbook_lib.measure import cost
from runbook_lib.phases import PhaseContext
from runbook_lib.phases.access import POD_TIMEOUT_S
from runbook_lib.portability.checkpoint import natural_key
from runbook_lib.providers.base import Plan
from runbook_lib.storage import MARKER_KEY
from runbook_lib.workload.durable import LOST, PARENT

NAME = "checkpoint_durability"
EXPECTATION = ("the pod is destroyed (not stopped) past its first checkpoint; a new pod resumes from that "
               "checkpoint, which outlived the pod where workload.checkpoint_location keeps it")


@dataclass(frozen=True)
class DurabilityPlans:
    """The drill's two pods: ``hold`` (past the first checkpoint, then destroyed) and ``resume``
    (the new pod), with their store prefixes."""

    hold: Plan
    resume: Plan
    hold_prefix: str
    resume_prefix: str


@dataclass(frozen=True)
class Held:
    """The destroyed pod as its ``hold`` record says it held (:func:`runbook_lib.workload.job.hold`):
    where its job kept checkpoints, the steps it finished, its newest verified checkpoint and the
    store sets it committed; its id, and whether the provider's listing shows it gone."""

    location: str
    steps_finished: int
    checkpoint: str | None
    kept: tuple[str, ...]
    pod_id: str
    gone: bool

    @classmethod
    def of(cls, record: Mapping[str, Any], *, pod_id: str, gone: bool) -> "Held":
        """From the ``hold`` entry of the pod's ``result.json``."""
        return cls(location=str(record["location"]), steps_finished=int(record["steps_finished"]),
                   checkpoint=record.get("checkpoint"), kept=tuple(record.get("kept") or ()), pod_id=pod_id, gone=gone)


def plans(ctx: PhaseContext) -> DurabilityPlans:
    """The drill's launch plans (pure, so phase 04's approval names them): both agents start from
    phase 01's frozen set; with ``checkpoint_location: store`` the resume pod's grant reads the
    checkpoint set the hold pod commits one step before it holds (``step-<checkpoint_every>``)."""
    frozen = ctx.records.need_freeze().frozen().prefix
    held, resumed = ctx.store_prefix("drills", NAME, "hold"), ctx.store_prefix("drills", NAME, "resume")
    extra: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    if ctx.mig.workload.checkpoint_location == "store":
        extra = ("--restore-from", f"{held}/{PARENT}")
        reads = (f"{held}/{PARENT}/step-{ctx.mig.workload.checkpoint_every:06d}",)
    return DurabilityPlans(
        hold=ctx.agents.plan("target", "durability-hold", "hold", prefix=held, frozen_prefix=frozen),
        resume=ctx.agents.plan("target", "durability-resume", "resume", prefix=resumed, frozen_prefix=frozen,
                               extra=extra, reads=reads),
        hold_prefix=held, resume_prefix=resumed)


def planned(ctx: PhaseContext) -> list[tuple[str, Plan, str]]:
    """The drill's plans as phase 04 lists them (``(side, plan, when)``), when ``drills.run`` names it."""
    if NAME not in ctx.mig.drills.run or ctx.mig.workload.kind != "training":
        return []
    p = plans(ctx)
    when = f"the {NAME} drill, after the rounds"
    return [("target", p.hold, when), ("target", p.resume, when)]


def _held(ctx: PhaseContext, p: DurabilityPlans) -> Held:
    """Launch the hold pod, wait for its result set, destroy the pod, and say what it held.

    Raises:
        WorkloadError: the pod ended before it held (its log tail).
    """
    res = ctx.resources
    prov = res.provider("target")
    pod = ctx.agents.launched(res.apply_plan("target", p.hold, needs_store=True))
    marker = f"{p.hold_prefix}/result/{MARKER_KEY}"
    try:
        done = prov.wait_exit(pod.id, timeout_s=POD_TIMEOUT_S, finished=lambda: ctx.store.head(marker) is not None)
        if ctx.store.head(marker) is None:
            raise WorkloadError(f"{NAME}: pod {pod.id} ended {done.status_detail or done.state} before its job held "
                                f"past the first checkpoint; log tail:\n{prov.log_tail(pod.id, 2500)}")
    finally:
        res.destroy("target", pod.id)
    files = ctx.evidence.fetch(ctx.store, f"{p.hold_prefix}/result", f"04/drills/{NAME}/hold")
    return Held.of(json.loads(files["result.json"].read_text())["hold"], pod_id=pod.id, gone=prov.is_gone(pod.id))


def run(ctx: PhaseContext, meter: cost.SpendMeter | None) -> tuple[str, str]:
    """Carry the drill out: ``(verdict, observation)``; a pod the spend limit refuses is not
    launched (INCONCLUSIVE).

    Raises:
        WorkloadError, ProviderError, ApprovalRequired: as :meth:`runbook_lib.phases.agents.Agents.run` raises them.
    """
    p = plans(ctx)
    price = ctx.resources.profile("target").price_usd_per_hour
    if meter is not None:
        stop = meter.check(f"{NAME} drill pods", 2 * ctx.mig.run.acceptance_budget_s, launches_usd_per_hour=price)
        if stop is not None:
            return "INCONCLUSIVE", (f"not run: its two pods at {price:g} USD/h could cross the spend limit "
                                    f"({stop.accrued_usd:.5f} USD spent, {stop.projected_usd:.5f} USD projected)")
    t0 = time.monotonic()
    try:
        held = _held(ctx, p)
        run = ctx.agents.run("target", p.resume, result_prefix=f"{p.resume_prefix}/result")
    finally:  # both pods' time, launch to destroy, at the target's price
        if meter is not None:
            meter.charge(price * (time.monotonic() - t0) / 3600.0)
    files = ctx.evidence.fetch(ctx.store, f"{p.resume_prefix}/result", f"04/drills/{NAME}/resume")
    [resumed] = json.loads(files["result.json"].read_text())["attempts"]
    return judge(held, resumed, resume_id=run.pod.id)


def judge(held: Held, resumed: Mapping[str, Any], *, resume_id: str) -> tuple[str, str]:
    """The verdict from the hold pod's record (:func:`runbook_lib.workload.job.hold`) and the new
    pod's attempt (``resumed_from``, ``start_step``, ``restored``): PASS only when the first pod
    is verified gone and the new one resumed from the checkpoint the first held or a newer one
    (saved on the destroy's SIGTERM)."""
    where = held.location
    finished, ck = held.steps_finished, held.checkpoint
    told = (f"pod {held.pod_id} destroyed (verified gone: {held.gone}) after {finished} steps, holding {ck} on its "
            f"{'volume' if where == 'store' else where}" + (f" and {len(held.kept)} set(s) in the store"
                                                             if where == "store" else "") + "; ")
    got, start = resumed.get("resumed_from"), resumed.get("start_step")
    restored = resumed.get("restored") or {}
    if not held.gone:
        return "FAIL", told + "the pod was not verified gone, so nothing was shown to outlive it"
    if got is None:
        why = LOST.get(where, "nothing the new pod could read held it")
        return "FAIL", told + (f"new pod {resume_id} found no checkpoint ({why}): the job would start again from "
                               f"step 0, losing {finished} step(s); keep checkpoints in the store "
                               "(workload.checkpoint_location: store)")
    told += f"new pod {resume_id} resumed from {got}" + (f", restored from {restored.get('set')}" if restored else "")
    if ck is not None and natural_key(got) > natural_key(ck):
        told += f", newer than {ck}: the job saved it on the destroy's SIGTERM"
    lost = max(0, finished - start) if isinstance(start, int) else "?"
    told += f"; {lost} of the {finished} steps finished before the destroy were lost"
    ok = ck is not None and natural_key(got) >= natural_key(ck)
    return ("PASS" if ok else "FAIL"), told + ("" if ok else f": older than {ck}, the newest it held")

