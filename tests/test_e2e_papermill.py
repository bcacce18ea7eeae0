"""A migration whose six notebooks papermill runs directly, as Airflow's PapermillOperator would,
without the runner: every hash its phase 06 sealed agrees, but it has no executed notebooks beside
its records, no notebook provenance, no secret scans and no host-lock record, so ``runbook verify``
says it is incomplete (exit 1, each item named) and ``runbook list`` never calls it verified.
Slow (a minute on 2 cores): `make test-e2e`."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import papermill as pm
import pytest

from runbook_lib.cli import main as cli_main
from runbook_lib.evidence.manifest import PHASES

from .conftest import ROOT
from .runs import UNJUDGED, write_params

pytestmark = pytest.mark.e2e


def test_notebooks_run_by_papermill_alone_are_an_incomplete_run_verify_names(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], as_an_untimed_phase: Callable[[], None]) -> None:
    params = write_params(tmp_path, "demo.yaml", **UNJUDGED)
    out = tmp_path / "papermill-out"  # where the orchestrator keeps its executed notebooks: not the run
    out.mkdir()
    as_an_untimed_phase()  # papermill takes no host lock; no timed phase runs beside it
    run_dir = ""
    for pid, name in PHASES:
        pm.execute_notebook(str(ROOT / "notebooks" / f"{pid}_{name}.ipynb"), str(out / f"{pid}_{name}.ipynb"),
                            parameters={"params_path": str(params), "run_dir": run_dir, "run_mode": "headless"},
                            cwd=str(tmp_path), progress_bar=False)
        if not run_dir:
            [made] = [d for d in (tmp_path / "reports").iterdir() if d.is_dir()]
            run_dir = str(made)
    run = Path(run_dir)
    assert (run / "manifest.json").is_file() and (run / "_SUCCESS").is_file()  # phase 06 sealed it
    assert cli_main(["verify", str(run)]) == 1
    said = capsys.readouterr().out
    assert "0 altered, 0 missing, 0 broken links, 6 phases incomplete" in said, said
    for pid, name in PHASES:
        line = next(x for x in said.splitlines() if x.startswith(f"incomplete   {pid}_{name}.ipynb"))
        for item in ("executed notebook, beside its record", "notebook_source", "lock_wait_s", "secret_scans"):
            assert item in line, line
    assert cli_main(["list", "--reports", str(run.parent)]) == 0
    listed = next(x for x in capsys.readouterr().out.splitlines() if run.name in x)
    assert " incomplete " in listed and "INCOMPLETE" in listed and "verified" not in listed
