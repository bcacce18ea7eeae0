"""Phase 03, prove artifact parity on a disposable canary.

The canary pod runs the acceptance agent on the target profile: it downloads the frozen
artifact re-hashing every byte, runs the acceptance steps, is SIGKILLed once after its first
checkpoint and resumes from the newest checkpoint that verifies, then reloads its saved
artifact. The notebook waits for the canary's completion marker, judges the evidence, and
destroys the canary (verified gone).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from runbook_lib import gates as g
from runbook_lib.evidence.records import (
    CanaryResult,
    CapacityTry,
    EnvironmentDiffRow,
    Interruption,
    Inventory,
    ParityData,
    TensorRow,
)
from runbook_lib.layout import GOLDEN_FINAL_OUTPUTS, GOLDEN_INFERENCE_OUTPUTS, GOLDEN_OUTPUTS
from runbook_lib.params import operator_set
from runbook_lib.phases import PhaseContext, PhaseResult, PlanShown, candidates, md, service, table
from runbook_lib.portability import inventory
from runbook_lib.providers.base import Plan
from runbook_lib.storage import credential_env


def plan_canary(ctx: PhaseContext) -> Plan:
    """The canary's launch plan (a remote target's tries the offers phase 02 ranked, in order)."""
    frozen = ctx.records.need_freeze().freeze.frozen
    frozen_prefix = frozen.prefix if frozen else ctx.run_prefix("source", "frozen")  # dry-run: where phase 01 will put it
    return ctx.agents.plan("target", "canary", "accept", prefix=ctx.store_prefix("canary"), frozen_prefix=frozen_prefix)


@dataclass(frozen=True)
class Canary:
    """The canary's verified result (:func:`run_canary`).

    Attributes:
        pod_id: the canary pod. destroyed: verified gone through the provider's listing.
        result: what its acceptance job returned (``result.json``).
        outputs, final_outputs, inference_outputs: float arrays ``(inputs, dims)`` it saved
            (None when its workload saves none of that kind).
        capacity_tries: every launch try on a ranked offer. acceptance_job_s: wall seconds from
            the first launch to the result set's completion marker, replacements included.
        interruptions: machines the provider took back before the job finished.
    """

    pod_id: str
    destroyed: bool
    result: CanaryResult
    outputs: np.ndarray | None
    final_outputs: np.ndarray | None
    inference_outputs: np.ndarray | None
    capacity_tries: tuple[CapacityTry, ...]
    acceptance_job_s: float
    interruptions: tuple[Interruption, ...]


def run_canary(ctx: PhaseContext) -> Canary | Plan:
    """Launch, wait for and destroy the canary; return its verified result. In dry-run the plan is
    recorded, nothing runs, and the plan is returned.

    A remote canary is ready only when it runs, its ports are reachable and the machine is what
    was asked for (re-checked); a try that fails that is destroyed and the next ranked offer tried.
    A canary the provider interrupts (outbid) is destroyed and the acceptance job run again on
    the next untried offer (:meth:`~runbook_lib.phases.agents.Agents.run`).

    Raises:
        ApprovalRequired: the plan is not approved (HOLD). NoCapacity: no ranked offer became
            ready within ``target.offer.capacity_budget_s``.
    """
    plan = plan_canary(ctx)
    if plan.dry_run:
        ctx.resources.apply_plan("target", plan)
        return plan
    run = ctx.agents.run("target", plan, result_prefix=ctx.store_prefix("canary", "result"))
    tries = tuple(CapacityTry.model_validate(vars(a)) for a in ctx.resources.provider("target").attempts)
    files = ctx.evidence.fetch(ctx.store, ctx.store_prefix("canary", "result"), "03/canary")
    result = json.loads(files["result.json"].read_text())
    result["result_manifest"] = ctx.store.read_manifest(ctx.store_prefix("canary", "result"), run_id=ctx.run_id)

    def load(name: str) -> np.ndarray | None:
        return np.load(files[name]) if name in files else None

    return Canary(pod_id=run.pod.id, destroyed=run.destroyed, result=CanaryResult.model_validate(result),
                  outputs=load("outputs.npy"), final_outputs=load("final_outputs.npy"),
                  inference_outputs=load("inference_outputs.npy"), capacity_tries=tries,
                  acceptance_job_s=run.seconds, interruptions=run.interruptions)


def parity_gates(ctx: PhaseContext, canary: Canary, env_diff: Sequence[EnvironmentDiffRow]) -> list[g.GateResult]:
    """Judge the canary: checksums, environment, output parity, failure-and-resume, reload,
    training loss band and top-1 agreement, the environment difference ``env_diff``
    (:func:`environment_diff`), and that the canary is gone."""
    res, wl, gates_cfg = canary.result, ctx.mig.workload, ctx.mig.gates
    env = res.environment or Inventory()
    want_cuda = ctx.mig.target.device.startswith("cuda")
    env_ok = env.device == ctx.mig.target.device and (not want_cuda or env.cuda.available)
    answers_path = ctx.run_dir / GOLDEN_INFERENCE_OUTPUTS
    checks = g.artifact_parity(res.artifact_checksums, np.load(ctx.run_dir / GOLDEN_OUTPUTS),
                               canary.outputs, np.load(answers_path) if answers_path.exists() else None,
                               canary.inference_outputs, dtype=ctx.mig.source.dtype,
                               rtol=gates_cfg.parity_rtol, atol=gates_cfg.parity_atol, entry_point=wl.entry_point)
    out = [checks[0], g.boolean_gate("canary_environment", bool(env_ok), phase="03",
                                     detail=f"canary saw device {env.device or None}, torch {env.torch or None}, CUDA "
                                            f"available {env.cuda.available if res.environment else None}"),
           *checks[1:]]
    if wl.kind == "checkpoint":
        out.append(_tensor_gate(ctx.records.need_freeze().golden_run().tensors, res.last_attempt.tensors))
    drill = res.failure_drill
    drill_ok = None if drill is None else bool(drill.exit_code == -9 and drill.resumed_from)
    out.append(g.boolean_gate(
        "failure_resume", drill_ok, phase="03",
        detail="not run (artifact did not verify)" if drill is None else
        f"SIGKILL after step {drill.killed_after_step}, resumed from {drill.resumed_from}, "
        f"rejected checkpoints: {[r.model_dump() for r in drill.rejected_checkpoints] or 'none'}"))
    reload = res.reload
    out.append(g.boolean_gate("artifact_reload", None if reload is None else reload.exact, phase="03",
                              detail="not run" if reload is None else
                              f"reloaded artifact reproduces outputs exactly: {reload.exact} "
                              f"(max abs diff {reload.max_abs_diff:.3g})"))
    if wl.kind == "training":
        golden_final_path = ctx.run_dir / GOLDEN_FINAL_OUTPUTS
        golden_final = np.load(golden_final_path) if golden_final_path.exists() else None
        out.append(g.top1_agreement(golden_final, canary.final_outputs, minimum=gates_cfg.top1_agreement_min,
                                    phase="03"))
        golden_run = ctx.records.need_freeze().golden_run()
        obs_losses = [m["loss"] for m in res.last_attempt.metrics if "loss" in m]
        out.append(g.loss_band(golden_run.losses, obs_losses, rel=gates_cfg.loss_band_rel,
                               replicate=golden_run.aa_losses, phase="03"))
    out.append(_environment_gate(env_diff))
    budget = g.acceptance_budget(canary.acceptance_job_s, budget_s=ctx.mig.run.acceptance_budget_s, phase="03")
    out.append(g.scored_unless_set(budget, setting="run.acceptance_budget_s",
                                   operator_set=operator_set(ctx.mig, "run.acceptance_budget_s")))
    out.append(g.boolean_gate("canary_destroyed", canary.destroyed, phase="03",
                              detail=f"canary {canary.pod_id} destroyed and verified gone: {canary.destroyed}"))
    return ctx.evidence.add_gates(*out)


def _tensor_gate(golden: Sequence[TensorRow] | None, seen: Sequence[TensorRow] | None) -> g.GateResult:
    """``tensor_identity``: the canary loaded the source's tensors bit for bit."""
    if golden is None or seen is None:
        same, detail = None, "no tensor table from " + ("the source" if golden is None else "the canary")
    else:
        diffs = tensor_differences(golden, seen)
        same = not diffs
        detail = ("; ".join(diffs[:5]) + (f"; {len(diffs) - 5} more" if len(diffs) > 5 else "") if diffs else
                  f"{len(seen)} tensors: same names, dtypes, shapes and sha256 of their bytes")
    return g.boolean_gate("tensor_identity", same, phase="03", source="runbook_lib/phases/parity.py", detail=detail)


def _environment_gate(rows: Sequence[EnvironmentDiffRow]) -> g.GateResult:
    """``environment_diff``: FAIL on any blocker between the source's and the canary's inventory."""
    blockers = [r for r in rows if r.klass == "blocker"]
    counts = {c: sum(r.klass == c for r in rows) for c in inventory.CLASSES}
    return g.boolean_gate(
        "environment_diff", not blockers, phase="03", source="runbook_lib/portability/inventory.py",
        detail=("; ".join(f"{r.item}: {r.reason}" for r in blockers) if blockers else
                "source vs canary: " + ", ".join(f"{n} {c}" for c, n in counts.items() if n) if rows else
                "source vs canary: no difference"))


def tensor_differences(source: Sequence[TensorRow], canary: Sequence[TensorRow]) -> list[str]:
    """Every way the canary's loaded tensors differ from the source's, each as one sentence: a
    name only one side has, or a dtype, shape or byte digest that differs
    (:meth:`runbook_lib.workload.checkpoint_set.CheckpointWorkload.tensor_table` rows). Empty
    when both loaded the same tensors bit for bit."""
    src, got = {r.name: r for r in source}, {r.name: r for r in canary}
    out = [f"{n}: loaded on the source, missing on the canary" for n in src if n not in got]
    out += [f"{n}: loaded on the canary only" for n in got if n not in src]
    for n in (n for n in src if n in got):
        for field in ("dtype", "shape", "sha256"):
            a, b = getattr(src[n], field), getattr(got[n], field)
            if a != b:
                a, b = (str(a)[:16], str(b)[:16]) if field == "sha256" else (a, b)
                out.append(f"{n}: {field} {b} on the canary, {a} on the source")
    return out


def environment_diff(ctx: PhaseContext, canary_env: Inventory | None) -> list[EnvironmentDiffRow]:
    """The source's inventory (phase 01, taken inside the freeze pod) against the canary's (taken
    inside the canary), every difference classified (:func:`runbook_lib.portability.inventory.diff`) against
    the workload's declared needs and the bytes of the frozen set the target restores."""
    rec01 = ctx.records.need_freeze().freeze
    req = ctx.mig.workload.requirements
    restore = (rec01.inspection.total_bytes if rec01.inspection else None) or sum(
        o.size_bytes for o in (rec01.frozen.objects.values() if rec01.frozen else ()))
    declared = frozenset({s.name for s in ctx.mig.target.secrets} | {n for n, _ in credential_env(ctx.mig.storage)})
    source_env = rec01.environment.model_dump(exclude_unset=True) if rec01.environment else {}
    rows = inventory.diff(source_env, canary_env.model_dump(exclude_unset=True) if canary_env else {},
                          target_device=ctx.mig.target.device, memory_gb=req.memory_gb or 0.0, shm_gb=req.shm_gb or 0.0,
                          disk_gb=req.disk_gb or 0.0, restore_bytes=int(restore), loader_workers=req.loader_workers,
                          declared_credentials=declared, target_dtype=ctx.mig.target.dtype)
    return [EnvironmentDiffRow.model_validate(r) for r in rows]


def plan(ctx: PhaseContext) -> PlanShown:
    """The canary's launch plan, for display before its approval cell (a service: the canary and
    its replacement after the kill), and the documented alternate an earlier try proposed when
    the target had no capacity (:func:`runbook_lib.phases.candidates.awaiting`)."""
    if ctx.mig.racing:  # every candidate's canary, each under the one approval of the phase
        return PlanShown.of([("target", p, f"candidate {c.name}'s canary")
                             for c in ctx.mig.targets for p in _launches(ctx.for_candidate(c.name))],
                            note="Phase 03 proves every candidate of the race on its own canary, one after the other.")
    own = service.plans_03(ctx) if ctx.mig.workload.kind == "service" else PlanShown((plan_canary(ctx),), ("target",))
    more = candidates.awaiting(ctx, _launches)
    if not more:
        return own
    return PlanShown.of([(side, p, when) for side, p, when in zip(own.sides or ("target",) * len(own.plans), own.plans,
                                                                 own.when or ("always",) * len(own.plans), strict=True)]
                        + more, note=own.note)


def _launches(ctx: PhaseContext) -> tuple[Plan, ...]:
    """The canary's plans on ``ctx``'s target (an alternate's, through its own context)."""
    return service.plans_03(ctx).plans if ctx.mig.workload.kind == "service" else (plan_canary(ctx),)


TRY_COLUMNS = ["offer_id", "outcome", "detail", "resource_id", "at_s"]


@dataclass(frozen=True)
class ParityResult(PhaseResult):
    """Phase 03's evidence: the canary's verified result (or its dry-run plan) and the gates
    judged on it (:func:`parity_gates`, kept in the phase's context)."""

    canary: Canary | Plan
    env_diff: tuple[EnvironmentDiffRow, ...]
    budget_s: float

    @property
    def dry_run(self) -> bool:
        """The canary was only planned."""
        return isinstance(self.canary, Plan)

    def record(self) -> ParityData:
        c = self.canary
        if isinstance(c, Plan):
            return ParityData(dry_run=True, plan=c.to_dict())
        return ParityData(canary_pod=c.pod_id, canary_destroyed=c.destroyed, capacity_tries=c.capacity_tries,
                          interruptions=c.interruptions, acceptance_job_s=c.acceptance_job_s,
                          acceptance_budget_s=self.budget_s, environment_diff=self.env_diff, result=c.result)

    def parts(self) -> list[Any]:
        c = self.canary
        if isinstance(c, Plan):
            return [md("**Dry-run**: the canary launch is planned above and recorded; nothing was launched.")]
        drill = c.result.failure_drill.model_dump() if c.result.failure_drill else {}
        return [md(f"**Acceptance job**: {c.acceptance_job_s:.1f} s from launch to its completion marker "
                   f"(budget {self.budget_s:g} s)"),
                md("**Capacity tries**"), table(c.capacity_tries, columns=TRY_COLUMNS),
                md("**Artifact checksums re-verified on the canary**"), table(c.result.artifact_checksums),
                md("**Source vs canary environment**, every difference classified (harmless, tolerance, risk, "
                   "blocker, not checked)"),
                table(self.env_diff, columns=["item", "source", "target", "class", "reason"]),
                md("**Failure drill**"), table({"failure drill": drill}, dtype=object)]


def run(ctx: PhaseContext) -> candidates.OnCandidate | candidates.Delayed | candidates.Raced:
    """Phase 03 on the first candidate with capacity (:func:`runbook_lib.phases.candidates.prove_first`:
    the target, then each documented alternate a person approved with a reason; without one, a
    HOLD with a retry time): :func:`prove` on it. In a race (``targets``), :func:`prove` on every
    candidate (:func:`runbook_lib.phases.candidates.prove_each`)."""
    if ctx.mig.racing:
        return candidates.prove_each(ctx, prove)
    return candidates.prove_first(ctx, prove, _launches)


def prove(ctx: PhaseContext) -> ParityResult | service.ServiceParityResult:
    """Launch, wait for and destroy the canary of ``ctx``'s target (:func:`run_canary`), then
    judge parity (a service: :func:`runbook_lib.phases.service.run_canary`).

    Raises:
        NoCapacity: no ranked offer became ready within ``target.offer.capacity_budget_s``.
    """
    if ctx.mig.workload.kind == "service":
        return service.ServiceParityResult(service.run_canary(ctx))
    canary = run_canary(ctx)
    rows: tuple[EnvironmentDiffRow, ...] = ()
    if isinstance(canary, Canary):
        rows = tuple(environment_diff(ctx, canary.result.environment))
        parity_gates(ctx, canary, rows)
    return ParityResult(canary=canary, env_diff=rows, budget_s=ctx.mig.run.acceptance_budget_s)
