"""Where a project keeps its things: the project root a params file belongs to, and the
directories under it (``reports/``, ``notebooks/``, ``.runbook/``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

REPORTS_DIR = "reports"  # run directories: reports/<run_id>
NOTEBOOKS_DIR = "notebooks"  # the phase notebooks
STATE_DIR = ".runbook"  # provider state under the project root: .runbook/<provider>


def project_root(params_path: str | Path) -> Path:
    """The project a params file belongs to: the parent of the ``params/`` directory holding it
    (the layout ``runbook init`` writes); else the nearest ancestor holding ``pyproject.toml``;
    else the file's directory. ``reports/``, ``notebooks/`` and ``.runbook/`` resolve against it."""
    p = Path(params_path).resolve()
    if p.parent.name == "params":
        return p.parent.parent
    for d in p.parents:
        if (d / "pyproject.toml").exists():
            return d
    return p.parent


def params_sha256(path: str | Path) -> str:
    """sha256 (hex) of the params file's bytes, as recorded in the run manifest."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
