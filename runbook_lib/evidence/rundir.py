"""A run directory's lifecycle: created once, opened by every phase after it, sealed at the end.

``reports/<run_id>/`` belongs to one params file: :meth:`RunDir.create` copies the params into it
(``params.yaml``), and :meth:`RunDir.open` refuses params whose bytes differ, a run that is sealed
(``_SUCCESS`` present: its evidence is final), and a directory that is not a run. The runner, the
``runbook phase`` command and an interactive notebook all reach a run through this class, and all
paths (the reports, the providers' state under ``.runbook/``, a ``file://`` store) resolve against
the project root, never the process's working directory.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runbook_lib.errors import EvidenceError, UsageError
from runbook_lib.evidence.closedworld import refuse_symlinks
from runbook_lib.evidence.manifest import (
    PHASES,
    Record,
    new_run_id,
    read_chain,
    require_records,
    write_json_atomic,
    write_record,
)
from runbook_lib.layout import COMPLETION_MARKER, KEPT_PARAMS, REPORTS_DIR, STATE_DIR, params_sha256, project_root
from runbook_lib.params import Migration, load_params

NEEDS: dict[str, tuple[str, ...]] = {
    "01": (),
    "02": ("01",),
    "03": ("01", "02"),
    "04": ("01", "02", "03"),
    "05": ("01", "04"),
    "06": (),
}
"""Records each phase requires (phase 06 reads whatever exists: a stopped or failed run is still
decided and torn down)."""


def _load(params_path: str | Path) -> tuple[Path, Migration, Path]:
    """The params file made absolute, its validated params, and its project root.

    Raises:
        ParamsError: the params are invalid.
    """
    params = Path(params_path).resolve()
    return params, load_params(params), project_root(params)


class OnRun:
    """Shorthands for an object working on one run (its ``run`` attribute): the run's params,
    params file, directory and id."""

    run: RunDir

    @property
    def mig(self) -> Migration:
        return self.run.mig

    @property
    def params_path(self) -> Path:
        return self.run.params_path

    @property
    def run_dir(self) -> Path:
        return self.run.path

    @property
    def run_id(self) -> str:
        return self.run.run_id


@dataclass(frozen=True)
class RunDir:
    """One run's directory, bound to the params it runs with.

    Attributes:
        path: absolute ``<project>/reports/<run_id>`` (or wherever the run was created).
        project: absolute project root (:func:`runbook_lib.params.project_root` of the params).
        params_path: absolute path of the params file the caller named.
        mig: those params, validated.
    """

    path: Path
    project: Path
    params_path: Path
    mig: Migration

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def kept_params(self) -> Path:
        """``params.yaml`` inside the run: the bytes the run started with."""
        return self.path / KEPT_PARAMS

    def state_dir(self, provider: str) -> Path:
        """Where a provider keeps its local state: ``<project>/.runbook/<provider>``."""
        return self.project / STATE_DIR / provider

    # -- create / open ------------------------------------------------------------------------

    @classmethod
    def create(cls, params_path: str | Path, *, reports_dir: str | Path = REPORTS_DIR,
               path: str | Path | None = None) -> RunDir:
        """Validate ``params_path`` and start a new run: ``<reports_dir>/<new run id>`` (``reports_dir``
        relative to the project root), or exactly ``path`` when given (its parent must exist and
        it must not be a run already).

        Raises:
            ParamsError: the params are invalid (nothing is created).
            UsageError: ``path`` exists as a non-empty directory or is a symlink, or its parent does not exist.
        """
        params, mig, project = _load(params_path)
        if path is None:
            reports = Path(reports_dir) if Path(reports_dir).is_absolute() else project / reports_dir
            target = reports / new_run_id(mig.migration)
            target.mkdir(parents=True)
        else:
            refuse_symlinks(Path(path))
            target = Path(path).resolve()
            if not target.parent.is_dir():
                raise UsageError(f"cannot start a run in {target}: its parent directory does not exist; create it "
                                 "or pass an existing reports directory")
            if target.exists() and any(target.iterdir()):
                raise UsageError(f"cannot start a run in {target}: the directory is not empty; name a new directory")
            target.mkdir(exist_ok=True)
        shutil.copyfile(params, target / KEPT_PARAMS)
        return cls(target, project, params, mig)

    @classmethod
    def open(cls, path: str | Path, params_path: str | Path) -> RunDir:
        """Open an existing run to add a phase to it.

        ``path`` relative to the project root of ``params_path`` (or absolute).

        Raises:
            ParamsError: the params are invalid.
            UsageError: ``path`` does not exist, is sealed, is or holds a symlink (a write would
                follow it), is not a run directory (no ``params.yaml``), or
                ``params_path``'s bytes differ from the params the run started with.
        """
        params, mig, project = _load(params_path)
        target = Path(path) if Path(path).is_absolute() else project / path
        refuse_symlinks(target)
        target = target.resolve()
        kept = target / KEPT_PARAMS
        if not target.is_dir():
            raise UsageError(f"run directory {target} does not exist; a phase after 01 needs the run that the phases "
                             "before it wrote (start one with phase 01 or `runbook run`)")
        if (target / COMPLETION_MARKER).exists():
            raise UsageError(f"{target} is sealed ({COMPLETION_MARKER} present): its evidence is final. Start a new "
                             "run instead of rewriting this one.")
        if not kept.exists():
            raise UsageError(f"{target} is not a run directory (no {KEPT_PARAMS} in it); start the run with phase "
                             "01 or `runbook run`, or pass reports/<run_id>")
        if params_sha256(kept) != params_sha256(params):
            raise UsageError(f"{params} differs from the params this run started with ({kept}); a phase must run "
                             "with the same params as the phases before it. Start a new run for new params.")
        return cls(target, project, params, mig)

    @classmethod
    def latest(cls, params_path: str | Path, *, reports_dir: str | Path = REPORTS_DIR) -> RunDir:
        """The newest run of the params' migration (run ids sort by start time), opened.

        Raises:
            EvidenceError: the migration has no run yet.
            UsageError: as :meth:`open`.
        """
        params, mig, project = _load(params_path)
        reports = Path(reports_dir) if Path(reports_dir).is_absolute() else project / reports_dir
        runs = sorted(p for p in reports.glob(f"*-{mig.migration}-*") if (p / KEPT_PARAMS).exists())
        if not runs:
            raise EvidenceError(f"no run of {mig.migration!r} under {reports}; run phase 01 first")
        return cls.open(runs[-1], params)

    # -- records and evidence -----------------------------------------------------------------

    def require(self, phase: str) -> dict[str, Record]:
        """Verified records of the phases ``phase`` needs (:data:`NEEDS`), by phase id.

        Raises:
            EvidenceError: unknown phase, or a needed record is missing, failed or altered.
        """
        if phase not in NEEDS:
            raise EvidenceError(f"unknown phase {phase!r}; known phases are {[p for p, _ in PHASES]}")
        return require_records(self.path, phase, NEEDS[phase])

    def records(self) -> dict[str, Record]:
        """Every phase record, chain verified, by phase id."""
        return {r.phase: r for r in read_chain(self.path)}

    def file(self, rel: str) -> Path:
        """Absolute path of ``rel`` inside the run, its parent directory created."""
        p = self.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def write_json(self, rel: str, data: Any) -> Path:
        """Write ``rel`` as indented JSON atomically (temporary name, fsync, rename)."""
        p = self.file(rel)
        write_json_atomic(p, data)
        return p

    def write_record(self, phase: str, *, status: str, data: dict[str, Any], files: list[str],
                     started: str) -> Record:
        """Write phase ``phase``'s record, chained to the one before it
        (:func:`runbook_lib.evidence.manifest.write_record`)."""
        return write_record(self.path, phase, status=status, data=data, files=files, started=started)
