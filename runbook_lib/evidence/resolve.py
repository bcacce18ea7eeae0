"""Resolve a HOLD run: a person decides GO or NO-GO before its deadline, or, once the deadline has
passed with no one deciding, it resolves to NO-GO (docs/reference/gates.md 5.2: "then fail safe").

A HOLD run is already sealed (``manifest.json``, then ``_SUCCESS``) and phase 06 has already
restored the source route and torn the target down. Its evidence is never rewritten: the
resolution is a separate file, ``resolution.json``, that names the sha256 of the
``manifest.json`` it resolves and carries the sha256 of its own content (``content_sha256``),
sealed by a link of its own (:func:`runbook_lib.evidence.closedworld.append_link`); ``runbook verify``
recomputes all three and checks that it may resolve the run at all (:func:`resolution_problem`).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

from runbook_lib._time import iso, parse_iso
from runbook_lib.errors import EXIT_BY_DECISION, EvidenceError, RunbookError, UsageError
from runbook_lib.evidence.closedworld import (
    append_link,
    closed_world_rows,
    read_json_object,
    read_links,
    refuse_symlinks,
    seal_kind,
)
from runbook_lib.evidence.manifest import sha256_file, verify_evidence, write_json_atomic
from runbook_lib.evidence.records import Manifest, Receipt, load_manifest, load_receipt
from runbook_lib.evidence.signing import sign_record
from runbook_lib.evidence.text import MAX_BY, MAX_REASON, checked_text
from runbook_lib.evidence.text import printable as printable  # re-exported: the commands print through it
from runbook_lib.gates import CAPACITY_GATE
from runbook_lib.layout import COMPLETION_MARKER, KEPT_PARAMS, MANIFEST, RECEIPT, RESOLUTION
from runbook_lib.params import load_params

RESOLUTION_FILE = RESOLUTION
DECISIONS = ("GO", "NO-GO")
DEADLINE_BY = "hold deadline (no person decided in time)"
_M = TypeVar("_M", Receipt, Manifest)


def hold_deadline(decided_at: str, deadline_s: float) -> str:
    """When a HOLD decided at ``decided_at`` (ISO) resolves to NO-GO: ``deadline_s`` seconds later (ISO)."""
    return iso(parse_iso(decided_at) + _dt.timedelta(seconds=deadline_s))


def content_sha256(body: dict[str, Any]) -> str:
    """sha256 (hex) of ``body`` without its ``content_sha256`` key, as canonical JSON (sorted keys,
    no whitespace, UTF-8)."""
    rest = {k: v for k, v in body.items() if k != "content_sha256"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class Standing:
    """Where a run stands now.

    Attributes:
        decision: the effective decision (``GO``, ``NO-GO``, ``HOLD``, ``FAILED ...`` or ``?``).
        note: how it came to be (``resolved by alice``, ``hold expired at ...``, ``held until ...``).
        deadline: the hold deadline, for HOLD runs.
        resolution: the ``resolution.json`` body, when there is one.
    """

    decision: str
    note: str = ""
    deadline: _dt.datetime | None = None
    resolution: dict[str, Any] | None = None


def _deadline(run_dir: Path, receipt: Receipt) -> _dt.datetime:
    """The receipt's ``hold_deadline``; for receipts written before it was recorded, the decision
    time plus the run's ``gates.hold_deadline_s``."""
    if receipt.hold_deadline:
        return parse_iso(receipt.hold_deadline)
    return parse_iso(hold_deadline(receipt.decided_at, load_params(run_dir / KEPT_PARAMS).gates.hold_deadline_s))


def _tolerant(load: Callable[[Path], _M | None], run_dir: Path) -> _M | None:
    """``load(run_dir)``, or None when the file is unreadable (``runbook verify`` names it)."""
    try:
        return load(run_dir)
    except EvidenceError:
        return None


def standing(run_dir: str | Path, *, now: _dt.datetime | None = None) -> Standing:
    """The effective decision of a run: a resolution if there is one; NO-GO for a HOLD whose
    deadline has passed (shown, not recorded: ``runbook resolve`` records it); else the sealed
    decision.

    Args:
        now: the current time (injected in tests); default the system clock, UTC.
    """
    run_dir = Path(run_dir)
    now = now or _dt.datetime.now(_dt.timezone.utc)
    manifest = _tolerant(load_manifest, run_dir)
    decision = manifest.decision if manifest else "?"
    res = read_json_object(run_dir / RESOLUTION_FILE)
    ignored = ""
    if res is not None or (run_dir / RESOLUTION_FILE).exists():
        why = resolution_problem(run_dir, res)
        if why is None and res is not None:
            return Standing(str(res.get("decision", "?")),
                            f"HOLD resolved by {res.get('by')} at {res.get('resolved_at')}", resolution=res)
        ignored = f"; {RESOLUTION_FILE} ignored: {why}"
    receipt = _tolerant(load_receipt, run_dir)
    if decision != "HOLD" or receipt is None:
        return Standing(decision, ignored.lstrip("; "))
    deadline = _deadline(run_dir, receipt)
    if now >= deadline:
        return Standing("NO-GO", f"hold expired at {iso(deadline)}{ignored}", deadline)
    return Standing("HOLD", f"a person decides until {iso(deadline)}{ignored}", deadline)


def resolution_problem(run_dir: Path, body: dict[str, Any] | None) -> str | None:
    """Why ``resolution.json`` (its ``body``) cannot resolve this run, whatever it says; None when
    it may. A resolution applies only to a sealed HOLD (manifest decision HOLD, completion marker
    present), names that manifest's sha256, carries its own ``content_sha256``, decides GO or
    NO-GO, decides GO only before the receipt's hold deadline and only as a person, NO-GO by the
    deadline only once it has passed; and, under a closed-world seal, is sealed by exactly one
    ``resolution`` link. Its times are its own word until it is signed (the seal's signature
    covers the evidence it resolves, not when it was written)."""
    if body is None:
        return "not readable JSON"
    if body.get("content_sha256") != content_sha256(body):
        return "its content no longer matches its content_sha256"
    manifest = _tolerant(load_manifest, run_dir)
    if manifest is None or manifest.decision != "HOLD" or not (run_dir / COMPLETION_MARKER).exists():
        return (f"the run is not a sealed HOLD (sealed decision {manifest.decision if manifest else None!r}"
                f"{'' if (run_dir / COMPLETION_MARKER).exists() else ', no ' + COMPLETION_MARKER}): only a HOLD waits "
                "for a person")
    if (body.get("resolves") or {}).get("sha256") != sha256_file(run_dir / MANIFEST):
        return "it names another manifest.json sha256"
    decision, kind = body.get("decision"), body.get("kind")
    if decision not in DECISIONS:
        return f"decision {decision!r} is not one of {list(DECISIONS)}"
    receipt = _tolerant(load_receipt, run_dir)
    if receipt is None:
        return "the run has no readable receipt.json"
    try:
        deadline, at = _deadline(run_dir, receipt), parse_iso(str(body.get("resolved_at")))
    except (ValueError, RunbookError) as exc:
        return f"its resolved_at or the receipt's deadline does not read as a time ({exc})"
    if decision == "GO" and (kind != "person" or at >= deadline):
        return f"GO at {iso(at)} by {kind!r}; GO is a person's, before the hold deadline {iso(deadline)}"
    refused = go_refusal(receipt) if decision == "GO" else None
    if refused:
        return f"GO is not allowed on this run: it {refused}"
    if kind == "deadline" and (decision != "NO-GO" or at < deadline):
        return f"the deadline's resolution must be NO-GO after {iso(deadline)}; it says {decision} at {iso(at)}"
    if seal_kind(run_dir) == "closed":
        sealing = [link for link in read_links(run_dir) if RESOLUTION_FILE in (link.body.get("files") or {})]
        if len(sealing) != 1:
            return (f"{len(sealing)} links seal a {RESOLUTION_FILE}; a resolution is sealed by exactly one "
                    "(a resolution is final)")
    return None


def resolve_run(run_dir: str | Path, *, decision: str | None, by: str | None, reason: str = "",
                now: _dt.datetime | None = None, signer: Any = None) -> dict[str, Any]:
    """Record how a sealed HOLD run was resolved, in ``resolution.json``.

    A person may decide ``GO`` before the hold deadline and ``NO-GO`` at any time. With no
    decision, the run resolves to NO-GO once its deadline has passed (recorded as decided by the
    deadline). The run's evidence must verify intact first.

    Args:
        run_dir: ``reports/<run_id>``.
        decision: ``GO``, ``NO-GO``, or None (deadline expiry).
        by: who decided (required with a decision).
        reason: why, free text.
        now: the current time (injected in tests); default the system clock, UTC.
        signer: the deciding person's key (:func:`runbook_lib.evidence.signing.load_signer`), or None:
            the resolution is then signed into ``resolution.dsse.json``
            (:func:`runbook_lib.evidence.signing.sign_record`), sealed with it by the same link.

    Returns:
        The ``resolution.json`` body as written.

    Raises:
        UsageError: the run directory is or holds a symlink, the run is not a sealed HOLD run, is already resolved, the decision or its
            author is missing or invalid (a control character in ``by`` or ``reason``, or either
            too long: :func:`checked_text`), GO comes after the deadline, or no decision was given
            before the deadline.
        EvidenceError: the run's evidence does not verify.
    """
    run_dir = Path(run_dir)
    refuse_symlinks(run_dir)  # resolution.json and its link are written into the run
    checked_text(reason, what="--reason", max_len=MAX_REASON)
    now = now or _dt.datetime.now(_dt.timezone.utc)
    receipt = _held_receipt(run_dir)
    deadline = _deadline(run_dir, receipt)
    decision, by, kind = _who_decides(run_dir, receipt, decision, by, now=now, deadline=deadline)
    body: dict[str, Any] = {
        "run_id": run_dir.name,
        "resolves": {"file": MANIFEST, "sha256": sha256_file(run_dir / MANIFEST)},
        "receipt_sha256": sha256_file(run_dir / RECEIPT),
        "held_decision": "HOLD",
        "decision": decision,
        "exit_code": EXIT_BY_DECISION[decision],
        "kind": kind,
        "by": by,
        "reason": reason,
        "resolved_at": iso(now),
        "hold_deadline": iso(deadline),
        "rollback": _rollback_note(receipt, decision),
    }
    body["content_sha256"] = content_sha256(body)
    write_json_atomic(run_dir / RESOLUTION_FILE, body)
    files = [RESOLUTION_FILE]
    if signer is not None:
        files.append(sign_record(run_dir / RESOLUTION_FILE, signer, kind="resolution").name)
    append_link(run_dir, "resolution", files, by=by)
    return body


def _held_receipt(run_dir: Path) -> Receipt:
    """The receipt of a sealed, unresolved HOLD run whose evidence verifies.

    Raises:
        UsageError: not sealed, not HOLD, already resolved, or no receipt.
        EvidenceError: the evidence does not verify.
    """
    if not (run_dir / MANIFEST).exists() or not (run_dir / COMPLETION_MARKER).exists():
        raise UsageError(f"{run_dir} is not a sealed run (manifest.json and {COMPLETION_MARKER} needed); only a "
                         "finished HOLD run can be resolved")
    manifest = load_manifest(run_dir)
    if manifest is None or manifest.decision != "HOLD":
        raise UsageError(f"{run_dir.name} was decided {manifest.decision if manifest else None!r}, not HOLD: only a "
                         "HOLD run waits for a person, so there is nothing to resolve")
    existing = read_json_object(run_dir / RESOLUTION_FILE)
    if (run_dir / RESOLUTION_FILE).exists():
        got = f"{existing.get('decision')} by {existing.get('by')} at {existing.get('resolved_at')}" if existing \
            else "unreadable"
        raise UsageError(f"{run_dir.name} is already resolved ({RESOLUTION_FILE}: {printable(got)}); a resolution is "
                         "final")
    bad = [r for r in verify_evidence(run_dir) + closed_world_rows(run_dir) if r["status"] != "intact"]
    if bad:
        raise EvidenceError(f"{run_dir.name}: evidence does not verify ({[(r['path'], r['status']) for r in bad]}); "
                            "a decision cannot rest on it. Run `runbook verify` and investigate, or start a new run.")
    receipt = load_receipt(run_dir)
    if receipt is None:
        raise UsageError(f"{run_dir.name} has no receipt.json: phase 06 never decided it, so there is nothing to resolve")
    return receipt


def _who_decides(run_dir: Path, receipt: Receipt, decision: str | None, by: str | None, *, now: _dt.datetime,
                 deadline: _dt.datetime) -> tuple[str, str, str]:
    """``(decision, by, kind)``: a person's decision, checked, or the deadline's NO-GO.

    Raises:
        UsageError: no decision before the deadline; an unknown decision or no author; GO after
            the deadline, or GO on a run whose phases never ran.
    """
    expired = now >= deadline
    if decision is None:
        if not expired:
            raise UsageError(f"{run_dir.name} is HOLD until {iso(deadline)} (now {iso(now)}); pass --decision GO|NO-GO "
                             "--by NAME to decide, or wait: after the deadline it resolves to NO-GO")
        return "NO-GO", DEADLINE_BY, "deadline"
    if decision not in DECISIONS:
        raise UsageError(f"decision must be one of {list(DECISIONS)}, got {decision!r}")
    if not by or not by.strip():
        raise UsageError("--by NAME is required with --decision: a resolution names the person who decided")
    checked_text(by, what="--by", max_len=MAX_BY)
    if decision == "GO" and expired:
        raise UsageError(f"GO is refused: the hold deadline passed at {iso(deadline)} (now {iso(now)}), so "
                         f"{run_dir.name} resolves to NO-GO; run `runbook resolve {run_dir}` to record that, and "
                         "start a new run to migrate")
    refused = go_refusal(receipt) if decision == "GO" else None
    if refused:
        raise UsageError(f"GO is refused: {run_dir.name} {refused}")
    return decision, by, "person"


def go_refusal(receipt: Receipt) -> str | None:
    """Why a person may not resolve this receipt's HOLD to GO, whatever else holds; None when they
    may. The one rule ``runbook resolve`` applies before it writes and ``verify`` (through
    :func:`resolution_problem`) applies to a resolution already written:

    * phases never ran (a dry run, a phase that did not complete): a person may judge
      inconclusive measurements, not evidence that was never collected;
    * no candidate was proven (``target_capacity`` not PASS, :mod:`runbook_lib.phases.candidates`):
      no target got the machines it needs, so there is nothing to accept; the run's ``retry_at``
      says when a new run may find them;
    * a blocking gate failed: that is a NO-GO no person can overrule (a sealed HOLD never holds
      one unless its receipt was edited).
    """
    unrun = [x for x in receipt.gates if x.name in ("dry_run", "phases_complete") and x.verdict != "PASS"]
    if unrun:
        return (f"holds because phases never ran ({[x.name for x in unrun]}: {unrun[0].detail}). A person may judge "
                "inconclusive measurements, not evidence that was never collected: decide NO-GO or start a new run")
    capacity = [x for x in receipt.gates if x.name == CAPACITY_GATE and x.verdict != "PASS"]
    if capacity:
        return (f"holds because no candidate was proven ({CAPACITY_GATE} {capacity[0].verdict}: {capacity[0].detail}). "
                "There is no target to accept: decide NO-GO or start a new run once capacity is back")
    failed = [x.name for x in receipt.gates if x.blocking and x.verdict == "FAIL"]
    if failed:
        return (f"has a blocking gate failed ({failed}): a failed blocking gate is NO-GO, which no person can "
                "overrule; decide NO-GO")
    return None


def _rollback_note(receipt: Receipt, decision: str) -> str:
    """What rolling back needs now that the HOLD is resolved (phase 06 already restored the source)."""
    route = receipt.route or {}
    remaining = receipt.resources.remaining
    note = (f"phase 06 restored the source route (target at {route.get('target_percent', 0)} %) and tore the "
            "target down when it held" + (f"; {len(remaining)} resource(s) are still present: destroy them"
                                          if remaining else "; nothing is left to roll back"))
    if decision == "GO":
        note += ". GO accepts this run's evidence; the cutover itself needs a new run, since the target was torn down"
    return note


def verify_resolution(run_dir: str | Path) -> list[dict[str, str]]:
    """Rows (``path``, ``status``, ``by``) for ``resolution.json``, as :func:`verify.verify_run`
    reports them: ``altered`` when its content no longer matches its ``content_sha256`` (or it is
    not JSON) or when it cannot resolve this run (:func:`resolution_problem`: not a sealed HOLD,
    GO after the deadline, sealed more than once), ``broken-link`` when the ``manifest.json`` it
    resolves has a different sha256 now; no rows when there is no resolution."""
    run_dir = Path(run_dir)
    path = run_dir / RESOLUTION_FILE
    if not path.exists():
        return []
    body = read_json_object(path)
    if body is None or body.get("content_sha256") != content_sha256(body):
        return [{"path": RESOLUTION_FILE, "status": "altered", "by": "its content_sha256"}]
    rows = [{"path": RESOLUTION_FILE, "status": "intact", "by": "its content_sha256"}]
    manifest = run_dir / MANIFEST
    want = (body.get("resolves") or {}).get("sha256")
    if not manifest.exists() or sha256_file(manifest) != want:
        rows.append({"path": RESOLUTION_FILE, "status": "broken-link",
                     "by": "names a manifest.json sha256 that differs from the run's manifest.json"})
        return rows
    why = resolution_problem(run_dir, body)
    if why is not None:
        rows.append({"path": RESOLUTION_FILE, "status": "altered", "by": f"cannot resolve this run: {why}"})
    return rows


