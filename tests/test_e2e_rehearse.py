"""`runbook rehearse` end to end: params/runpod-to-vast-train.yaml runs all six phases through the
real Runpod and Vast.ai adapters against the loopback simulators and moto's S3, ends GO, and its
evidence says it was a rehearsal. Slow (two minutes on 2 cores): `make test-e2e`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runbook_lib.cli import main as cli_main
from runbook_lib.errors import EXIT_GO

from .conftest import ROOT

pytestmark = pytest.mark.e2e


def test_the_training_migration_rehearses_go_and_is_marked_a_rehearsal(tmp_path: Path, capsys,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "notebooks").symlink_to(ROOT / "notebooks")
    (tmp_path / "params").mkdir()
    real = tmp_path / "params" / "runpod-to-vast-train.yaml"
    real.write_text((ROOT / "params" / "runpod-to-vast-train.yaml").read_text())
    before = real.read_bytes()
    for var in ("RUNPOD_API_KEY", "VAST_API_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    code = cli_main(["rehearse", str(real)])
    out = capsys.readouterr().out
    assert code == EXIT_GO, out
    assert "rehearse_s=" in out and "vast simulator requests:" in out and "PUT /api/v0/asks/{id}" in out
    assert real.read_bytes() == before  # the committed params stay dry-run and real-sized
    [run_dir] = [p for p in (tmp_path / "reports").iterdir() if p.is_dir()]
    receipt = json.loads((run_dir / "receipt.json").read_text())
    assert receipt["decision"] == "GO"
    assert receipt["rehearsal"]["simulators"] == {"source": "runpod", "target": "vast"}
    assert "source.dry_run = False" in receipt["rehearsal"]["params"]["overrides"]
    point = receipt["rollback_point"]  # names who may order a rollback, and the source kept running
    assert (point["rollback_owner"], point["source_provider"]) == ("platform-oncall@example.com", "runpod")
    assert json.loads((run_dir / "manifest.json").read_text())["rehearsal"]["simulators"]
    approvals = [json.loads(p.read_text())["approval"]["method"] for p in (run_dir / "approvals").glob("*.json")]
    assert approvals and all("simulator" in m or "teardown" in m for m in approvals)
    assert cli_main(["list", "--reports", str(tmp_path / "reports")]) == 0
    assert "REHEARSAL: " in capsys.readouterr().out
    assert cli_main(["verify", str(run_dir)]) == 0
    for f in run_dir.rglob("*"):  # the simulators' keys never reach the evidence
        if f.is_file():
            assert b"sim-rp-" not in f.read_bytes() and b"sim-vast-" not in f.read_bytes(), f
