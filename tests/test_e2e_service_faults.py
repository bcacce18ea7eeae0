"""Whole migrations of a service whose target misbehaves (:mod:`tests.faulty_service` as the
image's stand-in on the local provider): each fault is caught by the phase that must catch it,
named with the server's words, the service's URL and the stage, and none reaches GO or waits on
a cell timeout.

- a target answering errors with status 200 from its first request: phase 03's parity, NO-GO;
- a target that sends its headers and then only keep-alive comments: phase 03, NO-GO, each
  stalled request ended at ``measure.request_timeout_s``;
- a target that answers cleanly through phase 03 and then one request in three with a 200 error
  body: phase 04's ``error_rate``, NO-GO, under the fixed and the sequential method;
- a target that starts answering 200 error bodies at the 50 % step of a cutover through HAProxy:
  the step fails on the target's failed answers and the source takes all traffic back under the
  replay, nothing lost, NO-GO (needs Debian's haproxy: fails, not skips, in CI).
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from runbook_lib.errors import EXIT_NO_GO
from runbook_lib.run.runner import run_migration

from .conftest import ROOT
from .faulty_service import ERROR_TEXT
from .runs import UNJUDGED, merged, phase_statuses, receipt, require_haproxy, write_params

pytestmark = pytest.mark.e2e

TIMEOUT_S = 2.0
SAMPLES = 12  # examples/chat-samples.jsonl: phase 03's canary answers each once, then its replacement one


def _params(tmp_path: Path, fault: str, *, after: int = 0, every: int = 1, **over: Any) -> Path:
    """demo-service.yaml with the faulty server standing in for the image, the fault on the
    target, and a small measurement (a few seconds a round): these cases judge failures, not
    latency."""
    service = {"samples": str(ROOT / "examples" / "chat-samples.jsonl"), "env": {},
               "stand_in": {"command": [sys.executable, str(ROOT / "tests" / "faulty_service.py"), "{port}"]},
               "readiness": {"timeout_s": 30}, "ttft_slo_s": None, "tpot_slo_s": None}
    base = {"workload": {"service": service},
            "target": {"service_env": {"FAULT": fault, "FAULT_AFTER": str(after), "FAULT_EVERY": str(every)}},
            "drills": {"run": [], "blocking": []},
            "measure": {"requests_per_round": 24, "warmup_requests": 4, "arrival_rate_per_s": 40,
                        "throughput_requests": 8, "cold_starts": 0, "request_timeout_s": TIMEOUT_S,
                        "exclusive": False},
            "gates": {"min_latency_samples": 20},
            "cutover": {"requests_per_step": 10}}
    params = write_params(tmp_path, "demo-service.yaml", "m.yaml", **merged(base, over))
    text = params.read_text()
    assert "CHAT_MODEL_DIR" not in text.split("stand_in")[1]
    return params


def _run(params: Path) -> Any:
    return run_migration(params, reports_dir=params.parent.parent / "reports", echo=print)


def _phase_seconds(d: Path, phase: str) -> float:
    from datetime import datetime

    rec = json.loads(next(d.glob(f"{phase}_*.json")).read_text())
    return (datetime.fromisoformat(rec["ended"]) - datetime.fromisoformat(rec["started"])).total_seconds()


def _gate(d: Path, name: str) -> dict[str, Any]:
    [g] = [g for g in receipt(d)["gates"] if g["name"] == name]
    return dict(g)


@pytest.mark.parametrize(("fault", "says"), [
    ("error200", ERROR_TEXT),  # an error object in a 200 stream, at once
    ("trickle", f"no whole answer within measure.request_timeout_s ({TIMEOUT_S:g} s): stalled at first token"),
])
def test_a_target_failing_from_its_first_answer_is_no_go_in_phase_03_naming_the_fault(
        tmp_path: Path, fault: str, says: str) -> None:
    res = _run(_params(tmp_path, fault))
    d = res.run_dir
    assert (res.decision, res.exit_code) == ("NO-GO", EXIT_NO_GO)
    parity = _gate(d, "service_parity")
    assert parity["verdict"] == "FAIL" and parity["observed"] == 0.0
    assert says in parity["detail"] and "http://127.0.0.1:" in parity["detail"]  # the fault, the service's URL
    assert phase_statuses(d)["04"] == "skipped" and receipt(d)["resources"]["remaining"] == []
    rec = json.loads((d / "03_prove_parity.json").read_text())
    if fault == "trickle":  # one stalled request, the rest not sent: one deadline, not one per sample
        statuses = [a["status"] for a in rec["data"]["service"]["answers"]]
        assert statuses == ["TIMED_OUT"] + ["NOT_SENT"] * (SAMPLES - 1)
        took = _phase_seconds(d, "03")
        assert took < 60, took  # two deadlines, two launches and a kernel: never run.cell_timeout_s


@pytest.mark.parametrize("method", ["fixed", "sequential"])
def test_a_target_answering_one_request_in_three_with_a_200_error_after_phase_03_is_no_go_on_error_rate(
        tmp_path: Path, method: str) -> None:
    over: dict[str, Any] = {"gates": {"method": method}}
    if method == "sequential":
        over["measure"] = {"min_rounds": 2, "max_rounds": 4}
    params = _params(tmp_path, "error200", after=SAMPLES + 1, every=3, **over)
    if method == "sequential":  # measure.rounds is the fixed method's
        data = yaml.safe_load(params.read_text())
        del data["measure"]["rounds"]
        params.write_text(yaml.safe_dump(data))
    res = _run(params)
    d = res.run_dir
    assert (res.decision, res.exit_code) == ("NO-GO", EXIT_NO_GO)
    assert _gate(d, "service_parity")["verdict"] == "PASS"  # phase 03 saw clean answers
    err = _gate(d, "error_rate")
    assert err["verdict"] == "FAIL" and err["blocking"]
    assert "ERROR_BODY x" in err["detail"] and ERROR_TEXT in err["detail"] and "at mid-stream" in err["detail"]
    r04 = json.loads((d / "04_compare_production.json").read_text())["data"]
    assert r04["method"] == method
    # a failed request is never a latency sample: the target's p95 comes from completed ones only
    import pandas as pd

    s = pd.read_parquet(d / "04" / "samples.parquet")
    tgt = s[s["side"] == "target"]
    assert (tgt["status"] == "ERROR_BODY").sum() > 0 and tgt.loc[tgt["status"] == "ERROR_BODY", "error"].str.contains(
        "CUDA error").all()
    assert r04["summary"]["target"]["failed"] == int((tgt["status"] != "COMPLETED").sum())


def test_a_target_answering_200_error_bodies_at_the_50_percent_step_rolls_back_under_load_with_nothing_lost(
        tmp_path: Path) -> None:
    # Phases 01-04 unjudged (this case is about phase 05); the target's stand-in reads its fault
    # from a file, written the moment phase 05's route reaches 50 %: from then on every answer it
    # gives is a 200 stream carrying an error object.
    from runbook_lib.cli import main as cli_main
    from runbook_lib.layout import ROUTE

    require_haproxy()
    fault = tmp_path / "fault"
    over = merged(UNJUDGED, {"measure": {"requests_per_round": 24}},
                  {"target": {"service_env": {"FAULT_FILE": str(fault)}},
                   "cutover": {"requests_per_step": 80, "router": {"kind": "haproxy"}}})
    params = _params(tmp_path, "", **over)
    run_dir = tmp_path / "reports" / "routed-error-bodies"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    args = [str(params), str(run_dir), "--notebooks", str(ROOT / "notebooks")]
    for pid in ("01", "02", "03", "04"):
        assert cli_main(["phase", pid, *args]) == 0, pid
    stop = threading.Event()

    def at_half() -> None:
        while not stop.wait(0.02):
            route = run_dir / ROUTE
            if route.exists() and json.loads(route.read_text()).get("target_percent") == 50:
                fault.write_text("error200")
                return

    watcher = threading.Thread(target=at_half, daemon=True)
    watcher.start()
    try:
        assert cli_main(["phase", "05", *args]) == 0
    finally:
        stop.set()
        watcher.join()
    assert fault.read_text() == "error200"
    cut = json.loads((run_dir / "05_cutover.json").read_text())["data"]["cutover"]
    router, steps = cut["router"], cut["steps"]
    windows = {w["window"]: w for w in router["windows"]}
    assert [s["passed"] for s in steps] == [True, False]  # 10 % clean, 50 % fails
    step2 = windows["step 2"]
    assert step2["target_failures"] > 0 and step2["lost"] == 0, step2
    [failed_p] = [p for p in step2["problems"] if p.startswith(f"the target failed {step2['target_failures']}")]
    assert f"ERROR_BODY x{step2['target_failures']}" in failed_p and ERROR_TEXT in failed_p, failed_p
    back = windows["rollback"]
    assert back["passed"] and back["lost"] == 0 and back["source_serves_all_after_s"] <= back["rollback_within_s"]
    assert router["lost"] == 0 and cut["route"]["target_percent"] == 0
    assert cut["route"]["history"][-1]["reason"].startswith("rollback: step 2")
    import pandas as pd

    rows = pd.read_csv(run_dir / "05" / "routed_samples.csv")
    failed = rows[rows["status"] == "FAILED"]
    assert len(failed) and set(failed["server"]) == {"target"} and set(failed["failure"]) == {"ERROR_BODY"}
    assert failed["error"].str.contains("CUDA error").all()  # the server's own words, per request
    assert (rows["status"] != "LOST").all()
    assert cli_main(["phase", "06", *args]) == 0
    r = receipt(run_dir)
    assert r["decision"] == "NO-GO" and any(x.startswith("cutover_slices FAIL") for x in r["reasons"])
    assert {g["name"]: g["verdict"] for g in r["gates"]}["routed_requests_lost"] == "PASS"
    assert r["resources"]["remaining"] == []
