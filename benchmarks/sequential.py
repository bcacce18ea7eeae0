"""Sequential against fixed-horizon judgement of the p95 latency ratio, on simulated migrations.

Each simulated migration measures interleaved rounds (S, T, T, S, ..., as phase 04 does) of
``--requests`` requests a side, lognormal latencies (log-scale spread ``--sigma``) with a
between-round effect (each round's log latencies shifted by a N(0, ``--round-sigma``) draw: the
host's state of that round) and Bernoulli failures (``--failure-rate``; a failed request has no
latency, as in phase 04). The target's true p95 is ``ratio`` times the source's. The gate is
``gates.latency_p95_ratio_max`` (``--margin``, default 1.10, the params default).

- fixed: 8 rounds a side (``--budget``), then :func:`runbook_lib.gates.latency_p95_ratio` once
  (90 % block-bootstrap interval over rounds), on the first ``--fixed-sims`` migrations of each
  scenario (about half a second each on 2 cores: its rounds are always the budget's, so only its
  error rates need simulating);
- sequential: a look after each pair of rounds (:mod:`runbook_lib.gates.sequential`: per-pair log
  ratio of the rounds' p95s, t confidence sequence at alpha = 0.10), stopping at the first look
  from 2 pairs on whose sequence is wholly inside (GO) or outside (NO-GO) the margin, or at the
  same budget of 8 rounds a side (HOLD).

Scenarios: true ratios 1.0, 1.05 (inside the margin), 1.10 (at it), 1.3 and 2.0, and a
heavy-tailed case (ratio 1.0, 3 % of requests on both sides multiplied by a Pareto draw of shape
1.5). Per scenario and method: the share of GO, NO-GO and HOLD, the false-GO rate where the truth
is at or beyond the margin, the false-NO-GO rate where the sides are equal, and the mean and p95
rounds a side to the decision; then the ratio of mean rounds sequential/fixed. The last line is
``worst_false_go=<max over scenarios at or beyond the margin, sequential> clear_cases_rounds_ratio=<mean
sequential rounds over mean fixed rounds on ratios 1.0 and 2.0>``. Targets (issue 32): the false GO
at or below 0.05 (one side of the 90 % level) within its Monte Carlo interval in every scenario,
and a rounds ratio of at most 0.5 on the clear cases.

Usage: python benchmarks/sequential.py [--sims 2000] [--fixed-sims 200] [--requests 500]
       [--sigma 0.25] [--round-sigma 0.02] [--margin 1.10] [--budget 8] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import numpy as np

from runbook_lib import gates as g
from runbook_lib.gates import sequential as sq
from runbook_lib.phases.compare.protocol import round_sides


@dataclass(frozen=True)
class Scenario:
    name: str
    ratio: float
    heavy_tail: bool = False


SCENARIOS = (Scenario("equal (1.0)", 1.0), Scenario("inside (1.05)", 1.05), Scenario("at margin (1.10)", 1.10),
             Scenario("slower (1.3)", 1.3), Scenario("much slower (2.0)", 2.0),
             Scenario("heavy tail (1.0)", 1.0, heavy_tail=True))
HEAVY_SHARE, PARETO_SHAPE = 0.03, 1.5


def simulate_rounds(rng: np.random.Generator, sc: Scenario, args: argparse.Namespace) -> list[tuple[str, np.ndarray]]:
    """The budget's rounds in phase 04's order: ``(side, latencies in seconds)`` each."""
    out = []
    for side in round_sides(2 * args.budget):
        shift = math.log(sc.ratio) if side == "target" else 0.0
        logs = rng.normal(math.log(0.05) + shift + rng.normal(0.0, args.round_sigma), args.sigma, args.requests)
        lat = np.exp(logs)
        if sc.heavy_tail:
            tail = rng.random(args.requests) < HEAVY_SHARE
            lat[tail] *= 1.0 + rng.pareto(PARETO_SHAPE, int(tail.sum()))
        out.append((side, lat[rng.random(args.requests) >= args.failure_rate]))
    return out


def fixed(rounds: list[tuple[str, np.ndarray]], margin: float) -> tuple[str, int]:
    src = [x for side, x in rounds if side == "source"]
    tgt = [x for side, x in rounds if side == "target"]
    res = g.latency_p95_ratio(src, tgt, max_ratio=margin, min_samples=1)
    return {"PASS": "GO", "FAIL": "NO-GO"}.get(res.verdict, "HOLD"), len(src)


def sequential(rounds: list[tuple[str, np.ndarray]], margin: float, min_pairs: int = 2) -> tuple[str, int]:
    src = [float(np.percentile(x, 95)) for side, x in rounds if side == "source"]
    tgt = [float(np.percentile(x, 95)) for side, x in rounds if side == "target"]
    looks = sq.ratio_looks(sq.paired_log_ratios(src, tgt), threshold=margin, higher_is_better=False)
    first = sq.decided(looks, min_pairs)
    if first is None:
        return "HOLD", len(looks)
    return ("GO" if first.verdict == "PASS" else "NO-GO"), first.pairs


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a Monte Carlo rate (E. B. Wilson, JASA 22(158), 1927)."""
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, mid - half), min(1.0, mid + half)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=2000)
    ap.add_argument("--fixed-sims", type=int, default=200)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--sigma", type=float, default=0.25)
    ap.add_argument("--round-sigma", type=float, default=0.02)
    ap.add_argument("--failure-rate", type=float, default=0.001)
    ap.add_argument("--margin", type=float, default=1.10)
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"{args.sims} simulated migrations a scenario (the fixed method on the first {args.fixed_sims}); {args.requests} requests a round, sigma {args.sigma}, "
          f"round sigma {args.round_sigma}, margin {args.margin}, budget {args.budget} rounds a side")
    print(f"{'scenario':<18} {'method':<10} {'GO':>6} {'NO-GO':>6} {'HOLD':>6} {'false GO':>20} "
          f"{'false NO-GO':>20} {'mean rounds':>11} {'p95 rounds':>10}")
    worst, clear = 0.0, {"sequential": [], "fixed": []}
    t0 = time.perf_counter()
    for sc in SCENARIOS:
        got: dict[str, list[tuple[str, int]]] = {"fixed": [], "sequential": []}
        for i in range(args.sims):
            rounds = simulate_rounds(rng, sc, args)
            if i < args.fixed_sims:
                got["fixed"].append(fixed(rounds, args.margin))
            got["sequential"].append(sequential(rounds, args.margin))
        for method, rows in got.items():
            decisions = [d for d, _ in rows]
            used = np.array([r for _, r in rows], dtype=float)
            share = {d: decisions.count(d) / len(rows) for d in ("GO", "NO-GO", "HOLD")}
            fgo = fnogo = "-"
            if sc.ratio >= args.margin:
                k = decisions.count("GO")
                lo, hi = wilson(k, len(rows))
                fgo = f"{k / len(rows):.4f} [{lo:.4f},{hi:.4f}]"
                if method == "sequential":
                    worst = max(worst, k / len(rows))
            if sc.ratio == 1.0:
                k = decisions.count("NO-GO")
                lo, hi = wilson(k, len(rows))
                fnogo = f"{k / len(rows):.4f} [{lo:.4f},{hi:.4f}]"
            if sc.ratio in (1.0, 2.0) and not sc.heavy_tail:
                clear[method].extend(used.tolist())
            print(f"{sc.name:<18} {method:<10} {share['GO']:>6.3f} {share['NO-GO']:>6.3f} {share['HOLD']:>6.3f} "
                  f"{fgo:>20} {fnogo:>20} {used.mean():>11.2f} {np.percentile(used, 95):>10.1f}")
        ratio = np.mean([r for _, r in got["sequential"]]) / np.mean([r for _, r in got["fixed"]])
        print(f"{'':<18} rounds sequential/fixed: {ratio:.3f}")
    print(f"elapsed_s={time.perf_counter() - t0:.0f}")
    print(f"worst_false_go={worst:.4f} clear_cases_rounds_ratio={np.mean(clear['sequential']) / np.mean(clear['fixed']):.3f}")


if __name__ == "__main__":
    main()
