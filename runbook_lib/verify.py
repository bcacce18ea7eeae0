"""``runbook verify``: every hash a run's evidence names, recomputed offline.

The sealed evidence is checked by :func:`runbook_lib.manifest.verify_evidence`; what is written
after the seal (a HOLD run's ``resolution.json``) by :func:`runbook_lib.resolve.verify_resolution`.
This module sits above both, so neither imports the other.
"""

from __future__ import annotations

from pathlib import Path

from runbook_lib.manifest import verify_evidence
from runbook_lib.resolve import verify_resolution


def verify_run(run_dir: str | Path) -> list[dict[str, str]]:
    """Recompute every hash a run's evidence names, offline, without stopping at the first problem.

    Checks each phase record's link to the record before it, every file a record lists, the
    manifest's records and executed notebooks, the completion marker's files, and a HOLD run's
    ``resolution.json`` when there is one (its own content hash and the manifest it names).

    Returns:
        Rows ``{"path", "status", "by"}`` with status ``intact``, ``altered``, ``missing`` or
        ``broken-link``, and ``by`` naming the record or file that vouches for it; one row per
        path and status (several vouchers are joined in ``by``).
    """
    rows = verify_evidence(run_dir) + verify_resolution(run_dir)
    seen: dict[tuple[str, str], dict[str, str]] = {}
    for r in rows:
        key = (r["path"], r["status"])
        if key in seen:
            seen[key]["by"] += f", {r['by']}"
        else:
            seen[key] = dict(r)
    return list(seen.values())
