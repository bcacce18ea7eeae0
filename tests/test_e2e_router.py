"""Phase 05 through a real load balancer: `params/demo-haproxy.yaml` cuts over through Debian's
HAProxy on loopback while a background replay sends traffic through it the whole phase; a
target that dies before the cutover makes the first step fail and the source take everything
back under load, nothing lost. These cases need Debian's haproxy (`make haproxy` as root in CI,
where they fail rather than skip without it)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from runbook_lib.cli import main as cli_main
from runbook_lib.errors import EXIT_GO
from runbook_lib.run.runner import run_migration

from .runs import FAST_INFERENCE, UNJUDGED, merged, receipt, require_haproxy, target_dies_before_phase_05

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
def _haproxy() -> None:
    require_haproxy()


def _cut(run_dir: Path) -> dict:
    return dict(json.loads((run_dir / "05_cutover.json").read_text())["data"]["cutover"])


# Phase 04 measured FAST_INFERENCE's sizes with only the drills a load-balancing target takes,
# after 30 warm-up requests a side (a load-balancing worker's first round was seen slower than its
# last: an A/A interval of [0.39, 0.76] against 1 +/- 0.5, a HOLD in CI), and 120 requests a round,
# not 45: a p95 of 45 samples is their third-largest, and a CI run beside the fleet case held on
# an A/A interval of [1.08, 1.52] (4 s more a round at 30/s). Phase 05: 250 requests a window at
# 30/s, the steady state and three steps, 1,000 through HAProxy.
ROUTED = merged(FAST_INFERENCE, {"cutover": {"requests_per_step": 250},
                                 "measure": {"warmup_requests": 30, "requests_per_round": 120},
                                 "drills": {"run": ["preferred_offer_removed", "spend_limit"],
                                            "blocking": ["preferred_offer_removed", "spend_limit"]}})


@pytest.mark.measure
@pytest.mark.fleet_worker  # its windows' p95 at 30 requests/s: never beside the fleet case
def test_the_haproxy_demo_cuts_over_real_traffic_step_by_step_and_loses_nothing(make_params) -> None:
    params = make_params("demo-haproxy.yaml", name="demo-haproxy.yaml", **ROUTED)
    res = run_migration(params, reports_dir=params.parent.parent / "reports", echo=print)
    assert (res.decision, res.exit_code) == ("GO", EXIT_GO), res.reasons
    cut = _cut(res.run_dir)
    router = cut["router"]
    assert router["kind"] == "haproxy" and router["url"].startswith("http://127.0.0.1:")
    assert cut["routing"].startswith("haproxy router")
    assert sum(w["sent"] for w in router["windows"]) == router["requests"]  # every request in one window
    assert router["requests"] >= 1000 and router["lost"] == 0 and router["answered"] == router["requests"]
    windows = {w["window"]: w for w in router["windows"]}
    assert list(windows) == ["steady state before the first step", "step 1", "step 2", "step 3"]
    for pct, name in ((10, "step 1"), (50, "step 2"), (100, "step 3")):
        w = windows[name]  # the target's share, from the replay and from HAProxy's counters
        assert w["passed"] and w["weights_read"] == {"source": 100 - pct, "target": pct}, w
        assert abs(w["router_share_replay"] - pct / 100) <= 0.05 + 4 / w["answered"]
        assert abs(w["router_share_replay"] - w["router_share_counters"]) <= 0.05 + 4 / w["answered"]
        assert w["p99_s"] is not None and w["p99_before_s"] is not None
    assert windows["steady state before the first step"]["to_target"] == 0
    samples = pd.read_csv(res.run_dir / "05" / "routed_samples.csv")
    assert len(samples) == router["requests"] and set(samples["status"]) == {"COMPLETED"}
    assert set(samples["server"]) == {"source", "target"}
    gates = {g["name"]: g for g in receipt(res.run_dir)["gates"]}
    assert gates["routed_requests_lost"]["verdict"] == "PASS" and gates["routed_requests_lost"]["blocking"]
    assert cut["route"]["target_percent"] == 100
    assert cli_main(["verify", str(res.run_dir)]) == 0


def test_a_target_gone_before_the_cutover_fails_the_first_step_and_the_source_takes_all_under_load(
        make_params, tmp_path: Path) -> None:
    # Phases 01-04 as `runbook phase` runs them (04 unjudged: this case is about phase 05); then
    # the target's worker is stopped (an eviction): HAProxy's health check marks it down, the
    # first step finds no share on the target, and the rollback runs under the replay. Its timed
    # phases hold the host alone (phase 04's unjudged measurement is a few seconds): a window whose
    # replay fell behind its schedule is no evidence of what the router did, and beside another
    # case's canary the rollback window's replay fell 1.5 s behind at 30 requests/s (2026-12-07).
    params = make_params("demo-haproxy.yaml", **merged(UNJUDGED, {"cutover": {"requests_per_step": 90},
                                                                 "measure": {"exclusive": True}}))
    run_dir = tmp_path / "reports" / "routed-drill"
    args = target_dies_before_phase_05(params, run_dir, tmp_path)
    assert cli_main(["phase", "05", *args]) == 0
    cut = _cut(run_dir)
    steps, router = cut["steps"], cut["router"]
    windows = {w["window"]: w for w in router["windows"]}
    assert len(steps) == 1 and not steps[0]["passed"] and windows["step 1"]["lost"] == 0
    assert any("DOWN" in p or "is not its weight" in p for p in windows["step 1"]["problems"]), windows["step 1"]
    back = windows["rollback"]
    assert back["passed"] and back["lost"] == 0 and back["to_target"] == 0
    assert back["source_serves_all_after_s"] <= back["rollback_within_s"] == 5.0
    assert router["lost"] == 0 and cut["route"]["target_percent"] == 0
    assert cut["route"]["history"][-1]["reason"].startswith("rollback: step 1")
    assert cli_main(["phase", "06", *args]) == 0
    r = receipt(run_dir)
    assert r["decision"] == "NO-GO" and any(x.startswith("cutover_slices FAIL") for x in r["reasons"])
    assert {g["name"]: g["verdict"] for g in r["gates"]}["routed_requests_lost"] == "PASS"
