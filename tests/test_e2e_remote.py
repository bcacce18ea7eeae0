"""``params/runpod-to-vast*.yaml`` end to end through papermill: without credentials a run stops at
the first phase that needs an API, naming the reference; with the provider fixtures the training
migration plans phases 01-03 in dry-run, and so does the inference one, whose phase 02 maps the
Runpod queue endpoint to a Vast.ai load_balancing worker as a named adapter; with dry-run off and no
approval a run holds before creating anything.
Remote APIs are the recorded-shape fixtures (``--provider-fixtures``); nothing reaches a network."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runbook_lib.audit.verify import verify_run
from runbook_lib.cli import main as cli_main
from runbook_lib.errors import EXIT_FAILED, EXIT_HOLD, EXIT_NO_GO, EXIT_USAGE

from .conftest import ROOT

pytestmark = pytest.mark.e2e
WRITES = ("POST api.runpod.io/v2/pods", "POST api.runpod.io/v2/serverless", "POST api.runpod.io/graphql",
          "PUT console.vast.ai/api/v0/asks", "DELETE", "PUT console.vast.ai/api/v0/instances")


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project dir with the real notebooks and params (``m.yaml``: the training migration,
    ``inference.yaml``: the inference one), and no provider or bucket keys anywhere."""
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "notebooks").symlink_to(ROOT / "notebooks")
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "m.yaml").write_text((ROOT / "params" / "runpod-to-vast-train.yaml").read_text())
    (tmp_path / "params" / "inference.yaml").write_text((ROOT / "params" / "runpod-to-vast.yaml").read_text())
    for var in ("RUNPOD_API_KEY", "VAST_API_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                "RUNBOOK_PROVIDER_FIXTURES"):
        monkeypatch.setenv(var, "")  # recorded, so the CLI's own setting is undone after the test
        monkeypatch.delenv(var)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.runpod or ~/.config/vastai key files
    return tmp_path


def _run(project: Path, *extra: str, capsys: pytest.CaptureFixture[str], params: str = "m.yaml"
         ) -> tuple[int, Path, str]:
    code = cli_main(["run", str(project / "params" / params), *extra])
    out = capsys.readouterr().out
    run_dir = Path(out.split("evidence: ")[-1].split("\n", 1)[0].strip())
    return code, run_dir, out


def _requests(project: Path) -> list[str]:
    """Every request the provider fixtures answered, in order (``METHOD host/path``). An empty log
    means the run never reached the fixtures: a "nothing was written" check over it would pass
    without proving anything, so it fails here."""
    logs = sorted((project / ".runbook" / "fixtures").glob("*.log"))
    lines = [line for f in logs for line in f.read_text().splitlines()]
    assert lines, f"no request reached the provider fixtures ({len(logs)} log files under .runbook/fixtures)"
    return lines


def _writes(project: Path) -> list[str]:
    """The requests that would create, change or destroy something (:data:`WRITES`), out of a
    log that shows the run did reach the fixtures (:func:`_requests`)."""
    return [r for r in _requests(project) if r.startswith(WRITES)]


def test_without_credentials_stops_at_phase_01_naming_the_reference(project: Path, capsys) -> None:
    code, run_dir, out = _run(project, capsys=capsys)
    assert code == EXIT_FAILED
    rec = json.loads((run_dir / "01_freeze_source.json").read_text())
    assert rec["status"] == "failed" and "AuthError" in rec["data"]["error"]
    assert "tried env:RUNPOD_API_KEY" in rec["data"]["error"] and "Nothing was created" in rec["data"]["error"]
    receipt = json.loads((run_dir / "receipt.json").read_text())
    assert receipt["resources"]["created"] == []
    teardown = next(g for g in receipt["gates"] if g["name"] == "teardown_verified")
    assert teardown["verdict"] == "PASS" and "no plan was applied there" in teardown["detail"]


RUNPOD_CANARY = "rpa_" + "C4n4ry" * 6
VAST_CANARY = "vast-canary-key-5d1f0e9a7c3b"


def test_fixtures_plan_phases_01_to_03_in_dry_run(project: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNPOD_API_KEY", RUNPOD_CANARY)  # present, unused (fixture mode), and never written
    monkeypatch.setenv("VAST_API_KEY", VAST_CANARY)
    code, run_dir, out = _run(project, "--provider-fixtures", capsys=capsys)
    assert code == EXIT_HOLD, out
    chain = {p: json.loads((run_dir / f"{p}.json").read_text()) for p in
             ("01_freeze_source", "02_map_target", "03_prove_parity")}
    assert all(r["status"] == "completed" for r in chain.values())
    assert not (run_dir / "04_compare_production.json").exists() and "dry-run: phases 01-03 only planned" in out
    freeze, canary = chain["01_freeze_source"]["data"], chain["03_prove_parity"]["data"]
    assert freeze["dry_run"] and canary["dry_run"]
    assert [p["applied"] for p in freeze["plans"] + canary["plans"]] == [False, False]
    assert freeze["plans"][0]["plan"]["spec"]["offers"] == ["NVIDIA GeForce RTX 4090"]  # the source's GPU type
    assert canary["plan"]["spec"]["offers"] == ["8812345", "8812501"]  # phase 02's ranking, cheapest first
    assert canary["plan"]["spec"]["ports"] == [] and canary["plan"]["provider"] == "vast"  # an agent serves nothing
    finding = [f for f in freeze["credential_findings"] if f["finding"]]
    # the source container exports the provider key, and an HF_TOKEN these params do not declare
    assert [f["variable"] for f in finding] == ["HF_TOKEN", "RUNPOD_API_KEY"]
    offers = chain["02_map_target"]["data"]["offers"]
    assert {r["offer_id"]: r["accepted"] for r in offers["table"]} == {
        "8812345": True, "8812399": False, "8812400": False, "8812501": True}
    receipt = json.loads((run_dir / "receipt.json").read_text())
    assert receipt["decision"] == "HOLD" and any("dry_run" in r for r in receipt["reasons"])
    assert not _writes(project), "dry-run must not create or change anything"
    assert {r["status"] for r in verify_run(run_dir)} == {"intact"}
    for f in run_dir.rglob("*"):
        if f.is_file():
            assert RUNPOD_CANARY.encode() not in f.read_bytes() and VAST_CANARY.encode() not in f.read_bytes(), f
    scans = json.loads((run_dir / "manifest.json").read_text())["secret_scans"]
    assert all({"runpod API key", "vast API key"} <= set(s["secret_names"]) for s in scans)


def test_headless_non_local_launch_without_approval_holds_and_creates_nothing(project: Path, capsys) -> None:
    p = project / "params" / "m.yaml"
    p.write_text(p.read_text().replace("dry_run: true", "dry_run: false"))
    code, run_dir, out = _run(project, "--provider-fixtures", capsys=capsys)
    assert code == EXIT_HOLD, out
    rec = json.loads((run_dir / "01_freeze_source.json").read_text())
    assert rec["status"] == "held" and "has no approval record" in rec["data"]["error"]
    assert "provider 'runpod'" in rec["data"]["error"]
    assert not _writes(project), "nothing may be created without approval"
    receipt = json.loads((run_dir / "receipt.json").read_text())
    assert receipt["decision"] == "HOLD" and receipt["resources"]["created"] == []


def test_approving_the_dry_run_plans_lets_the_real_run_apply_them(project: Path, capsys,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Dry run -> `runbook approve` -> dry_run: false: the same fingerprints are approved, the freeze
    pod is created on the fake API, and (no agent runs there) phase 01 fails on the missing result
    set with the pod destroyed: nothing is left behind."""
    p = project / "params" / "m.yaml"
    p.write_text(p.read_text().replace("url: s3://digits-migration-evidence/runpod-to-vast", "url: file://.runbook/store"))
    code, dry_dir, out = _run(project, "--provider-fixtures", capsys=capsys)
    assert code == EXIT_HOLD
    assert cli_main(["resolve", str(dry_dir), "--decision", "GO", "--by", "e2e"]) == EXIT_USAGE  # nothing ran
    assert cli_main(["approve", str(dry_dir), "--by", "e2e-approver"]) == 0
    approval = json.loads((project / "approvals" / "digits-runpod-to-vast.json").read_text())
    assert [x["action"] for x in approval["plans"]] == ["launch_pod", "launch_pod"]
    p.write_text(p.read_text().replace("dry_run: true", "dry_run: false"))
    code, run_dir, out = _run(project, "--provider-fixtures", capsys=capsys)
    assert code == EXIT_FAILED, out
    rec = json.loads((run_dir / "01_freeze_source.json").read_text())
    assert rec["status"] == "failed" and "completion marker" in rec["data"]["error"]
    applied = json.loads((run_dir / "approvals" / f"{approval['fingerprints'][0][:16]}.json").read_text())
    assert applied["approval"]["approved_by"] == "e2e-approver"
    log = _requests(project)
    created = [r for r in log if r.startswith("POST api.runpod.io/v2/pods")]
    assert len(created) == 1 and any(r.startswith("DELETE api.runpod.io/v2/pods/") for r in log)
    receipt = json.loads((run_dir / "receipt.json").read_text())
    assert receipt["resources"]["remaining"] == []


def test_inference_to_vast_maps_the_queue_endpoint_to_a_named_adapter_in_phase_02(project: Path, capsys) -> None:
    # The Runpod source serves a queue endpoint; Vast.ai serves load_balancing only. Phase 02
    # decides the adapter (a request/response contract) and names it, instead of phase 04
    # discovering the difference; phases 01-03 are then planned in dry-run.
    code, run_dir, out = _run(project, "--provider-fixtures", capsys=capsys, params="inference.yaml")
    assert code == EXIT_HOLD, out
    rec = json.loads((run_dir / "02_map_target.json").read_text())
    row = next(r for r in rec["data"]["dependency_map"] if r["dependency"] == "endpoint mode")
    assert (row["source"], row["target"], row["status"]) == ("queue", "load_balancing", "adapter needed")
    assert "request/response contract" in row["reason"] and "no job ids" in row["reason"]
    assert json.loads((run_dir / "03_prove_parity.json").read_text())["data"]["dry_run"]
    assert not _writes(project)


def test_a_target_mode_the_provider_cannot_serve_stops_at_phase_02(project: Path, capsys) -> None:
    text = (project / "params" / "inference.yaml").read_text()
    assert "  endpoint_mode: load_balancing\n" in text  # the target's mode, as committed
    (project / "params" / "inference.yaml").write_text(text.replace("  endpoint_mode: load_balancing\n",
                                                                     "  endpoint_mode: queue\n"))
    code, run_dir, out = _run(project, "--provider-fixtures", capsys=capsys, params="inference.yaml")
    assert code == EXIT_NO_GO, out
    rec = json.loads((run_dir / "02_map_target.json").read_text())
    row = next(r for r in rec["data"]["dependency_map"] if r["dependency"] == "endpoint mode")
    assert row["status"] == "no equivalent" and "set target.endpoint_mode: load_balancing" in row["reason"]
    assert not (run_dir / "03_prove_parity.json").exists()
    receipt = json.loads((run_dir / "receipt.json").read_text())
    assert any("endpoint mode" in r for r in receipt["reasons"])
    assert not _writes(project)