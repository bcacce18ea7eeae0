"""Phase 06, accept or roll back: every gate, the decision, the receipt, and the teardown.

GO needs every blocking gate PASS. On NO-GO or HOLD the source route is restored and every
target resource the run created is destroyed and verified gone. The embedded demo owns its
source too (``run.teardown_source``), so there every resource the run created is destroyed.
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from runbook_lib import __version__
from runbook_lib import gates as g
from runbook_lib._time import utc_now
from runbook_lib.errors import EXIT_BY_DECISION, EXIT_FAILED, AuthError, NotFound, StorageError
from runbook_lib.evidence import report
from runbook_lib.evidence.approvals import plans_awaiting
from runbook_lib.evidence.manifest import PHASES
from runbook_lib.evidence.records import (
    ADAPTER,
    AcceptanceJob,
    CandidateFate,
    CheckpointMoved,
    DecideData,
    Delta,
    Manifest,
    Receipt,
    ReceiptResources,
    ReconciledWrite,
    Reconciliation,
    ResourceRow,
    RollbackPoint,
    ServiceReceipt,
    ServingSide,
    Side,
    TeardownNote,
    TimelineEvent,
)
from runbook_lib.evidence.resolve import hold_deadline
from runbook_lib.evidence.seal import rehearsal_of, seal_run, sealed_decision
from runbook_lib.layout import RECEIPT, ROLLBACK_POINT, ROUTE, params_sha256
from runbook_lib.params import AnyProfile, LiveProfile, RemoteProfile
from runbook_lib.phases import Finished, PhaseContext, PhaseResult, md, schedules, table
from runbook_lib.phases.routed import restore_source
from runbook_lib.phases.service_pods import serving_shown
from runbook_lib.traffic import schedules as sch
from runbook_lib.traffic.route import Route


def _planned_only(prof: AnyProfile) -> bool:
    """A remote side left in dry-run: its launches were only shown."""
    return isinstance(prof, RemoteProfile) and prof.dry_run


@dataclass(frozen=True)
class PhaseStatus:
    """A phase as its record says: its name (``01_freeze_source``), status (``completed``,
    ``failed``, ``held``, ``interrupted`` or ``missing``), whether it stopped the migration, why
    it did not complete."""

    phase: str
    status: str
    stop_migration: bool
    error: str | None


def phase_status(ctx: PhaseContext) -> list[PhaseStatus]:
    """Status of phases 01..05 as their records say (``missing`` when a phase never ran)."""
    rows = []
    for pid, name in PHASES[:-1]:
        rec, data = ctx.records.get(pid), ctx.records.data(pid)
        rows.append(PhaseStatus(f"{pid}_{name}", rec.status if rec else "missing", bool(data and data.stops),
                                data.error if data else None))
    return rows


def evidence_gates(ctx: PhaseContext) -> list[g.GateResult]:
    """Gates of earlier phases, plus completeness and the rollback window."""
    gates = ctx.earlier_gates()
    rows = phase_status(ctx)
    failed = [r for r in rows if r.status in ("failed", "interrupted")]
    held = [r for r in rows if r.status == "held"]
    missing = [r.phase for r in rows if r.status == "missing"]
    stopped = any(r.stop_migration for r in rows)
    if failed:
        gates.append(g.GateResult("phases_complete", "ERROR", True, len(failed), 0, "failed phases", "records",
                                  f"phase {failed[0].phase} failed: {failed[0].error}", phase="06"))
    elif held:
        gates.append(g.GateResult("phases_complete", "INCONCLUSIVE", True, len(held), 0, "held phases", "records",
                                  f"phase {held[0].phase} is waiting for an approval: {held[0].error}",
                                  phase="06"))
    elif missing and not stopped:
        gates.append(g.GateResult("phases_complete", "INCONCLUSIVE", True, len(missing), 0, "missing phases",
                                  "records", f"no record for {missing}", phase="06"))
    else:
        gates.append(g.GateResult("phases_complete", "PASS", True, 5 - len(missing), 5, "phases 01-05 completed",
                                  "records",
                                  "every phase ran" if not missing else
                                  f"migration stopped by a blocking gate (failed or inconclusive); {missing} not run",
                                  phase="06"))
    dry = sorted(pid for pid in ctx.records if (d := ctx.records.data(pid)) is not None and d.dry_run)
    if dry:
        planned = [p for d in ctx.records.all_data() for p in d.plans if not p.applied]
        sides = [s for s in ("source", "target") if _planned_only(ctx.resources.profile(s))]
        gates.append(g.GateResult(
            "dry_run", "INCONCLUSIVE", True, len(planned), 0, "plans shown, none applied", "records",
            f"phases {dry} only planned ({len(planned)} plans recorded, nothing created: "
            f"{[p.plan['action'] + ' ' + p.plan['target'] + ' ' + p.plan['fingerprint'] for p in planned]}). "
            f"To run them: `runbook approve reports/{ctx.run_dir.name} --by NAME` writes the approval file "
            f"(approvals.approval_file), then set dry_run: false on {sides or 'the remote sides'} and run again",
            source="engineering standard: real providers default to dry-run",
            phase="06"))
    cut = ctx.records.get("05")
    if cut is not None and cut.status == "completed":
        point = RollbackPoint.model_validate_json((ctx.run_dir / ROLLBACK_POINT).read_text())
        left = point.window_closes_epoch - time.time()
        gates.append(g.GateResult("rollback_window", "PASS" if left > 0 else "FAIL", True, round(left, 1), 0,
                                  "s remaining", "window close time minus now",
                                  f"rollback window open for {left:.0f} more s" if left > 0 else
                                  "rollback window closed before the decision: source restoration is not provable",
                                  source="failure responses (README): a rollback window that closes early is NO-GO", phase="06"))
    return gates


@dataclass
class Actions:
    """What phase 06 did about the decision: the route's final state (None without a route),
    every resource the run created as found after the teardown, and the reconciliation of what
    the target wrote (:func:`reconcile`)."""

    route: dict[str, Any] | None
    created: list[ResourceRow]
    reconciliation: Reconciliation | None = None
    not_ours: tuple[str, ...] = ()
    schedules: list[sch.Shifted] = field(default_factory=list)

    @property
    def remaining(self) -> list[ResourceRow]:
        """Resources that had to go and are still there."""
        return [c for c in self.created if c.should_be_gone and c.state != "DESTROYED"]

    def resources(self) -> ReceiptResources:
        return ReceiptResources(created=tuple(self.created), remaining=tuple(self.remaining),
                                destroyed=tuple(c.id for c in self.created if c.state == "DESTROYED"),
                                not_ours=self.not_ours)


def candidate_fates(ctx: PhaseContext) -> tuple[CandidateFate, ...]:
    """What became of every candidate: phase 03's fates (the target and its alternates, or every
    raced candidate), a raced candidate's carried on by phase 04's race (``picked``,
    ``eliminated`` with the pair and why, ``undecided``)."""
    parity, compare = ctx.records.parity, ctx.records.compare
    fates = parity.candidates if parity is not None else ()
    race = {e.name: e for e in (compare.race.entries if compare is not None and compare.race is not None else ())}
    out = []
    for f in fates:
        e = race.get(f.name)
        if e is not None and e.fate != "racing":
            f = f.model_copy(update={"outcome": e.fate, "detail": (
                f"race: out after pair {e.exit_pair} by {e.exit_by}: {e.exit_reason}" if e.fate == "eliminated" else
                f"race: {e.fate} after {e.pairs} pairs on {compare.race.objective}")})  # type: ignore[union-attr]
        out.append(f)
    return tuple(out)


def tried(ctx: PhaseContext) -> list[str]:
    """The target candidates this run may have rented on: the target it runs on and every
    candidate phase 03 launched or tried (:meth:`ParityData.tried`)."""
    rec = ctx.records.parity
    return list(dict.fromkeys((ctx.mig.target.name, *(rec.tried() if rec is not None else ()))))


def act(ctx: PhaseContext, decision: str) -> Actions:
    """Carry out the decision: restore the source route and point the schedules back at the
    source on NO-GO/HOLD (:func:`runbook_lib.phases.schedules.restore`), destroy what must go, and
    verify it is gone (the gate ``teardown_verified``)."""
    route_file = ctx.run_dir / ROUTE
    route = None
    if route_file.exists():
        r = Route(route_file, actor=f"runbook phase 06 ({ctx.run_mode} run {ctx.run_id})")
        if decision != "GO" and r.target_percent != 0:
            r.set(0, f"{decision}: source route restored")
            restored = restore_source(ctx.mig.cutover.router, ctx.run.project)
            if restored is not None:  # a router that outlives the run carries the traffic: set it back too
                ctx.evidence.add_gates(g.boolean_gate("router_restored", restored[0], phase="06", detail=restored[1],
                                                      source="runbook_lib/phases/routed.py: restore_source"))
        route = r.state
        ctx.evidence.write_json("06/route_final.json", route)
    moved = schedules.restore(ctx, decision)  # before the teardown: no schedule may start a destroyed target
    created: list[ResourceRow] = []
    unlisted: list[str] = []
    seen: set[tuple[str, str]] = set()  # two candidates on one provider list the same machines
    for side, where in (("source", ctx), *(("target", ctx.for_candidate(name)) for name in tried(ctx))):
        prov = where.resources.provider(side)
        try:
            found = prov.list(labels={"run_id": ctx.run_id, "side": side})
        except AuthError as exc:
            applied = [p for d in ctx.records.all_data() for p in d.plans
                       if p.applied and p.plan.get("provider") == prov.name]
            if applied:  # something may exist that we cannot see: not verified
                unlisted.append(f"{side} ({prov.name}): {exc}")
            else:
                unlisted.append(f"{side} ({prov.name}) not listed, but no plan was applied there: nothing to tear down")
            found = []
        for res in found:
            if (prov.name, res.id) in seen:
                continue
            seen.add((prov.name, res.id))
            job_pod = not (res.labels.get("role") or "").startswith("endpoint-")  # freeze, canary, bench, slice
            # a raced candidate that is not the one the run went on with never keeps a machine
            other = side == "target" and res.labels.get("candidate", ctx.mig.target.name) != ctx.mig.target.name
            must_go = ctx.mig.run.teardown_source or job_pod or other or (side == "target" and decision != "GO")
            done = None
            if must_go and res.state != "DESTROYED":
                done = where.resources.destroy(side, res.id, labels=res.labels)
            try:  # one read after the teardown: gone from the provider, or its final state
                after = prov.get(res.id)
            except NotFound:
                after = None
            state = "DESTROYED" if after is None else after.state
            created.append(ResourceRow(id=res.id, name=res.name, side=side, kind=type(res).__name__.lower(),
                                       role=res.labels.get("role"), phase=res.labels.get("phase"),
                                       candidate=res.labels.get("candidate"),
                                       created_at=res.created_at, ended_at=after.ended_at if after else None,
                                       state=state, should_be_gone=must_go,
                                       teardown=asdict(done) if done is not None else None))
    lp = ctx.mig.source if isinstance(ctx.mig.source, LiveProfile) else None
    not_ours = (f"source {lp.url}: the live service the team runs (source.provider live); not created, stopped or "
                "destroyed by the run, only sent requests paced at source.max_rate_per_s",) if lp is not None else ()
    actions = Actions(route, created, not_ours=not_ours, schedules=moved)
    remaining = actions.remaining
    blind = [u for u in unlisted if "nothing to tear down" not in u]
    ok = None if blind and not remaining else not remaining
    detail = (f"still present: {[c.id for c in remaining]}" if remaining else
              f"could not list: {blind}" if blind else
              f"{len(created) - len(remaining)} of {len(created)} resources created by the run are destroyed and "
              f"verified gone" + (f"; {'; '.join(unlisted)}" if unlisted else "")
              + (f"; not ours, untouched: {'; '.join(not_ours)}" if not_ours else ""))
    ctx.evidence.add_gates(g.boolean_gate("teardown_verified", ok, phase="06", detail=detail))
    return actions


def reconcile(ctx: PhaseContext, decision: str) -> Reconciliation | None:
    """On NO-GO or HOLD after phase 05 ran, account for what the target wrote during the cutover:
    each slice's checkpoint set is listed from the store with every object's sha256 (verified
    against its manifest), then ``cutover.on_rollback`` keeps, copies back or discards it
    (:class:`runbook_lib.params.Cutover`). Nothing is silently lost: the listing comes first and
    is kept in ``06/reconciliation.json`` whatever the rule.

    Returns:
        When, the rule, every set found (prefix, verified, each object's sha256, bytes), what was
        done and where a copy went; None when the decision is GO or phase 05 did not complete.

    Raises:
        StorageError: copying back failed verification (the target's set is left in place).
    """
    cut = ctx.records.cutover
    if decision == "GO" or cut is None:
        return None
    rule = ctx.mig.cutover.on_rollback
    prefixes = [s.checkpoint_prefix for s in cut.cutover.steps if s.checkpoint_prefix]
    at = utc_now()
    if not prefixes:
        out = Reconciliation(at=at, rule=rule, action="nothing durable to reconcile: the target's responses went back "
                                                       "to their callers (listed in 05/cutover_samples.csv)")
        ctx.evidence.write_json("06/reconciliation.json", out)
        return out
    store = ctx.store
    writes = []
    for prefix in prefixes:
        try:
            objs = store.verify_set(prefix, run_id=ctx.run_id)
            writes.append(ReconciledWrite(prefix=prefix, verified=True, objects={k: o.sha256 for k, o in objs.items()},
                                          bytes=sum(o.size_bytes for o in objs.values())))
        except StorageError as exc:  # listed as found, never dropped from the account
            writes.append(ReconciledWrite(prefix=prefix, verified=False, objects=dict.fromkeys(store.list(prefix)),
                                          error=str(exc)))
    action, copied_to = _reconcile_by_rule(ctx, rule, writes)
    out = Reconciliation(at=at, rule=rule, writes=tuple(writes), action=action, copied_to=copied_to)
    ctx.evidence.write_json("06/reconciliation.json", out)
    return out


def _reconcile_by_rule(ctx: PhaseContext, rule: str, writes: list[ReconciledWrite]) -> tuple[str, str | None]:
    """Apply ``cutover.on_rollback`` to the target's listed sets; returns what was done and the
    prefix a verified copy went to (None when nothing was copied)."""
    store = ctx.store
    newest = next((w.prefix for w in reversed(writes) if w.verified), None)
    frozen = ctx.records.need_freeze().frozen().prefix
    if rule == "copy_back" and newest is not None:
        dest = ctx.store_prefix("reconciled")
        with tempfile.TemporaryDirectory() as tmp:
            files = store.fetch_set(newest, tmp, run_id=ctx.run_id)
            infos = [store.put_file(path, f"{dest}/{rel}") for rel, path in sorted(files.items())]
        source = store.read_manifest(newest, run_id=ctx.run_id)
        store.commit_set(dest, infos, run_id=ctx.run_id, about=ctx.set_about(
            "reconciled", {"copied_from": newest, "source_set_verified": True, "objects": len(infos)},
            from_set=source.get("about", {}).get("model", {})))
        store.verify_set(dest, run_id=ctx.run_id)
        return (f"copied the target's newest verified checkpoint set {newest} to {dest} and verified it: the source "
                "can resume from the target's progress; the target's sets are kept where they are"), dest
    if rule == "discard":
        for w in writes:
            store.delete_prefix(w.prefix)
        return (f"deleted the {len(writes)} set(s) the target wrote, after listing them here; the source resumes "
                f"from the rollback point {frozen}"), None
    return (f"kept the {len(writes)} set(s) the target wrote where they are, listed here; the source resumes from "
            f"the rollback point {frozen}"
            + ("" if newest or rule == "keep" else "; none verified, so nothing could be copied back")), None


def timeline(ctx: PhaseContext, *, decided_at: str, decision: str, route: dict[str, Any] | None,
             point: RollbackPoint | None, reconciliation: Reconciliation | None) -> list[TimelineEvent]:
    """The cutover or rollback as it happened, oldest first: the rollback point, every route change
    (time, share of traffic on the target, why, who; ``route``: :attr:`runbook_lib.traffic.route.Route.state`),
    the reconciliation and the decision."""
    events: list[TimelineEvent] = []
    if point:
        events.append(TimelineEvent(at=point.recorded_at, event=f"rollback point recorded: {point.route} on "
                                    f"{point.source_provider}; rollback owner {point.rollback_owner}",
                                    target_percent=0, actor=f"runbook phase 05 ({ctx.run_id})"))
    for h in (route or {}).get("history", []):
        events.append(TimelineEvent(at=h["at"], event=h["reason"], target_percent=h["target_percent"],
                                    actor=h.get("actor", "runbook")))
    now_percent = (route or {}).get("target_percent", 0)
    if reconciliation:
        events.append(TimelineEvent(at=reconciliation.at, event=f"reconciled ({reconciliation.rule}): "
                                    f"{reconciliation.action}", target_percent=now_percent,
                                    actor=f"runbook phase 06 ({ctx.run_mode} run {ctx.run_id})"))
    events.append(TimelineEvent(at=decided_at, event=f"decision {decision}", target_percent=now_percent,
                                actor=f"runbook phase 06 ({ctx.run_mode} run {ctx.run_id}): the gates"))
    return sorted(events, key=lambda e: e.at)


def _deltas(ctx: PhaseContext) -> list[Delta]:
    rec = ctx.records.compare
    out: list[Delta] = []
    if rec is None:
        return out
    summ = rec.summary
    verdicts = {x.name: x.verdict for x in rec.gates}
    for metric, gate in (("total p50 (s)", None), ("total p95 (s)", "latency_p95_ratio"), ("total p99 (s)", None),
                         ("throughput mean (units/s)", "throughput_ratio")):
        s, t = summ["source"].metric(metric), summ["target"].metric(metric)
        out.append(Delta(metric=metric, source=s, target=t,
                         ratio=(t / s) if s and t is not None and not math.isnan(s) else None,
                         verdict=verdicts.get(gate) if gate else None, gate=gate))
    for side_key, gate in (("cold_start_median_s", "cold_start_ratio"), ("usd_per_accepted_unit", "cost_per_accepted_unit")):
        by_side = rec.cold_start_median_s if side_key == "cold_start_median_s" else rec.usd_per_accepted_unit
        s, t = by_side.get("source"), by_side.get("target")
        out.append(Delta(metric=side_key, source=s, target=t, ratio=(t / s) if s and t is not None else None,
                         verdict=verdicts.get(gate), gate=gate))
    return out


def _rehearsal(ctx: PhaseContext) -> dict[str, Any] | None:  # seal.rehearsal_of's shape
    """:func:`runbook_lib.evidence.seal.rehearsal_of` over the records so far and this phase's providers."""
    out = rehearsal_of(ctx.records, ctx.mig) or {"simulators": {}, "params": None}
    out["simulators"].update({side: p.simulator() for side, p in ctx.resources.providers.items() if p.simulator()})
    return out if out["simulators"] or out["params"] else None


def _acceptance_job(ctx: PhaseContext, gates: list[g.GateResult]) -> AcceptanceJob:
    """The canary's acceptance job as phase 03 timed it: wall seconds (launch to completion
    marker), the budget (``run.acceptance_budget_s``) and the gate's verdict; None values when
    phase 03 did not run it."""
    rec = ctx.records.parity
    gate = next((x for x in gates if x.name == "acceptance_budget"), None)
    return AcceptanceJob(wall_s=rec.acceptance_job_s if rec else None, budget_s=ctx.mig.run.acceptance_budget_s,
                         verdict=gate.verdict if gate else None, blocking=gate.blocking if gate else None)


def write_receipt(ctx: PhaseContext, decision: str, reasons: list[str], gates: list[g.GateResult],
                  actions: Actions) -> Receipt:
    """Write ``receipt.json``: releases, identities, data moved, deltas, phase 04's fault drills
    (expectation, observation, verdict), decision, rollback point, resources created and
    destroyed, and every gate; a HOLD also records ``hold_deadline`` (UTC
    ISO), ``gates.hold_deadline_s`` after the decision, when it resolves to NO-GO unless a person
    decides first."""
    r01, r05 = ctx.records.freeze, ctx.records.cutover
    freeze = r01.freeze if r01 is not None else None
    cut = r05.cutover if r05 is not None else None
    decided_at = utc_now()
    held = decision == "HOLD"  # a person decides by the deadline (`runbook resolve`); after it, NO-GO
    failed = any(r.status == "failed" for r in phase_status(ctx))
    point = cut.rollback_point if cut else None
    live_src = isinstance(ctx.mig.source, LiveProfile)
    receipt = Receipt(
        run_id=ctx.run_id, migration=ctx.mig.migration, decided_at=decided_at, decision=decision,
        hold_deadline=hold_deadline(decided_at, ctx.mig.gates.hold_deadline_s) if held else None,
        hold_deadline_s=ctx.mig.gates.hold_deadline_s if held else None,
        run_status="failed" if failed else "completed", exit_code=EXIT_FAILED if failed else EXIT_BY_DECISION[decision],
        reasons=reasons,
        source=Side(release=ctx.mig.source.release, provider=ctx.mig.source.provider,
                    profile=ctx.mig.source.model_dump(exclude={"secrets", *LiveProfile.NOT_FOR_LIVE}) if live_src
                    else ctx.mig.source.model_dump(exclude={"secrets"})),
        target=Side(release=ctx.mig.target.release, provider=ctx.mig.target.provider,
                    profile=ctx.mig.target.model_dump(exclude={"secrets"})),
        identities={"params_sha256": params_sha256(ctx.params_path), "runbook_lib_version": __version__,
                    **((freeze.identity if freeze else None) or {}),
                    "frozen_manifest_sha256": freeze.frozen.manifest_sha256 if freeze and freeze.frozen else None,
                    "golden_outputs_sha256": freeze.golden.outputs_sha256 if freeze and freeze.golden else None},
        data_checkpoint_moved=CheckpointMoved(frozen=freeze.frozen if freeze else None,
                                              final_checkpoint_prefix=cut.checkpoint_moved if cut else None),
        acceptance_deltas=tuple(_deltas(ctx)), acceptance_job=_acceptance_job(ctx, gates),
        drills=ctx.records.compare.drills if ctx.records.compare else (), rehearsal=_rehearsal(ctx),
        rollback_point=point, route=actions.route, reconciliation=actions.reconciliation,
        schedules=schedules.receipt_rows(ctx, actions.schedules),
        candidates=candidate_fates(ctx),
        timeline=tuple(timeline(ctx, decided_at=decided_at, decision=decision, route=actions.route, point=point,
                                reconciliation=actions.reconciliation)),
        service=service_receipt(ctx),
        forecast=ctx.records.compare.forecast if ctx.records.compare else None,
        teardown=TeardownNote(
            teardown_source=ctx.mig.run.teardown_source and not live_src,
            note=("the source is a live service, not ours: it is never torn down, so the rollback point stays valid "
                  "until the window closes (run.teardown_source does not apply to it)") if live_src else
                 ("the embedded run owns both sides: after the decision it destroys every resource it created, so the "
                  "rollback point above was valid until teardown") if ctx.mig.run.teardown_source else
                 "source kept: the rollback point stays valid until the window closes"),
        resources=actions.resources(), gates=tuple(gates))
    ctx.evidence.write_json(RECEIPT, receipt)
    return receipt


def service_receipt(ctx: PhaseContext) -> ServiceReceipt | None:
    """For ``kind: service``: the image (or the stand-in that ran for it), the digest phase 01
    pinned, the protocol, whether every service pod the run launched ran as declared, and any
    runbook code found inside one (phases 01 and 03's launches, as the provider reported them);
    a live source is named with what was observed and declared of it, and is not a launch."""
    svc = ctx.mig.workload.service
    if ctx.mig.workload.kind != "service" or svc is None:
        return None
    r01, r03 = ctx.records.freeze, ctx.records.parity
    frozen = r01.freeze.service if r01 is not None else None
    canary = r03.service if r03 is not None else None
    live = frozen.live if frozen is not None else None  # a live source was not launched: not a launch
    launches = [x for x in (frozen.launch if frozen and live is None else None, canary.launch if canary else None,
                            canary.recovered_launch if canary else None) if x is not None]
    stand_in = any(x.stand_in for x in launches)
    return ServiceReceipt(image=svc.image, digest=frozen.pinned_digest if frozen else None, stand_in=stand_in,
                          stand_in_command=svc.stand_in.command if stand_in and svc.stand_in else (),
                          protocol=svc.protocol, launches_as_declared=bool(launches) and all(x.as_declared for x in launches),
                          runbook_code_inside=tuple(i for x in launches for i in x.runbook_inside),
                          recovery_s=canary.recovery_s if canary else None,
                          exact_match_rate=canary.exact_match_rate if canary else None,
                          latency=ctx.records.compare.token_metrics if ctx.records.compare is not None else {},
                          live_source=live, serving=serving_sides(ctx, frozen, canary), adapter=serving_adapter(ctx))


def serving_sides(ctx: PhaseContext, frozen: Any, canary: Any) -> dict[str, ServingSide]:
    """Where each side's service ran (:class:`~runbook_lib.evidence.records.ServingSide`): phase
    02's words for it, and the launch phase 01 (source) and phase 03 (target) recorded."""
    out = {}
    for side, launch in (("source", frozen.launch if frozen is not None else None),
                         ("target", canary.launch if canary is not None else None)):
        prof = ctx.mig.source if side == "source" else ctx.mig.target
        out[side] = ServingSide(where=serving_shown(prof), id=launch.pod if launch is not None else "",
                                endpoint=launch.endpoint if launch is not None else None)
    return out


def serving_adapter(ctx: PhaseContext) -> str:
    """Phase 02's ``serving`` row's reason when it is an adapter, else empty."""
    m = ctx.records.mapping
    row = next((r for r in m.dependency_map if r.dependency == "serving"), None) if m is not None else None
    return row.reason if row is not None and row.status == ADAPTER else ""


@dataclass(frozen=True)
class Decided:
    """What :func:`decide_and_act` found and did: the decision and why, every gate, the actions,
    the receipt."""

    decision: str
    reasons: list[str]
    gates: list[g.GateResult]
    actions: Actions
    receipt: Receipt


def decide_and_act(ctx: PhaseContext) -> Decided:
    """Evaluate every gate, decide, act on the decision, decide again with the teardown gate,
    and write the receipt."""
    gates = evidence_gates(ctx)
    decision, _ = g.decide(gates)
    before = len(ctx.evidence.gates)
    actions = act(ctx, decision)
    actions.reconciliation = reconcile(ctx, decision)
    gates += ctx.evidence.gates[before:]  # what acting found: teardown_verified, and router_restored if set back
    ctx.evidence.gates = [x for x in gates if x.phase == "06"]
    decision, reasons = g.decide(gates)
    receipt = write_receipt(ctx, decision, reasons, gates, actions)
    return Decided(decision, reasons, gates, actions, receipt)


@dataclass(frozen=True)
class DecisionResult(PhaseResult):
    """Phase 06's outcome (:func:`decide_and_act`): the status of phases 01-05, every gate, the
    decision and why, the actions taken, and the receipt written to ``receipt.json``."""

    phases: list[PhaseStatus]
    decision: str
    reasons: list[str]
    gates: list[g.GateResult]
    actions: Actions
    receipt: Receipt
    awaiting: tuple[dict[str, Any], ...] = ()  # Plan.to_dict of each plan shown, not approved (approvals.plans_awaiting)

    def record(self) -> DecideData:
        return DecideData(decision=self.decision, reasons=self.reasons)

    def hold_guidance(self) -> str:
        """On HOLD, what a person must decide and the commands that do it (Markdown); else ""."""
        if self.decision != "HOLD":
            return ""
        run = f"reports/{self.receipt.run_id}"
        lines = [f"### A person must decide by {self.receipt.hold_deadline or '?'} (UTC)",
                 "The evidence neither passes nor fails every blocking gate (the reasons above). Read them, then "
                 f"record the decision: `runbook resolve {run} --decision GO|NO-GO --by NAME --reason TEXT`. "
                 "After the deadline the run counts as NO-GO. The source route is already restored and the "
                 "target torn down, so NO-GO needs nothing more."]
        if self.awaiting:
            plans = ", ".join(f"{p['action']} {p['target']!r} on {p['provider']!r}" for p in self.awaiting)
            lines.append(f"Plans waiting for approval ({plans}): a run that never applied them cannot be resolved "
                         f"to GO. Approve them with `runbook approve {run} --by NAME` (it writes the approval "
                         "file) and run the migration again with `--approval-file`, or click Approve in the "
                         "phase's notebook.")
        return "\n\n".join(lines)

    def parts(self) -> list[Any]:
        guidance = self.hold_guidance()
        return [table([asdict(p) for p in self.phases]), report.gates_table(self.gates),
                md(f"## Decision: **{self.decision}**\n\n" + "\n".join(f"- {r}" for r in self.reasons)),
                *([md(guidance)] if guidance else []),
                md("**Acceptance deltas**"), table(self.receipt.acceptance_deltas),
                md("**Resources this run created**"), table(self.actions.created),
                *([md("**Not ours** (used, never changed)"), table([{"resource": x} for x in self.actions.not_ours])]
                  if self.actions.not_ours else []),
                *([md("**Schedules**: the side each started at freeze, after the cutover and now"),
                   table(self.receipt.schedules)] if self.receipt.schedules else []),
                *([md("**Candidates**: the target and the documented alternates phase 03 tried, or every candidate "
                      "of the race, and what became of each (an alternate runs only under an approval with a reason; "
                      "a raced candidate's fate is phase 04's race)"),
                   table(self.receipt.candidates, columns=["name", "provider", "role", "outcome", "approved_by",
                                                           "reason", "detail"])]
                  if len(self.receipt.candidates) > 1 else []),
                *self.serving_parts()]

    def serving_parts(self) -> list[Any]:
        """Where a service ran on each side and phase 02's adapter between them (the receipt's
        ``service.serving`` and ``service.adapter``), shown when a side ran on an endpoint or an
        adapter was needed; nothing for a pod on both sides or another workload."""
        svc = self.receipt.service
        if svc is None or not (svc.adapter or any(s.endpoint for s in svc.serving.values())):
            return []
        rows = [{"side": side, "where": s.where, "id": s.id} for side, s in svc.serving.items()]
        return [md("**Where the service ran**"), table(rows),
                *([md(f"**Adapter** (phase 02's `serving` row, proven by phase 03): {svc.adapter}")] if svc.adapter
                  else [])]


@dataclass(frozen=True)
class Sealed:
    """Phase 06's record and the run's manifest, written last (``manifest.json``, then
    ``_SUCCESS`` unless a phase failed; the headless runner seals again with every phase's outcome)."""

    finished: Finished
    manifest: Manifest

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.finished)
        display(md(f"Sealed: `manifest.json` for run `{self.manifest.run_id}`"))


def run(ctx: PhaseContext) -> DecisionResult:
    """Phase 06: judge every gate, decide, act (route, teardown verified), write the receipt."""
    status = phase_status(ctx)
    out = decide_and_act(ctx)
    return DecisionResult(phases=status, decision=out.decision, reasons=out.reasons, gates=out.gates,
                          actions=out.actions, receipt=out.receipt, awaiting=tuple(plans_awaiting(ctx.run_dir)))


def finish(ctx: PhaseContext, result: DecisionResult) -> Sealed:
    """Write phase 06's record (it hashes ``receipt.json``), then seal the run."""
    record = ctx.finish(result.record())
    failed = result.receipt.run_status == "failed"
    manifest = seal_run(ctx.run_dir, ctx.mig, ctx.params_path, decision=sealed_decision(result.decision, failed=failed),
                        complete=not failed)
    return Sealed(Finished(record, tuple(ctx.evidence.gates)), Manifest.model_validate(manifest))
