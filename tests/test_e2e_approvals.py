"""Nothing pre-approved: each phase that rents or moves something stops at its start with every
plan it will apply waiting (HOLD, nothing created), one `runbook approve` covers them all, and
the phase then runs to its end. The fingerprints a phase shows before its approval cell are
exactly the ones it applies: a mismatch would hold the phase again (:func:`tests.runs.approval_walk`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .runs import FAST_INFERENCE, NOT_PREAPPROVED, UNJUDGED, approval_walk, merged

pytestmark = pytest.mark.e2e


def _every_phase_ran_and_everything_is_destroyed(run_dir: Path) -> dict[str, str]:
    receipt = json.loads((run_dir / "receipt.json").read_text())
    gates = {g["name"]: g["verdict"] for g in receipt["gates"]}
    assert gates["phases_complete"] == "PASS" and gates["teardown_verified"] == "PASS", receipt["reasons"]
    assert not any("approval" in r for r in receipt["reasons"]), receipt["reasons"]  # nothing left waiting
    assert receipt["resources"]["created"] and all(c["state"] == "DESTROYED" for c in receipt["resources"]["created"])
    return {"decision": receipt["decision"]}


def test_every_phase_holds_for_all_its_plans_then_runs_on_one_approval_inference(make_params, tmp_path: Path) -> None:
    # About the holds and approvals, not the verdicts: phase 04 measures the least the params allow
    # and its verdicts are not judged (each phase is run by run_phase, as `runbook phase` runs it).
    params = make_params("demo.yaml", **merged(FAST_INFERENCE, UNJUDGED, NOT_PREAPPROVED))
    run_dir = approval_walk(params, tmp_path, {"04": {"create_endpoint"}, "05": {"route"}})
    _every_phase_ran_and_everything_is_destroyed(run_dir)


@pytest.mark.measure  # the shared training run is also the training demo's GO
def test_every_phase_holds_for_all_its_plans_then_runs_on_one_approval_training(approved_training_run: Path) -> None:
    # The walk (conftest.py's approved_training_run) asserts each hold and approval as it goes;
    # phases 04 and 05 each apply launch_pod plans only, the ones they showed.
    assert _every_phase_ran_and_everything_is_destroyed(approved_training_run)["decision"] == "GO"
