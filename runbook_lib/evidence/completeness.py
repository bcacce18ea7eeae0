"""What the headless runner writes for every phase that ran, and what a sealed run lacks of it.

A phase run by ``runbook run`` or ``runbook phase`` leaves its executed notebook beside its record
(``NN_<phase>.ipynb``) and, in ``manifest.json``, which notebook ran it (``notebook_source``: a
path and the notebook's sha256), how long it waited for the host lock (``lock_wait_s``, seconds)
and its secret scan (``secret_scans``: files scanned, findings). A run whose notebooks papermill or
JupyterLab ran without the runner lacks them: its hashes may all agree, but nothing says its
notebooks were the ones shown, its files were scanned for credentials, or its timed phases ran
alone. :func:`runbook_lib.audit.verify.incomplete_rows` reports what is missing, and the decision's
attestation claims ``RUNBOOK_PROVENANCE_COMPLETE`` only when nothing is
(:mod:`runbook_lib.evidence.attestation`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from runbook_lib.evidence.closedworld import read_json_object, seal_kind
from runbook_lib.evidence.manifest import PHASES
from runbook_lib.layout import MANIFEST

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _notebook_problem(path: Path) -> str | None:
    """Why ``path`` is not an executed notebook (missing, not JSON, no cells), or None."""
    if not path.is_file():
        return "executed notebook, beside its record"
    try:
        cells = json.loads(path.read_text()).get("cells")
    except (OSError, ValueError, AttributeError):
        cells = None
    return None if isinstance(cells, list) and cells else "executed notebook (the file there holds no cells)"


def _entry_problems(pid: str, entry: dict[str, Any], scans: dict[str, Any]) -> list[str]:
    """What phase ``pid``'s manifest entry and scan lack, each named."""
    out = []
    src = entry.get("notebook_source")
    if not (isinstance(src, dict) and isinstance(src.get("path"), str) and src["path"]
            and _SHA256.match(str(src.get("sha256", "")))):
        out.append(f"notebook provenance (notebook_source: which notebook ran it, a path and its sha256) in {MANIFEST}")
    wait = entry.get("lock_wait_s")
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait < 0:
        out.append(f"host-lock record (lock_wait_s: seconds waited, a number) in {MANIFEST}")
    scan = scans.get(pid)
    if not (isinstance(scan, dict) and isinstance(scan.get("findings"), list)
            and isinstance(scan.get("scanned_files"), int) and not isinstance(scan.get("scanned_files"), bool)
            and scan["scanned_files"] > 0):
        out.append(f"secret scan (secret_scans: files scanned and findings) in {MANIFEST}")
    elif scan["findings"]:
        out.append(f"a clean secret scan: its scan found {len(scan['findings'])} credential(s), so the phase failed")
    return out


def missing_provenance(run_dir: Path) -> dict[str, list[str]]:
    """What each phase that ran (each phase with a record) lacks of the runner's evidence, by
    phase id; empty for a complete run. A phase stopped by a signal while it waited for the host
    lock ran no notebook and needs none. Only closed-world seals are checked: an unsealed run or
    an older open-world (legacy) seal, whose runner did not write all of these yet, gives {}."""
    if seal_kind(run_dir) != "closed":
        return {}
    manifest = read_json_object(run_dir / MANIFEST) or {}
    entries = {str(p.get("phase")): p for p in manifest.get("phases") or [] if isinstance(p, dict)}
    scans = {str(x.get("phase")): x for x in manifest.get("secret_scans") or [] if isinstance(x, dict)}
    out: dict[str, list[str]] = {}
    for pid, name in PHASES:
        if not (run_dir / f"{pid}_{name}.json").is_file():
            continue
        entry = entries.get(pid, {})
        notebook = run_dir / f"{pid}_{name}.ipynb"
        if entry.get("status") == "interrupted" and not notebook.exists():
            continue
        missing = [m for m in [_notebook_problem(notebook)] if m] + _entry_problems(pid, entry, scans)
        if missing:
            out[pid] = missing
    return out
