"""`runbook rehearse` end to end, as `make rehearse` runs it: params/runpod-to-vast.yaml (a Runpod
serverless queue endpoint to a Vast.ai load_balancing worker) and params/runpod-to-vast-train.yaml
run all six phases through the real Runpod and Vast.ai adapters against the loopback simulators
and moto's S3, end GO, and their evidence says they were rehearsals. Slow (about three minutes on
2 cores): `make test-e2e`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runbook_lib.cli import main as cli_main
from runbook_lib.errors import EXIT_GO

from .conftest import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.measure]  # both migrations must GO on their measurements


def test_both_migrations_rehearse_go_and_are_marked_rehearsals(tmp_path: Path, capsys,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "notebooks").symlink_to(ROOT / "notebooks")
    (tmp_path / "params").mkdir()
    names = ("runpod-to-vast.yaml", "runpod-to-vast-train.yaml")
    for name in names:
        (tmp_path / "params" / name).write_text((ROOT / "params" / name).read_text())
    before = {n: (tmp_path / "params" / n).read_bytes() for n in names}
    for var in ("RUNPOD_API_KEY", "VAST_API_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    code = cli_main(["rehearse"])  # the default: both migrations, as `make rehearse`
    out = capsys.readouterr().out
    assert code == EXIT_GO, out
    assert out.count(": GO (exit 0)") == 2 and "rehearse_s=" in out
    assert "POST /v2/serverless x1" in out and "POST /v2/{id}/runsync x" in out  # the job API reached real workers
    assert {n: (tmp_path / "params" / n).read_bytes() for n in names} == before  # committed params untouched
    by_kind = {("train" if "digits" in d.name else "inference"): d for d in (tmp_path / "reports").iterdir()
               if d.is_dir()}
    assert set(by_kind) == {"inference", "train"}
    for kind, run_dir in by_kind.items():
        receipt = json.loads((run_dir / "receipt.json").read_text())
        assert receipt["decision"] == "GO", kind
        assert receipt["rehearsal"]["simulators"] == {"source": "runpod", "target": "vast"}
        assert "source.dry_run = False" in receipt["rehearsal"]["params"]["overrides"]
        point = receipt["rollback_point"]  # names who may order a rollback, and the source kept running
        assert (point["rollback_owner"], point["source_provider"]) == ("platform-oncall@example.com", "runpod")
        assert json.loads((run_dir / "manifest.json").read_text())["rehearsal"]["simulators"]
        approvals = [json.loads(p.read_text())["approval"]["method"] for p in (run_dir / "approvals").glob("*.json")]
        assert approvals and all("simulator" in m or "teardown" in m for m in approvals)
        assert cli_main(["verify", str(run_dir)]) == 0
        for f in run_dir.rglob("*"):  # the simulators' keys never reach the evidence
            if f.is_file():
                assert b"sim-rp-" not in f.read_bytes() and b"sim-vast-" not in f.read_bytes(), f
    rec02 = json.loads((by_kind["inference"] / "02_map_target.json").read_text())
    row = next(r for r in rec02["data"]["dependency_map"] if r["dependency"] == "endpoint mode")
    assert (row["source"], row["target"], row["status"]) == ("queue", "load_balancing", "adapter needed")
    rec04 = json.loads((by_kind["inference"] / "04_compare_production.json").read_text())["data"]
    assert rec04["endpoint_modes"] == {"source": "queue", "target": "load_balancing"}
    target_url = rec04["endpoint_urls"]["target"]
    assert target_url.startswith("http://127.0.0.1:") and not target_url.endswith(":8000")  # Vast's mapped port
    drills = {d["drill"]: d for d in rec04["drills"]}  # a load-balancing target: only two drills can run
    assert drills["preferred_offer_removed"]["verdict"] == "PASS", drills
    assert "withdrew offer 8812345" in drills["preferred_offer_removed"]["observation"]
    assert drills["spend_limit"]["verdict"] == "PASS", drills
    assert all(drills[n]["verdict"] == "INCONCLUSIVE" and "load_balancing endpoint has no job API"
               in drills[n]["observation"] for n in ("redeliver", "hung_worker", "output_durability"))
    assert not any(d["blocking"] for d in drills.values())  # scored: params/runpod-to-vast.yaml blocks none
    assert cli_main(["list", "--reports", str(tmp_path / "reports")]) == 0
    assert capsys.readouterr().out.count("REHEARSAL: ") == 2
