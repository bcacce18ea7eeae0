"""Idempotent handlers on a real local queue endpoint (front door + worker processes, the store a
real directory): a job whose worker dies after recording its result is redelivered and runs
once; a broken handler runs it twice (counted); a client's resubmission with the same request id
is deduplicated; a wiped worker disk loses no result; a hung worker is timed out and replaced;
payloads above the declared limits fail loudly. Executions are counted from the store, not from
the endpoint's own report."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from runbook_lib.errors import ParamsError, ProviderError, WorkloadError
from runbook_lib.evidence.approvals import Approval
from runbook_lib.measure.timing import INIT_PARTS, JobClient
from runbook_lib.providers.base import EndpointSpec
from runbook_lib.providers.local import LocalProvider
from runbook_lib.providers.local.endpoint import MAX_DELIVERIES, PAYLOAD_LIMITS, FrontDoor
from runbook_lib.storage import open_store
from runbook_lib.workload.records import DRILLS_ENV, RECORDS_ENV, STORE_ENV, JobRecords, unwrap

from .conftest import ROOT

PREFIX = "runs/r1/jobs/target"


def _approve(plan: Any) -> Approval:
    return Approval(plan.fingerprint, "test", "2026-11-30T00:00:00Z", "test")


def _endpoint(tmp_path: Path, make_params: Any, *, fault: str = "none", drills: bool = True,
              execution_timeout_s: float = 30.0) -> tuple[LocalProvider, Any, JobClient, JobRecords]:
    params = make_params(workload={"entry_point": "tests.fixture_workloads:SleepWorkload"},
                         target={"batch_size": 1, "workers": 1, "fault": fault})
    store_url = f"file://{tmp_path / 'store'}"
    env = ((RECORDS_ENV, PREFIX), (STORE_ENV, store_url)) + (((DRILLS_ENV, "1"),) if drills else ())
    prov = LocalProvider(root=tmp_path / "state")
    spec = EndpointSpec(name="e", params_path=str(params), side="target", workers=1, price_usd_per_hour=0.2,
                        labels=(("run_id", "idem"),), execution_timeout_s=execution_timeout_s, env=env)
    plan = prov.plan_endpoint(spec, dry_run=False)
    ep = prov.apply(plan, _approve(plan))
    client = JobClient(ep.url)
    client.wait_ready(timeout_s=60)
    return prov, ep, client, JobRecords(open_store(store_url), PREFIX)


@pytest.fixture
def served(tmp_path: Path, make_params: Any, monkeypatch: pytest.MonkeyPatch, request: Any) -> Iterator[tuple]:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    prov, ep, client, records = _endpoint(tmp_path, make_params, **getattr(request, "param", {}))
    yield prov, ep, client, records
    client.close()
    plan = prov.plan_destroy(ep.id)
    prov.apply(plan, _approve(plan))


def _drill(name: str, payload: Any = 0.01, **extra: Any) -> dict[str, Any]:
    return {"runbook_drill": name, "input": payload, **extra}


def test_a_job_whose_worker_died_after_recording_is_redelivered_and_runs_once(served) -> None:
    _, _, client, records = served
    job = client.runsync(_drill("crash_after_record"), client_timeout_s=60)
    assert job["status"] == "COMPLETED" and job["output"] == [0.02]
    assert job["deliveries"] == 2 and job["replayed"] is True  # the second delivery read the record
    assert records.executions(job["id"]) == 1
    assert records.recorded(job["id"])["output"] == [0.02]
    plain = client.runsync(0.01)  # the replacement worker serves new work normally
    assert plain["status"] == "COMPLETED" and plain["deliveries"] == 1 and not plain["replayed"]
    assert records.executions(plain["id"]) == 1


@pytest.mark.parametrize("served", [{"fault": "duplicate_side_effects"}], indirect=True)
def test_a_broken_handler_runs_a_redelivered_job_twice_and_the_count_shows_it(served) -> None:
    _, _, client, records = served
    job = client.runsync(_drill("crash_after_record"), client_timeout_s=60)
    assert job["status"] == "COMPLETED" and job["deliveries"] == 2 and not job["replayed"]
    assert records.executions(job["id"]) == 2


def test_a_resubmission_with_the_same_request_id_returns_the_recorded_result(served) -> None:
    _, _, client, records = served
    first = client.runsync({"request_id": "req-0001", "input": 0.01})
    again = client.runsync({"request_id": "req-0001", "input": 0.01})
    assert first["id"] != again["id"]
    assert first["output"] == again["output"] == [0.02] and again["replayed"] and not first["replayed"]
    assert records.executions("req-0001") == 1
    [start] = client.health()["cold_starts"]  # the worker's initialisation, split into its parts
    assert all(start[k] >= 0 for k in INIT_PARTS)
    assert abs(sum(start[k] for k in INIT_PARTS) - start["init_s"]) < 1e-6


def _copies(disk: Path) -> list[str]:
    """Result files on a worker's disk; a directory vanishing mid-listing is a wipe in progress."""
    try:
        return sorted(p.name for p in disk.glob("worker-*/*.json"))
    except FileNotFoundError:
        return ["(being wiped)"]


def test_a_wiped_worker_disk_loses_no_result(served, tmp_path: Path) -> None:
    _, ep, client, records = served
    disk = tmp_path / "state" / "pods" / ep.id / "container"  # the endpoint's container disk
    before = client.runsync(0.01)
    assert _copies(disk) == [f"{before['id']}.json"]  # the worker's copy
    job = client.runsync(_drill("wipe_disk", 0.01))
    assert job["status"] == "COMPLETED"
    deadline = time.monotonic() + 10
    seen = _copies(disk)  # judged on the listing the loop ended on, not on a second one racing the restart
    while seen and time.monotonic() < deadline:
        time.sleep(0.05)
        seen = _copies(disk)
    assert not seen  # the worker's disk is wiped...
    for done in (before, job):  # ...and every result is still in the store, as it was returned
        assert records.recorded(done["id"])["output"] == done["output"] == [0.02]


def test_a_hung_worker_is_timed_out_and_another_serves(served, tmp_path: Path) -> None:
    _, ep, client, records = served
    short = JobClient(ep.url, execution_timeout_s=1.0)
    try:
        hung = short.runsync(_drill("hang"), client_timeout_s=30)
    finally:
        short.close()
    assert hung["status"] == "TIMED_OUT" and "execution timeout 1.0 s" in hung["error"]
    after = client.runsync(0.01, client_timeout_s=60)
    assert after["status"] == "COMPLETED" and after["worker"] != hung["worker"]
    assert records.executions(hung["id"]) == 0


@pytest.mark.parametrize("served", [{"drills": False}], indirect=True)
def test_an_endpoint_not_created_for_drills_refuses_drill_requests(served) -> None:
    _, _, client, records = served
    job = client.runsync(_drill("crash_after_record"))
    assert job["status"] == "FAILED" and "not created for drills" in job["error"]


def test_a_request_above_the_run_limit_is_refused_before_it_is_queued(served) -> None:
    _, ep, client, _ = served
    too_big = "x" * (PAYLOAD_LIMITS["queue"]["run_request_bytes"] + 1)
    with pytest.raises(ProviderError, match="413.*exceeds /run's limit of 10000000 bytes"):
        client.run(too_big)
    assert client.health()["jobs"]["inQueue"] == 0
    assert httpx.get(f"{ep.url}/health").status_code == 200  # the connection and the door are fine


def test_results_above_the_response_limit_or_empty_are_failed_jobs_not_completed() -> None:
    import sys

    door = FrontDoor(worker_argv=[sys.executable, "-c", "import time; time.sleep(60)"], workers=1,
                     execution_timeout_s=30, ttl_s=60,
                     limits={"run_request_bytes": 100, "runsync_request_bytes": 100, "response_bytes": 50})
    wid = next(iter(door.pool.workers))  # a worker process that never polls: the test takes its jobs for it
    ids = [door.submit(i)["id"] for i in range(3)]
    taken = door.take(wid, 3)
    assert [t["id"] for t in taken] == ids
    door.done(wid, [{"id": ids[0], "output": "y" * 60}, {"id": ids[1], "output": None},
                    {"id": ids[2], "output": [1.0]}])
    states = [door.public(i) for i in ids]
    assert [s["status"] for s in states] == ["FAILED", "FAILED", "COMPLETED"]
    assert "62 bytes exceeds the endpoint's response limit of 50 bytes" in states[0]["error"]
    assert "no output" in states[1]["error"]
    assert door.take("w-gone", 1) == []  # a worker not on the books (stopped, replaced) takes nothing
    for w in door.pool.workers.values():
        w["proc"].kill()
        w["proc"].wait()


def test_a_job_is_delivered_at_most_max_deliveries_times() -> None:
    import sys

    door = FrontDoor(worker_argv=[sys.executable, "-c", "raise SystemExit(3)"], workers=1,
                     execution_timeout_s=30, ttl_s=60)
    jid = door.submit(0.01)["id"]
    for n in range(1, MAX_DELIVERIES + 1):
        wid = next(iter(door.pool.workers))
        assert [t["id"] for t in door.take(wid, 1)] == [jid]
        door.pool.workers[wid]["proc"].wait()  # the worker dies holding the job
        door.sweep()
        assert door.public(jid)["deliveries"] == n
        assert door.public(jid)["status"] == ("IN_QUEUE" if n < MAX_DELIVERIES else "FAILED")
    assert "exited with code 3; delivered 3 times (the limit)" in door.public(jid)["error"]
    for w in door.pool.workers.values():
        w["proc"].wait()


def test_envelopes_are_checked() -> None:
    assert unwrap(0.5) == (0.5, "", "")
    assert unwrap({"input": 1}) == ({"input": 1}, "", "")  # a plain dict payload is left alone
    assert unwrap({"runbook_drill": "hang", "input": 2}) == (2, "hang", "")
    with pytest.raises(WorkloadError, match="unknown drill 'explode'"):
        unwrap({"runbook_drill": "explode", "input": 2})
    with pytest.raises(WorkloadError, match="request_id"):
        unwrap({"request_id": "../../etc", "input": 2})


def test_phase_02_compares_the_largest_payloads_with_each_modes_declared_limits(tmp_path: Path) -> None:
    from runbook_lib.phases.mapping import payload_row

    caps = LocalProvider(root=tmp_path / "state").capabilities()
    ok = payload_row({"request_bytes": 500, "output_bytes": 9000}, "queue", caps)
    assert ok.status == "equivalent" and ok.target == "queue: request 10000000 B, response 20000000 B"
    big = payload_row({"request_bytes": 500, "output_bytes": 25_000_000}, "queue", caps)
    assert big.status == "no equivalent" and "an output of 25000000 B exceeds 20000000 B" in big.reason
    lb = payload_row({"request_bytes": 40_000_000, "output_bytes": 10}, "load_balancing", caps)
    assert lb.status == "no equivalent" and "a request of 40000000 B exceeds 30000000 B" in lb.reason


def test_phase_02_maps_endpoint_settings_side_against_side(make_params: Any) -> None:
    from runbook_lib.params import load_params
    from runbook_lib.phases.mapping import endpoint_settings_row

    same = load_params(make_params())
    assert endpoint_settings_row(same.source, same.source).status == "equivalent"
    mig = load_params(make_params(target={"workers": 3, "active_workers": 0, "idle_timeout_s": 2,
                                          "model_cache": "hf:sentence-transformers/all-MiniLM-L6-v2"}))
    row = endpoint_settings_row(mig.source, mig.target)
    assert row.status == "adapter needed"
    assert row.target == ("workers 0 active of 3 max, idle timeout 2 s, model cache "
                             "hf:sentence-transformers/all-MiniLM-L6-v2, GPU priority any")
    assert row.reason.startswith("active workers, max workers, idle timeout, model cache change")
    with pytest.raises(ParamsError, match="active_workers \\(4\\) exceeds workers \\(3\\)"):
        load_params(make_params(target={"workers": 3, "active_workers": 4}))
