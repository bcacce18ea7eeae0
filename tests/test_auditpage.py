"""The report's first page from a receipt written by hand (values chosen here, not produced by a
run): formatted with units, every string escaped, links to the phase sections, no index column."""

from __future__ import annotations

from runbook_lib.evidence.auditpage import SealStatus, first_page, fmt
from runbook_lib.evidence.records import Delta, DrillRow, Receipt, ReceiptResources, ResourceRow, RollbackPoint
from runbook_lib.gates import GateResult

SECTIONS = {p: f"phase-{p}_x" for p in ("01", "02", "03", "04", "05", "06")}


def _receipt(**over) -> Receipt:
    latency = GateResult("latency_p95_ratio", "PASS", True, 1.05, 1.10, "ratio", "p95 ratio", "within",
                         interval=(0.98, 1.12), phase="04")
    slow = GateResult("cold_start_ratio", "FAIL", False, 1.6, 1.25, "ratio", "median ratio", "<b>slower</b>",
                      phase="04")
    fields = dict(
        migration="<script>alert(1)</script>", decision="GO", decided_at="2026-12-04T20:00:00Z",
        reasons=["all 2 blocking gates PASS", "scored: cold <i>start</i>"],
        acceptance_deltas=(Delta(metric="total p95 (s)", source=0.1234, target=0.1296, ratio=1.05, verdict="PASS",
                                 gate="latency_p95_ratio"),
                           Delta(metric="usd_per_accepted_unit", source=0.0012, target=0.00096, ratio=0.8,
                                 verdict="PASS"),
                           Delta(metric="throughput mean (units/s)", source=41.5, target=40.25, ratio=0.97)),
        drills=(DrillRow(drill="redeliver", expectation="once", observation="ran 1 time(s)", verdict="PASS",
                         blocking=True, seconds=1.0),),
        rollback_point=RollbackPoint(route="route-a", source_release="embed-api:2.3.1", frozen_prefix="frozen/x",
                                     frozen_manifest_sha256="ab" * 32, window_s=3600.0,
                                     window_closes_epoch=1796414400.0, source_provider="local",
                                     rollback_owner="oncall"),
        resources=ReceiptResources(created=(ResourceRow(id="pod-1", kind="pod", side="target", role="canary",
                                                        phase="03", state="DESTROYED"),),
                                   destroyed=("pod-1",)),
        gates=(latency, slow))
    return Receipt(**(fields | over))


def test_numbers_carry_their_units() -> None:
    assert fmt(0.1234, "s") == "123.4 ms" and fmt(2.5, "s") == "2.50 s" and fmt(None, "s") == "-"
    assert fmt(0.0012, "USD") == "$0.0012" and fmt(1.05, "ratio") == "1.050x" and fmt(40.25, "/s") == "40.25 /s"
    assert fmt(float("nan"), "USD") == "-" and fmt(0.5, "fraction") == "50.0 %"


def test_the_first_page_says_what_an_auditor_needs_escaped_and_linked() -> None:
    page = first_page(_receipt(), SealStatus(kind="closed", files=41, signed_by=("ab12cd",)), SECTIONS)
    assert "Decision: <b>GO</b> at 2026-12-04T20:00:00Z" in page
    assert "<script" not in page and "&lt;i&gt;start&lt;/i&gt;" in page and "&lt;b&gt;slower&lt;/b&gt;" in page
    assert "closed-world seal over 41 files" in page and "<code>ab12cd</code>" in page and "verify --key" in page
    assert "Every hash of this run's evidence verified" in page
    # p95: 123.4 ms -> 129.6 ms, overall ratio 1.050x, the gate's own estimate 1.050x and its interval
    # [0.980x, 1.120x], linked to phase 04
    assert ("<td>total p95</td><td>123.4 ms</td><td>129.6 ms</td><td>1.050x</td><td>1.050x</td>"
            "<td>[0.980x, 1.120x]</td><td><a href='#phase-04_x'>latency_p95_ratio</a></td>") in page
    assert "<td>41.50 /s</td><td>40.25 /s</td><td>0.970x</td><td>-</td><td>-</td>" in page  # its gate not in the receipt
    assert "as the gate judged it" in page
    assert "per accepted unit: source $0.0012, target $0.00096 (0.800x)" in page
    assert "2 gates: 1 FAIL, 1 PASS" in page and "cold_start_ratio</a></td><td><span class='verdict verdict-FAIL'>" in page
    assert "<a href='#phase-04_x'>redeliver</a>" in page and "<a href='#phase-05_x'>Rollback point</a>" in page
    assert "1 hour" not in page and "1.00 s" not in page and "3600.00 s, closes 2026-12-04T20:00:00Z" in page
    assert "1 created, 1 destroyed" in page and "nothing left billing after phase 06" in page
    assert "<th></th><th>id</th>" not in page  # no index column before the first


def test_an_unsigned_legacy_run_and_what_it_left_billing_are_said_plainly() -> None:
    left = ResourceRow(id="i-9", kind="pod", side="target", state="RUNNING", should_be_gone=True)
    receipt = _receipt(resources=ReceiptResources(created=(left,), remaining=(left,)), rollback_point=None,
                       acceptance_deltas=(), drills=())
    page = first_page(receipt, SealStatus(kind="legacy", files=0, problems=("x: altered",)), {})
    assert "legacy seal" in page and "<b>not signed</b>" in page and "<b>1 verify problem(s)</b>" in page
    assert "<b>1 still there after phase 06</b>: <code>i-9</code>" in page
    assert "none recorded: the run did not cut over" in page and "did not reach the comparison" in page
    assert "<a " not in page  # no section to link to


def test_a_phase_table_is_shown_without_its_index_column() -> None:
    import pandas as pd

    from runbook_lib.phases.results import table_bundle

    bundle = table_bundle(pd.DataFrame([{"gate": "a", "verdict": "PASS"}, {"gate": "b", "verdict": "FAIL"}]))
    assert bundle is not None and "<th>gate</th>" in bundle["text/html"] and "<th></th>" not in bundle["text/html"]
    assert bundle["text/plain"].splitlines()[0].split() == ["gate", "verdict"]  # no row numbers
    assert table_bundle("**markdown**") is None


def test_a_gate_table_marks_each_verdict_in_colour_and_in_text() -> None:
    # README: "gate tables mark verdicts in colour and text" (a reader without colour still reads them)
    from runbook_lib.evidence.report import VERDICT_COLORS, gates_table
    from runbook_lib.gates import GateResult

    gates = [GateResult(f"g{i}", v, True, None, None, "", "", "") for i, v in enumerate(VERDICT_COLORS)]
    html = gates_table(gates).to_html()
    for v, colour in VERDICT_COLORS.items():
        assert f">{v}</td>" in html and f"background-color: {colour}" in html and f"verdict-{v}" in html
    assert len(set(VERDICT_COLORS.values())) == len(VERDICT_COLORS)  # no two verdicts share a colour
    assert "<style" not in html and "#T_" not in html  # colours inline: no stylesheet that could show as text


def test_the_first_page_carries_the_savings_forecast() -> None:
    from runbook_lib.evidence.records import SavingsForecast

    f = SavingsForecast(traffic_per_s=20.0, source_usd_per_month=1460.0, target_usd_per_month=1338.33,
                        saving_usd_per_month=121.67, saving_fraction=0.0833, saving_interval=(-0.004, 0.164),
                        cheaper_at_traffic="target", break_even_per_s=11.0)
    page = first_page(_receipt(forecast=f), SealStatus(kind="closed", files=41), SECTIONS)
    assert ("Forecast at 20 requests/s: source $1,460.00 a month, target $1,338.33 a month; saving $121.67 "
            "a month, 8.3% per accepted unit (90 % interval over rounds -0.4% to 16.4%); cheaper there: target; the "
            "costs per accepted unit cross at 11 requests/s") in page
    assert "Forecast" not in first_page(_receipt(), SealStatus(kind="closed", files=41), SECTIONS)


def test_the_first_page_leads_with_a_resolution_and_says_when_it_is_unsigned_on_a_signed_run() -> None:
    from runbook_lib.evidence.auditpage import DecisionShown

    receipt = _receipt(decision="HOLD", hold_deadline="2026-03-01T13:00:00Z")
    res = {"decision": "NO-GO", "by": "alice <ops>", "resolved_at": "2026-03-01T12:30:00Z", "reason": "too slow",
           "kind": "person"}
    page = first_page(receipt, SealStatus(kind="closed", files=41, signed_by=("ab12cd",)), SECTIONS,
                      DecisionShown("NO-GO", "HOLD resolved by alice", res, (), run_signed=True))
    lead = page.split("</p>", 1)[0]
    assert "Decision: <b>NO-GO</b>, resolved by alice &lt;ops&gt; at 2026-03-01T12:30:00Z: too slow" in lead
    assert "resolution NOT SIGNED, on a signed run" in page and "sealed by phase 06 as <b>HOLD</b>" in page
    assert "hold deadline" not in page  # resolved: the deadline no longer applies
    signed = first_page(receipt, SealStatus(kind="closed", files=41), SECTIONS,
                        DecisionShown("NO-GO", "", res, ("9f00aa",), run_signed=True))
    assert "resolution signed by key 9f00aa" in signed and "NOT SIGNED" not in signed
    expired = first_page(receipt, SealStatus(kind="closed", files=41), SECTIONS,
                         DecisionShown("NO-GO", "hold expired at 2026-03-01T13:00:00Z"))
    assert "Decision: <b>NO-GO</b> (hold expired at 2026-03-01T13:00:00Z)" in expired
    assert "Sealed by phase 06 as <b>HOLD</b>" in expired


def test_a_tables_row_labels_become_a_labelled_first_column_and_row_numbers_stay_out() -> None:
    import pandas as pd

    from runbook_lib.phases.results import table_bundle

    by_side = pd.DataFrame.from_dict({"source": {"usd_per_hour": 0.2}, "target": {"usd_per_hour": 0.1}},
                                     orient="index")  # labels in the index, as a dict-built table has them
    lines = table_bundle(by_side)["text/plain"].splitlines()
    assert lines[0].split() == ["item", "usd_per_hour"] and lines[1].split()[0] == "source"
    named = table_bundle(by_side.rename_axis("side"))["text/plain"].splitlines()
    assert named[0].split() == ["side", "usd_per_hour"]
    filtered = pd.DataFrame({"gate": ["a", "b", "c"], "verdict": ["PASS", "FAIL", "PASS"]})
    filtered = filtered[filtered["verdict"] == "PASS"]  # keeps row numbers 0 and 2
    assert table_bundle(filtered)["text/plain"].splitlines()[0].split() == ["gate", "verdict"]
