"""Typed phase records (runbook_lib/evidence/records.py): written with their schema version, checked
against their phase's model before they are written, read only through the models (no module
reads another phase's record by key), and their generated schema kept current."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from runbook_lib.errors import EvidenceError
from runbook_lib.evidence import records
from runbook_lib.evidence.manifest import RECORD_SCHEMA_VERSION, Record, read_chain, write_record

from .conftest import ROOT


def test_a_record_is_written_with_its_schema_version_and_reads_back_typed(tmp_path: Path) -> None:
    data = {"offers": {"ranked": ["b"], "table": [{"offer_id": "a", "hourly_usd_with_disk": 0.5},
                                                  {"offer_id": "b", "hourly_usd_with_disk": 0.3,
                                                   "interruptible_usd_per_hour": 0.1}]}}
    write_record(tmp_path, "02", status="completed", data=records.checked("02", data))
    body = json.loads((tmp_path / "02_map_target.json").read_text())
    assert body["schema_version"] == RECORD_SCHEMA_VERSION == records.SCHEMA_VERSION == 1
    chain = records.Chain({r.phase: r for r in read_chain(tmp_path)})
    assert chain.mapping is not None and chain.mapping.offers is not None
    first = chain.mapping.offers.first
    assert first is not None and (first.offer_id, first.interruptible_usd_per_hour) == ("b", 0.1)
    assert chain.freeze is None and chain.compare is None  # phases with no record read as None
    with pytest.raises(EvidenceError, match="phase 01's completed record is needed"):
        chain.need_freeze()


def test_data_that_does_not_fit_its_phase_model_is_refused_before_it_is_written() -> None:
    with pytest.raises(EvidenceError, match=r"data\.offers\.table\.0\.offer_id does not fit MappingData"):
        records.checked("02", {"offers": {"ranked": [], "table": [{"hourly_usd_with_disk": 1.0}]}})
    with pytest.raises(EvidenceError, match=r"data\.summary\.source\.total p95 \(s\) does not fit CompareData"):
        records.checked("04", {"summary": {"source": {"total p95 (s)": "fast"}}})


def test_a_failed_record_reads_as_the_common_fields_with_its_error(tmp_path: Path) -> None:
    write_record(tmp_path, "03", status="failed", data={"error": "canary never ready", "ename": "NoCapacity"})
    chain = records.read_unchecked(tmp_path)
    assert chain.parity is None  # not completed: none of phase 03's evidence is there
    d = chain.data("03")
    assert d is not None and d.error == "canary never ready" and d.model_extra == {"ename": "NoCapacity"}


def test_the_generated_schema_is_current() -> None:
    on_disk = (ROOT / records.SCHEMA_FILE).read_text()
    assert on_disk == records.schema_text(), "run `.venv/bin/python -m runbook_lib.evidence.records` and commit the file"
    phases = json.loads(on_disk)["phases"]
    assert sorted(phases) == ["01", "02", "03", "04", "05", "06"]
    assert "total p95 (s)" in json.dumps(phases["04"])  # the names on disk, not the Python ones


KEYED_READS = [
    (re.compile(r"""records\s*\[\s*["']0[1-6]["']\s*\]"""), "a phase record picked by key"),
    (re.compile(r"""\.body\s*(\[\s*["']data["']|\.get\(\s*["']data["'])"""), "a record's raw data"),
    (re.compile(r"""json\.loads\(.*\)\s*(\[\s*["']data["']|\.get\(\s*["']data["'])"""), "a record file's raw data"),
]


def test_no_module_reads_another_phase_record_by_key() -> None:
    # Every read of a record's data goes through runbook_lib.evidence.records (the models and Chain);
    # manifest.py writes and chains the raw bodies and is the only other module that sees them.
    found = []
    for f in sorted((ROOT / "runbook_lib").rglob("*.py")):
        if f.name in ("records.py", "manifest.py"):
            continue
        for n, line in enumerate(f.read_text().splitlines(), 1):
            for pattern, what in KEYED_READS:
                if pattern.search(line):
                    found.append(f"{f.relative_to(ROOT)}:{n}: {what}: {line.strip()}")
    assert found == []
    assert "data" not in {n.name for n in ast.walk(ast.parse((ROOT / "runbook_lib" / "evidence" / "manifest.py").read_text()))
                          if isinstance(n, ast.FunctionDef)}
    assert not hasattr(Record, "data")  # a Record's data is read typed, through records.parse
