"""The target's documented alternates (``alternates``) through phase 03.

When a candidate (the target, then each alternate in order) has no capacity (no ranked offer
became ready within its ``offer.capacity_budget_s``: :class:`~runbook_lib.errors.NoCapacity`),
phase 03 proposes the next alternate as a ``use_alternate`` plan that shows what it changes
against the target. The alternate's canary runs only under an approval of that plan that gives a
reason (``runbook approve --reason``); the params' pre-approvals never cover it, since it changes
where the workload will run. An alternate phase 02 found a dependency with no equivalent for is
not proposed: it does not meet the same constraints. Without a proven candidate the phase ends
with the blocking gate ``target_capacity`` INCONCLUSIVE, so the run HOLDs (a delay) with a retry
time one capacity budget later, instead of failing: a later run of the same params tries again,
the target first. Seed 001's error table: "Target capacity violates policy: delay or approve a
documented alternate; do not weaken constraints silently"; the constraints an alternate keeps are
:func:`runbook_lib.params.relaxed_constraints`'s.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping, Sequence

from runbook_lib import gates as g
from runbook_lib.errors import NoCapacity
from runbook_lib.evidence import approvals
from runbook_lib.evidence.records import CandidateFate, ParityData, PlanRow
from runbook_lib.params import AnyProfile, OfferSpec, RemoteProfile, profile_differences
from runbook_lib.phases import PhaseContext, PhaseResult, md, table
from runbook_lib.providers.base import Plan

ACTION = approvals.ALTERNATE_ACTION
"""The plan action of a proposed alternate (:func:`proposal`); only an approval that gives a reason covers it."""
PROVIDER = "alternates"
"""The plan provider of a proposed alternate: a choice made in the runbook, on no provider."""
GATE = g.CAPACITY_GATE
SOURCE = "seed 001: target capacity violates policy: delay or approve a documented alternate"
FATE_COLUMNS = ["name", "provider", "role", "outcome", "differences", "detail", "approved_by", "reason"]


def proposal(ctx: PhaseContext, alt: AnyProfile) -> Plan:
    """The ``use_alternate`` plan of ``alt``: the alternate named with what it changes against the
    target (:func:`runbook_lib.params.profile_differences`), at its declared price. The same
    params give the same plan, and so the same fingerprint, in every run."""
    changes = "; ".join(profile_differences(ctx.mig.target, alt)) or "nothing but its name"
    return Plan(provider=PROVIDER, action=ACTION, spec=None, cost_usd_per_hour=alt.price_usd_per_hour, dry_run=False,
                target=f"{ctx.mig.migration}: prove alternate {alt.name} ({alt.provider}) in place of target "
                       f"{ctx.mig.target.name}, which had no capacity; it changes {changes}")


def approved_with_reason(ctx: PhaseContext, plan: Plan) -> approvals.Approval | None:
    """The approval of ``plan`` when one exists and gives a reason (recorded with the phase's
    plans); None while none does, the plan left pending for ``runbook approve``."""
    terms = ctx.resources.approval_terms()
    found = approvals.find(plan, run_dir=terms["run_dir"], approval_file=terms["approval_file"], with_reason=True)
    if found is None:
        return None
    approvals.record(terms["run_dir"], found, plan)
    ctx.evidence.plans.append(PlanRow(plan=plan.to_dict(), approved_by=found.approved_by,
                                      method=f"{found.method}; reason: {found.reason}"))
    ctx.evidence.path(f"approvals/{plan.fingerprint[:16]}.json")
    return found


def _awaiting(ctx: PhaseContext, plan: Plan, alt: PhaseContext, launches: Sequence[Plan]) -> None:
    """Keep ``plan`` and the alternate's ``launches`` (on ``alt``, the alternate's context) that
    nothing approves yet in the phase's record as shown and not applied, so one ``runbook approve
    --reason`` covers them all."""
    ctx.evidence.plans.append(PlanRow(plan=plan.to_dict(), applied=False,
                                      method="awaiting an approval with a reason (runbook approve --reason)"))
    t = alt.resources.approval_terms()
    for p in launches:
        if approvals.find(p, run_dir=t["run_dir"], approval_file=t["approval_file"], preapproved_local=t["preapproved_local"],
                          simulator=alt.resources.simulator("target")) is None:
            ctx.evidence.plans.append(PlanRow(plan=p.to_dict(), applied=False,
                                              method=f"awaiting approval with the alternate's plan {plan.fingerprint[:16]}"))


def awaiting(ctx: PhaseContext, launches: Callable[[PhaseContext], Sequence[Plan]]) -> list[tuple[str, Plan, str]]:
    """The alternate an earlier try of phase 03 in this run proposed and left waiting, with its
    canary's ``launches``, as ``(side, plan, when)`` for
    the phase's plan cell: one click there, with a reason, approves them (the next cell tries the
    target first again, then the alternate). Empty when no proposal waits."""
    shown = {str(p.get("fingerprint")) for p in approvals.plans_awaiting(ctx.resources.approval_terms()["run_dir"])}
    for alt in ctx.mig.alternates:
        plan = proposal(ctx, alt)
        if plan.fingerprint not in shown:
            continue
        when = "only if the target still has no capacity: the alternate proven in its place"
        return [("target", plan, when)] + [("target", p, f"{when} (its canary)") for p in launches(ctx.for_candidate(alt.name))]
    return []


@dataclass(frozen=True)
class OnCandidate(PhaseResult):
    """Phase 03's result on the candidate that was proven: the canary's own result (``inner``)
    with every candidate's fate; the phases after 03 run on ``target``."""

    inner: Any
    target: str
    fates: tuple[CandidateFate, ...]

    @property
    def dry_run(self) -> bool:
        return bool(getattr(self.inner, "dry_run", False))

    def record(self) -> ParityData:
        data: ParityData = self.inner.record()
        return data.model_copy(update={"target": self.target, "candidates": self.fates})

    def parts(self) -> list[Any]:
        head = [] if len(self.fates) < 2 else [
            md(f"**Candidates**: the canary ran on **{self.target}**; what became of each one tried"),
            table(self.fates, columns=FATE_COLUMNS)]
        return head + list(self.inner.parts())


@dataclass(frozen=True)
class Delayed(PhaseResult):
    """Phase 03 without a proven candidate: every fate, and when to try again (UTC ISO 8601)."""

    fates: tuple[CandidateFate, ...]
    retry_at: str

    def record(self) -> ParityData:
        return ParityData(candidates=self.fates, retry_at=self.retry_at)

    def parts(self) -> list[Any]:
        return [md(f"**No candidate was proven**: HOLD; try again at or after {self.retry_at}"),
                table(self.fates, columns=FATE_COLUMNS)]


def _fate(ctx: PhaseContext, prof: AnyProfile, outcome: str, detail: str, **more: str) -> CandidateFate:
    role = "candidate" if ctx.mig.racing else "target" if prof.name == ctx.mig.target.name else "alternate"
    diffs = tuple(profile_differences(ctx.mig.target, prof)) if role == "alternate" else ()
    return CandidateFate(name=prof.name, provider=prof.provider, role=role, outcome=outcome, detail=detail,
                         differences=diffs, **more)


def _blocked(ctx: PhaseContext, name: str) -> str:
    """Why phase 02 found alternate ``name`` short of the constraints (a dependency with no
    equivalent), or ``""``."""
    mapping = ctx.records.mapping
    alt = next((a for a in (mapping.alternates if mapping else ()) if a.name == name), None)
    if alt is None or not alt.blocked:
        return ""
    return "; ".join(f"{r.dependency}: {r.reason}" for r in alt.dependency_map if r.status == "no equivalent")


def budget_s(prof: AnyProfile) -> float:
    """``offer.capacity_budget_s`` of a remote candidate, seconds; 0 for a local one (no wait)."""
    return prof.offer.capacity_budget_s if isinstance(prof, RemoteProfile) else 0.0


def prove_first(ctx: PhaseContext, prove: Callable[[PhaseContext], Any],
                launches: Callable[[PhaseContext], Sequence[Plan]], *,
                now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)) -> OnCandidate | Delayed:
    """Phase 03 over the candidates: ``prove`` (the canary and its gates) on the target; on
    :class:`~runbook_lib.errors.NoCapacity`, on the next alternate once its ``use_alternate``
    plan is approved with a reason, and so on. A proposal still waiting stops the walk there (the
    next alternate is proposed only after this one), shown with the alternate's ``launches`` (its
    canary's plans) so one approval covers both. Without a proven candidate, the blocking
    gate ``target_capacity`` is INCONCLUSIVE (a HOLD) with a retry time one capacity budget
    (the largest of the candidates tried; :class:`OfferSpec`'s default when none was) after ``now``.

    Returns:
        :class:`OnCandidate` (the proven candidate's result and every fate) or :class:`Delayed`.
    """
    fates: list[CandidateFate] = []
    tried: list[AnyProfile] = []
    for prof in ctx.mig.candidates:
        if prof.name != ctx.mig.target.name:
            blocked = _blocked(ctx, prof.name)
            if blocked:
                fates.append(_fate(ctx, prof, "blocked", f"phase 02: {blocked}"))
                continue
            plan = proposal(ctx, prof)
            found = approved_with_reason(ctx, plan)
            if found is None:
                alt = ctx.for_candidate(prof.name)
                _awaiting(ctx, plan, alt, launches(alt))
                fates.append(_fate(ctx, prof, "awaiting_approval",
                                   f"proposed as plan {plan.fingerprint[:16]}; run `runbook approve reports/"
                                   f"{ctx.run_id} --by NAME --reason TEXT` and run again", plan=plan.fingerprint))
                break
            more = {"plan": plan.fingerprint, "approved_by": found.approved_by, "reason": found.reason}
        else:
            more = {}
        tried.append(prof)
        try:
            inner = prove(ctx.for_candidate(prof.name))
        except NoCapacity as exc:
            fates.append(_fate(ctx, prof, "no_capacity", str(exc), **more))
            continue
        dry = bool(getattr(inner, "dry_run", False))
        fates.append(_fate(ctx, prof, "planned" if dry else "proved",
                           "dry-run: its canary is planned, nothing was launched" if dry else
                           "its canary ran; the gates judge it", **more))
        return OnCandidate(inner=inner, target=prof.name, fates=tuple(fates))
    wait = max((budget_s(p) for p in tried), default=0.0) or OfferSpec.model_fields["capacity_budget_s"].default
    retry = (now() + timedelta(seconds=wait)).strftime("%Y-%m-%dT%H:%M:%SZ")
    left = [f.name for f in fates if f.outcome == "awaiting_approval"]
    detail = ("no candidate has capacity: " + "; ".join(f"{f.name}: {f.outcome}" for f in fates)
              + (f". Alternate {left[0]} waits for an approval with a reason" if left else
                 "" if ctx.mig.alternates else ". No alternates are declared (alternates)")
              + f". Try again at or after {retry}: run the same params again, the target first")
    ctx.evidence.add_gates(g.boolean_gate(GATE, None, phase="03", detail=detail, source=SOURCE))
    return Delayed(fates=tuple(fates), retry_at=retry)


RACE_GATE = "race_candidates"
"""Phase 03's blocking gate of a race: how many candidates were proven on their canaries."""
CANARY_RECORD = "03/canary_record.json"
"""A raced candidate's own phase 03 record data, under its directory (``03/candidates/<name>/``),
written for every candidate whose canary ran (proved or failed)."""


@dataclass(frozen=True)
class Raced(PhaseResult):
    """Phase 03 of a race (``targets``): every candidate's fate, each proven candidate's canary
    result by name (the first one's shown in full and kept as the record's), and, without any
    proven, when to try again."""

    proven: dict[str, PhaseResult]
    fates: tuple[CandidateFate, ...]
    retry_at: str | None = None

    @property
    def dry_run(self) -> bool:
        return any(bool(getattr(r, "dry_run", False)) for r in self.proven.values())

    def record(self) -> ParityData:
        if not self.proven:
            return ParityData(candidates=self.fates, retry_at=self.retry_at)
        first, inner = next(iter(self.proven.items()))
        data = inner.record()
        assert isinstance(data, ParityData)  # prove() returns phase 03's results
        return data.model_copy(update={"target": first, "candidates": self.fates})

    def parts(self) -> list[Any]:
        head = [md(f"**The race's candidates**: {len(self.proven)} of {len(self.fates)} proven on their own canaries "
                   "go on to phase 04's race; what became of each"), table(self.fates, columns=FATE_COLUMNS)]
        if not self.proven:
            return head
        first, inner = next(iter(self.proven.items()))
        return head + [md(f"**Candidate {first}'s canary** (each candidate's record: "
                          f"`03/candidates/<name>/{CANARY_RECORD.split('/')[-1]}`)"), *inner.parts()]


def _judged(name: str, added: Sequence[g.GateResult], *, out: bool = False) -> tuple[list[g.GateResult], str]:
    """Candidate ``name``'s phase 03 gates under their own names (``<gate>[<name>]``) and why it is
    out (empty when every blocking one passed). An out candidate's gates (``out``: it was out
    already, with no capacity) are kept but scored, not blocking: the race goes on without it, and
    only :data:`RACE_GATE` decides for phase 03."""
    bad = [x for x in added if x.blocking and x.verdict not in ("PASS", "NOT_APPLICABLE")]
    why = "; ".join(f"{x.name} {x.verdict}: {x.detail}" for x in bad)
    gone = out or bool(bad)
    return [dataclasses.replace(x, name=f"{x.name}[{name}]", blocking=x.blocking and not gone,
                                detail=(f"out of the race: {x.detail}" if x in bad else x.detail))
            for x in added], why


def prove_each(ctx: PhaseContext, prove: Callable[[PhaseContext], Any], *,
               now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)) -> Raced:
    """Phase 03 of a race: ``prove`` (the canary and its gates) on every candidate of ``targets``
    in the params' order, each on its own canary with its own files and store sets
    (:meth:`~runbook_lib.phases.context.PhaseContext.for_candidate`), one after the other (the
    canaries are judged on their outputs, not on time, but one host's CPUs are shared). A
    candidate phase 02 found a dependency without an equivalent for is ``blocked`` and not
    launched; one with no capacity (:class:`~runbook_lib.errors.NoCapacity`) is ``no_capacity``;
    one whose blocking gates did not all pass is ``failed``, with the gates named. Each candidate
    whose canary ran keeps its record data in its directory (:data:`CANARY_RECORD`).

    The blocking gate :data:`RACE_GATE` PASSes with one candidate or more proven (phase 04 races
    them); with none it FAILs, unless one had no capacity: then it is INCONCLUSIVE (a HOLD, the
    delay of seed 001's error table) with a retry time one capacity budget after ``now``.
    """
    fates: list[CandidateFate] = []
    proven: dict[str, PhaseResult] = {}
    mapping = ctx.records.mapping
    for prof in ctx.mig.targets:
        blocked = mapping.blocked(prof.name) if mapping is not None else ()
        if prof.name == ctx.mig.targets[0].name and mapping is not None:
            blocked = tuple(f"{r.dependency}: {r.reason}" for r in mapping.dependency_map if r.status == "no equivalent")
        if blocked:
            fates.append(_fate(ctx, prof, "blocked", "phase 02: " + "; ".join(blocked)))
            continue
        cand = ctx.for_candidate(prof.name)
        before = len(ctx.evidence.gates)
        try:
            inner, full = prove(cand), ""
        except NoCapacity as exc:
            inner, full = None, str(exc)
        added = ctx.evidence.gates[before:]
        del ctx.evidence.gates[before:]
        named, why = _judged(prof.name, added, out=inner is None)
        ctx.evidence.add_gates(*named)
        if inner is not None:  # its gates are derived again from it (runbook verify --recompute)
            cand.evidence.write_json(CANARY_RECORD, inner.record().model_dump(mode="json", by_alias=True))
        if inner is None or why:
            fates.append(_fate(ctx, prof, "no_capacity" if inner is None else "failed", full or why))
            continue
        dry = bool(getattr(inner, "dry_run", False))
        fates.append(_fate(ctx, prof, "planned" if dry else "proved",
                           "dry-run: its canary is planned, nothing was launched" if dry else
                           "its canary ran and passed every blocking gate; it races in phase 04"))
        proven[prof.name] = inner
    return Raced(proven=proven, fates=tuple(fates), retry_at=_race_gate(ctx, fates, proven, now))


def _race_gate(ctx: PhaseContext, fates: Sequence[CandidateFate], proven: Mapping[str, object],
               now: Callable[[], datetime]) -> str | None:
    """Add :data:`RACE_GATE`; the retry time when nothing was proven and a candidate had no capacity."""
    said = "; ".join(f"{f.name}: {f.outcome}" for f in fates)
    waiting = [f for f in fates if f.outcome == "no_capacity"]
    retry = None
    if proven:
        ok: bool | None = True
        detail = f"{len(proven)} of {len(fates)} candidates proven on their canaries ({said}); phase 04 races them"
    elif waiting:
        ok = None
        wait = max((budget_s(p) for p in ctx.mig.targets if p.name in {f.name for f in waiting}), default=0.0) \
            or OfferSpec.model_fields["capacity_budget_s"].default
        retry = (now() + timedelta(seconds=wait)).strftime("%Y-%m-%dT%H:%M:%SZ")
        detail = f"no candidate proven ({said}); try again at or after {retry}: run the same params again"
    else:
        ok = False
        detail = f"no candidate passed its canary ({said})"
    ctx.evidence.add_gates(g.boolean_gate(RACE_GATE, ok, phase="03", detail=detail,
                                          source="issue 50: a candidate that fails parity is out, with its reason"))
    return retry
