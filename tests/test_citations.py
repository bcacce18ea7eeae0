"""Every file the library's docstrings and comments cite exists in the repository, so a reader
can follow each constant and rule to its source."""

from __future__ import annotations

import re

from .conftest import ROOT

# Paths inside this repository, as the code cites them.
CITED = re.compile(r"\b((?:docs|runbook_lib|tests|params|benchmarks|notebooks|scripts)/[\w./-]+\.(?:md|py|yaml|ipynb))")
OUTSIDE = re.compile(r"\.\./shared/|(?<![\w/])reference/(?:gates|notebooks|providers)\.md")


def _sources() -> list:
    return sorted([*(ROOT / "runbook_lib").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
                   *(ROOT / "scripts").glob("*.py")])


def test_every_cited_repository_file_exists() -> None:
    missing = []
    cited = 0
    for f in _sources():
        for m in CITED.finditer(f.read_text()):
            cited += 1
            if not (ROOT / m.group(1)).exists():
                missing.append(f"{f.relative_to(ROOT)} cites {m.group(1)}")
    assert cited >= 10, "the pattern should find the code's citations"
    assert missing == []


def test_nothing_cites_a_file_outside_the_repository() -> None:
    outside = [f"{f.relative_to(ROOT)}: {m.group(0)}" for f in _sources() for m in OUTSIDE.finditer(f.read_text())]
    assert outside == []
