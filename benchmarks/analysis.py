"""Phase 04's analysis at production scale: every comparison gate judged from a synthetic
measurement of ``--samples`` requests (default 1,000,000; half a side, in ``--rounds`` interleaved
rounds, the target 3 % slower, lognormal latencies), by the same code phase 04 and
``runbook verify --recompute`` run (:func:`runbook_lib.phases.compare.judge.judge` on the tables
:func:`runbook_lib.phases.compare.raw.load_measurement` reads back).

A child process writes the synthetic run directory (``04/samples.parquet`` streamed a round at a
time, the small CSV tables, params/demo.yaml's settings); this process then loads and judges it,
so its peak RSS is the analysis's own (imports included). It prints each gate's wall time and
verdict, the raw file's size, the size of a phase 04 notebook holding what phase 04 displays
(summary tables, gate table, the three plots; rendered with IPython's display formatter), then a
last line ``analysis_s=<load + judge seconds> peak_rss_mb=<MB>``.

Issue 16's targets, on 2 cores: ``analysis_s`` <= 10 and ``peak_rss_mb`` <= 500 at 1,000,000
samples; 10,000,000 must complete; the notebook stays under 2 MB whatever the sample count.

Usage: python benchmarks/analysis.py [--samples 1000000] [--rounds 10] [--params params/demo.yaml]
"""

from __future__ import annotations

import argparse
import functools
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def generate(run_dir: Path, samples: int, rounds: int) -> None:
    """Write a synthetic phase 04 measurement into ``run_dir`` (a round at a time)."""
    import numpy as np
    import pandas as pd

    from runbook_lib.evidence.records import SpendRecord
    from runbook_lib.measure.timing import INIT_PARTS
    from runbook_lib.phases.compare.protocol import round_sides
    from runbook_lib.phases.compare.raw import SAMPLES_FILE, Measured, SampleSink, write_tables

    rng = np.random.default_rng(0)
    (run_dir / "04").mkdir(parents=True, exist_ok=True)
    per_round = samples // rounds
    thr = []
    with SampleSink(run_dir / SAMPLES_FILE) as sink:
        for r, side in enumerate(round_sides(rounds)):
            slow = 1.03 if side == "target" else 1.0
            execution = rng.lognormal(-2.3, 0.4, per_round) * slow
            queue = rng.exponential(0.004, per_round)
            intended = np.cumsum(rng.exponential(1 / 200.0, per_round))
            total = queue + execution
            status = np.where(rng.random(per_round) < 1e-4, "FAILED", "COMPLETED")
            sink.write_frame(pd.DataFrame({
                "side": side, "round": r, "request": np.arange(per_round), "intended_s": intended,
                "sent_s": intended + rng.exponential(1e-4, per_round), "done_s": intended + total, "total_s": total,
                "queue_s": queue, "init_s": 0.0, "execution_s": execution, "status": status, "batch_size": 1,
                "input_index": rng.integers(0, 64, per_round), "accepted": (status == "COMPLETED") & (total < 1.0)}))
            thr.append({"side": side, "round": r, "requests": 2000.0, "completed": 2000.0, "failed": 0.0,
                        "elapsed_s": 10.0 * slow, "throughput_units_per_s": 200.0 / slow * rng.normal(1, 0.01),
                        "failed_by_status": "{}"})
    zero = pd.DataFrame([{"side": side, "start": i, "status": "COMPLETED", "total_s": t, "queue_s": 0.1,
                          "init_s": t - 0.3, "execution_s": 0.2,
                          **{part: (t - 0.3) / len(INIT_PARTS) for part in INIT_PARTS}}
                         for side in ("source", "target") for i, t in enumerate(rng.normal(3.0, 0.2, 5))])
    cold = pd.DataFrame([{"side": s, "endpoint": f"ep-{s}", "cold_start_s": 5.0, "first_status": "COMPLETED"}
                         for s in ("source", "target")])
    write_tables(run_dir, Measured(samples=pd.DataFrame(), throughput=pd.DataFrame(thr), cold_starts=cold, attempts=[],
                                   billed_s={}, egress_bytes={}, spend=SpendRecord(), cold_starts_from_zero=zero))


def notebook_bytes(mig: Any, res: dict[str, Any], gates: list[Any], costs: Any, out_dir: Path) -> int:
    """Size of a notebook holding what phase 04 displays of this measurement."""
    import matplotlib

    matplotlib.use("Agg")
    import nbformat
    from IPython.core.formatters import DisplayFormatter
    from IPython.display import Image

    from runbook_lib.evidence import report
    from runbook_lib.phases.compare.judge import cold_start_summary, summary

    figs = [report.latency_cdf(res.samples, out_dir / "latency_cdf.png"),
            report.throughput_plot(res.throughput, out_dir / "throughput.png"),
            report.cost_plot(costs, out_dir / "cost.png")]
    import matplotlib.pyplot as plt

    for f in figs:
        plt.close(f)
    fmt = DisplayFormatter()
    shown = [summary(res), report.gates_table(gates), cold_start_summary(res),
             *(Image(filename=str(out_dir / n)) for n in ("latency_cdf.png", "throughput.png", "cost.png"))]
    outputs = []
    for obj in shown:
        data, meta = fmt.format(obj)
        outputs.append(nbformat.v4.new_output("display_data", data=data, metadata=meta))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("compare.evaluate(ctx, measured)", outputs=outputs)])
    path = out_dir / "04_compare_production.ipynb"
    nbformat.write(nb, path)
    return path.stat().st_size


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="analysis")
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--params", default=str(ROOT / "params" / "demo.yaml"))
    ap.add_argument("--generate-into", help=argparse.SUPPRESS)  # the child process's job
    args = ap.parse_args(argv)
    if args.generate_into:
        generate(Path(args.generate_into), args.samples, args.rounds)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--samples", str(args.samples), "--rounds", str(args.rounds),
                        "--generate-into", str(run_dir)], check=True)
        print(f"generated {args.samples} samples in {args.rounds} rounds: {time.perf_counter() - t0:.1f} s; "
              f"04/samples.parquet {(run_dir / '04/samples.parquet').stat().st_size / 1e6:.1f} MB")
        return analyse(run_dir, args)


def analyse(run_dir: Path, args: argparse.Namespace) -> int:
    t_import = time.perf_counter()
    from runbook_lib import gates as g
    from runbook_lib.evidence.records import CompareData, SpendRecord
    from runbook_lib.params import load_params
    from runbook_lib.phases.compare.judge import costs_at_traffic, judge, window_costs
    from runbook_lib.phases.compare.raw import load_measurement

    mig = load_params(args.params)
    print(f"{'imports':<24} {time.perf_counter() - t_import:7.2f} s")
    timings: dict[str, float] = {}

    def timed(name: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def run(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                timings[name] = timings.get(name, 0.0) + time.perf_counter() - t
        return run

    for name in ("latency_p95_ratio", "throughput_ratio", "cold_start_ratio", "error_rate", "cost_per_unit", "capacity",
                 "latency_slo", "noise_floor", "latency_shift", "baseline_health", "spend_limit"):
        setattr(g, name, timed(name, getattr(g, name)))  # judge calls them through the module
    t0 = time.perf_counter()
    res = load_measurement(run_dir, CompareData(billed_s={"source": 3600.0, "target": 3600.0},
                                                egress_bytes={"source": 1e9, "target": 1e9},
                                                target_workers_ready=mig.target.workers, spend=SpendRecord()))
    load_s = time.perf_counter() - t0
    print(f"{'load 04/samples.parquet':<24} {load_s:7.2f} s  {len(res.samples)} rows")
    t1 = time.perf_counter()
    costs = window_costs(mig, res)
    gates = judge(mig, res, costs, costs_at_traffic(mig, res))
    judge_s = time.perf_counter() - t1
    by_name = {x.name: x for x in gates}
    for name, secs in timings.items():
        gate = by_name.get("cost_per_accepted_unit" if name == "cost_per_unit" else name)
        print(f"{name:<24} {secs:7.2f} s  {gate.verdict if gate else '':<12} observed {gate.observed if gate else ''}")
    print(f"{'judge (all gates)':<24} {judge_s:7.2f} s")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before any plotting
    size = notebook_bytes(mig, res, gates, costs, run_dir)
    print(f"phase 04 notebook: {size / 1e6:.2f} MB (limit 2 MB)")
    print(f"analysis_s={load_s + judge_s:.2f} peak_rss_mb={peak_mb:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
