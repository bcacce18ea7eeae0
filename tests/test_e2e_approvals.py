"""Nothing pre-approved: each phase that rents or moves something stops at its start with every
plan it will apply waiting (HOLD, nothing created), one `runbook approve` covers them all, and
the phase then runs to its end. The fingerprints a phase shows before its approval cell are
exactly the ones it applies: a mismatch would hold the phase again (:func:`tests.runs.approval_walk`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .runs import FAST_INFERENCE, NOT_PREAPPROVED, QUIET, approval_walk, merged

pytestmark = [pytest.mark.e2e, pytest.mark.measure]


def _ends_go_with_everything_destroyed(run_dir: Path) -> None:
    receipt = json.loads((run_dir / "receipt.json").read_text())
    assert receipt["decision"] == "GO" and all(c["state"] == "DESTROYED" for c in receipt["resources"]["created"])


def test_every_phase_holds_for_all_its_plans_then_runs_on_one_approval_inference(make_params, tmp_path: Path) -> None:
    params = make_params("demo.yaml", **merged(FAST_INFERENCE, QUIET, NOT_PREAPPROVED))
    run_dir = approval_walk(params, tmp_path, {"04": {"create_endpoint"}, "05": {"route"}})
    _ends_go_with_everything_destroyed(run_dir)


def test_every_phase_holds_for_all_its_plans_then_runs_on_one_approval_training(approved_training_run: Path) -> None:
    # The walk (conftest.py's approved_training_run) asserts each hold and approval as it goes;
    # phases 04 and 05 each apply launch_pod plans only, the ones they showed.
    _ends_go_with_everything_destroyed(approved_training_run)
