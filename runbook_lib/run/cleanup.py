"""Tear down everything a run created, outside the phase notebooks: after Ctrl-C or SIGTERM
stopped a run, after a dead kernel, or whenever ``runbook cleanup <run_dir>`` is asked to.

Resources are found through each provider's own listing, filtered by the run's ``run_id`` label
(every launch carries it), so nothing depends on what a dead kernel remembered. Each destroy is
planned, shown, and applied under the approval of the launch that created the resource (the
same rule as phase 06: the fingerprint of a destroy names an id nobody could approve in
advance, and tearing down only stops spending); the approval record is kept in the run's
``approvals/``. A resource without this run's label is never touched here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from runbook_lib._time import utc_now
from runbook_lib.errors import FULL_DISK, NotFound, RunbookError, os_error_line
from runbook_lib.evidence import approvals
from runbook_lib.evidence.closedworld import append_link, refuse_symlinks
from runbook_lib.evidence.manifest import sha256_file, write_json_atomic
from runbook_lib.evidence.records import read_unchecked
from runbook_lib.layout import CLEANUP_RECORD, KEPT_PARAMS, STATE_DIR
from runbook_lib.params import Migration, load_params
from runbook_lib.providers import create_provider


@dataclass
class CleanupResult:
    """What a cleanup found and did.

    Attributes:
        run_id: the run whose label was searched for.
        found: ``{"side", "provider", "id", "name", "state", "role", "phase"}`` per resource.
        destroyed: ids destroyed by this cleanup and verified gone.
        already_gone: ids listed as destroyed already (nothing to do).
        remaining: ``{"id", "provider", "state", "why"}`` for what is still there.
        unlisted: ``"<side> (<provider>): <error>"`` where a provider could not be listed.
        dry_run: plans shown, nothing applied.
        teardowns: the provider's :class:`~runbook_lib.providers.base.Teardown` records.
        unrecorded: what could not be written for want of disk (a destroy's approval record,
            ``cleanup.json``), each with the path and free space; the teardown went on without it.
    """

    run_id: str
    found: list[dict[str, Any]] = field(default_factory=list)
    destroyed: list[str] = field(default_factory=list)
    already_gone: list[str] = field(default_factory=list)
    remaining: list[dict[str, Any]] = field(default_factory=list)
    unlisted: list[str] = field(default_factory=list)
    dry_run: bool = False
    teardowns: list[dict[str, Any]] = field(default_factory=list)
    unrecorded: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """True when nothing the run created is left and every provider could be listed."""
        return not self.remaining and not self.unlisted

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "clean": self.clean}


class CleanupAborted(RunbookError):
    """A second interrupt arrived while the cleanup was tearing resources down."""


def project_of_run(run_dir: Path) -> Path:
    """The project a run directory belongs to: the nearest ancestor holding ``pyproject.toml``,
    else the parent of its ``reports/`` directory (where ``.runbook/`` lives)."""
    run_dir = run_dir.resolve()
    for d in run_dir.parents:
        if (d / "pyproject.toml").exists():
            return d
    return run_dir.parent.parent


def cleanup_run(run_dir: str | Path, *, mig: Migration | None = None, project: str | Path | None = None,
                dry_run: bool = False, echo: Callable[[str], None] = print) -> CleanupResult:
    """Find every resource labelled with the run's id on the providers its params name (the
    source's, the target's and each documented alternate's that phase 03 tried), and
    destroy each one (``dry_run``: show the plans only). Writes ``cleanup.json`` in the run; after
    the run's seal, ``cleanup.json`` and the teardown approval records are sealed as a link
    (:func:`runbook_lib.evidence.closedworld.append_link`).

    Args:
        run_dir: ``reports/<run_id>`` (its ``params.yaml`` names the providers).
        mig: the run's params, when the caller has them loaded.
        project: the project whose ``.runbook/`` holds local state (default :func:`project_of_run`).
        dry_run: list and show plans, destroy nothing.
        echo: progress lines.

    Returns:
        The :class:`CleanupResult`.

    Raises:
        UsageError: the run directory is, or holds, a symlink (before anything is listed or written).
        CleanupAborted: raised out of ``echo`` or a provider call by an interrupt handler; the
            resources not yet destroyed are still listed by the next ``runbook cleanup``.
    """
    refuse_symlinks(Path(run_dir))  # its record and approvals are written into the run
    run_dir = Path(run_dir).resolve()
    mig = mig or load_params(run_dir / KEPT_PARAMS)
    root = Path(project).resolve() if project else project_of_run(run_dir)
    run_id = run_dir.name
    res = CleanupResult(run_id, dry_run=dry_run)
    before = _approval_records(run_dir)
    seen: set[tuple[str, str]] = set()
    tried = read_unchecked(run_dir).parity
    names = {mig.target.name, *(tried.tried() if tried is not None else ())}
    for side, prof in (("source", mig.source), *(("target", c) for c in mig.candidates if c.name in names)):
        prov = create_provider(prof.provider, root=root / STATE_DIR / prof.provider, profile=prof)
        try:
            _clean_side(prov, side, prof.provider, run_dir, res, seen, dry_run=dry_run, echo=echo)
        finally:
            close = getattr(prov, "close", None)  # a remote provider's HTTP client; the local one holds none
            if close is not None:
                close()

    try:
        write_json_atomic(run_dir / CLEANUP_RECORD, {"at": utc_now(), **res.to_dict()})
        written = [rel for rel, digest in _approval_records(run_dir).items() if before.get(rel) != digest]
        append_link(run_dir, "cleanup", [CLEANUP_RECORD, *written])
    except OSError as exc:
        if exc.errno not in FULL_DISK:
            raise
        res.unrecorded.append(f"{CLEANUP_RECORD}: {os_error_line(exc)}")
        echo(f"  {CLEANUP_RECORD} not written: {os_error_line(exc)}")
    return res


def _clean_side(prov: Any, side: str, provider: str, run_dir: Path, res: CleanupResult, seen: set[tuple[str, str]],
                *, dry_run: bool, echo: Callable[[str], None]) -> None:
    """List what ``prov`` holds labelled with the run, and destroy each (or, with ``dry_run``,
    plan it), adding to ``res``; ``seen`` skips what the other side's provider listed already."""
    try:
        listed = prov.list(labels={"run_id": res.run_id})
    except CleanupAborted:
        raise
    except RunbookError as exc:
        res.unlisted.append(f"{side} ({provider}): {exc}")
        echo(f"  {side} ({provider}): could not list: {exc}")
        return
    for r in listed:
        if (prov.name, r.id) in seen:  # both sides on one provider list the same resources
            continue
        seen.add((prov.name, r.id))
        row = {"side": r.labels.get("side", side), "provider": prov.name, "id": r.id, "name": r.name,
               "state": r.state, "role": r.labels.get("role"), "phase": r.labels.get("phase")}
        res.found.append(row)
        if r.state == "DESTROYED":
            res.already_gone.append(r.id)
            continue
        plan = prov.plan_destroy(r.id, dry_run=dry_run)
        echo(f"  destroy {r.id} ({r.name}, {row['role']}, {r.state}) on {prov.name}: plan {plan.fingerprint[:16]}")
        if dry_run:
            res.remaining.append({"id": r.id, "provider": prov.name, "state": r.state, "why": "dry run"})
            continue
        try:
            a = approvals.run_teardown(plan, run_dir)
        except OSError as exc:  # a full disk never keeps a machine billing: destroy, and say what is unrecorded
            if exc.errno not in FULL_DISK:
                raise
            a = approvals.Approval(plan.fingerprint, "runbook", utc_now(), approvals.RUN_TEARDOWN)
            res.unrecorded.append(f"approval of destroying {r.id}: {os_error_line(exc)}")
            echo(f"  the approval record of destroying {r.id} is not written ({os_error_line(exc)}); destroying it")
        try:
            done = prov.apply(plan, a)
        except CleanupAborted:
            raise
        except RunbookError as exc:
            res.remaining.append({"id": r.id, "provider": prov.name, "state": r.state, "why": str(exc)})
            continue
        res.teardowns.append(asdict(done) if done is not None else {})
        try:
            after = prov.get(r.id).state
        except NotFound:
            after = "DESTROYED"
        if after == "DESTROYED":
            res.destroyed.append(r.id)
        else:
            res.remaining.append({"id": r.id, "provider": prov.name, "state": after,
                                  "why": "still listed after the destroy"})


def _approval_records(run_dir: Path) -> dict[str, str]:
    """``{approvals/<name>.json: sha256}`` of the run's approval records now."""
    return {f"approvals/{p.name}": sha256_file(p) for p in sorted((run_dir / "approvals").glob("*.json"))}


def summary(res: CleanupResult) -> str:
    """One line: what was destroyed and what is left."""
    left = [f"{r['id']} ({r['provider']}, {r['state']}: {r['why']})" for r in res.remaining]
    parts = [f"destroyed {res.destroyed or 'nothing'}"]
    if res.already_gone:
        parts.append(f"already gone {res.already_gone}")
    parts.append(f"left {left or 'nothing'}")
    if res.unlisted:
        parts.append(f"not listed {res.unlisted}")
    return "; ".join(parts)
