"""The training job's drills, run by the acceptance agent on the target's canary after phase 03's
failure-and-resume check (issue 51): what a job meets on a rented machine that a one-off run
never shows. Each returns what it observed; phase 04 judges it
(:func:`runbook_lib.phases.compare.drills.judge_job_drill`) with the params' limits.

* ``preemption_grace``: the job gets SIGTERM mid-run, as ``docker stop`` sends it (Runpod and
  Vast.ai run pods as containers), and SIGKILL if it is still running ``drills.preemption_grace_s``
  later; a replacement resumes. Observed: whether it exited by itself within the grace, the
  steps it had finished, the step the replacement resumed from (the difference is the steps lost).
* ``corrupt_newest``: a truncated copy of the newest checkpoint is planted as a newer one (a write
  cut off by the machine going away, its sidecar naming the whole file's sha256); the resume must
  refuse it and take the previous complete one (seed 000's completion-marker rule). When both
  run, the preemption's replacement is this resume.
* ``hung_step``: one step never finishes; the job's watchdog (``workload.step_timeout_s``) must
  stop it within that time and name the step (``hung.json``).

A drill process is an attempt like the failure check's (:func:`runbook_lib.workload.job.child_main`),
each in its own directory under ``work/drills`` with its own checkpoints; each observation carries
``seconds``, the wall time of its processes on the canary (the preemption's replacement counts
for ``corrupt_newest`` when both run).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from runbook_lib.evidence.manifest import sha256_file
from runbook_lib.portability.checkpoint import natural_key

WATCHDOG_EXIT = 86
"""Exit status of a job process its step watchdog stopped (``workload.step_timeout_s``;
:class:`runbook_lib.workload.job.StepGuard`)."""
HANG_AT_ENV = "RUNBOOK_DRILL_HANG_AT"
"""The ``hung_step`` drill's injection: the job's step with this index never finishes."""
HOLD_AT_ENV = "RUNBOOK_DRILL_HOLD_AT"
"""The ``preemption_grace`` drill's point: before the step with this index the job waits, mid-run,
until its stop is requested (a job of sub-millisecond steps would otherwise end before its notice)."""
JOB_DRILLS = ("preemption_grace", "corrupt_newest", "hung_step")
"""The drills the canary's agent runs; phase 04 judges them with the others of ``drills.run``."""
PROCESS_DEADLINE_S = 300.0
"""Longest a drill waits for one of its processes to reach a point (a checkpoint, an exit), seconds."""
HUNG_DEADLINE_SLACK_S = 30.0
"""How long past ``workload.step_timeout_s`` the hung-step drill waits for the job to stop before it
kills it itself and records that nothing stopped it, seconds."""

Spawn = Callable[..., "subprocess.Popen[bytes]"]
"""Starts an attempt in its own process (:func:`runbook_lib.workload.job.spawn_attempt` with the agent's arguments bound)."""


def until(what: str, ok: Callable[[], bool], proc: "subprocess.Popen[bytes]", deadline_s: float) -> None:
    """Wait until ``ok()`` holds, polling every 20 ms.

    Raises:
        RuntimeError: ``proc`` exited first, or ``deadline_s`` seconds passed; the message names ``what``.
    """
    deadline = time.monotonic() + deadline_s
    while not ok():
        if proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with {proc.returncode} first")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {deadline_s:g} s")
        time.sleep(0.02)


def steps_in(path: Path) -> int:
    """The finished steps a job's steps file counts (:class:`runbook_lib.workload.job.StepGuard`); 0 before the first."""
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def plant_truncated_newest(ckpt_dir: Path, checkpoint_every: int) -> dict[str, Any]:
    """Write a truncated copy of the newest checkpoint as the next one (``step-N+k``), half its
    bytes, with a sidecar naming the whole file's sha256, as a save cut off mid-write by a machine
    that went away would leave it. Returns ``{"planted", "bytes", "of"}``.

    Raises:
        RuntimeError: ``ckpt_dir`` holds no checkpoint to copy.
    """
    files = sorted(ckpt_dir.glob("step-*.pt"), key=lambda p: natural_key(p.name))
    if not files:
        raise RuntimeError(f"no checkpoint in {ckpt_dir} to plant a truncated newer copy of")
    newest = files[-1]
    step = int(newest.stem.split("-")[1]) + checkpoint_every
    planted = ckpt_dir / f"step-{step:06d}.pt"
    data = newest.read_bytes()
    planted.write_bytes(data[: len(data) // 2])
    (ckpt_dir / f"{planted.name}.sha256").write_text(sha256_file(newest))
    return {"planted": planted.name, "bytes": len(data) // 2, "of": newest.name}


def _finished(proc: "subprocess.Popen[bytes]") -> int | None:
    """The process's exit code, or None when it ran past :data:`PROCESS_DEADLINE_S` (then killed)."""
    try:
        return proc.wait(timeout=PROCESS_DEADLINE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def _resume(spawn: Spawn, d: Path) -> dict[str, Any]:
    """A replacement attempt resuming from ``d/ckpt``: its exit code, and where it resumed from
    and what it refused (``attempt.json``) when it finished."""
    code = _finished(spawn(resume=True, pause=False, work_dir=d, reload_check=False))
    if code is None:
        return {"exit_code": None, "error": f"did not finish within {PROCESS_DEADLINE_S:g} s"}
    done = d / "attempt.json"
    if code != 0 or not done.exists():
        return {"exit_code": code}
    res = json.loads(done.read_text())
    return {"exit_code": code, "resumed_from": res.get("resumed_from"), "start_step": res.get("start_step"),
            "rejected": res.get("rejected_checkpoints", [])}


def preemption(spawn: Spawn, d: Path, *, grace_s: float, checkpoint_every: int, hold_at: int,
               plant: bool) -> list[dict[str, Any]]:
    """``preemption_grace`` (and, with ``plant``, ``corrupt_newest`` on the same replacement): the
    notice comes while the job waits before step ``hold_at`` (past its first checkpoint); the
    observations, one dict per drill."""
    steps = d / "steps"
    t0 = time.monotonic()
    first = spawn(resume=False, pause=False, work_dir=d, steps_file=steps, reload_check=False,
                  env={HOLD_AT_ENV: str(hold_at)})
    try:
        until("the job past its first checkpoint", lambda: steps_in(steps) >= hold_at, first, PROCESS_DEADLINE_S)
        first.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        try:
            first.wait(timeout=grace_s)
            exited_s: float | None = time.monotonic() - sent
        except subprocess.TimeoutExpired:
            first.kill()  # the grace is over: what the platform does next
            first.wait()
            exited_s = None
    except BaseException:
        first.kill()
        first.wait()
        raise
    finished = steps_in(steps)
    saved = json.loads((d / "preempted.json").read_text()) if (d / "preempted.json").exists() else None
    planted = plant_truncated_newest(d / "ckpt", checkpoint_every) if plant else None
    t1 = time.monotonic()
    resumed = _resume(spawn, d)
    start = resumed.get("start_step")
    out = [{"drill": "preemption_grace", "seconds": time.monotonic() - t0, "grace_s": grace_s,
            "exited_within_grace_s": exited_s,
            "exit_code": first.returncode, "steps_finished": finished, "saved": saved,
            "resumed_from": resumed.get("resumed_from"), "resume_exit_code": resumed.get("exit_code"),
            "steps_lost": finished - start if isinstance(start, int) else None}]
    if planted is not None:
        out.append({"drill": "corrupt_newest", "seconds": time.monotonic() - t1, **planted, **resumed})
    return out


def corrupt_newest(spawn: Spawn, d: Path, *, checkpoint_every: int) -> dict[str, Any]:
    """``corrupt_newest`` alone: a job runs to its end (its checkpoints on disk), a truncated newer
    copy is planted, and a replacement resumes."""
    t0 = time.monotonic()
    code = _finished(spawn(resume=False, pause=False, work_dir=d, reload_check=False))
    if code != 0:
        return {"drill": "corrupt_newest", "error": f"the job that writes the checkpoints exited with {code}"}
    planted = plant_truncated_newest(d / "ckpt", checkpoint_every)
    return {"drill": "corrupt_newest", **planted, **_resume(spawn, d), "seconds": time.monotonic() - t0}


def hung_step(spawn: Spawn, d: Path, *, step_timeout_s: float | None, hang_at: int) -> dict[str, Any]:
    """``hung_step``: step ``hang_at`` never finishes. Observed: whether the job stopped by itself
    (its exit code, :data:`WATCHDOG_EXIT` when its watchdog did), after how
    long from the hung step's start, and what ``hung.json`` named. Without a declared
    ``step_timeout_s`` nothing is run: there is no watchdog to drill."""
    if not step_timeout_s:
        return {"drill": "hung_step", "step_timeout_s": None}
    steps = d / "steps"
    t0 = time.monotonic()
    proc = spawn(resume=False, pause=False, work_dir=d, steps_file=steps, reload_check=False,
                 env={HANG_AT_ENV: str(hang_at)})
    try:
        until("the hung step", lambda: steps_in(steps) >= hang_at, proc, PROCESS_DEADLINE_S)
    except RuntimeError:
        proc.kill()
        proc.wait()
        raise
    hung_from = time.monotonic()
    try:
        code: int | None = proc.wait(timeout=step_timeout_s + HUNG_DEADLINE_SLACK_S)
        stopped_s: float | None = time.monotonic() - hung_from
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code, stopped_s = None, None
    named = json.loads((d / "hung.json").read_text()) if (d / "hung.json").exists() else None
    return {"drill": "hung_step", "seconds": time.monotonic() - t0, "step_timeout_s": step_timeout_s,
            "hang_at": hang_at, "exit_code": code,
            "stopped_after_s": stopped_s, "waited_s": step_timeout_s + HUNG_DEADLINE_SLACK_S, "named": named}


def run(spawn: Spawn, work: Path, names: tuple[str, ...], *, grace_s: float, step_timeout_s: float | None,
        checkpoint_every: int, train_steps: int) -> list[dict[str, Any]]:
    """The job drills of ``names`` (those in :data:`JOB_DRILLS`), each in ``work/drills/<name>``;
    one dict of observations per drill, with ``error`` when the drill itself could not be carried out."""
    root = work / "drills"
    shutil.rmtree(root, ignore_errors=True)
    out: list[dict[str, Any]] = []
    wanted = [n for n in JOB_DRILLS if n in names]
    mid_run = past_first_checkpoint(checkpoint_every, train_steps)
    try:
        if "preemption_grace" in wanted:
            out += preemption(spawn, _dir(root, "preemption_grace"), grace_s=grace_s, checkpoint_every=checkpoint_every,
                              hold_at=mid_run, plant="corrupt_newest" in wanted)
        elif "corrupt_newest" in wanted:
            out.append(corrupt_newest(spawn, _dir(root, "corrupt_newest"), checkpoint_every=checkpoint_every))
    except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as exc:
        out += [{"drill": n, "error": f"{type(exc).__name__}: {exc}"} for n in ("preemption_grace", "corrupt_newest")
                if n in wanted and n not in {o["drill"] for o in out}]
    if "hung_step" in wanted:
        try:
            out.append(hung_step(spawn, _dir(root, "hung_step"), step_timeout_s=step_timeout_s, hang_at=mid_run))
        except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as exc:
            out.append({"drill": "hung_step", "error": f"{type(exc).__name__}: {exc}"})
    return out


def past_first_checkpoint(checkpoint_every: int, train_steps: int) -> int:
    """The step a drill holds or hangs the job before: one past its first checkpoint (whose save
    has finished once that step's predecessor is counted), and before its last step."""
    return min(checkpoint_every + 1, train_steps - 1)


def _dir(root: Path, name: str) -> Path:
    d = root / name
    (d / "ckpt").mkdir(parents=True, exist_ok=True)
    return d
