"""A training job's drills as the canary's agent runs them: real job processes of the digits
workload on CPU, each fault the drill is about either handled (PASS) or not (the profile's fault
switched on: FAIL, named), judged by phase 04's rule with the params' limits."""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.layout import POD_FAULT_ENV
from runbook_lib.params import load_params
from runbook_lib.phases.compare.drills import judge_job_drill
from runbook_lib.workload import jobdrills, make_workload
from runbook_lib.workload.job import spawn_attempt
from runbook_lib.workload.jobdrills import WATCHDOG_EXIT


@pytest.fixture
def job(make_params, tmp_path: Path) -> tuple[Path, Path]:
    """The training demo's params (a 2 s step watchdog, a 6 s grace) and a frozen artifact of its job.
    The grace is docker stop's 10 s (the default) cut to what a save on SIGTERM needs beside the unit tier's
    other workers: the job saving and exiting took 3.0 s there once (2026-12-07)."""
    params = make_params("demo-train.yaml", workload={"step_timeout_s": 2.0}, drills={"preemption_grace_s": 6.0})
    mig = load_params(params)
    wl = make_workload(mig.workload, mig.target)
    wl.load(None)
    artifact = tmp_path / "artifact"
    wl.export_artifact(artifact)
    return params, artifact


def _drills(params: Path, artifact: Path, work: Path, names: tuple[str, ...], *, fault: str = "",
            monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    if fault:
        monkeypatch.setenv(POD_FAULT_ENV, fault)  # as the local provider passes a profile's fault to its pods
    mig = load_params(params)
    args = argparse.Namespace(params=str(params), side="target", artifact_dir=str(artifact),
                              ckpt_dir=str(work / "ckpt"), work_dir=str(work))
    seen = jobdrills.run(functools.partial(spawn_attempt, args), work, names,
                         grace_s=mig.drills.preemption_grace_s, step_timeout_s=mig.workload.step_timeout_s,
                         checkpoint_every=mig.workload.checkpoint_every, train_steps=mig.workload.train_steps)
    return {s["drill"]: s for s in seen}


def test_a_job_that_saves_on_sigterm_and_skips_a_truncated_newest_passes_both(job, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    params, artifact = job
    mig = load_params(params)
    seen = _drills(params, artifact, tmp_path / "work", ("preemption_grace", "corrupt_newest"), monkeypatch=monkeypatch)
    pre, bad = seen["preemption_grace"], seen["corrupt_newest"]
    # SIGTERM while the job waited before step 11 (one past its first checkpoint at 10): it finished
    # that step, saved step 12, and the replacement resumed there, refusing the truncated step-22.
    assert pre["steps_finished"] == 12 and pre["saved"]["checkpoint"] == "step-000012.pt", pre
    # exited_within_grace_s is set only when the wait for the exit returned within the grace
    assert pre["exit_code"] == 0 and pre["exited_within_grace_s"] is not None and pre["steps_lost"] == 0
    assert (bad["planted"], bad["of"], bad["resumed_from"]) == ("step-000022.pt", "step-000012.pt", "step-000012.pt")
    assert pre["seconds"] > bad["seconds"] > 0  # the preemption's processes include the shared replacement
    verdicts = {n: judge_job_drill(mig, n, s) for n, s in seen.items()}
    assert {n: v.verdict for n, v in verdicts.items()} == {"preemption_grace": "PASS", "corrupt_newest": "PASS"}
    assert "sha256 differs" in verdicts["corrupt_newest"].observation


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace_and_fails_the_drill(job, tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    params, artifact = job
    seen = _drills(params, artifact, tmp_path / "work", ("preemption_grace",), fault="ignore_sigterm",
                   monkeypatch=monkeypatch)["preemption_grace"]
    assert seen["exited_within_grace_s"] is None and seen["saved"] is None  # SIGKILLed 6 s after SIGTERM
    assert seen["steps_finished"] == 11 and seen["resumed_from"] == "step-000010.pt" and seen["steps_lost"] == 1
    out = judge_job_drill(load_params(params), "preemption_grace", seen)
    assert out.verdict == "FAIL" and "does not handle SIGTERM" in out.observation and "losing 1 step" in out.observation


def test_a_resume_that_trusts_its_newest_file_fails_the_corrupt_newest_drill(job, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    params, artifact = job
    seen = _drills(params, artifact, tmp_path / "work", ("corrupt_newest",), fault="resume_unverified",
                   monkeypatch=monkeypatch)["corrupt_newest"]
    assert seen["planted"] == "step-000060.pt" and seen["exit_code"] != 0  # torch.load of half a zip file
    out = judge_job_drill(load_params(params), "corrupt_newest", seen)
    assert out.verdict == "FAIL" and "did not skip the truncated one" in out.observation


def test_a_hung_step_is_stopped_by_the_watchdog_and_named_or_the_drill_fails(job, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    params, artifact = job
    mig = load_params(params)
    seen = _drills(params, artifact, tmp_path / "a", ("hung_step",), monkeypatch=monkeypatch)["hung_step"]
    assert seen["exit_code"] == WATCHDOG_EXIT and seen["named"]["step"] == 11 == seen["hang_at"]
    assert 2.0 <= seen["stopped_after_s"] < 4.0 and seen["named"]["seconds"] > 2.0
    assert judge_job_drill(mig, "hung_step", seen).verdict == "PASS"
    # The watchdog never starts: nothing stops the job; the drill waits its slack, kills it and says so.
    monkeypatch.setattr(jobdrills, "HUNG_DEADLINE_SLACK_S", 3.0)
    broken = _drills(params, artifact, tmp_path / "b", ("hung_step",), fault="no_watchdog",
                     monkeypatch=monkeypatch)["hung_step"]
    assert broken["exit_code"] is None and broken["named"] is None
    out = judge_job_drill(mig, "hung_step", broken)
    assert out.verdict == "FAIL" and "nothing stopped the job in 5 s" in out.observation
    # No watchdog declared: nothing is run, and the drill says what to declare.
    plain = load_params(params).model_copy(update={"workload": mig.workload.model_copy(update={"step_timeout_s": None})})
    out = judge_job_drill(plain, "hung_step", {"drill": "hung_step", "step_timeout_s": None})
    assert out.verdict == "FAIL" and "declare it" in out.observation


def test_a_drill_the_canary_did_not_carry_out_is_inconclusive(job) -> None:
    mig = load_params(job[0])
    assert judge_job_drill(mig, "preemption_grace", None).verdict == "INCONCLUSIVE"
    out = judge_job_drill(mig, "corrupt_newest", {"drill": "corrupt_newest", "error": "RuntimeError: no checkpoint"})
    assert out.verdict == "INCONCLUSIVE" and "no checkpoint" in out.observation
