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
from runbook_lib.evidence.attestation import attestation_problems
from runbook_lib.evidence.closedworld import BUNDLE, closed_world_rows, read_json_object, seal_kind
from runbook_lib.evidence.completeness import missing_provenance
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
    phase that ran (:func:`runbook_lib.evidence.completeness.missing_provenance`: the executed
    notebook, its provenance, its host-lock wait, a clean secret scan).

    Returns:
        Rows ``{"path": "NN_<phase>.ipynb", "status": "incomplete", "by"}``, one per phase that
        lacks something, ``by`` naming each missing item; empty for a complete run, an unsealed
        one, or an older open-world (legacy) seal.
    """
    return [{"path": f"{pid}_{dict(PHASES)[pid]}.ipynb", "status": "incomplete",
             "by": "missing " + "; ".join(f"phase {pid}'s {m}" for m in missing)
                   + " (`runbook run` and `runbook phase` write them)"}
            for pid, missing in missing_provenance(Path(run_dir)).items()]


def attestation_rows(run_dir: str | Path) -> list[dict[str, str]]:
    """Rows for a closed-world sealed run's in-toto bundle (:mod:`runbook_lib.evidence.attestation`),
    checked without a key: ``intact`` when every statement is the one the run's files give now,
    else ``altered`` naming each difference (a statement edited, added, replayed, dropped or
    reordered). A run sealed before the bundle (its one statement is checked with ``verify --key``)
    and an unsealed or legacy run have none."""
    run_dir = Path(run_dir)
    if seal_kind(run_dir) != "closed":
        return []
    name, problems = attestation_problems(run_dir, None)
    if not problems:
        return [{"path": name, "status": "intact", "by": "its statements attest the run as it is"}] if name == BUNDLE \
            else []
    return [{"path": name, "status": "altered", "by": p} for p in problems]


def verify_run(run_dir: str | Path) -> list[dict[str, str]]:
    """Recompute every hash a run's evidence names, offline, without stopping at the first problem.

    Checks each phase record's link to the record before it, every file a record lists, the
    manifest's records and executed notebooks, the completion marker's files, for a closed-world
    seal every file of the run directory (an unlisted file is ``altered``) and each link after the
    seal, a HOLD run's ``resolution.json`` when there is one (its content hash, the manifest it
    names, and whether it may resolve this run at all), and the run's in-toto bundle
    (:func:`attestation_rows`).

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
            + attestation_rows(run_dir) + incomplete_rows(run_dir))
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
