"""Time each phase of a migration, and the orchestration around it (default params/demo.yaml).

For every phase that ran, prints its wall time, the time its own cells took (the phase's imports
and work, as papermill records each cell's duration in the executed notebook), and the
difference: the runner's orchestration overhead (kernel start and shutdown, notebook load and
saves, path scrubbing, the credential scan, reading the record). Ends with
``max_overhead_s=<seconds>`` and ``total_s=<seconds>`` (wall time of the whole run).

Targets (issue 10), for params/demo.yaml on a 2-core machine: overhead at most 2 s a phase,
total at most 60 s.

Usage: python benchmarks/run_phases.py [params.yaml]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat

from runbook_lib.evidence.manifest import phase_name
from runbook_lib.run.runner import environment_ok, run_migration


def cell_seconds(notebook: Path) -> float:
    """Sum of the code cells' durations papermill recorded in an executed notebook, seconds."""
    nb = nbformat.read(notebook, as_version=4)
    return sum(float((c.metadata.get("papermill") or {}).get("duration") or 0.0) for c in nb.cells
               if c.cell_type == "code")


def main(argv: list[str]) -> int:
    params = Path(argv[0] if argv else "params/demo.yaml")
    environment_ok()
    t0 = time.perf_counter()
    res = run_migration(params, echo=lambda s: None)
    total = time.perf_counter() - t0
    overheads = []
    for o in res.outcomes:
        nb = res.run_dir / f"{phase_name(o.phase)}.ipynb"
        if o.status == "skipped" or not nb.exists():
            print(f"phase {o.phase} {o.status:<9}")
            continue
        cells = cell_seconds(nb)
        overheads.append(o.seconds - cells)
        print(f"phase {o.phase} {o.status:<9} wall {o.seconds:6.2f} s  cells {cells:6.2f} s  "
              f"overhead {o.seconds - cells:5.2f} s")
    print(f"decision={res.decision} run_dir={res.run_dir}")
    print(f"max_overhead_s={max(overheads, default=0.0):.2f}")
    print(f"total_s={total:.2f}")
    return 0 if res.exit_code == 0 else res.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
