"""Time each phase of a migration (default params/demo.yaml) and split the time by kind.

For every phase that ran, prints its wall time, the time its own cells took (as papermill records
each cell's duration in the executed notebook) and the difference: the runner's orchestration
overhead (kernel start and shutdown, notebook load and saves, path scrubbing, the credential scan,
reading the record). Then the whole run's seconds by kind:

- ``wait``: the host lock (another runbook run's timed phase on this machine);
- ``kernel``: the runner's overhead around each phase (mostly the kernel's start and shutdown);
- ``imports``: each notebook's set-up cells (imports, opening the phase), every cell before the
  phase's own call;
- ``worker starts``: phase 04's worker process starts as its evidence times them (each side's
  endpoint creation to first answer, and every scale-from-zero start, ``04/cold_starts*.csv``);
- ``measure``: phase 04's rounds (``pair_seconds`` of the sequential method, else the rest of its
  measurement) and its fault drills (which restart workers too);
- ``work``: the rest of the phases' own cells (freeze, parity with the canary's starts, cutover).

Ends with ``max_overhead_s=<seconds>`` and ``total_s=<seconds>`` (wall time of the whole run).

Targets (issues 10 and 46), for params/demo.yaml on an idle 2-core machine: overhead at most 2 s
a phase, total at most 60 s.

Usage: python benchmarks/run_phases.py [params.yaml]
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import nbformat
import pandas as pd

from runbook_lib.evidence.manifest import phase_name
from runbook_lib.run.runner import environment_ok, run_migration

MAIN_CALLS = {"01": "freeze.run", "02": "mapping.run", "03": "parity.run", "04": "compare.plan",
              "05": "cutover.run", "06": "decide.run"}
"""The first cell of each phase notebook that does the phase's own work; the cells before it set up."""


def cell_seconds(notebook: Path) -> tuple[float, float]:
    """(set-up seconds, own-work seconds) of an executed notebook's code cells, as papermill
    recorded their durations; set-up is every cell before the phase's own call."""
    nb = nbformat.read(notebook, as_version=4)
    phase = notebook.name[:2]
    setup = work = 0.0
    started = False
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        started = started or MAIN_CALLS.get(phase, "\0") in c.source
        secs = float((c.metadata.get("papermill") or {}).get("duration") or 0.0)
        if started:
            work += secs
        else:
            setup += secs
    return setup, work


def phase04_split(run_dir: Path, work_s: float) -> dict[str, float]:
    """Phase 04's own work split into worker starts, rounds and drills, from its evidence."""
    starts = 0.0
    for name, col in (("cold_starts.csv", "cold_start_s"), ("cold_starts_from_zero.csv", "total_s")):
        f = run_dir / "04" / name
        if f.exists():
            starts += float(pd.read_csv(f)[col].fillna(0).sum())
    record = json.loads((run_dir / "04_compare_production.json").read_text())["data"]
    nb = nbformat.read(run_dir / "04_compare_production.ipynb", as_version=4)
    drills = sum(float((c.metadata.get("papermill") or {}).get("duration") or 0.0) for c in nb.cells
                 if c.cell_type == "code" and "run_drills" in c.source)
    rounds = float(sum(record.get("pair_seconds") or [])) or max(work_s - starts - drills, 0.0)
    return {"worker starts": starts, "measure": rounds + drills, "work": max(work_s - starts - rounds - drills, 0.0)}


def main(argv: list[str]) -> int:
    params = Path(argv[0] if argv else "params/demo.yaml")
    environment_ok()
    load = os.getloadavg()
    t0 = time.perf_counter()
    res = run_migration(params, echo=lambda s: None)
    total = time.perf_counter() - t0
    overheads = []
    kinds = dict.fromkeys(("wait", "kernel", "imports", "worker starts", "measure", "work"), 0.0)
    for o in res.outcomes:
        nb = res.run_dir / f"{phase_name(o.phase)}.ipynb"
        if o.status == "skipped" or not nb.exists():
            print(f"phase {o.phase} {o.status:<9}")
            continue
        setup, work = cell_seconds(nb)
        overhead = o.seconds - o.lock_wait_s - setup - work
        overheads.append(overhead)
        kinds["wait"] += o.lock_wait_s
        kinds["kernel"] += overhead
        kinds["imports"] += setup
        parts = phase04_split(res.run_dir, work) if o.phase == "04" else {"work": work}
        for k, v in parts.items():
            kinds[k] += v
        print(f"phase {o.phase} {o.status:<9} wall {o.seconds:6.2f} s  wait {o.lock_wait_s:5.2f} s  "
              f"kernel {overhead:5.2f} s  imports {setup:5.2f} s  "
              + "  ".join(f"{k} {v:5.2f} s" for k, v in parts.items()))
    print("by kind: " + ", ".join(f"{k} {v:.1f} s" for k, v in kinds.items())
          + f"; outside the phases {total - sum(o.seconds for o in res.outcomes):.1f} s")
    print(f"decision={res.decision} run_dir={res.run_dir} load_before_1min={load[0]:.2f}")
    print(f"max_overhead_s={max(overheads, default=0.0):.2f}")
    print(f"total_s={total:.2f}")
    return 0 if res.exit_code == 0 else res.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
