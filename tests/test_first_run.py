"""What a first run meets at the command line: `runbook` alone, a key in a directory that does
not exist yet, a phase run before the ones it needs, and text from params shown, never obeyed."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from runbook_lib.cli import main as cli_main
from runbook_lib.errors import EXIT_USAGE
from runbook_lib.evidence.rundir import RunDir
from runbook_lib.run.runner import escaped, phase_out_of_order

from .conftest import ROOT
from .runs import write_params


def test_runbook_alone_prints_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main([]) == EXIT_USAGE
    out = capsys.readouterr().out
    assert "usage: runbook" in out and "run all six phases of a migration" in out


def test_keygen_creates_the_keys_directory_private(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "home" / ".runbook" / "seal.key"  # as the README writes it, on a fresh home
    assert cli_main(["keygen", str(key)]) == 0
    assert key.exists() and key.with_name("seal.key.pub").exists()
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700 and stat.S_IMODE(key.stat().st_mode) == 0o600


def test_a_phase_before_the_ones_it_needs_is_refused_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    params = write_params(tmp_path)
    run_dir = tmp_path / "reports" / "r1"
    run_dir.parent.mkdir()
    run = RunDir.create(params, path=run_dir)
    assert phase_out_of_order(run, "01") is None and phase_out_of_order(run, "06") is None
    why = phase_out_of_order(run, "03")
    assert why is not None and "phase 01 (01_freeze_source) has not run" in why and f"runbook phase 01 {params} {run_dir}" in why
    assert cli_main(["phase", "03", str(params), str(run_dir)]) == EXIT_USAGE
    assert "has not run" in capsys.readouterr().err
    assert run.records() == {}  # nothing was written: the run is still usable from phase 01


def test_text_said_to_the_terminal_has_its_control_characters_escaped() -> None:
    seen: list[str] = []
    escaped(seen.append)("run r: v1\x1b[2J A  ->  B\nnext line\tok")
    assert seen == ["run r: v1\\x1b[2J A  ->  B\nnext line\\tok"]


@pytest.mark.parametrize(("rc", "make_fails"), [(0, False), (1, False), (3, False), (4, True), (2, True)])
def test_make_demo_reports_a_no_go_or_hold_as_a_decision_and_a_failed_run_as_a_failure(
        tmp_path: Path, rc: int, make_fails: bool) -> None:
    import os
    import subprocess
    import time

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "runbook"  # stands for `runbook run`: prints its last line, exits rc
    fake.write_text(f"#!/bin/sh\necho 'decision: X (exit {rc}; ...)'\nexit {rc}\n")
    fake.chmod(0o755)
    stamp = venv / ".installed"
    stamp.touch()
    later = time.time() + 3600  # newer than pyproject.toml and the lock: make installs nothing
    os.utime(stamp, (later, later))
    got = subprocess.run(["make", "-s", "-C", str(ROOT), "demo", f"VENV={venv}"], capture_output=True, text=True,
                         timeout=60)
    assert (got.returncode != 0) == make_fails, got.stderr
    assert got.stdout.strip().splitlines()[-1] == f"decision: X (exit {rc}; ...)"


def test_runbook_run_ends_with_the_decision_its_exit_codes_and_first_reason() -> None:
    from runbook_lib.cli import EXIT_MEANINGS, decision_line

    line = decision_line("HOLD", 3, "noise_floor INCONCLUSIVE (phase 04): the setup is too noisy")
    assert line == "decision: HOLD (exit 3): noise_floor INCONCLUSIVE (phase 04): the setup is too noisy"
    assert "3 HOLD (each a decision, not a crash)" in EXIT_MEANINGS and "4 failed" in EXIT_MEANINGS
