"""The data-parallel digits job and the interconnect on this machine: the check to run where a
GPU machine is lent (issue 51, item 6), and on CPU anywhere.

Runs the digits training job (``runbook_lib.workload.digits``) as ``--world-size`` processes on
``--device`` exactly as a pod's agent runs it (rank 0 here, the other ranks with torchrun's
layout; NCCL on CUDA, gloo on CPU), times its steps with the device synchronised, times an
all-reduce at each ``--sizes-mib`` over the ranks (nccl-tests' algbw and busbw,
:func:`runbook_lib.workload.ddp.bus_bandwidth`), and prints the topology probe the inventory
records (``nvidia-smi topo -m``, NCCL's version and ``NCCL_*`` settings). One GPU gives one
process: the all-reduce needs two ranks, so it is skipped with that reason.

Ends with the line ``device=... ranks=... backend=... step_ms_p50=... busbw_gbps=...`` (busbw
at the largest size; ``-`` without an all-reduce).

Usage: python benchmarks/ddp.py [--device cuda] [--world-size 2] [--steps 60] [--sizes-mib 1,8,64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from runbook_lib.params import Workload, load_params
from runbook_lib.portability import topology
from runbook_lib.workload import ddp, make_workload

PARAMS = Path(__file__).resolve().parent.parent / "params" / "demo-train-ddp.yaml"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/ddp.py")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--world-size", type=int, default=max(2, torch.cuda.device_count()))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--sizes-mib", default="1,8,64")
    args = ap.parse_args(argv)
    ranks = args.world_size
    if args.device.startswith("cuda") and ranks > torch.cuda.device_count():
        print(f"{torch.cuda.device_count()} GPU(s) here: NCCL runs one rank a GPU, so world size {ranks} becomes "
              f"{torch.cuda.device_count()}")
        ranks = max(1, torch.cuda.device_count())
    mig = load_params(PARAMS)
    prof = mig.source.model_copy(update={"device": args.device, "world_size": ranks, "batch_size": 32 // ranks or 1})
    job = Workload.model_validate({**mig.workload.model_dump(exclude_unset=True), "train_steps": args.steps,
                                   "checkpoint_every": max(1, args.steps // 2)})
    wl = make_workload(job, prof)
    t0 = time.perf_counter()
    wl.load(None)
    print(f"load (ranks started): {time.perf_counter() - t0:.2f} s")
    times, losses = [], []
    for i in range(args.steps):
        t = time.perf_counter()
        losses.append(wl.step(i)["loss"])  # the step synchronises the device before it returns
        times.append(time.perf_counter() - t)
    p50 = statistics.median(times[5:] or times) * 1e3
    print(f"steps: {args.steps}, global batch {prof.batch_size * ranks}, step p50 {p50:.3f} ms, "
          f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    busbw = "-"
    group = ddp.current()
    if group is None:
        print("all-reduce: skipped, one process (an all-reduce needs two ranks)")
    else:
        for mib in (float(x) for x in args.sizes_mib.split(",")):
            r = group.allreduce(int(mib * 2**20))
            busbw = f"{r['busbw_bytes_per_s'] / 1e9:.2f}"
            print(f"all-reduce {mib:g} MiB over {r['ranks']} ranks ({r['backend']}): {r['time_s'] * 1e6:.1f} us, "
                  f"algbw {r['algbw_bytes_per_s'] / 1e9:.2f} GB/s, busbw {busbw} GB/s")
        group.close()
    probe = topology.probe(cuda_available=torch.cuda.is_available())
    print("topology:", json.dumps({k: v for k, v in probe.items() if k != "links"}, default=str))
    print(f"device={args.device} ranks={ranks} backend={ddp.backend(args.device)} step_ms_p50={p50:.3f} "
          f"busbw_gbps={busbw}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
