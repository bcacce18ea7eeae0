"""``runbook verify`` checks what a run means, not only its bytes (issue 47): a manifest edited to
another decision and resealed without a key verifies byte for byte but fails ``--recompute``,
naming the sealed decision; a resolution that ``runbook resolve`` itself would refuse (GO on a run
whose phases never ran, GO over a blocking FAIL) is named by ``verify``, one rule for both."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest

from runbook_lib.audit.recompute import recompute_run
from runbook_lib.audit.verify import incomplete_rows
from runbook_lib.cli import main as cli_main
from runbook_lib.evidence.records import load_receipt
from runbook_lib.evidence.resolve import go_refusal

from .conftest import ROOT, reseal


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


def _one_phase_run(tmp_path: Path, *, stamped: bool, notebook: bool = True) -> Path:
    """A closed-world sealed run of phase 01 alone, sealed as `runbook phase` seals (the manifest's
    phases from the records): the notebook stamped by the runner's own stamp, or left as papermill
    alone leaves it (no stamp), or missing from the run."""
    import nbformat

    from runbook_lib.evidence.rundir import RunDir
    from runbook_lib.evidence.seal import seal_run
    from runbook_lib.params import load_params
    from runbook_lib.run.runner import stamp_provenance

    (tmp_path / "params").mkdir(parents=True)
    shutil.copy(ROOT / "params" / "demo.yaml", tmp_path / "params" / "demo.yaml")
    params = tmp_path / "params" / "demo.yaml"
    run = RunDir.create(params, reports_dir=tmp_path / "reports")
    nb = run.path / "01_freeze_source.ipynb"
    if notebook:
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Phase 01")]), nb)
    if stamped:
        stamp_provenance(nb, notebook_source={"origin": "packaged", "phase": "01", "sha256": "ab" * 32,
                                              "path": "runbook_lib/notebooks/01_freeze_source.ipynb"},
                         host_lock={"mode": "shared", "waited_s": 0.25},
                         secret_scan={"phase": "01", "findings": [], "scanned_files": 2})
    run.write_record("01", status="completed", data={}, files=[], started="2026-12-05T14:00:00.000Z")
    seal_run(run.path, load_params(params), params, decision="FAILED")
    return run.path


def test_a_run_sealed_phase_by_phase_carries_each_phases_provenance_from_its_notebook(tmp_path: Path, capsys) -> None:
    run = _one_phase_run(tmp_path, stamped=True)
    manifest = json.loads((run / "manifest.json").read_text())
    [entry] = manifest["phases"]
    assert entry["notebook_source"]["phase"] == "01" and entry["lock_wait_s"] == 0.25
    assert [s["phase"] for s in manifest["secret_scans"]] == ["01"]
    assert incomplete_rows(run) == []
    assert cli_main(["verify", str(run)]) == 0


@pytest.mark.parametrize("notebook", [True, False], ids=["notebooks-run-by-papermill-alone", "notebook-missing"])
def test_a_run_without_the_runners_provenance_is_incomplete_naming_each_item(tmp_path: Path, capsys,
                                                                            notebook: bool) -> None:
    run = _one_phase_run(tmp_path, stamped=False, notebook=notebook)
    [row] = incomplete_rows(run)
    assert row["path"] == "01_freeze_source.ipynb" and row["status"] == "incomplete"
    for item in ("notebook_source", "lock_wait_s", "secret_scans"):
        assert item in row["by"], row
    assert ("executed notebook, beside its record" in row["by"]) is not notebook
    assert cli_main(["verify", str(run)]) == 1
    out = capsys.readouterr().out
    assert "incomplete   01_freeze_source.ipynb" in out and "1 phases incomplete" in out
    assert cli_main(["list", "--reports", str(run.parent)]) == 0
    listed = capsys.readouterr().out
    line = next(x for x in listed.splitlines() if run.name in x)
    assert "INCOMPLETE" in line and "verified" not in line and "incomplete" in line
    assert "INCOMPLETE: the run lacks" in listed


def test_a_record_cut_off_after_the_seal_is_named_by_the_attestation_check_not_a_crash(tmp_path: Path,
                                                                                     capsys) -> None:
    run = _one_phase_run(tmp_path, stamped=True)
    (run / "01_freeze_source.json").write_text('{"phase": "01", "sta')  # as a full disk leaves it
    assert cli_main(["verify", str(run)]) == 1
    out = capsys.readouterr().out
    assert "01_freeze_source.json: not what the signed statement names (phase 01's test result)" in out


def test_the_bundle_is_exactly_what_the_seal_wrote_so_a_replayed_or_added_statement_fails(tmp_path: Path,
                                                                                          capsys) -> None:
    # A signed GO decision replayed from another run into this run's bundle verifies by its
    # signature alone; the bundle check names it. So do a duplicated line, an added field, a line
    # that is not an envelope and the statements out of order, with the key and without it.
    from runbook_lib.evidence.attestation import write_bundle
    from runbook_lib.evidence.signing import generate_key, load_signer

    private, public = generate_key(tmp_path / "keys" / "seal.key")
    signer = load_signer(f"file:{private}")
    run = _one_phase_run(tmp_path / "held", stamped=True)  # sealed FAILED: the decision attested is FAILED
    other = _one_phase_run(tmp_path / "other", stamped=True)
    manifest = json.loads((other / "manifest.json").read_text())
    (other / "manifest.json").write_text(json.dumps({**manifest, "decision": "GO"}))
    for r in (run, other):
        write_bundle(r, signer)
    bundle = run / "attestation.intoto.jsonl"
    lines = bundle.read_text().splitlines()
    assert len(lines) == 2 and cli_main(["verify", "--key", str(public), str(run)]) == 0
    replayed = (other / "attestation.intoto.jsonl").read_text().splitlines()[-1]  # its signed GO decision
    stmt = json.loads(base64.b64decode(json.loads(lines[0])["payload"]))
    extra = json.dumps({**json.loads(lines[0]), "payload": base64.b64encode(json.dumps(
        {**stmt, "note": "decision overridden"}).encode()).decode()})
    cases = {"replayed": [replayed] + lines, "duplicated": lines + [lines[1]], "reordered": lines[::-1],
             "added field": [extra, lines[1]], "not an envelope": lines + ["[1, 2]"]}
    said = {"replayed": "a second statement of the decision", "duplicated": "a second statement of the decision",
            "reordered": "out of order", "added field": "fields the seal did not write",
            "not an envelope": "line 3: not a DSSE envelope"}
    for case, body in cases.items():
        bundle.write_text("\n".join(body) + "\n")
        for args in (["verify", str(run)], ["verify", "--key", str(public), str(run)]):
            assert cli_main(args) == 1, (case, args)
            assert said[case] in capsys.readouterr().out, (case, args)


def test_provenance_that_is_there_but_says_nothing_is_incomplete_and_the_attestation_does_not_claim_it(
        tmp_path: Path) -> None:
    import nbformat

    from runbook_lib.evidence.attestation import decision_statement

    run = _one_phase_run(tmp_path, stamped=True)
    assert "RUNBOOK_PROVENANCE_COMPLETE" in decision_statement(run)["predicate"]["properties"]
    manifest = json.loads((run / "manifest.json").read_text())
    bad = {"notebook_source": ("trust me", "notebook provenance"), "lock_wait_s": ("never", "host-lock record")}
    for key, (value, named) in bad.items():
        edited = json.loads(json.dumps(manifest))
        edited["phases"][0][key] = value
        (run / "manifest.json").write_text(json.dumps(edited))
        [row] = incomplete_rows(run)
        assert named in row["by"], row
    edited = json.loads(json.dumps(manifest))
    edited["secret_scans"][0]["findings"] = [{"what": "AWS_SECRET_ACCESS_KEY", "path": "01/x.json"}]
    (run / "manifest.json").write_text(json.dumps(edited))
    [row] = incomplete_rows(run)
    assert "found 1 credential(s)" in row["by"]
    assert "RUNBOOK_PROVENANCE_COMPLETE" not in decision_statement(run)["predicate"]["properties"]
    (run / "manifest.json").write_text(json.dumps(manifest))
    nbformat.write(nbformat.v4.new_notebook(), run / "01_freeze_source.ipynb")  # a notebook with no cells
    [row] = incomplete_rows(run)
    assert "holds no cells" in row["by"]
