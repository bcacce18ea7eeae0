"""Fault drills: `runbook rehearse --faults FILE` runs the inference migration against simulators
that misbehave on cue, and each drill ends in its documented decision with a receipt that says
what happened. Slow (a minute or two each on 2 cores): `make test-e2e`. Phase 04's own drills are
off here, except in the money-safety drill, which is also `make rehearse`'s inference migration
and checks the drills a load-balancing target can take.

A container that exits at start with an OCI runtime error is destroyed and the next offer tried:
the provider-level case tests/test_simulator.py::test_scripted_faults_on_the_wire_end_in_the_documented_outcome
proves it on the wire (``exited_oci_error``), and the capacity loop that records it in phase 03
is the one the outbid and never-ready drills here go through."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import pytest
import yaml

from runbook_lib.cli import main as cli_main
from runbook_lib.errors import EXIT_GO, EXIT_HOLD, EXIT_NO_GO
from runbook_lib.params import dump_yaml
from runbook_lib.run.rehearse import start, write_copy
from runbook_lib.run.runner import run_migration

from .conftest import ROOT
from .runs import BESIDE_OTHER_WORK, deep_merge, merged, phase_statuses

pytestmark = pytest.mark.e2e


# A drill whose decision rests on something other than phase 04's timings (a crash, an expired
# job): the least measurement the params allow (a rehearsal never raises a size, rehearse.SIZES),
# no extra rounds, and its timed phases keep no other run waiting (measure.exclusive: false).
UNTIMED = {"requests_per_round": 10, "warmup_requests": 2, "throughput_requests": 8, "max_extra_rounds": 0,
           "exclusive": False}

# A rehearsed queue endpoint beside other work: its simulated workers completed 11.5 requests/s
# there (20 alone), so the rehearsal's 10/s kept it near saturation, where two source rounds'
# p95 differed 5.6-fold (an A/A floor of [4.99, 6.41], 2026-12-07). At 5/s it runs at under half
# its capacity; 30 requests a round keep each round as short (two rounds a side: 60 samples, above
# the rehearsal's 40).
LIGHT_LOAD = {"measure": {"arrival_rate_per_s": 5, "requests_per_round": 30}}


def _drill_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A project in ``tmp_path`` with params/runpod-to-vast.yaml as ``edit`` changes it (its
    mapping, in place), no provider or store key in the environment, and ``tmp_path`` the working
    directory. Returns the params file."""
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "notebooks").symlink_to(ROOT / "notebooks")
    (tmp_path / "params").mkdir()
    data = yaml.safe_load((ROOT / "params" / "runpod-to-vast.yaml").read_text())
    edit(data)
    params = tmp_path / "params" / "runpod-to-vast.yaml"
    params.write_text(dump_yaml(data))
    for var in ("RUNPOD_API_KEY", "VAST_API_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    return params


def _drill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
           faults: dict[str, Any], *, target_offer: dict[str, Any] | None = None,
           over: dict[str, Any] | None = None, keep_drills: bool = False) -> tuple[int, Path, str]:
    """Rehearse params/runpod-to-vast.yaml with ``faults`` scripted, ``target_offer`` merged into
    the target's offer and ``over`` (sections of params) merged into the file; its drills off
    unless ``keep_drills``. Returns the exit code, the run directory and the printed output."""
    def edit(data: dict[str, Any]) -> None:
        data["target"]["offer"].update(target_offer or {})
        if not keep_drills:
            data["drills"] = {"run": [], "blocking": []}
        data.update(deep_merge(data, over or {}))

    params = _drill_project(tmp_path, monkeypatch, edit)
    (tmp_path / "faults.json").write_text(json.dumps(faults))
    code = cli_main(["rehearse", str(params), "--faults", str(tmp_path / "faults.json")])
    out = capsys.readouterr().out
    [run_dir] = [d for d in (tmp_path / "reports").iterdir() if d.is_dir()]
    return code, run_dir, out


def _record(run_dir: Path, name: str) -> dict[str, Any]:
    return dict(json.loads((run_dir / f"{name}.json").read_text())["data"])


@pytest.mark.measure
def test_money_safety_429_outbid_and_502_after_create_end_go_with_one_machine_each(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # One rehearsal, every create that can fail unclearly or be taken away. Runpod: the freeze
    # pod's create is rate limited once (429 with Retry-After), the serverless endpoint's create
    # answers 502 after creating it. Vast.ai, renting interruptible instances: the canary is outbid
    # 2 s after it starts running, before its acceptance job finishes; its replacement's create on
    # the next offer answers 502 after creating the instance. (An offer taken between search and
    # create, 410, is test_simulator.py's and test_providers.py's: it creates nothing.)
    # It is also the inference rehearsal of `make rehearse` (params/runpod-to-vast.yaml, its own
    # drills on): the queue-to-load-balancing mapping and the drills a load-balancing target can
    # run are checked here (_the_inference_rehearsal_mapped_and_drilled); test_e2e_rehearse.py
    # rehearses the training and service migrations. Its subject is the money, not the latency:
    # it measures beside other work (runs.BESIDE_OTHER_WORK), so no other case waits for it, at
    # half the rehearsal's offered load (LIGHT_LOAD).
    faults = {"runpod": {"script": {"create": ["rate"], "endpoint": ["created_then_502"]}},
              "vast": {"script": {"create": ["outbid", "created_then_502"]}, "limits": {"outbid_after_s": 2}}}
    code, run_dir, out = _drill(tmp_path, monkeypatch, capsys, faults, target_offer={"interruptible": True},
                                over=merged(BESIDE_OTHER_WORK, LIGHT_LOAD), keep_drills=True)
    assert code == EXIT_GO, out
    assert "POST /v2/{id}/runsync x" in out  # the job API reached real workers
    _the_inference_rehearsal_mapped_and_drilled(run_dir)
    assert "POST /v2/pods x2" in out  # the 429 was retried after Retry-After: one pod
    assert "POST /v2/serverless x1" in out  # the unclear create was looked up by label, not repeated
    # three creates on Vast.ai: the outbid canary, its replacement's unclear one, the endpoint's
    assert "PUT /api/v0/asks/{id} x3" in out
    rec = _record(run_dir, "03_prove_parity")
    tries = rec["capacity_tries"]
    assert [(t["offer_id"], t["outcome"]) for t in tries] == [
        ("8812345", "ready"), ("8812345", "interrupted"), ("8812501", "adopted"), ("8812501", "ready")], tries
    assert "outbid" in tries[1]["detail"]
    assert "502" in tries[2]["detail"] and "kept it" in tries[2]["detail"]
    assert tries[2]["resource_id"] == tries[3]["resource_id"]  # the adopted machine is the canary: one machine
    [cut] = rec["interruptions"]
    assert cut["destroyed"] and cut["resource_id"] == tries[0]["resource_id"] != tries[3]["resource_id"]
    launches = [p for p in rec["plans"] if p["plan"]["action"] == "launch_pod"]
    # one bid, valid on both ranked offers (the higher minimum bid of the two in the recorded search)
    assert [p["plan"]["spec"]["interruptible_bid_usd_per_hour"] for p in launches] == [0.25, 0.25]
    disk = launches[0]["plan"]["cost_usd_per_hour"] - 0.25  # the plan's cost is the bid placed, plus the disk
    assert 0 < disk < 0.05 and launches[1]["plan"]["cost_usd_per_hour"] == launches[0]["plan"]["cost_usd_per_hour"]
    assert launches[1]["plan"]["spec"]["offers"] == ["8812501"] and launches[1]["method"].startswith("replacement")
    assert rec["result"]["failure_drill"]["resumed_from"]  # the replacement ran the whole acceptance job
    receipt = json.loads((run_dir / "receipt.json").read_text())
    assert len([c for c in receipt["resources"]["created"] if c["role"] == "endpoint-source"]) == 1
    assert receipt["decision"] == "GO" and receipt["rehearsal"] and receipt["resources"]["remaining"] == []
    assert receipt["rehearsal"]["params"]["faults"] == faults  # a drill's GO says which faults it survived


def _the_inference_rehearsal_mapped_and_drilled(run_dir: Path) -> None:
    """A Runpod serverless queue endpoint to a Vast.ai load-balancing worker: phase 02 names the
    adapter, phase 04 reaches the target on Vast's mapped port, and of the drills only the two a
    load-balancing target can take run (scored: the params block none)."""
    rec02 = _record(run_dir, "02_map_target")
    row = next(r for r in rec02["dependency_map"] if r["dependency"] == "endpoint mode")
    assert (row["source"], row["target"], row["status"]) == ("queue", "load_balancing", "adapter needed")
    rec04 = _record(run_dir, "04_compare_production")
    assert rec04["endpoint_modes"] == {"source": "queue", "target": "load_balancing"}
    target_url = rec04["endpoint_urls"]["target"]
    assert target_url.startswith("http://127.0.0.1:") and not target_url.endswith(":8000")  # Vast's mapped port
    drills = {d["drill"]: d for d in rec04["drills"]}
    assert drills["preferred_offer_removed"]["verdict"] == "PASS", drills
    assert "withdrew offer 8812345" in drills["preferred_offer_removed"]["observation"]
    assert drills["spend_limit"]["verdict"] == "PASS", drills
    assert all(drills[n]["verdict"] == "NOT_APPLICABLE" and "load_balancing endpoint has no job API"
               in drills[n]["observation"] for n in ("redeliver", "hung_worker", "output_durability"))
    assert not any(d["blocking"] for d in drills.values())
    assert cli_main(["verify", str(run_dir)]) == 0


def test_a_target_worker_that_crashes_mid_measurement_is_no_go_and_the_target_is_destroyed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # The canary (phase 03) is sound; the instance serving phase 04's target endpoint runs a
    # worker that dies after 7 requests, as a crash-looping image would.
    code, run_dir, out = _drill(tmp_path, monkeypatch, capsys, {"vast": {"script": {"create": ["ok", "worker_crash"]}}},
                                over={"measure": UNTIMED})
    assert code == EXIT_NO_GO, out
    receipt = json.loads((run_dir / "receipt.json").read_text())
    assert receipt["decision"] == "NO-GO"
    failed = {g["name"]: g for g in receipt["gates"] if g["verdict"] == "FAIL"}
    assert {"error_rate", "throughput_ratio"} <= set(failed), receipt["gates"]
    assert failed["error_rate"]["observed"] > 0  # the target's refused requests are samples, not lost machinery
    assert any(r.startswith("error_rate FAIL") for r in receipt["reasons"])
    assert phase_statuses(run_dir)["05"] == "skipped"  # no cutover onto a target that crashes
    target = [c for c in receipt["resources"]["created"] if c["side"] == "target"]
    assert target and all(c["state"] == "DESTROYED" for c in target)  # NO-GO: the target's resources are gone
    assert receipt["resources"]["remaining"] == []


def _with_alternate(data: dict[str, Any]) -> None:
    """params/runpod-to-vast.yaml (``data``, changed in place) for a drill: the least measurement,
    its performance gates scored, and a documented alternate: the same image on a Runpod Community
    Cloud RTX 4090, served from a pod's port (as Vast.ai would have served it)."""
    data["target"]["offer"].update({"ready_timeout_s": 5, "capacity_budget_s": 120})
    data["drills"] = {"run": [], "blocking": []}
    # The HOLD rests on the failing baseline, which no load makes PASS: the gates a measurement
    # beside another run could FAIL (latency, throughput, cost) are scored, so its timed phases
    # keep no other run waiting.
    data["measure"].update(UNTIMED)
    for gate in ("latency_p95_ratio_max", "throughput_ratio_min", "required_saving"):
        del data["gates"][gate]
    alt = {k: v for k, v in data["source"].items() if k != "pod_id"}
    alt.update(name="runpod-community", release="embed-api 2.3.1 on a Runpod Community Cloud RTX 4090",
               endpoint_mode="load_balancing", price_usd_per_hour=0.39,
               # the target's 5 s readiness is its never-ready drill; the alternate's serving pod
               # loads its model within the default wait, however busy the host
               offer={k: v for k, v in data["target"]["offer"].items() if k not in ("query", "ready_timeout_s")}
               | {"cloud": "COMMUNITY"})
    data["alternates"] = [alt]


def test_a_target_never_ready_holds_then_the_alternate_approved_with_a_reason_runs_and_an_expired_source_job_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every Vast.ai instance stays `loading`; readiness waits target.offer.ready_timeout_s per
    # offer, destroys the machine, tries the next ranked offer, and gives up with the tries named.
    # The run does not fail: it proposes the documented alternate and HOLDs until a person
    # approves it with a reason; the next run tries the target first, then proves the alternate
    # and measures it. There the Runpod endpoint forgets a job 2 s after it was submitted: phase
    # 04's first source job waits out the worker's cold start in the queue and expires, a HOLD on
    # a failing baseline.
    params = _drill_project(tmp_path, monkeypatch, _with_alternate)
    reh = start(tmp_path, {"vast": {"script": {"poll": ["loading"] * 40}}, "runpod": {"limits": {"job_ttl_s": 2}}})
    try:
        copy = write_copy(params, reh)
        first = run_migration(copy, reports_dir=tmp_path / "reports")
        assert first.exit_code == EXIT_HOLD and first.decision == "HOLD", first.reasons
        rec = _record(first.run_dir, "03_prove_parity")
        target, alt = rec["candidates"]
        assert target["name"] == "vast-4090" and target["outcome"] == "no_capacity"
        error = target["detail"]
        assert "8812345: failed readiness" in error and "8812501: failed readiness" in error  # both ranked offers
        assert error.count("not ready after 5 s") == 2
        assert alt["name"] == "runpod-community" and alt["outcome"] == "awaiting_approval"
        assert "offer.cloud: SECURE -> COMMUNITY" in alt["differences"] and "provider: vast -> runpod" in alt["differences"]
        assert rec["retry_at"] and first.reasons[0].startswith("target_capacity INCONCLUSIVE")
        assert "runpod-community waits for an approval with a reason" in first.reasons[0]
        waiting = {p["plan"]["action"] for p in rec["plans"] if not p["applied"]}
        assert waiting == {"use_alternate"}  # its canary is pre-approved on the simulator
        receipt = json.loads((first.run_dir / "receipt.json").read_text())
        assert receipt["resources"]["remaining"] == [] and not (first.run_dir / "04_compare_production.json").exists()
        assert reh.sims["vast"].request_summary()["DELETE /api/v0/instances/{id}"] == 2  # each never-ready machine
        assert cli_main(["verify", "--recompute", str(first.run_dir)]) == 0

        reason = "no RTX 4090 on Vast.ai since 09:00; Community Cloud keeps every constraint"
        assert cli_main(["approve", str(first.run_dir), "--by", "platform-oncall", "--reason", reason]) == 0
        second = run_migration(copy, reports_dir=tmp_path / "reports")
        run_dir = second.run_dir
        mapped = {a["name"]: a for a in _record(run_dir, "02_map_target")["alternates"]}
        assert mapped["runpod-community"]["offers"]["ranked"] and not mapped["runpod-community"]["blocked"]
        rec = _record(run_dir, "03_prove_parity")
        assert rec["target"] == "runpod-community" and not rec["hold_migration"]
        assert [c["outcome"] for c in rec["candidates"]] == ["no_capacity", "proved"]
        assert (rec["candidates"][1]["approved_by"], rec["candidates"][1]["reason"]) == ("platform-oncall", reason)
        assert phase_statuses(run_dir)["04"] == "completed", second.reasons
        rec04 = _record(run_dir, "04_compare_production")  # measured on the alternate: a Runpod pod's port
        assert rec04["endpoint_modes"] == {"source": "queue", "target": "load_balancing"}
        assert rec04["endpoint_urls"]["target"].startswith(reh.sims["runpod"].url)

        assert second.exit_code == EXIT_HOLD, second.reasons
        receipt = json.loads((run_dir / "receipt.json").read_text())
        assert receipt["target"]["provider"] == "runpod"
        assert [(c["name"], c["outcome"]) for c in receipt["candidates"]] == \
            [("vast-4090", "no_capacity"), ("runpod-community", "proved")]
        base = {g["name"]: g for g in receipt["gates"]}["baseline_health"]
        assert base["verdict"] == "INCONCLUSIVE" and "EXPIRED" in base["detail"] and "TTL" in base["detail"]
        assert any(r.startswith("baseline_health INCONCLUSIVE") for r in receipt["reasons"])
        cold = pd.read_csv(run_dir / "04" / "cold_starts.csv")
        [source_row] = cold[cold["side"] == "source"].to_dict("records")
        assert source_row["first_status"] == "EXPIRED" and pd.isna(source_row["cold_start_s"])  # not served
        assert phase_statuses(run_dir)["05"] == "skipped"
        assert receipt["resources"]["remaining"] == []
        assert cli_main(["verify", "--recompute", str(run_dir)]) == 0
    finally:
        reh.close()
