"""Nothing pre-approved: each phase that rents or moves something stops at its start with every
plan it will apply waiting (HOLD, nothing created), one `runbook approve` covers them all, and
the phase then runs to its end. The fingerprints a phase shows before its approval cell are
exactly the ones it applies: a mismatch would hold the phase again (:func:`tests.runs.approval_walk`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .airflow_api import AirflowApi
from .runs import FAST_INFERENCE, FAST_TRAINING, NOT_PREAPPROVED, UNJUDGED, approval_walk, merged

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
def test_every_phase_holds_for_all_its_plans_then_runs_on_one_approval_training(approved_training_run: Path,
                                                                                 airflow_api: AirflowApi) -> None:
    # The walk (conftest.py's approved_training_run) asserts each hold and approval as it goes;
    # phase 04 applies launch_pod plans only, phase 05 launch_pod plans and the schedule change,
    # the ones they showed.
    assert _every_phase_ran_and_everything_is_destroyed(approved_training_run)["decision"] == "GO"
    # Its source job is started by an Airflow DAG: after the GO, Airflow's own API says the
    # source's DAG is paused and the target's unpaused; the receipt shows each step.
    assert (airflow_api.paused("nightly_walk_source"), airflow_api.paused("nightly_walk_target")) == (True, False)
    receipt = json.loads((approved_training_run / "receipt.json").read_text())
    [row] = receipt["schedules"]
    assert {k: row[k] for k in ("name", "kind", "cadence", "frozen", "after_cutover", "final")} == {
        "name": "nightly_walk-dag", "kind": "airflow", "cadence": "0 2 * * *", "frozen": "source",
        "after_cutover": "target", "final": "target"}, row
    mapped = json.loads((approved_training_run / "02_map_target.json").read_text())["data"]["dependency_map"]
    assert [(r["status"], r["target"]) for r in mapped if r["dependency"].startswith("schedule ")] == [
        ("equivalent", "DAG nightly_walk_target (0 2 * * *, paused)")]
    gates = {g["name"]: g["verdict"] for g in receipt["gates"]}
    assert gates["schedules_moved"] == "PASS" and "schedules_restored" not in gates


def test_a_retried_round_rents_another_machine_under_its_own_approval(make_params, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # README: "A retry of a round after a machinery failure rents another machine and waits for
    # its own approval." The training demo, nothing pre-approved, through phase 03; then phase 04's
    # first round, in this process, with its plans approved as `runbook approve` approves them and
    # the local provider's first launch failing as a provider API can (a ProviderError, which phase
    # 04 retries). The retry's plan is another rental: it holds (nothing created) with its own plan
    # pending until a second approval names it; then it runs, and its pod is destroyed.
    from runbook_lib.errors import ApprovalRequired, ProviderError
    from runbook_lib.evidence.approvals import require_all, write_approval_file
    from runbook_lib.evidence.rundir import RunDir
    from runbook_lib.phases import open_phase
    from runbook_lib.phases.compare import protocol
    from runbook_lib.providers.local import LocalProvider
    from runbook_lib.run.hostlock import host_lock
    from runbook_lib.run.runner import run_phase

    params = make_params("demo-train.yaml", **merged(FAST_TRAINING, UNJUDGED, NOT_PREAPPROVED))
    run = RunDir.create(params, reports_dir=tmp_path / "reports")
    for phase in ("01", "02", "03"):
        out = run_phase(run, phase)
        if out.status == "held":
            write_approval_file(run.path, tmp_path / f"approval-{phase}.json", approved_by="release-manager")
            out = run_phase(run, phase, approval_ref=str(tmp_path / f"approval-{phase}.json"))
        assert out.status == "completed", (phase, out.reason)

    # Phase 04's part runs in this process: it holds the host lock shared, as an untimed phase,
    # so no other case's timed phase measures beside it.
    with host_lock(False):
        ctx = open_phase("04", str(params), str(run.path), run_mode="headless")
        shown = [plan for _, plan, _ in protocol.planned(ctx)]
        with pytest.raises(ApprovalRequired):
            require_all(shown, **ctx.resources.approval_terms())
        write_approval_file(run.path, tmp_path / "approval-04.json", approved_by="release-manager")
        ctx = open_phase("04", str(params), str(run.path), run_mode="headless",
                         approval_ref=str(tmp_path / "approval-04.json"))
        launched: list[str] = []
        real_apply = LocalProvider.apply

        def first_launch_fails(self: LocalProvider, plan: Any, approval: Any) -> Any:
            if plan.action == "launch_pod":
                launched.append(plan.target)
                if len(launched) == 1:
                    raise ProviderError("POST /pods failed: connection reset by peer", provider="local")
            return real_apply(self, plan, approval)

        monkeypatch.setattr(LocalProvider, "apply", first_launch_fails)
        log: list[Any] = []
        retry = protocol.bench_plan(ctx, "source", "0-retry1")
        assert retry.fingerprint not in {p.fingerprint for p in shown}  # not among what phase 04 showed
        with pytest.raises(ApprovalRequired, match=retry.fingerprint):
            protocol.measured_with_retries(ctx, protocol.round_attempt(ctx, "source", 0), log,
                                           what="round 0 source training pod", kind="training_round", side="source",
                                           sleep=lambda s: None)
        assert len(launched) == 1  # the failed launch; the retry created nothing
        first = json.loads((tmp_path / "approval-04.json").read_text())["fingerprints"]
        assert shown[0].fingerprint in first and retry.fingerprint not in first
        pending = {p.name for p in (run.path / "approvals").glob("pending-*.json")}
        assert f"pending-{retry.fingerprint[:16]}.json" in pending  # it waits, named, beside rounds 1-3 not yet run
        assert retry.spec.name != shown[0].spec.name  # another machine, not the first round's

        body = write_approval_file(run.path, tmp_path / "approval-retry.json", approved_by="on-call")
        assert retry.fingerprint in body["fingerprints"]
        ctx = open_phase("04", str(params), str(run.path), run_mode="headless",
                         approval_ref=str(tmp_path / "approval-retry.json"))
        pod, done, files = protocol.round_attempt(ctx, "source", 0)(1)
        assert len(launched) == 2 and done.state in ("EXITED", "DESTROYED") and "result.json" in files
        assert ctx.resources.provider("source").is_gone(pod.id)
        record = json.loads((run.path / "approvals" / f"{retry.fingerprint[:16]}.json").read_text())
        assert record["approval"]["approved_by"] == "on-call" and record["plan"]["fingerprint"] == retry.fingerprint
        assert not (run.path / "approvals" / f"pending-{retry.fingerprint[:16]}.json").exists()
