"""The two endpoint modes over real HTTP with real workers: ``queue`` (a front door with the job
API: the local provider and the Runpod simulator's serverless endpoints) and ``load_balancing``
(one worker's own HTTP contract, reached straight: the local provider and a Vast.ai instance's
randomly mapped port in the simulator). Outputs are checked against the workload run in this
process; phase 02 names the adapter between the two modes. The simulator cases load the model in
simulated machines and run in `make test-e2e`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pytest

from runbook_lib.errors import ProviderError
from runbook_lib.evidence.approvals import Approval
from runbook_lib.measure.timing import job_timings, served_status
from runbook_lib.params import load_params
from runbook_lib.phases.mapping import endpoint_mode_row
from runbook_lib.providers import create_provider
from runbook_lib.providers.api import KeySource
from runbook_lib.providers.base import EndpointSpec, Provider
from runbook_lib.providers.local import LocalProvider
from runbook_lib.providers.simulator import simulate
from runbook_lib.workload import make_workload

from .conftest import ROOT

DEMO = ROOT / "params" / "demo.yaml"
MIG = load_params(DEMO)
KEY = "sim-test-key-endpoint-modes-0001"


@pytest.fixture(scope="module")
def requests_and_golden() -> tuple[list[Any], list[Any]]:
    """Three requests and the target profile's own outputs for them, computed in this process."""
    wl = make_workload(MIG.workload, MIG.target)
    wl.load()
    payloads = [p for _, p in wl.request_inputs(3, seed=0)]
    return payloads, wl.infer(payloads)


def _ok(plan: Any) -> Approval:
    return Approval(plan.fingerprint, "test", "2026-11-30T00:00:00Z", "test")


def _spec(mode: str, **kw: Any) -> EndpointSpec:
    remote = {"env": (("RUNBOOK_PARAMS_YAML", DEMO.read_text()), ("RUNBOOK_SIDE", "target"),
                      ("RUNBOOK_DEVICE", "cpu"))} if kw.pop("remote", False) else {}
    return EndpointSpec(name=f"ep-{mode}", params_path=str(DEMO), side="target", workers=1, price_usd_per_hour=0.3,
                        labels=(("run_id", "modes"),), mode=mode, image="ghcr.io/example/embed-api:2.3.1",
                        **remote, **kw)


def _serve(prov: Provider, spec: EndpointSpec, payloads: list[Any]) -> tuple[Any, list[dict[str, Any]], dict]:
    plan = prov.plan_endpoint(spec, dry_run=False)
    ep = prov.apply(plan, _ok(plan))
    client = prov.job_client(ep.id, ep.url, timeout_s=60, mode=ep.mode)
    try:
        return ep, [client.runsync(p) for p in payloads], client.health()
    finally:
        client.close()


def _same(jobs: list[dict[str, Any]], golden: list[Any]) -> None:
    assert [j["status"] for j in jobs] == ["COMPLETED"] * len(golden)
    np.testing.assert_allclose(np.array([j["output"] for j in jobs]), np.array(golden), rtol=1e-5, atol=1e-6)


def test_a_local_load_balancing_worker_answers_straight_with_no_job_api(tmp_path: Path, requests_and_golden) -> None:
    payloads, golden = requests_and_golden
    prov = LocalProvider(root=tmp_path / "local")
    ep, jobs, health = _serve(prov, _spec("load_balancing"), payloads)
    try:
        assert ep.mode == "load_balancing" and ep.workers == 1
        _same(jobs, golden)
        assert all(j["execution_s"] > 0 and j["queue_s"] >= 0 for j in jobs)
        assert health["workers"] == {"idle": 1, "running": 0, "initializing": 0} and health["jobs"]["completed"] == 3
        assert httpx.post(f"{ep.url}/run", json={"input": payloads[0]}).status_code == 404  # no queue in front
        assert httpx.get(f"{ep.url}/ping").json() == {"status": "healthy"}
    finally:
        prov.apply(prov.plan_destroy(ep.id, dry_run=False), _ok(prov.plan_destroy(ep.id, dry_run=False)))
    assert prov.get(ep.id).state == "DESTROYED"


@pytest.fixture
def sim_provider(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Provider]:
    name = request.param
    srv = simulate(name, state_dir=tmp_path / "sim", key=KEY)
    real = load_params(ROOT / "params" / "runpod-to-vast.yaml")
    prof = (real.source if name == "runpod" else real.target).model_copy(
        update={"api_url": srv.url, **({"job_api_url": srv.url} if name == "runpod" else {})})
    prov = create_provider(name, profile=prof, key=KeySource(name, ("env:NONE",), _value=KEY), poll_s=0.1)
    try:
        yield prov
    finally:
        prov.close()
        srv.close()


@pytest.mark.usefixtures("beside_untimed_phases")  # no phase runs here: none is timed beside it
@pytest.mark.e2e  # a model load in a simulated instance; the rehearsal covers it too
@pytest.mark.parametrize("sim_provider", ["vast"], indirect=True)
def test_vast_serves_load_balancing_on_a_randomly_mapped_port(sim_provider: Provider, requests_and_golden) -> None:
    payloads, golden = requests_and_golden
    ep, jobs, health = _serve(sim_provider, _spec("load_balancing", remote=True, offers=("8812345",), disk_gb=40),
                              payloads)
    instance = sim_provider.get(ep.id)
    assert ep.mode == "load_balancing" and instance.state == "RUNNING"
    assert ep.url == f"http://{instance.host['ports']['8000/tcp']}" and not ep.url.endswith(":8000")
    _same(jobs, golden)
    assert health["workers"]["idle"] == 1
    sim_provider.apply(plan := sim_provider.plan_destroy(ep.id, dry_run=False), _ok(plan))
    assert sim_provider.list(labels={"run_id": "modes"}) == []
    # Nothing answers at the mapped port: refused, or (a port freed on a host shared with other
    # cases may be bound a moment by another's process) reset; never an answer.
    with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
        httpx.get(f"{ep.url}/ping", timeout=5)


@pytest.mark.usefixtures("beside_untimed_phases")  # no phase runs here: none is timed beside it
@pytest.mark.e2e  # model loads in simulated serverless workers; the rehearsal covers it too
@pytest.mark.parametrize("sim_provider", ["runpod"], indirect=True)
def test_runpod_serverless_jobs_run_on_real_workers_in_runpods_shapes(sim_provider: Provider,
                                                                      requests_and_golden) -> None:
    payloads, golden = requests_and_golden
    ep, jobs, health = _serve(sim_provider, _spec("queue", remote=True), payloads)
    assert ep.mode == "queue"
    _same(jobs, golden)
    for j in jobs:  # Runpod's own fields, in milliseconds
        assert isinstance(j["delayTime"], int) and isinstance(j["executionTime"], int) and "queue_s" not in j
        t = job_timings(j)
        assert t["execution_s"] == j["executionTime"] / 1000 and t["queue_s"] == j["delayTime"] / 1000
    assert health["jobs"]["completed"] == 3 and set(health["workers"]) >= {"idle", "running", "throttled"}
    client = sim_provider.job_client(ep.id, ep.url)
    assert client.status("job-unknown")["status"] == "EXPIRED"  # a 404 on /status: the TTL's answer
    client.close()
    assert [w["status"] for w in sim_provider.workers(ep.id)] == ["IDLE"]  # type: ignore[attr-defined]
    sim_provider.apply(plan := sim_provider.plan_destroy(ep.id, dry_run=False), _ok(plan))
    assert sim_provider.list(labels={"run_id": "modes"}) == []


@pytest.mark.usefixtures("beside_untimed_phases")  # no phase runs here: none is timed beside it
@pytest.mark.e2e  # a model load in a simulated serverless worker
def test_scripted_job_answers_are_served_on_the_wire_and_the_job_client_handles_each(
        tmp_path: Path, requests_and_golden) -> None:
    """A Runpod ``job``/``runsync`` fault script reaches the job requests (they pass through to the
    endpoint's front door outside the fake API): a /runsync that answers before the job ends, a 429
    on /status, a COMPLETED job with no output, a refused /runsync."""
    payloads, golden = requests_and_golden
    script = {"runsync": ["in_progress", "completed_empty", "rate"], "job": ["rate", "in_queue"]}
    srv = simulate("runpod", state_dir=tmp_path / "sim", key=KEY, script=script)
    prof = load_params(ROOT / "params" / "runpod-to-vast.yaml").source.model_copy(
        update={"api_url": srv.url, "job_api_url": srv.url})
    prov = create_provider("runpod", profile=prof, key=KeySource("runpod", ("env:NONE",), _value=KEY), poll_s=0.1)
    try:
        ep = prov.apply(plan := prov.plan_endpoint(_spec("queue", remote=True), dry_run=False), _ok(plan))
        client = prov.job_client(ep.id, ep.url, timeout_s=60, mode=ep.mode)
        first = client.runsync(payloads[0])  # IN_PROGRESS; /status 429 (retried), IN_QUEUE, then the front door's
        _same([first], golden[:1])
        statuses = [path for method, path, _ in srv.api.requests if method == "GET" and "/status/" in path]
        assert len(statuses) >= 3 and all(path.endswith(first["id"]) for path in statuses)  # polled until terminal
        empty = client.runsync(payloads[1])  # COMPLETED, its output dropped: served nothing
        assert empty["status"] == "COMPLETED" and "output" not in empty and served_status(empty) == "NO_OUTPUT"
        with pytest.raises(ProviderError, match="rate limited"):  # a submission is never retried
            client.runsync(payloads[2])
        assert srv.api.script == {"runsync": [], "job": []}  # every scripted answer was served
        assert client.health()["jobs"]["completed"] == 2  # the refused one never reached a worker
        client.close()
        prov.apply(plan := prov.plan_destroy(ep.id, dry_run=False), _ok(plan))
    finally:
        prov.close()
        srv.close()


def test_phase_02_names_the_adapter_between_modes_and_refuses_a_mode_the_target_lacks(tmp_path: Path) -> None:
    local = LocalProvider(root=tmp_path).capabilities()
    vast = create_provider("vast", profile=load_params(ROOT / "params" / "runpod-to-vast.yaml").target,
                           key=KeySource("vast", ("env:NONE",), _value=KEY)).capabilities()
    assert endpoint_mode_row("queue", "queue", local).status == "equivalent"
    to_lb = endpoint_mode_row("queue", "load_balancing", vast)
    assert to_lb.status == "adapter needed" and "callers own retries" in to_lb.reason
    assert "job API in front" in endpoint_mode_row("load_balancing", "queue", local).reason
    none = endpoint_mode_row("queue", "queue", vast)
    assert none.status == "no equivalent" and "set target.endpoint_mode: load_balancing" in none.reason


@pytest.mark.usefixtures("beside_untimed_phases")  # no phase runs here: none is timed beside it
@pytest.mark.e2e  # a model load in a simulated pod
def test_runpod_serves_load_balancing_from_a_pod_through_its_proxy_which_cuts_slow_requests(
        tmp_path: Path, requests_and_golden) -> None:
    payloads, golden = requests_and_golden
    srv = simulate("runpod", state_dir=tmp_path / "sim", key=KEY)
    real = load_params(ROOT / "params" / "runpod-to-vast.yaml")
    prof = real.source.model_copy(update={"api_url": srv.url, "job_api_url": srv.url,
                                          "proxy_url": srv.url + "/proxy/{pod_id}-{port}"})
    prov = create_provider("runpod", profile=prof, key=KeySource("runpod", ("env:NONE",), _value=KEY), poll_s=0.1)
    try:
        spec = _spec("load_balancing", remote=True, offers=("NVIDIA GeForce RTX 4090",), disk_gb=40)
        spec = EndpointSpec(**{**spec.__dict__, "env": (*spec.env, ("RUNBOOK_FAULT", "slow_worker"))})
        ep, jobs, health = _serve(prov, spec, payloads)
        pod = prov.get(ep.id)
        assert ep.mode == "load_balancing" and pod.state == "RUNNING"
        assert ep.url == f"{srv.url}/proxy/{ep.id}-8000"  # the pod's proxy URL, not an address of the machine
        _same(jobs, golden)
        assert health["workers"]["idle"] == 1
        srv.api.limits["proxy_timeout_s"] = 0.1  # the slow worker (0.5 s a batch) now outlasts the proxy
        client = prov.job_client(ep.id, ep.url, timeout_s=30, mode=ep.mode)
        cut = client.runsync(payloads[0])
        client.close()
        assert cut["status"] == "FAILED" and cut["error"].startswith("HTTP 524")
        prov.apply(plan := prov.plan_destroy(ep.id, dry_run=False), _ok(plan))
        assert httpx.get(f"{ep.url}/ping", timeout=5).status_code == 502  # nothing behind the proxy any more
    finally:
        prov.close()
        srv.close()
