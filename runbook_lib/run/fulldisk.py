"""A write that failed for want of disk during a phase: recognised wherever it happened, and what
it leaves behind removed.

A full disk (``ENOSPC``, or ``EDQUOT`` for a quota) can stop a phase in three places: papermill
saving the executed notebook after a cell (an :class:`OSError` in the runner), the library writing
a record, a sample table or a plot inside a cell (the cell's error, which papermill reports as its
name and text), or the runner's own writes after the notebook (the path scrub, the credential
scan's redaction, the phase record). Each is the same failure: :func:`full_disk_error` names it,
and the runner then runs no further phase (phase 06 would write a notebook too), tears down what
the run created by its label (:func:`runbook_lib.run.cleanup.cleanup_run`, which keeps tearing
down when it cannot record), and removes the notebooks the disk cut off (:func:`remove_partial`):
a file that is not a whole notebook is not evidence of anything.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from runbook_lib.errors import FULL_DISK

NO_SPACE = "NoSpaceLeft"
"""The ``ename`` of a phase that failed for want of disk (in its record and its outcome)."""

_CELL_ERROR = re.compile(r"\[Errno (\d+)\] ([^:\n]+?)(?:: '([^'\n]*)')?\s*$")
_OS_ERROR_NAMES = frozenset(["OSError", "IOError"] + [c.__name__ for c in OSError.__subclasses__()])
"""How Python prints an :class:`OSError` (``[Errno 28] No space left on device: '/path'``), which
is the text papermill gives as a failed cell's ``evalue``."""


def full_disk_error(exc: BaseException | None = None, *, ename: str = "", evalue: str = "") -> OSError | None:
    """The full-disk :class:`OSError` behind a failure, or None when it is something else.

    Args:
        exc: an exception the runner caught (an :class:`OSError` itself, or one chained to it).
        ename, evalue: a failed cell's error name and text as papermill reports them
            (``PapermillExecutionError.ename`` / ``.evalue``); an ``OSError`` or subclass whose text
            carries errno 28 (``ENOSPC``) or 122 (``EDQUOT``) counts, with the path it names.
    """
    seen = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in FULL_DISK:
            return seen
        seen = seen.__cause__ or seen.__context__
    if ename in _OS_ERROR_NAMES:
        m = _CELL_ERROR.match(evalue.strip())
        if m and int(m.group(1)) in FULL_DISK:
            return OSError(int(m.group(1)), m.group(2).strip(), m.group(3) or None)
    return None


def partial_notebooks(run_dir: Path) -> list[Path]:
    """The run's notebooks that are not whole: empty, or not a JSON object with a cell list (what
    a write cut off by a full disk leaves), in name order."""
    out = []
    for nb in sorted(run_dir.glob("*.ipynb")):
        try:
            doc = json.loads(nb.read_bytes())
        except (OSError, ValueError):
            out.append(nb)
            continue
        if not isinstance(doc, dict) or not isinstance(doc.get("cells"), list):
            out.append(nb)
    return out


def remove_partial(run_dir: Path) -> list[str]:
    """Remove :func:`partial_notebooks` (an atomic write's temporary file removes itself when its
    write fails: :func:`runbook_lib._fs.atomic_write`); returns the names removed."""
    removed = []
    for path in partial_notebooks(run_dir):
        path.unlink(missing_ok=True)
        removed.append(path.name)
    return removed
