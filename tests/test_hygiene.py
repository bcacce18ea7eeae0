"""The tests hold themselves to the guide: they reach the library through public names only, and
every file a docstring or comment in the library cites exists in the repository (see also
``test_citations``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from .conftest import ROOT


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _library_private_names() -> set[str]:
    """Every private name the library defines: functions, methods, classes, module and instance
    attributes (``self._x = ...``)."""
    names: set[str] = set()
    for f in (ROOT / "runbook_lib").rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    return {n for n in names if _private(n)}


def private_uses(source: str, library_private: set[str]) -> list[str]:
    """Where ``source`` (a test module) imports a private library module or name, or reads a
    private attribute the library defines on anything but the test's own ``self``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("runbook_lib"):
            if any(_private(part) for part in node.module.split(".")):
                found.append(f"line {node.lineno}: from {node.module} import ...")
            found += [f"line {node.lineno}: imports {a.name}" for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names
                      if a.name.startswith("runbook_lib") and any(_private(p) for p in a.name.split("."))]
        elif isinstance(node, ast.Attribute) and node.attr in library_private:
            own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if not own:
                found.append(f"line {node.lineno}: .{node.attr}")
    return found


def test_tests_use_public_names_only() -> None:
    library_private = _library_private_names()
    offenders = {}
    for f in sorted((ROOT / "tests").rglob("*.py")):
        uses = private_uses(f.read_text(), library_private)
        if uses:
            offenders[str(f.relative_to(ROOT))] = uses
    assert offenders == {}


def test_private_use_check_sees_what_it_should() -> None:
    lib = {"_create", "_k"}
    assert private_uses("from runbook_lib.providers._http import x", lib) == [
        "line 1: from runbook_lib.providers._http import ..."]
    assert private_uses("from runbook_lib.phases import _helper", lib) == ["line 1: imports _helper"]
    assert private_uses("prov._create(1)\nself._create(2)\nos._exit(0)", lib) == ["line 1: ._create"]
    assert private_uses("import runbook_lib._fs", lib) == ["line 1: import runbook_lib._fs"]


def test_pytest_turns_warnings_into_errors() -> None:
    import tomllib

    conf = tomllib.loads(Path(ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert conf["filterwarnings"][0] == "error"


def test_every_test_is_in_the_behaviour_table() -> None:
    """tests/README.md lists every test function with its tier (unit, smoke, e2e-parallel or
    e2e-measure): a case added without a row, or a row left for a case that is gone, fails here."""
    text = (ROOT / "tests" / "README.md").read_text()
    table = text.split("\n## Behaviours", 1)[1].split("\n## ", 1)[0]  # the table, not the history below it
    listed = set(re.findall(r"`test_\w+\.py::(?:\w+::)?(test_\w+)`", table))
    defined = {node.name for f in (ROOT / "tests").rglob("test_*.py") for node in ast.walk(ast.parse(f.read_text()))
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")}
    defined |= {node.name for f in (ROOT / "tests" / "contract").glob("*.py") for node in ast.walk(ast.parse(f.read_text()))
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")}
    assert sorted(defined - listed) == [], "cases with no row in tests/README.md"
    assert sorted(listed - defined) == [], "rows in tests/README.md for cases that no longer exist"


def test_the_readers_of_a_shared_run_go_to_one_worker(tmp_path: Path) -> None:
    """`make test-e2e`'s scheduling (conftest.SharedRunScheduling, selected by `--dist loadgroup`):
    three files each with a case reading a session fixture named like a shared run and a case
    that does not, on two workers: the three readers run on one worker and the run is made once.
    Two more files use the Airflow API server, one through the approved training run: it starts once."""
    import os
    import subprocess
    import sys

    log = tmp_path / "log"
    (tmp_path / "conftest.py").write_text(
        "import os, pytest\n"
        "from tests.conftest import (pytest_collection_modifyitems, pytest_configure, pytest_unconfigure,\n"
        "                            pytest_xdist_make_scheduler)\n"
        "@pytest.fixture(scope='session')\n"
        "def held_run():\n"
        f"    open({str(log)!r}, 'a').write('made ' + os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n"
        "    return os.environ['PYTEST_XDIST_WORKER']\n"
        "@pytest.fixture(scope='session')\n"
        "def airflow_api():\n"
        f"    open({str(log)!r}, 'a').write('airflow ' + os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n"
        "@pytest.fixture(scope='session')\n"
        "def approved_training_run(airflow_api):\n"
        "    return None\n")
    for name in "abc":
        (tmp_path / f"test_{name}.py").write_text(
            "import os, time\n"
            f"def test_{name}_reads(held_run):\n"
            f"    open({str(log)!r}, 'a').write('read ' + held_run + ' ' + os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n"
            f"def test_{name}_alone():\n    time.sleep(0.3)\n")
    (tmp_path / "test_d.py").write_text("def test_d_schedules(airflow_api):\n    pass\n")  # the Airflow API's users
    (tmp_path / "test_e.py").write_text("def test_e_walks(approved_training_run):\n    pass\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p",
                           "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)], capture_output=True,
                          text=True, timeout=120, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    lines = log.read_text().splitlines()
    made = [x for x in lines if x.startswith("made")]
    reads = {tuple(x.split()[1:]) for x in lines if x.startswith("read")}
    assert len(made) == 1 and len(reads) == 1 and len(next(iter(reads))) == 2, lines
    assert len([x for x in lines if x.startswith("airflow")]) == 1, lines  # one Airflow API server, not one per worker
    assert len([x for x in lines if x.startswith("read")]) == 3
