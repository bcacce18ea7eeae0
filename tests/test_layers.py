"""The library's import direction, checked: lower layers never import higher ones, no two modules
import each other (directly or around a loop), and a phase module uses the shared phase
context, never another phase. Imports inside functions count the same as those at the top."""

from __future__ import annotations

import ast
from pathlib import Path

from .conftest import ROOT

PACKAGES: list[set[str]] = [
    {"errors", "_fs", "_fmt", "_http", "_time", "layout"},
    {"__init__", "secret_refs", "offer_query"},
    {"params"},
    {"service"},
    {"gates", "measure", "portability", "storage"},
    {"evidence"},
    {"traffic", "workload"},
    {"providers"},
    {"phases"},
    {"audit"},
    {"run"},
    {"cli"},
]
"""The top level, bottom to top: a package (or top-level module) imports only its own modules and
what is in a band below it. docs/explanation/architecture.md draws these bands."""

LAYERS: list[set[str]] = [
    {"errors", "_fs", "_fmt", "_http", "_time", "layout"},
    {"evidence", "measure", "traffic", "portability", "audit", "run"},  # packages' docstrings only
    {"run.hostlock", "run.fulldisk"},
    {"__init__"},  # the package itself: __version__
    {"evidence.manifest", "evidence.cells", "secret_refs", "offer_query", "portability.gpus", "portability.topology",
     "evidence.text"},
    {"evidence.closedworld"},
    {"evidence.completeness"},
    {"evidence.signing"},
    {"evidence.attestation"},
    {"params"},
    {"service"},
    {"evidence.rundir", "run.phase_notebooks"},
    {"gates", "measure.cost", "measure.timing", "portability.inventory", "storage", "traffic.route",
     "traffic.router", "portability.checkpoint"},
    {"traffic.replay", "traffic.schedules", "run.runstore"},
    {"run.fleet"},
    {"evidence.records"},
    {"evidence.auditpage"},
    {"evidence.approvals", "evidence.resolve", "evidence.seal"},
    {"evidence.report"},  # the report leads with the run's standing (a resolution)
    {"workload"},
    {"providers"},
    {"phases.scan"},
    {"phases", "run.cleanup"},
    {"run.interrupt", "audit.verify", "audit.recompute"},
    {"run.runner"},
    {"run.rehearse"},
    {"cli"},
]
"""Modules, bottom to top; a module may import its own component and anything in a lower layer. An
entry names a module (``evidence.records``) or a package whose modules share one component
(``gates``); a package's ``__init__`` is its own component."""


def _modules() -> dict[str, Path]:
    out = {}
    for f in (ROOT / "runbook_lib").rglob("*.py"):
        parts = f.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = f
    return out


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """``runbook_lib`` modules imported anywhere in ``path`` (``from pkg import sub`` resolves to
    the submodule)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("runbook_lib"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("runbook_lib")}
    return found


def _named(module: str) -> list[str]:
    """Every layer entry that could name ``module``, longest first: ``runbook_lib.evidence.records``
    -> ``evidence.records``, ``evidence``."""
    parts = module.split(".")[1:] or ["__init__"]
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def _component(module: str) -> str:
    entries = set().union(*LAYERS)
    for name in _named(module):
        if name in entries:
            return name
    raise AssertionError(f"{module} is in no layer: add it (or its package) to LAYERS")


def _layer(module: str) -> int:
    comp = _component(module)
    return next(i for i, layer in enumerate(LAYERS) if comp in layer)


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _band(module: str) -> int:
    pkg = _package(module)
    for i, band in enumerate(PACKAGES):
        if pkg in band:
            return i
    raise AssertionError(f"{module} is in no band: add its package {pkg!r} to PACKAGES")


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: {t for t in _imports(f, modules) if t != m} for m, f in modules.items()}


def test_packages_import_only_their_own_modules_and_lower_bands() -> None:
    wrong = sorted({f"{_package(m)} (band {_band(m)}) imports {_package(t)} (band {_band(t)}): {m} -> {t}"
                    for m, ts in _graph().items() for t in ts
                    if _package(t) != _package(m) and _band(t) >= _band(m)})
    assert wrong == []


def test_the_top_level_holds_at_most_12_modules_besides_its_packages() -> None:
    top = sorted(f.stem for f in (ROOT / "runbook_lib").glob("*.py"))
    assert len(top) <= 12, top
    packages = {p.name for p in (ROOT / "runbook_lib").iterdir() if (p / "__init__.py").exists()}
    assert packages | set(top) == set().union(*PACKAGES)


def test_lower_layers_never_import_higher_ones() -> None:
    wrong = []
    for mod, targets in _graph().items():
        for t in targets:
            same = _component(t) == _component(mod)
            if not same and _layer(t) >= _layer(mod):
                wrong.append(f"{mod} (layer {_layer(mod)}) imports {t} (layer {_layer(t)})")
    assert wrong == []


def test_no_import_cycles() -> None:
    graph = _graph()
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        for t in sorted(graph.get(node, ())):
            if t in path:
                cycles.append(" -> ".join(path[path.index(t):] + [t]))
            elif t in graph and len(path) < 12:
                visit(t, path + [t])

    for m in sorted(graph):
        visit(m, [m])
    assert sorted(set(cycles)) == []


PHASE_MODULES = {"freeze", "mapping", "parity", "compare", "cutover", "decide"}
"""The phases; ``context``, ``evidence``, ``resources`` and ``results`` are what they share."""


def _phase(module: str) -> str:
    """The phase a module belongs to: ``runbook_lib.phases.compare.judge`` -> ``compare``."""
    return module.split(".")[2]


def test_phase_modules_share_the_context_not_each_other() -> None:
    graph = _graph()
    crossing = [f"{m} imports {t}" for m, ts in graph.items()
                if m.startswith("runbook_lib.phases.") and _phase(m) in PHASE_MODULES
                for t in ts if t.startswith("runbook_lib.phases.") and _phase(t) in PHASE_MODULES
                and _phase(t) != _phase(m)]
    assert crossing == []
    shared = [f"{m} imports {t}" for m, ts in graph.items()
              if m.startswith("runbook_lib.phases.") and _phase(m) not in PHASE_MODULES
              for t in ts if t.startswith("runbook_lib.phases.") and _phase(t) in PHASE_MODULES]
    assert shared == []  # the shared parts never reach into a phase


def test_layers_name_every_component() -> None:
    assert {_component(m) for m in _modules()} <= set().union(*LAYERS)


LAZY_ALLOWED = {
    "runbook_lib.storage.local", "runbook_lib.storage.s3",  # boto3 only when an S3 store is opened
    "runbook_lib.providers.fixtures", "runbook_lib.providers.api",  # the --provider-fixtures test option
}


def test_library_dependencies_are_stated_at_the_top_of_each_module() -> None:
    # Imports inside functions hide what a module depends on; only the command line (which keeps
    # `runbook --help` fast) and the optional backends above import lazily.
    modules = _modules()
    hidden = []
    for mod, path in modules.items():
        if mod == "runbook_lib.cli":
            continue
        tree = ast.parse(path.read_text())
        top = {id(n) for n in tree.body}
        for n in tree.body:  # typing-only imports state a dependency too
            if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING":
                top |= {id(x) for x in n.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("runbook_lib") \
                    and id(node) not in top:
                names = {f"{node.module}.{a.name}" for a in node.names} | {node.module}
                if not names & LAZY_ALLOWED:
                    hidden.append(f"{mod}: from {node.module} import ... (line {node.lineno})")
    assert hidden == []


MAX_FUNCTION_LINES = 80
MAX_METHODS = 15
MAX_UNTYPED_IN_PHASES = 20
"""At most this many ``dict[str, Any]`` in runbook_lib/phases (issue 27): phase data is built as the
record models of runbook_lib/evidence/records.py; what stays a dict is free-form by nature (a provider's
JSON answer, a table row headed for pandas, the phase's read cache)."""


def _definitions() -> list[tuple[str, ast.AST]]:
    out = []
    for f in sorted((ROOT / "runbook_lib").rglob("*.py")):
        rel = str(f.relative_to(ROOT))
        out += [(rel, n) for n in ast.walk(ast.parse(f.read_text()))]
    return out


def test_no_function_is_over_80_lines() -> None:
    long = [f"{rel}:{n.name} ({n.end_lineno - n.lineno + 1} lines)" for rel, n in _definitions()
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno is not None
            and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []


def test_no_class_grows_past_15_methods() -> None:
    big = {f"{rel}:{n.name}": sum(isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef)) for x in n.body)
           for rel, n in _definitions() if isinstance(n, ast.ClassDef)}
    over = {k: v for k, v in big.items() if v > MAX_METHODS}
    assert over == {}, "split the class into collaborators, each named for what it owns"


def test_phase_data_is_typed_not_dicts() -> None:
    found = [f"{f.relative_to(ROOT)}:{i}" for f in sorted((ROOT / "runbook_lib" / "phases").rglob("*.py"))
             for i, line in enumerate(f.read_text().splitlines(), 1) for _ in range(line.count("dict[str, Any]"))]
    assert len(found) <= MAX_UNTYPED_IN_PHASES, found


def _drawn_bands() -> dict[int, set[str]]:
    """The bands docs/explanation/architecture.md draws: ``band -> names`` from its diagram."""
    text = (ROOT / "docs" / "explanation" / "architecture.md").read_text()
    diagram = text.split("```text", 1)[1].split("```", 1)[0]
    bands: dict[int, set[str]] = {}
    band = -1
    for line in diagram.splitlines()[3:]:
        cells = line[:33].split()
        if cells and cells[0].isdigit():
            band = int(cells.pop(0))
        bands.setdefault(band, set()).update(c.rstrip("/") for c in cells)
    return bands


def test_the_architecture_page_draws_the_bands_the_test_checks() -> None:
    assert _drawn_bands() == dict(enumerate(PACKAGES))


def test_the_library_never_imports_airflow() -> None:
    # Airflow lives in .venv-airflow and calls the `runbook` command (integrations/airflow); the
    # main environment neither has it nor may need it.
    found = []
    for f in sorted((ROOT / "runbook_lib").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{f.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in ("airflow", "runbook_airflow")]
    assert found == []
