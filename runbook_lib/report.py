"""Tables, comparison plots and the receipt.

Plots are written as PNG files into the run directory (hashed into the phase record) and shown
inline. Figures use a fixed size and DPI, and PNG metadata carries no software version, so the
same data gives the same bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

COLORS = {"source": "#4c72b0", "target": "#dd8452"}
VERDICT_COLORS = {"PASS": "#c8e6c9", "FAIL": "#ffcdd2", "INCONCLUSIVE": "#fff9c4", "ERROR": "#e1bee7"}
FIGSIZE = (7.0, 4.0)
DPI = 100


def _plt() -> Any:
    """pyplot, imported on first use (the inline backend in a kernel, Agg without a display)."""
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    return path


def latency_cdf(samples: pd.DataFrame, path: Path, *, unit_label: str = "request") -> Any:
    """Empirical CDF of total latency (seconds, from intended arrival) per side, with p50/p95/p99."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=FIGSIZE)
    for side in ("source", "target"):
        v = np.sort(samples[(samples["side"] == side) & (samples["status"] == "COMPLETED")]["total_s"].astype(float))
        if v.size == 0:
            continue
        ax.step(v * 1e3, np.arange(1, v.size + 1) / v.size, where="post", color=COLORS[side],
                label=f"{side} (n={v.size})")
        for q, ls in ((50, ":"), (95, "--"), (99, "-.")):
            x = float(np.percentile(v, q)) * 1e3
            ax.axvline(x, color=COLORS[side], linestyle=ls, linewidth=1)
            ax.annotate(f"p{q} {x:.0f} ms", (x, q / 100), fontsize=7, color=COLORS[side], rotation=90,
                        va="top", ha="right")
    ax.set_xlabel(f"total latency per {unit_label} (ms): queue + init + execution")
    ax.set_ylabel("fraction of requests")
    ax.set_title("Latency CDF, source vs target")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    _save(fig, path)
    return fig


def throughput_plot(throughput: pd.DataFrame, path: Path, *, unit: str = "requests/s") -> Any:
    """Throughput per round (bars, interleaved order) with each side's mean (line)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=FIGSIZE)
    for _, r in throughput.iterrows():
        ax.bar(int(r["round"]), r["throughput_units_per_s"], color=COLORS[r["side"]])
    for side in ("source", "target"):
        mean = throughput[throughput["side"] == side]["throughput_units_per_s"].mean()
        ax.axhline(mean, color=COLORS[side], linestyle="--", label=f"{side} mean {mean:.1f} {unit}")
    ax.set_xticks([int(r) for r in throughput["round"]],
                  [f"{int(r)}: {sd}" for r, sd in zip(throughput["round"], throughput["side"])])
    ax.set_xlabel("round (interleaved source, target, target, source)")
    ax.set_ylabel(f"throughput ({unit})")
    ax.set_title("Throughput at saturation per round")
    ax.legend(loc="lower right")
    _save(fig, path)
    return fig


def cost_plot(costs: dict[str, Any], path: Path, *, unit: str = "request") -> Any:
    """USD per accepted unit per side (bars), with the billed total in the label."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=FIGSIZE)
    sides = list(costs)
    vals = [costs[s].usd_per_accepted_unit * 1e6 if np.isfinite(costs[s].usd_per_accepted_unit) else 0 for s in sides]
    bars = ax.bar(sides, vals, color=[COLORS[s] for s in sides])
    for b, s in zip(bars, sides):
        c = costs[s]
        ax.annotate(f"{c.total_usd:.5f} USD / {c.accepted_units} units", (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(f"micro-USD per accepted {unit}")
    ax.set_title("Cost per accepted unit (price x billed time + storage + egress)")
    _save(fig, path)
    return fig


def gates_frame(gates: Sequence[Any]) -> pd.DataFrame:
    """One row per gate: phase, name, verdict, blocking, observed, threshold, unit, detail."""
    return pd.DataFrame([{
        "phase": x.phase, "gate": x.name, "verdict": x.verdict, "blocking": x.blocking,
        "observed": x.observed if not isinstance(x.observed, float) else float(f"{x.observed:.6g}"),
        "threshold": x.threshold, "unit": x.unit, "detail": x.detail,
    } for x in gates])


def gates_table(gates: Sequence[Any]) -> Any:
    """:func:`gates_frame` with verdicts coloured (a pandas Styler for notebook display)."""
    df = gates_frame(gates)
    if df.empty:
        return df
    return df.style.map(lambda v: f"background-color: {VERDICT_COLORS.get(v, '')}", subset=["verdict"]).hide(axis="index")
