"""The library's import direction, checked: lower layers never import higher ones, no two modules
import each other (directly or around a loop), and a phase module uses the shared phase
context, never another phase. Imports inside functions count the same as those at the top."""

from __future__ import annotations

import ast
from pathlib import Path

from .conftest import ROOT

LAYERS: list[set[str]] = [
    {"errors", "_fs", "_http", "_time", "layout"},
    {"hostlock"},
    {"__init__"},  # the package itself: __version__
    {"manifest", "secret_refs", "offer_query"},
    {"closedworld"},
    {"signing"},
    {"params"},
    {"service"},
    {"rundir", "phase_notebooks"},
    {"gates", "cost", "measure", "inventory", "storage", "route", "router", "checkpoint"},
    {"replay"},
    {"records"},
    {"auditpage"},
    {"approvals", "resolve", "report", "seal"},
    {"workload"},
    {"providers"},
    {"scan"},
    {"phases", "cleanup"},
    {"interrupt", "verify", "recompute"},
    {"runner"},
    {"rehearse"},
    {"cli"},
]
"""Bottom to top; a module may import its own component and anything in a lower layer."""


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


def _component(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer(module: str) -> int:
    comp = _component(module)
    for i, layer in enumerate(LAYERS):
        if comp in layer:
            return i
    raise AssertionError(f"{module} is in no layer: add its component {comp!r} to LAYERS")


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: {t for t in _imports(f, modules) if t != m} for m, f in modules.items()}


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
record models of runbook_lib/records.py; what stays a dict is free-form by nature (a provider's
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
