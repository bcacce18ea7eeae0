"""A live service as the source (``source.provider: live``): a chat server the test starts and
owns (:mod:`tests.faulty_service`, answering cleanly, keeping its own request and signal logs),
which the runbook did not start and must not change, migrated to a target the runbook launches
through all six phases, its traffic cut over through Debian's HAProxy. Afterwards the server is
the same process, never signalled, and its own log shows no more than the declared rate in any
second, the replay through the router and HAProxy's health checks included. (Its bearer token is
tests/test_live_source.py's: HAProxy is refused for a token-guarded live source.)"""

from __future__ import annotations

import bisect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pandas as pd
import pytest
import yaml

from runbook_lib.audit.recompute import recompute_run
from runbook_lib.audit.verify import verify_run
from runbook_lib.errors import EXIT_GO
from runbook_lib.params import dump_yaml
from runbook_lib.providers.local.lifecycle import free_port
from runbook_lib.run.runner import run_migration

from .conftest import ROOT
from .runs import deep_merge, phase_statuses, receipt, require_haproxy

pytestmark = pytest.mark.e2e

RATE = 20.0  # source.max_rate_per_s


def _live_params(tmp_path: Path, url: str) -> Path:
    """demo-service.yaml with the live server as the source (nothing of demo-service's local
    source kept but its price) and the faulty server, answering cleanly, standing in for the
    image on the target; a small measurement at 15/s, under the source's 20/s. Its GO rests on
    timings (the A/A noise floor, the p95 ratio), so phases 04 and 05 hold the host lock
    exclusively (measure.exclusive's default): beside another case's timed phase on CI's two
    cores, two identical source rounds once read a p95 ratio of 1.8."""
    data = yaml.safe_load((ROOT / "params" / "demo-service.yaml").read_text())
    data["source"] = {"name": "source-live", "provider": "live", "release": "chat-server 1.4 (live, the team's)",
                      "price_usd_per_hour": 0.44, "url": url, "max_rate_per_s": RATE,
                      "declared": {"provider": "the team's own cluster", "gpu": "none (CPU)"}}
    service = {"samples": str(ROOT / "examples" / "chat-samples.jsonl"), "env": {},
               "stand_in": {"command": [sys.executable, str(ROOT / "tests" / "faulty_service.py"), "{port}"]},
               "readiness": {"timeout_s": 30}, "ttft_slo_s": None, "tpot_slo_s": None}
    data = deep_merge(data, {"workload": {"service": service},
                             "measure": {"requests_per_round": 48, "warmup_requests": 4, "arrival_rate_per_s": 15,
                                         "throughput_requests": 8, "cold_starts": 0, "request_timeout_s": 2.0},
                             "gates": {"min_latency_samples": 20},
                             # HAProxy's replay at phase 04's 15/s, spaced for 19/s (one check a second
                             # beside it); 80 requests a window judge the shares
                             "cutover": {"requests_per_step": 80, "router": {"kind": "haproxy"}}})
    (tmp_path / "params").mkdir(parents=True)
    p = tmp_path / "params" / "m.yaml"
    p.write_text(dump_yaml(data))
    return p


def _start(port: int, logs: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "REQUEST_LOG": str(logs / "requests.jsonl"), "SIGNAL_LOG": str(logs / "signals.txt")}
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "faulty_service.py"), str(port)], env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("the live server did not start")


def _started_at(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22): a restarted
    process with a reused PID would differ."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def test_a_live_service_is_the_source_of_all_six_phases_untouched_and_never_loaded_past_its_rate(
        tmp_path: Path) -> None:
    require_haproxy()
    logs = tmp_path / "live"
    logs.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start(port, logs)
    born = _started_at(proc.pid)
    (logs / "requests.jsonl").write_text("")  # the test's own readiness probe is not the runbook's
    try:
        res = run_migration(_live_params(tmp_path, url), reports_dir=tmp_path / "reports", echo=print)
        still = proc.poll() is None and _started_at(proc.pid) == born
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    d = res.run_dir
    r = receipt(d)
    assert (res.decision, res.exit_code) == ("GO", EXIT_GO), r["reasons"]
    assert set(phase_statuses(d).values()) == {"completed"}
    # the server: the same process throughout, never signalled by the run (SIGTERM above is the test's)
    assert still
    assert (logs / "signals.txt").read_text().split() == ["SIGTERM"]
    # ... and never asked more than 20 requests in any one second, by its own clock
    ts = sorted(json.loads(line)["t"] for line in (logs / "requests.jsonl").read_text().splitlines())
    most = max(bisect.bisect_left(ts, t + 1.0) - i for i, t in enumerate(ts))
    assert len(ts) > 300 and most <= RATE, (len(ts), most)  # ~150 in phases 01-04, ~200 through HAProxy
    # what phase 01 read of it, observed, beside what params declare
    facts = {f["name"]: f for f in r["service"]["live_source"]["facts"]}
    assert facts["models served"] == {"name": "models served", "value": "faulty-chat", "basis": "observed",
                                      "how": "GET /v1/models (OpenAI API: list models)"}
    assert facts["server header"]["basis"] == "observed" and facts["server header"]["value"].startswith("BaseHTTP")
    assert facts["provider"]["value"] == "the team's own cluster" and facts["provider"]["basis"] == "declared"
    assert facts["digest"]["value"] == "not declared"
    by_phase = {(g["name"], g["phase"]): g for g in r["gates"]}
    for name, phase in (("launched_as_declared", "01"), ("no_runbook_inside", "01"), ("throughput_ratio", "04"),
                        ("cold_start_ratio", "04")):
        got = by_phase[name, phase]
        assert got["verdict"] == "NOT_APPLICABLE" and not got["blocking"], got
    assert by_phase["launched_as_declared", "03"]["verdict"] == "PASS"  # the target's canary was launched and read
    gates = {g["name"]: g for g in r["gates"]}
    assert "target-only" in gates["throughput_ratio"]["detail"]
    for name in ("source_answers", "service_parity", "recovery", "latency_p95_ratio", "noise_floor", "error_rate",
                 "baseline_health", "cutover_slices", "routed_requests_lost", "teardown_verified"):
        assert gates[name]["verdict"] == "PASS", gates[name]
    # nothing was created on the source; it is named as not ours
    res_ = r["resources"]
    assert res_["created"] and {c["side"] for c in res_["created"]} == {"target"} and res_["remaining"] == []
    assert len(res_["not_ours"]) == 1 and url in res_["not_ours"][0]
    assert f"not ours, untouched: source {url}" in gates["teardown_verified"]["detail"]
    # phase 04 measured it as it runs, with no saturation burst
    r04 = json.loads((d / "04_compare_production.json").read_text())["data"]
    assert r04["endpoints"]["source"] == "live" and r04["endpoint_urls"]["source"] == url
    thr = pd.read_csv(d / "04" / "throughput.csv")
    assert set(thr["side"]) == {"target"}
    samples = pd.read_parquet(d / "04" / "samples.parquet")
    assert (samples["side"] == "source").sum() >= 96 and set(samples["status"]) == {"COMPLETED"}
    # phase 05: the team's traffic through HAProxy, none lost, the live source taking its share
    router = json.loads((d / "05_cutover.json").read_text())["data"]["cutover"]["router"]
    assert router["kind"] == "haproxy" and router["lost"] == 0 and all(w["passed"] for w in router["windows"])
    rows = pd.read_csv(d / "05" / "routed_samples.csv")
    assert set(rows["server"]) == {"source", "target"} and set(rows["status"]) == {"COMPLETED"}
    assert {x["status"] for x in verify_run(d)} == {"intact"}
    assert [x for x in recompute_run(d) if not x.same] == []
