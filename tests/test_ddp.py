"""Data-parallel training: real torch.distributed processes (gloo on CPU) of the digits workload,
the layout torchrun gives them, a checkpoint crossing a change of world size, the helpers'
end with their leader, nccl-tests' bandwidth formulas against a published run, and the gates
phases 02 and 04 judge from them."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from runbook_lib.errors import ParamsError, WorkloadError
from runbook_lib.gates import allreduce_busbw_ratio
from runbook_lib.params import load_params
from runbook_lib.phases.mapping import global_batch_gate
from runbook_lib.workload import ddp, load_workload_class, make_workload, require_processes
from runbook_lib.workload.job import spawn_attempt


def _job(params: Path, side: str, *, steps: int, state: dict[str, Any] | None = None) -> tuple[list[float], dict[str, Any], np.ndarray]:
    """``steps`` steps of ``side``'s job (from ``state`` when given): losses, the state after, eval logits."""
    mig = load_params(params)
    wl = make_workload(mig.workload, getattr(mig, side))
    wl.load(None)
    start = wl.load_state_dict(state) if state is not None else 0
    losses = [wl.step(i)["loss"] for i in range(start, start + steps)]
    return losses, wl.state_dict(), wl.outputs()


def test_two_processes_of_16_rows_train_as_one_of_32_and_a_checkpoint_crosses_the_change(make_params: Any) -> None:
    # the DDP demo's sides: 2 processes x 16 rows (source) and 1 x 32 (target), the same 32 rows a step
    params = make_params("demo-train-ddp.yaml")
    two, two_state, two_out = _job(params, "source", steps=10)
    one, one_state, one_out = _job(params, "target", steps=10)
    # the same rows and the averaged gradient: equal up to float32 summation order (measured: 5e-7)
    np.testing.assert_allclose(two, one, rtol=0, atol=1e-5)
    np.testing.assert_allclose(two_out, one_out, rtol=0, atol=1e-5)
    assert two[-1] < two[0]  # it learns
    ranks = ddp.current()
    assert ranks is not None and ranks.world_size == 2
    [helper] = ranks.helpers
    env = psutil.Process(helper.pid).environ()  # torchrun's layout, as the helper rank sees it
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR")} == {
        "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    # the two processes' checkpoint resumes in one process, and the reverse, on the same curve
    after_two, _, _ = _job(params, "target", steps=5, state=two_state)
    after_one, _, _ = _job(params, "source", steps=5, state=one_state)
    np.testing.assert_allclose(after_two, after_one, rtol=0, atol=1e-5)
    figures = ranks.allreduce(1 << 20)
    assert (figures["ranks"], figures["size_bytes"], figures["backend"]) == (2, 1 << 20, "gloo")
    assert figures["busbw_bytes_per_s"] == pytest.approx(figures["algbw_bytes_per_s"])  # 2(n-1)/n = 1 for n = 2
    ranks.close()
    assert helper.returncode == 0 and ddp.current() is None and ranks.closed
    ranks.close()  # once: a second close (its exit hook is gone) touches no later group


def test_the_helper_ranks_end_when_their_leader_is_killed(make_params: Any, tmp_path: Path) -> None:
    # the canary's failure drill SIGKILLs the job after its first checkpoint: its helper rank goes too
    params = make_params("demo-train-ddp.yaml")
    mig = load_params(params)
    wl = make_workload(mig.workload, mig.source)
    wl.load(None)
    wl.export_artifact(tmp_path / "artifact")
    args = argparse.Namespace(params=str(params), side="source", artifact_dir=str(tmp_path / "artifact"),
                              ckpt_dir=str(tmp_path / "ckpt"), work_dir=str(tmp_path))
    leader = spawn_attempt(args, resume=False, pause=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "progress.json").exists():
            assert leader.poll() is None and time.monotonic() < deadline, "the job wrote no checkpoint"
            time.sleep(0.05)
        assert json.loads((tmp_path / "progress.json").read_text()) == {"paused_after_step": 10}
        helpers = psutil.Process(leader.pid).children()
        assert [h.environ()["RANK"] for h in helpers] == ["1"]
        leader.send_signal(signal.SIGKILL)
        leader.wait()
        gone, alive = psutil.wait_procs(helpers, timeout=5)
        assert not alive, f"helper rank(s) {[p.pid for p in alive]} outlived their leader"
    finally:
        leader.kill()
        leader.wait()


def test_nccl_tests_bandwidth_formulas_give_a_published_runs_figures() -> None:
    # all_reduce_perf over 16 H100 ranks (two nodes of 8), out-of-place columns of the run posted in
    # github.com/lessizzmore/create-a3mega-ztan-fork, file ztan-NCCL-test-result: size (B), time (us),
    # algbw and busbw (GB/s), as nccl-tests printed them
    for size, us, algbw, busbw in ((1073741824, 6759.0, 158.86, 297.86), (8388608, 571.9, 14.67, 27.50),
                                   (134217728, 1652.2, 81.24, 152.32)):
        a, b = ddp.bus_bandwidth(size, us * 1e-6, 16)
        assert (round(a / 1e9, 2), round(b / 1e9, 2)) == (algbw, busbw)
    with pytest.raises(WorkloadError, match="2 or more ranks"):
        ddp.bus_bandwidth(1 << 20, 0.001, 1)


def test_a_world_size_change_that_changes_the_global_batch_fails_phase_02s_gate(make_params: Any) -> None:
    kept = global_batch_gate(load_params(make_params("demo-train-ddp.yaml")))
    assert kept is not None and (kept.verdict, kept.observed, kept.threshold) == ("PASS", 32, 32)
    assert "source 2 process(es) x 16 = 32 rows, target 1 process(es) x 32 = 32 rows" in kept.detail
    halved = global_batch_gate(load_params(make_params("demo-train-ddp.yaml", target={"batch_size": 16})))
    assert halved is not None and (halved.verdict, halved.observed, halved.threshold) == ("FAIL", 16, 32)
    assert "set target.batch_size to 32 to keep 32 rows a step" in halved.detail
    odd = global_batch_gate(load_params(make_params("demo-train.yaml", target={"world_size": 3})))
    assert odd is not None and "no whole target.batch_size keeps 32 rows over 3 processes" in odd.detail
    assert global_batch_gate(load_params(make_params("demo-train.yaml"))) is None  # one process, one batch: no finding


def test_more_than_one_process_is_refused_where_it_cannot_run(make_params: Any) -> None:
    with pytest.raises(ParamsError, match="data-parallel processes are for a training job"):
        load_params(make_params("demo.yaml", target={"world_size": 2}))
    embed = load_workload_class("runbook_lib.workload.embed:EmbeddingWorkload")
    mig = load_params(make_params("demo-train-ddp.yaml"))
    with pytest.raises(WorkloadError, match="source.world_size 2: .*EmbeddingWorkload runs in one process"):
        require_processes(embed, source=mig.source, target=mig.target)


def test_the_allreduce_comparison_is_not_applicable_with_one_process_and_judged_with_two() -> None:
    gb = 1e9
    na = allreduce_busbw_ratio([1.1 * gb, 1.3 * gb], [], ranks={"source": 2, "target": 1}, min_ratio=0.95,
                               size_bytes=8 << 20, phase="04")
    assert (na.verdict, na.blocking) == ("NOT_APPLICABLE", False)
    assert "the target runs only one process" in na.detail and "source 2 process(es): busbw 1.20 GB/s" in na.detail
    slower = allreduce_busbw_ratio([2 * gb, 2 * gb], [gb, gb], ranks={"source": 2, "target": 2}, min_ratio=0.95,
                                   size_bytes=8 << 20)
    assert (slower.verdict, slower.observed) == ("FAIL", 0.5)
    assert allreduce_busbw_ratio([gb], [gb], ranks={"source": 4, "target": 2}, min_ratio=0.95,
                                 size_bytes=8 << 20).verdict == "PASS"
    assert allreduce_busbw_ratio([gb], [], ranks={"source": 2, "target": 2}, min_ratio=0.95,
                                 size_bytes=8 << 20).verdict == "INCONCLUSIVE"


def test_the_gpu_check_script_runs_the_job_and_times_the_all_reduce_on_cpu() -> None:
    # benchmarks/ddp.py is what a lent GPU machine runs (NCCL there); here it runs with gloo
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "ddp.py"), "--device", "cpu", "--world-size", "2",
                          "--steps", "8", "--sizes-mib", "1"], capture_output=True, text=True, timeout=300, check=True)
    last = dict(kv.split("=") for kv in out.stdout.strip().splitlines()[-1].split())
    assert (last["device"], last["ranks"], last["backend"]) == ("cpu", "2", "gloo"), out.stdout
    assert float(last["step_ms_p50"]) > 0 and float(last["busbw_gbps"]) > 0
    assert "all-reduce 1 MiB over 2 ranks (gloo)" in out.stdout and "no CUDA device" in out.stdout


def test_a_helper_rank_that_cannot_load_its_workload_is_named_at_once(make_params: Any) -> None:
    # a workload the helper's own validation refuses (fewer steps than a checkpoint needs, set past
    # the params' checks): rank 0 names the helper's exit instead of waiting out the group's timeout
    mig = load_params(make_params("demo-train-ddp.yaml"))
    wl = make_workload(mig.workload.model_copy(update={"train_steps": 8}), mig.source)
    t0 = time.monotonic()
    with pytest.raises(WorkloadError, match="rank 1 exited with code 1"):
        wl.load(None)
    assert time.monotonic() - t0 < ddp.LEADER_TIMEOUT_S / 10 and ddp.current() is None
