"""Goodput and token measurability of a service (``kind: service``), for phase 04's gates.

Goodput is vLLM ``bench serve``'s (``vllm.benchmarks.serve``, ``calculate_metrics``, after
DistServe, Zhong et al. 2024): completed requests that meet every SLO given (``--goodput
ttft:... tpot:... e2el:...``), per second of the measurement. Here a good request is also
*accepted* (its answer matches the golden), and the SLOs are ``workload.service.ttft_slo_s``,
``tpot_slo_s`` and ``e2e_slo_s`` (seconds; E2E from the send to the last byte, as vLLM's
``e2el``). A request with one output token has no TPOT and meets a TPOT SLO, as vLLM counts it.
Per side, goodput is computed round by round (good requests over the round's wall seconds, its
last answer's arrival), so the ``goodput_ratio`` gate is judged like ``throughput_ratio``: a
90 % bootstrap over rounds under the fixed method, the per-pair log ratios' confidence sequence
under the sequential one. docs/reference/gates.md designs it (target goodput over source
goodput, lower bound at least ``gates.goodput_ratio_min``; off unless set).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from runbook_lib import gates as g
from runbook_lib.params import Migration

GOODPUT_FLOOR = 1e-6
"""Requests per second a round with no good request counts as in the log ratios of the
sequential gate (a zero would be minus infinity): any real goodput dwarfs it, so such a round
weighs as what it is, a collapse."""


def tokens_unmeasurable(mig: Migration, s: pd.DataFrame) -> str:
    """Why output tokens (and with them TPOT, ITL and a TPOT SLO) are not measurable on this
    measurement, or ``""`` when they are: a streamed service whose completed requests carry no
    token count (the server sent no ``usage`` and no ``workload.service.tokenizer`` is set)."""
    svc = mig.workload.service
    if mig.workload.kind != "service" or svc is None or not svc.stream or not len(s) or "output_tokens" not in s:
        return ""
    done = s[s["status"] == "COMPLETED"]
    if not len(done) or done["output_tokens"].astype(float).notna().all():
        return ""
    return ("not measurable: the server sends no usage.completion_tokens and workload.service.tokenizer is not set, "
            "so output tokens are unknown (streamed chunks are not tokens); name a local tokenizer directory to "
            "measure TPOT, ITL and goodput")


def e2e_seconds(d: pd.DataFrame) -> pd.Series:
    """Per request of ``d``, the E2E latency (seconds): from the send to the last byte,
    ``done_s - sent_s``, as vLLM's ``e2el``. For a serverless endpoint that includes its queue, a
    cold worker's start and a Vast.ai ``/route/``; the endpoint's own ``executionTime``
    (``execution_s``) does not, so it is used only where the send and arrival times are absent."""
    if "sent_s" in d and "done_s" in d:
        return (d["done_s"].astype(float) - d["sent_s"].astype(float)).rename("e2e_s")
    return d["execution_s"].astype(float).rename("e2e_s")


def good(mig: Migration, d: pd.DataFrame) -> pd.Series:
    """Per completed request of ``d``: accepted and within every SLO set (bool)."""
    svc = mig.workload.service
    ok = (d["status"] == "COMPLETED") & d["accepted"].astype(bool)
    if svc is None:
        return ok
    if svc.ttft_slo_s is not None:
        ok &= d["ttft_s"].astype(float) <= svc.ttft_slo_s
    if svc.tpot_slo_s is not None:
        ok &= d["tpot_s"].astype(float).fillna(0.0) <= svc.tpot_slo_s
    if svc.e2e_slo_s is not None:
        ok &= e2e_seconds(d) <= svc.e2e_slo_s
    return ok


def unmeasurable(mig: Migration, s: pd.DataFrame) -> str:
    """Why goodput is not measurable here, or ``""``: a TPOT SLO without token counts, or a TTFT
    SLO on a service that does not stream."""
    svc = mig.workload.service
    if svc is None:
        return "not a service"
    no_tokens = tokens_unmeasurable(mig, s) if svc.tpot_slo_s is not None else ""
    if no_tokens:
        return "goodput " + no_tokens
    if (svc.ttft_slo_s is not None or svc.tpot_slo_s is not None) and not svc.stream:
        return ("goodput not measurable: a TTFT or TPOT SLO is set but workload.service.stream is false, so no "
                "token is timed; drop those SLOs or stream")
    return ""


def round_goodputs(mig: Migration, s: pd.DataFrame) -> dict[str, list[float]]:
    """Per side, each round's goodput in requests per second (round order): good requests over
    the round's wall seconds (its last answer's arrival, ``done_s``)."""
    out: dict[str, list[float]] = {"source": [], "target": []}
    if not len(s):
        return out
    for (side, _rnd), d in s.groupby(["side", "round"], observed=True, sort=True):
        wall = float(d["done_s"].astype(float).max()) if "done_s" in d else float("nan")
        if np.isfinite(wall) and wall > 0 and str(side) in out:
            out[str(side)].append(float(good(mig, d).sum()) / wall)
    return out


def goodput_gate(mig: Migration, s: pd.DataFrame) -> g.GateResult | None:
    """``goodput_ratio`` under the fixed method (None unless ``gates.goodput_ratio_min`` is set):
    the target's mean goodput over the source's, one value per round, 90 % bootstrap over rounds
    (:func:`runbook_lib.gates.throughput_ratio`'s method); NOT_APPLICABLE, blocking (so a HOLD,
    never a PASS), when goodput is not measurable."""
    limit = mig.gates.goodput_ratio_min
    if limit is None or mig.workload.kind != "service":
        return None
    why = unmeasurable(mig, s)
    if why:
        return g.GateResult("goodput_ratio", "NOT_APPLICABLE", True, None, limit, "ratio", "goodput ratio", why,
                            source="params gates.goodput_ratio_min", phase="04")
    per = round_goodputs(mig, s)
    r = g.throughput_ratio(per["source"], per["target"], min_ratio=limit, phase="04")
    return replace(r, name="goodput_ratio", method=r.method.replace("throughput", "goodput (accepted requests within "
                                                                    "the SLOs per second)"),
                   detail=r.detail.replace("throughput", "goodput"), source="params gates.goodput_ratio_min")
