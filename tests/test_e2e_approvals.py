"""Nothing pre-approved: each phase that rents or moves something stops at its start with every
plan it will apply waiting (HOLD, nothing created), one `runbook approve` covers them all, and
the phase then runs to its end. The fingerprints a phase shows before its approval cell are
exactly the ones it applies: a mismatch would hold the phase again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.approvals import write_approval_file
from runbook_lib.phases import open_phase
from runbook_lib.rundir import RunDir
from runbook_lib.runner import run_phase

pytestmark = pytest.mark.e2e

NOT_PREAPPROVED = {"approvals": {"preapproved_local": False}}
FAST_INFERENCE = {"measure": {"requests_per_round": 45, "throughput_requests": 24, "warmup_requests": 10,
                              "cold_starts": 1},
                  "gates": {"min_latency_samples": 40}, "cutover": {"requests_per_step": 10}}
FAST_TRAINING = {"workload": {"train_steps": 60}, "measure": {"rounds": 4}, "gates": {"min_latency_samples": 20}}


def _shown(params: Path, run: RunDir, phase: str) -> list[str]:
    """The fingerprints the phase's plan cell shows (the notebook's ``<module>.plan(ctx)``)."""
    from runbook_lib.phases import compare, cutover, freeze, parity

    mod: Any = {"01": freeze, "03": parity, "04": compare, "05": cutover}[phase]
    ctx = open_phase(phase, str(params), str(run.path), run_mode="headless")
    return [p.fingerprint for p in mod.plan(ctx).plans]


def _applied(run: RunDir, phase: str) -> list[dict[str, Any]]:
    rec = json.loads(next(run.path.glob(f"{phase}_*.json")).read_text())
    return [p for p in rec["data"].get("plans", []) if p["applied"] and p["plan"]["action"] != "destroy"]


@pytest.mark.parametrize(("base", "fast", "kinds"), [
    ("demo.yaml", FAST_INFERENCE, {"04": {"create_endpoint"}, "05": {"route"}}),
    ("demo-train.yaml", FAST_TRAINING, {"04": {"launch_pod"}, "05": {"launch_pod"}}),
])
def test_every_phase_holds_for_all_its_plans_then_runs_on_one_approval(make_params, tmp_path: Path, base: str,
                                                                       fast: dict[str, Any],
                                                                       kinds: dict[str, set[str]]) -> None:
    params = make_params(base, **fast, **NOT_PREAPPROVED)
    run = RunDir.create(params, reports_dir=tmp_path / "reports")
    for phase in ("01", "02", "03", "04", "05"):
        first = run_phase(run, phase)
        if phase == "02":  # maps offers; rents nothing
            assert first.status == "completed", first.reason
            continue
        shown = _shown(params, run, phase) if phase in ("04", "05") else []
        assert first.status == "held", (phase, first.status, first.reason)
        pending = sorted(p.name for p in (run.path / "approvals").glob("pending-*.json"))
        if shown:  # the whole step waits, not its first plan
            assert pending == sorted(f"pending-{f[:16]}.json" for f in set(shown)), phase
            assert f"{len(shown)} plans this step applies" in first.reason
        approval = tmp_path / f"approval-{phase}.json"
        body = write_approval_file(run.path, approval, approved_by="release-manager")
        assert set(shown) <= set(body["fingerprints"])
        second = run_phase(run, phase, approval_ref=str(approval))
        assert second.status == "completed", (phase, second.reason)
        assert not list((run.path / "approvals").glob("pending-*.json"))
        if shown:
            applied = _applied(run, phase)
            assert {p["plan"]["action"] for p in applied} == kinds[phase]
            assert {p["plan"]["fingerprint"] for p in applied} <= set(shown)  # the shown plans are the applied ones
            assert all(p["method"] == f"file:{approval}" for p in applied)
    end = run_phase(run, "06")  # tears down phase 04's endpoints under their launch approvals
    assert end.status == "completed", end.reason
    receipt = json.loads((run.path / "receipt.json").read_text())
    assert receipt["decision"] == "GO" and all(c["state"] == "DESTROYED" for c in receipt["resources"]["created"])
