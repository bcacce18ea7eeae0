"""Tables, comparison plots and the receipt.

Plots are written as PNG files into the run directory (hashed into the phase record) and shown
inline. Figures use a fixed size and DPI, and PNG metadata carries no software version, so the
same data gives the same bytes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from runbook_lib._fs import atomic_write
from runbook_lib.errors import EvidenceError, UsageError
from runbook_lib.evidence.auditpage import DecisionShown, SealStatus, first_page
from runbook_lib.evidence.cells import readable_frame
from runbook_lib.evidence.closedworld import expected_files, is_sealed, seal_kind, sealed_notebooks
from runbook_lib.evidence.records import RaceRecord, Receipt, load_receipt
from runbook_lib.evidence.resolve import standing
from runbook_lib.evidence.signing import envelope_keyids, record_envelope, signed_by
from runbook_lib.layout import RESOLUTION

COLORS = {"source": "#4c72b0", "target": "#dd8452"}
VERDICT_COLORS = {"PASS": "#c8e6c9", "FAIL": "#ffcdd2", "INCONCLUSIVE": "#fff9c4", "ERROR": "#e1bee7",
                  "NOT_APPLICABLE": "#eceff1"}
FIGSIZE = (7.0, 4.0)
DPI = 100
CDF_POINTS = 4000  # a 7-inch figure at 100 DPI is 700 pixels wide: more steps than this draw nothing more


def _plt() -> Any:
    """pyplot, imported on first use (the inline backend in a kernel, Agg without a display)."""
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()  # makes room for a legend placed below the axes
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    return path


def _no_data(ax: Any, why: str) -> None:
    """An empty plot that says why it is empty, instead of axes that read as zero."""
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, fontsize=10, color="#555")
    ax.set_xticks([])
    ax.set_yticks([])


def _legend_below(ax: Any, **kwargs: Any) -> None:
    """The legend under the axes, outside the data (it never covers a bar or a curve)."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1, fontsize=8, frameon=False, **kwargs)


def latency_cdf(samples: pd.DataFrame, path: Path, *, unit_label: str = "request") -> Any:
    """Empirical CDF of total latency (seconds, from intended arrival) per side, with p50/p95/p99
    as vertical lines (dotted, dashed, dash-dotted) whose values, in ms, are in each side's legend
    entry: no label is drawn on the data, so close percentiles never overlap."""
    from matplotlib.lines import Line2D

    plt = _plt()
    fig, ax = plt.subplots(figsize=FIGSIZE)
    styles: tuple[tuple[int, Any], ...] = ((50, ":"), (95, "--"), (99, "-."))
    for side in ("source", "target"):
        v = np.sort(samples[(samples["side"] == side) & (samples["status"] == "COMPLETED")]["total_s"].astype(float))
        if v.size == 0:
            continue
        frac = np.arange(1, v.size + 1) / v.size
        if v.size > CDF_POINTS:  # the curve at the figure's resolution: every CDF_POINTS-th order statistic
            keep = np.unique(np.linspace(0, v.size - 1, CDF_POINTS).astype(int))
            xs, ys = v[keep], frac[keep]
        else:
            xs, ys = v, frac
        ps = {q: float(np.percentile(v, q)) * 1e3 for q, _ in styles}
        ax.step(xs * 1e3, ys, where="post", color=COLORS[side],
                label=f"{side} (n={v.size}): " + ", ".join(f"p{q} {ps[q]:.0f}" for q, _ in styles) + " ms")
        for q, ls in styles:
            ax.axvline(ps[q], color=COLORS[side], linestyle=ls, linewidth=1)
    handles, labels = ax.get_legend_handles_labels()
    handles += [Line2D([], [], color="#555", linestyle=ls) for _, ls in styles]  # what each line style marks
    labels += [f"p{q}" for q, _ in styles]
    ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=8, frameon=False)
    ax.set_xlabel(f"total latency per {unit_label} (ms): queue + init + execution")
    ax.set_ylabel("fraction of requests")
    ax.set_title("Latency CDF, source vs target")
    ax.grid(alpha=0.3)
    _save(fig, path)
    return fig


def mean_interval(values: np.ndarray, *, level: float = 0.90) -> tuple[float, float, float]:
    """Mean of per-round values and its two-sided ``level`` Student-t interval (the throughput
    gate compares mean throughput per round; the t interval over rounds is the textbook one,
    e.g. NIST/SEMATECH e-Handbook of Statistical Methods, 7.2.2.1). With fewer than two rounds,
    the interval is the mean itself."""
    from scipy import stats

    v = np.asarray(values, dtype=float)
    m = float(v.mean()) if v.size else float("nan")
    if v.size < 2 or float(v.std(ddof=1)) == 0:
        return m, m, m
    lo, hi = stats.t.interval(level, v.size - 1, loc=m, scale=float(v.std(ddof=1)) / np.sqrt(v.size))
    return m, float(lo), float(hi)


def throughput_plot(throughput: pd.DataFrame, path: Path, *, unit: str = "requests/s") -> Any:
    """Throughput per round (bars, interleaved order), with each side's mean (dashed line) and its
    90 % interval over rounds (:func:`mean_interval`, the shaded band): the quantity the
    throughput gate compares. Round labels are two-line and thinned when many; the legend sits
    below the axes."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=FIGSIZE)
    if throughput.empty:
        _no_data(ax, "no round was measured")
        ax.set_title("Throughput at saturation per round")
        _save(fig, path)
        return fig
    for _, r in throughput.iterrows():
        ax.bar(int(r["round"]), r["throughput_units_per_s"], color=COLORS[r["side"]], alpha=0.85)
    for side in ("source", "target"):
        values = throughput[throughput["side"] == side]["throughput_units_per_s"].astype(float).to_numpy()
        if values.size == 0:
            continue
        mean, lo, hi = mean_interval(values)
        ax.axhspan(lo, hi, color=COLORS[side], alpha=0.18)
        ax.axhline(mean, color=COLORS[side], linestyle="--",
                   label=f"{side} mean {mean:.1f} {unit}, 90 % interval [{lo:.1f}, {hi:.1f}]")
    rounds = [int(r) for r in throughput["round"]]
    step = max(1, int(np.ceil(len(rounds) / 12)))  # at most 12 labels on a 7-inch axis
    ax.set_xticks(rounds[::step], [f"{r}\n{sd}" for r, sd in list(zip(rounds, throughput["side"], strict=True))[::step]],
                  fontsize=7)
    ax.set_xlabel("round (interleaved: source, target, target, source, ...)", fontsize=8)
    ax.set_ylabel(f"throughput ({unit})")
    ax.set_title("Throughput at saturation per round")
    _legend_below(ax)
    _save(fig, path)
    return fig


def cost_plot(costs: dict[str, Any], path: Path, *, unit: str = "request",
              judged: dict[str, float] | None = None, rounds: dict[str, list[float]] | None = None,
              basis: str = "over the measurement window") -> Any:
    """USD per accepted unit per side (bars, micro-USD), as the ``cost_per_accepted_unit`` gate
    prices it, each with the 90 % interval of its per-round values (:func:`mean_interval`; error
    bars) when there are two or more finite rounds, and the billed total of the measurement
    window above it.

    Args:
        costs: per side, the measurement window's :class:`runbook_lib.measure.cost.CostBreakdown`.
        judged: per side, USD per accepted unit as the gate prices it (at the declared traffic,
            for an endpoint); default each side's measurement-window value.
        rounds: per side, USD per accepted unit priced round by round the same way
            (:func:`runbook_lib.phases.compare.judge.round_costs`), for the intervals.
        basis: how the bars are priced, for the title.
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=FIGSIZE)
    sides = list(costs)
    value = {s: (judged or {}).get(s, costs[s].usd_per_accepted_unit) for s in sides}
    vals = [value[s] * 1e6 if np.isfinite(value[s]) else 0 for s in sides]
    errs: list[list[float]] = [[0.0] * len(sides), [0.0] * len(sides)]
    for i, s in enumerate(sides):
        finite = np.array([x for x in (rounds or {}).get(s, []) if np.isfinite(x)], dtype=float)
        if finite.size >= 2 and vals[i] > 0:
            _, lo, hi = mean_interval(finite * 1e6)
            errs[0][i], errs[1][i] = max(vals[i] - lo, 0.0), max(hi - vals[i], 0.0)
    if not any(vals):  # nothing was accepted on either side: a zero bar would read as free
        _no_data(ax, "no accepted units on either side: nothing to price")
        ax.set_title(f"Cost per accepted unit, {basis}", fontsize=9)
        _save(fig, path)
        return fig
    bars = ax.bar(sides, vals, color=[COLORS[s] for s in sides], yerr=errs, capsize=6, ecolor="#333")
    for b, s in zip(bars, sides, strict=True):
        c = costs[s]
        ax.annotate(f"window: {c.total_usd:.5f} USD / {c.accepted_units} units", (b.get_x() + b.get_width() / 2, 0),
                    xytext=(0, 4), textcoords="offset points", ha="center", va="bottom", fontsize=8, color="white")
    ax.set_ylabel(f"micro-USD per accepted {unit}")
    ax.set_title(f"Cost per accepted unit, {basis}\n(error bars: 90 % interval over rounds)", fontsize=9)
    _save(fig, path)
    return fig


RACE_COLORS = {"picked": "#2e7d32", "eliminated": "#9e9e9e", "undecided": "#dd8452", "racing": "#dd8452"}


def race_plot(record: RaceRecord, path: Path) -> Any:
    """Each candidate of a race (:func:`runbook_lib.phases.compare.race.judge_race`) at its USD per
    accepted unit (x, micro-USD) and p95 latency (y, milliseconds), each with the race's sequence
    as error bars (open-ended where unbounded); the source as a square; the Pareto front (lower is
    better on both) joined by a dashed line; an eliminated candidate grey, labelled with the pair
    it left at and by what; the pick green."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(FIGSIZE[0], FIGSIZE[1] + 1.0))  # a legend line per candidate below
    shown = [e for e in record.entries if e.usd_per_accepted_unit is not None and e.p95_s is not None]
    if not shown:
        _no_data(ax, "no candidate has both a priced and a timed round: nothing to place")
        ax.set_title("Candidates: cost per accepted unit against p95 latency", fontsize=9)
        _save(fig, path)
        return fig

    def bar(v: float, lo: float | None, hi: float | None, top: float) -> tuple[float, float]:
        return v - (lo if lo is not None else 0.0), (hi if hi is not None else top) - v

    top_x = max(e.usd_per_accepted_unit or 0.0 for e in shown) * 1e6 * 2
    top_y = max(e.p95_s or 0.0 for e in shown) * 1e3 * 2
    for i, e in enumerate(shown):
        x, y = e.usd_per_accepted_unit * 1e6, e.p95_s * 1e3  # type: ignore[operator]
        xe = bar(x, None if e.usd_lower is None else e.usd_lower * 1e6, None if e.usd_upper is None else e.usd_upper * 1e6,
                 top_x)
        ye = bar(y, None if e.p95_lower_s is None else e.p95_lower_s * 1e3,
                 None if e.p95_upper_s is None else e.p95_upper_s * 1e3, top_y)
        color = RACE_COLORS.get(e.fate, "#dd8452")
        ax.errorbar([x], [y], xerr=[[xe[0]], [xe[1]]], yerr=[[ye[0]], [ye[1]]], fmt="*" if e.fate == "picked" else
                    "x" if e.fate == "eliminated" else "o", color=color, ecolor=color, capsize=4, markersize=10,
                    label=f"{e.name}: {e.fate}" + (f" at pair {e.exit_pair} ({e.exit_by})" if e.exit_pair else ""))
        # staggered, so the names of candidates close together do not print over each other
        ax.annotate(e.name, (x, y), xytext=(6, 6 + 11 * (i % 3)), textcoords="offset points", fontsize=8, color="#333")
    front = sorted((e.usd_per_accepted_unit * 1e6, e.p95_s * 1e3) for e in shown if e.on_front)  # type: ignore[operator]
    if len(front) > 1:
        ax.plot([p[0] for p in front], [p[1] for p in front], "--", color="#555", linewidth=1, label="Pareto front")
    elif front:
        ax.plot([front[0][0]], [front[0][1]], "s", mfc="none", mec="#555", markersize=16, label="Pareto front")
    if record.source_usd_per_accepted_unit is not None and record.source_p95_s is not None:
        ax.plot([record.source_usd_per_accepted_unit * 1e6], [record.source_p95_s * 1e3], "s", color=COLORS["source"],
                label="source")
    # the axes end past the farthest bounded figure: an unbounded sequence runs off them
    reach_x = [v * 1e6 for e in shown for v in (e.usd_per_accepted_unit, e.usd_upper) if v is not None]
    reach_y = [v * 1e3 for e in shown for v in (e.p95_s, e.p95_upper_s) if v is not None]
    if record.source_usd_per_accepted_unit is not None and record.source_p95_s is not None:
        reach_x.append(record.source_usd_per_accepted_unit * 1e6)
        reach_y.append(record.source_p95_s * 1e3)
    ax.set_xlim(0, max(reach_x) * 1.15)
    ax.set_ylim(0, max(reach_y) * 1.15)
    ax.set_xlabel("micro-USD per accepted unit")
    ax.set_ylabel("p95 latency (ms)")
    ax.set_title(f"Candidates: cost per accepted unit against p95 latency (objective {record.objective})\n"
                 f"(error bars: the race's sequences, {record.comparisons} comparisons at "
                 f"{record.alpha_each:.4f} each)", fontsize=9)
    _legend_below(ax)
    _save(fig, path)
    return fig


def gates_frame(gates: Sequence[Any]) -> pd.DataFrame:
    """One row per gate: phase, name, verdict, blocking, observed, threshold, unit, detail."""
    return pd.DataFrame([{
        "phase": x.phase, "gate": x.name, "verdict": x.verdict, "blocking": x.blocking,
        "observed": x.observed if not isinstance(x.observed, float) else float(f"{x.observed:.6g}"),
        "threshold": x.threshold, "unit": x.unit, "detail": x.detail,
    } for x in gates])


class GatesTable:
    """The gates as a notebook shows them: an HTML table whose verdict cells carry the class
    ``verdict-<VERDICT>`` and their colour as an inline ``style`` attribute, and no ``<style>``
    block, so no CSS can ever show as text (a viewer that drops a ``<style>`` tag may keep its
    text); the HTML report strips ``style`` attributes and colours the classes from its own
    stylesheet. Cells read as words and plain numbers (:func:`runbook_lib.evidence.cells.readable_frame`).

    Attributes:
        frame: :func:`gates_frame`'s table, one row per gate.
    """

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame

    def to_html(self) -> str:
        """The table as HTML (escaped cells; a header row; no index column)."""
        import html

        shown = readable_frame(self.frame)
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in shown.columns)
        rows = []
        for i in range(len(shown)):
            cells = []
            for j, col in enumerate(shown.columns):
                text = html.escape(str(shown.iat[i, j]))
                if col == "verdict":
                    colour = VERDICT_COLORS.get(str(self.frame.iat[i, j]), "")
                    cells.append(f'<td class="verdict verdict-{text}" style="background-color: {colour}">{text}</td>')
                else:
                    cells.append(f"<td>{text}</td>")
            rows.append(f"<tr>{''.join(cells)}</tr>")
        return f'<table class="dataframe"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'

    def _repr_html_(self) -> str:
        return self.to_html()

    def __repr__(self) -> str:
        return str(readable_frame(self.frame).to_string(index=False))


def gates_table(gates: Sequence[Any]) -> Any:
    """:func:`gates_frame` with verdicts coloured, for notebook display (:class:`GatesTable`); an
    empty DataFrame when there are no gates."""
    df = gates_frame(gates)
    if df.empty:
        return df
    return GatesTable(df)


_REMOTE = re.compile(
    r"""(?:\b(?:src|srcset|poster|background|lowsrc|dynsrc|longdesc|xlink:href|codebase|ping|action|formaction)"""
    r"""|<(?:link|use|image|feImage|object|embed|iframe|frame|base|script)\b[^>]*?\b(?:href|data|src))\s*=\s*["']?\s*"""
    r"""(?:https?:|ftp:)?//|@import\s*(?:url\s*\()?\s*["']|url\s*\(\s*["']?\s*(?:https?:|ftp:)?//"""
    r"""|from\s+["']https?://|!\[[^\]]*\]\(\s*<?\s*(?:https?:|ftp:)?//""", re.IGNORECASE)
"""What would make a browser fetch: a ``src``-like attribute (``background``, ``poster``, SVG
``xlink:href`` ...), a ``<link>``, ``<base>``, SVG ``<use>``, ``<image>`` or ``<feImage>``, or an
``<object>``/``<embed>``/frame reference, CSS ``@import`` or ``url()`` to a host (in a stylesheet
or a ``style`` attribute), an ES module import, a Markdown image. A plain ``<a href>`` to a host is
a link a reader may follow, not a fetch, and is kept."""
_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0;font-size:.85em}td,th{border:1px solid #ccc;padding:2px 6px}
img{max-width:100%}section.phase{border-top:2px solid #444;margin-top:2em}#runbook-first-page .decision{font-size:1.4em}
#runbook-first-page h3{margin:1.2em 0 .3em}#runbook-first-page table{font-size:.9em}
pre{white-space:pre-wrap}.runbook-unverified{border:3px solid #b00020;background:#ffebee;padding:.5em 1em;margin:1em 0}
.phase-output{overflow-x:auto;overflow-y:hidden;contain:paint}
.phase-output table,#runbook-first-page table{display:block;max-width:100%;overflow-x:auto}
@media print{#runbook-first-page{break-after:page}.phase-output{overflow:visible}
.phase-output table{display:table;width:100%;table-layout:fixed}#runbook-first-page table{display:table;width:100%}
.phase-output td,.phase-output th{overflow-wrap:anywhere}#runbook-first-page td,#runbook-first-page th{overflow-wrap:break-word}}""" + "".join(
    f"\n.phase-output td.verdict-{v},#runbook-first-page .verdict-{v}{{background-color:{c}}}"
    for v, c in VERDICT_COLORS.items())
"""The report's own stylesheet: its head and banners are styled by id and by classes no output can
reach (an output's ``class`` is kept, its CSS is not), verdict cells by ``verdict-<VERDICT>``
(:func:`gates_table`), and every output box clips what it draws (``contain: paint``); a table
wider than the page scrolls sideways in its own box (the first page's too), so the rest of its
section stays put; printed (the PDF), tables take the page's width and their cells wrap, since a
printed page cannot scroll."""


def remote_references(html: str) -> list[str]:
    """Fragments of ``html`` that would load something over the network (scripts, styles, images,
    SVG references, CSS ``@import`` and ``url()``, ES module imports)."""
    return [m.group(0) for m in _REMOTE.finditer(html)]


RENDERED_MIMES = ("text/html", "image/svg+xml", "text/markdown")
"""Output types the report renders as markup, so a remote reference in them would be fetched."""


def raw_remote_references(nb: Any) -> list[str]:
    """:func:`remote_references` in a notebook as written (an ``nbformat`` node): its Markdown
    cells and every output of a type in :data:`RENDERED_MIMES`, before any sanitiser strips them
    (a stripped reference is still what the notebook tried to show, and the report refuses it)."""
    found: list[str] = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            found += remote_references(str(cell.source))
        for out in cell.get("outputs", []):
            for mime in RENDERED_MIMES:
                data = out.get("data", {}).get(mime)
                if data is not None:
                    found += remote_references("".join(data) if isinstance(data, list) else str(data))
    return found


CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
"""Content-Security-Policy of every report: no script of any kind (no ``script-src``, so inline
scripts and event-handler attributes are refused), nothing fetched but inline images and styles
(https://www.w3.org/TR/CSP3/, ``default-src``). The sanitiser below is the first line; this is
the last."""

SAFE_TAGS = frozenset({
    "a", "abbr", "b", "blockquote", "br", "caption", "code", "col", "colgroup", "dd", "del", "details", "div", "dl",
    "dt", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "img", "ins", "kbd", "li", "ol", "p", "pre", "q", "s",
    "samp", "small", "span", "strong", "sub", "summary", "sup", "table", "tbody", "td", "tfoot", "th",
    "thead", "tr", "tt", "u", "ul", "var",
})
"""Tags an output's HTML may keep (bleach's defaults plus tables and headings); everything else is
stripped. No ``<style>``: CSS in an output could restyle the report around it."""

SAFE_SCHEMES = ("http", "https", "mailto")
"""Schemes a link (``<a href>``) may use; a ``#fragment`` is also kept. An image may only be an
inline ``data:image/png``, ``data:image/jpeg`` or ``data:image/gif`` (no SVG: it can reference remote content)."""

_DATA_IMAGE = re.compile(r"^data:image/(?:png|jpeg|gif);base64,[A-Za-z0-9+/=\s]*$")


def _safe_attribute(tag: str, name: str, value: str) -> bool:
    """bleach's attribute filter: an output keeps ``class`` (none of the report's own ``runbook*``), ``title``, table spans and
    alignment; links with :data:`SAFE_SCHEMES` or a fragment; inline raster images. No ``id``
    (it could take over the report's anchors), no ``style``, no event handler."""
    if name == "class":  # never one of the report's own (a fake "unverified" banner inside an output)
        return not any(c.startswith("runbook") for c in value.split())
    if name in ("title", "colspan", "rowspan", "align"):
        return True
    if tag == "a" and name == "href":
        v = value.strip().lower()
        return v.startswith("#") or v.split(":", 1)[0] in SAFE_SCHEMES and ":" in v
    if tag == "img" and name in ("alt", "width", "height"):
        return True
    if tag == "img" and name == "src":
        return bool(_DATA_IMAGE.match(value.strip()))
    return False


def sanitize_fragment(fragment: str) -> str:
    """``fragment`` (HTML nbconvert rendered from a notebook: Markdown cells and outputs) as the
    report may show it: ``<script>`` and ``<style>`` elements removed with their content, every
    other tag not in :data:`SAFE_TAGS` stripped (its text kept, escaped), attributes filtered by
    :func:`_safe_attribute` (bleach 6, https://bleach.readthedocs.io/en/latest/clean.html)."""
    import bleach

    fragment = re.sub(r"<(script|style)\b.*?</\1\s*>", "", fragment, flags=re.DOTALL | re.IGNORECASE)
    return str(bleach.clean(fragment, tags=SAFE_TAGS, attributes=_safe_attribute, protocols=[*SAFE_SCHEMES, "data"],
                        strip=True, strip_comments=True))


def exported_notebook(nb_path: Path) -> str:
    """The notebook at ``nb_path`` rendered (nbconvert's ``basic`` template, code hidden, script
    outputs dropped by nbconvert's SanitizeHTML) and then sanitised whole
    (:func:`sanitize_fragment`): Markdown becomes HTML only in the exporter, so a ``javascript:``
    link written in Markdown is caught here.

    Raises:
        EvidenceError: the rendered notebook references remote content (an image, style or
            module on a host): refused, not silently dropped, as an auditor would not see it.
    """
    import nbformat
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors.sanitize import SanitizeHTML

    exporter = HTMLExporter(template_name="basic", exclude_input=True, exclude_input_prompt=True,
                            exclude_output_prompt=True)
    first = {"*": ["class", "title", "colspan", "rowspan", "align"], "a": ["href"], "img": ["src", "alt", "width", "height"]}
    raw = nbformat.read(nb_path, as_version=4)
    _refuse_remote(nb_path, raw_remote_references(raw))  # before any sanitiser drops them: what the notebook says
    nb, _ = SanitizeHTML(tags=sorted(SAFE_TAGS), attributes=first, strip=True).preprocess(without_style_blocks(raw), {})
    body, _ = exporter.from_notebook_node(nb)
    _refuse_remote(nb_path, remote_references(re.sub(r"<script\b.*?</script\s*>", "", body,
                                                     flags=re.DOTALL | re.IGNORECASE)))
    return sanitize_fragment(body)


STYLE_BLOCK = re.compile(r"<style\b[^>]*>.*?</style\s*>", re.DOTALL | re.IGNORECASE)
"""A ``<style>`` element with its rules (a pandas Styler table carries its colours this way)."""


def without_style_blocks(nb: Any) -> Any:
    """``nb`` with every ``<style>`` element removed from its HTML outputs, rules included.

    nbconvert's :class:`~nbconvert.preprocessors.sanitize.SanitizeHTML` with ``strip=True`` drops a
    tag it does not allow but keeps the tag's text, so a Styler table's ``#T_9365b_row0_col2 {
    background-color: ... }`` would reach the report as a paragraph of CSS. The report styles
    tables with its own stylesheet; a notebook's rules are never carried into it."""
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            data = out.get("data") or {}
            html_ = data.get("text/html")
            if html_ is None:
                continue
            text = "".join(html_) if isinstance(html_, list) else str(html_)
            data["text/html"] = STYLE_BLOCK.sub("", text)
    return nb


def _refuse_remote(nb_path: Path, remote: list[str]) -> None:
    if remote:
        raise EvidenceError(f"{nb_path.name} would load remote content ({remote[:3]}): a report is read offline and "
                            "must not fetch anything; remove the output that references it and run the phase again")


def _output_path(run_dir: Path, out: Path | None) -> Path:
    """Where the report goes: ``out``, or ``reports/<run_id>.html`` beside the run.

    Raises:
        UsageError: ``out`` is inside the run directory (a sealed run is not written to).
    """
    out = out or run_dir.parent / f"{run_dir.name}.html"
    resolved, run = out.parent.resolve() / out.name, run_dir.resolve()
    if resolved == run or run in resolved.parents:
        raise UsageError(f"report output {out} is inside the run directory {run_dir}: a sealed run is not written "
                         f"to (a file added there is an alteration). Write it beside the run, e.g. "
                         f"{run_dir.parent / (run_dir.name + '.html')}")
    return out


def write_html(run_dir: Path, out: Path | None = None, *, unverified: Sequence[str] = ()) -> Path:
    """One offline HTML report of a run: a first page for auditors from ``receipt.json`` and the
    seal (:func:`runbook_lib.evidence.auditpage.first_page`: decision, evidence and signature status,
    acceptance deltas with their intervals, cost, drills, rollback point, resources, each linking
    to its phase), then each executed phase notebook the seal covers (:func:`runbook_lib.evidence.closedworld.sealed_notebooks`; every phase
    notebook in the directory for an unsealed run written with ``--allow-unverified``), code
    hidden and plots inline. Executed notebooks are shared with auditors, so every output is
    untrusted: it is sanitised whole (:func:`exported_notebook`: no script, no CSS, no ``id``, safe link
    schemes, inline raster images only), boxed so it cannot draw outside itself, and the page
    carries a Content-Security-Policy (:data:`CSP`) that forbids all script and every fetch. Every
    name and string from the run is escaped.

    Args:
        run_dir: ``reports/<run_id>``.
        out: output file; default ``reports/<run_id>.html`` beside the run. Written atomically
            (a symlink at ``out`` is replaced, never followed).
        unverified: what ``runbook verify`` found wrong with the run, one line each; when given,
            a banner naming them is stamped at the top and on every notebook section.

    Returns:
        The path written.

    Raises:
        EvidenceError: the run has no executed notebooks, or the HTML would load something remotely.
        UsageError: ``out`` is inside the run directory.
    """
    import html as _html

    out = _output_path(run_dir, out)
    notebooks = sealed_notebooks(run_dir) if is_sealed(run_dir) else sorted(run_dir.glob("0[1-6]_*.ipynb"))
    if not notebooks:
        raise EvidenceError(f"{run_dir} holds no executed phase notebooks that its seal covers, to report")
    receipt = load_receipt(run_dir) or Receipt(migration=run_dir.name, decision="none")
    stamp = ""
    if unverified:
        items = "".join(f"<li>{_html.escape(u)}</li>" for u in unverified)
        stamp = (f"<div class='runbook-unverified'><b>UNVERIFIED EVIDENCE</b>: <code>runbook verify</code> found "
                 f"{len(unverified)} problem(s); this page may not show what the run recorded.<ul>{items}</ul></div>")
    parts, sections = [], {}
    for nb_path in notebooks:
        name = _html.escape(nb_path.name, quote=True)
        sections[nb_path.name[:2]] = f"phase-{nb_path.stem}"
        parts.append(f'<section class="phase" id="phase-{_html.escape(nb_path.stem, quote=True)}">{stamp}'
                     f'<h2>Phase {_html.escape(nb_path.name[:2])}: <code>{name}</code></h2>'
                     f'<div class="phase-output">{exported_notebook(nb_path)}</div></section>')
    seal = SealStatus(kind=seal_kind(run_dir), files=len(expected_files(run_dir) or {}), problems=tuple(unverified),
                      signed_by=tuple(signed_by(run_dir)))
    head = (f"<header id='runbook-head'>{stamp}<h1>Migration report: {_html.escape(receipt.migration or run_dir.name)}"
            f"</h1><p>Run <code>{_html.escape(run_dir.name)}</code></p>"
            f"{first_page(receipt, seal, sections, decision_shown(run_dir, run_signed=bool(seal.signed_by)))}</header>")
    doc = (f"<!DOCTYPE html><html><head><meta charset='utf-8'>"
           f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">"
           f"<title>{_html.escape(run_dir.name)}</title>"
           f"<style>{_CSS}</style></head><body>{head}{''.join(parts)}</body></html>")
    remote = remote_references(doc)
    if remote:
        raise EvidenceError(f"report for {run_dir.name} would load remote content: {remote[:3]}")
    atomic_write(out, [doc.encode("utf-8")])
    return out


CHROMIUM_ENV = "RUNBOOK_CHROMIUM"
"""The variable naming the Chromium binary that prints PDFs (default: ``chromium`` on the PATH,
Debian's package)."""


def chromium_path(given: str | None = None) -> str:
    """The Chromium that prints a PDF: ``given``, else ``$RUNBOOK_CHROMIUM``, else ``chromium`` on
    the PATH ('' when none is found)."""
    import os
    import shutil

    return given or os.environ.get(CHROMIUM_ENV) or shutil.which("chromium") or ""


def pdf_problem(chromium: str) -> str:
    """Why :func:`write_pdf` could not print with the Chromium at ``chromium``: Playwright is not
    installed, or there is no such binary; "" when it can. ``runbook report --pdf`` asks before
    it writes anything."""
    import importlib.util

    if importlib.util.find_spec("playwright") is None:
        return ("--pdf needs Playwright: pip install 'gpu-migration-runbook[pdf]' (it drives the Chromium you have; it "
                "downloads none)")
    if not chromium or not Path(chromium).is_file():
        return (f"--pdf needs Chromium and found none at {chromium or 'chromium on the PATH'}: install Debian's chromium "
                f"package, or name the binary with --chromium or ${CHROMIUM_ENV}")
    return ""


PDF_FOOTER = ("<div style='font-size:8px;width:100%;text-align:center;color:#555'><span class='title'></span> · "
              "page <span class='pageNumber'></span> of <span class='totalPages'></span></div>")
"""Each PDF page's footer: the report's title and ``page N of M`` (Chromium fills the spans: Playwright
``page.pdf``'s ``footer_template``)."""


def write_pdf(html_path: Path, out: Path, *, chromium: str) -> Path:
    """Print the report at ``html_path`` to a PDF at ``out`` (A4, backgrounds printed, so verdict
    colours show; the first page is the decision page alone, every page numbered ``page N of M``
    in its footer), with the Chromium at ``chromium`` driven by Playwright: no browser is
    downloaded. The page's Content-Security-Policy holds while it prints. Written atomically (a
    symlink at ``out`` is replaced, never followed).

    Raises:
        UsageError: Playwright is not installed (the ``pdf`` extra), or there is no Chromium at
            ``chromium`` (Debian: ``apt-get install chromium``; or name one with ``--chromium``).
    """
    import os

    problem = pdf_problem(chromium)
    if problem:
        raise UsageError(problem)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True,
                                    args=["--no-sandbox"] if os.geteuid() == 0 else [])
        try:
            page = browser.new_page()
            page.goto(html_path.resolve().as_uri())
            page.wait_for_load_state("load")
            data = page.pdf(format="A4", print_background=True, display_header_footer=True,
                            header_template="<span></span>", footer_template=PDF_FOOTER,
                            margin={"top": "12mm", "bottom": "16mm", "left": "10mm", "right": "10mm"})
        finally:
            browser.close()
    atomic_write(out, [data])
    return out


def decision_shown(run_dir: Path, *, run_signed: bool) -> DecisionShown:
    """What the report leads with: the run's effective decision as ``runbook list`` shows it
    (:func:`runbook_lib.evidence.resolve.standing`: a resolution that may apply, else NO-GO for an
    expired HOLD, else the sealed decision), with who signed the resolution."""
    st = standing(run_dir)
    env = record_envelope(run_dir / RESOLUTION)
    keys: tuple[str, ...] = ()
    if st.resolution is not None and env.is_file():
        try:
            keys = tuple(envelope_keyids(json.loads(env.read_text())))
        except ValueError:
            keys = ()
    return DecisionShown(st.decision, st.note, st.resolution, keys, run_signed)
