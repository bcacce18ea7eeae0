"""Racing target candidates against measuring every one for the whole budget, on simulated races.

Each simulated race has three candidates measured against one source in pairs of rounds, as
:mod:`runbook_lib.gates.race` reads them: per pair, a log ratio against the source for the latency
p95 (gate: at most ``--latency-max``), the throughput (gate: at least ``--throughput-min``) and the
cost per accepted unit (the objective, lower is better), each the candidate's true log ratio plus
a N(0, ``--sigma``) draw of that pair (the host's state). The candidates differ by construction:

- ``slow``: latency 3 times the source's (it fails the latency gate), cost 0.7;
- ``pricey``: as fast as the source, cost 1.5 times the best's ratio (1.05);
- ``best``: as fast as the source, cost 0.7.

A look after every pair from ``--min-pairs`` on eliminates what the race can tell; an eliminated
candidate is measured no more. Printed: the share of races that pick ``best``, pick another, or
end undecided (HOLD) within ``--budget`` pairs; the mean and p95 pair at which ``slow`` and
``pricey`` left; and the rounds measured (the source's and the candidates') against the
``1 + 3`` rounds a pair for the whole budget that measuring every candidate to the end costs. A
second scenario gives all three candidates the same truth (no pick is right): its line is the
share of races that eliminated anyone, which the race's level (0.10, split over 9 comparisons)
bounds. The last line is ``wrong_pick=<share> null_eliminations=<share> rounds_ratio=<raced over
full>``.

Usage: python benchmarks/race.py [--sims 2000] [--sigma 0.1] [--budget 8] [--min-pairs 2] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from runbook_lib.gates.race import Criterion, race

TRUTH = {"slow": (3.0, 1.0, 0.7), "pricey": (1.0, 1.0, 1.05), "best": (1.0, 1.0, 0.7)}
"""Candidate -> true (latency, throughput, cost) ratios against the source."""


def simulate(rng: np.random.Generator, truth: dict[str, tuple[float, float, float]], args: argparse.Namespace,
             gates: list[Criterion], objective: Criterion) -> tuple[dict[str, int], str | None, int]:
    """One race, look by look: returns the pair each candidate left at (absent: it stayed), the
    pick, and the rounds measured."""
    draws = {c: {q: np.log(v) + rng.normal(0.0, args.sigma, args.budget)
                 for q, v in zip(("latency_p95_ratio", "throughput_ratio", objective.name), t, strict=True)}
             for c, t in truth.items()}
    left: dict[str, int] = {}
    rounds = 0
    for n in range(1, args.budget + 1):
        rounds += 1 + sum(1 for c in truth if c not in left)  # the source's round and each live candidate's
        traces = {c: {q: v[: left.get(c, n)] for q, v in d.items()} for c, d in draws.items()}
        res = race(traces, gates, objective, min_pairs=args.min_pairs, final=n == args.budget)
        for e in res.exits:
            left.setdefault(e.candidate, e.pair)
        if res.pick is not None or res.undecided:
            return left, res.pick, rounds
    return left, None, rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=2000)
    ap.add_argument("--sigma", type=float, default=0.1)
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--min-pairs", type=int, default=2)
    ap.add_argument("--latency-max", type=float, default=2.0)
    ap.add_argument("--throughput-min", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    gates = [Criterion("latency_p95_ratio", args.latency_max, False), Criterion("throughput_ratio", args.throughput_min, True)]
    objective = Criterion("cost_per_accepted_unit", None, False)
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    picks: dict[str, int] = {}
    out_at: dict[str, list[int]] = {"slow": [], "pricey": []}
    rounds = []
    for _ in range(args.sims):
        left, pick, r = simulate(rng, TRUTH, args, gates, objective)
        picks[str(pick)] = picks.get(str(pick), 0) + 1
        for c in out_at:
            if c in left:
                out_at[c].append(left[c])
        rounds.append(r)
    full = (1 + len(TRUTH)) * args.budget
    print(f"{args.sims} simulated races of {len(TRUTH)} candidates, budget {args.budget} pairs, per-pair sigma "
          f"{args.sigma}, looks from pair {args.min_pairs}")
    for name in ("best", "pricey", "slow", "None"):
        print(f"  pick {name:<7} {picks.get(name, 0) / args.sims:.3f}")
    for c, at in out_at.items():
        if at:
            print(f"  {c:<7} eliminated in {len(at) / args.sims:.3f} of races, at pair mean {np.mean(at):.2f}, "
                  f"p95 {np.percentile(at, 95):.0f}")
    ratio = float(np.mean(rounds)) / full
    print(f"  rounds measured: mean {np.mean(rounds):.1f} of {full} for every candidate to the budget (ratio {ratio:.3f})")
    same = {c: (1.0, 1.0, 0.8) for c in TRUTH}
    null = sum(bool(simulate(rng, same, args, gates, objective)[0]) for _ in range(args.sims)) / args.sims
    print(f"  equal candidates: a race eliminated one in {null:.4f} of races (level 0.10 over "
          f"{len(TRUTH) * 2 + math.comb(len(TRUTH), 2)} comparisons)")
    print(f"elapsed_s={time.perf_counter() - t0:.0f}")
    wrong = sum(v for k, v in picks.items() if k not in ("best", "None")) / args.sims
    print(f"wrong_pick={wrong:.4f} null_eliminations={null:.4f} rounds_ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
