"""A HOLD run waits for a person until its deadline, then resolves to NO-GO; the seal stays intact."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import pytest

from runbook_lib.audit.verify import verify_run
from runbook_lib.cli import main as cli_main
from runbook_lib.errors import EXIT_GO, EXIT_HOLD, EXIT_NO_GO, EXIT_USAGE, EvidenceError, UsageError
from runbook_lib.evidence.manifest import sha256_file, write_json_atomic
from runbook_lib.evidence.resolve import hold_deadline, iso, printable, resolve_run, standing
from runbook_lib.evidence.seal import seal_run
from runbook_lib.params import Gates, load_params

from .conftest import ROOT

DECIDED = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
DEADLINE = DECIDED + dt.timedelta(hours=1)


def _sealed(tmp_path: Path, decision: str = "HOLD", deadline: dt.datetime | None = DEADLINE) -> Path:
    """A sealed run directory as phase 06 and the runner leave it (receipt, manifest, _SUCCESS)."""
    run = tmp_path / "reports" / f"20260301T110000Z-demo-embed-endpoint-{decision.lower().replace('-', '')}"
    run.mkdir(parents=True)
    shutil.copyfile(ROOT / "params" / "demo.yaml", run / "params.yaml")
    receipt = {"run_id": run.name, "decision": decision, "decided_at": iso(DECIDED),
               "source": {"release": "v1 A"}, "target": {"release": "v1 B"},
               "route": {"target_percent": 0}, "resources": {"remaining": []}}
    if deadline is not None:
        receipt["hold_deadline"] = iso(deadline)
    write_json_atomic(run / "receipt.json", receipt)
    seal_run(run, load_params(run / "params.yaml"), run / "params.yaml", decision=decision)
    return run


def test_deadline_default_and_arithmetic() -> None:
    assert Gates().hold_deadline_s == 3600.0  # docs/reference/gates.md 5.2: 60 min
    assert hold_deadline("2026-03-01T12:00:00.000Z", 3600) == "2026-03-01T13:00:00.000Z"
    assert hold_deadline("2026-12-31T23:30:00.250Z", 5400) == "2027-01-01T01:00:00.250Z"


def test_a_person_decides_before_the_deadline(tmp_path: Path) -> None:
    run = _sealed(tmp_path)
    manifest_sha = sha256_file(run / "manifest.json")
    before = DEADLINE - dt.timedelta(minutes=1)
    assert standing(run, now=before).decision == "HOLD"
    res = resolve_run(run, decision="GO", by="alice", reason="p95 within SLO on the canary", now=before)
    assert (res["decision"], res["by"], res["kind"], res["exit_code"]) == ("GO", "alice", "person", EXIT_GO)
    assert res["resolves"] == {"file": "manifest.json", "sha256": manifest_sha}
    assert res["hold_deadline"] == "2026-03-01T13:00:00.000Z" and res["resolved_at"] == "2026-03-01T12:59:00.000Z"
    assert sha256_file(run / "manifest.json") == manifest_sha  # the seal is not rewritten
    assert {r["status"] for r in verify_run(run)} == {"intact"}
    assert "resolution.json" in {r["path"] for r in verify_run(run)}
    st = standing(run, now=DEADLINE + dt.timedelta(days=1))
    assert st.decision == "GO" and "alice" in st.note  # a resolution is final; the deadline no longer applies
    with pytest.raises(UsageError, match="already resolved"):
        resolve_run(run, decision="NO-GO", by="bob", now=before)


def test_no_decision_before_the_deadline_is_refused_after_it_records_no_go(tmp_path: Path) -> None:
    run = _sealed(tmp_path)
    with pytest.raises(UsageError, match="HOLD until 2026-03-01T13:00:00.000Z"):
        resolve_run(run, decision=None, by=None, now=DEADLINE - dt.timedelta(seconds=1))
    assert not (run / "resolution.json").exists()
    assert standing(run, now=DEADLINE).decision == "NO-GO"  # shown once the deadline passes
    res = resolve_run(run, decision=None, by=None, now=DEADLINE + dt.timedelta(minutes=5))
    assert (res["decision"], res["kind"], res["exit_code"]) == ("NO-GO", "deadline", EXIT_NO_GO)
    assert "nothing is left to roll back" in res["rollback"]


def test_go_after_the_deadline_is_refused_no_go_is_not(tmp_path: Path) -> None:
    run = _sealed(tmp_path)
    late = DEADLINE + dt.timedelta(seconds=1)
    with pytest.raises(UsageError, match="GO is refused: the hold deadline passed at 2026-03-01T13:00:00.000Z"):
        resolve_run(run, decision="GO", by="alice", now=late)
    res = resolve_run(run, decision="NO-GO", by="alice", reason="too late to judge", now=late)
    assert (res["decision"], res["kind"]) == ("NO-GO", "person")


@pytest.mark.parametrize("decision", ["GO", "NO-GO"])
def test_only_a_hold_run_can_be_resolved(tmp_path: Path, decision: str) -> None:
    run = _sealed(tmp_path, decision=decision, deadline=None)
    with pytest.raises(UsageError, match=f"was decided '{decision}', not HOLD"):
        resolve_run(run, decision="NO-GO", by="alice", now=DECIDED)
    unsealed = _sealed(tmp_path / "u")
    (unsealed / "_SUCCESS").unlink()
    with pytest.raises(UsageError, match="not a sealed run"):
        resolve_run(unsealed, decision="NO-GO", by="alice", now=DECIDED)


def test_a_person_must_be_named(tmp_path: Path) -> None:
    run = _sealed(tmp_path)
    with pytest.raises(UsageError, match="--by NAME is required"):
        resolve_run(run, decision="GO", by=" ", now=DECIDED)


def test_altered_evidence_cannot_be_resolved(tmp_path: Path) -> None:
    run = _sealed(tmp_path)
    (run / "receipt.json").write_text((run / "receipt.json").read_text().replace("v1 B", "v1 C"))
    with pytest.raises(EvidenceError, match="receipt.json"):
        resolve_run(run, decision="GO", by="alice", now=DECIDED)


def test_verify_names_an_altered_or_detached_resolution(tmp_path: Path) -> None:
    run = _sealed(tmp_path)
    resolve_run(run, decision="NO-GO", by="alice", now=DECIDED)
    body = json.loads((run / "resolution.json").read_text())
    (run / "resolution.json").write_text(json.dumps({**body, "decision": "GO"}))
    rows = {(r["path"], r["status"]) for r in verify_run(run)}
    assert ("resolution.json", "altered") in rows
    assert cli_main(["verify", str(run)]) == 1
    (run / "resolution.json").write_text(json.dumps(body))  # restored, but the manifest it names changes
    (run / "manifest.json").write_text((run / "manifest.json").read_text() + " ")
    rows = {(r["path"], r["status"]) for r in verify_run(run)}
    assert ("resolution.json", "broken-link") in rows and ("manifest.json", "altered") in rows


def test_an_old_receipt_without_a_deadline_uses_the_runs_params(tmp_path: Path) -> None:
    run = _sealed(tmp_path, deadline=None)
    assert standing(run, now=DECIDED + dt.timedelta(seconds=3599)).decision == "HOLD"
    assert standing(run, now=DECIDED + dt.timedelta(seconds=3600)).decision == "NO-GO"


def test_cli_resolve_and_list(tmp_path: Path, capsys) -> None:
    future = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    held = _sealed(tmp_path, deadline=future)
    assert cli_main(["resolve", str(held)]) == EXIT_HOLD
    assert "HOLD; a person decides until" in capsys.readouterr().out
    assert cli_main(["resolve", str(held), "--decision", "GO"]) == EXIT_USAGE
    assert "--by NAME is required" in capsys.readouterr().err
    expired = _sealed(tmp_path / "x", deadline=dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1))
    assert cli_main(["list", "--reports", str(expired.parent)]) == 0
    assert "NO-GO" in capsys.readouterr().out and not (expired / "resolution.json").exists()  # list only shows
    assert cli_main(["resolve", str(expired), "--decision", "GO", "--by", "alice"]) == EXIT_USAGE
    assert "GO is refused" in capsys.readouterr().err
    assert cli_main(["resolve", str(expired)]) == EXIT_NO_GO
    assert "HOLD resolved to NO-GO by hold deadline" in capsys.readouterr().out
    assert cli_main(["resolve", str(held), "--decision", "GO", "--by", "alice", "--reason", "ok"]) == EXIT_GO
    assert cli_main(["verify", str(held)]) == 0
    assert cli_main(["list", "--reports", str(held.parent)]) == 0
    out = capsys.readouterr().out
    assert "HOLD resolved by alice" in out


def test_free_text_that_would_rewrite_a_terminal_is_refused_and_old_text_is_shown_escaped(tmp_path: Path,
                                                                                          capsys) -> None:
    future = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    held = _sealed(tmp_path, deadline=future)
    forged = "alice\n20260301T000000Z-other   GO"
    for args in (["--by", forged], ["--by", "bob\x1b[2J"], ["--by", "x" * 201], ["--by", "bob", "--reason", "\x1b[31m"]):
        assert cli_main(["resolve", str(held), "--decision", "GO", *args]) == EXIT_USAGE
        err = capsys.readouterr().err
        assert ("control character" in err or "more than 200" in err), err
        assert not (held / "resolution.json").exists()  # nothing was written
    assert cli_main(["approve", str(held), "--by", "eve\x1b[2J", "-o", str(tmp_path / "a.json")]) == EXIT_USAGE
    assert "control character '\\x1b' at position 3" in capsys.readouterr().err
    # text a run recorded (a release name is free text in params) is printed escaped by `list`
    shown = _sealed(tmp_path / "shown")
    receipt = json.loads((shown / "receipt.json").read_text())
    receipt["source"]["release"] = "v1\x1b[2J"
    write_json_atomic(shown / "receipt.json", receipt)
    assert cli_main(["list", "--reports", str(shown.parent)]) == 0
    out = capsys.readouterr().out
    assert "v1\\x1b[2J -> v1 B" in out and "\x1b" not in out
    assert printable("a\x1b[2Jb\nc\u202e") == "a\\x1b[2Jb\\nc\\u202e"


def test_a_second_resolution_shows_the_stored_name_escaped_never_obeyed(tmp_path: Path) -> None:
    # --by refuses control characters when it is written; a resolution written by hand, or by an
    # older runbook, can still hold them
    run = _sealed(tmp_path)
    before = DEADLINE - dt.timedelta(minutes=1)
    write_json_atomic(run / "resolution.json", {"decision": "GO", "by": "mallory\x1b]0;owned\x07",
                                                "resolved_at": "2026-03-01T12:30:00.000Z"})
    with pytest.raises(UsageError) as e:
        resolve_run(run, decision="NO-GO", by="bob", now=before)
    assert "\x1b" not in str(e.value) and "\x07" not in str(e.value) and "mallory\\x1b]0;owned\\x07" in str(e.value)


def test_verify_names_a_go_resolution_that_resolve_itself_would_refuse(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A forger with the code writes a GO resolution, correctly chained and linked, on a HOLD whose
    phases never ran (a dry run): ``verify`` names the rule ``resolve`` applies, and ``list`` does
    not show it as a verified GO."""
    from runbook_lib import gates as g
    from runbook_lib.evidence import resolve as resolve_module

    run = _sealed(tmp_path)
    receipt = json.loads((run / "receipt.json").read_text())
    receipt["gates"] = [g.GateResult("dry_run", "INCONCLUSIVE", True, 2, 0, "plans", "records",
                                     "plans shown, none applied", phase="06").to_dict()]
    write_json_atomic(run / "receipt.json", receipt)
    seal_run(run, load_params(run / "params.yaml"), run / "params.yaml", decision="HOLD")
    with pytest.raises(UsageError, match="phases never ran"):
        resolve_run(run, decision="GO", by="mallory", now=DECIDED)
    monkeypatch.setattr(resolve_module, "go_refusal", lambda receipt: None)
    resolve_run(run, decision="GO", by="mallory", now=DECIDED)  # the refusal skipped: a forged GO
    monkeypatch.undo()
    rows = [r for r in verify_run(run) if r["path"] == "resolution.json"]
    assert any(r["status"] != "intact" and "phases never ran" in r["by"] for r in rows), rows
    assert cli_main(["verify", str(run)]) == 1


def test_a_hold_for_capacity_cannot_be_resolved_to_go_only_to_no_go(tmp_path: Path) -> None:
    """No candidate got its machines (target_capacity INCONCLUSIVE, phases 04 and 05 skipped):
    there is no target to accept, so GO is refused, naming the gate; NO-GO is recorded."""
    from runbook_lib import gates as g

    run = _sealed(tmp_path)
    receipt = json.loads((run / "receipt.json").read_text())
    receipt["gates"] = [g.GateResult("phases_complete", "PASS", True, 5, 5, "phases", "records", "phases 01-05 completed",
                                     phase="06").to_dict(),
                        g.GateResult("target_capacity", "INCONCLUSIVE", True, 0, 1, "candidates", "offers tried",
                                     "vast-4090: no capacity; runpod-community waits for an approval", phase="03").to_dict()]
    write_json_atomic(run / "receipt.json", receipt)
    seal_run(run, load_params(run / "params.yaml"), run / "params.yaml", decision="HOLD")
    with pytest.raises(UsageError, match="no candidate was proven .target_capacity INCONCLUSIVE: vast-4090"):
        resolve_run(run, decision="GO", by="alice", now=DECIDED)
    assert not (run / "resolution.json").exists()
    assert resolve_run(run, decision="NO-GO", by="alice", now=DECIDED)["decision"] == "NO-GO"
    assert {r["status"] for r in verify_run(run)} == {"intact"}


def test_the_report_leads_with_the_resolution_list_shows(tmp_path: Path) -> None:
    from runbook_lib.evidence.report import decision_shown

    run = _sealed(tmp_path)
    before = decision_shown(run, run_signed=False)
    assert before.decision in ("HOLD", "NO-GO") and before.resolution is None  # HOLD, or expired by now
    resolve_run(run, decision="NO-GO", by="alice", reason="p95 too close to call", now=DECIDED)
    shown = decision_shown(run, run_signed=False)
    assert shown.decision == "NO-GO" and shown.resolution is not None and shown.resolution["by"] == "alice"
    assert shown.signed_by == ()  # resolved without --key
