"""Overhead of the measurement path (open-loop scheduler, thread pool, timestamps) on a trivial
handler, against calling the same handler bare, in process.

The handler busy-waits ``--handler-ms`` (default 2 ms). The measured path is
:func:`runbook_lib.measure.timing.run_open_loop` with a client whose ``runsync`` calls the handler
in process, at an arrival rate low enough that requests never queue, so any extra latency is the
harness's own. Ends with ``ratio_p50=<harness p50 / bare p50> overhead_us=<microseconds>``.
Target: ratio_p50 <= 1.05.

Usage: python benchmarks/harness.py [--requests 400] [--handler-ms 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np

from runbook_lib.measure.timing import Request, poisson_schedule, run_open_loop


def handler(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class InProcessClient:
    """Stands in for :class:`runbook_lib.measure.timing.JobClient`: the job runs the handler here."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def runsync(self, payload: Any) -> dict[str, Any]:
        t0 = time.perf_counter()
        handler(self.seconds)
        return {"status": "COMPLETED", "execution_s": time.perf_counter() - t0, "queue_s": 0.0, "init_s": 0.0}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--handler-ms", type=float, default=2.0)
    args = ap.parse_args(argv)
    s = args.handler_ms / 1000
    bare = []
    for _ in range(args.requests):
        t0 = time.perf_counter()
        handler(s)
        bare.append(time.perf_counter() - t0)
    rate = 0.25 / s  # one request per 4 handler times on average: no queueing
    sched = poisson_schedule(args.requests, rate, seed=0)
    rows = run_open_loop(InProcessClient(s), [Request(i, float(t), None, 0) for i, t in enumerate(sched)],  # type: ignore[arg-type]
                         side="harness", round_id=0, max_in_flight=8)
    measured = np.array([r["total_s"] for r in rows])
    p50_bare, p50_h = float(np.median(bare)), float(np.median(measured))
    print(f"handler {args.handler_ms} ms, {args.requests} requests at {rate:.0f}/s (open loop)")
    print(f"bare p50 {p50_bare * 1e6:.1f} us, through the measurement path p50 {p50_h * 1e6:.1f} us, "
          f"p99 {np.percentile(measured, 99) * 1e6:.1f} us")
    print(f"ratio_p50={p50_h / p50_bare:.4f} overhead_us={(p50_h - p50_bare) * 1e6:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
