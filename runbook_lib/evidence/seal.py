"""Seal a run: ``manifest.json`` (what ran, on what, with which inputs, every record and executed
notebook by sha256), then the completion marker ``_SUCCESS``, last.

The headless runner seals after the last notebook is saved, so the manifest also covers phase
06's notebook; an interactive run is sealed by phase 06's last cell (its own notebook is saved
by the person afterwards, so its hash cannot be in the manifest).
"""

from __future__ import annotations

import importlib.metadata as md
import json
import platform
import subprocess
from pathlib import Path
from typing import Any

from runbook_lib import __version__
from runbook_lib._time import utc_now
from runbook_lib.evidence.attestation import write_bundle
from runbook_lib.evidence.closedworld import ATTESTATIONS, seal_listing
from runbook_lib.evidence.manifest import PHASES, read_chain, sha256_file, write_completion_marker, write_json_atomic
from runbook_lib.evidence.records import Chain, FreezeSource
from runbook_lib.evidence.signing import load_signer
from runbook_lib.layout import COMPLETION_MARKER, MANIFEST, RECEIPT, params_sha256, project_root
from runbook_lib.params import Migration

VERSIONED_PACKAGES = ("torch", "papermill", "nbclient", "sentence-transformers", "scikit-learn", "numpy", "pandas",
                      "scipy", "boto3")


LOCK_FILE = "locks/main.txt"
"""The main environment's lock, beside the package in a checkout (the Makefile installs from it)."""


def lock_sha256() -> str | None:
    """sha256 of the lock the running package was installed from (:data:`LOCK_FILE` in the
    checkout that holds ``runbook_lib``), or None where there is none (an installed wheel)."""
    f = Path(__file__).resolve().parents[2] / LOCK_FILE
    return sha256_file(f) if f.is_file() else None


def git_commit(root: Path) -> str | None:
    """``HEAD`` of the project checkout, with ``+dirty`` when tracked files changed; None outside git."""
    try:
        r = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (r.stdout.strip() + ("+dirty" if dirty else "")) if r.returncode == 0 else None


def rehearsal_of(chain: Chain, mig: Migration) -> dict[str, Any] | None:
    """The run's rehearsal marks: the simulators its phases talked to (as their answers said) and
    the params' ``rehearsal`` section; None for a real migration."""
    sims: dict[str, str] = {}
    for d in chain.all_data():
        sims.update(d.simulators)
    if not sims and mig.rehearsal is None:
        return None
    return {"simulators": sims, "params": mig.rehearsal.model_dump() if mig.rehearsal is not None else None}


def notebook_provenance(run_dir: Path) -> dict[str, dict[str, Any]]:
    """What the headless runner wrote into each executed notebook of the run about how its phase
    ran (``metadata.runbook``: ``notebook_source``, ``host_lock``, ``secret_scan``;
    :func:`runbook_lib.run.runner.stamp_provenance`), by phase id. A phase whose notebook is not in
    the run, does not read, or was not run by the runner (papermill alone, JupyterLab) has none."""
    out: dict[str, dict[str, Any]] = {}
    for pid, name in PHASES:
        nb = run_dir / f"{pid}_{name}.ipynb"
        try:
            meta = json.loads(nb.read_text()).get("metadata", {}).get("runbook", {})
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(meta, dict) and meta:
            out[pid] = meta
    return out


def _with_provenance(phases: list[dict[str, Any]], scans: list[dict[str, Any]] | None,
                     stamped: dict[str, dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The manifest's phases and secret scans, each phase's missing provenance (which notebook
    ran it, its wait for the host lock, its scan) filled from its notebook's stamp: a run made
    phase by phase has each phase's provenance in its own notebook, not in the sealing process."""
    phases = [dict(p) for p in phases]
    for entry in phases:
        meta = stamped.get(str(entry.get("phase")), {})
        if entry.get("notebook_source") is None and meta.get("notebook_source"):
            entry["notebook_source"] = meta["notebook_source"]
        lock = meta.get("host_lock")
        if entry.get("lock_wait_s") is None and isinstance(lock, dict) and lock.get("waited_s") is not None:
            entry["lock_wait_s"] = lock["waited_s"]
    have = {str(x.get("phase")) for x in scans or []}
    scans = list(scans or []) + [meta["secret_scan"] for pid, meta in sorted(stamped.items())
                                 if pid not in have and isinstance(meta.get("secret_scan"), dict)]
    return phases, sorted(scans, key=lambda x: str(x.get("phase")))


def sealed_decision(decision: str | None, *, failed: bool) -> str:
    """The decision a seal records: phase 06's (``GO``, ``NO-GO``, ``HOLD``); ``FAILED (decision X)``
    when a phase failed after phase 06 decided X; ``FAILED`` when no decision was reached."""
    if not failed:
        return decision or "FAILED"
    return f"FAILED (decision {decision})" if decision else "FAILED"


def seal_run(run_dir: Path, mig: Migration, params_path: Path, *, decision: str,
             phases: list[dict[str, Any]] | None = None, complete: bool = True,
             extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``manifest.json`` and, when ``complete``, ``_SUCCESS`` after it.

    Args:
        run_dir: the run directory.
        mig: validated params.
        params_path: the params file (its sha256 is recorded).
        decision: ``GO``, ``NO-GO``, ``HOLD`` or ``FAILED ...``.
        phases: per-phase outcomes (status, seconds, reason); from the records when None.
        complete: write the completion marker (False for a failed run).
        extra: more top-level fields (the runner adds its per-phase secret scans).

    Returns:
        The manifest.
    """
    chain = Chain({r.phase: r for r in read_chain(run_dir)})
    freeze = chain.freeze.freeze if chain.freeze is not None else FreezeSource()
    versions: dict[str, str | None] = {}
    for pkg in VERSIONED_PACKAGES:
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    if phases is None:
        phases = [{"phase": r.phase, "status": r.status, "started": r.body.get("started"), "ended": r.body.get("ended")}
                  for r in chain.values()]
    manifest = {
        "run_id": run_dir.name,
        "migration": mig.migration,
        "decision": decision,
        "params_file": params_path.name,
        "params_sha256": params_sha256(params_path),
        "code": {"runbook_lib": __version__, "git_commit": git_commit(project_root(params_path))},
        "runtime": {"python": platform.python_version(), "platform": platform.platform(), **versions,
                    "lock_sha256": lock_sha256()},
        "workload": {"kind": mig.workload.kind, "entry_point": mig.workload.entry_point,
                     "model_id": mig.workload.model_id, "dataset_id": mig.workload.dataset_id},
        "identities": freeze.identity,
        "inputs": {"store": mig.storage.url, "frozen": freeze.frozen.prefix if freeze.frozen else None,
                   "golden": freeze.golden.prefix if freeze.golden else None},
        "outputs": {"run_dir": str(run_dir), "records": {r.path.name: r.sha256 for r in chain.values()},
                    "notebooks": {p.name: sha256_file(p) for p in sorted(run_dir.glob("*.ipynb"))}},
        "phases": phases,
        "rehearsal": rehearsal_of(chain, mig),
        "finished": utc_now(),
        **(extra or {}),
    }
    manifest["phases"], scans = _with_provenance(phases, (extra or {}).get("secret_scans"), notebook_provenance(run_dir))
    if scans:
        manifest["secret_scans"] = scans
    (run_dir / COMPLETION_MARKER).unlink(missing_ok=True)
    for name in ATTESTATIONS:
        (run_dir / name).unlink(missing_ok=True)
    manifest["seal"] = seal_listing(run_dir)
    write_json_atomic(run_dir / MANIFEST, manifest)
    # in-toto statements of each phase and of the decision (runbook_lib.evidence.attestation), signed
    # with evidence.signing_key, else written unsigned
    write_bundle(run_dir, load_signer(mig.evidence.signing_key) if mig.evidence.signing_key else None)
    if complete:  # the completion marker is the last file written, after the signature too
        files = {p: sha256_file(run_dir / p) for p in (MANIFEST, RECEIPT) if (run_dir / p).exists()}
        write_completion_marker(run_dir, files)
    return manifest
