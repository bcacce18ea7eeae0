"""A workload of one's own, as a new user writes it: a module in the project directory (the one
``runbook init`` made, holding ``params/``), named in params, with no PYTHONPATH set and the
command run from elsewhere. The runner finds it before anything is rented, refuses a class whose
requests JSON cannot carry, and phase 01's kernel and local pod import the same module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .runs import FAST_INFERENCE, write_params

MODULE = textwrap.dedent('''
    import numpy as np

    from runbook_lib.workload.embed import EmbeddingWorkload


    class TeamEmbedder(EmbeddingWorkload):
        """The packaged embedder under a team's name: its identity says whose it is."""

        def identity(self):
            return {**super().identity(), "owner": "team-search"}


    class ArrayRequests(EmbeddingWorkload):
        """Sends numpy arrays as requests: no job API can carry them as JSON."""

        def golden_requests(self):
            return [np.array([1.0, 2.0])] + super().golden_requests()
''')


def _project(tmp_path: Path, entry_point: str) -> Path:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "team_models.py").write_text(MODULE)
    return write_params(project, "demo.yaml", "mine.yaml", workload={"entry_point": entry_point},
                        **FAST_INFERENCE)


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter started elsewhere, with no PYTHONPATH: as a user's shell."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True,
                          timeout=600)


def test_requests_json_cannot_carry_are_refused_before_anything_runs(tmp_path: Path) -> None:
    params = _project(tmp_path, "team_models:ArrayRequests")
    out = _run(f"import sys; from runbook_lib.cli import main; sys.exit(main(['run', {str(params)!r}]))", tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "golden request 0 is a ndarray that JSON cannot carry" in out.stderr and "nothing was run" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (params.parent.parent / "reports").exists()  # no run directory, nothing launched


@pytest.mark.e2e  # phase 01: a local source pod runs the acceptance job
def test_a_module_in_the_project_directory_is_found_by_the_runner_the_kernel_and_the_pod(tmp_path: Path) -> None:
    params = _project(tmp_path, "team_models:TeamEmbedder")
    code = textwrap.dedent(f'''
        from pathlib import Path
        from runbook_lib.params import load_params
        from runbook_lib.evidence.rundir import RunDir
        from runbook_lib.run.runner import preflight, run_phase
        params = Path({str(params)!r})
        preflight(load_params(params), params.parent.parent)
        run = RunDir.create(params, reports_dir=params.parent.parent / "reports")
        out = run_phase(run, "01")
        print(out.status, out.reason, run.path)
    ''')
    out = _run(code, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    status, *_, run_dir = out.stdout.split()
    assert status == "completed", out.stdout
    record = json.loads((Path(run_dir) / "01_freeze_source.json").read_text())
    assert '"owner": "team-search"' in json.dumps(record)  # the identity the pod's import of the module gave
