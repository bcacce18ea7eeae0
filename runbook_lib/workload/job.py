"""The acceptance job driver and the agent that runs it inside a pod.

Inside a pod the agent (``python -m runbook_lib.workload.job agent ...``):

1. probes the environment it landed on;
2. ``freeze`` mode (source): trains the production state if the workload is a training job,
   exports the artifact (weights or checkpoint) and uploads it as a verified set ``frozen/``,
   then runs the acceptance steps once from that artifact and uploads the golden outputs;
3. ``bench`` mode (phase 04): one uninterrupted timed run; a data-parallel training job
   (``world_size`` > 1) then times an all-reduce over its ranks (:mod:`runbook_lib.workload.ddp`);
4. ``hold`` and ``resume`` modes (phase 04's ``checkpoint_durability`` drill): the job runs past
   its first checkpoint and waits for its pod to be destroyed; a new pod resumes the job from
   what outlived it (:func:`hold`, ``--restore-from``);
5. ``accept`` mode (canary): downloads the frozen set re-hashing every byte, runs the
   acceptance steps in a child process with a checkpoint every ``checkpoint_every`` steps,
   SIGKILLs that child after its first checkpoint (one real failure), resumes a new child from
   the newest checkpoint that verifies, then reloads the saved artifact in a fresh model and
   checks it reproduces the outputs exactly; a training job then runs the job drills
   ``drills.run`` names (:mod:`runbook_lib.workload.jobdrills`);
6. uploads outputs, metrics and a ``result.json`` as a set: objects, manifest, ``_SUCCESS`` last.

The notebook waits for the completion marker; it never talks to the pod directly.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, Callable, cast

from runbook_lib.errors import RunbookError, WorkloadError
from runbook_lib.evidence.manifest import sha256_file, write_json_atomic
from runbook_lib.layout import KEPT_PARAMS, POD_DEVICE_ENV, POD_FAULT_ENV, POD_ID_ENV, POD_VOLUME_ENV
from runbook_lib.params import pod_params
from runbook_lib.portability.checkpoint import load_state, natural_key
from runbook_lib.portability.inventory import probe
from runbook_lib.storage import HashingWriter, ObjectInfo, Store, pod_store
from runbook_lib.workload import ddp, jobdrills, make_workload
from runbook_lib.workload._torch import synchronize
from runbook_lib.workload.checkpoint_set import CheckpointWorkload
from runbook_lib.workload.durable import PARENT, StoreCheckpoints
from runbook_lib.workload.jobdrills import HANG_AT_ENV, HOLD_AT_ENV, WATCHDOG_EXIT

CHILD_TIMEOUT_S = 600.0


def save_checkpoint(state: dict[str, Any], ckpt_dir: Path, step: int) -> Path:
    """torch.save ``state`` as ``step-NNNNNN.pt`` (temp name, fsync, rename), hashing the bytes as
    they are written; the sha256 goes into a ``.sha256`` sidecar written after the rename."""
    import torch

    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"step-{step:06d}.pt"
    tmp = ckpt_dir / f".{final.name}.tmp"
    with open(tmp, "wb") as f:
        w = HashingWriter(f)
        torch.save(state, cast(IO[bytes], w))  # a file-like writer: write, flush, writable
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    (ckpt_dir / f"{final.name}.sha256").write_text(w.sha256.hexdigest())
    return final


def newest_verified_checkpoint(ckpt_dir: Path) -> tuple[Path | None, list[dict[str, str]]]:
    """The newest checkpoint whose sha256 matches its sidecar, and the ones that did not verify.
    Newest is by the step number in the name (``step-10`` after ``step-9``, and past the six
    digits :func:`save_checkpoint` pads to), never by the name's character order.

    Returns:
        ``(path or None, rejected)`` where ``rejected`` lists ``{"file", "reason"}``.
    """
    rejected: list[dict[str, str]] = []
    for ck in sorted(ckpt_dir.glob("step-*.pt"), key=lambda p: natural_key(p.name), reverse=True):
        side = ck.with_name(ck.name + ".sha256")
        if not side.exists():
            rejected.append({"file": ck.name, "reason": "no .sha256 sidecar (write did not finish)"})
        elif ck.stat().st_size == 0:
            rejected.append({"file": ck.name, "reason": "zero bytes"})
        elif sha256_file(ck) != side.read_text().strip():
            rejected.append({"file": ck.name, "reason": "sha256 differs from sidecar (truncated or corrupt)"})
        else:
            return ck, rejected
    return None, rejected


class Preempted(Exception):
    """The job was asked to stop (SIGTERM) and saved a checkpoint at a step boundary first."""


class StepGuard:
    """What watches a job's steps while they run, in the process that runs them:

    * SIGTERM (a preemption's notice, the platform's ``docker stop``): the step in progress
      finishes, a checkpoint of the state after it is saved, ``preempted.json`` names it, and
      :class:`Preempted` ends the loop (the ``ignore_sigterm`` fault leaves SIGTERM ignored, as
      a workload that does not handle it);
    * a watchdog thread (``step_timeout_s`` set): a step running longer than that writes
      ``hung.json`` (the step, the seconds it ran) and ends the process with
      :data:`WATCHDOG_EXIT` (the ``no_watchdog`` fault starts none);
    * ``steps_file``: the count of finished steps, rewritten after each step (the drills read
      how far a killed job got).
    """

    def __init__(self, work_dir: Path | None, *, step_timeout_s: float | None = None,
                 steps_file: Path | None = None) -> None:
        import threading

        self.work_dir, self.step_timeout_s = work_dir, step_timeout_s
        self.stop_requested: float | None = None
        self.step_started = time.monotonic()
        self.current = -1
        self._fd = os.open(steps_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if steps_file else None
        self._closed = threading.Event()
        self._previous: Any = None
        fault = os.environ.get(POD_FAULT_ENV, "")
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, signal.SIG_IGN if fault == "ignore_sigterm" else self._on_term)
        if step_timeout_s and fault != "no_watchdog":
            threading.Thread(target=self._watch, name="step-watchdog", daemon=True).start()

    def __enter__(self) -> "StepGuard":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _on_term(self, signum: int, frame: Any) -> None:
        self.stop_requested = time.monotonic()

    def _watch(self) -> None:
        assert self.step_timeout_s
        tick = min(1.0, self.step_timeout_s / 10)
        while not self._closed.wait(tick):
            ran = time.monotonic() - self.step_started
            if self.current >= 0 and ran > self.step_timeout_s:
                if self.work_dir is not None:
                    write_json_atomic(self.work_dir / "hung.json", {"step": self.current, "seconds": ran,
                                                                   "step_timeout_s": self.step_timeout_s})
                os._exit(WATCHDOG_EXIT)

    def starting(self, i: int) -> None:
        self.current, self.step_started = i, time.monotonic()

    def finished(self, i: int) -> None:
        self.current = -1
        if self._fd is not None:
            os.pwrite(self._fd, f"{i + 1:>12}".encode(), 0)

    def close(self) -> None:
        """Stop watching: the watchdog ends, SIGTERM gets its previous handler back."""
        self._closed.set()
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _resume_point(wl: Any, ckpt_dir: Path) -> tuple[int, str | None, list[dict[str, str]]]:
    """The step to start from, the checkpoint it came from and those refused: the newest that
    verifies (:func:`newest_verified_checkpoint`). The ``resume_unverified`` fault takes the
    newest file by its step number without checking it, as a job that trusts its newest write."""
    rejected: list[dict[str, str]] = []
    if os.environ.get(POD_FAULT_ENV) == "resume_unverified":
        files = sorted(ckpt_dir.glob("step-*.pt"), key=lambda p: natural_key(p.name))
        ck = files[-1] if files else None
    else:
        ck, rejected = newest_verified_checkpoint(ckpt_dir)
    if ck is None:
        return 0, None, rejected
    # weights_only on this side's device: a checkpoint naming any non-tensor global is refused, never run
    return wl.load_state_dict(load_state(ck, device=wl.profile.device).state), ck.name, rejected


def run_steps(wl: Any, *, ckpt_dir: Path, checkpoint_every: int, resume: bool,
              pause_after_checkpoint: bool, progress: Path | None = None,
              max_steps: int | None = None, guard: StepGuard | None = None,
              on_saved: Callable[[Path], Any] | None = None) -> dict[str, Any]:
    """Run the workload's acceptance steps with periodic checkpoints.

    Args:
        wl: a loaded :class:`~runbook_lib.workload.AcceptanceWorkload`.
        ckpt_dir: checkpoint directory (on the pod's volume).
        checkpoint_every: steps between checkpoints.
        resume: start from the newest checkpoint that verifies (:func:`_resume_point`).
        pause_after_checkpoint: after the first checkpoint, write ``progress`` and block (the
            drill's kill point: the parent SIGKILLs this process there).
        guard: the :class:`StepGuard` watching the steps (default: one with no watchdog).
        on_saved: called with each checkpoint's path once it is saved, before the next step
            (:meth:`runbook_lib.workload.durable.StoreCheckpoints.saved` keeps it in the store).

    Returns:
        ``{"start_step", "resumed_from", "rejected_checkpoints", "step_times_s", "metrics",
        "first_step_done_epoch"}``;
        ``step_times_s`` are seconds per step, the device synchronised before each clock stops
        (the driver does it, whatever the workload does); ``timing``: :func:`step_timing`.

    Raises:
        Preempted: SIGTERM arrived; the checkpoint after the step in progress was saved first.
    """
    if guard is None:
        with StepGuard(progress.parent if progress is not None else None) as own:
            return run_steps(wl, ckpt_dir=ckpt_dir, checkpoint_every=checkpoint_every, resume=resume,
                             pause_after_checkpoint=pause_after_checkpoint, progress=progress,
                             max_steps=max_steps, guard=own, on_saved=on_saved)
    start, resumed_from, rejected = _resume_point(wl, ckpt_dir) if resume else (0, None, [])
    hang_at, hold_at = int(os.environ.get(HANG_AT_ENV) or -1), int(os.environ.get(HOLD_AT_ENV) or -1)
    times, metrics = [], []
    first_done: float | None = None
    checkpoint_s = 0.0
    n = wl.num_steps() if max_steps is None else min(max_steps, wl.num_steps())
    device = wl.profile.device
    synchronize(device)  # nothing queued before the loop is billed to its first step
    loop_t0 = time.perf_counter()
    for i in range(start, n):
        while i == hold_at and guard.stop_requested is None:  # the preemption drill: mid-run, awaiting its notice
            time.sleep(0.01)
        guard.starting(i)
        t0 = time.perf_counter()
        while i == hang_at:  # the hung_step drill: this step never finishes
            time.sleep(3600)
        m = wl.step(i)
        synchronize(device)  # the step's kernels are done before its clock stops, whatever the workload does
        times.append(time.perf_counter() - t0)
        guard.finished(i)
        first_done = first_done or time.time()
        metrics.append(m)
        if guard.stop_requested is not None:
            path = save_checkpoint(wl.state_dict(), ckpt_dir, i + 1)
            if on_saved is not None:
                on_saved(path)
            if guard.work_dir is not None:
                write_json_atomic(guard.work_dir / "preempted.json", {
                    "step": i + 1, "checkpoint": path.name, "seconds_after_signal": time.monotonic() - guard.stop_requested})
            raise Preempted(f"stopped by SIGTERM after step {i + 1}; saved {path.name}")
        if (i + 1) % checkpoint_every == 0 and i + 1 < n:
            c0 = time.perf_counter()
            path = save_checkpoint(wl.state_dict(), ckpt_dir, i + 1)
            if on_saved is not None:
                on_saved(path)
            checkpoint_s += time.perf_counter() - c0
            if pause_after_checkpoint:
                if progress is not None:
                    write_json_atomic(progress, {"paused_after_step": i + 1})  # the parent polls for it
                while True:  # wait to be killed; the parent's SIGKILL is the failure
                    time.sleep(3600)
    synchronize(device)
    timing = step_timing(times, wall_s=time.perf_counter() - loop_t0, checkpoint_s=checkpoint_s)
    return {"start_step": start, "resumed_from": resumed_from, "rejected_checkpoints": rejected,
            "step_times_s": times, "metrics": metrics, "first_step_done_epoch": first_done, "timing": timing}


def step_timing(times: list[float], *, wall_s: float, checkpoint_s: float) -> dict[str, float]:
    """Check the step clock against wall time: the steps, timed one by one with the device
    synchronised around each, cannot sum to more than the loop's wall time, and the loop's
    other time (checkpoint saves, metric bookkeeping) is what is left.

    Args:
        times: seconds per step. wall_s: seconds from the loop's start to its end, device
            synchronised at both. checkpoint_s: seconds spent saving checkpoints in the loop.

    Returns:
        ``{"wall_s", "steps_sum_s", "checkpoint_s", "other_s", "steps_share"}`` (``steps_share``:
        the steps' sum over wall time, 0..1).

    Raises:
        WorkloadError: the steps sum to more than the wall time (beyond 1 ms of clock
            resolution): the step clock does not measure what ran.
    """
    total = float(sum(times))
    if total > wall_s + 1e-3:
        raise WorkloadError(f"step times sum to {total:.4f} s but the loop took {wall_s:.4f} s of wall time; the step "
                            "clock is wrong (a step timed twice, or a clock other than time.perf_counter). Fix the "
                            "workload's step() before measuring")
    return {"wall_s": wall_s, "steps_sum_s": total, "checkpoint_s": checkpoint_s,
            "other_s": max(0.0, wall_s - total - checkpoint_s), "steps_share": total / wall_s if wall_s > 0 else 1.0}


def _make(params_path: str, side: str) -> Any:
    mig = pod_params(params_path)
    return mig, make_workload(mig.workload, getattr(mig, side))


def attempt(params_path: str, side: str, *, artifact_dir: Path, work_dir: Path, ckpt_dir: Path,
            resume: bool, pause: bool, reload_check: bool, max_steps: int | None = None,
            steps_file: Path | None = None, keep: StoreCheckpoints | None = None) -> dict[str, Any]:
    """One attempt of the acceptance steps from ``artifact_dir``: writes ``outputs.npy`` (and for
    training ``final_outputs.npy``; ``inference_outputs.npy`` when the workload has them), the final artifact and ``attempt.json`` into ``work_dir``.

    With ``reload_check`` the saved artifact is loaded into a fresh model afterwards, and its
    outputs must equal the run's exactly (recorded under ``reload``). The steps run under a
    :class:`StepGuard` with ``workload.step_timeout_s`` (``steps_file``: where it counts them).
    ``keep`` (``workload.checkpoint_location: store``): each checkpoint is also committed to the
    store, and a resume that finds no verified checkpoint in ``ckpt_dir`` first restores the
    newest set that verifies there (recorded under ``restored``).

    Raises:
        Preempted: SIGTERM arrived during the steps (their checkpoint is saved).
    """
    import numpy as np

    t0 = time.perf_counter()
    mig, wl = _make(params_path, side)
    wl.load(artifact_dir)
    load_s = time.perf_counter() - t0
    reference = wl.outputs() if wl.kind == "training" else None
    restored = keep.restore(ckpt_dir) if keep is not None and resume and \
        newest_verified_checkpoint(ckpt_dir)[0] is None else None
    with StepGuard(work_dir, step_timeout_s=mig.workload.step_timeout_s, steps_file=steps_file) as guard:
        res = run_steps(wl, ckpt_dir=ckpt_dir, checkpoint_every=mig.workload.checkpoint_every,
                        resume=resume, pause_after_checkpoint=pause, progress=work_dir / "progress.json",
                        max_steps=max_steps, guard=guard, on_saved=keep.saved if keep is not None else None)
    res["load_s"] = load_s
    if restored is not None:
        res["restored"] = restored
    final = wl.outputs()
    np.save(work_dir / "outputs.npy", reference if reference is not None else final)
    if isinstance(wl, CheckpointWorkload):  # names, dtypes, shapes and a digest of every tensor loaded
        res["tensors"] = wl.tensor_table()
    answers = wl.inference_outputs()
    if answers is not None:
        np.save(work_dir / "inference_outputs.npy", np.asarray(answers, dtype=np.float32))
    if reference is not None:
        np.save(work_dir / "final_outputs.npy", final)
    wl.export_artifact(work_dir / "final_artifact")
    if reload_check:
        _, fresh = _make(params_path, side)
        fresh.load(work_dir / "final_artifact")
        if fresh.kind != "training":
            for i in range(fresh.num_steps()):
                fresh.step(i)
        got = fresh.outputs()
        same = got.shape == final.shape and bool(np.array_equal(got, final))
        diff = float(np.max(np.abs(got - final))) if got.shape == final.shape else float("inf")
        res["reload"] = {"exact": same, "max_abs_diff": diff}
    (work_dir / "attempt.json").write_text(json.dumps(res, default=float))
    return res


def child_main(args: argparse.Namespace) -> int:
    """One attempt as its own process, so the failure drill can SIGKILL it.

    With ``--start-after PATH`` the process stands by first: it imports the workload's libraries
    (:meth:`~runbook_lib.workload.AcceptanceWorkload.preload`), then waits until ``PATH`` exists
    (the driver writes it once the killed attempt is gone) before it reads any checkpoint.

    Raises:
        WorkloadError: ``PATH`` did not appear within ``CHILD_TIMEOUT_S``.
    """
    if args.start_after:
        _make(args.params, args.side)[1].preload()
        go, deadline = Path(args.start_after), time.monotonic() + CHILD_TIMEOUT_S
        while not go.exists():
            if time.monotonic() > deadline:
                raise WorkloadError(f"the standby attempt was not started within {CHILD_TIMEOUT_S} s ({go} absent)")
            time.sleep(0.02)
    try:
        attempt(args.params, args.side, artifact_dir=Path(args.artifact_dir), work_dir=Path(args.work_dir),
                ckpt_dir=Path(args.ckpt_dir), resume=args.resume, pause=args.pause, reload_check=args.reload_check,
                steps_file=Path(args.steps_file) if args.steps_file else None, keep=kept(args))
    except Preempted as exc:  # stopped as asked, its checkpoint saved: a clean exit (preempted.json says where)
        print(exc, file=sys.stderr)
    return 0


def kept(args: argparse.Namespace) -> StoreCheckpoints | None:
    """Where an attempt keeps its checkpoints in the store (``--keep-checkpoints``, set when
    ``workload.checkpoint_location`` is ``store``), or None."""
    if not getattr(args, "keep_checkpoints", ""):
        return None
    mig = pod_params(args.params)
    return StoreCheckpoints(pod_store(mig.storage, args.store_url), args.keep_checkpoints, args.run_id,
                            restore_from=args.restore_from)


def checkpoint_dir(location: str, work: Path, volume: Path) -> Path:
    """The job's checkpoint directory for ``workload.checkpoint_location``: the container disk
    (``work/ckpt``) for ``container``, else the pod's volume (``volume/ckpt``; with ``store``
    each checkpoint is committed to the store as well, :class:`StoreCheckpoints`)."""
    return work / "ckpt" if location == "container" else volume / "ckpt"


def hold(args: argparse.Namespace, mig: Any, work: Path) -> dict[str, Any]:
    """The ``checkpoint_durability`` drill's first pod (``hold`` mode): the job runs past its first
    checkpoint and waits there, mid-run, in its own process, for its machine to be destroyed.

    Returns:
        ``{"location", "ckpt_dir", "steps_finished", "checkpoint", "kept"}``: where the job keeps
        its checkpoints, the steps it finished, the newest checkpoint that verifies on this pod,
        and (``store``) the store sets it committed.

    Raises:
        WorkloadError: the job exited, or did not get past its first checkpoint, within
            :data:`CHILD_TIMEOUT_S`.
    """
    steps = work / "steps"
    at = jobdrills.past_first_checkpoint(mig.workload.checkpoint_every, mig.workload.train_steps)
    proc = spawn_attempt(args, resume=False, pause=False, steps_file=steps, reload_check=False,
                         env={HOLD_AT_ENV: str(at)})
    try:
        jobdrills.until("the job past its first checkpoint", lambda: jobdrills.steps_in(steps) >= at, proc,
                        CHILD_TIMEOUT_S)
    except RuntimeError as exc:
        proc.kill()
        raise WorkloadError(f"checkpoint_durability: {exc}") from None
    newest, _ = newest_verified_checkpoint(args.ckpt_dir)
    store = kept(args)
    return {"location": mig.workload.checkpoint_location, "ckpt_dir": str(args.ckpt_dir),
            "steps_finished": jobdrills.steps_in(steps), "checkpoint": newest.name if newest else None,
            "kept": sorted({k.split("/")[-2] for k in store.store.list(store.parent)}) if store else []}


def spawn_attempt(args: argparse.Namespace, *, resume: bool, pause: bool, start_after: Path | None = None,
           work_dir: Path | None = None, steps_file: Path | None = None, reload_check: bool | None = None,
           env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """An attempt (:func:`child_main`) in its own process: the failure-and-resume check's, or a job
    drill's (``work_dir``: where it writes, its checkpoints in ``work_dir/ckpt``; default the
    agent's; ``env``: variables added to the agent's)."""
    argv = [sys.executable, "-m", "runbook_lib.workload.job", "child", "--params", args.params, "--side", args.side,
            "--artifact-dir", str(args.artifact_dir), "--ckpt-dir", str(work_dir / "ckpt" if work_dir else args.ckpt_dir),
            "--work-dir", str(work_dir or args.work_dir)]
    argv += (["--resume"] if resume else []) + (["--pause"] if pause else [])
    argv += ["--reload-check"] if (resume if reload_check is None else reload_check) else []
    argv += ["--start-after", str(start_after)] if start_after else []
    argv += ["--steps-file", str(steps_file)] if steps_file else []
    keep: str = getattr(args, "keep_checkpoints", "")
    if work_dir is None and keep:  # the job's own checkpoints; a drill's stay on its disk
        argv += ["--keep-checkpoints", keep, "--restore-from", args.restore_from,
                 "--store-url", args.store_url, "--run-id", args.run_id]
    # The environment is passed as a copy, not inherited: the probe thread imports torch meanwhile,
    # and a library that calls setenv(3) then can move the process's environ while Popen's vfork
    # child reads it before execve (seen as "OSError: [Errno 14] Bad address", and as the pod's
    # leader dying without an exit record). A copy is built before the fork and changes under no one.
    proc = subprocess.Popen(argv, env={**os.environ, **(env or {})})
    _CHILDREN.append(proc)
    return proc


_CHILDREN: list[subprocess.Popen[bytes]] = []
"""The attempts this process started (:func:`spawn_attempt`), for :func:`forward_sigterm`."""


def forward_sigterm(grace_s: float) -> None:
    """Make SIGTERM to this process (the agent) reach the job processes it started, as a
    container's init (tini, dumb-init) passes it on: ``docker stop`` and a provider's destroy
    signal PID 1 only, and a job that never hears the notice cannot save its last checkpoint.
    The agent then waits for them, up to ``grace_s`` less half a second (it must be gone before
    the platform's SIGKILL), and exits with 143 (128 + SIGTERM) without the interpreter's
    shutdown (torch's teardown alone takes seconds). Main thread only."""

    def _on_term(signum: int, frame: Any) -> None:
        live = [p for p in _CHILDREN if p.poll() is None]
        for p in live:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + max(0.0, grace_s - 0.5)
        for p in live:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + signum)  # at once, as the default action would: the machine is going away

    signal.signal(signal.SIGTERM, _on_term)


def _wait(proc: subprocess.Popen[bytes], what: str) -> None:
    try:
        code = proc.wait(timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise WorkloadError(f"{what} did not finish within {CHILD_TIMEOUT_S} s") from None
    if code != 0:
        raise WorkloadError(f"{what} exited with code {code}; see the pod log")


def fetch_verified(store: Store, frozen_prefix: str, dest: Path) -> list[dict[str, Any]]:
    """Download a verified set into ``dest``, re-hashing each local copy.

    With ``RUNBOOK_FAULT=corrupt_checkpoint`` in the environment (a drill), one byte of each
    copy is flipped after download, as a corrupting storage route would.

    Returns:
        Rows ``{"key", "expected_sha256", "observed_sha256", "size_bytes", "match"}``.
    """
    checks: list[dict[str, Any]] = []
    for key, info in store.verify_set(frozen_prefix).items():
        local = dest / key
        store.get_file(f"{frozen_prefix}/{key}", local, expect=info, progress=info.size_bytes >= PROGRESS_MIN_BYTES)
        if os.environ.get(POD_FAULT_ENV) == "corrupt_checkpoint":
            with open(local, "r+b") as f:
                f.seek(local.stat().st_size // 2)
                b = f.read(1)
                f.seek(-1, 1)
                f.write(bytes([b[0] ^ 0xFF]))
        got = sha256_file(local)
        checks.append({"key": key, "expected_sha256": info.sha256, "observed_sha256": got,
                       "size_bytes": local.stat().st_size, "match": got == info.sha256})
    return checks


def timed_fetch(store: Store, prefix: str, dest: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """:func:`fetch_verified` of set ``prefix`` into ``dest``, timed: the checksum rows and
    ``{"bytes", "seconds", "objects", "bytes_per_s"}`` (bytes per second; None when too fast to time)."""
    t0 = time.perf_counter()
    checks = fetch_verified(store, prefix, dest)
    took = time.perf_counter() - t0
    moved = sum(int(c["size_bytes"]) for c in checks)
    return checks, {"bytes": moved, "seconds": took, "objects": len(checks),
                    "bytes_per_s": moved / took if took > 0 else None}


def _drill(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Run the acceptance steps, SIGKILL the child after its first checkpoint, resume, reload.

    The resuming process starts at once on standby (its imports overlap the first attempt) and
    reads the checkpoints only after the first attempt is killed and reaped."""
    go = work / "resume.go"
    go.unlink(missing_ok=True)
    first = spawn_attempt(args, resume=False, pause=True)
    second = spawn_attempt(args, resume=True, pause=False, start_after=go)
    try:
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        while not (work / "progress.json").exists():
            if first.poll() is not None:
                raise WorkloadError(f"acceptance child exited with {first.returncode} before its first checkpoint")
            if time.monotonic() > deadline:
                raise WorkloadError(f"acceptance child wrote no checkpoint within {CHILD_TIMEOUT_S} s")
            time.sleep(0.02)
        paused = json.loads((work / "progress.json").read_text())
        first.send_signal(signal.SIGKILL)
        first.wait()
        go.touch()
    except BaseException:
        for proc in (first, second):
            proc.kill()
            proc.wait()
        raise
    _wait(second, "resumed acceptance run")
    resumed = json.loads((work / "attempt.json").read_text())
    return {
        "failure_drill": {"killed_after_step": paused["paused_after_step"], "signal": "SIGKILL",
                          "exit_code": first.returncode, "resumed_from": resumed["resumed_from"],
                          "rejected_checkpoints": resumed["rejected_checkpoints"]},
        "attempts": [resumed],
        "reload": resumed.get("reload"),
    }


def _job_drills(args: argparse.Namespace, mig: Any, work: Path) -> list[dict[str, Any]]:
    """The training job's drills ``drills.run`` names, on this canary (:func:`runbook_lib.workload.jobdrills.run`)."""
    return jobdrills.run(functools.partial(spawn_attempt, args), work, tuple(mig.drills.run),
                         grace_s=mig.drills.preemption_grace_s, step_timeout_s=mig.workload.step_timeout_s,
                         checkpoint_every=mig.workload.checkpoint_every, train_steps=mig.workload.train_steps)


PARAMS_FROM_ENV = "env:RUNBOOK_PARAMS_YAML"
"""``--params`` value telling the agent the params YAML is in that variable (remote pods: params
hold no secrets, so they may travel in the launch plan and be shown)."""


def params_file(arg: str) -> str:
    """The params file a ``--params`` argument names: the path itself, or, for
    :data:`PARAMS_FROM_ENV` (a remote pod or worker), ``params.yaml`` in the working directory
    written from that variable."""
    if arg != PARAMS_FROM_ENV:
        return arg
    path = Path.cwd() / KEPT_PARAMS
    path.write_text(os.environ[PARAMS_FROM_ENV.removeprefix("env:")])
    return str(path)


def provenance(args: argparse.Namespace, mig: Any, identity: dict[str, Any] | None, environment: dict[str, Any],
               validation: dict[str, Any]) -> dict[str, Any]:
    """What moves with a result set (``about`` in its manifest, :meth:`runbook_lib.storage.Store.commit_set`):
    "the model and dataset identifiers, runtime version, configuration, run identifier and
    validation results" (the acceptance-job contract, seed 000: :mod:`runbook_lib.workload`).

    Args:
        args: the agent's arguments (``--params``, ``--side``, ``--mode``, ``--run-id``).
        mig: the run's params.
        identity: the workload's :meth:`~runbook_lib.workload.AcceptanceWorkload.identity` (model id,
            weights and dataset sha256), when this set defines it (a freeze); else None.
        environment: :func:`runbook_lib.portability.inventory.probe` of this pod.
        validation: what this job checked and found (JSON).

    Returns:
        ``{"run_id", "mode", "side", "model", "runtime", "configuration", "validation"}``.
    """
    import runbook_lib

    side = getattr(mig, args.side)
    cuda = environment.get("cuda") or {}
    return {
        "run_id": args.run_id, "mode": args.mode, "side": args.side,
        "model": {"workload": mig.workload.entry_point, "model_id": mig.workload.model_id,
                  **({"identity": identity} if identity is not None else {}),
                  **({"artifact": args.frozen_prefix} if getattr(args, "frozen_prefix", "") else {})},
        "runtime": {"python": environment.get("python"), "torch": environment.get("torch"),
                    "cuda": cuda.get("runtime"), "runbook_lib": runbook_lib.__version__,
                    "device": os.environ.get(POD_DEVICE_ENV, "cpu"), "image": getattr(side, "image", "") or None},
        "configuration": {"params_sha256": sha256_file(Path(params_file(args.params))),
                          "profile": {k: getattr(side, k, None) for k in ("device", "dtype", "batch_size", "threads")},
                          "workload": mig.workload.model_dump(mode="json", exclude_none=True)},
        "validation": validation,
    }


def _validation(result: dict[str, Any]) -> dict[str, Any]:
    """The checks an agent's ``result`` holds, summarised for its set's manifest."""
    out: dict[str, Any] = {}
    checks = result.get("artifact_checksums")
    if checks is not None:
        out["artifact_checksums"] = {"objects": len(checks), "all_match": all(c["match"] for c in checks)}
    if "skipped" in result:
        out["skipped"] = result["skipped"]
    drill = result.get("failure_drill")
    if drill:
        out["failure_drill"] = {k: drill.get(k) for k in ("exit_code", "killed_after_step", "resumed_from")}
    reload = result.get("reload")
    if reload:
        out["reload"] = {k: reload.get(k) for k in ("exact", "max_abs_diff")}
    if "frozen_manifest_sha256" in result:
        out["frozen_manifest_sha256"] = result["frozen_manifest_sha256"]
    return out


def _allreduce(mig: Any, side: str) -> dict[str, Any]:
    """``{"allreduce": ...}``: the ranks a data-parallel training job's steps ran on, timed in one
    all-reduce of ``measure.allreduce_mib`` (:meth:`runbook_lib.workload.ddp.Ranks.allreduce`);
    empty for a job of one process or a workload that is not training."""
    prof = getattr(mig, side)
    if mig.workload.kind != "training" or prof.world_size < 2:
        return {}
    return {"allreduce": ddp.ranks(mig.workload, prof).allreduce(int(mig.measure.allreduce_mib * 2**20))}


PROGRESS_MIN_BYTES = 64 << 20  # transfers at least this large show a tqdm bar in the pod log


def _upload_dir(store: Store, src: Path, prefix: str) -> list[ObjectInfo]:
    return [store.put_file(f, f"{prefix}/{f.relative_to(src)}", progress=f.stat().st_size >= PROGRESS_MIN_BYTES)
            for f in sorted(src.rglob("*")) if f.is_file()]


def _freeze(args: argparse.Namespace, store: Store, work: Path, environment: Any) -> dict[str, Any]:
    """The source's ``freeze``: train the production state (a training job), export and commit the
    artifact as the set ``frozen/``, run the acceptance steps once from it (the golden outputs),
    and for a training job an A/A replicate (the loss band's noise floor); what goes into ``result.json``."""
    result: dict[str, Any] = {}
    mig, wl = _make(args.params, args.side)
    t0 = time.perf_counter()
    if args.frozen_prefix:  # the checkpoint as phase 01 copied it into the store (an s3:// checkpoint)
        checks, result["fetch"] = timed_fetch(store, args.frozen_prefix, work / "input")
        if not all(c["match"] for c in checks):
            raise WorkloadError(f"the checkpoint copy {args.frozen_prefix} does not match its manifest: "
                                + ", ".join(c["key"] for c in checks if not c["match"]) + "; run phase 01 again")
        wl.load_input(work / "input")
    else:
        wl.load(None)
    if wl.kind == "training":  # the production state the source holds today
        for i in range(wl.num_steps()):
            wl.step(i)
    wl.export_artifact(work / "frozen")
    result["freeze_s"] = time.perf_counter() - t0
    result["identity"] = wl.identity()
    frozen = _upload_dir(store, work / "frozen", f"{args.prefix}/frozen")
    about = provenance(args, mig, result["identity"], environment.result(),
                       {"objects": len(frozen), "sha256": "each object's, in this manifest, as written"})
    result["frozen_manifest_sha256"] = store.commit_set(f"{args.prefix}/frozen", frozen, run_id=args.run_id,
                                                        about=about).sha256
    result["attempts"] = [attempt(args.params, args.side, artifact_dir=work / "frozen", work_dir=work,
                                  ckpt_dir=args.ckpt_dir, resume=False, pause=False, reload_check=False)]
    if wl.kind == "training":  # A/A replicate on the source: the loss band's noise floor
        aa_dir = work / "aa"
        aa_dir.mkdir(exist_ok=True)
        aa = attempt(args.params, args.side, artifact_dir=work / "frozen", work_dir=aa_dir,
                     ckpt_dir=args.ckpt_dir.parent / "ckpt-aa", resume=False, pause=False, reload_check=False)
        result["aa_losses"] = [m["loss"] for m in aa["metrics"]]
    return result


def agent_main(args: argparse.Namespace) -> int:
    """Freeze (source), accept (canary, with the failure drill), bench (timed run) or slice
    (a cutover slice that writes a checkpoint set); then upload the results set with its marker."""
    import psutil

    started_epoch = psutil.Process().create_time()
    mig, _ = _make(args.params, args.side)
    forward_sigterm(mig.drills.preemption_grace_s)
    store = pod_store(mig.storage, args.store_url)  # an S3 store: through the launch's grant, never the keys
    work = Path.cwd() / "work"  # container disk
    work.mkdir(exist_ok=True)
    vol = Path(os.environ.get(POD_VOLUME_ENV, work / "volume"))
    location = mig.workload.checkpoint_location
    args.work_dir, args.ckpt_dir = work, checkpoint_dir(location, work, vol)
    args.keep_checkpoints = f"{args.prefix}/{PARENT}" if location == "store" else ""
    # The pod's environment is probed in a thread (the probe imports torch, about 2 s on 2 cores)
    # while the acceptance children run in their own processes.
    probing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="probe")
    environment = probing.submit(probe, device=os.environ.get(POD_DEVICE_ENV, "cpu"))
    probing.shutdown(wait=False)
    result: dict[str, Any] = {"mode": args.mode, "side": args.side, "pod_id": os.environ.get(POD_ID_ENV, ""),
                              "process_started_epoch": started_epoch}
    out = work / "out"
    out.mkdir(exist_ok=True)
    if args.mode == "freeze":
        result.update(_freeze(args, store, work, environment))
    else:
        args.artifact_dir = work / "artifact"
        # store-to-pod transfer as this pod saw it: the verified download of the set it starts from
        checks, result["fetch"] = timed_fetch(store, args.frozen_prefix, args.artifact_dir)
        result["artifact_checksums"] = checks
        if not all(c["match"] for c in checks):
            result["skipped"] = "artifact checksum mismatch: acceptance not run on unverified bytes"
        elif args.mode == "accept":
            result.update(_drill(args, work))
            if mig.workload.kind == "training" and set(mig.drills.run) & set(jobdrills.JOB_DRILLS):
                result["job_drills"] = _job_drills(args, mig, work)
        elif args.mode == "hold":
            result["hold"] = hold(args, mig, work)
        else:  # bench / slice / resume: one uninterrupted attempt, timed
            res = attempt(args.params, args.side, artifact_dir=args.artifact_dir, work_dir=work, ckpt_dir=args.ckpt_dir,
                          resume=args.mode == "resume", pause=False, reload_check=False, max_steps=args.steps or None,
                          keep=kept(args))
            result.update(attempts=[res], **(_allreduce(mig, args.side) if args.mode == "bench" else {}))
            if args.mode == "slice":
                ck = _upload_dir(store, work / "final_artifact", f"{args.prefix}/checkpoint")
                about = provenance(args, mig, None, environment.result(), {**_validation(result), "objects": len(ck)})
                result["checkpoint_manifest_sha256"] = store.commit_set(f"{args.prefix}/checkpoint", ck,
                                                                        run_id=args.run_id, about=about).sha256
    result["environment"] = environment.result()
    for name in ("outputs.npy", "final_outputs.npy", "inference_outputs.npy"):
        if (work / name).exists():
            (out / name).write_bytes((work / name).read_bytes())
    (out / "result.json").write_text(json.dumps(result, indent=2, default=float))
    objs = _upload_dir(store, out, args.prefix + "/result")
    store.commit_set(args.prefix + "/result", objs, run_id=args.run_id,
                     about=provenance(args, mig, result.get("identity"), result["environment"], _validation(result)))
    while args.mode == "hold":  # mid-run until the machine is destroyed (its job process holds too)
        time.sleep(3600)
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="runbook_lib.workload.job")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("child")
    for a in ("--params", "--side", "--artifact-dir", "--ckpt-dir", "--work-dir"):
        c.add_argument(a, required=True)
    c.add_argument("--resume", action="store_true")
    c.add_argument("--pause", action="store_true")
    c.add_argument("--reload-check", action="store_true")
    c.add_argument("--start-after", default="", help="stand by (imports done) until this file exists")
    c.add_argument("--steps-file", default="", help="count the finished steps in this file")
    c.add_argument("--keep-checkpoints", default="", help="commit each checkpoint to the store under this prefix")
    c.add_argument("--restore-from", default="", help="a resume with no checkpoint restores from this store prefix")
    c.add_argument("--store-url", default="")
    c.add_argument("--run-id", default="")
    ag = sub.add_parser("agent")
    ag.add_argument("mode", choices=["freeze", "accept", "bench", "slice", "hold", "resume"])
    ag.add_argument("--steps", type=int, default=0, help="bench/slice: steps to run (0 = all)")
    for opt in ("--params", "--side", "--run-id", "--store-url", "--prefix"):
        ag.add_argument(opt, required=True)
    ag.add_argument("--frozen-prefix", default="")
    ag.add_argument("--restore-from", default="", help="resume: a store prefix of checkpoint sets to resume from "
                                                       "when this pod has none (workload.checkpoint_location: store)")
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args.params = params_file(args.params)
    try:
        return child_main(args) if args.cmd == "child" else agent_main(args)
    except RunbookError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
