"""``runbook cleanup`` and the interrupt handler, on real local pods (no notebook runs here)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

from runbook_lib.audit.verify import verify_run
from runbook_lib.cli import main as cli_main
from runbook_lib.errors import EXIT_FAILED
from runbook_lib.evidence.approvals import require
from runbook_lib.evidence.closedworld import read_links
from runbook_lib.evidence.seal import seal_run
from runbook_lib.params import load_params
from runbook_lib.providers.base import PodSpec
from runbook_lib.providers.local import LocalProvider
from runbook_lib.run.cleanup import CleanupAborted, cleanup_run, summary
from runbook_lib.run.interrupt import Interrupts, exit_code

from .conftest import ROOT

RUN_ID = "20261130T000000Z-m-abc123"


def _project(tmp_path: Path) -> tuple[Path, LocalProvider]:
    run_dir = tmp_path / "reports" / RUN_ID
    run_dir.mkdir(parents=True)
    shutil.copyfile(ROOT / "params" / "demo.yaml", run_dir / "params.yaml")
    return run_dir, LocalProvider(root=tmp_path / ".runbook" / "local")


def _sleeper(prov: LocalProvider, tmp_path: Path, run_id: str, role: str):
    spec = PodSpec(name=role, command=(sys.executable, "-c", "import time; time.sleep(600)"), device="cpu",
                   price_usd_per_hour=0.1, labels=(("run_id", run_id), ("side", "target"), ("role", role)))
    plan = prov.plan_launch(spec)
    return prov.apply(plan, require(plan, run_dir=tmp_path / "approvals", preapproved_local=True))


def test_cleanup_destroys_only_what_the_run_labelled(tmp_path: Path, capsys) -> None:
    run_dir, prov = _project(tmp_path)
    ours = [_sleeper(prov, tmp_path, RUN_ID, r) for r in ("canary", "endpoint-target")]
    other = _sleeper(prov, tmp_path, "another-run", "canary")
    gone = _sleeper(prov, tmp_path, RUN_ID, "bench")
    plan = prov.plan_destroy(gone.id)
    prov.apply(plan, require(plan, run_dir=tmp_path / "approvals", preapproved_local=True))

    assert cli_main(["cleanup", str(run_dir), "--dry-run"]) == 0
    assert {p.id: prov.get(p.id).state for p in ours} == {p.id: "RUNNING" for p in ours}  # dry run: nothing
    assert "dry run" in capsys.readouterr().out

    assert cli_main(["cleanup", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert all(p.id in out for p in ours) and other.id not in out
    assert all(prov.get(p.id).state == "DESTROYED" for p in ours)
    assert prov.get(other.id).state == "RUNNING"
    record = json.loads((run_dir / "cleanup.json").read_text())
    assert sorted(record["destroyed"]) == sorted(p.id for p in ours) and record["already_gone"] == [gone.id]
    assert record["clean"] and len(record["teardowns"]) == 2
    assert all(t["detail"]["processes"]["survivors"] == [] for t in record["teardowns"])
    approvals = list((run_dir / "approvals").glob("*.json"))
    assert len(approvals) == 2  # each destroy is recorded under the run's launch approvals

    plan = prov.plan_destroy(other.id)
    prov.apply(plan, require(plan, run_dir=tmp_path / "approvals", preapproved_local=True))


def test_a_cleanup_after_the_seal_is_sealed_as_a_link_of_its_own(tmp_path: Path, capsys) -> None:
    run_dir, prov = _project(tmp_path)
    seal_run(run_dir, load_params(run_dir / "params.yaml"), run_dir / "params.yaml", decision="GO")
    pod = _sleeper(prov, tmp_path, RUN_ID, "canary")
    assert cli_main(["cleanup", str(run_dir)]) == 0 and prov.get(pod.id).state == "DESTROYED"
    links = read_links(run_dir)
    assert [link.kind for link in links] == ["cleanup"]
    assert sorted(links[0].body["files"])[-1] == "cleanup.json"
    assert [k for k in links[0].body["files"] if k.startswith("approvals/")]  # the teardown's approval record
    assert {r["status"] for r in verify_run(run_dir)} == {"intact"}
    assert cli_main(["cleanup", str(run_dir)]) == 0  # again: nothing found, a second link, still intact
    assert [link.kind for link in read_links(run_dir)] == ["cleanup", "cleanup"]
    assert {r["status"] for r in verify_run(run_dir)} == {"intact"}


def test_an_aborted_cleanup_leaves_the_rest_for_the_next_one(tmp_path: Path) -> None:
    run_dir, prov = _project(tmp_path)
    pods = [_sleeper(prov, tmp_path, RUN_ID, r) for r in ("a", "b")]

    def echo(line: str) -> None:
        if line.strip().startswith("destroy"):
            raise CleanupAborted("second Ctrl-C")

    with pytest.raises(CleanupAborted):
        cleanup_run(run_dir, project=tmp_path, echo=echo)
    assert sorted(prov.get(p.id).state for p in pods) == ["RUNNING", "RUNNING"]
    res = cleanup_run(run_dir, project=tmp_path, echo=lambda s: None)
    assert res.clean and sorted(res.destroyed) == sorted(p.id for p in pods)
    assert summary(res).startswith("destroyed [")


def test_a_phase_06_that_fails_to_run_is_followed_by_the_teardown_it_did_not_do(
        make_params, monkeypatch: pytest.MonkeyPatch) -> None:
    """Phase 01 launches a pod labelled with the run, then its kernel dies; phase 06 (the teardown)
    dies too, before any cell: ``runbook run`` destroys the pod by its label, says so and keeps what
    it destroyed in the manifest; ``runbook phase 06`` destroys it too."""
    import nbformat
    import papermill
    from nbclient.exceptions import DeadKernelError

    from runbook_lib.run.runner import run_migration

    params = make_params()
    project = params.parent.parent
    pods: list[tuple[LocalProvider, str]] = []

    def execute(src: str, out: str, **_: object) -> None:
        if Path(out).name.startswith("01"):
            prov = LocalProvider(root=project / ".runbook" / "local")
            pods.append((prov, _sleeper(prov, project, Path(out).parent.name, "freeze").id))
        nbformat.write(nbformat.v4.new_notebook(), out)
        raise DeadKernelError("Kernel died")

    monkeypatch.setattr(papermill, "execute_notebook", execute)
    lines: list[str] = []
    res = run_migration(params, echo=lines.append)
    assert [o.status for o in res.outcomes] == ["failed", "skipped", "skipped", "skipped", "skipped", "failed"]
    assert res.decision == "FAILED" and "DeadKernelError: Kernel died" in res.outcomes[-1].reason
    [(prov, pod_id)] = pods
    assert prov.get(pod_id).state == "DESTROYED"
    text = "\n".join(lines)
    assert "phase 06 failed: tearing down what this run created" in text and pod_id in text
    kept = json.loads((res.run_dir / "manifest.json").read_text())["teardown_after_phase_06"]
    assert kept["destroyed"] == [pod_id] and kept["clean"]

    run_dir = project / "reports" / "20261207T000000Z-m-dead06"  # the same, one `runbook phase` at a time
    assert cli_main(["phase", "01", str(params), str(run_dir)]) == EXIT_FAILED
    assert pods[-1][0].get(pods[-1][1]).state == "RUNNING"  # phase 06 tears down, not a failed phase 01
    assert cli_main(["phase", "06", str(params), str(run_dir)]) == EXIT_FAILED
    assert pods[-1][0].get(pods[-1][1]).state == "DESTROYED"
    assert json.loads((run_dir / "cleanup.json").read_text())["destroyed"] == [pods[-1][1]]


def test_cleanup_refuses_a_directory_that_is_not_a_run(tmp_path: Path, capsys) -> None:
    assert cli_main(["cleanup", str(tmp_path)]) == 2
    assert "is not a run directory (no params.yaml in it)" in capsys.readouterr().err


def test_a_signal_during_teardown_aborts_it_and_handlers_are_restored() -> None:
    before = signal.getsignal(signal.SIGINT)
    with Interrupts() as intr:
        intr.tearing_down = True
        with pytest.raises(CleanupAborted, match="SIGINT during teardown"):
            os.kill(os.getpid(), signal.SIGINT)
        assert intr.name == "SIGINT" and intr.count == 1
    assert signal.getsignal(signal.SIGINT) is before
    assert (exit_code(signal.SIGINT), exit_code(signal.SIGTERM), exit_code(signal.SIGHUP)) == (130, 143, 129)


def test_a_closed_terminal_stops_the_run_like_sigterm() -> None:
    with Interrupts(kernel_grace_s=0.1) as intr:
        os.kill(os.getpid(), signal.SIGHUP)  # without the handler this would kill the test process
        assert intr.name == "SIGHUP" and intr.count == 1


def test_first_signal_is_recorded_and_a_second_skips_the_teardown() -> None:
    with Interrupts(kernel_grace_s=0.1) as intr:
        os.kill(os.getpid(), signal.SIGTERM)
        assert intr.name == "SIGTERM" and intr.received_at and not intr.skip_teardown
        os.kill(os.getpid(), signal.SIGINT)
        assert intr.count == 2 and intr.skip_teardown and intr.name == "SIGTERM"
