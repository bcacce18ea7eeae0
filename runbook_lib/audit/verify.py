"""``runbook verify``: every hash a run's evidence names, recomputed offline, in a closed world.

The sealed evidence is checked by :func:`runbook_lib.evidence.manifest.verify_evidence` (the phase
records' chain and what each names), the closed world by
:func:`runbook_lib.evidence.closedworld.closed_world_rows` (every file of the run is in the seal or a link
after it), a HOLD run's ``resolution.json`` by :func:`runbook_lib.evidence.resolve.verify_resolution`, and
with the people's public keys the signatures of what people decided (:func:`person_signature_rows`).
This module sits above them, so none imports another.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runbook_lib.errors import EvidenceError
from runbook_lib.evidence.closedworld import closed_world_rows, read_json_object, seal_kind
from runbook_lib.evidence.manifest import PHASES, sha256_file, verify_evidence
from runbook_lib.evidence.records import load_manifest
from runbook_lib.evidence.resolve import verify_resolution
from runbook_lib.evidence.signing import envelope_keyids, record_envelope, record_signature_problems
from runbook_lib.layout import MANIFEST, RESOLUTION


def unreadable_manifest(run_dir: str | Path) -> str | None:
    """Why the run's ``manifest.json`` cannot be read (not JSON, not the manifest's shape), naming
    the file; None when it reads or is absent. Nothing the manifest vouches for can be checked
    without it, so a run whose manifest does not read is ALTERED, named, never a crash."""
    try:
        load_manifest(Path(run_dir))
    except (EvidenceError, OSError, ValueError) as exc:
        return f"{MANIFEST} cannot be read: {exc}"
    return None


def incomplete_rows(run_dir: str | Path) -> list[dict[str, str]]:
    """What a closed-world sealed run lacks of the evidence the headless runner writes for every
    phase that ran (each phase with a record): its executed notebook beside its record
    (``NN_<phase>.ipynb``), and in ``manifest.json`` which notebook ran it (``notebook_source``),
    its wait for the host lock (``lock_wait_s``) and its secret scan (``secret_scans``). A run
    whose notebooks papermill or JupyterLab ran without the runner lacks them: its hashes may all
    agree, but nothing says its notebooks were the ones shown, its files were scanned for
    credentials, or its timed phases ran alone.

    Returns:
        Rows ``{"path": "NN_<phase>.ipynb", "status": "incomplete", "by"}``, one per phase that
        lacks something, ``by`` naming each missing item;
        empty for a complete run, an unsealed one, or an older open-world (legacy) seal, whose
        runner did not write all of these yet.
    """
    run_dir = Path(run_dir)
    if seal_kind(run_dir) != "closed":
        return []
    manifest = read_json_object(run_dir / MANIFEST) or {}
    entries = {str(p.get("phase")): p for p in manifest.get("phases") or [] if isinstance(p, dict)}
    scanned = {str(x.get("phase")) for x in manifest.get("secret_scans") or [] if isinstance(x, dict)}
    rows = []
    for pid, name in PHASES:
        if not (run_dir / f"{pid}_{name}.json").is_file():
            continue
        entry = entries.get(pid, {})
        if entry.get("status") == "interrupted" and not (run_dir / f"{pid}_{name}.ipynb").exists():
            continue  # stopped by a signal while it waited for the host lock: no notebook ever ran
        missing = [f"phase {pid}'s executed notebook, beside its record"] if not (
            run_dir / f"{pid}_{name}.ipynb").is_file() else []
        missing += [f"phase {pid}'s {what} in {MANIFEST}" for key, what in (
            ("notebook_source", "notebook provenance (notebook_source: which notebook ran it)"),
            ("lock_wait_s", "host-lock record (lock_wait_s)")) if entry.get(key) is None]
        if pid not in scanned:
            missing.append(f"phase {pid}'s secret scan (secret_scans) in {MANIFEST}")
        if missing:
            rows.append({"path": f"{pid}_{name}.ipynb", "status": "incomplete",
                         "by": "missing " + "; ".join(missing) + " (`runbook run` and `runbook phase` write them)"})
    return rows


def verify_run(run_dir: str | Path) -> list[dict[str, str]]:
    """Recompute every hash a run's evidence names, offline, without stopping at the first problem.

    Checks each phase record's link to the record before it, every file a record lists, the
    manifest's records and executed notebooks, the completion marker's files, for a closed-world
    seal every file of the run directory (an unlisted file is ``altered``) and each link after the
    seal, and a HOLD run's ``resolution.json`` when there is one (its content hash, the manifest it
    names, and whether it may resolve this run at all).

    A run that lacks what the runner writes for every phase is ``incomplete`` (:func:`incomplete_rows`).

    Returns:
        Rows ``{"path", "status", "by"}`` with status ``intact``, ``altered``, ``missing``,
        ``broken-link`` or ``incomplete``, and ``by`` naming the record or file that vouches for it; one row per
        path and status (several vouchers are joined in ``by``). A file that is both ``intact``
        by one voucher and not by another keeps both rows.
    """
    run_dir = Path(run_dir)
    unreadable = unreadable_manifest(run_dir)
    if unreadable:
        return [{"path": MANIFEST, "status": "altered", "by": unreadable}]
    rows = (verify_evidence(run_dir) + closed_world_rows(run_dir) + verify_resolution(run_dir)
            + incomplete_rows(run_dir))
    seen: dict[tuple[str, str], dict[str, str]] = {}
    for r in rows:
        key = (r["path"], r["status"])
        if key in seen:
            seen[key]["by"] += f", {r['by']}"
        else:
            seen[key] = dict(r)
    return list(seen.values())


def person_records(run_dir: str | Path) -> list[tuple[str, Path, Path | None]]:
    """The records in a run that a person made and may have signed, each as ``(what, record,
    envelope or None)``: ``resolution.json`` (``runbook resolve``) and each approval a person
    gave through an approval file (``runbook approve``; the file's copy in ``approvals/`` when it
    was signed, else the approval record itself). Approvals by params or by the run's own
    teardown are no person's and are not listed."""
    run_dir = Path(run_dir)
    out: list[tuple[str, Path, Path | None]] = []
    res = run_dir / RESOLUTION
    if res.is_file():
        env = record_envelope(res)
        out.append(("resolution", res, env if env.is_file() else None))
    for rec in sorted((run_dir / "approvals").glob("*.json")):
        if rec.name.startswith(("pending-", "signed-")) or rec.name.endswith(".dsse.json"):
            continue
        body = read_json_object(rec) or {}
        if not str((body.get("approval") or {}).get("method", "")).startswith("file:"):
            continue
        kept = body.get("signed_file")
        if kept and (run_dir / "approvals" / str(kept)).is_file():
            copy = run_dir / "approvals" / str(kept)
            env = record_envelope(copy)
            out.append((f"approval {rec.name}", copy, env if env.is_file() else None))
        else:
            out.append((f"approval {rec.name}", rec, None))
    return out


def person_signature_rows(run_dir: str | Path, keys: list[Any]) -> list[dict[str, str]]:
    """Rows for each person's record (:func:`person_records`) checked against ``keys`` (the
    public keys of the people who may sign): ``intact`` when one of them signed it as it is now,
    else ``altered`` naming why; an unsigned record fails (no downgrade)."""
    import json

    rows = []
    for what, record, env in person_records(run_dir):
        envelope = json.loads(env.read_text()) if env is not None else None
        problems = record_signature_problems(record.name, sha256_file(record), envelope, keys)
        rel = str(record.relative_to(Path(run_dir)))
        rows += ([{"path": rel, "status": "intact", "by": f"{what}: signed by {', '.join(envelope_keyids(envelope or {}))} "
                                                           "(--person-key)"}] if not problems else
                 [{"path": rel, "status": "altered", "by": f"{what}: {p}"} for p in problems])
    return rows
