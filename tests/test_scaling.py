"""Endpoint scaling as Runpod's settings define it, on a real local queue endpoint: ``active``
workers kept running, more started while jobs wait (up to the maximum), an idle worker beyond the
active ones stopped after the idle timeout; at zero, the next job pays a cold start, reported as
its ``init_s``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.evidence.approvals import Approval
from runbook_lib.measure.timing import JobClient
from runbook_lib.phases.compare import wait_for_zero
from runbook_lib.providers.base import EndpointSpec
from runbook_lib.providers.local import LocalProvider

from .conftest import ROOT


def _approve(plan: Any) -> Approval:
    return Approval(plan.fingerprint, "test", "2026-11-30T00:00:00Z", "test")


def test_an_endpoint_with_no_active_worker_scales_from_zero_and_back(tmp_path: Path, make_params: Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    params = make_params(workload={"entry_point": "tests.fixture_workloads:SleepWorkload"},
                         target={"batch_size": 1, "workers": 2})
    prov = LocalProvider(root=tmp_path / "state")
    spec = EndpointSpec(name="e", params_path=str(params), side="target", workers=2, price_usd_per_hour=0.2,
                        labels=(("run_id", "scale"),), active_workers=0, idle_timeout_s=0.5)
    plan = prov.plan_endpoint(spec, dry_run=False)
    ep = prov.apply(plan, _approve(plan))
    client = JobClient(ep.url)
    try:
        assert client.health()["workers"] == {"idle": 0, "running": 0, "initializing": 0}  # none kept running
        cold = client.runsync(0.01, client_timeout_s=60)
        assert cold["status"] == "COMPLETED" and cold["init_s"] > 0.05  # it waited for a worker to start
        warm = client.runsync(0.01)
        assert warm["init_s"] == 0.0 and warm["worker"] == cold["worker"]  # the same worker, still warm
        wait_for_zero(lambda: client.health()["workers"], timeout_s=30)  # stopped after 0.5 s idle
        again = client.runsync(0.01, client_timeout_s=60)
        assert again["init_s"] > 0.05 and again["worker"] != cold["worker"]  # a new cold start
        both = [client.run(0.5), client.run(0.5)]  # two waiting jobs: a second worker is started for them
        time.sleep(0.1)
        assert sum(client.health()["workers"].values()) == 2
        assert all(client.wait(j, client_timeout_s=60)["status"] == "COMPLETED" for j in both)
        starts = client.health()["cold_starts"]  # one per worker that became ready, each split into parts
        assert len(starts) >= 2 and all(s_["init_s"] > 0 and "weight_load_s" in s_ for s_ in starts)
        assert all(s_["gc_frozen_objects"] > 1000 for s_ in starts)  # the loaded worker's heap, out of the collector's way
        first = next(s_ for s_ in starts if s_["worker"] == cold["worker"])  # the worker started for `cold`
        assert first["init_s"] <= cold["init_s"] + 0.05  # its start-up fits in the wait the job saw
    finally:
        client.close()
        plan = prov.plan_destroy(ep.id)
        prov.apply(plan, _approve(plan))
