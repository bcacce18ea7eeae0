"""A fresh clone's first run, timed: ``git clone`` of this checkout's HEAD into a temporary
directory, then the README's first command in two parts, so the install and the demo show apart:
``make .venv/.installed`` (the environment from locks/main.txt) and ``make demo``.

Prints one line per step with its seconds and exit code, the 1-minute load average before it, and
ends with ``setup_s=<install seconds> demo_s=<demo seconds> total_s=<both>``. Target (issue 46):
on an idle 2-core machine, ``total_s`` at most 180 and the demo at most 60 (the demo's own split:
``benchmarks/run_phases.py``).

Usage: python benchmarks/fresh_clone.py [--keep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(cmd: list[str], cwd: Path) -> tuple[float, int, str]:
    """Run ``cmd`` in ``cwd``; (wall seconds, exit code, its output's last line)."""
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return time.perf_counter() - t0, done.returncode, lines[-1] if lines else ""


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="fresh_clone", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="runbook-fresh-"))
    clone = tmp / "clone"
    try:
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        seconds = {}
        for name, cmd in (("setup", ["make", ".venv/.installed"]), ("demo", ["make", "demo"])):
            load = os.getloadavg()[0]
            secs, rc, last = timed(cmd, clone)
            seconds[name] = secs
            print(f"{' '.join(cmd):<24} {secs:7.1f} s  exit {rc}  load before {load:.2f}  last line: {last}")
            if rc != 0:
                return rc
        print(f"setup_s={seconds['setup']:.1f} demo_s={seconds['demo']:.1f} total_s={sum(seconds.values()):.1f}")
        return 0
    finally:
        if args.keep:
            print(f"clone kept at {clone}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
