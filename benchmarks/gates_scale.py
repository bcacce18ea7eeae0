"""Phase 04's gates on a production-sized measurement: synthetic lognormal latencies, ``--samples``
in total (default 1,000,000), half a side, in ``--rounds`` rounds (default 10, interleaved S, T,
T, S), the target 3 % slower.

Prints each gate's wall time and verdict, then ``peak_rss_mb=<MB>`` (this process's
``ru_maxrss``) and ``total_s=<seconds>``. Issue 16's targets: all gates over 1,000,000 samples in
at most 10 s and 500 MB on 2 cores. Gates not yet built for that scale (the block bootstrap
resamples every sample) can be skipped with ``--skip latency_p95_ratio,noise_floor``.

Usage: python benchmarks/gates_scale.py [--samples 1000000] [--rounds 10] [--skip NAMES]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from typing import Any, Callable

import numpy as np

from runbook_lib import gates as g


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="gates_scale")
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--skip", default="", help="comma-separated gate names not to run")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    per_round = args.samples // args.rounds
    sides = ("source", "target", "target", "source")
    rounds: dict[str, list[np.ndarray]] = {"source": [], "target": []}
    for r in range(args.rounds):
        side = sides[r % 4]
        rounds[side].append(rng.lognormal(-2.0, 0.4, per_round) * (1.03 if side == "target" else 1.0))
    src, tgt = np.concatenate(rounds["source"]), np.concatenate(rounds["target"])
    runs: dict[str, Callable[[], Any]] = {
        "latency_shift": lambda: g.latency_shift(src, tgt, max_ratio=1.10),
        "latency_slo": lambda: g.latency_slo(tgt, slo_s=1.0),
        "latency_p95_ratio": lambda: g.latency_p95_ratio(rounds["source"], rounds["target"], max_ratio=1.10,
                                                         min_samples=100),
        "noise_floor": lambda: g.noise_floor(rounds["source"][0], rounds["source"][-1], max_ratio=1.10),
    }
    skip = {s for s in args.skip.split(",") if s}
    t_all = time.perf_counter()
    for name, run in runs.items():
        if name in skip:
            print(f"{name:<18} skipped")
            continue
        t0 = time.perf_counter()
        res = run()
        print(f"{name:<18} {time.perf_counter() - t0:7.2f} s  {res.verdict:<12} observed {res.observed}")
    print(f"samples={src.size + tgt.size}")
    print(f"peak_rss_mb={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}")
    print(f"total_s={time.perf_counter() - t_all:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
