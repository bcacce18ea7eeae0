"""The source's schedules through the phases (:mod:`runbook_lib.traffic.schedules`): phase 01
reads each one, phase 02 maps it to its target equivalent, phase 05 points every one at the
target after the last cutover step passed (an approved plan, shown before its approval cell)
and reads it back, and a rollback points it back at the source: phase 05's own when a schedule
could not be moved, phase 06's on NO-GO or HOLD. The receipt lists each schedule's side at every
step."""

from __future__ import annotations

from runbook_lib import gates as g
from runbook_lib.errors import ProviderError
from runbook_lib.evidence.records import (
    ADAPTER,
    EQUIVALENT,
    NONE,
    DependencyRow,
    FreezeData,
    ReceiptSchedule,
    ScheduleRow,
    ScheduleShift,
)
from runbook_lib.phases import PhaseContext
from runbook_lib.providers.base import Plan
from runbook_lib.traffic import schedules as sch

UNREADABLE = "unreadable"
ACTION = "point_schedules"
"""The plan action of phase 05's schedule change (:func:`plan`)."""


def declared(ctx: PhaseContext) -> list[sch.Schedule]:
    """``source.schedules`` as :mod:`runbook_lib.traffic.schedules` objects, relative paths and
    commands under the project."""
    return [sch.make(p, project=ctx.run.project) for p in ctx.mig.source.schedules]


def _row(state: sch.ScheduleState) -> ScheduleRow:
    return ScheduleRow(name=state.name, kind=state.kind, side=state.side, cadence=state.cadence, detail=state.detail)


def freeze(ctx: PhaseContext) -> tuple[ScheduleRow, ...]:
    """Phase 01: each schedule as read now; one that cannot be read is recorded ``unreadable``
    with the error (phase 02 then finds no equivalent for it)."""
    rows = []
    for s in declared(ctx):
        try:
            rows.append(_row(s.read()))
        except ProviderError as exc:
            rows.append(ScheduleRow(name=s.name, kind=s.kind, side=UNREADABLE, detail=str(exc)))
    return tuple(rows)


def mapping_rows(ctx: PhaseContext, rec: FreezeData) -> list[DependencyRow]:
    """Phase 02: one dependency row per frozen schedule. ``no equivalent`` (blocking) when it
    did not start the source at freeze, could not be read, or its target equivalent (the target's
    DAG, the Variable, the read-back command) is missing; ``adapter needed`` when the target's
    runs at other times than the source's."""
    out = []
    by_name = {s.name: s for s in declared(ctx)}
    for row in rec.schedules:
        dep, src = f"schedule {row.name} ({row.kind})", row.detail
        if row.side != sch.SOURCE:
            why = (f"it could not be read at freeze: {row.detail}" if row.side == UNREADABLE else
                   f"at freeze it started {row.side}, not the source, so there is no source schedule to move")
            out.append(DependencyRow(dependency=dep, source=src, target="-", status=NONE,
                                     reason=f"{why}; point it at the source (or remove it from source.schedules) and "
                                            "run phase 01 again"))
            continue
        try:
            eq = by_name[row.name].equivalent()
        except (KeyError, ProviderError) as exc:
            out.append(DependencyRow(dependency=dep, source=src, target="-", status=NONE,
                                     reason=f"no target equivalent: {exc}; deploy it (paused) before cutover"))
            continue
        out.append(DependencyRow(dependency=dep, source=src, target=eq.target,
                                 status=ADAPTER if eq.same_cadence is False else EQUIVALENT,
                                 reason=f"phase 05 points it at the target after the last cutover step: {eq.reason}"))
    return out


def plan(ctx: PhaseContext) -> Plan | None:
    """Phase 05's schedule change as a plan to approve (None without schedules): a change
    outside any provider (a DAG paused, a crontab edited), so ``approvals.preapproved_local``
    never covers it."""
    if not ctx.mig.source.schedules:
        return None
    names = ", ".join(f"{p.name} ({p.kind})" for p in ctx.mig.source.schedules)
    return Plan(provider="schedules", action=ACTION, spec=None, cost_usd_per_hour=0.0, dry_run=False,
                target=f"{ctx.mig.migration}: point {names} at the target after the last cutover step")


def _shifts(done: list[sch.Shifted]) -> tuple[ScheduleShift, ...]:
    return tuple(ScheduleShift(name=s.name, kind=s.kind, to=s.to, before=s.before, after=s.after, detail=s.detail,
                               error=s.error) for s in done)


def move(ctx: PhaseContext, moved: bool) -> tuple[ScheduleShift, ...]:
    """Phase 05, after the slices: when the cutover ``moved`` (every step passed), point every
    schedule at the target and read it back; if any did not move, point them all back at the
    source. Adds the gate ``schedules_moved`` (blocking). Returns every shift made, in order."""
    if not ctx.mig.source.schedules or not moved:  # a cutover that did not complete leaves them on the source
        return ()
    todo = declared(ctx)
    there = sch.shift(todo, sch.TARGET)
    failed = [s for s in there if not s.ok]
    back = sch.shift(todo, sch.SOURCE) if failed else []
    detail = (f"{len(there)} schedule(s) now start the target: " + "; ".join(f"{s.name}: {s.detail}" for s in there)
              if not failed else
              f"not moved: {'; '.join(f'{s.name}: {s.error}' for s in failed)}; pointed back at the source: "
              + "; ".join(f"{s.name} {'ok' if s.ok else s.error}" for s in back))
    ctx.evidence.add_gates(g.boolean_gate("schedules_moved", not failed, phase="05", detail=detail,
                                          source="seed 001: shift scheduled jobs while the source remains available"))
    return _shifts(there + back)


def restore(ctx: PhaseContext, decision: str) -> list[sch.Shifted]:
    """Phase 06: on NO-GO or HOLD, point every schedule that does not start the source back at
    it (gate ``schedules_restored``, blocking); on GO, read them as they are. Returns the last
    read or shift of each schedule."""
    todo = declared(ctx)
    if not todo:
        return []
    if decision == "GO":
        out = []
        for s in todo:
            try:
                st = s.read()
                out.append(sch.Shifted(s.name, s.kind, sch.TARGET, st.side, st.side, st.detail))
            except ProviderError as exc:
                out.append(sch.Shifted(s.name, s.kind, sch.TARGET, "", "", "", str(exc)))
        return out
    back = sch.shift(todo, sch.SOURCE)
    # Restored: each one phase 05 may have moved. Without a phase 05 record nothing moved them, so
    # one that cannot be read now is not counted as left on the target.
    ran05 = ctx.records.get("05") is not None
    moved = [s for s in back if s.before != sch.SOURCE and (s.before or ran05)]
    if moved:
        failed = [s for s in back if not s.ok]
        ctx.evidence.add_gates(g.boolean_gate(
            "schedules_restored", not failed, phase="06",
            detail=(f"{decision}: pointed back at the source: " + "; ".join(f"{s.name}: {s.detail}" for s in moved)
                    if not failed else f"{decision}: still not on the source: "
                    + "; ".join(f"{s.name}: {s.error}" for s in failed) + "; point them back by hand now"),
            source="runbook_lib/phases/schedules.py: restore"))
    return back


def receipt_rows(ctx: PhaseContext, final: list[sch.Shifted]) -> tuple[ReceiptSchedule, ...]:
    """The receipt's ``schedules``: each schedule's side at freeze, after phase 05 and now."""
    frozen = {r.name: r for r in (ctx.records.freeze.schedules if ctx.records.freeze else ())}
    cut = ctx.records.cutover
    after: dict[str, str] = {}
    for shifted in (cut.cutover.schedules if cut is not None else ()):
        after[shifted.name] = shifted.after  # the last shift of each schedule in phase 05 wins
    out = []
    for s in final:
        f = frozen.get(s.name)
        out.append(ReceiptSchedule(name=s.name, kind=s.kind, cadence=f.cadence if f else "",
                                   frozen=f.side if f else "", after_cutover=after.get(s.name, ""),
                                   final=s.after or UNREADABLE, detail=s.error or s.detail))
    return tuple(out)
