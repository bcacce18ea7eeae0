"""A full disk during a phase, injected (ENOSPC from the writes; no small file system needed): the
run names the path and the free space, runs no further phase, tears down what it created on real
local pods (even when no record of the teardown can be written), and removes the notebooks the
disk cut off. No kernel starts: papermill's execution is replaced by what a full disk does to it."""

from __future__ import annotations

import errno
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest

from runbook_lib.cli import main as cli_main
from runbook_lib.errors import EXIT_FAILED
from runbook_lib.evidence import manifest
from runbook_lib.evidence.approvals import require
from runbook_lib.params import load_params
from runbook_lib.providers.base import PodSpec, plan_stop
from runbook_lib.providers.local import LocalProvider
from runbook_lib.run.fulldisk import NO_SPACE, full_disk_error, partial_notebooks
from runbook_lib.run.runner import run_migration


def _pod(project: Path, run_id: str, role: str, *, stop: bool = False) -> tuple[LocalProvider, str]:
    """A real local pod labelled with ``run_id`` (a sleeping process), stopped when ``stop``: what
    phase 01's freeze pod is when its phase dies."""
    prov = LocalProvider(root=project / ".runbook" / "local")
    spec = PodSpec(name=role, command=(sys.executable, "-c", "import time; time.sleep(600)"), device="cpu",
                   price_usd_per_hour=0.1, labels=(("run_id", run_id), ("side", "source"), ("role", role)))
    plan = prov.plan_launch(spec)
    pod = prov.apply(plan, require(plan, run_dir=project / "approvals", preapproved_local=True))
    if stop:
        plan = plan_stop(prov, pod.id)
        prov.apply(plan, require(plan, run_dir=project / "approvals", preapproved_local=True))
    return prov, pod.id


def _fill_up(monkeypatch: pytest.MonkeyPatch, pods: list[tuple[LocalProvider, str]], project: Path) -> None:
    """papermill runs phase 01's first cells, which launch the freeze pods, then saves a notebook
    that the disk cuts off; from then on every write under reports/ fails with ENOSPC."""
    import papermill

    real = manifest.atomic_write
    full = {"now": False}

    def execute(src: str, out: str, **_: Any) -> None:
        run_id = Path(out).parent.name
        pods.extend([_pod(project, run_id, "freeze", stop=True), _pod(project, run_id, "canary")])
        Path(out).write_text(nbformat.writes(nbformat.v4.new_notebook())[:40])
        full["now"] = True
        raise OSError(errno.ENOSPC, "No space left on device", out)

    def atomic_write(dest: Path, chunks: Any, **kw: Any) -> Any:
        if full["now"] and "reports" in dest.parts:
            raise OSError(errno.ENOSPC, "No space left on device", str(dest))
        return real(dest, chunks, **kw)

    monkeypatch.setattr(papermill, "execute_notebook", execute)
    monkeypatch.setattr(manifest, "atomic_write", atomic_write)


def test_a_full_disk_tears_down_what_the_run_created_and_removes_cut_off_notebooks(
        make_params, monkeypatch: pytest.MonkeyPatch) -> None:
    params = make_params()
    project = params.parent.parent
    pods: list[tuple[LocalProvider, str]] = []
    _fill_up(monkeypatch, pods, project)
    lines: list[str] = []
    res = run_migration(params, echo=lines.append)

    assert res.exit_code == EXIT_FAILED and res.decision == "FAILED"
    nb = res.run_dir / "01_freeze_source.ipynb"
    assert res.reasons[0].startswith(f"phase 01 failed: no space left on the device holding {nb}")
    assert " free of " in res.reasons[0]  # the free space on that device
    assert [o.status for o in res.outcomes] == ["failed", "skipped", "skipped", "skipped", "skipped", "skipped"]
    assert res.outcomes[0].disk_full and "the disk is full" in res.outcomes[5].reason  # 06 cannot write either
    assert not nb.exists() and not list(res.run_dir.glob("*.ipynb"))  # cut off: removed, not left as evidence
    assert len(pods) == 2 and all(prov.get(pid).state == "DESTROYED" for prov, pid in pods)  # the EXITED one too
    text = "\n".join(lines)
    assert "removed 01_freeze_source.ipynb: cut off by the full disk" in text
    assert "the approval record of destroying" in text and "cleanup.json not written" in text
    assert "the run is not sealed: no space left on the device holding" in text


def test_runbook_phase_on_a_full_disk_exits_4_naming_the_path_after_tearing_down(
        make_params, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    params = make_params()
    project = params.parent.parent
    pods: list[tuple[LocalProvider, str]] = []
    _fill_up(monkeypatch, pods, project)
    run_dir = project / "reports" / "20261205T000000Z-m-full01"
    run_dir.parent.mkdir(exist_ok=True)
    assert cli_main(["phase", "01", str(params), str(run_dir)]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert f"no space left on the device holding {run_dir / '01_freeze_source.ipynb'}" in err
    assert all(prov.get(pid).state == "DESTROYED" for prov, pid in pods)
    assert not (run_dir / "01_freeze_source.ipynb").exists()
    assert load_params(run_dir / "params.yaml").migration == load_params(params).migration  # the run stays a run


def test_a_cells_own_full_disk_is_recognised_from_papermills_report() -> None:
    # papermill gives a failed cell's exception as its name and printed text
    got = full_disk_error(ename="OSError", evalue="[Errno 28] No space left on device: '/r/04/samples.parquet'")
    assert got is not None and got.errno == errno.ENOSPC and got.filename == "/r/04/samples.parquet"
    assert full_disk_error(ename="OSError", evalue="[Errno 122] Disk quota exceeded").errno == errno.EDQUOT
    assert full_disk_error(ename="OSError", evalue="[Errno 2] No such file or directory: '/x'") is None
    assert full_disk_error(ename="ValueError", evalue="bad [Errno 28] text") is None
    chained = RuntimeError("writing the record")
    chained.__cause__ = OSError(errno.ENOSPC, "No space left on device", "/r/x.json")
    assert full_disk_error(chained).filename == "/r/x.json"
    assert NO_SPACE == "NoSpaceLeft"


def test_partial_notebooks_are_the_empty_and_cut_off_ones(tmp_path: Path) -> None:
    nbformat.write(nbformat.v4.new_notebook(), tmp_path / "01_freeze_source.ipynb")
    (tmp_path / "02_map_target.ipynb").write_text(nbformat.writes(nbformat.v4.new_notebook())[:30])
    (tmp_path / "06_accept_or_rollback.ipynb").write_bytes(b"")
    (tmp_path / "03_prove_parity.ipynb").write_text("[1, 2]")
    assert [p.name for p in partial_notebooks(tmp_path)] == [
        "02_map_target.ipynb", "03_prove_parity.ipynb", "06_accept_or_rollback.ipynb"]
