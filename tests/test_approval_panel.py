"""The approval cell: what approves a plan, as text that survives saving and export; a click
writes the record the next cell's :func:`runbook_lib.evidence.approvals.require` finds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runbook_lib.errors import ApprovalRequired, UsageError
from runbook_lib.evidence.approvals import ALTERNATE_ACTION, approval_widget, find, require, require_all, standing
from runbook_lib.providers.base import Plan


def _plan(provider: str = "vast") -> Plan:
    return Plan(provider=provider, action="destroy", target="i-123", spec=None, cost_usd_per_hour=0.5,
                dry_run=False)


def test_standing_says_what_approves_a_plan_in_require_order(tmp_path: Path) -> None:
    plan = _plan()
    waiting = standing(plan, run_dir=tmp_path, preapproved_local=True)  # local pre-approval does not cover vast
    assert waiting.startswith("Awaiting approval: destroy 'i-123' on 'vast'")
    assert f"runbook approve reports/{tmp_path.name} --by NAME" in waiting
    assert standing(_plan("local"), run_dir=tmp_path, preapproved_local=True).startswith("Approved by params")
    assert "loopback simulator" in standing(plan, run_dir=tmp_path, preapproved_local=False,
                                            preapproved_simulator=True)
    f = tmp_path / "approval.json"
    f.write_text(json.dumps({"fingerprints": [plan.fingerprint], "approved_by": "dana",
                             "approved_at": "2026-12-01T00:00:00Z"}))
    assert "by dana at 2026-12-01T00:00:00Z" in standing(plan, run_dir=tmp_path, preapproved_local=False,
                                                          approval_file=str(f))
    assert not list((tmp_path / "approvals").glob("*.json"))  # looking wrote nothing


def test_a_click_writes_the_record_the_next_cell_finds(tmp_path: Path) -> None:
    plan = _plan()
    panel = approval_widget(plan, run_dir=tmp_path, interactive=True)
    assert panel.text.startswith("Awaiting approval")
    with pytest.raises(ApprovalRequired):  # the next cell, before the click: HOLD
        require(plan, run_dir=tmp_path, preapproved_local=False)
    [path] = panel.click(by="dana")
    assert json.loads(path.read_text())["approval"]["approved_by"] == "dana"
    assert panel.text.startswith("Approved: destroy 'i-123'") and "by dana" in panel.text
    a = require(plan, run_dir=tmp_path, preapproved_local=False)  # the next cell, after the click
    assert (a.approved_by, a.method) == ("dana", "widget")
    again = approval_widget(plan, run_dir=tmp_path, interactive=True)  # re-running the cell: no button
    assert again.text.startswith("Approved:") and "(widget)" in again.text


def test_one_click_approves_every_plan_a_step_applies_and_the_step_checks_them_all_first(tmp_path: Path) -> None:
    plans = [_plan("vast"), Plan(provider="vast", action="create_endpoint", target="m-endpoint-target", spec=None,
                                 cost_usd_per_hour=1.25, dry_run=False), _plan("local")]
    with pytest.raises(ApprovalRequired, match=r"2 of the 3 plans this step applies") as held:
        require_all(plans, run_dir=tmp_path, preapproved_local=True)
    assert "nothing was created" in str(held.value)
    pending = sorted(p.name for p in (tmp_path / "approvals").glob("pending-*.json"))
    assert pending == sorted(f"pending-{p.fingerprint[:16]}.json" for p in plans[:2])  # one `runbook approve` covers both
    assert not [p for p in (tmp_path / "approvals").glob("*.json") if not p.name.startswith("pending-")]

    panel = approval_widget(plans, run_dir=tmp_path, interactive=True, preapproved_local=True)
    assert [p.fingerprint for p in panel.waiting] == [p.fingerprint for p in plans[:2]]
    assert panel.text.splitlines()[2].startswith("Approved by params")
    paths = panel.click(by="dana")
    assert len(paths) == 2 and not panel.waiting
    assert all(line.startswith("Approved") for line in panel.text.splitlines())
    require_all(plans, run_dir=tmp_path, preapproved_local=True)  # the next cell: nothing waits
    assert not list((tmp_path / "approvals").glob("pending-*.json"))  # approved plans wait no longer
    html = panel.static_forms(panel.text)["text/html"]
    assert html.count("<p ") == 3 and "#9a6700" not in html  # one green line per plan


def test_a_step_that_applies_no_plan_says_so(tmp_path: Path) -> None:
    panel = approval_widget([], run_dir=tmp_path, interactive=True)
    assert panel.text.startswith("Nothing to approve") and not panel.waiting and panel.click() == []


def test_the_static_forms_carry_the_text_and_no_script(tmp_path: Path) -> None:
    panel = approval_widget(_plan(), run_dir=tmp_path, interactive=False)
    bundle = panel.static_forms(panel.text + " <script>alert(1)</script>")
    assert bundle["text/plain"].startswith("Awaiting approval")
    assert "<script>" not in bundle["text/html"] and "&lt;script&gt;" in bundle["text/html"]


def test_a_hold_says_what_to_decide_and_the_commands() -> None:
    from runbook_lib.evidence.records import Receipt
    from runbook_lib.phases.decide import Actions, DecisionResult

    receipt = Receipt(run_id="20261201T000000Z-m-abc123", hold_deadline="2026-12-01T01:00:00Z")
    held = DecisionResult(phases=[], decision="HOLD", reasons=["too few samples"], gates=[], actions=Actions(None, []),
                          receipt=receipt, awaiting=(_plan().to_dict(),))
    text = held.hold_guidance()
    assert "by 2026-12-01T01:00:00Z" in text
    assert "runbook resolve reports/20261201T000000Z-m-abc123 --decision GO|NO-GO --by NAME" in text
    assert "runbook approve reports/20261201T000000Z-m-abc123 --by NAME" in text and "'i-123'" in text
    gone = DecisionResult(phases=[], decision="GO", reasons=[], gates=[], actions=Actions(None, []), receipt=receipt)
    assert gone.hold_guidance() == ""


def test_an_alternate_needs_a_reason_typed_beside_the_click(tmp_path: Path) -> None:
    alt = Plan(provider="alternates", action=ALTERNATE_ACTION, target="m: prove alternate spare in place of target t",
               spec=None, cost_usd_per_hour=0.33, dry_run=False)
    panel = approval_widget([alt, _plan()], run_dir=tmp_path, interactive=True)
    assert panel.asks_reason and panel.lines[0].startswith("Awaiting approval with a reason: use_alternate")
    assert "--reason TEXT" in panel.lines[0]
    [path] = panel.click(by="dana")  # no reason: the other plan is approved, the alternate still waits
    assert json.loads(path.read_text())["plan"]["fingerprint"] == _plan().fingerprint
    assert panel.waiting == [alt] and "type why in the reason box" in panel.lines[0]
    assert find(alt, run_dir=tmp_path, with_reason=True) is None
    with pytest.raises(UsageError, match="control character"):  # a reason is printed raw to terminals later
        panel.click(by="dana", reason="capacity\x1b[2J")
    [path] = panel.click(by="dana", reason="  the 1-CPU machines are all taken ")
    found = find(alt, run_dir=tmp_path, with_reason=True)
    assert found is not None and (found.reason, found.method) == ("the 1-CPU machines are all taken", "widget")
    assert panel.lines[0].endswith("reason: the 1-CPU machines are all taken.")
    again = standing(alt, run_dir=tmp_path, preapproved_local=True)  # the cell re-run says who and why
    assert again.startswith("Approved: use_alternate") and again.endswith("reason: the 1-CPU machines are all taken.")
