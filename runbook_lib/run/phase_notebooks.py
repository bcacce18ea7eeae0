"""Which notebook runs each phase: the project's edited copy, a directory given on the command
line, or the copy shipped inside the package; and ``runbook init``, which copies the packaged
notebooks and example params into a directory for a user who wants to edit them.

The packaged notebooks are package data (``runbook_lib/notebooks/*.ipynb``; in this repository
that directory is a link to the top-level ``notebooks/``, the one copy people edit), so
``runbook run any/where/params.yaml`` works from any directory. A project that keeps its own
``notebooks/NN_<phase>.ipynb`` runs that copy for that phase; the others stay packaged. What ran is
recorded per phase (:class:`NotebookSource`): origin, path, the sha256 of the file's bytes, and
whether its cells are the packaged ones.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runbook_lib.errors import UsageError
from runbook_lib.evidence.manifest import PHASES, phase_name
from runbook_lib.layout import NOTEBOOKS_DIR

PACKAGED_NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
"""The phase notebooks shipped with the package (package data, see ``pyproject.toml``)."""

PACKAGED_PARAMS = Path(__file__).resolve().parents[1] / "params"
"""The example params files shipped with the package (the repository's ``params/``)."""

PACKAGED_EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
"""Example inputs the params name (the repository's ``examples/``: the demo checkpoint)."""

ORIGINS = ("project", "given", "packaged")
"""``project``: ``<project>/notebooks/``; ``given``: ``--notebooks DIR``; ``packaged``: the package's copy."""


def cells_digest(nb: dict[str, Any]) -> str:
    """sha256 (hex) of a notebook's cells as code and text only: cell type, source and tags, in
    order; outputs, execution counts, ids and other metadata (which JupyterLab rewrites on every
    save) do not count. Two notebooks with the same digest run the same code."""
    cells = [[c.get("cell_type"), "".join(c.get("source", "")), sorted(c.get("metadata", {}).get("tags", []))]
             for c in nb.get("cells", [])]
    return hashlib.sha256(json.dumps(cells, separators=(",", ":")).encode()).hexdigest()


def _read(path: Path) -> dict[str, Any]:
    try:
        body = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise UsageError(f"phase notebook {path} cannot be read as a notebook ({exc}); restore it "
                         f"(`runbook init DIR` writes fresh copies) or remove it to run the packaged one") from None
    if not isinstance(body, dict) or not isinstance(body.get("cells"), list):
        raise UsageError(f"phase notebook {path} has no cell list; restore it or remove it to run the packaged one")
    return body


@dataclass(frozen=True)
class NotebookSource:
    """The notebook that runs one phase.

    Attributes:
        phase: ``"01"`` .. ``"06"``.
        path: the ``.ipynb`` file (absolute).
        origin: one of :data:`ORIGINS`.
        sha256: sha256 (hex) of the file's bytes as read before the run (``sha256sum`` gives the same).
        same_as_packaged: its :func:`cells_digest` equals the packaged notebook's (an edited copy
            that only gained outputs or metadata in JupyterLab is still the packaged code).
    """

    phase: str
    path: Path
    origin: str
    sha256: str
    same_as_packaged: bool

    def to_dict(self, root: Path | None = None) -> dict[str, Any]:
        """JSON form; ``path`` relative to ``root`` when it is inside it (reports carry no home
        directories), the packaged copy as ``<package>/notebooks/<name>``."""
        if self.origin == "packaged":
            shown = f"<package>/{NOTEBOOKS_DIR}/{self.path.name}"
        elif root is not None and self.path.is_relative_to(root):
            shown = str(self.path.relative_to(root))
        else:
            shown = str(self.path)
        return {"phase": self.phase, "origin": self.origin, "path": shown, "sha256": self.sha256,
                "same_as_packaged": self.same_as_packaged}


def phase_notebook(phase: str, *, project: Path, given: Path | None = None) -> NotebookSource:
    """The notebook that runs ``phase``: ``given/NN_<phase>.ipynb`` when a directory is given
    (it must hold it), else ``project/notebooks/NN_<phase>.ipynb`` when the project has one, else
    the packaged copy.

    Raises:
        UsageError: the given directory lacks the notebook, the notebook is not JSON with a cell
            list, or the package was installed without its notebooks.
    """
    name = f"{phase_name(phase)}.ipynb"
    packaged = PACKAGED_NOTEBOOKS / name
    if given is not None:
        path, origin = Path(given).resolve() / name, "given"
        if not path.exists():
            raise UsageError(f"--notebooks {given}: {name} is not there. Give a directory holding all six phase "
                             "notebooks (`runbook init DIR` writes them), or leave --notebooks out to run the "
                             "project's or the packaged ones.")
    elif (project / NOTEBOOKS_DIR / name).exists():
        path, origin = (project / NOTEBOOKS_DIR / name).resolve(), "project"
    else:
        path, origin = packaged, "packaged"
    if not packaged.exists():
        raise UsageError(f"the packaged phase notebook {packaged} is missing: the package was installed without "
                         "its data files; reinstall it (pip install --force-reinstall gpu-migration-runbook)")
    raw = path.read_bytes()
    same = path == packaged or cells_digest(_read(path)) == cells_digest(_read(packaged))
    return NotebookSource(phase, path, origin, hashlib.sha256(raw).hexdigest(), same)


def phase_notebooks(*, project: Path, given: Path | None = None) -> list[NotebookSource]:
    """:func:`phase_notebook` for every phase, in order (a preflight: every notebook is found
    and readable before a run directory exists).

    Raises:
        UsageError: as :func:`phase_notebook`.
    """
    return [phase_notebook(pid, project=project, given=given) for pid, _ in PHASES]


def init_project(target: Path) -> list[Path]:
    """Copy the packaged phase notebooks into ``target/notebooks/``, the example params files
    into ``target/params/`` and the inputs they name into ``target/examples/``, for a user who
    wants to edit them; ``runbook run
    target/params/demo.yaml`` then runs the copies (origin ``project``). Nothing is overwritten.

    Returns:
        The files written, in order.

    Raises:
        UsageError: ``target`` is a file, a file it would write already exists or is a symlink
            (dangling or not), a directory it would write into is a symlink (nothing is written),
            or the package lacks its notebooks or params.
    """
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise UsageError(f"runbook init {target}: it is a file, not a directory; nothing was written. Name a new "
                         "or empty directory.")
    pairs = [(PACKAGED_NOTEBOOKS / f"{phase_name(p)}.ipynb", target / NOTEBOOKS_DIR / f"{phase_name(p)}.ipynb")
             for p, _ in PHASES]
    pairs += [(p, target / "params" / p.name) for p in sorted(PACKAGED_PARAMS.glob("*.yaml"))]
    pairs += [(p, target / "examples" / p.relative_to(PACKAGED_EXAMPLES)) for p in sorted(PACKAGED_EXAMPLES.rglob("*"))
              if p.is_file() and "__pycache__" not in p.parts]
    missing = [str(src) for src, _ in pairs if not src.exists()]
    if missing or not any(src.parent == PACKAGED_PARAMS for src, _ in pairs):
        raise UsageError(f"the package lacks its notebooks or example params ({missing or PACKAGED_PARAMS}); "
                         "reinstall it")
    existing = [str(dst) for _, dst in pairs if dst.exists() or dst.is_symlink()]
    linked = sorted({str(d) for _, dst in pairs for d in (dst, *dst.parents) if d.is_symlink()
                     and (d == target or target in d.parents)})
    if linked:
        raise UsageError(f"runbook init {target}: {', '.join(linked[:3])} is a symlink; init writes only into real "
                         "directories and never through a link (it could point anywhere); nothing was written. "
                         "Remove the link or choose another directory.")
    if existing:
        raise UsageError(f"runbook init {target}: {len(existing)} file(s) already exist ({', '.join(existing[:3])}"
                         f"{', ...' if len(existing) > 3 else ''}); nothing was written. Choose an empty "
                         "directory, or move those files away first.")
    written = []
    for src, dst in pairs:
        dst.parent.mkdir(parents=True, exist_ok=True)
        with open(src, "rb") as fin, open(dst, "xb") as fout:  # "x": O_EXCL, which never follows a symlink
            shutil.copyfileobj(fin, fout)
        written.append(dst)
    return written
