"""A closed-world seal: every file of a run is in the seal or in a link after it, so an added
notebook, a hand-written resolution or a directory that was never sealed is named by
``runbook verify``; a resolution counts only where it may; the report shows only what the seal
covers, and nothing inside a notebook can restyle, script or re-anchor it; no write follows a
symlink. Run directories here are sealed by the library's own sealer, as phase 06 and the
runner seal them, without running a migration."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Any

import nbformat
import pytest
import yaml

from runbook_lib.audit.verify import person_signature_rows, verify_run
from runbook_lib.cli import main as cli_main
from runbook_lib.errors import EXIT_USAGE, ApprovalRequired, EvidenceError, UsageError
from runbook_lib.evidence.approvals import require
from runbook_lib.evidence.closedworld import read_links
from runbook_lib.evidence.manifest import sha256_file, write_json_atomic
from runbook_lib.evidence.report import sanitize_fragment, write_html
from runbook_lib.evidence.resolve import content_sha256, iso, resolve_run, standing
from runbook_lib.evidence.seal import seal_run
from runbook_lib.evidence.signing import load_public_key, load_signer
from runbook_lib.params import dump_yaml, load_params
from runbook_lib.providers.base import PodSpec
from runbook_lib.providers.local import LocalProvider

from .conftest import ROOT

DECIDED = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
DEADLINE = DECIDED + dt.timedelta(hours=1)


def _notebook(path: Path, markdown: str, html: str = "") -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_markdown_cell(markdown))
    if html:
        code = nbformat.v4.new_code_cell("display(x)")
        code.outputs.append(nbformat.v4.new_output("display_data", data={"text/html": html, "text/plain": "x"}))
        nb.cells.append(code)
    nbformat.write(nb, path)


def _sealed(tmp_path: Path, decision: str = "HOLD", *, html: str = "", signing_key: str = "",
            before_seal: Any = None) -> Path:
    """A sealed run directory as phase 06 and the runner leave it: params, one executed phase
    notebook, a phase 04 file, a receipt, then the manifest and ``_SUCCESS`` (and, with
    ``signing_key`` in params, ``attestation.dsse.json``)."""
    run = tmp_path / "reports" / f"20260301T110000Z-demo-embed-endpoint-{decision.lower().replace('-', '')}"
    (run / "04").mkdir(parents=True)
    params = yaml.safe_load((ROOT / "params" / "demo.yaml").read_text())
    if signing_key:
        params["evidence"] = {"signing_key": signing_key}
    (run / "params.yaml").write_text(dump_yaml(params))
    _notebook(run / "01_freeze_source.ipynb", "# Phase 01\nsource frozen", html)
    (run / "04" / "throughput.csv").write_text("round,side,throughput\n1,source,10\n")
    write_json_atomic(run / "receipt.json", {
        "run_id": run.name, "decision": decision, "decided_at": iso(DECIDED), "hold_deadline": iso(DEADLINE),
        "source": {"release": "v1 A"}, "target": {"release": "v1 B"}, "route": {"target_percent": 0},
        "resources": {"remaining": []}})
    if before_seal is not None:
        before_seal(run)
    seal_run(run, load_params(run / "params.yaml"), run / "params.yaml", decision=decision,
             complete=decision != "INTERRUPTED")
    return run


def _bad(run: Path) -> dict[str, str]:
    return {r["path"]: f"{r['status']}: {r['by']}" for r in verify_run(run) if r["status"] != "intact"}


def test_a_sealed_run_verifies_and_lists_every_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _sealed(tmp_path, "GO")
    seal = json.loads((run / "manifest.json").read_text())["seal"]
    assert sorted(seal["files"]) == ["01_freeze_source.ipynb", "04/throughput.csv", "params.yaml", "receipt.json"]
    assert seal["files"]["04/throughput.csv"] == sha256_file(run / "04" / "throughput.csv")
    assert _bad(run) == {}
    assert cli_main(["verify", str(run)]) == 0
    assert "seal: closed world" in capsys.readouterr().out


@pytest.mark.parametrize("added", ["02_map_target.ipynb", "04/extra.csv", "notes.txt"])
def test_a_file_added_after_the_seal_is_an_alteration(tmp_path: Path, added: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    run = _sealed(tmp_path, "GO")
    _notebook(run / added, "All slices passed ... **GO**")
    assert _bad(run) == {added: "altered: not in the seal or any valid link: added after the seal (an addition is an "
                                "alteration)"}
    assert cli_main(["verify", str(run)]) == 1
    assert added in capsys.readouterr().out
    # the report shows only what the seal covers: the forged notebook is not rendered
    out = write_html(run, tmp_path / "r.html", unverified=[f"{added}: altered"])
    html = out.read_text()
    assert html.count("<section ") == 1 and "All slices passed" not in html


def test_a_removed_sealed_file_is_missing(tmp_path: Path) -> None:
    run = _sealed(tmp_path, "GO")
    (run / "04" / "throughput.csv").unlink()
    assert _bad(run)["04/throughput.csv"].startswith("missing")


def test_no_seal_is_not_a_sealed_run_and_no_run_dir_is_a_usage_error(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    unsealed = tmp_path / "reports" / "20260301T110000Z-demo-x"
    unsealed.mkdir(parents=True)
    shutil.copyfile(ROOT / "params" / "demo.yaml", unsealed / "params.yaml")
    assert cli_main(["verify", str(unsealed)]) == 1
    assert capsys.readouterr().out.startswith("not a sealed run")
    for path in ("/etc", str(tmp_path / "nothing-here"), str(ROOT / "README.md")):
        assert cli_main(["verify", path]) == EXIT_USAGE
        assert "is not a run directory" in capsys.readouterr().err
    assert cli_main(["report", "/etc", "-o", str(tmp_path / "etc.html")]) == EXIT_USAGE
    assert not (tmp_path / "etc.html").exists()


def _forged_resolution(run: Path, decision: str = "GO", at: dt.datetime = DECIDED) -> None:
    """``resolution.json`` written by hand, consistent with the run (the manifest's sha256, a
    matching ``content_sha256``): what anyone who can write the directory can make."""
    body = {"run_id": run.name, "resolves": {"file": "manifest.json", "sha256": sha256_file(run / "manifest.json")},
            "held_decision": "HOLD", "decision": decision, "exit_code": 0, "kind": "person", "by": "mallory",
            "reason": "", "resolved_at": iso(at), "hold_deadline": iso(DEADLINE), "rollback": ""}
    body["content_sha256"] = content_sha256(body)
    write_json_atomic(run / "resolution.json", body)


@pytest.mark.parametrize("decision", ["GO", "NO-GO", "INTERRUPTED"])
def test_a_hand_written_resolution_of_a_run_that_did_not_hold_changes_nothing(
        tmp_path: Path, decision: str, capsys: pytest.CaptureFixture[str]) -> None:
    run = _sealed(tmp_path, decision)
    _forged_resolution(run, "NO-GO" if decision == "GO" else "GO")
    assert standing(run).decision == decision
    assert "resolution.json ignored: the run is not a sealed HOLD" in standing(run).note
    assert "not a sealed HOLD" in _bad(run)["resolution.json"]
    assert cli_main(["list", "--reports", str(run.parent)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(run.name))
    assert row.split()[1] == decision


def test_a_hand_written_resolution_of_a_hold_is_not_sealed_and_is_ignored(tmp_path: Path) -> None:
    run = _sealed(tmp_path, "HOLD")
    _forged_resolution(run)
    assert "added after the seal" in _bad(run)["resolution.json"]
    st = standing(run, now=DECIDED)
    assert st.decision == "HOLD" and "0 links seal a resolution.json" in st.note


def test_a_resolution_counts_once_and_go_only_before_the_deadline(tmp_path: Path) -> None:
    run = _sealed(tmp_path, "HOLD")
    resolve_run(run, decision="GO", by="alice", now=DECIDED)
    assert [link.kind for link in read_links(run)] == ["resolution"]
    assert _bad(run) == {} and standing(run).decision == "GO"
    # a second resolution, written and linked by hand over the first
    body = json.loads((run / "resolution.json").read_text())
    write_json_atomic(run / "resolution.json", {**body, "decision": "NO-GO", "content_sha256": None})
    late = _sealed(tmp_path / "late", "HOLD")
    _forged_resolution(late, "GO", at=DEADLINE + dt.timedelta(seconds=1))
    link = json.loads(json.dumps({"kind": "resolution", "prev_sha256": sha256_file(late / "manifest.json"),
                                  "files": {"resolution.json": sha256_file(late / "resolution.json")},
                                  "removed": [], "at": iso(DEADLINE), "by": "mallory"}))
    write_json_atomic(late / "links" / "0001-resolution.json", link)
    assert "GO is a person's, before the hold deadline" in _bad(late)["resolution.json"]
    assert standing(late, now=DEADLINE + dt.timedelta(seconds=2)).decision == "NO-GO"  # the deadline's, not GO
    assert "altered" in _bad(run)["resolution.json"]


def test_a_link_that_names_another_sha256_is_a_broken_link(tmp_path: Path) -> None:
    run = _sealed(tmp_path, "HOLD")
    resolve_run(run, decision="NO-GO", by="alice", now=DECIDED)
    link = run / "links" / "0001-resolution.json"
    body = json.loads(link.read_text())
    write_json_atomic(link, {**body, "prev_sha256": "0" * 64})
    assert _bad(run)["links/0001-resolution.json"].startswith("broken-link")


def test_a_legacy_seal_is_checked_open_world_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _sealed(tmp_path, "GO")
    manifest = json.loads((run / "manifest.json").read_text())
    del manifest["seal"]
    write_json_atomic(run / "manifest.json", manifest)
    marker = json.loads((run / "_SUCCESS").read_text())
    marker["files"]["manifest.json"] = sha256_file(run / "manifest.json")
    write_json_atomic(run / "_SUCCESS", marker)
    (run / "extra.txt").write_text("unlisted")
    assert cli_main(["verify", str(run)]) == 0
    assert "seal: LEGACY, open world" in capsys.readouterr().out


HOSTILE_CSS = ("<style>h1{color:red!important} #runbook-head{display:none} body{background:black}</style>"
               "<div style='position:fixed;top:0;left:0;width:100%;height:100%;background:white'>cover</div>"
               "<p class='decision' id='runbook-head'>Decision: <b>GO</b></p>"
               "<a href='javascript:alert(1)'>js</a><a href='data:text/html,x'>data</a>"
               "<a href='https://example.org/doc'>doc</a><a href='#phase-01_freeze_source'>up</a>"
               "<img src='data:image/svg+xml;base64,PHN2Zz48L3N2Zz4='><img src='data:image/png;base64,AAAA'>")


def test_an_output_cannot_style_script_or_re_anchor_the_report() -> None:
    clean = sanitize_fragment(HOSTILE_CSS)
    assert "<style" not in clean and "style=" not in clean and "id=" not in clean
    assert "javascript:" not in clean and "data:text" not in clean and "svg" not in clean
    assert 'href="https://example.org/doc"' in clean and 'href="#phase-01_freeze_source"' in clean
    assert 'src="data:image/png;base64,AAAA"' in clean and 'class="decision"' in clean
    assert "h1{color" not in clean  # a style element goes with its content


def test_the_report_escapes_names_and_drops_markdown_script_links(tmp_path: Path) -> None:
    run = _sealed(tmp_path, "GO", html=HOSTILE_CSS)
    nb = nbformat.read(run / "01_freeze_source.ipynb", as_version=4)
    nb.cells[0].source = "[click](javascript:alert(1)) and ![x](https://evil.example/p.png)"
    nbformat.write(nb, run / "01_freeze_source.ipynb")
    with pytest.raises(Exception, match="remote content"):  # a remote image in Markdown: refused
        write_html(run, tmp_path / "r.html", unverified=["01_freeze_source.ipynb: altered"])
    nb.cells[0].source = "[click](javascript:alert(1))"
    nbformat.write(nb, run / "01_freeze_source.ipynb")
    html = write_html(run, tmp_path / "r.html", unverified=["<b>x</b>"]).read_text()
    assert "javascript:" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
    assert html.count("id='runbook-head'") == 1 and "position:fixed" not in html


def test_report_and_init_never_write_through_a_symlink(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _sealed(tmp_path, "GO")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    link = tmp_path / "out.html"
    link.symlink_to(victim)
    assert cli_main(["report", str(run), "-o", str(link)]) == 0
    assert victim.read_text() == "keep me" and not link.is_symlink() and "<html>" in link.read_text()
    assert cli_main(["report", str(run), "-o", str(run / "r.html")]) == EXIT_USAGE
    assert "inside the run directory" in capsys.readouterr().err and not (run / "r.html").exists()
    target = tmp_path / "proj"
    (target / "notebooks").mkdir(parents=True)
    (target / "notebooks" / "01_freeze_source.ipynb").symlink_to(tmp_path / "planted.ipynb")  # dangling
    assert cli_main(["init", str(target)]) == EXIT_USAGE
    assert not (tmp_path / "planted.ipynb").exists() and not (target / "params").exists()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "proj2").mkdir()
    (tmp_path / "proj2" / "params").symlink_to(elsewhere)
    assert cli_main(["init", str(tmp_path / "proj2")]) == EXIT_USAGE
    assert "is a symlink" in capsys.readouterr().err and list(elsewhere.iterdir()) == []


# Signing: an in-toto statement of the seal in a DSSE envelope, ed25519 (runbook_lib.evidence.signing).


def _keys(tmp_path: Path, name: str = "seal.key") -> tuple[Path, Path]:
    keys = tmp_path / "keys"
    keys.mkdir(exist_ok=True)
    assert cli_main(["keygen", str(keys / name)]) == 0
    return keys / name, keys / f"{name}.pub"


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites(tmp_path: Path,
                                                                              capsys: pytest.CaptureFixture[str]) -> None:
    private, public = _keys(tmp_path)
    assert private.stat().st_mode & 0o777 == 0o600 and public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    assert "evidence.signing_key" in capsys.readouterr().out
    before = private.read_bytes()
    assert cli_main(["keygen", str(private)]) == EXIT_USAGE
    assert private.read_bytes() == before and "already exists" in capsys.readouterr().err


def test_a_signed_run_verifies_with_its_public_key_from_a_copy_elsewhere(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import base64

    private, public = _keys(tmp_path)
    run = _sealed(tmp_path, "HOLD", signing_key=f"file:{private}")
    [envelope] = [json.loads(line) for line in (run / "attestation.intoto.jsonl").read_text().splitlines()]
    assert envelope["payloadType"] == "application/vnd.in-toto+json" and len(envelope["signatures"]) == 1
    stmt = json.loads(base64.b64decode(envelope["payload"]))  # no phase records here: the decision's alone
    assert stmt["_type"] == "https://in-toto.io/Statement/v1"
    subjects = {x["name"]: x["digest"]["sha256"] for x in stmt["subject"]}
    assert subjects["manifest.json"] == sha256_file(run / "manifest.json")
    assert subjects["04/throughput.csv"] == sha256_file(run / "04" / "throughput.csv")
    assert stmt["predicateType"] == "https://in-toto.io/attestation/svr/v0.1"
    assert "RUNBOOK_DECISION_HOLD" in stmt["predicate"]["properties"]
    elsewhere = tmp_path / "auditor" / run.name
    shutil.copytree(run, elsewhere)
    assert cli_main(["verify", "--key", str(public), str(elsewhere)]) == 0
    assert "signed by key" in capsys.readouterr().out
    assert cli_main(["verify", str(elsewhere)]) == 0
    assert "(not checked: pass --key PUBKEY" in capsys.readouterr().out
    resolve_run(elsewhere, decision="NO-GO", by="alice", now=DECIDED)  # a link after the seal: still signed
    assert cli_main(["verify", "--key", str(public), str(elsewhere)]) == 0
    capsys.readouterr()
    # the decision now comes from a resolution the seal's signature does not cover: never "verified"
    assert cli_main(["list", "--reports", str(elsewhere.parent)]) == 0
    listed = capsys.readouterr().out
    row = next(x for x in listed.splitlines() if x.startswith(elsewhere.name)).split()
    assert row[1:4] == ["NO-GO", "complete", "UNSIGNED"], row
    assert "UNSIGNED: the run's seal is signed but the resolution deciding it is not" in listed
    # signed by a key anyone can make: list cannot check whose it is, so it never says verified
    mallory, _ = _keys(tmp_path, "mallory.key")
    keyed = tmp_path / "keyed" / run.name
    shutil.copytree(run, keyed)
    resolve_run(keyed, decision="GO", by="mallory", now=DECIDED, signer=load_signer(f"file:{mallory}", what="--key"))
    assert cli_main(["list", "--reports", str(keyed.parent)]) == 0
    listed = capsys.readouterr().out
    row = next(x for x in listed.splitlines() if x.startswith(keyed.name)).split()
    assert row[1:4] == ["GO", "complete", "UNCHECKED"], row
    assert "verify --person-key" in listed


def test_a_run_resealed_without_the_key_unsigned_or_signed_by_another_key_fails_verify_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from runbook_lib.evidence.attestation import write_bundle
    from runbook_lib.evidence.closedworld import seal_listing

    private, public = _keys(tmp_path)
    monkeypatch.setenv("RUNBOOK_TEST_SEAL_KEY", private.read_text())  # env: holds the PEM itself
    run = _sealed(tmp_path, "GO", signing_key="env:RUNBOOK_TEST_SEAL_KEY")
    assert cli_main(["verify", "--key", str(public), str(run)]) == 0
    receipt = json.loads((run / "receipt.json").read_text())
    write_json_atomic(run / "receipt.json", {**receipt, "decision": "NO-GO"})
    manifest = json.loads((run / "manifest.json").read_text())  # every hash made consistent again,
    write_json_atomic(run / "manifest.json", {**manifest, "seal": seal_listing(run)})  # as anyone who can
    marker = json.loads((run / "_SUCCESS").read_text())  # write the directory can
    write_json_atomic(run / "_SUCCESS", {**marker, "files": {k: sha256_file(run / k) for k in marker["files"]}})
    stale = {r["path"]: r["status"] for r in verify_run(run) if r["status"] != "intact"}
    assert stale == {"attestation.intoto.jsonl": "altered"}, stale  # the statements still name the old receipt
    write_bundle(run, None)  # rebuilt too, unsigned: the editor has no key
    assert {r["status"] for r in verify_run(run)} == {"intact"}  # integrity alone cannot tell
    capsys.readouterr()
    assert cli_main(["verify", "--key", str(public), str(run)]) == 1
    out = capsys.readouterr().out
    assert "line 1: not signed, and --key asks for a signed run" in out and "DOES NOT VERIFY" in out
    unsigned = _sealed(tmp_path / "u", "GO")
    assert cli_main(["verify", "--key", str(public), str(unsigned)]) == 1
    assert "line 1: not signed, and --key asks for a signed run" in capsys.readouterr().out
    _, other = _keys(tmp_path, "other.key")
    assert cli_main(["verify", "--key", str(other), str(_sealed(tmp_path / "o", "GO", signing_key=f"file:{private}"))]) == 1
    assert "no signature verifies with key" in capsys.readouterr().out


def test_a_signing_key_that_cannot_be_read_is_named_and_its_value_never_shown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runbook_lib.errors import AuthError
    from runbook_lib.evidence.signing import load_signer
    from runbook_lib.phases.scan import resolved_secrets

    with pytest.raises(AuthError, match="RUNBOOK_TEST_MISSING"):
        load_signer("env:RUNBOOK_TEST_MISSING")
    monkeypatch.setenv("RUNBOOK_TEST_NOT_A_KEY", "not a key but long enough to be secret-ish 12345")
    with pytest.raises(AuthError) as err:
        load_signer("env:RUNBOOK_TEST_NOT_A_KEY")
    assert "not a key but" not in str(err.value) and "ed25519" in str(err.value)
    private, _ = _keys(tmp_path)
    mig = load_params(_sealed(tmp_path, "GO", signing_key=f"file:{private}") / "params.yaml")
    values, _ = resolved_secrets(mig)  # the secret scan looks for the key, armoured or not
    body = "".join(x for x in private.read_text().splitlines() if not x.startswith("-----"))
    assert values["evidence.signing_key"] == private.read_text().strip() and body in values.values()


def test_a_resolution_signed_with_the_persons_key_verifies_with_it_and_no_other(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    alice, alice_pub = _keys(tmp_path, "alice.key")
    _, mallory_pub = _keys(tmp_path, "mallory.key")
    run = _sealed(tmp_path, "HOLD")
    resolve_run(run, decision="GO", by="alice", now=DECIDED, signer=load_signer(f"file:{alice}", what="--key"))
    [link] = read_links(run)
    assert sorted(link.body["files"]) == ["resolution.dsse.json", "resolution.json"]  # sealed together, by one link
    assert cli_main(["verify", str(run)]) == 0
    assert "resolution: signed by key" in capsys.readouterr().out
    assert cli_main(["verify", "--person-key", str(alice_pub), str(run)]) == 0
    assert cli_main(["verify", "--person-key", str(mallory_pub), str(run)]) == 1
    assert "no signature verifies with the key(s) given" in capsys.readouterr().out
    unsigned = _sealed(tmp_path / "u", "HOLD")
    assert cli_main(["resolve", str(unsigned), "--decision", "NO-GO", "--by", "bob"]) == 1  # past the deadline: NO-GO
    capsys.readouterr()
    assert cli_main(["verify", "--person-key", str(alice_pub), str(unsigned)]) == 1  # no downgrade
    assert "resolution: NOT SIGNED" in capsys.readouterr().out
    keyless = _sealed(tmp_path / "k", "HOLD")
    assert cli_main(["resolve", str(keyless), "--decision", "NO-GO", "--by", "bob", "--key",
                     "env:RUNBOOK_TEST_NO_SUCH_KEY"]) == 2  # an unreadable key: refused before anything is written
    assert not (keyless / "resolution.json").exists()


def test_an_approval_file_signed_by_its_approver_travels_into_the_run_and_verifies(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bob, bob_pub = _keys(tmp_path, "bob.key")
    _, eve_pub = _keys(tmp_path, "eve.key")
    prov = LocalProvider(root=tmp_path / "local")
    plan = prov.plan_launch(PodSpec(name="p", command=("python", "-c", "pass"), device="cpu", price_usd_per_hour=0.1,
                                    labels=(("run_id", "x"),)))
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(ApprovalRequired):
        require(plan, run_dir=run, preapproved_local=False)
    out = tmp_path / "approval.json"
    assert cli_main(["approve", str(run), "--by", "bob", "-o", str(out), "--key", f"file:{bob}"]) == 0
    assert "signed in" in capsys.readouterr().out and (tmp_path / "approval.dsse.json").is_file()
    require(plan, run_dir=run, preapproved_local=False, approval_file=str(out))
    rec = json.loads((run / "approvals" / f"{plan.fingerprint[:16]}.json").read_text())
    kept = run / "approvals" / rec["signed_file"]
    assert json.loads(kept.read_text()) == json.loads(out.read_text()) and kept.with_name(
        kept.stem + ".dsse.json").is_file()
    assert [r["status"] for r in person_signature_rows(run, [load_public_key(bob_pub)])] == ["intact"]
    [row] = person_signature_rows(run, [load_public_key(eve_pub)])
    assert row["status"] == "altered" and "no signature verifies" in row["by"]
    body = json.loads(kept.read_text())  # the copy edited after it was signed: not what bob signed
    write_json_atomic(kept, {**body, "approved_by": "eve"})
    [row] = person_signature_rows(run, [load_public_key(bob_pub)])
    assert row["status"] == "altered" and "not over the record as it is now" in row["by"]
    assert cli_main(["approve", str(run), "--by", "bob", "-o", str(tmp_path / "plain.json")]) == 2  # nothing waits now


def test_a_run_directory_that_is_or_holds_a_symlink_is_never_written_into(tmp_path: Path) -> None:
    from runbook_lib.evidence.rundir import RunDir

    params = tmp_path / "params" / "demo.yaml"
    params.parent.mkdir()
    params.write_text((ROOT / "params" / "demo.yaml").read_text())
    run = RunDir.create(params, reports_dir=tmp_path / "reports")
    victim = tmp_path / "victim.json"
    victim.write_text("keep me")
    (run.path / "04").mkdir()
    (run.path / "04" / "cost.json").symlink_to(victim)  # planted where phase 04 writes
    with pytest.raises(UsageError, match=r"holds symlinks: 04/cost.json"):
        RunDir.open(run.path, params)
    (run.path / "04" / "cost.json").unlink()
    assert RunDir.open(run.path, params).path == run.path
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "reports" / "linked").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(UsageError, match="is a symlink"):
        RunDir.open(tmp_path / "reports" / "linked", params)
    with pytest.raises(UsageError, match="is a symlink"):
        RunDir.create(params, path=tmp_path / "reports" / "linked")
    assert victim.read_text() == "keep me" and not any(elsewhere.iterdir())


def _forged_link(run: Path, kind: str, files: dict[str, str], removed: list[str] | None = None) -> str:
    """A link written by hand after the seal, correctly chained (what anyone who can write the
    directory can make): ``files`` relative path -> text, written and hashed."""
    for rel, text in files.items():
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith(".ipynb"):
            _notebook(run / rel, text)
        else:
            (run / rel).write_text(text)
    links = read_links(run)
    prev = links[-1].sha256 if links else sha256_file(run / "manifest.json")
    name = f"links/{len(links) + 1:04d}-{kind}.json"
    write_json_atomic(run / name, {"kind": kind, "prev_sha256": prev, "files": {r: sha256_file(run / r) for r in files},
                                   "removed": removed or [], "at": iso(DECIDED), "by": "mallory"})
    return name


@pytest.mark.parametrize(("kind", "files", "removed", "why"), [
    ("cleanup", {"02_map_target.ipynb": "All slices passed ... **GO**"}, [],
     "adds 02_map_target.ipynb, which a cleanup link never holds"),
    ("cleanup", {"receipt.json": '{"decision": "GO"}'}, [], "adds receipt.json, which a cleanup link never holds"),
    ("cleanup", {"approvals/x.json": "{}"}, ["04/throughput.csv"], "removes 04/throughput.csv"),
    ("resolution", {"resolution.json": "{}", "01_freeze_source.ipynb": "rewritten"}, [],
     "adds 01_freeze_source.ipynb, which a resolution link never holds"),
    ("notes", {"notes.txt": "hello"}, [], "its kind 'notes' is none a runbook command writes"),
])
def test_a_hand_written_link_holds_only_what_its_command_writes(
        tmp_path: Path, kind: str, files: dict[str, str], removed: list[str], why: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Correctly chained links that add a phase notebook, rewrite the receipt or a notebook,
    # remove a sealed file, or are of a kind no command writes: each is a broken link, and what
    # it names counts as an addition (or the sealed file as altered or missing), so verify fails
    # and the report shows none of it, signed run or not.
    from runbook_lib.evidence.signing import generate_key

    key = tmp_path / "seal.key"
    generate_key(key)
    run = _sealed(tmp_path, "GO", signing_key=f"file:{key}")
    link = _forged_link(run, kind, files, removed)
    bad = _bad(run)
    assert bad[link].startswith("broken-link") and why in bad[link]
    assert all(rel in bad for rel in files)
    assert cli_main(["verify", "--key", f"{key}.pub", str(run)]) == 1
    out = capsys.readouterr().out
    assert f"does not cover the 1 link(s) written after the seal ({link})" in out
    html = write_html(run, tmp_path / "r.html", unverified=[link]).read_text()
    assert "All slices passed" not in html


def test_a_cleanup_after_the_seal_is_a_valid_link_and_may_rewrite_only_its_record(tmp_path: Path) -> None:
    run = _sealed(tmp_path, "GO")
    _forged_link(run, "cleanup", {"cleanup.json": '{"destroyed": []}', "approvals/teardown.json": "{}"})
    _forged_link(run, "cleanup", {"cleanup.json": '{"destroyed": ["pod-1"]}'})  # a second cleanup
    assert _bad(run) == {}
    third = _forged_link(run, "cleanup", {"approvals/teardown.json": '{"approved_by": "mallory"}'})
    assert "replaces the sealed approvals/teardown.json" in _bad(run)[third]


def test_runbook_list_says_whether_each_runs_evidence_verifies(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # A NO-GO run whose manifest was edited to read GO is listed ALTERED beside whatever it claims;
    # a run with no seal is unsealed; an untouched one verified.
    edited, intact = _sealed(tmp_path / "a", "NO-GO"), _sealed(tmp_path / "a", "GO")
    manifest = json.loads((edited / "manifest.json").read_text())
    manifest["decision"] = "GO"
    write_json_atomic(edited / "manifest.json", manifest)
    unsealed = tmp_path / "a" / "reports" / "20260301T120000Z-demo-embed-endpoint-running"
    unsealed.mkdir()
    shutil.copyfile(ROOT / "params" / "demo.yaml", unsealed / "params.yaml")
    assert cli_main(["list", "--reports", str(edited.parent)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[3] for line in out.splitlines() if line.startswith("2026")}
    assert rows == {edited.name: "ALTERED", intact.name: "verified", unsealed.name: "unsealed"}
    assert "`runbook verify RUN` names it" in out


@pytest.mark.parametrize("hostile", [
    '<div style="background-image:url(https://evil.example/x.png)">x</div>',
    '<svg><image href="https://evil.example/x.png"/></svg>',
    '<svg><use xlink:href="//evil.example/s.svg#a"/></svg>',
    '<svg><filter><feImage href="http://evil.example/f.png"/></filter></svg>',
    "<table><tr><td background='https://evil.example/bg.png'>x</td></tr></table>",
    '<object data="https://evil.example/o.swf"></object>',
    "<style>@import 'https://evil.example/s.css';</style>",
    '<script src="https://evil.example/x.js"></script>',
])
def test_a_remote_reference_in_any_output_makes_the_report_refuse(tmp_path: Path, hostile: str) -> None:
    # Each of these would fetch from a host if rendered; the sanitiser would strip most of them,
    # but a stripped reference is still what the notebook tried to show: the report refuses it,
    # naming the notebook, and writes nothing.
    run = _sealed(tmp_path, "GO", html=hostile)
    with pytest.raises(EvidenceError, match=r"01_freeze_source\.ipynb would load remote content"):
        write_html(run, tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()
    nb = nbformat.read(run / "01_freeze_source.ipynb", as_version=4)  # the same as an SVG output
    nb.cells[1].outputs[0].data = {"image/svg+xml": f"<svg xmlns='http://www.w3.org/2000/svg'>{hostile}</svg>"}
    nbformat.write(nb, run / "01_freeze_source.ipynb")
    with pytest.raises(EvidenceError, match="remote content"):
        write_html(run, tmp_path / "r.html")


def test_a_notebook_name_is_escaped_in_the_report(tmp_path: Path) -> None:
    # A sealed notebook whose file name is markup: the report shows the name as text.
    run = tmp_path / "reports" / "20260301T110000Z-demo-embed-endpoint-go"
    (run / "04").mkdir(parents=True)
    (run / "params.yaml").write_text((ROOT / "params" / "demo.yaml").read_text())
    _notebook(run / "02_<img src=x onerror=alert(1)>.ipynb", "# Phase 02")
    write_json_atomic(run / "receipt.json", {"run_id": run.name, "decision": "GO", "decided_at": iso(DECIDED),
                                             "hold_deadline": iso(DEADLINE), "source": {"release": "a"},
                                             "target": {"release": "b"}, "route": {"target_percent": 0},
                                             "resources": {"remaining": []}})
    seal_run(run, load_params(run / "params.yaml"), run / "params.yaml", decision="GO", complete=True)
    html = write_html(run, tmp_path / "r.html").read_text()
    assert "02_&lt;img src=x onerror=alert(1)&gt;.ipynb" in html and "<img src=x" not in html


def test_cleanup_and_resolve_never_write_through_a_symlink_planted_in_the_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A planted links/ -> elsewhere would receive cleanup's and resolve's links: both stop first
    # (exit 2), naming the symlink, and write nothing anywhere.
    run = _sealed(tmp_path, "HOLD")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run / "links").symlink_to(elsewhere)
    assert cli_main(["cleanup", str(run)]) == EXIT_USAGE
    assert "holds symlinks: links" in capsys.readouterr().err
    assert cli_main(["resolve", str(run), "--decision", "NO-GO", "--by", "alice"]) == EXIT_USAGE
    assert "holds symlinks: links" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == [] and not (run / "cleanup.json").exists()
    assert not (run / "resolution.json").exists()


def test_an_output_cannot_wear_the_reports_own_classes() -> None:
    # A red "UNVERIFIED" box drawn inside an output with the report's banner class loses it.
    clean = sanitize_fragment("<div class='runbook-unverified'>UNVERIFIED</div><td class='verdict-PASS'>x</td>")
    assert "runbook-unverified" not in clean and "UNVERIFIED" in clean


def test_verify_key_refuses_a_legacy_seal_and_a_second_resolution_link_is_broken(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    private, public = _keys(tmp_path)
    run = _sealed(tmp_path, "GO", signing_key=f"file:{private}")
    manifest = json.loads((run / "manifest.json").read_text())
    del manifest["seal"]  # as an older runbook sealed it: never signed
    write_json_atomic(run / "manifest.json", manifest)
    marker = json.loads((run / "_SUCCESS").read_text())
    marker["files"]["manifest.json"] = sha256_file(run / "manifest.json")
    write_json_atomic(run / "_SUCCESS", marker)
    assert cli_main(["verify", "--key", str(public), str(run)]) == 1
    assert "a legacy seal is never signed" in capsys.readouterr().out
    # A HOLD resolved by a person, then a second resolution link over another resolution.json.
    held = _sealed(tmp_path / "h", "HOLD")
    resolve_run(held, decision="NO-GO", by="alice", now=DECIDED)
    body = json.loads((held / "resolution.json").read_text())
    second = _forged_link(held, "resolution", {"resolution.json": json.dumps({**body, "decision": "GO"})})
    bad = _bad(held)
    assert "replaces the sealed resolution.json" in bad[second] and bad["resolution.json"].startswith("altered")
    assert standing(held).decision != "GO"


def test_report_pdf_without_a_chromium_is_a_usage_error_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _sealed(tmp_path, "GO")
    out = tmp_path / "r.html"
    assert cli_main(["report", str(run), "-o", str(out), "--pdf", "--chromium", str(tmp_path / "no-chromium")]) == \
        EXIT_USAGE
    assert "--pdf needs" in capsys.readouterr().err
    assert not out.exists() and not out.with_suffix(".pdf").exists()


def test_an_approval_on_record_is_never_rewritten_so_a_later_cleanup_adds_a_valid_link(tmp_path: Path) -> None:
    # A teardown approved destroying a pod that was then left (sealed); `runbook cleanup` then
    # destroys the same pod under the same plan: the sealed approval stands (its bytes unchanged),
    # the cleanup's link holds only cleanup.json, and the run still verifies.
    from runbook_lib.evidence.approvals import Approval, record
    from runbook_lib.evidence.closedworld import append_link
    from runbook_lib.providers.base import Plan

    plan = Plan(provider="local", action="destroy", target="pod-1", spec=None, cost_usd_per_hour=0.0, dry_run=False)
    run = _sealed(tmp_path, "NO-GO", before_seal=lambda d: record(
        d, Approval(plan.fingerprint, "runbook", "2026-03-01T11:00:00Z", "teardown"), plan))
    [sealed] = (run / "approvals").glob("*.json")
    before = sealed.read_bytes()
    assert record(run, Approval(plan.fingerprint, "runbook", "2026-03-02T09:00:00Z", "teardown"), plan) == sealed
    assert sealed.read_bytes() == before
    (run / "cleanup.json").write_text('{"destroyed": ["pod-1"]}')
    append_link(run, "cleanup", ["cleanup.json"])
    assert _bad(run) == {}
    with pytest.raises(ValueError, match=f"replaces the sealed approvals/{sealed.name}"):  # a writer bug, named
        append_link(run, "cleanup", [f"approvals/{sealed.name}"])


def test_a_styler_tables_css_never_reaches_the_report_as_text(tmp_path: Path) -> None:
    """A pandas Styler table carries its colours in a <style> element; nbconvert's sanitiser would
    drop the tag and keep the rules as a paragraph of text (issue 47). The report drops the rules."""
    import nbformat
    import pandas as pd

    from runbook_lib.evidence.report import exported_notebook

    styled = pd.DataFrame({"gate": ["error_rate"], "verdict": ["PASS"]}).style.map(
        lambda v: "background-color: #c8e6c9" if v == "PASS" else "")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("table", outputs=[nbformat.v4.new_output(
        "display_data", data={"text/html": styled.to_html(), "text/plain": "table"})])])
    path = tmp_path / "04_compare_production.ipynb"
    nbformat.write(nb, path)
    assert "background-color" in styled.to_html()  # the Styler does write rules
    body = exported_notebook(path)
    assert "background-color" not in body and "#T_" not in body
    assert "error_rate" in body and "PASS" in body  # the table itself stays


def test_an_older_runs_single_signed_statement_still_verifies_with_its_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Runs sealed before the bundle hold attestation.dsse.json: one statement with the package's own
    # predicate over every sealed file. Written here as that code wrote it (signing.statement and
    # signed_envelope are kept for it), it verifies with its key, and an edit resealed without it fails.
    from runbook_lib.evidence.closedworld import seal_listing
    from runbook_lib.evidence.signing import signed_envelope, statement

    private, public = _keys(tmp_path)
    run = _sealed(tmp_path, "GO")
    (run / "attestation.intoto.jsonl").unlink()
    write_json_atomic(run / "attestation.dsse.json", signed_envelope(statement(run), load_signer(f"file:{private}")))
    assert cli_main(["verify", "--key", str(public), str(run)]) == 0
    assert "intact       attestation.dsse.json" in capsys.readouterr().out
    receipt = json.loads((run / "receipt.json").read_text())
    write_json_atomic(run / "receipt.json", {**receipt, "decision": "NO-GO"})
    manifest = json.loads((run / "manifest.json").read_text())
    write_json_atomic(run / "manifest.json", {**manifest, "seal": seal_listing(run)})
    assert cli_main(["verify", "--key", str(public), str(run)]) == 1
    assert "receipt.json: not what the signed statement names" in capsys.readouterr().out
