"""`benchmarks/soak.py` (README, Soak): it exits 1 on any run that exits 4 or on anything left
behind, and 0 otherwise, whatever the decisions. Each case soaks a temporary project (``--root``)
with one real `runbook run`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT
from .runs import write_params

pytestmark = pytest.mark.e2e


def _soak(project: Path, params: Path) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--root", str(project), "--runs", "1",
                           "--params", str(params.relative_to(project))],
                          capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def test_soak_exits_0_on_a_clean_failure_and_1_on_anything_left_behind(tmp_path: Path) -> None:
    # A run refused at the door (params with an unknown field: exit 2, nothing created) is not a
    # crash: the soak exits 0. The same soak with a file in .runbook/ that the runbook does not keep
    # exits 1 and names it.
    params = write_params(tmp_path, "demo.yaml", surprise=True)
    code, out = _soak(tmp_path, params)
    assert code == 0, out
    assert "exit=2" in out and out.rstrip().endswith("crashes=0 leftovers=0"), out
    (tmp_path / ".runbook").mkdir(exist_ok=True)
    (tmp_path / ".runbook" / "scratch.bin").write_bytes(b"left by hand")
    code, out = _soak(tmp_path, params)
    assert code == 1, out
    assert ".runbook/scratch.bin is not something the runbook keeps" in out
    assert out.rstrip().endswith("crashes=0 leftovers=1"), out


def test_soak_exits_1_on_a_run_that_exits_4(tmp_path: Path) -> None:
    # A 3 s cell timeout fails phase 01 of the training demo (exit 4, a failed phase); phase 06
    # still tears its freeze pod down, so nothing is left, and the crash alone makes the exit 1.
    params = write_params(tmp_path, "demo-train.yaml", run={"cell_timeout_s": 3})
    code, out = _soak(tmp_path, params)
    assert code == 1, out
    assert "exit=4" in out and "failed_phase=01" in out, out
    assert out.rstrip().endswith("crashes=1 leftovers=0"), out
