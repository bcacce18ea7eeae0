"""Package hygiene: a light import; notebooks that are thin, structured alike and committed without
outputs.

The ``.ipynb`` files are the notebooks' source (edited in JupyterLab); this test holds their shape:
the parameters cell holds references only, and every other code cell makes exactly one call into
``runbook_lib.phases`` and displays what it returned. A notebook saved in JupyterLab after running
(outputs, execution counts, widget state, kernel metadata) keeps that shape; only the committed
(staged) copy must be output-free, which the nbstripout git filter (``make strip-filter``) does."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import nbformat
import papermill

from runbook_lib import phases
from runbook_lib.evidence.manifest import PHASES, phase_name

from .conftest import ROOT


def test_import_is_light() -> None:
    code = ("import sys, runbook_lib, runbook_lib.params, runbook_lib.evidence.manifest, runbook_lib.gates;"
            "heavy = [m for m in ('torch', 'matplotlib', 'pandas', 'papermill', 'sentence_transformers', 'sklearn')"
            " if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def _phases_call(node: ast.expr, phase_names: set[str]) -> bool:
    """``name(...)`` or ``module.name(...)`` where the name was imported from ``runbook_lib.phases``."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Name):
        return f.id in phase_names
    return isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in phase_names


def cell_shape(source: str, phase_names: set[str]) -> str:
    """``ok``, or what is wrong with a code cell: it must be imports (IPython's display, names from
    runbook_lib.phases), then one call into runbook_lib.phases, then a display of its result."""
    body = [n for n in ast.parse(source).body if not isinstance(n, (ast.Import, ast.ImportFrom))]
    imports = [n for n in ast.parse(source).body if isinstance(n, (ast.Import, ast.ImportFrom))]
    for imp in imports:
        if not (isinstance(imp, ast.ImportFrom) and imp.module in ("runbook_lib.phases", "IPython.display")):
            return f"imports something other than runbook_lib.phases / IPython.display (line {imp.lineno})"
    calls = [n for stmt in body for n in ast.walk(stmt) if _phases_call(n, phase_names)]  # type: ignore[arg-type]
    if len(calls) != 1:
        return f"makes {len(calls)} calls into runbook_lib.phases (want exactly 1)"
    last = body[-1] if body else None
    shown = (isinstance(last, ast.Expr) and isinstance(last.value, ast.Call) and isinstance(last.value.func, ast.Name)
             and last.value.func.id == "display" and len(last.value.args) == 1)
    if not shown:
        return "does not end by displaying the call's result"
    arg = last.value.args[0]  # type: ignore[union-attr]
    if len(body) == 1:
        return "ok" if _phases_call(arg, phase_names) else "displays something other than the phases call"
    first = body[0]
    if len(body) != 2 or not (isinstance(first, ast.Assign) and _phases_call(first.value, phase_names)):
        return "holds statements besides the call and its display"
    target = first.targets[0]
    same = isinstance(target, ast.Name) and isinstance(arg, ast.Name) and arg.id == target.id
    return "ok" if same else "displays something other than the call's result"


def test_every_code_cell_is_one_phases_call_and_its_display() -> None:
    _check_shapes(ROOT / "notebooks")


def _check_shapes(nb_dir) -> None:
    assert sorted(p.name for p in nb_dir.glob("*.ipynb")) == [f"{phase_name(p)}.ipynb" for p, _ in PHASES]
    for pid, _ in PHASES:
        nb = nbformat.read(nb_dir / f"{phase_name(pid)}.ipynb", as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert "parameters" in code[0].metadata.get("tags", []), f"{pid}: first code cell is the parameters cell"
        names: set[str] = set()
        for node in ast.walk(ast.parse("\n".join(c.source for c in code[1:]))):
            if isinstance(node, ast.ImportFrom) and node.module == "runbook_lib.phases":
                names |= {a.asname or a.name for a in node.names}
        assert names, f"{pid}: imports nothing from runbook_lib.phases"
        assert all(hasattr(phases, n) or n in {"freeze", "mapping", "parity", "compare", "cutover", "decide"}
                   for n in names), f"{pid}: imports {names}"
        for i, cell in enumerate(code[1:], start=1):
            assert cell_shape(cell.source, names) == "ok", f"{phase_name(pid)} code cell {i}: " \
                f"{cell_shape(cell.source, names)}\n{cell.source}"


def _committed(name: str) -> bytes:
    """The notebook as staged in git (``git show :notebooks/NAME``); the working file outside a checkout."""
    path = f"notebooks/{name}"
    got = subprocess.run(["git", "show", f":{path}"], cwd=ROOT, capture_output=True)
    return got.stdout if got.returncode == 0 else (ROOT / path).read_bytes()


def test_committed_notebooks_carry_no_outputs() -> None:
    for pid, _ in PHASES:
        nb = nbformat.reads(_committed(f"{phase_name(pid)}.ipynb").decode(), as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), \
            f"{phase_name(pid)} is staged with outputs: run `make strip-filter` (git then strips them on add) " \
            f"and `git add notebooks/{phase_name(pid)}.ipynb` again"
        assert "widgets" not in nb.metadata, f"{phase_name(pid)} is staged with widget state"


def test_a_notebook_saved_after_running_keeps_its_shape(tmp_path) -> None:
    # What JupyterLab writes on save after running cells: outputs, counts, widget state, kernel
    # metadata. The shape checks read such a copy as they read the clean one.
    import shutil

    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")
    path = tmp_path / "notebooks" / "03_prove_parity.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nb.metadata["language_info"] = {"name": "python", "version": "3.11.7"}
    for i, c in enumerate(c for c in nb.cells if c.cell_type == "code"):
        c.outputs = [nbformat.v4.new_output("stream", name="stdout", text="ran\n")]
        c.execution_count = i + 1
        c.metadata["execution"] = {"iopub.status.busy": "2026-12-01T00:00:00Z"}
    nbformat.write(nb, path)
    _check_shapes(tmp_path / "notebooks")
    _check_parameters(tmp_path / "notebooks")


def test_cell_shape_check_catches_thick_cells() -> None:
    names = {"freeze", "finish"}
    assert cell_shape("result = freeze.run(ctx)\ndisplay(result)", names) == "ok"
    assert cell_shape("display(finish(ctx, result))", names) == "ok"
    assert "2 calls" in cell_shape("a = freeze.run(ctx)\nb = freeze.plan(ctx)\ndisplay(a)", names)
    assert "0 calls" in cell_shape("display(ctx.mig)", names)
    assert "does not end by displaying" in cell_shape("result = freeze.run(ctx)", names)
    assert "besides the call" in cell_shape("x = 1\nresult = freeze.run(ctx)\ndisplay(result)", names)
    assert "other than the call's result" in cell_shape("result = freeze.run(ctx)\ndisplay(ctx)", names)
    assert "imports something other" in cell_shape("import os\nresult = freeze.run(ctx)\ndisplay(result)", names)


def test_parameters_cells_hold_references_only() -> None:
    _check_parameters(ROOT / "notebooks")


def _check_parameters(nb_dir) -> None:
    for nb in sorted(nb_dir.glob("*.ipynb")):
        params = papermill.inspect_notebook(str(nb))
        assert set(params) == {"params_path", "run_dir", "run_mode", "approval_ref"}, nb.name
        widget_cells = [c for c in json.loads(nb.read_text())["cells"] if "approval_widget(" in "".join(c["source"])]
        # The approval cell runs headless too (it shows what approves the plan; it never waits).
        assert all("skip-execution" not in c["metadata"].get("tags", []) for c in widget_cells), nb.name


def test_remote_reference_detector() -> None:
    from runbook_lib.evidence.report import remote_references

    assert remote_references('<script src="https://cdn.example/x.js"></script>')
    assert remote_references("<link href='//cdn.example/s.css'>")
    assert remote_references('import m from "https://cdnjs.example/mermaid.mjs"')
    assert remote_references('<img src="data:image/png;base64,AAAA">') == []
