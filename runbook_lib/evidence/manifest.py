"""Run directories, phase records chained by sha256, the run manifest and the completion marker.

A run directory ``reports/<run_id>/`` holds, per phase, the executed notebook and a record
``NN_<phase>.json``. Each record names the sha256 of the record before it (``prev_sha256``) and
of every file the phase produced, so a reader can check that nothing was altered or dropped.
``_SUCCESS`` is written last, after ``receipt.json`` and ``manifest.json``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runbook_lib._fs import atomic_write
from runbook_lib._time import utc_now
from runbook_lib.errors import EvidenceError
from runbook_lib.layout import COMPLETION_MARKER, KEPT_PARAMS, MANIFEST

PHASES: tuple[tuple[str, str], ...] = (
    ("01", "freeze_source"),
    ("02", "map_target"),
    ("03", "prove_parity"),
    ("04", "compare_production"),
    ("05", "cutover"),
    ("06", "accept_or_rollback"),
)
"""Phase ids and names, in order; notebook ``NN_<name>.ipynb`` and record ``NN_<name>.json``."""

PHASE_PLOTS: dict[str, tuple[str, ...]] = {
    "04": ("04/latency_cdf.png", "04/throughput.png", "04/cost.png"),
}
"""The plots each phase writes (paths in the run) and must show in its executed notebook, each as
an ``image/png`` output whose metadata names it (``PLOT_METADATA_KEY``); the runner fails a phase
whose notebook lacks one (:func:`runbook_lib.run.runner.missing_plots`)."""

PLOT_METADATA_KEY = "runbook_plot"
"""Key in an image output's ``image/png`` metadata naming the plot file it shows."""

RECORD_SCHEMA_VERSION = 1
"""Version of a phase record's shape (:mod:`runbook_lib.evidence.records` models it), written into each
record as ``schema_version``; a record without it predates the field and has version 1's shape."""
GENESIS = "0" * 64  # prev_sha256 of the first record


def new_run_id(migration: str) -> str:
    """``<UTC yyyymmddThhmmssZ>-<migration>-<6 hex>``, sortable by start time."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{migration}-{secrets.token_hex(3)}"


def sha256_file(path: str | Path, *, chunk_bytes: int = 1 << 20) -> str:
    """sha256 hex digest of a file, read in ``chunk_bytes`` chunks (constant memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            h.update(chunk)
    return h.hexdigest()


def write_json_atomic(path: str | Path, data: Any) -> str:
    """Write ``data`` as indented JSON via a temporary file, fsync and rename.

    Returns:
        sha256 hex of the bytes written.
    """
    payload = (json.dumps(data, indent=2, sort_keys=True, default=jsonable) + "\n").encode()
    return atomic_write(Path(path), [payload])[1]


def jsonable(value: Any) -> Any:
    """What :func:`json.dumps` writes for a value it cannot: a pydantic model or a dataclass as
    its JSON form (field aliases kept), anything else as ``str(value)``. A model's fields are
    written as they hold their values (an ``int`` in a ``float`` field stays ``5``), without
    pydantic's serializer warnings: the record models are checked on write and on every read
    (:mod:`runbook_lib.evidence.records`), which is where a wrong type is an error."""
    from pydantic import BaseModel
    from pydantic_core import to_jsonable_python

    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, warnings=False, fallback=str)
    return to_jsonable_python(value, by_alias=True, fallback=str)


def phase_name(phase: str) -> str:
    """``"03"`` -> ``"03_prove_parity"``.

    Raises:
        EvidenceError: unknown phase id.
    """
    for pid, name in PHASES:
        if pid == phase:
            return f"{pid}_{name}"
    raise EvidenceError(f"unknown phase {phase!r}; known phases are {[p for p, _ in PHASES]}")


@dataclass(frozen=True)
class Record:
    """A phase record as read back: its JSON body and the sha256 of its file bytes. Its ``data``
    is read through :mod:`runbook_lib.evidence.records`, which types it."""

    phase: str
    path: Path
    sha256: str
    body: dict[str, Any]

    @property
    def status(self) -> str:
        return str(self.body.get("status", ""))


def read_chain(run_dir: str | Path, *, before: str | None = None) -> list[Record]:
    """Read every phase record (optionally only those before phase ``before``) and verify the chain.

    Each record's ``prev_sha256`` must equal the sha256 of the previous existing record's bytes
    (the first names :data:`GENESIS`), and every file it lists must still hash to its value.

    Raises:
        EvidenceError: a record's link or a listed file's hash does not match, or a file is gone.
    """
    run_dir = Path(run_dir)
    out: list[Record] = []
    prev = GENESIS
    for pid, _ in PHASES:
        if before is not None and pid >= before:
            break
        path = run_dir / f"{phase_name(pid)}.json"
        if not path.exists():
            continue
        digest = sha256_file(path)
        body = json.loads(path.read_text())
        if body.get("prev_sha256") != prev:
            raise EvidenceError(
                f"{path.name}: prev_sha256 {body.get('prev_sha256')!r} does not match the previous "
                f"record's sha256 {prev!r}; the evidence chain is broken. Re-run the migration."
            )
        for rel, want in body.get("files", {}).items():
            f = run_dir / rel
            if not f.exists():
                raise EvidenceError(f"{path.name} lists {rel}, which is missing from {run_dir}")
            if sha256_file(f) != want:
                raise EvidenceError(f"{rel} was altered after {path.name} recorded it (sha256 differs)")
        out.append(Record(pid, path, digest, body))
        prev = digest
    return out


def require_records(run_dir: str | Path, phase: str, needed: tuple[str, ...]) -> dict[str, Record]:
    """Verified records of the phases ``needed`` that precede ``phase``, by phase id.

    Raises:
        EvidenceError: a needed record is missing, failed, or the chain is broken.
    """
    chain = {r.phase: r for r in read_chain(run_dir, before=phase)}
    for pid in needed:
        rec = chain.get(pid)
        if rec is None:
            raise EvidenceError(
                f"phase {phase} needs the record of phase {pid} ({phase_name(pid)}.json) in {run_dir}, "
                f"which is missing. Run phase {pid} first (`runbook phase {pid} ...`)."
            )
        if rec.status != "completed":
            raise EvidenceError(f"phase {phase} needs phase {pid} completed; its record says {rec.status!r}")
    return chain


def write_record(
    run_dir: str | Path,
    phase: str,
    *,
    status: str,
    data: dict[str, Any],
    files: list[str] | tuple[str, ...] = (),
    started: str | None = None,
) -> Record:
    """Write ``NN_<phase>.json`` linked to the previous record.

    Args:
        run_dir: the run directory.
        phase: phase id, ``"01"`` .. ``"06"``.
        status: ``completed`` or ``failed`` (the runner writes ``failed`` records).
        data: JSON-serialisable evidence of the phase.
        files: paths relative to ``run_dir`` produced by the phase; each is hashed into the record.
        started: ISO time the phase started.

    Returns:
        The record as written.

    Raises:
        EvidenceError: the chain before this phase is broken, or a listed file is missing.
    """
    run_dir = Path(run_dir)
    chain = read_chain(run_dir, before=phase)
    prev = chain[-1].sha256 if chain else GENESIS
    hashed: dict[str, str] = {}
    for rel in files:
        f = run_dir / rel
        if not f.exists():
            raise EvidenceError(f"phase {phase} lists {rel} as produced, but {f} does not exist")
        hashed[rel] = sha256_file(f)
    body = {
        "schema_version": RECORD_SCHEMA_VERSION,
        "phase": phase,
        "name": phase_name(phase),
        "status": status,
        "started": started,
        "ended": utc_now(),
        "prev_sha256": prev,
        "files": hashed,
        "data": data,
    }
    path = run_dir / f"{phase_name(phase)}.json"
    digest = write_json_atomic(path, body)
    return Record(phase, path, digest, json.loads(path.read_text()))


def write_completion_marker(run_dir: str | Path, files: dict[str, str]) -> Path:
    """Write ``_SUCCESS`` (last) listing the sha256 of the run's final files."""
    path = Path(run_dir) / COMPLETION_MARKER
    write_json_atomic(path, {"completed": utc_now(), "files": files})
    return path


def verify_evidence(run_dir: str | Path) -> list[dict[str, str]]:
    """Recompute every hash the sealed evidence names, offline, without stopping at the first
    problem: each phase record's link to the record before it, every file a record lists, the
    manifest's records and executed notebooks, and the completion marker's files. (What is
    written after the seal, ``resolution.json``, is checked by :mod:`runbook_lib.audit.verify`.)

    Returns:
        Rows ``{"path", "status", "by"}`` with status ``intact``, ``altered``, ``missing`` or
        ``broken-link``, and ``by`` naming the record or file that vouches for it.
    """
    run_dir = Path(run_dir)
    rows: list[dict[str, str]] = []

    def check(rel: str, want: str, by: str) -> None:
        f = run_dir / rel
        status = "missing" if not f.exists() else ("intact" if sha256_file(f) == want else "altered")
        rows.append({"path": rel, "status": status, "by": by})

    prev = GENESIS
    for pid, _ in PHASES:
        path = run_dir / f"{phase_name(pid)}.json"
        if not path.exists():
            continue
        digest = sha256_file(path)
        try:
            body = json.loads(path.read_text())
        except json.JSONDecodeError:
            rows.append({"path": path.name, "status": "altered", "by": "not valid JSON"})
            prev = digest
            continue
        linked = body.get("prev_sha256") == prev
        rows.append({"path": path.name, "status": "intact" if linked else "broken-link",
                     "by": "previous record" if linked else "prev_sha256 does not match the record before it"})
        for rel, want in body.get("files", {}).items():
            check(rel, want, path.name)
        prev = digest
    manifest = run_dir / MANIFEST
    if manifest.exists():
        m = json.loads(manifest.read_text())
        if (run_dir / KEPT_PARAMS).exists() and m.get("params_sha256"):
            check(KEPT_PARAMS, m["params_sha256"], MANIFEST)
        for name, want in {**m.get("outputs", {}).get("records", {}), **m.get("outputs", {}).get("notebooks", {})}.items():
            check(name, want, MANIFEST)
    marker = run_dir / COMPLETION_MARKER
    if marker.exists():
        for name, want in json.loads(marker.read_text()).get("files", {}).items():
            check(name, want, COMPLETION_MARKER)
    elif manifest.exists():
        rows.append({"path": COMPLETION_MARKER, "status": "missing", "by": "a sealed run ends with it"})
    return rows
