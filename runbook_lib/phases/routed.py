"""Phase 05 through a real router (``cutover.router.kind`` ``haproxy`` or ``command``): the
router's weights move step by step while a background replay sends traffic through it the whole
time, and each step is judged on that traffic.

* Before the first step the router is started (or attached) and must read back all traffic on
  the source; anything else stops the phase before a weight moves (fail closed).
* The replay (:class:`runbook_lib.traffic.replay.Replay`) is phase 04's open-loop generator in its own
  process: Poisson arrivals at ``cutover.router.arrival_rate_per_s`` (default
  ``measure.arrival_rate_per_s``) of the workload's sample inputs, from a steady window before
  the first step until after the last. It never resends a request. An endpoint is sent ``POST
  /infer``; a service its own protocol's request (openai-chat streamed or whole, http-json,
  runpod-handler's ``/runsync``), each failure named as in phase 04: a stream cut, a stall or
  no connection is a lost request, an error answer (a 200 error body included) a failed one.
  HAProxy checks each server as the workload is checked for readiness (an endpoint's
  ``/ping``; a service's ``readiness.path`` and ``status``).
* Each step sets the weights, reads them back (a difference fails the step), lets one window of
  ``cutover.requests_per_step`` requests pass, and judges: no request lost (sent, never
  answered), the target's answers all completed and accepted, its p95 within the latency margin
  (``gates.latency_p95_ratio_max``) times the source's p95 in the steady window (the same replay,
  rate and router, moments before: like for like; phase 04's source p95, measured at its own
  rate without a router, when the steady window has too few answers), the router's servers up,
  and the target's share of the window from the replay (the
  ``X-Runbook-Server`` header) and from the router's counters agreeing with each other and with
  the weight within ``cutover.router.share_tolerance``.
* A failing step sets the target's weight to 0, drains it and keeps the replay running until
  the source has served everything for ``cutover.router.rollback_within_s``: a rollback under
  load, counted like a step.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from runbook_lib.errors import ProviderError
from runbook_lib.evidence.records import InferenceStep, RoutedCutover, RoutedWindow
from runbook_lib.params import HAPROXY_CHECKS_PER_S, RouterParams
from runbook_lib.phases import PhaseContext
from runbook_lib.phases.serving import serving_for, source_gap_s
from runbook_lib.traffic.replay import Replay, ReplayRow
from runbook_lib.traffic.route import Route
from runbook_lib.traffic.router import CommandRouter, HAProxyRouter, Router, ServerStat

MIN_STEP_LATENCY_SAMPLES = 5
"""Completed target requests a window needs before its p95 is held to the bound."""
EDGE_REQUESTS = 2
"""Requests at each edge of a window that the replay and the router may count on different sides
of it (sent before a snapshot, counted by the router after it)."""


def owned_router(rp: RouterParams, project: Path) -> Router | None:
    """The router ``rp`` names when it outlives the run (an HAProxy attached by ``socket``, or a
    ``command`` router), opened again; None for the client split and for an HAProxy the
    runbook started (stopped with phase 05).

    Raises:
        ProviderError: it cannot be reached (named).
    """
    if rp.kind == "command":
        return CommandRouter(rp.url, rp.set_command, rp.read_command, rp.drain_command, cwd=project)
    if rp.kind == "haproxy" and rp.socket:
        return HAProxyRouter.attach(rp.socket, rp.url, backend=rp.backend,
                                    servers={"source": rp.source_server, "target": rp.target_server})
    return None


def restore_source(rp: RouterParams, project: Path) -> tuple[bool, str] | None:
    """Put all traffic back on the source on the router ``rp`` names, when it outlives the run
    (:func:`owned_router`; phase 06 on NO-GO or HOLD), and read it back. Returns ``(restored,
    what was seen)``, or None when there is no such router."""
    try:
        router = owned_router(rp, project)
        if router is None:
            return None
        try:
            router.set_weights(100, 0)
            read = router.weights()
        finally:
            router.close()
    except ProviderError as exc:
        return False, f"the {rp.kind} router could not be set back to the source: {exc}"
    ok = read == {"source": 100, "target": 0}
    return ok, f"the {rp.kind} router's weights read back {read} after setting all traffic on the source"


def build_router(ctx: PhaseContext, urls: dict[str, str]) -> Router:
    """The router ``cutover.router`` names, in front of ``urls`` (``source``, ``target``).

    Raises:
        ProviderError: it cannot be started or reached (named), before anything moves.
    """
    rp = ctx.mig.cutover.router
    owned = owned_router(rp, ctx.run.project)
    if owned is not None:
        return owned
    svc = ctx.mig.workload.service if ctx.mig.workload.kind == "service" else None
    return HAProxyRouter.start(urls["source"], urls["target"], binary=rp.binary,
                               timeout_s=ctx.mig.measure.request_timeout_s * 4,
                               workdir=ctx.run.project / ".runbook" / "routers" / ctx.run_id,
                               check_path=svc.readiness.path if svc else "/ping",
                               check_status=svc.readiness.status if svc else 200)


@dataclass
class Window:
    """One judged window of the replay: a step (or the steady state before the first, or the
    rollback), its weights, and what it found. ``start_s`` is taken before its weights change,
    so the change itself is in it; ``states`` are the worst each server showed in any read during
    the window (the router is read every :data:`STATE_POLL_S`)."""

    name: str
    target_percent: int
    start_s: float
    end_s: float
    rows: list[ReplayRow]
    router_delta: dict[str, int]
    states: dict[str, str]
    weights_read: dict[str, int]


STATE_POLL_S = 0.5
"""How often a window reads the router's servers' states, seconds: a server that goes down
mid-step and comes back is still seen."""
HEALTHY_STATES = ("UP", "NO CHECK", "DRAIN", "NOT REPORTED")
"""Server states that are not down (HAProxy's ``show stat`` status column; ``NOT REPORTED``: a
command router whose read-back gives no state)."""


def is_down(state: str) -> bool:
    """Whether a server state the router reports is none of :data:`HEALTHY_STATES`."""
    return not state.upper().startswith(HEALTHY_STATES)


def _delta(before: dict[str, ServerStat], after: dict[str, ServerStat]) -> dict[str, int]:
    return {side: after[side].requests - before[side].requests
            if after[side].requests >= 0 and before[side].requests >= 0 else -1 for side in after}


def _p(rows: list[ReplayRow], q: float) -> float:
    vals = [r["total_s"] for r in rows if r["status"] == "COMPLETED"]
    return float(np.percentile(vals, q)) if vals else math.nan


def by_kind(rows: list[ReplayRow]) -> str:
    """The named failures of ``rows``, most frequent first, and the first one's words:
    ``"; ERROR_BODY x12, STREAM_CUT x1; first: POST http://...: CUDA error: out of memory"``
    (empty for no rows)."""
    if not rows:
        return ""
    kinds = Counter(str(r.get("failure") or r["status"]) for r in rows)
    first = str(rows[0].get("error") or "")[:160]
    return "; " + ", ".join(f"{k} x{n}" for k, n in kinds.most_common()) + (f"; first: {first}" if first else "")


def behind(rows: list[ReplayRow], max_lateness_s: float, rate_per_s: float) -> str:
    """Why the replay's own schedule cannot be trusted over ``rows``: how many were sent more than
    ``max_lateness_s`` seconds after their intended time (a load generator that fell behind sends
    them in a later window than planned); empty when none was."""
    late = [r["sent_s"] - r["intended_s"] for r in rows if "intended_s" in r and
            r["sent_s"] - r["intended_s"] > max_lateness_s]
    if not late:
        return ""
    return (f"the replay fell behind its schedule: {len(late)} of {len(rows)} requests sent more than "
            f"{max_lateness_s:g} s late (worst {max(late):.2f} s), so this window's shares and counts do not show what "
            f"the router did; lower cutover.router.arrival_rate_per_s (now {rate_per_s:g}/s) or run the replay on a "
            "quieter host")


def judge_window(w: Window, *, tolerance: float, bound_s: float, accepted: Callable[[Any], bool],
                 before: Window | None, rollback: bool = False, max_lateness_s: float = math.inf,
                 rate_per_s: float = math.nan) -> RoutedWindow:
    """Judge one window: requests were sent and none lost, the source failed none, the target's
    answers completed and accepted, its p95 within ``bound_s``, neither server down, weights as
    set, the router's counters read, and the target's share from the replay and from the
    counters within ``tolerance`` (plus :data:`EDGE_REQUESTS` each) of each other and of the
    weight. ``rollback``: the window in which the target is taken out, so its answers, its state
    and its share (still falling) are not judged; the rest is. A window in which the replay fell
    behind (:func:`behind`, ``max_lateness_s``) fails on that alone, beside lost and failed
    requests: its shares and counts are not evidence either way."""
    lost = [r for r in w.rows if r["status"] == "LOST"]
    tgt = [r for r in w.rows if r.get("server") == "target"]
    src_failed = sum(1 for r in w.rows if r.get("server") == "source" and r["status"] != "COMPLETED")
    failures = sum(1 for r in tgt if r["status"] != "COMPLETED")
    rejected = sum(1 for r in tgt if r["status"] == "COMPLETED" and not accepted(r))
    p95 = _p(tgt, 95)
    answered = [r for r in w.rows if r.get("server") in ("source", "target")]
    share_replay = len(tgt) / len(answered) if answered else math.nan
    counted = all(v >= 0 for v in w.router_delta.values()) and set(w.router_delta) >= {"source", "target"}
    routed = sum(w.router_delta.values()) if counted else 0
    share_router = w.router_delta["target"] / routed if routed else math.nan
    slack = tolerance + 2 * EDGE_REQUESTS / max(len(answered), 1)
    problems: list[str] = []
    if not w.rows:
        problems.append("no replayed request was sent in the window: nothing shows what the router did")
    if lost:
        problems.append(f"{len(lost)} request(s) lost (first sent at {lost[0]['sent_s']:.2f} s: "
                        f"{lost[0].get('error', '')[:160]}){by_kind(lost)}")
    if src_failed:
        src = [r for r in w.rows if r.get("server") == "source" and r["status"] != "COMPLETED"]
        problems.append(f"the source failed {src_failed} request(s){by_kind(src)}")
    if not rollback and (failures or rejected):
        bad = [r for r in tgt if r["status"] != "COMPLETED"]
        problems.append(f"the target failed {failures} and answered {rejected} unacceptably{by_kind(bad)}")
    completed = sum(1 for r in tgt if r["status"] == "COMPLETED")  # a failed request has no latency
    if not rollback and completed >= MIN_STEP_LATENCY_SAMPLES and not p95 <= bound_s:
        problems.append(f"the target's p95 {p95:.3f} s is above the bound {bound_s:.3f} s")
    down = {s: st for s, st in w.states.items() if is_down(st) and (s == "source" or (w.target_percent > 0 and not rollback))}
    if down:
        problems.append(f"the router reports {', '.join(f'{s} {st}' for s, st in down.items())}")
    if w.weights_read != {"source": 100 - w.target_percent, "target": w.target_percent}:
        problems.append(f"weights read back {w.weights_read}, not the {100 - w.target_percent}/{w.target_percent} set")
    if not counted:
        problems.append(f"the router's counters could not be read ({w.router_delta}): the target's share cannot be "
                        "checked against them (a command router's read-back must give stats)")
    elif answered and not routed:
        problems.append(f"the router counted no request while the replay had {len(answered)} answered")
    elif answered and not abs(share_replay - share_router) <= slack:
        problems.append(f"the target's share from the replay {share_replay:.3f} and from the router's counters "
                        f"{share_router:.3f} differ by more than {slack:.3f}")
    if not rollback and answered and not abs(share_replay - w.target_percent / 100) <= slack:
        problems.append(f"the target's share {share_replay:.3f} is not its weight {w.target_percent} %")
    late = behind(w.rows, max_lateness_s, rate_per_s)
    if late:  # what the router did cannot be read from a schedule that slipped: only real failures stand
        problems = [p for p in problems if p.startswith(("no replayed request", f"{len(lost)} request(s) lost",
                                                         "the source failed", "the target failed"))] + [late]

    def finite(x: float) -> float | None:
        return None if math.isnan(x) else round(x, 6)

    return RoutedWindow(
        window=w.name, target_percent=w.target_percent, passed=not problems, problems=tuple(problems),
        start_s=round(w.start_s, 4), end_s=round(w.end_s, 4),
        requests=len(w.rows), sent=len(w.rows), answered=len(answered),
        failed=sum(1 for r in answered if r["status"] != "COMPLETED"), lost=len(lost), to_target=len(tgt),
        served_by_target=len(tgt) - failures, target_failures=failures, target_not_accepted=rejected,
        target_p95_s=finite(p95), p95_bound_s=bound_s, router_share_replay=finite(share_replay),
        router_share_counters=finite(share_router), p99_s=finite(_p(w.rows, 99)),
        p99_before_s=finite(_p(before.rows, 99)) if before else None, router_requests=dict(w.router_delta),
        states=dict(w.states), weights_read=dict(w.weights_read), replay_behind=late)


Mark = tuple[float, dict[str, ServerStat]]
"""Where a window starts: seconds into the replay and the router's counters then."""


def mark(replay: Replay, router: Router) -> Mark:
    """The start of a window, taken before its weights change."""
    return replay.now(), router.stats()


def _window(replay: Replay, router: Router, name: str, pct: int, seconds: float, *, timeout_s: float,
            start: Mark) -> Window:
    """Let ``seconds`` of replayed traffic pass from ``start``, reading the router's servers'
    states every :data:`STATE_POLL_S`; the requests sent in that time once every one has ended
    (at most ``timeout_s`` more), with the router's counters over it, the worst state each
    server showed and its weights read back at the end."""
    t0, before = start
    worst: dict[str, str] = {}
    while (left := t0 + seconds - replay.now()) > 0:
        time.sleep(min(STATE_POLL_S, left))
        for side, st in router.stats().items():
            if is_down(st.state):
                worst.setdefault(side, st.state)
    t1 = replay.now()
    after = router.stats()
    deadline = time.monotonic() + timeout_s
    while replay.in_flight_before(t1) and time.monotonic() < deadline:
        time.sleep(0.05)
    return Window(name, pct, t0, t1, replay.sent_between(t0, t1), _delta(before, after),
                  {side: worst.get(side, st.state) for side, st in after.items()}, router.weights())


def whole_spans(windows: list[RoutedWindow], rows: list[ReplayRow]) -> list[RoutedWindow]:
    """``windows`` with their counts (``sent``, ``answered``, ``failed``, ``lost``) taken over
    contiguous spans, each from its start to the next window's (the last to the replay's end),
    so every replayed request is counted in exactly one window, including those sent while a
    step was judged or approved. A request lost outside the judged part of a window adds a
    problem to it."""
    out = []
    for k, w in enumerate(windows):
        end = (windows[k + 1].start_s or 0.0) if k + 1 < len(windows) else math.inf
        span = [r for r in rows if (w.start_s or 0.0) <= r["sent_s"] < end]
        lost = sum(1 for r in span if r["status"] == "LOST")
        answered = [r for r in span if r.get("server") in ("source", "target")]
        extra = lost - w.lost
        problems = w.problems + ((f"{extra} request(s) lost after the judged part of the window, before the next "
                                  "change",) if extra > 0 else ())
        out.append(w.model_copy(update={
            "end_s": round(end, 4) if math.isfinite(end) else w.end_s, "sent": len(span), "answered": len(answered),
            "failed": sum(1 for r in answered if r["status"] != "COMPLETED"), "lost": lost,
            "problems": problems, "passed": w.passed and extra <= 0}))
    return out


@dataclass
class Routed:
    """What a routed cutover did: its steps, the route it left, the windows it judged (the
    steady state first, the rollback last when there was one) and the requests lost in all."""

    steps: list[InferenceStep]
    route: Route
    evidence: RoutedCutover


@dataclass(frozen=True)
class StepRule:
    """How :func:`move` judges a routed cutover: the window length (seconds), the share
    tolerance, the target's p95 bound (seconds; phase 04's until :meth:`after_steady`), what an
    accepted answer is, how long the source has to serve everything after a rollback (seconds),
    how long a request may take, and the latency margin the steps' bound is set with (``ratio``,
    ``gates.latency_p95_ratio_max``; None: the bound stays as given)."""

    window_s: float
    tolerance: float
    bound_s: float
    accepted: Callable[[Any], bool]
    rollback_within_s: float
    timeout_s: float
    max_lateness_s: float = math.inf
    rate_per_s: float = math.nan
    ratio: float | None = None

    def after_steady(self, steady: Window) -> "StepRule":
        """The rule for the steps: with ``ratio`` (the latency margin), the bound becomes ``ratio``
        times the source's p95 in the steady window when it has at least
        :data:`MIN_STEP_LATENCY_SAMPLES` completed answers; else this rule unchanged."""
        src = [r for r in steady.rows if r.get("server") == "source" and r["status"] == "COMPLETED"]
        if self.ratio is None or len(src) < MIN_STEP_LATENCY_SAMPLES:
            return self
        return dataclasses.replace(self, bound_s=self.ratio * _p(src, 95))

    def judge(self, w: Window, before: Window | None, *, rollback: bool = False) -> RoutedWindow:
        return judge_window(w, tolerance=self.tolerance, bound_s=self.bound_s, accepted=self.accepted, before=before,
                            rollback=rollback, max_lateness_s=self.max_lateness_s, rate_per_s=self.rate_per_s)


def move(replay: Replay, router: Router, percents: list[int], rule: StepRule, *,
         before_step: Callable[[int, int], None] = lambda k, pct: None,
         on_rollback: Callable[[int, list[str]], None] = lambda k, problems: None) -> list[RoutedWindow]:
    """The routed cutover under a running ``replay``: a steady window at all-source (a failing
    one stops before any weight moves), then each step of ``percents`` (``before_step(k, pct)``
    first: approval and the route record) with its weights set and judged over one window, the
    target's p95 against :meth:`StepRule.after_steady`'s bound; at the first failing step,
    :func:`rollback` (``on_rollback`` first). Returns every window judged."""
    start = mark(replay, router)
    steady = _window(replay, router, "steady state before the first step", 0, rule.window_s, timeout_s=rule.timeout_s,
                     start=start)
    windows = [rule.judge(steady, None)]
    if not windows[0].passed:
        return windows
    rule = rule.after_steady(steady)
    before = steady
    for k, pct in enumerate(percents):
        before_step(k, pct)
        start = mark(replay, router)
        router.set_weights(100 - pct, pct)
        w = _window(replay, router, f"step {k + 1}", pct, rule.window_s, timeout_s=rule.timeout_s, start=start)
        windows.append(rule.judge(w, before))
        if not windows[-1].passed:
            on_rollback(k, list(windows[-1].problems))
            windows.append(rollback(replay, router, rule))
            break
        before = w
    return windows


def rollback(replay: Replay, router: Router, rule: StepRule) -> RoutedWindow:
    """Set the target's weight to 0 and drain it, under the replay, then watch twice
    ``rule.rollback_within_s``: nothing lost, the source failing nothing and up, the weights read
    back all-source, the router's counters agreeing with the replay, and no request sent later
    than ``rollback_within_s`` after the change answered by the target. Returns the rollback
    window as judged (``source_serves_all_after_s``: when the target answered its last)."""
    start = mark(replay, router)
    router.set_weights(100, 0)
    router.drain("target")
    w = _window(replay, router, "rollback", 0, rule.rollback_within_s * 2, timeout_s=rule.timeout_s, start=start)
    served_target = [r["sent_s"] for r in w.rows if r.get("server") == "target"]
    after_s = (max(served_target) - start[0]) if served_target else 0.0
    judged = rule.judge(w, None, rollback=True)
    late = after_s > rule.rollback_within_s
    return judged.model_copy(update={
        "source_serves_all_after_s": round(after_s, 3), "rollback_within_s": rule.rollback_within_s,
        "passed": judged.passed and not late,
        "problems": judged.problems + ((f"the target still served a request sent {after_s:.2f} s after the "
                                        "rollback",) if late else ())})


def routed_cutover(ctx: PhaseContext, steps_plan: list[Any], *, route: Route, bound_s: float) -> Routed:
    """Move ``steps_plan`` (phase 05's slices) through ``cutover.router`` under a background
    replay (this module's docstring); writes ``05/routed_samples.csv``.

    Raises:
        ProviderError: the router cannot be started, reached or read back as all-source before
            the first step (nothing has moved).
    """
    rec04 = ctx.records.need_compare()
    m, rp = ctx.mig.measure, ctx.mig.cutover.router
    serving = serving_for(ctx)
    rate = rp.arrival_rate_per_s or m.arrival_rate_per_s
    svc = ctx.mig.workload.service if ctx.mig.workload.kind == "service" else None
    rule = StepRule(window_s=ctx.mig.cutover.requests_per_step / rate, tolerance=rp.share_tolerance,
                    bound_s=bound_s, accepted=serving.accepted, rollback_within_s=rp.rollback_within_s,
                    timeout_s=m.request_timeout_s * 4, max_lateness_s=m.max_send_lateness_s, rate_per_s=rate,
                    ratio=ctx.mig.gates.latency_p95_ratio_max)
    router = build_router(ctx, dict(rec04.endpoint_urls))

    def before_step(k: int, pct: int) -> None:
        ctx.resources.approve_change("target", steps_plan[k].plan)
        route.set(pct, f"slice step {k + 1}: weights {100 - pct}/{pct} on the {rp.kind} router")

    def on_rollback(k: int, problems: list[str]) -> None:
        route.set(0, f"rollback: step {k + 1} failed its gate check ({'; '.join(problems)[:200]})")

    try:
        all_on_source(router)
        route.set(0, f"cutover start: all traffic on source, through the {rp.kind} router at {router.url}")
        replay = Replay(router.url, serving.request_inputs(max(4 * ctx.mig.cutover.requests_per_step, 200), seed=5000),
                        rate_per_s=rate, timeout_s=rule.timeout_s, seed=6000,
                        service=svc.model_dump(mode="json") if svc else None,
                        # a live source can get every request (all of them before the first step):
                        # its pacing, less HAProxy's health checks of it (HAPROXY_CHECKS_PER_S)
                        min_gap_s=source_gap_s(ctx, reserved_per_s=HAPROXY_CHECKS_PER_S if rp.kind == "haproxy"
                                               else 0.0))
        replay.start()
        try:
            windows = move(replay, router, [sl.target_percent for sl in steps_plan], rule, before_step=before_step,
                           on_rollback=on_rollback)
        finally:
            replay.stop()
        rows = sorted(replay.rows, key=lambda r: r["sent_s"])
    finally:
        router.close()
    windows = whole_spans(windows, rows)
    pd.DataFrame([{k: v for k, v in r.items() if k != "output"} for r in rows]).to_csv(
        ctx.evidence.path("05/routed_samples.csv"), index=False)
    return Routed(_steps(windows, rp.kind), route, evidence(rp.kind, router.url, rule.window_s, windows, rows))


def all_on_source(router: Router) -> None:
    """Set all traffic on the source and read it back, before the first step.

    Raises:
        ProviderError: the router cannot be driven, or reads back anything else (named; nothing
            has moved).
    """
    router.set_weights(100, 0)
    read = router.weights()
    if read != {"source": 100, "target": 0}:
        raise ProviderError(f"router {router.kind} at {router.url}: weights read back {read} after setting all traffic "
                            "on the source; nothing was moved")


def _steps(windows: list[RoutedWindow], kind: str) -> list[InferenceStep]:
    """Phase 05's slice steps from the step windows (the steady and rollback windows are not steps)."""
    out = []
    for w in windows:
        if w.window.startswith("step "):
            fields = w.model_dump(include=set(InferenceStep.model_fields) - {"step", "mode", "passed"})
            out.append(InferenceStep(step=int(w.window.split()[1]), mode=f"drain ({kind} router)", passed=w.passed,
                                     **fields))
    return out


def evidence(kind: str, url: str, window_s: float, windows: list[RoutedWindow], rows: list[ReplayRow]) -> RoutedCutover:
    """What the routed cutover carried, for phase 05's record: requests replayed, answered and
    lost in all, the first lost one (seconds into the replay, and its window), every window."""
    lost = [r for r in rows if r["status"] == "LOST"]
    first = lost[0]["sent_s"] if lost else None
    starts = [w.start_s or 0.0 for w in windows]
    where = next((w.window for k, w in enumerate(windows) if first is not None and starts[k] <= first
                  and (k + 1 == len(windows) or first < starts[k + 1])), None)
    return RoutedCutover(kind=kind, url=url, window_s=window_s, requests=len(rows),
                         answered=sum(1 for r in rows if r.get("server") in ("source", "target")), lost=len(lost),
                         first_lost_at_s=first, first_lost_window=where, windows=tuple(windows))
