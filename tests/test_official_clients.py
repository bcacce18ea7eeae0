"""The outside check: the official clients, unmodified, each in its own environment that `make
test-e2e` creates (they cannot share one: vastai 1.9.1 pins ``cryptography==49.0.0``, runpod
1.12.0 needs ``>=50``). The ``vastai`` CLI 1.9.1 (``.venv-vastai``) drives the Vast.ai simulator
with only ``--url`` changed; the ``runpod`` package 1.12.0 (``.venv-runpod``) runs jobs on the
Runpod simulator's serverless workers with only ``RUNPOD_ENDPOINT_BASE_URL`` changed. Each sees
the same state the runbook's adapter sees. Where a client and a simulator disagree, the
simulator is wrong."""

from __future__ import annotations

import ast
import base64
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from runbook_lib.evidence.approvals import Approval
from runbook_lib.params import load_params
from runbook_lib.providers import create_provider
from runbook_lib.providers.api import KeySource
from runbook_lib.providers.base import EndpointSpec, PodSpec
from runbook_lib.providers.simulator import simulate
from runbook_lib.service.protocols import client_for
from runbook_lib.workload import make_workload

from .conftest import ROOT

pytestmark = pytest.mark.e2e
VASTAI = ROOT / ".venv-vastai" / "bin" / "vastai"
KEY = "official-client-key-5e0c"


def _vastai(url: str, *args: str) -> Any:
    """Run the official CLI with ``--raw``; its answer as data (``create instance`` prints
    ``Started.`` and a Python dict before nothing else; destroy prints nothing)."""
    assert VASTAI.exists(), "the official client is missing: `make test-e2e` installs it into .venv-vastai"
    r = subprocess.run([str(VASTAI), "--url", url, "--api-key", KEY, *args, "--raw"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout.strip()
    starts = [i for i in (out.find("{"), out.find("[")) if i >= 0]
    if not starts:
        return out
    text = out[min(starts):]
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return ast.literal_eval(text)


def test_the_vastai_cli_and_the_adapter_see_one_simulated_account(tmp_path: Path) -> None:
    srv = simulate("vast", state_dir=tmp_path / "sim", key=KEY)
    prof = load_params(ROOT / "params" / "runpod-to-vast-train.yaml").target.model_copy(update={"api_url": srv.url})
    prov = create_provider("vast", profile=prof, key=KeySource("vast", ("env:NONE",), _value=KEY), poll_s=0.1)
    try:
        offers = _vastai(srv.url, "search", "offers", "gpu_name=RTX_4090")
        ours = {o.offer_id for o in prov.search_offers(prof.offer)}
        # the adapter's search finds the four RTX 4090 offers of the recorded search
        # (providers/vast/recorded/), and the CLI lists them all: an adapter that found nothing fails here
        assert ours == {"8812345", "8812399", "8812400", "8812501"} and {str(o["id"]) for o in offers} >= ours
        made = _vastai(srv.url, "create", "instance", "8812345", "--image", "ghcr.io/example/agent:1", "--disk",
                       "40", "--args", "python", "-c", "import time; time.sleep(60)")
        iid = str(made["new_contract"])
        assert made["success"] is True and isinstance(made["new_contract"], int)
        spec = PodSpec(name="adapter-made", command=("python", "-c", "import time; time.sleep(60)"), device="cpu",
                       price_usd_per_hour=0.4, labels=(("run_id", "official"),), image="ghcr.io/example/agent:1",
                       offers=("8812501",), disk_gb=40)
        plan = prov.plan_launch(spec, dry_run=False)
        ours = prov.apply(plan, Approval(plan.fingerprint, "test", "2026-11-30T00:00:00Z", "test"))
        assert prov.get(iid).state == "RUNNING"  # the adapter sees what the CLI created ...
        shown = {str(r["id"]): r for r in _vastai(srv.url, "show", "instances")}
        assert {iid, ours.id} <= set(shown)  # ... and the CLI sees what the adapter created
        assert shown[ours.id]["actual_status"] == "running" and shown[ours.id]["label"].startswith("runbook:")
        _vastai(srv.url, "destroy", "instance", iid, "-y")
        assert prov.is_gone(iid) and iid not in {str(r["id"]) for r in _vastai(srv.url, "show", "instances")}
    finally:
        prov.close()
        srv.close()


RUNPOD_PYTHON = ROOT / ".venv-runpod" / "bin" / "python"
RUNPOD_SCRIPT = """
import json, sys
import runpod  # reads RUNPOD_ENDPOINT_BASE_URL when imported

runpod.api_key = sys.argv[1]
endpoint = runpod.Endpoint(sys.argv[2])
payload = json.loads(sys.argv[3])
out = {"run_sync": endpoint.run_sync({"input": payload}, timeout=120)}
job = endpoint.run({"input": payload})
out["output"] = job.output(timeout=120)
out["status"] = job.status()
out["health"] = endpoint.health()
print(json.dumps(out))
"""


def test_the_runpod_client_runs_jobs_on_the_simulators_serverless_workers(tmp_path: Path) -> None:
    assert RUNPOD_PYTHON.exists(), "the official client is missing: `make test-e2e` installs it into .venv-runpod"
    demo = ROOT / "params" / "demo.yaml"
    mig = load_params(demo)
    wl = make_workload(mig.workload, mig.target)
    wl.load()
    payload = wl.request_inputs(1, seed=0)[0][1]
    golden = np.array(wl.infer([payload])[0])
    srv = simulate("runpod", state_dir=tmp_path / "sim", key=KEY)
    prof = load_params(ROOT / "params" / "runpod-to-vast.yaml").source.model_copy(
        update={"api_url": srv.url, "job_api_url": srv.url})
    prov = create_provider("runpod", profile=prof, key=KeySource("runpod", ("env:NONE",), _value=KEY), poll_s=0.1)
    try:
        spec = EndpointSpec(name="official", params_path=str(demo), side="target", workers=1, price_usd_per_hour=0.3,
                            labels=(("run_id", "official"),), image="ghcr.io/example/embed-api:2.3.1",
                            env=(("RUNBOOK_PARAMS_YAML", demo.read_text()), ("RUNBOOK_SIDE", "target")))
        plan = prov.plan_endpoint(spec, dry_run=False)
        ep = prov.apply(plan, Approval(plan.fingerprint, "test", "2026-11-30T00:00:00Z", "test"))
        r = subprocess.run([str(RUNPOD_PYTHON), "-c", RUNPOD_SCRIPT, KEY, ep.id, json.dumps(payload)],
                           capture_output=True, text=True, timeout=300,
                           env={"RUNPOD_ENDPOINT_BASE_URL": f"{srv.url}/v2", "PATH": "/usr/bin:/bin",
                                "HOME": str(tmp_path)})
        assert r.returncode == 0, r.stderr[-3000:]
        got = json.loads(r.stdout.strip().splitlines()[-1])
        np.testing.assert_allclose(np.array(got["run_sync"]), golden, rtol=1e-5, atol=1e-6)  # the workload's answer
        np.testing.assert_allclose(np.array(got["output"]), golden, rtol=1e-5, atol=1e-6)
        assert got["status"] == "COMPLETED"
        assert got["health"]["jobs"]["completed"] == 2 and "idle" in got["health"]["workers"]
        client = prov.job_client(ep.id)
        try:  # the adapter sees the same endpoint
            assert client.health()["jobs"]["completed"] == 2
        finally:
            client.close()
    finally:
        prov.close()
        srv.close()


HANDLER_IMAGE = "ghcr.io/example/text-handler:2.1"


def _handler_simulator(provider: str, tmp_path: Path) -> tuple[Any, Any]:
    """``provider``'s simulator running the handler's stand-in (examples/runpod_handler.py under
    the SDK's HTTP API, in its own environment) for :data:`HANDLER_IMAGE`, and the handler
    migration's params."""
    srv = simulate(provider, state_dir=tmp_path / "sim", key=KEY)
    srv.api.stand_ins[HANDLER_IMAGE] = (str(RUNPOD_PYTHON), str(ROOT / "examples" / "runpod_handler.py"),  # type: ignore[attr-defined]
                                        "--rp_serve_api", "--rp_api_host", "127.0.0.1", "--rp_api_port", "{port}")
    return srv, load_params(ROOT / "params" / "runpod-serverless-to-vast-handler.yaml")


def test_the_runpod_client_runs_a_teams_handler_on_a_service_endpoint_that_scales_to_zero(tmp_path: Path) -> None:
    """A team's handler image on a Runpod Serverless queue endpoint (``serverless`` in params):
    the simulator runs its stand-in (examples/runpod_handler.py under the SDK) as the endpoint's
    worker; the official client's ``run_sync`` and ``run`` get the handler's own answer; once the
    idle worker has stopped, the next job waits for a new one, and its ``delayTime`` carries that
    cold start."""
    assert RUNPOD_PYTHON.exists(), "the official client is missing: `make test-e2e` installs it into .venv-runpod"
    srv, mig = _handler_simulator("runpod", tmp_path)
    prof = mig.source.model_copy(update={"api_url": srv.url, "job_api_url": srv.url})
    prov = create_provider("runpod", profile=prof, key=KeySource("runpod", ("env:NONE",), _value=KEY), poll_s=0.1)
    try:
        spec = EndpointSpec(name="handler", params_path="", side="source", workers=1, price_usd_per_hour=0.99,
                            labels=(("run_id", "official"),), image=HANDLER_IMAGE, gpu_types=("ADA_24",),
                            active_workers=0, idle_timeout_s=1.0, execution_timeout_s=60.0, service=True)
        plan = prov.plan_endpoint(spec, dry_run=False)
        ep = prov.apply(plan, Approval(plan.fingerprint, "test", "2026-11-30T00:00:00Z", "test"))
        r = subprocess.run([str(RUNPOD_PYTHON), "-c", RUNPOD_SCRIPT, KEY, ep.id, json.dumps({"text": "to be or not"})],
                           capture_output=True, text=True, timeout=300,
                           env={"RUNPOD_ENDPOINT_BASE_URL": f"{srv.url}/v2", "PATH": "/usr/bin:/bin",
                                "HOME": str(tmp_path)})
        assert r.returncode == 0, r.stderr[-3000:]
        got = json.loads(r.stdout.strip().splitlines()[-1])
        by_hand = {"words": 4, "chars": 12, "reversed": ["not", "or", "be", "to"]}  # "to be or not", counted
        assert got["run_sync"] == got["output"] == by_hand and got["status"] == "COMPLETED"
        assert got["health"]["jobs"]["completed"] == 2
        with client_for(mig.workload.service, ep.url, timeout_s=60, headers=prov.job_api_headers(),  # type: ignore[arg-type]
                        readiness=("/health", 200)) as c:
            deadline = time.monotonic() + 30
            while sum(c.http.get("/health").json()["workers"].values()) and time.monotonic() < deadline:
                time.sleep(0.2)  # the idle worker stops after its 1 s idle timeout: scaled to zero
            assert sum(c.http.get("/health").json()["workers"].values()) == 0
            cold = c.runsync({"text": "a b"})
        assert cold["status"] == "COMPLETED" and cold["output"] == {"words": 2, "chars": 3, "reversed": ["b", "a"]}
        assert cold["queue_s"] > 0.3, cold  # a new worker's start (the SDK's import and server) in delayTime
    finally:
        prov.close()
        srv.close()


VASTAI_PYTHON = ROOT / ".venv-vastai" / "bin" / "python"
VAST_SERVERLESS_SCRIPT = """
import asyncio, json, ssl, sys
from vastai.serverless.client.client import Serverless

async def main(key, url, name, payload):
    client = Serverless(api_key=key, autoscaler_url=url, webserver_url=url)
    client._ssl_context = ssl.create_default_context()  # no network: Vast.ai's root certificate is not fetched
    try:
        endpoint = await client.get_endpoint(name=name)
        out = await endpoint.request("/runsync", {"input": payload})
        print(json.dumps({k: out[k] for k in ("response", "ok", "status", "url", "auth_data")}))
    finally:
        await client.close()

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])))
"""


def test_the_vastai_serverless_client_is_routed_to_a_pyworker_the_adapter_created(tmp_path: Path) -> None:
    """A Vast.ai Serverless endpoint the adapter created (template, endpoint, workergroup) for a
    team's handler: the official ``vastai`` serverless client finds it by name, asks the
    simulator's ``/route/`` for a worker and calls it; the PyWorker checks the autoscaler's
    signature and answers with the handler's job, as counted by hand. A forged signature is
    refused (401). The endpoint keeps no load (``min_load`` 0): its idle worker is stopped, and
    the client's next request waits while ``/route/`` starts it again (a cold start from zero).
    The CLI lists the endpoint, and the adapter's teardown leaves nothing."""
    assert VASTAI_PYTHON.exists(), "the official client is missing: `make test-e2e` installs it into .venv-vastai"
    srv, mig = _handler_simulator("vast", tmp_path)
    prof = mig.target.model_copy(update={"api_url": srv.url, "autoscaler_url": srv.url})
    prov = create_provider("vast", profile=prof, key=KeySource("vast", ("env:NONE",), _value=KEY), poll_s=0.1)
    settings = (("max_workers", 1), ("cold_workers", 1), ("min_load", 0.0), ("min_cold_load", 0.0),
                ("target_util", 0.9), ("cold_mult", 2.5), ("search_params", "gpu_name=RTX_4090"), ("gpu_ram", 24.0),
                ("onstart", ""), ("pyworker", (("repo", "https://github.com/example/pw"), ("route", "/runsync"),
                                               ("healthcheck", "/"))))
    try:
        spec = EndpointSpec(name="handler", params_path="", side="target", workers=1, price_usd_per_hour=0.45,
                            labels=(("run_id", "official"),), image=HANDLER_IMAGE, mode="serverless", port=8000,
                            service=True, settings=settings)
        plan = prov.plan_endpoint(spec, dry_run=False)
        ep = prov.apply(plan, Approval(plan.fingerprint, "test", "2026-11-30T00:00:00Z", "test"))
        name, _ = prov.route_auth(ep.id)  # type: ignore[attr-defined]
        deadline = time.monotonic() + 60
        while not any(w["status"] == "idle" for w in prov.endpoint_workers(ep.id)):  # type: ignore[attr-defined]
            assert time.monotonic() < deadline, prov.endpoint_workers(ep.id)  # type: ignore[attr-defined]
            time.sleep(0.2)

        def official_request() -> dict[str, Any]:
            r = subprocess.run([str(VASTAI_PYTHON), "-c", VAST_SERVERLESS_SCRIPT, KEY, srv.url, name,
                                json.dumps({"text": "to be or not"})], capture_output=True, text=True, timeout=120,
                               env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
            assert r.returncode == 0, r.stderr[-3000:]
            got: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
            assert got["ok"] and got["status"] == 200 and got["response"]["status"] == "COMPLETED"
            assert got["response"]["output"] == {"words": 4, "chars": 12, "reversed": ["not", "or", "be", "to"]}
            return got

        got = official_request()
        forged = {**got["auth_data"], "signature": base64.b64encode(b"\0" * 256).decode()}
        assert httpx.post(f"{got['url']}/runsync", json={"auth_data": forged, "payload": {"input": {}}}).status_code == 401
        short = {k: v for k, v in got["auth_data"].items() if k != "reqnum"}
        refused = httpx.post(f"{got['url']}/runsync", json={"auth_data": short, "payload": {"input": {}}})
        assert refused.status_code == 422 and refused.json() == {"auth_data": {"reqnum": "missing parameter"}}
        while [w["status"] for w in prov.endpoint_workers(ep.id)] != ["stopped"]:  # type: ignore[attr-defined]
            assert time.monotonic() < deadline + 60, prov.endpoint_workers(ep.id)  # type: ignore[attr-defined]
            time.sleep(0.2)  # no load is kept: the idle worker is stopped (Vast.ai's Inactive)
        official_request()  # the route starts the stopped worker; the client waits for it
        assert [w["status"] for w in prov.endpoint_workers(ep.id)] == ["idle"]  # type: ignore[attr-defined]
        assert name in {e["endpoint_name"] for e in _vastai(srv.url, "show", "endpoints")}
        gone = prov.apply(prov.plan_destroy(ep.id, dry_run=False),
                          Approval(prov.plan_destroy(ep.id, dry_run=False).fingerprint, "test", "2026-11-30T00:00:00Z",
                                   "test"))
        assert gone is not None and name not in {e["endpoint_name"] for e in _vastai(srv.url, "show", "endpoints")}
        assert _vastai(srv.url, "show", "workergroups") == []
        with pytest.raises(httpx.ConnectError):  # its worker is gone with it
            httpx.post(f"{got['url']}/runsync", json={}, timeout=5)
    finally:
        prov.close()
        srv.close()
