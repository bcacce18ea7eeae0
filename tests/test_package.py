"""Package hygiene: a light import, notebooks in sync with their generator and without outputs."""

from __future__ import annotations

import json
import subprocess
import sys

import nbformat
import papermill

from .conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import build_notebooks  # noqa: E402


def test_import_is_light() -> None:
    code = ("import sys, runbook_lib, runbook_lib.params, runbook_lib.manifest, runbook_lib.gates;"
            "heavy = [m for m in ('torch', 'matplotlib', 'pandas', 'papermill', 'sentence_transformers', 'sklearn')"
            " if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_notebooks_match_generator_and_have_no_outputs() -> None:
    names = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert names == sorted(build_notebooks.NOTEBOOKS)
    for name in names:
        committed = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
        assert committed == build_notebooks.build(name), f"run scripts/build_notebooks.py ({name} drifted)"
        assert all(not c.get("outputs") and c.get("execution_count") is None
                   for c in committed.cells if c.cell_type == "code")


def test_parameters_cells_hold_references_only() -> None:
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        params = papermill.inspect_notebook(str(nb))
        assert set(params) == {"params_path", "run_dir", "run_mode", "approval_ref"}, nb.name
        widget_cells = [c for c in json.loads(nb.read_text())["cells"] if "approval_widget(" in "".join(c["source"])]
        assert all("skip-execution" in c["metadata"].get("tags", []) for c in widget_cells), nb.name


def test_remote_reference_detector() -> None:
    from runbook_lib.report import remote_references

    assert remote_references('<script src="https://cdn.example/x.js"></script>')
    assert remote_references("<link href='//cdn.example/s.css'>")
    assert remote_references('import m from "https://cdnjs.example/mermaid.mjs"')
    assert remote_references('<img src="data:image/png;base64,AAAA">') == []
