"""Time each phase and the whole `runbook run` of a migration (default params/demo.yaml).

Prints one line per phase and ends with ``total_s=<seconds>`` (wall time of the whole run,
kernel start-ups included). Target for params/demo.yaml: under 90 s on a 2-core machine.

Usage: python benchmarks/run_phases.py [params.yaml]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from runbook_lib.runner import environment_ok, run_migration


def main(argv: list[str]) -> int:
    params = Path(argv[0] if argv else "params/demo.yaml")
    environment_ok()
    t0 = time.perf_counter()
    res = run_migration(params, echo=lambda s: None)
    total = time.perf_counter() - t0
    for o in res.outcomes:
        print(f"phase {o.phase} {o.status:<9} {o.seconds:7.2f} s")
    print(f"decision={res.decision} run_dir={res.run_dir}")
    print(f"total_s={total:.2f}")
    return 0 if res.exit_code == 0 else res.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
