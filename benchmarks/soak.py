"""Soak: run the demo migration N times back to back, as a user would (``runbook run``), and
check that nothing of any run is left behind.

Per run it prints the decision, the exit code, the wall time and the phase that failed (or
``-``), and for anything but GO the first reason. Then it checks what the runs left:

- every local pod and endpoint labelled with a soak run's id is DESTROYED, its container disk
  and volume directories are gone, and only its records remain (``pod.json``, ``log.txt``,
  ``exit.json``, ``port``);
- no process carries the pod marker of those resources (``LOCAL_POD_ID``), none listens on a
  port, and no notebook kernel started by a soak run is still alive;
- ``.runbook/`` holds only what docs/reference/evidence.md says it keeps (``local/pods/<id>/`` records,
  ``store/runs/<run_id>/`` sets, ``fixtures/``).

The last line is ``go=<k>/<N> p50_s=<median wall s> max_s=<max wall s> crashes=<exit 4 count>
leftovers=<count>``. Target: ``go=20/20`` on an idle 2-core machine; with ``make test`` running
beside it, no crash (a HOLD that names the noise floor is the gates honestly seeing the load).
Exits 1 on a crash (exit 4) or anything left behind.

Usage: python benchmarks/soak.py [--runs 20] [--train] [--params params/demo.yaml] [--root DIR]

``--root``: the project directory the runs use (its ``params/``, ``.runbook/`` and ``reports/``;
default this checkout).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
KEPT_POD_FILES = {"pod.json", "log.txt", "exit.json", "port"}
KEPT_TOP = {"local", "store", "fixtures"}


def run_once(params: Path, root: Path = ROOT) -> dict:
    """One ``runbook run`` in project ``root``; returns decision, exit code, wall seconds, failed
    phase, run dir."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "runbook_lib.cli", "run", str(params)], cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate()
    wall = time.perf_counter() - t0
    m = re.search(r"^evidence: (.+)$", out, re.M)
    run_dir = root / m.group(1) if m else None
    decision, failed, reason = "?", "-", ""
    if run_dir and (run_dir / "manifest.json").exists():
        man = json.loads((run_dir / "manifest.json").read_text())
        decision = man["decision"]
        bad = [p for p in man.get("phases", []) if p.get("status") in ("failed", "interrupted")]
        failed = bad[0]["phase"] if bad else "-"
    reasons = re.findall(r"^  - (.+)$", out, re.M)
    if decision != "GO":
        reason = reasons[0] if reasons else out.strip().splitlines()[-1] if out.strip() else ""
    return {"decision": decision, "exit": proc.returncode, "wall_s": wall, "failed_phase": failed,
            "run_dir": run_dir, "reason": reason, "pid": proc.pid}


def leftovers(run_ids: set[str], runner_pids: set[int], root: Path = ROOT) -> list[str]:
    """What the soak's runs in project ``root`` left: resources not destroyed, disks, processes,
    ports, kernels, unexpected files under ``.runbook/``."""
    found: list[str] = []
    state = root / ".runbook"
    ours: set[str] = set()
    for meta_file in sorted((state / "local" / "pods").glob("*/pod.json")):
        meta = json.loads(meta_file.read_text())
        if meta["labels"].get("run_id") not in run_ids:
            continue
        ours.add(meta["id"])
        d = meta_file.parent
        if meta["state"] != "DESTROYED":
            found.append(f"resource {meta['id']} ({meta['name']}) is {meta['state']}")
        extra = {p.name for p in d.iterdir()} - KEPT_POD_FILES
        if extra:
            found.append(f"resource {meta['id']} still has {sorted(extra)} (container disk / volume not removed)")
    for p in psutil.process_iter(["environ", "cmdline", "status"], ad_value=None):
        env = p.info["environ"] or {}
        if p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if env.get("LOCAL_POD_ID") in ours:
            ports = []
            try:
                ports = [c.laddr.port for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
            except (psutil.Error, AttributeError):
                pass
            found.append(f"process {p.pid} of {env['LOCAL_POD_ID']} still runs ({' '.join(p.info['cmdline'] or [])[:80]})"
                         + (f", listening on {ports}" if ports else ""))
        elif env.get("JPY_PARENT_PID", "").isdigit() and int(env["JPY_PARENT_PID"]) in runner_pids:
            found.append(f"notebook kernel {p.pid} of a finished run still runs")
    if state.exists():
        for entry in state.iterdir():
            if entry.name not in KEPT_TOP:
                found.append(f".runbook/{entry.name} is not something the runbook keeps")
    runs = state / "store" / "runs"
    if (state / "store").exists():
        for entry in (state / "store").iterdir():
            if entry.name != "runs":
                found.append(f".runbook/store/{entry.name} is outside store/runs/<run_id>/")
    for rid in run_ids:
        if (runs / rid).exists() and not (root / "reports" / rid).exists():
            found.append(f"store/runs/{rid} has no run directory in reports/")
    return found


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--params", default="params/demo.yaml")
    ap.add_argument("--train", action="store_true", help="alternate with params/demo-train.yaml")
    ap.add_argument("--root", type=Path, default=ROOT, help="the project directory (default: this checkout)")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    files = [root / args.params] + ([root / "params/demo-train.yaml"] if args.train else [])
    rows = []
    for i in range(args.runs):
        params = files[i % len(files)]
        r = run_once(params, root)
        rows.append(r)
        print(f"run {i + 1:>2}/{args.runs} {params.name:<16} {r['decision']:<12} exit={r['exit']:<3} "
              f"wall_s={r['wall_s']:6.1f} failed_phase={r['failed_phase']}"
              + (f"  ({r['reason'][:160]})" if r["reason"] else ""), flush=True)
    run_ids = {r["run_dir"].name for r in rows if r["run_dir"]}
    left = leftovers(run_ids, {r["pid"] for r in rows}, root)
    print(f"left behind: {len(left)}" + "".join(f"\n  {x}" for x in left))
    walls = [r["wall_s"] for r in rows]
    go = sum(r["decision"] == "GO" for r in rows)
    crashes = sum(r["exit"] == 4 for r in rows)
    other = {r["decision"] for r in rows} - {"GO"}
    if other:
        print(f"not GO: {sorted(other)} (a HOLD naming the noise floor is the gates seeing load; exit 4 is a defect)")
    print(f"go={go}/{len(rows)} p50_s={statistics.median(walls):.1f} max_s={max(walls):.1f} crashes={crashes} "
          f"leftovers={len(left)}")
    return 1 if crashes or left else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
