"""``runbook verify``: every hash a run's evidence names, recomputed offline, in a closed world.

The sealed evidence is checked by :func:`runbook_lib.manifest.verify_evidence` (the phase
records' chain and what each names), the closed world by
:func:`runbook_lib.closedworld.closed_world_rows` (every file of the run is in the seal or a link
after it), and a HOLD run's ``resolution.json`` by :func:`runbook_lib.resolve.verify_resolution`.
This module sits above them, so none imports another.
"""

from __future__ import annotations

from pathlib import Path

from runbook_lib.closedworld import closed_world_rows
from runbook_lib.manifest import verify_evidence
from runbook_lib.resolve import verify_resolution


def verify_run(run_dir: str | Path) -> list[dict[str, str]]:
    """Recompute every hash a run's evidence names, offline, without stopping at the first problem.

    Checks each phase record's link to the record before it, every file a record lists, the
    manifest's records and executed notebooks, the completion marker's files, for a closed-world
    seal every file of the run directory (an unlisted file is ``altered``) and each link after the
    seal, and a HOLD run's ``resolution.json`` when there is one (its content hash, the manifest it
    names, and whether it may resolve this run at all).

    Returns:
        Rows ``{"path", "status", "by"}`` with status ``intact``, ``altered``, ``missing`` or
        ``broken-link``, and ``by`` naming the record or file that vouches for it; one row per
        path and status (several vouchers are joined in ``by``). A file that is both ``intact``
        by one voucher and not by another keeps both rows.
    """
    run_dir = Path(run_dir)
    rows = verify_evidence(run_dir) + closed_world_rows(run_dir) + verify_resolution(run_dir)
    seen: dict[tuple[str, str], dict[str, str]] = {}
    for r in rows:
        key = (r["path"], r["status"])
        if key in seen:
            seen[key]["by"] += f", {r['by']}"
        else:
            seen[key] = dict(r)
    return list(seen.values())
