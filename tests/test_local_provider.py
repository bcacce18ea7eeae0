"""The local provider: pods and endpoints are real processes; destroy is idempotent."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from runbook_lib.errors import ApprovalRequired, NotFound, ProviderError
from runbook_lib.evidence.approvals import Approval, require
from runbook_lib.measure.timing import JobClient, served_status
from runbook_lib.params import load_params
from runbook_lib.providers import create_provider
from runbook_lib.providers.base import EndpointSpec, PodSpec, plan_stop
from runbook_lib.providers.local import LocalProvider
from runbook_lib.providers.offers import filter_offers

from .conftest import ROOT

LABELS = (("run_id", "t1"),)


def _approve(plan, tmp_path: Path) -> Approval:
    return require(plan, run_dir=tmp_path / "run", preapproved_local=True)


def _pod(prov: LocalProvider, tmp_path: Path, code: str, **kw) -> object:
    spec = PodSpec(name="p", command=(sys.executable, "-c", code), device="cpu", price_usd_per_hour=0.5,
                   labels=LABELS, **kw)
    plan = prov.plan_launch(spec)
    return prov.apply(plan, _approve(plan, tmp_path))


def test_registry_names_valid_providers() -> None:
    with pytest.raises(Exception, match=r"unknown provider 'nope'; known providers: \['live', 'local', 'runpod', 'vast'\]"):
        create_provider("nope")


def test_apply_needs_matching_approval(tmp_path: Path) -> None:
    prov = LocalProvider(root=tmp_path / "state")
    plan = prov.plan_launch(PodSpec(name="p", command=("true",), device="cpu", price_usd_per_hour=1, labels=LABELS))
    with pytest.raises(ApprovalRequired, match="has no approval record"):
        require(plan, run_dir=tmp_path / "run", preapproved_local=False)
    other = prov.plan_launch(PodSpec(name="q", command=("true",), device="cpu", price_usd_per_hour=1, labels=LABELS))
    with pytest.raises(ApprovalRequired, match="is not approved"):
        prov.apply(plan, _approve(other, tmp_path))
    assert prov.list(labels={"run_id": "t1"}) == []


def test_pod_runs_exits_and_destroy_wipes_disks(tmp_path: Path) -> None:
    prov = LocalProvider(root=tmp_path / "state")
    code = ("import os, pathlib; pathlib.Path('c.txt').write_text('x');"
            "pathlib.Path(os.environ['LOCAL_POD_VOLUME'], 'v.txt').write_text('y');"
            "print('SECRET_SEEN', os.environ.get('TEST_SECRET', '')[::-1] == 'eulav-2retnuh'); raise SystemExit(3)")
    (tmp_path / "secret").write_text("hunter2-value\n")
    pod = _pod(prov, tmp_path, code, secret_refs=(("TEST_SECRET", f"file:{tmp_path / 'secret'}"),))
    done = prov.wait_exit(pod.id, timeout_s=60)
    assert done.state == "EXITED" and done.exit_code == 3
    assert (Path(done.container_dir) / "c.txt").exists() and (Path(done.volume_dir) / "v.txt").exists()
    assert "SECRET_SEEN True" in prov.log_tail(pod.id)
    assert "hunter2-value" not in (tmp_path / "state" / "pods" / pod.id / "pod.json").read_text()
    prov.apply(prov.plan_destroy(pod.id), _approve(prov.plan_destroy(pod.id), tmp_path))
    gone = prov.get(pod.id)
    assert gone.state == "DESTROYED"
    assert not Path(done.container_dir).exists() and not Path(done.volume_dir).exists()
    prov.apply(prov.plan_destroy(pod.id), _approve(prov.plan_destroy(pod.id), tmp_path))  # idempotent
    prov.apply(prov.plan_destroy("pod-never"), _approve(prov.plan_destroy("pod-never"), tmp_path))
    with pytest.raises(NotFound):
        prov.get("pod-never")


def test_stop_keeps_volume_and_kills_process(tmp_path: Path) -> None:
    prov = LocalProvider(root=tmp_path / "state")
    code = ("import os, pathlib, time; pathlib.Path(os.environ['LOCAL_POD_VOLUME'], 'v').write_text('y');"
            "pathlib.Path('c').write_text('x'); time.sleep(600)")
    pod = _pod(prov, tmp_path, code)
    deadline = time.time() + 30
    while not (Path(pod.volume_dir) / "v").exists() and time.time() < deadline:
        time.sleep(0.05)
    pid = json.loads((tmp_path / "state" / "pods" / pod.id / "pod.json").read_text())["pid"]
    prov.apply(plan_stop(prov, pod.id, dry_run=False), _approve(plan_stop(prov, pod.id, dry_run=False), tmp_path))
    st = prov.get(pod.id)
    assert st.state == "STOPPED"
    assert (Path(st.volume_dir) / "v").exists() and not (Path(st.container_dir) / "c").exists()
    import psutil
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert [p.id for p in prov.list(labels={"run_id": "t1"})] == [pod.id]


@pytest.fixture
def endpoint(request, tmp_path: Path, make_params, monkeypatch):
    """A local endpoint serving tests.fixture_workloads.SleepWorkload with a 1.5 s execution
    timeout and a 3 s TTL (or the TTL given by indirect parametrisation)."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    params = make_params(workload={"entry_point": "tests.fixture_workloads:SleepWorkload"},
                         target={"batch_size": 1, "workers": 1})
    prov = LocalProvider(root=tmp_path / "state")
    spec = EndpointSpec(name="e", params_path=str(params), side="target", workers=1, price_usd_per_hour=0.2,
                        labels=LABELS, execution_timeout_s=1.5, ttl_s=getattr(request, "param", 3.0))
    plan = prov.plan_endpoint(spec, dry_run=False)
    ep = prov.apply(plan, _approve(plan, tmp_path))
    client = JobClient(ep.url)
    client.wait_ready(timeout_s=60)
    yield prov, ep, client
    client.close()
    prov.apply(prov.plan_destroy(ep.id), _approve(prov.plan_destroy(ep.id), tmp_path))
    assert prov.get(ep.id).state == "DESTROYED"


@pytest.mark.parametrize("endpoint", [600.0], indirect=True)
def test_endpoint_survives_a_burst_of_new_connections(endpoint) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from runbook_lib.measure.timing import run_saturation

    prov, ep, _ = endpoint
    fresh = JobClient(ep.url)  # no pooled connections yet: every request opens one
    try:
        res = run_saturation(fresh, [0.0] * 96, max_in_flight=96)
    finally:
        fresh.close()
    assert res["completed"] == 96 and res["failed"] == 0
    assert ThreadPoolExecutor  # the burst above is 96 concurrent clients


def test_endpoint_job_states(endpoint) -> None:
    prov, ep, client = endpoint
    done = client.runsync(0.01)
    assert done["status"] == "COMPLETED" and done["output"] == [0.02]
    assert done["queue_s"] >= 0 and done["execution_s"] > 0
    assert client.runsync("boom")["status"] == "FAILED"
    timed = client.runsync(5.0)
    assert timed["status"] == "TIMED_OUT" and "execution timeout" in timed["error"]
    client.wait_ready(timeout_s=60)  # the timed-out worker was replaced
    slow = client.run(1.0)
    queued = client.run(0.1)
    assert client.cancel(queued["id"])["status"] == "CANCELLED"
    while client.status(slow["id"])["status"] not in ("COMPLETED", "FAILED"):
        time.sleep(0.05)
    time.sleep(3.5)  # past the TTL
    assert client.status(slow["id"])["status"] == "EXPIRED"
    h = client.health()
    assert len(h["cold_starts"]) >= 2 and h["workers"]["idle"] + h["workers"]["running"] >= 1


@pytest.mark.parametrize("endpoint", [30.0], indirect=True)  # a TTL the test cannot outlive
def test_endpoint_retries_a_failed_job_under_its_id_and_purges_the_queue(endpoint) -> None:
    prov, ep, client = endpoint
    client.wait_ready(timeout_s=60)
    failed = client.runsync("boom")
    assert failed["status"] == "FAILED"
    again = client.retry(failed["id"])  # requeued under the same id; the payload still raises
    assert (again["id"], again["status"], again["retries"]) == (failed["id"], "IN_QUEUE", 1)
    while client.status(failed["id"])["status"] in ("IN_QUEUE", "IN_PROGRESS"):
        time.sleep(0.05)
    assert client.status(failed["id"])["status"] == "FAILED"
    done = client.runsync(0.01)
    assert client.retry(done["id"])["status"] == "COMPLETED"  # only FAILED or TIMED_OUT jobs are requeued
    busy = client.run(1.0)  # holds the only worker while two more wait in the queue
    waiting = [client.run(0.01), client.run(0.01)]
    while client.status(busy["id"])["status"] == "IN_QUEUE":
        time.sleep(0.02)
    assert client.purge_queue() == {"removed": 2, "status": "completed"}
    assert [client.status(j["id"])["status"] for j in waiting] == ["CANCELLED", "CANCELLED"]
    assert client.runsync(0.01)["status"] == "COMPLETED" and client.status(busy["id"])["status"] == "COMPLETED"


def test_a_completed_job_without_output_is_counted_as_a_failure() -> None:
    assert served_status({"status": "COMPLETED", "output": [1.0]}) == "COMPLETED"
    assert served_status({"status": "COMPLETED"}) == "NO_OUTPUT"
    assert served_status({"status": "COMPLETED", "output": None}) == "NO_OUTPUT"
    assert served_status({"status": "FAILED"}) == "FAILED"


def test_local_has_no_offer_marketplace_and_says_so(tmp_path: Path) -> None:
    from runbook_lib.errors import ProviderError
    from runbook_lib.params import load_params

    prov = LocalProvider(root=tmp_path / "state")
    with pytest.raises(ProviderError, match="local has no offer marketplace"):
        prov.search_offers(load_params(ROOT / "params" / "runpod-to-vast.yaml").target.offer)


@pytest.mark.parametrize("endpoint", [30.0], indirect=True)  # the endpoint's own TTL outlives the test
def test_three_clocks_each_end_a_job_their_own_way(endpoint) -> None:
    prov, ep, client = endpoint
    # 1. execution timeout (the endpoint's, 1.5 s): the handler runs too long
    timed = client.runsync(5.0)
    assert timed["status"] == "TIMED_OUT" and "execution timeout 1.5 s" in timed["error"]
    client.wait_ready(timeout_s=60)
    # 2. job TTL (this job's policy.ttl, 1 s): it waits behind a 2 s job and is forgotten unrun
    short_lived = JobClient(ep.url, ttl_s=1.0)
    busy = client.run(1.2)
    while client.status(busy["id"])["status"] == "IN_QUEUE":
        time.sleep(0.02)
    waiting = short_lived.run(0.01)
    time.sleep(1.6)
    assert short_lived.status(waiting["id"])["status"] == "EXPIRED"  # 404 on /status
    short_lived.close()
    # 3. client timeout (0.5 s): the caller gives up, cancels the job and keeps its id
    held = client.run(1.2)
    queued = client.run(0.01)
    gave_up = client.wait(queued, client_timeout_s=0.5)
    assert gave_up["status"] == "CLIENT_TIMEOUT" and gave_up["id"] == queued["id"] and gave_up["cancelled"]
    assert client.status(queued["id"])["status"] == "CANCELLED"  # not left to run unobserved
    assert client.wait(held, client_timeout_s=30)["status"] == "COMPLETED"  # a patient caller collects it


def test_a_local_target_offers_its_declared_machines_and_can_withdraw_one(tmp_path: Path) -> None:
    tgt = load_params(ROOT / "params" / "demo.yaml").target
    prov = create_provider("local", root=tmp_path / "state", profile=tgt)
    ranked, table = filter_offers(prov.search_offers(tgt.offer, ports=1), tgt.offer)
    # demo.yaml: local-1gb (0.20 USD/h) has 1 GiB, below ram_gib_min 2; the rest cheapest first
    assert [o.offer_id for o in ranked] == ["local-1cpu", "local-2cpu"]
    assert next(r for r in table if r["offer_id"] == "local-1gb")["reasons"] == "RAM GiB 1 below 2"
    prov.withdraw_offer("local-1cpu")
    assert [o.offer_id for o in filter_offers(prov.search_offers(tgt.offer), tgt.offer)[0]] == ["local-2cpu"]
    with pytest.raises(ProviderError, match=r"cannot withdraw offer 'gone'.*\['local-1cpu', 'local-2cpu', 'local-1gb'\]"):
        prov.withdraw_offer("gone")
    bare = create_provider("local", root=tmp_path / "state", profile=load_params(ROOT / "params" / "demo.yaml").source)
    with pytest.raises(ProviderError, match="no offer marketplace"):
        bare.search_offers(tgt.offer)  # the source declares no machines: it is this host
