"""The report's first page: what an auditor reads before the phases.

From ``receipt.json`` (:class:`runbook_lib.evidence.records.Receipt`) and the run's seal: the decision and
its reasons, the seal and signature status, each acceptance delta with the interval and verdict
of the gate that judges it, the cost, the drills, the rollback point and the resources created
and destroyed, each part linking to the phase section that holds its evidence. Numbers carry
their units; tables have no index column. Every string from the run is escaped: the page is
built from strings, never from notebook outputs.
"""

from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

from runbook_lib._fmt import money, number
from runbook_lib.evidence.records import Delta, Receipt

METRIC_UNITS: dict[str, str] = {
    "total p50 (s)": "s", "total p95 (s)": "s", "total p99 (s)": "s", "throughput mean (units/s)": "/s",
    "cold_start_median_s": "s", "usd_per_accepted_unit": "USD",
}
"""The unit of each acceptance delta's metric (``runbook_lib.phases.decide``'s deltas)."""
METRIC_GATES: dict[str, str] = {
    "total p95 (s)": "latency_p95_ratio", "throughput mean (units/s)": "throughput_ratio",
    "cold_start_median_s": "cold_start_ratio", "usd_per_accepted_unit": "cost_per_accepted_unit",
}
"""The gate that judges each metric, for receipts written before a delta named its gate."""
PHASE_OF_GATE_PREFIX = {"drill_": "04"}


@dataclass(frozen=True)
class SealStatus:
    """What the first page says of the evidence: the seal's kind (``closed``, ``legacy``,
    ``none``: :func:`runbook_lib.evidence.closedworld.seal_kind`), the files it lists, whether every hash
    verified when the page was written (with the problems), and the key ids of the signatures
    (unchecked: ``runbook verify --key`` checks them)."""

    kind: str
    files: int
    problems: tuple[str, ...] = ()
    signed_by: tuple[str, ...] = ()


def fmt(value: float | None, unit: str) -> str:
    """``value`` with its unit for a reader: seconds under one as milliseconds, USD as currency
    (:func:`runbook_lib.evidence.cells.money`: cents from a dollar up, else three significant
    digits, never an exponent), rates per second, ratios as ``x``; None or NaN as a dash."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if unit == "s":
        return f"{value * 1000:.1f} ms" if abs(value) < 1 else f"{value:.2f} s"
    if unit == "USD":
        return money(value)
    if unit == "/s":
        return f"{value:.2f} /s"
    if unit == "ratio":
        return f"{value:.3f}x"
    if unit == "fraction":
        return f"{value * 100:.1f} %"
    return f"{number(value)} {unit}".strip()


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "") -> str:
    """An HTML table of already-escaped cells, no index column."""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table class='{cls}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _link(sections: dict[str, str], phase: str | None, text: str) -> str:
    anchor = sections.get(phase or "")
    return f"<a href='#{_e(anchor)}'>{_e(text)}</a>" if anchor else _e(text)


def _verdict(v: str | None) -> str:
    return f"<span class='verdict verdict-{_e(v)}'>{_e(v)}</span>" if v else "-"


def _evidence(seal: SealStatus) -> str:
    kind = {"closed": f"closed-world seal over {seal.files} files: a file added, changed or removed is named by "
                      "<code>runbook verify</code>",
            "legacy": "legacy seal (made before closed-world seals): the files it lists are checked, others are not",
            "none": "not sealed"}.get(seal.kind, _e(seal.kind))
    checked = ("Every hash of this run's evidence verified (<code>runbook verify</code>) when this report was written"
               if not seal.problems else
               f"<b>{len(seal.problems)} verify problem(s)</b> when this report was written")
    signed = ("signed (in-toto statements in DSSE envelopes: a Test Result per phase, a Simple Verification Result "
              f"for the decision) by key id(s) {', '.join(f'<code>{_e(k)}</code>' for k in seal.signed_by)}"
              "; check it with <code>runbook verify --key PUBKEY</code>" if seal.signed_by else
              "<b>not signed</b>: integrity only, anyone who can write the run directory could reseal it")
    return f"<h3>Evidence</h3><ul><li>{kind}</li><li>{checked}</li><li>{signed}</li></ul>"


def _deltas(receipt: Receipt, sections: dict[str, str]) -> str:
    gates = {g.name: g for g in receipt.gates}
    rows = []
    for d in receipt.acceptance_deltas:
        unit = METRIC_UNITS.get(d.metric, "")
        name = _gate_name(d)
        gate = gates.get(name) if name else None
        interval = (f"[{fmt(gate.interval[0], 'ratio')}, {fmt(gate.interval[1], 'ratio')}]"
                    if gate is not None and gate.interval else "-")
        judged = (fmt(float(gate.observed), "ratio") if gate is not None and gate.interval
                  and isinstance(gate.observed, (int, float)) and not isinstance(gate.observed, bool) else "-")
        shown = d.metric.removesuffix(" (s)").removesuffix(" (units/s)")  # the values carry their units
        rows.append([_e(shown), fmt(d.source, unit), fmt(d.target, unit), fmt(d.ratio, "ratio"), judged, interval,
                     _link(sections, gate.phase if gate else "04", name) if name else "-", _verdict(d.verdict)])
    if not rows:
        return "<h3>Acceptance deltas</h3><p>none: the run did not reach the comparison (phase 04)</p>"
    return ("<h3>Acceptance deltas</h3><p>source and target over every completed request of the measurement; the "
            "gate judges its own statistic (for a sequential gate, the rounds' ratios up to where it stopped), so its "
            "estimate and its interval are given beside the overall ratio, and one slow round can move the overall "
            "ratio far more than the gate's</p>"
            + _table(["metric", "source", "target", "target / source (overall)", "as the gate judged it",
                      "gate's interval", "gate", "verdict"], rows))


def _gate_name(d: Delta) -> str | None:
    return d.gate or METRIC_GATES.get(d.metric)


def _cost(receipt: Receipt, sections: dict[str, str]) -> str:
    cost = next((d for d in receipt.acceptance_deltas if d.metric == "usd_per_accepted_unit"), None)
    if cost is None or (cost.source is None and cost.target is None):
        return "<h3>Cost</h3><p>no cost per accepted unit was measured</p>"
    return (f"<h3>Cost</h3><p>per accepted unit: source {fmt(cost.source, 'USD')}, target {fmt(cost.target, 'USD')} "
            f"({fmt(cost.ratio, 'ratio')}), judged by "
            f"{_link(sections, '04', 'cost_per_accepted_unit')} {_verdict(cost.verdict)}</p>" + _forecast(receipt))


def _forecast(receipt: Receipt) -> str:
    """The savings forecast's line: monthly costs at the declared traffic, the saving with its
    interval, the break-even traffic."""
    f = receipt.forecast
    if f is None:
        return ""
    share = f"{f.saving_fraction:.1%}" if f.saving_fraction is not None else "n/a"
    interval = (f" (90 % interval over rounds {f.saving_interval[0]:.1%} to {f.saving_interval[1]:.1%})"
                if f.saving_interval else "")
    even = (f"the costs per accepted unit cross at {f.break_even_per_s:.3g} requests/s" if f.break_even_per_s is not None
            else "one side is cheaper at every traffic both can serve")
    return (f"<p>Forecast at {f.traffic_per_s:.3g} requests/s: source {money(f.source_usd_per_month)} a month, target "
            f"{money(f.target_usd_per_month)} a month; saving {money(f.saving_usd_per_month)} a month, {_e(share)} "
            f"per accepted unit{interval}; cheaper there: {_e(f.cheaper_at_traffic)}; {even}</p>")


def _gates(receipt: Receipt, sections: dict[str, str]) -> str:
    counts: dict[str, int] = {}
    for g in receipt.gates:
        counts[g.verdict] = counts.get(g.verdict, 0) + 1
    summary = ", ".join(f"{n} {_e(v)}" for v, n in sorted(counts.items()))
    notable = [[_link(sections, g.phase, g.name), _verdict(g.verdict), "blocking" if g.blocking else "scored",
                _e(g.detail[:300])] for g in receipt.gates if g.verdict != "PASS"]
    table = _table(["gate", "verdict", "", "detail"], notable) if notable else "<p>every gate PASS</p>"
    return f"<h3>Gates</h3><p>{len(receipt.gates)} gates: {summary or 'none'}</p>{table}"


def _drills(receipt: Receipt, sections: dict[str, str]) -> str:
    if not receipt.drills:
        return "<h3>Fault drills</h3><p>none run</p>"
    rows = [[_link(sections, "04", d.drill), _verdict(d.verdict), "blocking" if d.blocking else "scored",
             _e(d.observation[:300])] for d in receipt.drills]
    return "<h3>Fault drills</h3>" + _table(["drill", "verdict", "", "observation"], rows)


def _rollback(receipt: Receipt, sections: dict[str, str]) -> str:
    rp = receipt.rollback_point
    if rp is None:
        return "<h3>Rollback point</h3><p>none recorded: the run did not cut over (phase 05)</p>"
    closes = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(rp.window_closes_epoch)) if rp.window_closes_epoch else "-"
    rows = [["route", _e(rp.route)], ["source release", _e(rp.source_release)],
            ["source", _e(f"{rp.source_provider} {rp.source_endpoint or ''}".strip())],
            ["frozen artifact", f"<code>{_e(rp.frozen_prefix)}</code> (manifest sha256 <code>{_e(rp.frozen_manifest_sha256[:16])}</code>...)"],
            ["rollback window", f"{fmt(rp.window_s, 's')}, closes {_e(closes)}"], ["owner", _e(rp.rollback_owner)]]
    return f"<h3>{_link(sections, '05', 'Rollback point')}</h3>" + _table(["", ""], rows)


def _resources(receipt: Receipt, sections: dict[str, str]) -> str:
    res = receipt.resources
    rows = [[f"<code>{_e(r.id)}</code>", _e(r.kind), _e(r.side), _e(r.role or "-"),
             _link(sections, r.phase, r.phase or "-"), _e(r.state)] for r in res.created]
    left = (f"<p><b>{len(res.remaining)} still there after phase 06</b>: "
            f"{', '.join(f'<code>{_e(r.id)}</code>' for r in res.remaining)}</p>" if res.remaining else
            "<p>nothing left billing after phase 06</p>")
    created = _table(["id", "kind", "side", "role", "phase", "state"], rows) if rows else "<p>none created</p>"
    return (f"<h3>{_link(sections, '06', 'Resources')}</h3><p>{len(res.created)} created, {len(res.destroyed)} "
            f"destroyed</p>{created}{left}")


@dataclass(frozen=True)
class DecisionShown:
    """The decision the first page leads with, when it is not simply the receipt's: a HOLD a
    person (or the deadline) resolved, a HOLD whose deadline passed, or a ``resolution.json`` that
    may not resolve the run (``ignored``, with why).

    Attributes:
        decision: the effective decision (``GO``, ``NO-GO``, ``HOLD``).
        note: how it came about (``HOLD resolved by alice at ...``), or why a resolution is ignored.
        resolution: the resolution's body when it applies (by, resolved_at, reason, kind).
        signed_by: key ids that signed the resolution; empty: not signed.
        run_signed: the run's seal is signed, so an unsigned resolution is shown as such.
    """

    decision: str
    note: str = ""
    resolution: dict[str, Any] | None = None
    signed_by: tuple[str, ...] = ()
    run_signed: bool = False


def _decision_line(receipt: Receipt, shown: DecisionShown | None) -> str:
    """The first page's decision: the effective one first, then what phase 06 sealed when a
    resolution changed it; an unsigned resolution on a signed run is never shown as verified."""
    sealed = (f"<b>{_e(receipt.decision)}</b>{' at ' + _e(receipt.decided_at) if receipt.decided_at else ''}")
    if shown is None or (shown.decision == receipt.decision and shown.resolution is None and not shown.note):
        return f"<p class='decision'>Decision: {sealed}</p>"
    if shown.resolution is None:  # an expired HOLD, or a resolution that may not apply
        return (f"<p class='decision'>Decision: <b>{_e(shown.decision)}</b> ({_e(shown.note)})</p>"
                f"<p>Sealed by phase 06 as {sealed}</p>")
    res = shown.resolution
    reason = f": {_e(res.get('reason'))}" if res.get("reason") else ""
    if shown.signed_by:
        signed = f"resolution signed by key {_e(', '.join(shown.signed_by))}"
    else:
        signed = ("resolution NOT SIGNED, on a signed run: the seal's signature does not cover it, so this "
                  "decision is a person's word, not verified evidence" if shown.run_signed else
                  "resolution not signed")
    return (f"<p class='decision'>Decision: <b>{_e(shown.decision)}</b>, resolved by {_e(res.get('by'))} at "
            f"{_e(res.get('resolved_at'))}{reason}</p><p class='resolution'>{signed}; sealed by phase 06 as "
            f"{sealed}</p>")


def first_page(receipt: Receipt, seal: SealStatus, sections: dict[str, str],
               shown: DecisionShown | None = None) -> str:
    """The first page as an HTML ``<div id="runbook-first-page">``: decision and reasons,
    evidence (seal, verification, signature), acceptance deltas with their gates' intervals, cost,
    gates that did not pass, drills, rollback point, resources.

    Args:
        receipt: the run's receipt.
        seal: the seal's status (:class:`SealStatus`).
        sections: phase (``"04"``) -> the id of its section in the report, for links.
        shown: the effective decision when a resolution (or an expired deadline) changed it.
    """
    reasons = "".join(f"<li>{_e(r)}</li>" for r in receipt.reasons)
    resolved = shown is not None and shown.resolution is not None
    deadline = f"<p>hold deadline: {_e(receipt.hold_deadline)}</p>" if receipt.hold_deadline and not resolved else ""
    return ("<div id='runbook-first-page'>"
            f"{_decision_line(receipt, shown)}{deadline}<ul>{reasons}</ul>"
            f"<p>Source: {_e(receipt.source.release)} ({_e(receipt.source.provider)})<br>"
            f"Target: {_e(receipt.target.release)} ({_e(receipt.target.provider)})</p>"
            + _evidence(seal) + _deltas(receipt, sections) + _cost(receipt, sections) + _gates(receipt, sections)
            + _drills(receipt, sections) + _rollback(receipt, sections) + _resources(receipt, sections)
            + "</div>")
