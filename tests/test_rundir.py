"""One run lifecycle: RunDir creates and opens runs, paths resolve against the project and not the
working directory, and every way of running a phase scans the run for credentials."""

from __future__ import annotations

from pathlib import Path

import pytest

from runbook_lib.errors import EvidenceError, UsageError
from runbook_lib.evidence.records import FreezeData
from runbook_lib.evidence.rundir import RunDir
from runbook_lib.phases import check_credentials, open_phase

SECRET = "rundir-canary-value-4e1d9b7a"


def test_create_copies_the_params_and_open_finds_the_same_run(make_params, tmp_path: Path) -> None:
    params = make_params()
    run = RunDir.create(params)
    assert run.path.parent == tmp_path / "reports" and run.path.is_dir()
    assert run.kept_params.read_bytes() == params.read_bytes()
    assert RunDir.open(run.path, params).path == run.path
    assert RunDir.open(f"reports/{run.run_id}", params).path == run.path  # relative to the project
    assert RunDir.latest(params).path == run.path
    assert run.state_dir("local") == tmp_path / ".runbook" / "local"


def test_open_refuses_what_is_not_this_runs(make_params, tmp_path: Path) -> None:
    params = make_params()
    other = make_params(name="other.yaml", measure={"requests_per_round": 61})
    run = RunDir.create(params)
    with pytest.raises(UsageError, match="differs from the params this run started with"):
        RunDir.open(run.path, other)
    with pytest.raises(UsageError, match="does not exist"):
        RunDir.open(tmp_path / "reports" / "nope", params)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="is not a run directory"):
        RunDir.open(tmp_path / "empty", params)
    (run.path / "_SUCCESS").write_text("{}")
    with pytest.raises(UsageError, match="is sealed"):
        RunDir.open(run.path, params)
    with pytest.raises(EvidenceError, match="no run of"):
        RunDir.latest(make_params(name="fresh.yaml", migration="never-ran"))


def test_create_at_a_named_path_refuses_a_used_directory(make_params, tmp_path: Path) -> None:
    params = make_params()
    used = tmp_path / "used"
    used.mkdir()
    (used / "something").write_text("x")
    with pytest.raises(UsageError, match="not empty"):
        RunDir.create(params, path=used)
    with pytest.raises(UsageError, match="parent directory does not exist"):
        RunDir.create(params, path=tmp_path / "a" / "b")
    assert RunDir.create(params, path=tmp_path / "new").kept_params.exists()


def test_a_phase_never_changes_the_working_directory(make_params, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    params = make_params()
    ctx = open_phase("01", str(params), run_mode="headless")
    assert Path.cwd() == elsewhere
    assert ctx.run_dir.parent == tmp_path / "reports"
    assert ctx.resources.provider("source").capabilities().provider == "local"
    assert (tmp_path / ".runbook" / "local").is_dir() and not (elsewhere / ".runbook").exists()
    assert not (elsewhere / "reports").exists()


def test_interactive_finish_scans_and_redacts_like_the_runner(make_params, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRET)
    params = make_params(source={"secrets": [{"name": "HF_TOKEN", "ref": "env:HF_TOKEN"}]})
    ctx = open_phase("01", str(params), run_mode="interactive")
    ctx.evidence.write_json("01/debug.json", {"printed": f"token={SECRET}"})
    with pytest.raises(EvidenceError, match=r"credentials \(\['HF_TOKEN'\]\) found in \['01/debug.json'\]") as ei:
        ctx.finish(FreezeData())
    assert SECRET not in str(ei.value)
    assert SECRET not in (ctx.run_dir / "01" / "debug.json").read_text()
    assert "[REDACTED:HF_TOKEN]" in (ctx.run_dir / "01" / "debug.json").read_text()


def test_headless_finish_leaves_the_scan_to_the_runner(make_params, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRET)
    params = make_params(source={"secrets": [{"name": "HF_TOKEN", "ref": "env:HF_TOKEN"}]})
    ctx = open_phase("01", str(params), run_mode="headless")
    ctx.evidence.write_json("01/debug.json", {"printed": SECRET})
    record = ctx.finish(FreezeData())  # the runner scans after the kernel is gone
    assert record.path.exists() and SECRET in (ctx.run_dir / "01" / "debug.json").read_text()
    with pytest.raises(EvidenceError, match="HF_TOKEN"):
        check_credentials(ctx.run, "01")
    assert SECRET not in (ctx.run_dir / "01" / "debug.json").read_text()
