"""``runbook verify`` checks what a run means, not only its bytes (issue 47): a manifest edited to
another decision and resealed without a key verifies byte for byte but fails ``--recompute``,
naming the sealed decision; a resolution that ``runbook resolve`` itself would refuse (GO on a run
whose phases never ran, GO over a blocking FAIL) is named by ``verify``, one rule for both."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from runbook_lib.audit.recompute import recompute_run
from runbook_lib.cli import main as cli_main
from runbook_lib.evidence.records import load_receipt
from runbook_lib.evidence.resolve import go_refusal

from .conftest import reseal


@pytest.fixture
def sealed_go(old_run: Path) -> Path:
    """A copy of a sealed GO run (the old-evidence fixture, decided GO at 96aee4a)."""
    return old_run


def test_a_manifest_edited_to_another_decision_and_resealed_fails_recompute(sealed_go: Path, capsys) -> None:
    manifest = json.loads((sealed_go / "manifest.json").read_text())
    assert manifest["decision"] == "GO"
    manifest["decision"] = "NO-GO"
    (sealed_go / "manifest.json").write_text(json.dumps(manifest, indent=2))
    reseal(sealed_go)  # every hash that vouches for it recomputed, as anyone with write access could
    assert cli_main(["verify", str(sealed_go)]) == 0  # the bytes agree with each other
    capsys.readouterr()
    assert cli_main(["verify", "--recompute", str(sealed_go)]) == 1
    out = capsys.readouterr().out
    assert "DIFFERS  06 sealed decision" in out and "verdict: 'NO-GO' -> 'GO'" in out


def test_an_untouched_run_recomputes_its_sealed_decision_the_same(sealed_go: Path) -> None:
    rows = {x.gate: x for x in recompute_run(sealed_go)}
    assert rows["sealed decision"].same and rows["sealed decision"].recorded == {"verdict": "GO"}


def test_go_is_refused_for_phases_that_never_ran_or_over_a_blocking_fail(sealed_go: Path) -> None:
    receipt = load_receipt(sealed_go)
    assert receipt is not None and go_refusal(receipt) is None
    body = json.loads((sealed_go / "receipt.json").read_text())
    never = json.loads(json.dumps(body))
    never["gates"].append({**body["gates"][-1], "name": "dry_run", "phase": "06", "verdict": "INCONCLUSIVE",
                           "blocking": True, "detail": "plans shown, none applied"})
    (sealed_go / "receipt.json").write_text(json.dumps(never))
    refused = go_refusal(load_receipt(sealed_go))
    assert refused is not None and "phases never ran" in refused and "dry_run" in refused
    failed = json.loads(json.dumps(body))
    failed["gates"][0] = {**failed["gates"][0], "verdict": "FAIL", "blocking": True}
    (sealed_go / "receipt.json").write_text(json.dumps(failed))
    refused = go_refusal(load_receipt(sealed_go))
    assert refused is not None and "blocking gate failed" in refused and failed["gates"][0]["name"] in refused


def test_an_unreadable_manifest_is_altered_and_named_and_list_shows_every_run(sealed_go: Path, capsys) -> None:
    other = sealed_go.parent / "20261202T050000Z-demo-checkpoint-02b2f0"
    shutil.copytree(sealed_go, other)
    (other / "manifest.json").write_text("{not json")
    assert cli_main(["verify", str(other)]) == 1
    out = capsys.readouterr().out
    assert "altered" in out and "manifest.json cannot be read" in out and "LEGACY" not in out
    assert cli_main(["list", "--reports", str(sealed_go.parent)]) == 0
    listed = capsys.readouterr().out
    assert sealed_go.name in listed and "GO" in listed  # the intact run is still listed
    line = next(x for x in listed.splitlines() if other.name in x)
    assert "ALTERED" in line and "manifest.json cannot be read" in line
