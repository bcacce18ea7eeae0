"""Where a training job keeps its checkpoints, against a destroyed pod: phase 02's row before
anything is rented, the store's checkpoint sets, and phase 04's ``checkpoint_durability`` drill
on real local pods (the agent in ``hold`` mode destroyed mid-run, a new pod in ``resume`` mode).
The drill's PASS through a whole migration is the training demo's e2e case (test_e2e.py)."""

from __future__ import annotations

import json
import signal
import sys
from dataclasses import replace
from pathlib import Path

import psutil

from runbook_lib.evidence.approvals import require
from runbook_lib.evidence.records import ADAPTER, EQUIVALENT, NONE
from runbook_lib.params import load_params
from runbook_lib.phases.compare.durability import Held, judge
from runbook_lib.phases.mapping import checkpoint_row
from runbook_lib.providers.base import PodSpec
from runbook_lib.providers.local import LocalProvider
from runbook_lib.storage import open_store
from runbook_lib.workload import make_workload
from runbook_lib.workload.durable import StoreCheckpoints
from runbook_lib.workload.job import save_checkpoint


def test_phase_02_names_checkpoints_a_destroyed_pod_takes_with_it(make_params) -> None:
    rows = {where: checkpoint_row(load_params(make_params("demo-train.yaml", workload={"checkpoint_location": where})))
            for where in ("container", "volume", "store")}
    assert {w: r.status for w, r in rows.items()} == {"container": NONE, "volume": ADAPTER, "store": EQUIVALENT}
    assert "the container disk goes with its pod" in rows["container"].reason
    assert "starts again from step 0" in rows["volume"].reason and "checkpoint_location: store" in rows["volume"].reason
    assert rows["store"].target == "kept in the run's store"


def test_the_store_keeps_each_checkpoint_as_a_set_and_a_resume_refuses_an_unmarked_one(tmp_path: Path) -> None:
    import torch

    store = open_store(f"file://{tmp_path / 'store'}")
    kept = StoreCheckpoints(store, "runs/r/hold/checkpoints", "r")
    for step in (10, 20):
        kept.saved(save_checkpoint({"w": torch.full((3,), float(step))}, tmp_path / "pod1", step))
    store.delete("runs/r/hold/checkpoints/step-000020/_SUCCESS")  # the machine went away mid-commit
    got = StoreCheckpoints(store, "runs/r/resume/checkpoints", "r", restore_from="runs/r/hold/checkpoints")
    out = got.restore(tmp_path / "pod2")
    assert out["set"] == "runs/r/hold/checkpoints/step-000010"
    assert [r["prefix"] for r in out["rejected"]] == ["runs/r/hold/checkpoints/step-000020"]
    assert "no completion marker" in out["rejected"][0]["reason"]
    assert sorted(p.name for p in (tmp_path / "pod2").iterdir()) == ["step-000010.pt", "step-000010.pt.sha256"]
    assert StoreCheckpoints(store, "runs/r/none", "r").restore(tmp_path / "pod3")["set"] is None


def _agent(prov: LocalProvider, run_dir: Path, params: Path, store_url: str, mode: str, prefix: str,
           *extra: str) -> str:
    argv = (sys.executable, "-m", "runbook_lib.workload.job", "agent", mode, "--params", str(params), "--side", "target",
            "--run-id", "r", "--store-url", store_url, "--prefix", prefix, "--frozen-prefix", "runs/r/frozen", *extra)
    plan = prov.plan_launch(PodSpec(name=mode, command=argv, device="cpu", price_usd_per_hour=0.29,
                                    labels=(("run_id", "r"),)))
    return prov.apply(plan, require(plan, run_dir=run_dir, preapproved_local=True)).id


def test_checkpoints_on_a_destroyed_pods_volume_are_lost_and_the_drill_fails(make_params, tmp_path: Path) -> None:
    where = "volume"
    params = make_params("demo-train.yaml", workload={"checkpoint_location": where})
    mig = load_params(params)
    url = f"file://{tmp_path / 'store'}"
    store = open_store(url)
    wl = make_workload(mig.workload, mig.target)
    wl.load(None)
    wl.export_artifact(tmp_path / "frozen")
    store.commit_set("runs/r/frozen", [store.put_file(f, f"runs/r/frozen/{f.name}")
                                       for f in (tmp_path / "frozen").iterdir()], run_id="r")
    prov = LocalProvider(root=tmp_path / "state")
    hold = _agent(prov, tmp_path / "run", params, url, "hold", "runs/r/hold")
    prov.wait_exit(hold, timeout_s=120, finished=lambda: store.head("runs/r/hold/result/_SUCCESS") is not None)
    assert prov.get(hold).state == "RUNNING"  # holding mid-run, its result set committed
    # SIGTERM to the agent alone, as `docker stop` signals PID 1: it passes the notice on to its job,
    # which finishes the step it held before, saves a last checkpoint, and the agent exits 143
    leader = psutil.Process(json.loads((tmp_path / "state" / "pods" / hold / "pod.json").read_text())["pid"])
    [agent] = [p for p in leader.children() if "agent" in p.cmdline()]
    agent.send_signal(signal.SIGTERM)
    done = prov.wait_exit(hold, timeout_s=30)
    saved = json.loads((Path(done.container_dir) / "work" / "preempted.json").read_text())
    assert (done.exit_code, saved["checkpoint"]) == (143, "step-000012.pt"), prov.log_tail(hold)
    assert (Path(done.volume_dir) / "ckpt" / "step-000012.pt").exists()  # on the volume, which the destroy removes
    gone = prov.plan_destroy(hold)
    prov.apply(gone, require(gone, run_dir=tmp_path / "run", preapproved_local=True))
    resume = _agent(prov, tmp_path / "run", params, url, "resume", "runs/r/resume")
    done = prov.wait_exit(resume, timeout_s=120)
    assert done.exit_code == 0, prov.log_tail(resume)
    held = Held.of(json.loads(store.get_bytes("runs/r/hold/result/result.json"))["hold"], pod_id=hold,
                   gone=prov.is_gone(hold))
    [resumed] = json.loads(store.get_bytes("runs/r/resume/result/result.json"))["attempts"]
    assert (held.location, held.steps_finished, held.checkpoint, held.kept, held.gone) == \
        (where, 11, "step-000010.pt", (), True)
    assert resumed["resumed_from"] is None and resumed["start_step"] == 0
    verdict, seen = judge(held, resumed, resume_id=resume)
    assert verdict == "FAIL", seen
    assert "found no checkpoint (a pod's volume outlives a stop, not a destroy" in seen
    assert "losing 11 step(s); keep checkpoints in the store" in seen
    # the same two records, the job having kept its checkpoints in the store: the judge's PASS
    restored = {**resumed, "resumed_from": "step-000012.pt", "start_step": 12, "restored": {"set": "x/step-000012"}}
    verdict, seen = judge(replace(held, location="store", kept=("step-000010",)), restored, resume_id=resume)
    assert verdict == "PASS" and "newer than step-000010.pt: the job saved it on the destroy's SIGTERM" in seen
