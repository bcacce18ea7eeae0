"""Phase 04 judging: failed measurements are retried then INCONCLUSIVE; performance gates are scored unless set."""

from __future__ import annotations

import gc
import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from runbook_lib import gates as g
from runbook_lib.errors import ParamsError, ProviderError, WorkloadError
from runbook_lib.evidence.records import SpendRecord
from runbook_lib.gates import sequential as sq
from runbook_lib.measure import cost
from runbook_lib.measure.timing import Attempted, frozen_heap, with_retries
from runbook_lib.params import Measure, load_params, operator_set, parse_yaml, validate
from runbook_lib.phases import compare
from runbook_lib.phases.compare import sequential as seqmod

from .conftest import ROOT


class Sleeps:
    """Injected sleep: records the waits instead of waiting."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, s: float) -> None:
        self.calls.append(s)


def test_defaults_are_argos() -> None:
    # Argo Rollouts: DefaultConsecutiveErrorLimit 4, DefaultErrorRetryInterval 10 s.
    m = Measure()
    assert (m.error_retries, m.error_retry_interval_s) == (4, 10.0)


def test_every_attempt_failing_is_recorded_and_yields_no_value() -> None:
    sleeps, calls = Sleeps(), []

    def broken(k: int) -> float:
        calls.append(k)
        raise ProviderError("POST /runsync failed: ConnectError: [Errno 111] Connection refused")

    a = with_retries(broken, what="round 1 target open-loop", kind="open_loop", side="target", retries=4,
                     interval_s=10.0, sleep=sleeps)
    assert calls == [0, 1, 2, 3, 4]  # the first attempt and 4 retries
    assert sleeps.calls == [10.0] * 4 and a.waited_s == 40.0
    assert not a.ok and a.value is None and "Connection refused" in (a.error or "")
    assert [r["attempt"] for r in a.to_rows()] == [1, 2, 3, 4, 5]
    assert all(r["ok"] is False and r["what"] == "round 1 target open-loop" for r in a.to_rows())


def test_a_transient_failure_recovers() -> None:
    sleeps = Sleeps()

    def flaky(k: int) -> str:
        if k < 2:
            raise OSError("connection reset")
        return "measured"

    a = with_retries(flaky, what="x", kind="saturation", side="source", retries=4, interval_s=10.0, sleep=sleeps)
    assert a.ok and a.value == "measured" and a.error is None
    assert [r["ok"] for r in a.attempts] == [False, False, True] and sleeps.calls == [10.0, 10.0]


def test_a_target_failure_is_not_retried() -> None:
    sleeps = Sleeps()

    def crash(k: int) -> None:
        raise WorkloadError("pod exited with code 1")  # the workload failing is evidence, not machinery

    with pytest.raises(WorkloadError):
        with_retries(crash, what="x", kind="training_round", side="target", retries=4, interval_s=10.0, sleep=sleeps)
    assert sleeps.calls == []


def _fixed_demo() -> dict[str, Any]:
    """params/demo.yaml judged by the fixed method (the demo is sequential): 4 rounds, 2 a side."""
    data = parse_yaml((ROOT / "params" / "demo.yaml").read_text())
    data["gates"]["method"] = "fixed"
    data["measure"]["rounds"] = 4
    return data


def _ctx() -> SimpleNamespace:
    return SimpleNamespace(mig=validate(_fixed_demo()), evidence=SimpleNamespace(add_gates=lambda *r: list(r)))


def test_a_lost_round_extends_and_is_kept_as_evidence() -> None:
    ctx, sleeps = _ctx(), Sleeps()
    log: list[Attempted[Any]] = []

    def run_round(r: int, side: str) -> int:
        def take(k: int) -> int:
            if r == 1:
                raise ProviderError("GET /health failed: ConnectError")
            return 60

        got = compare.measured_with_retries(ctx, take, log, what=f"round {r} {side} open-loop", kind="open_loop", side=side,
                             sleep=sleeps)
        return got.value or 0

    extra = compare.schedule_rounds(ctx, run_round)
    # Losing round 1 left the target 60 samples short of the 90 the SLO bound needs: the two extra
    # rounds allowed (4 on the source, 5 on the target, in S,T,T,S order) were run.
    assert extra == 2
    assert [a.ok for a in log] == [True, False, True, True, True, True]
    assert len(log[1].attempts) == ctx.mig.measure.error_retries + 1 and len(sleeps.calls) == 4
    lost = compare.lost_measurements(log)
    assert set(lost) == {"latency_p95_ratio", "latency_slo", "noise_floor", "latency_shift",
                         "cost_per_accepted_unit", "error_rate"}
    assert "round 1 target open-loop: 5 attempts failed" in lost["latency_p95_ratio"][0]


def test_a_lost_worker_report_leaves_error_rate_to_the_requests() -> None:
    # A dead load_balancing worker answers no health report; the requests it refused are samples
    # (CLIENT_ERROR), so error_rate judges them instead of turning INCONCLUSIVE.
    def refused(k: int) -> None:
        raise ProviderError("GET /health failed: ConnectError")

    lost = compare.lost_measurements([with_retries(refused, what="target workers after rounds", kind="health",
                                                   side="target", retries=1, interval_s=0.0, sleep=Sleeps())])
    assert set(lost) == {"capacity"}


def _res(attempts: list[Attempted[Any]], slower: float = 1.5) -> compare.Measured:
    rng = np.random.default_rng(0)
    rows = []
    for r, side in enumerate(compare.round_sides(4)):
        for i, v in enumerate(rng.lognormal(-2.0, 0.2, size=200) * (slower if side == "target" else 1.0)):
            rows.append({"side": side, "round": r, "request": i, "total_s": v, "status": "COMPLETED",
                         "accepted": True})
    thr = [{"side": side, "round": r, "requests": 48.0, "completed": 48.0, "failed": 0.0, "elapsed_s": 1.0,
            "throughput_units_per_s": 48.0} for r, side in enumerate(compare.round_sides(4))]
    return compare.Measured(samples=pd.DataFrame(rows), throughput=pd.DataFrame(thr), target_workers_ready=1,
                            cold_starts=pd.DataFrame([{"side": "source", "cold_start_s": 2.0, "first_status": "COMPLETED"},
                                                      {"side": "target", "cold_start_s": 2.1, "first_status": "COMPLETED"}]),
                            attempts=attempts, billed_s={"source": 60.0, "target": 60.0},
                            egress_bytes={"source": 0.0, "target": 0.0}, spend=SpendRecord())


def _costs() -> dict[str, cost.CostBreakdown]:
    return {s: cost.breakdown(price_usd_per_hour=0.4, billed_s=60, instances=1, accepted_units=400)
            for s in ("source", "target")}


def test_a_lost_measurement_makes_its_gates_inconclusive_not_fail() -> None:
    ctx = _ctx()
    judged = {r.name: r for r in compare.compare_gates(ctx, _res([]), _costs())}
    assert judged["latency_p95_ratio"].verdict == "PASS"  # 1.5x within the demo's 2.0 margin
    lost = with_retries(lambda k: (_ for _ in ()).throw(ProviderError("connection refused")),
                        what="round 2 target saturation", kind="saturation", side="target", retries=2,
                        interval_s=10.0, sleep=Sleeps())
    gates = {r.name: r for r in compare.compare_gates(ctx, _res([lost]), _costs())}
    for name in ("throughput_ratio", "error_rate"):
        res = gates[name]
        assert res.verdict == "INCONCLUSIVE" and res.blocking
        assert "round 2 target saturation: 3 attempts failed, last ProviderError: connection refused" in res.detail
        assert "not evidence about the target" in res.detail and "On the remaining data it read PASS" in res.detail
    assert gates["latency_p95_ratio"].verdict == gates["cold_start_ratio"].verdict == "PASS"  # not fed by it


def test_a_noisy_a_a_floor_names_an_offered_load_near_the_source_capacity() -> None:
    # The last source round 2.3 times slower than the first (S,T,T,S): the A/A floor is
    # INCONCLUSIVE. The source completed 48 requests/s in its closed-loop rounds; offered at 45/s
    # (94 %) the detail names the load as the cause and the setting to lower; at the demo's 30/s
    # (63 %, under 80 %) it does not.
    res = _res([])
    res.samples.loc[res.samples["round"] == 3, "total_s"] *= 2.3
    data = _fixed_demo()
    data["measure"]["arrival_rate_per_s"] = 45
    busy = SimpleNamespace(mig=validate(data), evidence=SimpleNamespace(add_gates=lambda *r: list(r)))
    near = {r.name: r for r in compare.compare_gates(busy, res, _costs())}["noise_floor"]
    assert near.verdict == "INCONCLUSIVE" and near.blocking
    assert "the offered load, 45 requests/s, is 94% of the source's measured saturation throughput (48.0 requests/s)" \
        in near.detail and near.detail.endswith("offer at most 80% of it (measure.arrival_rate_per_s)")
    calm = {r.name: r for r in compare.compare_gates(_ctx(), res, _costs())}["noise_floor"]
    assert calm.verdict == "INCONCLUSIVE" and "offered load" not in calm.detail


PERFORMANCE = ("latency_p95_ratio", "noise_floor", "throughput_ratio", "cold_start_ratio", "cost_per_accepted_unit",
               "latency_slo")


def _ctx_without(*dropped: str) -> SimpleNamespace:
    """The demo's params (fixed method) with the named ``gates.*`` / ``workload.requirements.*`` settings removed."""
    data = _fixed_demo()
    for setting in dropped:
        *parents, name = setting.split(".")
        node = data
        for p in parents:
            node = node[p]
        node.pop(name, None)
    return SimpleNamespace(mig=validate(data), evidence=SimpleNamespace(add_gates=lambda *r: list(r)))


def test_performance_gates_block_when_the_operator_set_them() -> None:
    gates = {r.name: r for r in compare.compare_gates(_ctx(), _res([], slower=2.5), _costs())}
    assert all(gates[n].blocking for n in PERFORMANCE)  # demo.yaml sets every threshold it relies on
    assert gates["latency_p95_ratio"].verdict == "FAIL"
    assert g.decide(list(gates.values()))[0] == "NO-GO"


def test_performance_gates_are_scored_when_left_at_defaults() -> None:
    ctx = _ctx_without(*(compare.OPERATOR_SETTINGS[n] for n in PERFORMANCE))
    gates = {r.name: r for r in compare.compare_gates(ctx, _res([], slower=2.5), _costs())}
    for n in PERFORMANCE:
        assert not gates[n].blocking, n
        assert gates[n].detail.endswith(f"scored: threshold not set by the operator; set "
                                        f"{compare.OPERATOR_SETTINGS[n]} in params to make it blocking")
    assert gates["latency_p95_ratio"].verdict == "FAIL"  # judged against the 1.10 default, reported
    assert gates["error_rate"].blocking and gates["capacity"].blocking  # reliability and policy always block
    decision, reasons = g.decide(list(gates.values()))
    assert decision == "GO" and any(r.startswith("scored (not blocking): latency_p95_ratio FAIL") for r in reasons)


def test_one_unset_threshold_is_scored_alone() -> None:
    ctx = _ctx_without("gates.cold_start_ratio_max")
    assert not operator_set(ctx.mig, "gates.cold_start_ratio_max")
    assert operator_set(ctx.mig, "gates.latency_p95_ratio_max")
    gates = {r.name: r for r in compare.compare_gates(ctx, _res([]), _costs())}
    assert not gates["cold_start_ratio"].blocking and gates["latency_p95_ratio"].blocking


def test_shipped_params_set_what_their_gates_rely_on() -> None:
    for name, kind in (("demo.yaml", "inference"), ("demo-s3.yaml", "inference"), ("demo-train.yaml", "training")):
        mig = load_params(ROOT / "params" / name)
        needed = [n for n in PERFORMANCE if not (kind == "training" and n == "latency_slo")]
        assert all(operator_set(mig, compare.OPERATOR_SETTINGS[n]) for n in needed), name


def _training_res(stalled_round: int | None) -> compare.Measured:
    """Phase 04 of params/demo-train.yaml as the training rounds record it (source, target, target,
    source): 300 sub-millisecond steps a round, every side the same machine; in ``stalled_round``
    one step in ten stalls for 40 medians, as when other work takes the core."""
    rng = np.random.default_rng(3)
    rows, thr = [], []
    for r, side in enumerate(compare.round_sides(4)):
        steps = rng.lognormal(np.log(0.0005), 0.1, size=300)
        if r == stalled_round:
            steps[::10] *= 40
        rows += [{"side": side, "round": r, "request": i, "total_s": v, "queue_s": 0.0, "init_s": 0.0,
                  "execution_s": v, "status": "COMPLETED", "accepted": True} for i, v in enumerate(steps)]
        thr.append({"side": side, "round": r, "requests": 300.0, "completed": 300.0, "failed": 0.0,
                    "elapsed_s": float(steps.sum()), "throughput_units_per_s": 300 * 32 / float(steps.sum())})
    return compare.Measured(samples=pd.DataFrame(rows), throughput=pd.DataFrame(thr),
                            cold_starts=pd.DataFrame([{"side": s, "cold_start_s": 2.0} for s in ("source", "target")]),
                            billed_s={"source": 60.0, "target": 60.0}, egress_bytes={"source": 0.0, "target": 0.0},
                            attempts=[], spend=SpendRecord())


def test_a_training_comparison_whose_a_a_control_is_outside_its_band_holds_and_its_gain_is_no_finding() -> None:
    # Identical sides; the last source round stalled, so the target reads as a throughput gain of
    # about fivefold over that round. The source's two rounds (the A/A control) disagree on the mean
    # step time, whose inverse is the throughput, while their medians agree: the control blocks,
    # the run HOLDs, and the "gain" is not a PASS.
    ctx = SimpleNamespace(mig=load_params(ROOT / "params" / "demo-train.yaml"),
                          evidence=SimpleNamespace(add_gates=lambda *r: list(r)))
    costs_ = {s: cost.breakdown(price_usd_per_hour=0.4, billed_s=60, instances=1, accepted_units=600)
              for s in ("source", "target")}
    noisy = {r.name: r for r in compare.compare_gates(ctx, _training_res(stalled_round=3), costs_)}
    aa = noisy["noise_floor"]
    assert aa.verdict == "INCONCLUSIVE" and aa.blocking and "mean (throughput) interval is wholly above" in aa.detail
    thr = noisy["throughput_ratio"]
    assert thr.verdict == "INCONCLUSIVE" and thr.observed > 1.3 and "not judged: the A/A control" in thr.detail
    decision, reasons = g.decide(list(noisy.values()))
    assert decision == "HOLD" and any(r.startswith("noise_floor INCONCLUSIVE") for r in reasons), reasons
    quiet = {r.name: r for r in compare.compare_gates(ctx, _training_res(stalled_round=None), costs_)}
    assert quiet["noise_floor"].verdict == "PASS" and quiet["noise_floor"].blocking
    assert quiet["throughput_ratio"].verdict == "PASS" and 0.9 < quiet["throughput_ratio"].observed < 1.1


def test_runpod_job_times_in_milliseconds_become_seconds() -> None:
    # Runpod's job record (docs/reference/providers.md 2.4): delayTime 812 ms queued, executionTime
    # 143 ms running; the local endpoint reports seconds itself.
    from runbook_lib.measure.timing import job_timings

    rp = job_timings({"status": "COMPLETED", "delayTime": 812, "executionTime": 143})
    assert rp["queue_s"] == pytest.approx(0.812) and rp["execution_s"] == pytest.approx(0.143)
    assert rp["init_s"] != rp["init_s"]  # NaN: Runpod does not report it
    local = job_timings({"queue_s": 0.5, "init_s": 0.0, "execution_s": 0.25})
    assert (local["queue_s"], local["init_s"], local["execution_s"]) == (0.5, 0.0, 0.25)


def test_a_lost_source_measurement_leaves_the_baseline_unjudged() -> None:
    def refused(k: int) -> None:
        raise ProviderError("POST /runsync failed: ConnectError")

    lost = compare.lost_measurements([with_retries(refused, what="cold start source", kind="cold_start",
                                                   side="source", retries=1, interval_s=0.0, sleep=Sleeps())])
    assert set(lost) == {"cold_start_ratio", "baseline_health"}  # not error_rate: that judges the target


def _job_api(answers: dict[str, list[Any]], seen: list[Any]) -> Any:
    import httpx

    def handle(request: httpx.Request) -> httpx.Response:
        op = request.url.path.strip("/").split("/")[0]
        seen.append((request.method, request.url.path, json.loads(request.content or b"null")))
        status, body, headers = answers[op].pop(0)
        return httpx.Response(status, json=body, headers=headers)

    return httpx.Client(base_url="http://endpoint.test", transport=httpx.MockTransport(handle))


def test_the_job_client_polls_at_a_rate_limit_safe_cadence_and_honours_retry_after() -> None:
    from runbook_lib.measure.timing import POLL_MAX_S, POLL_START_S, JobClient

    seen: list[Any] = []
    running = (200, {"id": "j1", "status": "IN_PROGRESS"}, {})
    answers = {"runsync": [running], "status": [running, (429, {"error": "slow down"}, {"Retry-After": "3"}),
                                                 running, running, running, running,
                                                 (200, {"id": "j1", "status": "COMPLETED", "output": [1]}, {})]}
    sleeps = Sleeps()
    client = JobClient("http://endpoint.test", http=_job_api(answers, seen), ttl_s=60, sleep=sleeps)
    assert client.runsync("x")["status"] == "COMPLETED"
    # doubling from 0.5 s to the 5 s ceiling; the 429 waited its Retry-After, then the read was sent again
    assert sleeps.calls == [POLL_START_S, 1.0, 3.0, 2.0, 4.0, POLL_MAX_S, POLL_MAX_S]
    assert seen[0][2] == {"input": "x", "policy": {"ttl": 60_000}}  # the TTL travels with the job, in ms


def test_the_client_timeout_is_waited_out_whole_before_the_job_is_cancelled() -> None:
    """A job still queued after 0.5 + 1 + 2 s of polls has 0.5 s of its 4 s client timeout left:
    the client waits exactly that, polls once more, and only then cancels (it used to give up at
    3.5 s, when the next doubled wait would have overshot, and report 4 s)."""
    from runbook_lib.measure.timing import JobClient

    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    seen: list[Any] = []
    queued = (200, {"id": "j1", "status": "IN_QUEUE"}, {})
    answers = {"status": [queued] * 4, "cancel": [(200, {"id": "j1", "status": "CANCELLED"}, {})]}
    client = JobClient("http://endpoint.test", http=_job_api(answers, seen), sleep=sleep, clock=lambda: now[0])
    gave_up = client.wait({"id": "j1", "status": "IN_QUEUE"}, client_timeout_s=4.0)
    assert gave_up["status"] == "CLIENT_TIMEOUT" and gave_up["cancelled"] and now[0] == 4.0
    assert [path for _, path, _ in seen] == ["/status/j1"] * 4 + ["/cancel/j1"]
    assert "gave up after 4.0 s (client timeout 4 s)" in gave_up["error"]


def test_a_refused_submission_is_a_machinery_failure_and_is_never_resent() -> None:
    from runbook_lib.measure.timing import JobClient

    seen: list[Any] = []
    answers = {"run": [(429, {"error": "rate limited"}, {"Retry-After": "1"})]}
    client = JobClient("http://endpoint.test", http=_job_api(answers, seen), sleep=Sleeps())
    with pytest.raises(ProviderError, match="rate limited .*a machinery failure"):
        client.run("x")
    assert len(seen) == 1  # a resent job could run twice


def test_phase_04_records_each_clock_and_what_it_ended() -> None:
    from runbook_lib.params import Measure

    res = _res([])
    res.samples.loc[0, "status"] = "TIMED_OUT"
    res.throughput["failed_by_status"] = ['{"CLIENT_TIMEOUT": 2}', "{}", "{}", "{}"]
    res.cold_starts.loc[1, "first_status"] = "EXPIRED"
    rows = {r.clock: r for r in compare.clocks_record(Measure(job_ttl_s=600), res)}
    assert rows["execution timeout"].setting_s == 30.0 and rows["execution timeout"].ended == {
        "source": 1, "target": 0}
    assert rows["job TTL"].setting_s == 600 and rows["job TTL"].ended == {"source": 0, "target": 1}
    assert rows["client timeout"].ended == {"source": 2, "target": 0}


def test_the_load_generator_heap_is_frozen_while_it_measures_and_released_after() -> None:
    assert gc.get_freeze_count() == 0
    with frozen_heap() as pauses:
        # everything alive at entry is out of the collector's reach (gc.get_freeze_count's own count)
        assert pauses.frozen_objects > 1000 and gc.get_freeze_count() > 1000
        cycle: list[Any] = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1  # a collection inside the block still frees new garbage...
        assert pauses.collections >= 1 and pauses.full_collections >= 1  # ...and is counted
        assert 0 < pauses.longest_pause_s <= pauses.total_pause_s
    assert gc.get_freeze_count() == 0  # unfrozen on exit
    n = pauses.collections
    gc.collect()
    assert pauses.collections == n  # the counter is gone with the block


def test_a_heap_frozen_before_stays_frozen() -> None:
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        with frozen_heap():
            pass
        assert gc.get_freeze_count() >= before  # not unfrozen by a block that did not freeze it first
    finally:
        gc.unfreeze()


def _sequential_ctx(gates: dict[str, Any] | None = None, **measure: Any) -> SimpleNamespace:
    """The demo's params (judged sequentially), with ``gates`` and ``measure`` settings changed."""
    data = parse_yaml((ROOT / "params" / "demo.yaml").read_text())
    assert data["gates"]["method"] == "sequential"
    data["measure"].update(measure)
    data["gates"].update(gates or {})
    return SimpleNamespace(mig=validate(data), evidence=SimpleNamespace(add_gates=lambda *r: list(r)))


def _sequential_run(ctx: SimpleNamespace, slower: float, seed: int, drift: float = 0.0,
                    target_failures: float = 0.0) -> tuple[list[tuple[int, str]], compare.Measured]:
    """Phase 04's real round schedule (compare.schedule_rounds) with its live look, over rounds
    of 200 lognormal latencies (between-round spread 2 %) and a saturation throughput each; the
    target ``slower`` times the source in both; the host ``drift`` slower (log scale) each round."""
    rng = np.random.default_rng(seed)
    run: list[tuple[int, str]] = []
    rows: list[dict[str, Any]] = []
    thr: list[dict[str, Any]] = []

    def run_round(r: int, side: str) -> int:
        run.append((r, side))
        f = (slower if side == "target" else 1.0) * rng.lognormal(0.0, 0.02) * np.exp(drift * r)
        failed = rng.random(200) < (target_failures if side == "target" else 0.0)
        rows.extend({"side": side, "round": r, "request": i, "total_s": v * f,
                     "status": "FAILED" if failed[i] else "COMPLETED", "accepted": not failed[i]}
                    for i, v in enumerate(rng.lognormal(-2.0, 0.2, size=200)))
        thr.append({"side": side, "round": r, "requests": 48.0, "completed": 48.0, "failed": 0.0, "elapsed_s": f,
                    "throughput_units_per_s": 48.0 / f})
        return 200

    compare.schedule_rounds(ctx, run_round, look=lambda: seqmod.should_stop(ctx.mig, pd.DataFrame(rows),
                                                                            pd.DataFrame(thr)))
    res = compare.Measured(samples=pd.DataFrame(rows), throughput=pd.DataFrame(thr), target_workers_ready=1,
                           cold_starts=pd.DataFrame([{"side": "source", "cold_start_s": 2.0, "first_status": "COMPLETED"},
                                                     {"side": "target", "cold_start_s": 2.1, "first_status": "COMPLETED"}]),
                           attempts=[], billed_s={"source": 60.0, "target": 60.0},
                           egress_bytes={"source": 0.0, "target": 0.0}, spend=SpendRecord())
    return run, res


def test_sequential_phase_04_stops_at_the_first_decided_look_and_its_evidence_re_derives_it() -> None:
    # A target 2.5 times slower than the source against the demo's max of 2.0: NO-GO in fewer
    # rounds than the fixed horizon's 8 a side, at the first look where both blocking ratios are
    # decided; judging the raw samples again finds the same stopping pair (sequential_stop PASS).
    ctx = _sequential_ctx()
    run, res = _sequential_run(ctx, slower=2.5, seed=1)
    pairs = len(run) // 2
    assert [side for _, side in run] == compare.round_sides(len(run)) and ctx.mig.measure.min_rounds <= pairs < 8
    gates = {r.name: r for r in compare.compare_gates(ctx, res, _costs())}
    assert gates["latency_p95_ratio"].verdict == "FAIL" and gates["latency_p95_ratio"].samples == {"pairs": pairs}
    assert gates["sequential_stop"].verdict == "PASS" and gates["sequential_stop"].blocking
    assert g.decide(list(gates.values()))[0] == "NO-GO"
    rec = seqmod.record(seqmod.traces(ctx.mig, res.samples, res.throughput), ctx.mig)
    assert rec.pairs_measured == rec.stopped_at_pair == pairs
    assert max(gt.decided_at_pair or 0 for gt in rec.gates.values()) == pairs  # the later of the two decisions
    assert [lk.pairs for lk in rec.gates["latency_p95_ratio"].looks] == list(range(1, pairs + 1))
    # One pair more than the rule allows (measuring past the decision, or rounds added afterwards):
    def _plus_a_pair(df: pd.DataFrame) -> pd.DataFrame:
        return pd.concat([df, df[df["round"] < 2].assign(round=lambda d: d["round"] + 2 * pairs)])

    more = compare.Measured(**{**res.__dict__, "samples": _plus_a_pair(res.samples),
                               "throughput": _plus_a_pair(res.throughput)})
    stop = {r.name: r for r in compare.compare_gates(ctx, more, _costs())}["sequential_stop"]
    assert stop.verdict == "FAIL" and f"decided at pair {pairs}" in stop.detail


def test_a_failing_target_stops_the_sequential_measurement_at_its_first_look() -> None:
    # The demo's error_rate_max is 0: a failed target request decides error_rate FAIL at once, so
    # the measurement stops at the first look (2 pairs), NO-GO, whatever the ratios would say.
    ctx = _sequential_ctx()
    run, res = _sequential_run(ctx, slower=1.0, seed=6, target_failures=0.02)
    assert len(run) == 4
    gates = {r.name: r for r in compare.compare_gates(ctx, res, _costs())}
    assert gates["error_rate"].verdict == "FAIL" and gates["sequential_stop"].verdict == "PASS"
    assert g.decide(list(gates.values()))[0] == "NO-GO"
    rec = seqmod.record(seqmod.traces(ctx.mig, res.samples, res.throughput), ctx.mig)
    assert rec.gates["error_rate"].decided_at_pair == 1 and rec.stopped_at_pair == 2
    # A positive maximum is judged on the Bernoulli rate's sequence: 1 % allowed, about 2 % seen
    # over 800 requests: its sequence lies above 1 %: FAIL, with the sequence as its interval.
    loose = _sequential_ctx(gates={"error_rate_max": 0.01})
    _, res = _sequential_run(loose, slower=1.0, seed=6, target_failures=0.04)
    err = {r.name: r for r in compare.compare_gates(loose, res, _costs())}["error_rate"]
    assert "Bernoulli confidence sequence" in err.method and err.interval is not None
    assert err.verdict == "FAIL" and err.interval[0] > 0.01


def test_a_host_that_drifts_still_holds_under_the_sequential_gates() -> None:
    # Identical sides on a host 15 % slower every round. Alternating pairs (S,T then T,S) keep the
    # drift out of the ratios' mean, so the sequences may decide; the A/A noise floor (the first
    # block's two source rounds, three rounds apart) sees the drift and holds the decision.
    ctx = _sequential_ctx()
    _, res = _sequential_run(ctx, slower=1.0, seed=5, drift=0.15)
    gates = {r.name: r for r in compare.compare_gates(ctx, res, _costs())}
    assert gates["noise_floor"].verdict == "INCONCLUSIVE" and gates["noise_floor"].blocking
    assert gates["latency_p95_ratio"].verdict != "FAIL" and gates["sequential_stop"].verdict == "PASS"
    decision, reasons = g.decide(list(gates.values()))
    assert decision == "HOLD" and any(r.startswith("noise_floor INCONCLUSIVE") for r in reasons)


def test_runbook_run_says_how_many_rounds_a_sequential_phase_04_needed() -> None:
    from runbook_lib.evidence.records import CompareData
    from runbook_lib.run.runner import sequential_line

    ctx = _sequential_ctx()
    _, res = _sequential_run(ctx, slower=2.5, seed=1)
    rec = seqmod.record(seqmod.traces(ctx.mig, res.samples, res.throughput), ctx.mig)
    assert sequential_line(CompareData(sequential=rec)) == "sequential gates: decided at pair 3 of 8 (3 rounds a side)"
    assert sequential_line(CompareData()) == ""  # the fixed method says nothing more


def test_sequential_phase_04_runs_to_its_budget_when_the_target_sits_on_the_margin() -> None:
    # A target exactly at the latency max never leaves the margin: the whole budget (4 pairs
    # here) is measured and the latency gate ends INCONCLUSIVE with the sequence it reached.
    ctx = _sequential_ctx(max_rounds=4)
    run, res = _sequential_run(ctx, slower=2.0, seed=2)
    assert len(run) == 8
    gates = {r.name: r for r in compare.compare_gates(ctx, res, _costs())}
    assert gates["latency_p95_ratio"].verdict == "INCONCLUSIVE" and "budget 4 a side" in gates["latency_p95_ratio"].detail
    assert gates["sequential_stop"].verdict == "PASS" and "budget of 4 pairs reached" in gates["sequential_stop"].detail


def test_an_option_the_chosen_method_does_not_read_is_refused() -> None:
    data = parse_yaml((ROOT / "params" / "demo.yaml").read_text())
    data["measure"]["rounds"] = 6  # the fixed horizon, under the demo's sequential method
    with pytest.raises(ParamsError, match=r"measure\.rounds is not read under gates\.method 'sequential'"):
        validate(data)
    data = _fixed_demo()
    data["measure"]["max_rounds"] = 6  # fixed method: the sequential budget would be ignored
    with pytest.raises(ParamsError, match=r"measure\.max_rounds is not read under gates\.method 'fixed'"):
        validate(data)
    data = parse_yaml((ROOT / "params" / "demo.yaml").read_text())
    data["measure"].update(min_rounds=4, max_rounds=3)
    with pytest.raises(ParamsError, match=r"measure\.max_rounds \(3\) is below measure\.min_rounds \(4\)"):
        validate(data)


def _slo_ctx(slo_s: float) -> SimpleNamespace:
    ctx = _sequential_ctx()
    data = parse_yaml((ROOT / "params" / "demo.yaml").read_text())
    data["workload"]["requirements"]["max_request_s"] = slo_s
    return SimpleNamespace(mig=validate(data), evidence=ctx.evidence)


def test_the_latency_slo_is_judged_on_its_sequence_and_a_breach_stops_the_measurement() -> None:
    # Latencies are lognormal(-2, 0.2) seconds: about 11 % of them exceed 0.17 s, beyond the 5 %
    # an SLO at p95 allows. The demo sets its SLO, so the gate blocks and takes part in the stop
    # rule: the Bernoulli sequence of the share over lies wholly above 5 % at the first look.
    ctx = _slo_ctx(0.17)
    run, res = _sequential_run(ctx, slower=1.0, seed=3)
    assert len(run) == 4  # stopped at the minimum, 2 pairs
    gates = {r.name: r for r in compare.compare_gates(ctx, res, _costs())}
    slo = gates["latency_slo"]
    assert slo.verdict == "FAIL" and "Bernoulli confidence sequence" in slo.method and slo.interval is not None
    over = int((res.samples[res.samples["side"] == "target"]["total_s"] > 0.17).sum())
    lower, upper = sq.bernoulli_sequence(over, 400)  # the two target rounds' 400 requests
    assert slo.interval == pytest.approx((lower, upper)) and lower > 0.05
    assert g.decide(list(gates.values()))[0] == "NO-GO"
    # Nothing near the SLO: 200 requests with none over put the sequence's upper end at
    # 1 - (0.1 / 201) ** (1 / 200) = 3.7 % (the mixture's closed form with k = 0): PASS.
    ctx = _slo_ctx(10.0)
    _, res = _sequential_run(ctx, slower=1.0, seed=3)
    slo = {r.name: r for r in compare.compare_gates(ctx, res, _costs())}["latency_slo"]
    assert slo.verdict == "PASS" and "decided at pair 2" in slo.detail


def test_the_sequential_cost_gate_prices_each_pair_of_rounds_and_follows_its_throughput() -> None:
    # The demo at its declared 30 requests/s: each side has one worker, kept warm. A round of
    # capacity c requests/s serves min(30, c), is billed for max(1, served / c) workers at the
    # side's price plus 1 GB of storage a month (730 h), and accepts every answer: USD per
    # accepted unit = (workers x price + storage / 730) / (served x 3600).
    ctx = _sequential_ctx()
    _, res = _sequential_run(ctx, slower=1.5, seed=4)
    at = compare.judge.costs_at_traffic(ctx.mig, res)
    assert at is not None
    per = compare.judge.round_costs(ctx.mig, res, _costs(), at)
    t = res.throughput.sort_values("round")
    for side, price, storage in (("source", 0.44, 0.10), ("target", 0.29, 0.07)):
        caps = [float(x) for x in t[t["side"] == side]["throughput_units_per_s"]]
        assert per[side] == pytest.approx([(max(1.0, min(30, c) / c) * price + storage / 730) / (min(30, c) * 3600)
                                           for c in caps])
    gate = {r.name: r for r in compare.compare_gates(ctx, res, _costs(), at)}["cost_per_accepted_unit"]
    ratios = np.array(per["target"]) / np.array(per["source"])  # warm-bound both: (0.29 + ...) / (0.44 + ...) = 0.66
    assert gate.observed == pytest.approx(float(np.exp(np.log(ratios).mean())))
    assert "one per pair of rounds" in gate.method and "at the declared traffic" in gate.method
    assert gate.threshold == 1.0 and gate.blocking
    rec = seqmod.record(seqmod.traces(ctx.mig, res.samples, res.throughput, per), ctx.mig)
    assert len(rec.gates["cost_per_accepted_unit"].looks) == rec.pairs_measured
    assert gate.verdict == "PASS" and gate.interval is not None and gate.interval[1] < 0.7
    # A target 4 times slower serves 12 of the 30 requests/s: 0.66 x 30 / 12 = 1.65 times the
    # source's USD per accepted unit: FAIL.
    ctx = _sequential_ctx()
    _, res = _sequential_run(ctx, slower=4.0, seed=4)
    at = compare.judge.costs_at_traffic(ctx.mig, res)
    gate = {r.name: r for r in compare.compare_gates(ctx, res, _costs(), at)}["cost_per_accepted_unit"]
    assert gate.verdict == "FAIL" and gate.interval is not None and gate.interval[0] > 1.0


def test_the_sequential_a_a_floor_judges_the_first_blocks_source_rounds() -> None:
    # Three pairs; the third source round (round 4) is three times slower. The fixed method's
    # floor (first and last source rounds) is INCONCLUSIVE; the sequential one judges the first
    # block's two source rounds, which every stopping point includes, and they agree.
    rng = np.random.default_rng(9)
    rows = [{"side": side, "round": r, "request": i, "total_s": v * (3.0 if r == 4 else 1.0), "status": "COMPLETED",
             "accepted": True}
            for r, side in enumerate(compare.round_sides(6)) for i, v in enumerate(rng.lognormal(-2.0, 0.2, 200))]
    res = _res([])
    res = compare.Measured(**{**res.__dict__, "samples": pd.DataFrame(rows)})
    seq = {r.name: r for r in compare.judge.judge(_sequential_ctx().mig, res, _costs())}["noise_floor"]
    fixed = {r.name: r for r in compare.judge.judge(validate(_fixed_demo()), res, _costs())}["noise_floor"]
    assert seq.verdict == "PASS" and fixed.verdict == "INCONCLUSIVE"


def test_a_streaming_service_judges_ttft_and_tpot_on_sequences_that_take_part_in_the_stop() -> None:
    # The chat service demo judged sequentially: its target's first token comes 4 times later
    # (the latency margin is 3.0) while the whole answers take as long. The TTFT p95 ratio is a
    # sequential gate in the stop rule: it FAILs, the measurement stops, the decision is NO-GO.
    data = parse_yaml((ROOT / "params" / "demo-service.yaml").read_text())
    data["gates"]["method"] = "sequential"
    for unread in ("rounds", "max_extra_rounds"):
        data["measure"].pop(unread, None)
    ctx = SimpleNamespace(mig=validate(data), evidence=SimpleNamespace(add_gates=lambda *r: list(r)))
    rng = np.random.default_rng(2)
    run: list[int] = []
    rows: list[dict[str, Any]] = []
    thr: list[dict[str, Any]] = []

    def run_round(r: int, side: str) -> int:
        run.append(r)
        ttft = rng.lognormal(-3.0, 0.2, 100) * (4.0 if side == "target" else 1.0)
        rows.extend({"side": side, "round": r, "request": i, "total_s": 0.5 + rng.normal(0, 0.01), "status": "COMPLETED",
                     "accepted": True, "ttft_s": ttft[i], "tpot_s": 0.01} for i in range(100))
        thr.append({"side": side, "round": r, "requests": 8.0, "completed": 8.0, "failed": 0.0, "elapsed_s": 1.0,
                    "throughput_units_per_s": 8.0})
        return 100

    compare.schedule_rounds(ctx, run_round, look=lambda: seqmod.should_stop(ctx.mig, pd.DataFrame(rows),
                                                                            pd.DataFrame(thr)))
    found = {t.name: t for t in seqmod.traces(ctx.mig, pd.DataFrame(rows), pd.DataFrame(thr))}
    assert {"ttft_p95_ratio", "tpot_p95_ratio"} <= set(found) and found["ttft_p95_ratio"].stops
    assert found["ttft_p95_ratio"].decided is not None and found["ttft_p95_ratio"].decided.verdict == "FAIL"
    assert len(run) // 2 == seqmod.stop_pair(list(found.values()), ctx.mig.measure.min_rounds) < 8
    res = _res([])
    res = compare.Measured(**{**res.__dict__, "samples": pd.DataFrame(rows), "throughput": pd.DataFrame(thr)})
    gates = {r.name: r for r in compare.judge.judge(ctx.mig, res, _costs())}
    assert gates["ttft_p95_ratio"].verdict == "FAIL" and "TTFT p95 ratio, one per pair" in gates["ttft_p95_ratio"].method
    assert gates["tpot_p95_ratio"].verdict == "PASS" and gates["sequential_stop"].verdict == "PASS"


def test_the_sequential_measurement_stops_at_its_seconds_budget_and_its_evidence_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Each round takes 10 s (a clock the rounds move); measure.max_seconds 45: after two pairs
    # (40 s) a third, as long as the longest (20 s), would pass 45 s, so the rounds stop there. A
    # target on the margin leaves the latency gate undecided: INCONCLUSIVE with the sequence
    # reached, and sequential_stop PASS naming the seconds budget; recomputed from the recorded
    # pair seconds the same. Without the seconds the stop is unexplained (INCONCLUSIVE).
    from runbook_lib.phases.compare import protocol

    now = [0.0]
    monkeypatch.setattr(protocol, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    ctx = _sequential_ctx(max_seconds=45)
    pair_s: list[float] = []
    rng = np.random.default_rng(2)
    rows: list[dict[str, Any]] = []
    thr: list[dict[str, Any]] = []

    def run_round(r: int, side: str) -> int:
        now[0] += 10.0
        f = (2.0 if side == "target" else 1.0) * rng.lognormal(0.0, 0.02)
        rows.extend({"side": side, "round": r, "request": i, "total_s": v * f, "queue_s": 0.0, "init_s": 0.0,
                     "execution_s": v * f, "status": "COMPLETED", "accepted": True}
                    for i, v in enumerate(rng.lognormal(-2.0, 0.2, size=200)))
        thr.append({"side": side, "round": r, "requests": 48.0, "completed": 48.0, "failed": 0.0, "elapsed_s": f,
                    "throughput_units_per_s": 48.0 / f})
        return 200

    compare.schedule_rounds(ctx, run_round, look=lambda: seqmod.should_stop(ctx.mig, pd.DataFrame(rows),
                                                                            pd.DataFrame(thr)), pair_s=pair_s)
    assert pair_s == [20.0, 20.0] and seqmod.over_seconds(pair_s, 45) and not seqmod.over_seconds([20.0], 45)
    res = _res([])
    res = compare.Measured(**{**res.__dict__, "samples": pd.DataFrame(rows), "throughput": pd.DataFrame(thr),
                              "pair_s": pair_s})
    gates = {r.name: r for r in compare.judge.judge(ctx.mig, res, _costs())}
    assert gates["latency_p95_ratio"].verdict == "INCONCLUSIVE"
    stop = gates["sequential_stop"]
    assert stop.verdict == "PASS" and "would pass measure.max_seconds (45 s)" in stop.detail
    assert compare.judge.record_data(res, _costs(), compare.judge.summary(res), mig=ctx.mig).pair_seconds == (20.0, 20.0)
    unexplained = compare.Measured(**{**res.__dict__, "pair_s": []})
    assert {r.name: r for r in compare.judge.judge(ctx.mig, unexplained, _costs())}["sequential_stop"].verdict == \
        "INCONCLUSIVE"
    with pytest.raises(ParamsError, match=r"measure\.max_seconds is not read under gates\.method 'fixed'"):
        data = _fixed_demo()
        data["measure"]["max_seconds"] = 60
        validate(data)


def _service_rounds(method: str, rounds: int, *, usage: bool = True) -> tuple[Any, compare.Measured]:
    """demo-service judged with goodput_ratio_min 0.9 (TTFT SLO 0.5 s): the source's requests all
    within it, the target's first token late (1.0 s) on every other request, so the target's
    goodput is half the source's, round after round (worked by hand: 24 of 48 good)."""
    data = parse_yaml((ROOT / "params" / "demo-service.yaml").read_text())
    data["gates"]["method"] = method
    data["gates"]["goodput_ratio_min"] = 0.9
    if method == "sequential":
        for unread in ("rounds", "max_extra_rounds"):
            data["measure"].pop(unread, None)
    mig = validate(data)
    rng = np.random.default_rng(5)
    rows, thr = [], []
    for r, side in enumerate(compare.round_sides(rounds)):
        for i in range(48):
            late = side == "target" and i % 2 == 0
            rows.append({"side": side, "round": r, "request": i, "total_s": 0.05 + rng.normal(0, 0.002),
                         "execution_s": 0.05, "done_s": 9.6 + rng.normal(0, 0.01), "status": "COMPLETED",
                         "accepted": True, "ttft_s": 1.0 if late else 0.02, "tpot_s": 0.005,
                         "output_tokens": 16.0 if usage else float("nan")})
        thr.append({"side": side, "round": r, "requests": 16.0, "completed": 16.0, "failed": 0.0, "elapsed_s": 1.0,
                    "throughput_units_per_s": 16.0})
    res = _res([])
    return mig, compare.Measured(**{**res.__dict__, "samples": pd.DataFrame(rows), "throughput": pd.DataFrame(thr)})


@pytest.mark.parametrize(("method", "rounds"), [("fixed", 4), ("sequential", 8)])
def test_the_goodput_gate_fails_a_target_with_half_the_sources_goodput(method: str, rounds: int) -> None:
    mig, res = _service_rounds(method, rounds)
    gates = {r.name: r for r in compare.judge.judge(mig, res, _costs())}
    gp = gates["goodput_ratio"]
    assert gp.verdict == "FAIL" and gp.blocking and gp.observed == pytest.approx(0.5, rel=0.02)
    assert "goodput" in gp.method and gp.source in ("params gates.goodput_ratio_min", "gates.goodput_ratio_min")
    summary = compare.judge.token_summary(res, mig)
    assert summary["target"]["good share"] == 0.5 and summary["source"]["good share"] == 1.0
    assert summary["target"]["itl p50 (s)"] is None  # no inter-token table in this measurement


def test_without_token_counts_tpot_and_goodput_are_not_measurable_never_a_pass() -> None:
    mig, res = _service_rounds("fixed", 4, usage=False)
    mig = mig.model_copy(update={"workload": mig.workload.model_copy(update={"service": mig.workload.service.model_copy(
        update={"tpot_slo_s": 0.1})})})
    gates = {r.name: r for r in compare.judge.judge(mig, res, _costs())}
    assert gates["tpot_p95_ratio"].verdict == "NOT_APPLICABLE" and not gates["tpot_p95_ratio"].blocking
    assert "not measurable" in gates["tpot_p95_ratio"].detail
    assert gates["goodput_ratio"].verdict == "NOT_APPLICABLE" and gates["goodput_ratio"].blocking  # set: a HOLD
    assert gates["ttft_p95_ratio"].verdict != "NOT_APPLICABLE"  # TTFT needs no token count
    row = compare.judge.token_summary(res, mig)["target"]
    assert row["goodput (req/s)"] is None and "tokenizer" in str(row["not measurable"])
