"""`runbook rehearse` end to end, as `make rehearse` runs it: params/runpod-to-vast-train.yaml,
params/runpod-to-vast-service.yaml (a team's own chat image on a Runpod pod to a Vast.ai
instance, the simulators running its stand-in, `transformers serve`) and
params/runpod-serverless-to-vast-handler.yaml (a team's Runpod handler on a Runpod Serverless
queue endpoint, the simulator running its stand-in under Runpod's worker runtime, to a Vast.ai
Serverless endpoint, its workers running the stand-in behind a PyWorker that checks the
autoscaler's signature) run all six phases through the real Runpod and Vast.ai
adapters against the loopback simulators and moto's S3, end GO, and their evidence says they were
rehearsals. The fourth migration `make rehearse` runs, params/runpod-to-vast.yaml, is rehearsed to
GO by test_e2e_drills.py's money-safety drill with its own drills on (one whole migration fewer
in CI); that the default runs all four is test_simulator.py's. Slow (about five minutes on 2
cores): `make test-e2e`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import boto3
import pandas as pd
import pytest
import yaml

from runbook_lib.cli import main as cli_main
from runbook_lib.errors import EXIT_GO
from runbook_lib.run.rehearse import start, write_copy
from runbook_lib.run.runstore import RunLocation, RunStore

from .conftest import ROOT
from .runs import BESIDE_OTHER_WORK, deep_merge, merged, write_params

pytestmark = [pytest.mark.e2e, pytest.mark.measure]  # both migrations must GO on their measurements


def _rehearsed(tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch,
               names: tuple[str, ...]) -> tuple[str, dict[str, Path]]:
    """``runbook rehearse`` of ``params/<names>`` in a project of its own, as `make rehearse` runs
    them but with runs.BESIDE_OTHER_WORK merged in (a rehearsal's subject is the adapters and the
    evidence, not latency on one shared host; rehearse.MARGINS keeps the wider margins): every one GO, its committed params untouched, its evidence marked as a rehearsal and
    verified, no simulator key in it. Returns the command's output and the run directories by
    kind (``train``, ``service``, ``handler``)."""
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "notebooks").symlink_to(ROOT / "notebooks")
    (tmp_path / "params").mkdir()
    for shared in (".venv-serve", ".venv-runpod", "examples"):  # the stand-ins and their sample inputs
        (tmp_path / shared).symlink_to(ROOT / shared)
    (tmp_path / ".runbook").mkdir()
    (tmp_path / ".runbook" / "models").symlink_to(ROOT / ".runbook" / "models")
    for name in names:  # measured beside the other cases' work, with margins noise cannot decide
        data = deep_merge(yaml.safe_load((ROOT / "params" / name).read_text()), BESIDE_OTHER_WORK)
        if name == "runpod-to-vast-train.yaml":  # the canary's job drills are the training demo's case
            data["drills"] = {"run": ["checkpoint_durability", "spend_limit", "preferred_offer_removed"]}
        (tmp_path / "params" / name).write_text(yaml.safe_dump(data, sort_keys=False))
    before = {n: (tmp_path / "params" / n).read_bytes() for n in names}
    for var in ("RUNPOD_API_KEY", "VAST_API_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    code = cli_main(["rehearse", *(f"params/{n}" for n in names)])
    out = capsys.readouterr().out
    assert code == EXIT_GO, out
    assert out.count(": GO (exit 0)") == len(names) and "rehearse_s=" in out
    assert {n: (tmp_path / "params" / n).read_bytes() for n in names} == before  # committed params untouched
    by_kind = {("train" if "digits" in d.name else "service" if "chat" in d.name else "handler" if "handler" in d.name
                else "other"): d for d in (tmp_path / "reports").iterdir() if d.is_dir()}
    for kind, run_dir in by_kind.items():
        receipt = json.loads((run_dir / "receipt.json").read_text())
        assert receipt["decision"] == "GO", kind
        assert receipt["rehearsal"]["simulators"] == {"source": "runpod", "target": "vast"}
        assert "source.dry_run = False" in receipt["rehearsal"]["params"]["overrides"]
        point = receipt["rollback_point"]  # names who may order a rollback, and the source kept running
        assert (point["rollback_owner"], point["source_provider"]) == ("platform-oncall@example.com", "runpod")
        assert json.loads((run_dir / "manifest.json").read_text())["rehearsal"]["simulators"]
        approvals = [json.loads(p.read_text())["approval"]["method"] for p in (run_dir / "approvals").glob("*.json")]
        assert approvals and all("simulator" in m or "teardown" in m for m in approvals)
        assert cli_main(["verify", str(run_dir)]) == 0
        for f in run_dir.rglob("*"):  # the simulators' keys never reach the evidence
            if f.is_file():
                assert b"sim-rp-" not in f.read_bytes() and b"sim-vast-" not in f.read_bytes(), f
    assert cli_main(["list", "--reports", str(tmp_path / "reports")]) == 0
    assert capsys.readouterr().out.count("REHEARSAL: ") == len(names)
    return out, by_kind


def test_the_training_and_service_migrations_rehearse_go_and_are_marked_rehearsals(tmp_path: Path, capsys,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    out, by_kind = _rehearsed(tmp_path, capsys, monkeypatch,
                              ("runpod-to-vast-train.yaml", "runpod-to-vast-service.yaml"))
    assert set(by_kind) == {"train", "service"}
    assert "POST /proxy/{id}/v1/chat/completions x" in out  # the source service answered through Runpod's proxy
    # a Vast.ai instance destroyed past its first checkpoint; the new one read the set from S3 through its grant
    drills = {d["drill"]: d for d in json.loads((by_kind["train"] / "receipt.json").read_text())["drills"]}
    kept = drills["checkpoint_durability"]
    assert kept["verdict"] == "PASS" and "restored from runs/" in kept["observation"], kept
    _the_service_ran_unchanged_on_both_adapters(by_kind["service"])


def test_a_handler_rehearses_from_runpod_serverless_to_vast_serverless_go(tmp_path: Path, capsys,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # its own case, so it runs beside the two above on another of CI's workers
    out, by_kind = _rehearsed(tmp_path, capsys, monkeypatch, ("runpod-serverless-to-vast-handler.yaml",))
    assert set(by_kind) == {"handler"}
    _the_handler_ran_on_a_runpod_serverless_endpoint_then_a_vast_one(by_kind["handler"], out)


def _the_service_ran_unchanged_on_both_adapters(run_dir: Path) -> None:
    """The chat service's rehearsal: launched as declared on a Runpod pod and a Vast.ai instance
    (the providers' own reports), no runbook variable inside, the registry login sent in the create
    request and never in the pod's environment, streamed tokens measured through Runpod's proxy."""
    receipt = json.loads((run_dir / "receipt.json").read_text())
    svc = receipt["service"]
    assert (svc["image"], svc["protocol"], svc["stand_in"]) == ("ghcr.io/example/chat-server:1.4", "openai-chat", True)
    assert svc["launches_as_declared"] and svc["runbook_code_inside"] == [] and svc["exact_match_rate"] == 1.0
    assert [svc["serving"][s]["where"] for s in ("source", "target")] == ["a runpod pod", "a vast pod"]
    assert svc["adapter"] == ""  # a pod on both sides
    stand_ins = receipt["rehearsal"]["params"]["stand_ins"]["ghcr.io/example/chat-server:1.4"]
    assert stand_ins[:2] == ["env", "OMP_NUM_THREADS=1"] and "{port}" in stand_ins  # one torch thread: see the params
    assert stand_ins[2].endswith("/.venv-serve/bin/transformers")
    assert any("registry login" in o for o in receipt["rehearsal"]["params"]["overrides"])
    gates = {(gr["phase"], gr["name"]): gr for gr in receipt["gates"]}
    for phase in ("01", "03"):
        assert gates[(phase, "launched_as_declared")]["verdict"] == "PASS"
        assert "none RUNBOOK_*" in gates[(phase, "no_runbook_inside")]["detail"]
    freeze = json.loads((run_dir / "01_freeze_source.json").read_text())["data"]["freeze"]["service"]["launch"]
    canary = json.loads((run_dir / "03_prove_parity.json").read_text())["data"]["service"]["launch"]
    assert freeze["ports"]["8000/http"].startswith("127.0.0.1:")  # Runpod: the proxy
    assert canary["ports"]["8000/tcp"].startswith("127.0.0.1:")  # Vast.ai: a mapped port
    assert freeze["command"] == canary["command"] == ["transformers", "serve", "/models/chat", "--host", "0.0.0.0",
                                                      "--port", "8000", "--device", "cuda"]
    assert "REGISTRY_LOGIN" not in freeze["env_names"] + canary["env_names"]
    tokens = json.loads((run_dir / "04_compare_production.json").read_text())["data"]["token_metrics"]
    assert all(tokens[side]["ttft p50 (s)"] < tokens[side]["e2e p50 (s)"] for side in ("source", "target"))


def _the_handler_ran_on_a_runpod_serverless_endpoint_then_a_vast_one(run_dir: Path, out: str) -> None:
    """The handler's rehearsal: its source a Runpod Serverless queue endpoint created as declared
    (Runpod's own report of its settings, its image's entry point, no runbook variable), every
    request through the job API; its canary a Vast.ai Serverless endpoint created as declared
    (template, endpoint, workergroup as Vast.ai lists them), every request routed by the
    autoscaler to a worker's PyWorker, the adapter named in phase 02 and in the receipt."""
    receipt = json.loads((run_dir / "receipt.json").read_text())
    svc = receipt["service"]
    assert (svc["image"], svc["protocol"], svc["stand_in"]) == ("ghcr.io/example/text-handler:2.1", "runpod-handler",
                                                                True)
    assert svc["launches_as_declared"] and svc["runbook_code_inside"] == [] and svc["exact_match_rate"] == 1.0
    freeze = json.loads((run_dir / "01_freeze_source.json").read_text())["data"]["freeze"]["service"]["launch"]
    canary = json.loads((run_dir / "03_prove_parity.json").read_text())["data"]["service"]["launch"]
    ep = freeze["endpoint"]
    assert (ep["type"], ep["workers_min"], ep["workers_max"], ep["idle_timeout_s"], ep["gpu_pools"],
            ep["execution_timeout_ms"], ep["flashboot"]) == ("QUEUE", 1, 1, 5, ["ADA_24"], 60_000, "FLASHBOOT")
    assert freeze["as_declared"] and freeze["command"] == [] and "entry point" in freeze["entry_point"]
    assert freeze["url"].endswith(f"/v2/{freeze['pod']}") and freeze["env_names"] == []
    vast = canary["endpoint"]
    assert canary["as_declared"] and canary["pod"].startswith("ept-") and canary["command"] == []
    assert (vast["type"], vast["max_workers"], vast["cold_workers"], vast["pyworker"]) == (
        "vast serverless", 1, 1, {"repo": "https://github.com/example/text-handler-pyworker", "route": "/runsync",
                                  "healthcheck": "/"})
    assert canary["env_names"] == ["PYWORKER_HEALTHCHECK", "PYWORKER_REPO", "PYWORKER_ROUTE"]
    rows = {r["dependency"]: r for r in json.loads((run_dir / "02_map_target.json").read_text())["data"]["dependency_map"]}
    assert rows["serving"]["status"] == "adapter needed" and "PyWorker" in rows["serving"]["reason"]
    assert rows["endpoint setting: idle timeout"]["target"] == "none"  # each setting mapped, the missing named
    assert "POST /v2/{id}/runsync x" in out  # the source answered through Runpod's job API
    assert "POST /route x" in out and "GET /pubkey x" in out  # the target's requests were routed by the autoscaler
    # the receipt names both sides' serving, the endpoint's settings as Runpod reported them, and the adapter
    serving = svc["serving"]
    assert serving["source"]["id"] == freeze["pod"] and serving["source"]["endpoint"] == ep
    assert serving["source"]["where"].startswith("Runpod Serverless QUEUE: workers 1 min of 1 max")
    assert serving["target"]["id"] == canary["pod"] and serving["target"]["endpoint"] == vast
    assert serving["target"]["where"].startswith("Vast.ai Serverless endpoint")
    assert svc["adapter"] == rows["serving"]["reason"] and "HandlerConfig route is /runsync" in svc["adapter"]
    # cold starts from zero on both sides: each side's idle worker stopped before each start (Runpod:
    # its idle timeout; Vast.ai: no load kept), the start's wait for a worker is its queue time
    zero = pd.read_csv(run_dir / "04" / "cold_starts_from_zero.csv")
    assert sorted(zero["side"]) == ["source"] * 3 + ["target"] * 3 and set(zero["status"]) == {"COMPLETED"}
    assert (zero["queue_s"] > 0.5 * zero["total_s"]).all() and (zero["execution_s"] < zero["total_s"]).all()
    cold = next(d for d in receipt["acceptance_deltas"] if d["gate"] == "cold_start_ratio")
    assert cold["source"] == zero[zero["side"] == "source"]["total_s"].median()
    # the job drills that reach a handler: redelivery under its idempotency key, through the PyWorker
    drills = {d["drill"]: d for d in receipt["drills"]}
    assert [(n, d["verdict"]) for n, d in drills.items()] == [("spend_limit", "PASS"), ("redeliver", "PASS"),
                                                              ("hung_worker", "NOT_APPLICABLE")]
    assert "replayed: first False, second True" in drills["redeliver"]["observation"]
    assert "Vast.ai Serverless endpoint sets no execution timeout" in drills["hung_worker"]["observation"]


def test_a_chat_service_on_a_runpod_load_balancing_endpoint_is_frozen_and_its_canary_proven_on_two_workers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Phases 01-03 (and 06) of the chat migration with its source on a Runpod Serverless
    LOAD_BALANCER endpoint, through the simulators (the chat server's stand-in serving /ping):
    the endpoint is created as Runpod documents one and frozen as Runpod reports it, every request
    goes to its own URL with the Runpod key, phase 02 names what changes in the request path, the
    Vast.ai canary matches its golden, and phase 06 destroys the endpoint. The whole six phases
    are the handler rehearsal's (a queue endpoint); this one shares none of its runs.

    Its phases run as an orchestrator places them: `runbook phase` on two workers (two project
    directories, A and B by turns) against one run location in moto's S3, each phase pulling the
    last push and pushing its own (runbook_lib/run/runstore.py); the stored run then verifies."""
    workers = {}
    for name in ("a", "b"):
        project = workers[name] = tmp_path / name
        (project / "params").mkdir(parents=True)
        (project / "pyproject.toml").write_text("")
        (project / "examples").symlink_to(ROOT / "examples")
    service = {"private_image": False, "registry_credential": "", "readiness": {"path": "/ping", "timeout_s": 60},
               "stand_in": {"command": [sys.executable, str(ROOT / "tests" / "faulty_service.py"), "{port}"]},
               "ttft_slo_s": None, "tpot_slo_s": None}
    params = write_params(workers["a"], "runpod-to-vast-service.yaml", "lb.yaml", **merged({
        "workload": {"service": service},
        "source": {"secrets": [], "workers": 1, "active_workers": 1, "idle_timeout_s": 5,
                   "serverless": {"type": "LOAD_BALANCER", "execution_timeout_s": 60}},
        "target": {"secrets": []}, "drills": {"run": [], "blocking": []}}))
    for var in ("RUNPOD_API_KEY", "VAST_API_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(workers["a"])
    reh = start(workers["a"])
    url = "s3://runbook-runs/fleet/lb-0001"
    try:
        copy = write_copy(params, reh).relative_to(workers["a"])  # the same params bytes on both workers
        (workers["b"] / copy).parent.mkdir(parents=True)
        (workers["b"] / copy).write_bytes((workers["a"] / copy).read_bytes())
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", reh.s3_url)  # the run store, named as boto3 reads it
        boto3.client("s3", endpoint_url=reh.s3_url, region_name="us-east-1").create_bucket(Bucket="runbook-runs")
        for phase, worker in (("01", "a"), ("02", "b"), ("03", "a"), ("06", "b")):
            monkeypatch.chdir(workers[worker])
            assert cli_main(["phase", phase, str(copy), url]) == 0, capsys.readouterr()
        requests = reh.sims["runpod"].request_summary()
        endpoints = {k: v for k, v in reh.sims["runpod"].api.state.items() if k.endswith("ep")}  # type: ignore[attr-defined]
        state = RunStore(RunLocation.parse(url)).state()
        assert state is not None and [(h["phase"], Path(h["worker"]["project"]).name) for h in state.history] == [
            ("01", "a"), ("02", "b"), ("03", "a"), ("06", "b")]
        capsys.readouterr()
        assert cli_main(["verify", url]) == 0, capsys.readouterr().out  # the run as stored, pulled and checked
        run_dir = workers["b"] / "reports" / "lb-0001"  # worker B's copy: the last push
    finally:
        reh.close()
    freeze = json.loads((run_dir / "01_freeze_source.json").read_text())["data"]["freeze"]["service"]
    launch = freeze["launch"]
    assert launch["as_declared"] and launch["endpoint"]["type"] == "LOAD_BALANCER"
    assert launch["url"].endswith(f"/lb/{launch['pod']}")
    assert launch["env_names"] == ["CHAT_MODEL_DIR", "HF_HUB_OFFLINE", "PORT", "PORT_HEALTH"]  # the service's, and Runpod's
    assert any(k.startswith("POST /lb/") and k.endswith("/v1/chat/completions") for k in requests), requests
    rows = {r["dependency"]: r for r in json.loads((run_dir / "02_map_target.json").read_text())["data"]["dependency_map"]}
    assert rows["serving"]["status"] == "adapter needed" and "load balancer" in rows["serving"]["reason"]
    assert "routing by /ping health" in rows["serving"]["reason"]
    gates = {(g["phase"], g["name"]): g["verdict"] for g in json.loads((run_dir / "receipt.json").read_text())["gates"]}
    assert gates[("01", "launched_as_declared")] == gates[("03", "service_parity")] == "PASS"
    assert list(endpoints) == [launch["pod"]] and endpoints[launch["pod"]].get("deleted")  # phase 01 deleted it
