"""Approval records: who approved which plan (by fingerprint), when, and how.

Nothing blocks waiting for a click in a headless run. Interactively a widget button writes the
record (:func:`approval_widget`, in a cell tagged ``skip-execution``); headlessly the record
comes from params (``approvals.preapproved_local`` for the embedded local provider) or from an
approval file. A missing or mismatched record raises :class:`ApprovalRequired` (HOLD).
"""

from __future__ import annotations

import getpass
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runbook_lib.errors import ApprovalRequired
from runbook_lib.manifest import utc_now, write_json_atomic


@dataclass(frozen=True)
class Approval:
    """An approval of one plan. ``fingerprint`` is :attr:`Plan.fingerprint`."""

    fingerprint: str
    approved_by: str
    approved_at: str
    method: str  # "params:preapproved_local", "file:<path>", "widget"


def _record_dir(run_dir: str | Path) -> Path:
    d = Path(run_dir) / "approvals"
    d.mkdir(parents=True, exist_ok=True)
    return d


def record(run_dir: str | Path, approval: Approval, plan: Any) -> Path:
    """Write the approval next to the plan it approves: ``approvals/<fingerprint[:16]>.json``."""
    path = _record_dir(run_dir) / f"{approval.fingerprint[:16]}.json"
    write_json_atomic(path, {"approval": asdict(approval), "plan": plan.to_dict()})
    return path


def require(plan: Any, *, run_dir: str | Path, preapproved_local: bool, approval_file: str = "") -> Approval:
    """Find the approval for ``plan`` or stop.

    Order: an existing record in the run directory (a widget click), params pre-approval (only
    for the ``local`` provider), then ``approval_file`` (JSON with a ``fingerprints`` list,
    ``approved_by`` and ``approved_at``).

    Raises:
        ApprovalRequired: no record names this plan's fingerprint; the message says what to approve.
    """
    existing = _record_dir(run_dir) / f"{plan.fingerprint[:16]}.json"
    if existing.exists():
        a = json.loads(existing.read_text())["approval"]
        if a["fingerprint"] == plan.fingerprint:
            return Approval(**a)
    if preapproved_local and plan.provider == "local":
        a = Approval(plan.fingerprint, "params", utc_now(), "params:approvals.preapproved_local")
        record(run_dir, a, plan)
        return a
    if approval_file:
        p = Path(approval_file)
        if p.exists():
            body = json.loads(p.read_text())
            if plan.fingerprint in body.get("fingerprints", []):
                a = Approval(plan.fingerprint, str(body.get("approved_by", "?")),
                             str(body.get("approved_at", utc_now())), f"file:{p}")
                record(run_dir, a, plan)
                return a
    raise ApprovalRequired(
        f"plan {plan.action} {plan.target!r} on provider {plan.provider!r} (fingerprint "
        f"{plan.fingerprint}) has no approval record. Approve it in the notebook, or add the "
        "fingerprint to an approval file named by approvals.approval_file, then run again."
    )


def approval_widget(plan: Any, *, run_dir: str | Path) -> Any:  # pragma: no cover - needs a frontend
    """An Approve button for interactive use; a click writes the approval record.

    Tag the cell that calls this ``skip-execution`` so headless runs never wait on it.
    """
    import ipywidgets as widgets

    button = widgets.Button(description=f"Approve {plan.action} {plan.target}", button_style="warning")
    out = widgets.Output()

    def _on_click(_: Any) -> None:
        a = Approval(plan.fingerprint, getpass.getuser(), utc_now(), "widget")
        path = record(run_dir, a, plan)
        with out:
            print(f"approved: {path}")

    button.on_click(_on_click)
    return widgets.VBox([button, out])
