"""Evidence written before phase records were typed still reads: a sealed run made at 96aee4a
(tests/fixtures/README.md) verifies, recomputes, reports, lists and resolves as it did then, and
its records parse into today's models. A record whose schema version this code does not know is
named, never misread."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runbook_lib.audit.recompute import Recomputed, explained
from runbook_lib.cli import main as cli_main
from runbook_lib.errors import EXIT_USAGE, EvidenceError
from runbook_lib.evidence import records
from runbook_lib.evidence.manifest import read_chain

from .conftest import OLD_RUN, OLD_RUN_ID

RUN_ID = OLD_RUN_ID
FIXTURE = OLD_RUN


def test_the_fixture_predates_schema_versions() -> None:
    bodies = [json.loads(p.read_text()) for p in sorted(FIXTURE.glob("0[1-6]_*.json"))]
    assert len(bodies) == 6 and not any("schema_version" in b for b in bodies)


def test_an_old_run_verifies_and_recomputes_the_same(old_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["verify", str(old_run)]) == 0
    out = capsys.readouterr().out
    assert " 0 altered, 0 missing, 0 broken links" in out
    assert cli_main(["verify", "--recompute", str(old_run)]) == 0
    out = capsys.readouterr().out
    assert "DIFFERS" not in out and "recomputed the same" in out
    assert "same     06 decision" in out
    # 0.2.0 made a training job's A/A control blocking (issue 51): this 0.1.0 run recorded it
    # scored, and today's rules derive it blocking. Only that field differs, so it is that change.
    assert "RULE     04 noise_floor" in out and "blocking: False -> True" in out
    assert "runbook_lib 0.2.0 (this run: 0.1.0): a training job's A/A control blocks" in out
    assert "1 differ only as a rule change since the run's version makes them differ (RULE): noise_floor" in out


def test_a_rule_change_explains_only_its_own_fields_on_runs_older_than_it() -> None:
    blocking = Recomputed("04", "noise_floor", "raw samples", {"verdict": "PASS", "blocking": False},
                          {"verdict": "PASS", "blocking": True}, ("blocking: False -> True",))
    assert explained(blocking, "0.1.0").rule_change.startswith("runbook_lib 0.2.0 (this run: 0.1.0)")
    assert not explained(blocking, "0.2.0").rule_change  # made under the rule: a difference stays one
    assert not explained(blocking, None).rule_change  # no version known: nothing is explained
    verdict = Recomputed("04", "noise_floor", "raw samples", {"verdict": "PASS", "blocking": False},
                         {"verdict": "INCONCLUSIVE", "blocking": True}, ("verdict", "blocking"))
    assert not explained(verdict, "0.1.0").rule_change  # the change never touched the verdict
    other = Recomputed("04", "latency_p95_ratio", "raw samples", {"verdict": "PASS", "blocking": False},
                       {"verdict": "PASS", "blocking": True}, ("blocking",))
    assert not explained(other, "0.1.0").rule_change


def test_an_old_run_reports_lists_and_resolves(old_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["report", str(old_run), "-o", str(old_run.parent / "r.html")]) == 0
    html = (old_run.parent / "r.html").read_text()
    assert "Decision: <b>GO</b>" in html and "Every hash of this run's evidence verified" in html
    capsys.readouterr()
    assert cli_main(["list", "--reports", str(old_run.parent)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(RUN_ID))
    assert row.split()[1:3] == ["GO", "complete"]
    # a GO run waits on nobody: resolve reads its decision and refuses, naming it
    assert cli_main(["resolve", str(old_run), "--decision", "NO-GO", "--by", "auditor"]) == EXIT_USAGE
    assert "was decided 'GO', not HOLD" in capsys.readouterr().err


def test_an_old_run_parses_into_the_typed_records() -> None:
    chain = records.Chain({r.phase: r for r in read_chain(FIXTURE)})
    assert [type(chain.data(p)).__name__ for p in sorted(chain)] == [
        "FreezeData", "MappingData", "ParityData", "CompareData", "CutoverData", "DecideData"]
    freeze = chain.need_freeze()
    assert freeze.frozen().prefix == f"runs/{RUN_ID}/source/frozen"
    assert len(freeze.frozen().manifest_sha256) == 64 and freeze.frozen().objects
    assert freeze.requirements.device == "cpu" and freeze.requirements.dtype == "float32"
    compare = chain.need_compare()
    assert compare.summary["source"].p95_s is not None and compare.summary["target"].throughput
    assert {d.drill for d in compare.drills} >= {"redeliver", "spend_limit"}
    assert chain.cutover is not None and chain.cutover.cutover.steps[0].passed is True
    assert len(chain.gates()) == 29 and {x.phase for x in chain.gates()} == {"01", "02", "03", "04", "05", "06"}


def test_a_record_of_an_unknown_schema_version_is_named_never_misread(old_run: Path) -> None:
    path = old_run / "03_prove_parity.json"
    body = json.loads(path.read_text())
    body["schema_version"] = 99
    path.write_text(json.dumps(body))
    chain = records.read_unchecked(old_run)
    assert chain.data("01") is not None  # the others still read
    with pytest.raises(EvidenceError, match=r"03_prove_parity.json has record schema version 99; this runbook_lib "
                                            r"reads versions \[1\]"):
        chain.data("03")


def test_a_record_that_does_not_fit_its_model_names_the_field_and_the_value(old_run: Path) -> None:
    path = old_run / "01_freeze_source.json"
    body = json.loads(path.read_text())
    body["data"]["freeze"]["frozen"]["manifest_sha256"] = ["not", "a", "digest"]
    path.write_text(json.dumps(body))
    with pytest.raises(EvidenceError, match=r"data\.freeze\.frozen\.manifest_sha256 does not fit FreezeData"):
        records.read_unchecked(old_run).data("01")
