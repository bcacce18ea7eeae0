"""Evidence records chain by sha256; any alteration or gap is detected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runbook_lib.errors import EvidenceError
from runbook_lib.evidence.manifest import GENESIS, read_chain, require_records, sha256_file, write_record


def _chain(run: Path) -> None:
    (run / "01").mkdir(parents=True)
    (run / "01" / "a.txt").write_text("evidence")
    write_record(run, "01", status="completed", data={"x": 1}, files=["01/a.txt"])
    write_record(run, "02", status="completed", data={"y": 2})


def test_records_link_to_previous_bytes(tmp_path: Path) -> None:
    _chain(tmp_path)
    chain = read_chain(tmp_path)
    assert [r.phase for r in chain] == ["01", "02"]
    assert chain[0].body["prev_sha256"] == GENESIS
    assert chain[1].body["prev_sha256"] == sha256_file(tmp_path / "01_freeze_source.json")
    assert chain[0].body["files"]["01/a.txt"] == sha256_file(tmp_path / "01" / "a.txt")


def test_altered_record_breaks_chain(tmp_path: Path) -> None:
    _chain(tmp_path)
    p = tmp_path / "01_freeze_source.json"
    body = json.loads(p.read_text())
    body["data"]["x"] = 2
    p.write_text(json.dumps(body))
    with pytest.raises(EvidenceError, match="02_map_target.json: prev_sha256"):
        read_chain(tmp_path)


def test_altered_or_missing_file_is_named(tmp_path: Path) -> None:
    _chain(tmp_path)
    (tmp_path / "01" / "a.txt").write_text("evidencE")
    with pytest.raises(EvidenceError, match=r"01/a.txt was altered"):
        read_chain(tmp_path)
    (tmp_path / "01" / "a.txt").unlink()
    with pytest.raises(EvidenceError, match=r"lists 01/a.txt, which is missing"):
        read_chain(tmp_path)


def test_missing_needed_record_says_what_to_run(tmp_path: Path) -> None:
    _chain(tmp_path)
    with pytest.raises(EvidenceError, match=r"needs the record of phase 03"):
        require_records(tmp_path, "04", ("01", "03"))
