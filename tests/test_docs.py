"""The README is a front door (at most 250 lines, its links reach pages that exist), and the docs
site's troubleshooting page has a section for every error class the library raises. `make docs`
builds the site strictly (a broken link or a page missing from the nav fails it) and checks the
generated reference pages against the code; `make test` runs it."""

from __future__ import annotations

import importlib
import pkgutil
import re

import runbook_lib
from runbook_lib.errors import RunbookError

from .conftest import ROOT

SKIP = ("runbook_lib.examples", ".sim", ".fake")  # loopback simulators and test fakes: not what users meet


def test_the_readme_is_a_front_door_of_at_most_250_lines() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert text.startswith("# gpu-migration runbook\n\n```sh\nmake demo ")  # the two commands first
    for word in ("GO", "NO-GO", "HOLD", "busy machine gives HOLD"):
        assert word in text


def test_every_link_in_the_readme_reaches_a_page() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    assert len(links) >= 20
    missing = [link for link in links if not link.startswith("http") and not (ROOT / link).exists()]
    assert missing == []


def _error_classes() -> set[type[RunbookError]]:
    for mod in pkgutil.walk_packages(runbook_lib.__path__, "runbook_lib."):
        if not any(s in mod.name for s in SKIP):
            importlib.import_module(mod.name)
    found: set[type[RunbookError]] = set()
    todo = [RunbookError]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("runbook_lib.") and not any(s in sub.__module__ for s in SKIP):
                found.add(sub)
            todo.append(sub)
    return found


GATE_NAMED = re.compile(r'(?:GateResult|boolean_gate|_gate)\(\s*"([a-z][a-z_0-9]+)"|"name":\s*"([a-z][a-z_0-9]+)"')
"""Where the library names a gate it writes: a GateResult or boolean gate built with its name first,
or a gate dict renamed (``"name": ...``)."""


def test_every_gate_the_library_writes_is_on_the_gates_page() -> None:
    from runbook_lib.params import DRILL_NAMES

    names = {a or b for f in (ROOT / "runbook_lib").rglob("*.py") for a, b in GATE_NAMED.findall(f.read_text())}
    names |= {f"drill_{d}" for d in DRILL_NAMES} | {"artifact_checksum", "ttft_p95_ratio", "tpot_p95_ratio",
                                                    "inference_parity"}  # named through helpers
    assert len(names) >= 40
    page = (ROOT / "docs" / "reference" / "all-gates.md").read_text()
    assert sorted(n for n in names if f"`{n}`" not in page) == []


def test_troubleshooting_has_a_section_for_every_error_class() -> None:
    headings = set(re.findall(r"^#{2,3} (\w+)$", (ROOT / "docs" / "troubleshooting.md").read_text(), re.M))
    names = {c.__name__ for c in _error_classes()}
    assert len(names) >= 15
    assert sorted(names - headings) == []
