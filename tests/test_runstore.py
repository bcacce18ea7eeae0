"""Run directories in object storage (runbook_lib/run/runstore.py) against moto's S3 server on
127.0.0.1: two working directories stand for two workers; the lease keeps two phases of one run
from running at once; a pull yields exactly the last completed push, checked file by file; a local
migration stays on its worker; `runbook verify`, `list` and `report` read a stored run."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import boto3
import pytest

from runbook_lib.cli import main as cli_main
from runbook_lib.errors import EvidenceError, StorageError, UsageError
from runbook_lib.run.runstore import RunLocation, RunStore, local_copy, pinned_here, stored_runs, worked_on
from runbook_lib.storage.s3 import S3Store

from .conftest import ROOT

SEALED = ROOT / "tests" / "fixtures" / "20261202T043936Z-demo-checkpoint-01a1e9"  # a sealed GO run (its README)
BUCKET = "runbook-runs"


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """An empty bucket on moto's server, and boto3's chain pointed at it by name (as a worker's is)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    c = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    if BUCKET in {b["Name"] for b in c.list_buckets()["Buckets"]}:
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
            for o in page.get("Contents", []):
                c.delete_object(Bucket=BUCKET, Key=o["Key"])
    else:
        c.create_bucket(Bucket=BUCKET)
    return s3_endpoint


def _store() -> S3Store:
    return S3Store(BUCKET, "fleet")


def _loc(run_id: str = "m-0001") -> RunLocation:
    return RunLocation.parse(f"s3://{BUCKET}/fleet/{run_id}")


def _worker(tmp_path: Path, name: str) -> Path:
    project = tmp_path / name
    (project / "reports").mkdir(parents=True)
    (project / "pyproject.toml").write_text("")
    return project


def test_run_locations_are_parsed_and_bad_ones_refused() -> None:
    loc = RunLocation.parse("s3://runbook-runs/team/a/20261206T0800Z-demo-ab12")
    assert (loc.bucket, loc.base, loc.run_id) == ("runbook-runs", "team/a", "20261206T0800Z-demo-ab12")
    assert loc.url == "s3://runbook-runs/team/a/20261206T0800Z-demo-ab12"
    assert RunLocation.parse("s3://runbook-runs/r1").base == ""
    for bad in ("s3://runbook-runs", "s3://Bad_Bucket/r1", "s3://runbook-runs/.runstore", "gs://b/r1",
                "s3://runbook-runs/a/r 1"):
        with pytest.raises(UsageError, match="is not s3://<bucket>"):
            RunLocation.parse(bad)


def test_a_second_worker_pulls_exactly_the_last_completed_push(s3: str, tmp_path: Path) -> None:
    a, b = _worker(tmp_path, "a") / "run", _worker(tmp_path, "b") / "run"
    shutil.copytree(SEALED, a)
    rs = RunStore(_loc(), _store())
    first = rs.push(a, after=None, phase="01", status="completed", worker={"host": "a"})
    assert first.generation == 1 and len(first.files) == sum(1 for f in a.rglob("*") if f.is_file())
    # the store holds the run as a directory: the run's files under <run_id>/, the state beside it
    keys = _store().list()
    assert {k for k in keys if k.startswith("m-0001/")} == {f"m-0001/{r}" for r in first.files}
    assert keys.count(".runstore/m-0001/state.json") == 1
    assert rs.pull(b) is not None
    assert {p.relative_to(b).as_posix(): p.read_bytes() for p in b.rglob("*") if p.is_file()} == \
        {p.relative_to(a).as_posix(): p.read_bytes() for p in a.rglob("*") if p.is_file()}
    # worker b changes one file, adds one and removes one, and pushes; a pulls that and nothing else
    (b / "receipt.json").write_text("{}")
    (b / "07_extra.json").write_text("[]")
    (b / "params.yaml").unlink()
    second = rs.push(b, after=RunStore(_loc(), _store()).state(), phase="02", status="held", worker={"host": "b"})
    assert second.generation == 2 and [h["phase"] for h in second.history] == ["01", "02"]
    (a / "stray.txt").write_text("not the run's")
    rs.pull(a)
    assert (a / "receipt.json").read_text() == "{}" and (a / "07_extra.json").exists()
    assert not (a / "params.yaml").exists() and not (a / "stray.txt").exists()
    assert "m-0001/params.yaml" not in _store().list()
    # a push from a state that is no longer the run's (another worker pushed meanwhile) is refused
    with pytest.raises(EvidenceError, match="pushed by another worker since this one pulled it"):
        rs.push(a, after=first, phase="03", status="completed", worker={"host": "a"})


def test_a_pull_refuses_a_file_that_differs_from_the_push(s3: str, tmp_path: Path) -> None:
    a = _worker(tmp_path, "a") / "run"
    shutil.copytree(SEALED, a)
    RunStore(_loc(), _store()).push(a, after=None, phase="06", status="sealed", worker={})
    _store().put_bytes(b'{"decision": "GO"}', "m-0001/receipt.json")  # rewritten in the store by hand
    dest = _worker(tmp_path, "b") / "run"
    with pytest.raises(StorageError, match="receipt.json.*no longer match its last completed push"):
        RunStore(_loc(), _store()).pull(dest)
    assert not (dest / "receipt.json").exists()
    state = json.loads(_store().get_bytes(".runstore/m-0001/state.json"))
    state["files"]["../../outside"] = {"sha256": "0" * 64, "size_bytes": 1}
    _store().client.put_object(Bucket=BUCKET, Key="fleet/.runstore/m-0001/state.json", Body=json.dumps(state))
    with pytest.raises(EvidenceError, match="a path outside the run"):
        RunStore(_loc(), _store()).pull(dest)


def test_two_phases_of_one_run_never_hold_it_at_once(s3: str, tmp_path: Path) -> None:
    rs, said = RunStore(_loc(), _store()), []
    with rs.lease(phase="03", worker={"host": "a", "pid": 11}, ttl_s=1.5, echo=said.append):
        time.sleep(2.6)  # past its time to live, but renewed every 0.5 s
        with pytest.raises(UsageError, match=r"phase 03 on a \(PID 11\) holds its lease.*phase 04 ran nothing"):
            with rs.lease(phase="04", worker={"host": "b"}, echo=said.append):
                pass
    with rs.lease(phase="04", worker={"host": "b"}, echo=said.append):  # given back: the next phase takes it
        pass
    assert said == []
    # a worker that died holding the lease (its last renewal left in the store): after its time to
    # live, by the store's clock, the next phase takes it over and says so
    _store().put_bytes(json.dumps({"token": "t", "phase": "05", "worker": {"host": "c", "pid": 7},
                                   "ttl_s": 1.0}).encode(), ".runstore/m-0001/lease.json")
    with pytest.raises(UsageError, match="phase 05 on c"):
        with rs.lease(phase="05", worker={"host": "d"}, echo=said.append):
            pass
    time.sleep(2.2)
    with rs.lease(phase="05", worker={"host": "d"}, echo=said.append):
        pass
    assert len(said) == 1 and "the lease of phase 05 on c (PID 7) lapsed" in said[0] and "takes it over" in said[0]
    assert ".runstore/m-0001/lease.json" not in _store().list()  # given back


def test_a_local_migration_stays_on_the_worker_that_started_it(s3: str, tmp_path: Path) -> None:
    a, b = _worker(tmp_path, "a"), _worker(tmp_path, "b")
    with worked_on(_loc(), a, phase="01", providers=("local", "local"), store=_store()) as stored:
        shutil.copytree(SEALED, stored.path, dirs_exist_ok=True)
        stored.push("01", "completed")
    with pytest.raises(UsageError, match=r"runs on the local provider.*under .*/a/\.runbook/local.*cannot reach"):
        with worked_on(_loc(), b, phase="02", providers=("local", "local"), store=_store()):
            pass
    assert not (b / "reports" / "m-0001").exists()  # nothing was pulled
    with worked_on(_loc(), b, phase="02", providers=("runpod", "vast"), store=_store()) as stored:
        assert (stored.path / "receipt.json").read_bytes() == (SEALED / "receipt.json").read_bytes()
    # a directory of the worker's own under the run's id is never overwritten by a pull
    other = _loc("m-0002")
    (a / "reports" / "m-0002").mkdir()
    (a / "reports" / "m-0002" / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="is not a copy of s3://runbook-runs/fleet/m-0002"):
        local_copy(a, other)
    assert (a / "reports" / "m-0002" / "notes.txt").read_text() == "mine"
    pinned_here(None, ("local", "local"), b, "01")  # a new run starts anywhere


def test_verify_list_and_report_read_a_stored_run(s3: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    RunStore(_loc(SEALED.name), _store()).push(SEALED, after=None, phase="06", status="GO", worker={})
    url = f"s3://{BUCKET}/fleet/{SEALED.name}"
    assert cli_main(["verify", url]) == 0
    out = capsys.readouterr().out
    assert "pulled s3://runbook-runs/fleet/" in out and "77 intact, 0 altered" in out
    assert [loc.run_id for loc in stored_runs(f"s3://{BUCKET}/fleet")] == [SEALED.name]
    assert cli_main(["list", "--reports", f"s3://{BUCKET}/fleet"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:4] == [SEALED.name, "GO", "complete", "legacy"]
    monkeypatch.chdir(tmp_path)
    assert cli_main(["report", url]) == 0
    assert (tmp_path / "reports" / f"{SEALED.name}.html").stat().st_size > 10_000
    assert cli_main(["verify", f"s3://{BUCKET}/fleet/no-such-run"]) == 2
    assert "holds no run: nothing was pushed there" in capsys.readouterr().err
    params = tmp_path / "params" / "demo-checkpoint.yaml"
    params.parent.mkdir()
    params.write_text((ROOT / "params" / "demo-checkpoint.yaml").read_text())
    assert cli_main(["phase", "02", str(params), f"s3://{BUCKET}/fleet/no-such-run"]) == 2
    assert "holds no run, so phase 02 cannot run there" in capsys.readouterr().err
    assert ".runstore/no-such-run/lease.json" not in _store().list()
    # approving reads the stored run's plans (this GO run has none waiting); the run is untouched
    before = RunStore(_loc(SEALED.name), _store()).state()
    assert cli_main(["approve", url, "--by", "ops@example.com", "-o", str(tmp_path / "approval.json")]) == 2
    assert f"{SEALED.name} shows no plan waiting for approval" in capsys.readouterr().err
    # a resolution is written into the run under its lease: a GO run has no HOLD to resolve, and nothing is pushed
    assert cli_main(["resolve", url, "--decision", "GO", "--by", "ops@example.com"]) == 2
    assert "HOLD" in capsys.readouterr().err
    after = RunStore(_loc(SEALED.name), _store()).state()
    assert after is not None and before is not None and after.generation == before.generation
    assert f".runstore/{SEALED.name}/lease.json" not in _store().list()


def test_runbook_run_into_a_location_pushes_after_every_phase_and_the_seal(
        s3: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`runbook run --reports s3://...`'s plumbing: the run made in this worker's reports/<run_id>
    under the lease, pushed as each phase ends and after the seal, its location printed. The
    runner here copies a sealed run's files phase by phase (the real runner's phases are the
    end-to-end tier's); the location it prints then verifies."""
    from runbook_lib.evidence.manifest import PHASES
    from runbook_lib.run import runner

    project = _worker(tmp_path, "a")
    (project / "params").mkdir()
    params = project / "params" / "demo-checkpoint.yaml"
    params.write_text((ROOT / "params" / "demo-checkpoint.yaml").read_text())
    held: list[bool] = []

    def copying_runner(params_path: str, *, run_path: Path, after_phase, **_: object) -> runner.RunResult:
        run_path.mkdir()
        for pid, _name in PHASES:
            for f in SEALED.glob(f"{pid}*"):
                (shutil.copytree if f.is_dir() else shutil.copyfile)(f, run_path / f.name)
            held.append(".runstore/" + run_path.name + "/lease.json" in _store().list())
            after_phase(runner.PhaseOutcome(pid, "completed"))
        shutil.copytree(SEALED, run_path, dirs_exist_ok=True)
        return runner.RunResult(run_path, "GO", 0)

    monkeypatch.setattr(runner, "run_migration", copying_runner)
    monkeypatch.setattr(runner, "environment_ok", lambda: None)
    monkeypatch.chdir(project)
    assert cli_main(["run", "params/demo-checkpoint.yaml", "--reports", f"s3://{BUCKET}/fleet"]) == 0
    out = capsys.readouterr().out
    url = out.split("evidence: ")[1].split()[0]
    loc = RunLocation.parse(url)
    assert held == [True] * 6 and f"pushed to {url} (push 7)" in out
    state = RunStore(loc, _store()).state()
    assert state is not None and [h["phase"] for h in state.history] == ["01", "02", "03", "04", "05", "06", "seal"]
    assert state.history[-1]["status"] == "GO" and ".runstore/" + loc.run_id + "/lease.json" not in _store().list()
    assert (project / "reports" / loc.run_id / "receipt.json").exists()  # this worker's copy
    assert cli_main(["verify", url]) == 0


def test_status_says_where_a_run_stands_for_an_orchestrator(s3: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """`runbook status --json`: a sealed run's decision and the exit code `runbook run` gives it; a
    run whose phase is held for an approval, with the plan waiting; read from a location too."""
    from runbook_lib.evidence.rundir import RunDir

    RunStore(_loc(SEALED.name), _store()).push(SEALED, after=None, phase="06", status="GO", worker={})
    assert cli_main(["status", f"s3://{BUCKET}/fleet/{SEALED.name}", "--json"]) == 0
    st = json.loads(capsys.readouterr().out.split("\n", 1)[1])  # after the line saying what was pulled
    assert (st["decision"], st["exit_code"], st["sealed"], st["plans_waiting"]) == ("GO", 0, True, [])
    assert list(st["phases"].values()) == ["completed"] * 6 and st["reasons"][0] == "all 20 blocking gates PASS"
    project = _worker(tmp_path, "a")
    (project / "params").mkdir()
    (project / "params" / "demo.yaml").write_text((ROOT / "params" / "demo.yaml").read_text())
    run = RunDir.create(project / "params" / "demo.yaml", path=project / "reports" / "held-run")
    run.write_record("01", status="held", data={"error": "approval missing"}, files=[], started="2026-12-06T08:00:00Z")
    plan = json.loads(next(iter(sorted((SEALED / "approvals").glob("*.json")))).read_text())["plan"]
    (run.path / "approvals").mkdir()
    (run.path / "approvals" / "pending-1.json").write_text(json.dumps({"plan": plan}))
    assert cli_main(["status", str(run.path), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert (st["decision"], st["exit_code"], st["sealed"], st["phases"]) == ("WAITING FOR APPROVAL", 3, False,
                                                                             {"01": "held"})
    assert st["plans_waiting"] == [{k: plan[k] for k in ("fingerprint", "provider", "action", "target")}]
    assert cli_main(["status", str(run.path)]) == 0
    assert f"waiting for approval: launch_pod {plan['target']} on local" in capsys.readouterr().out
    # a phase whose blocking gate failed stops the migration: status names it (an orchestrator's
    # next task is phase 06)
    stopped = RunDir.create(project / "params" / "demo.yaml", path=project / "reports" / "stopped-run")
    stopped.write_record("01", status="completed", data={}, files=[], started="2026-12-06T08:00:00Z")
    gate = {**json.loads((SEALED / "02_map_target.json").read_text())["data"]["gates"][0], "verdict": "FAIL"}
    stopped.write_record("02", status="completed", data={"stop_migration": True, "gates": [gate]}, files=[],
                         started="2026-12-06T08:01:00Z")
    assert cli_main(["status", str(stopped.path), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert (st["decision"], st["stopped"]) == ("IN PROGRESS", {"phase": "02", "why": "a blocking gate failed "
                                                                                     "(dependency_map FAIL)"})
    assert cli_main(["status", str(stopped.path)]) == 0
    assert "phase 02 stopped the migration (a blocking gate failed (dependency_map FAIL))" in capsys.readouterr().out


def test_a_fleet_keeps_at_most_its_limit_of_migrations_in_flight(s3: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # two slots under s3://runbook-runs/fleet: a third migration waits (exit 3, naming who holds
    # them) until one gives its slot back or is sealed; a retried take keeps the slot it holds
    url = f"s3://{BUCKET}/fleet/"
    assert cli_main(["slot", "take", url + "m-a", "--limit", "2"]) == 0
    assert cli_main(["slot", "take", url + "m-b", "--limit", "2"]) == 0
    assert cli_main(["slot", "take", url + "m-a", "--limit", "2"]) == 0  # a retried task: the same slot
    capsys.readouterr()
    assert cli_main(["slot", "take", url + "m-c", "--limit", "2"]) == 3
    out = capsys.readouterr().out
    assert "all 2 slots" in out and "m-a since" in out and "m-b since" in out
    assert cli_main(["slot", "give", url + "m-a", "--limit", "2"]) == 0
    assert cli_main(["slot", "take", url + "m-c", "--limit", "2"]) == 0
    assert "m-c: holds slot 1 of 2" in capsys.readouterr().out
    # m-b's migration ended without giving its slot back (its last task never ran): its last push
    # lists the seal, so its slot is free for the next migration
    sealed = _worker(tmp_path, "a") / "run"
    shutil.copytree(SEALED, sealed)
    RunStore(_loc("m-b"), _store()).push(sealed, after=None, phase="06", status="completed", worker={"host": "a"})
    assert cli_main(["slot", "take", url + "m-d", "--limit", "2"]) == 0
    assert "m-d: holds slot 2 of 2" in capsys.readouterr().out
    assert cli_main(["slot", "give", url + "m-b", "--limit", "2"]) == 0  # taken over: nothing to give
    assert "holds no slot" in capsys.readouterr().out
    assert cli_main(["slot", "take", url + "m-e", "--limit", "0"]) == 2
