"""Routers against real things: Debian's HAProxy on loopback in front of two tiny HTTP servers,
driven through its runtime API (weights moved while a loop sends requests, counters read back,
a server drained and one taken down), and a user's router given as two commands (a script).
Tests that need HAProxy fail in CI when it is missing (`make haproxy` installs it as root)."""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from runbook_lib.errors import ProviderError
from runbook_lib.traffic.router import SERVER_HEADER, CommandRouter, HAProxyRouter

from .runs import require_haproxy


# Debian's haproxy is installed by `make test-e2e`'s set-up (as root), not `make test`'s. These cases
# run no phase, so they hold the host lock shared: a 4-thread request loop must not run beside
# another case's timed phase.
def needs_haproxy(fn: Any) -> Any:
    return pytest.mark.e2e(pytest.mark.usefixtures("beside_untimed_phases")(fn))


class _Server:
    """An HTTP server on loopback answering ``/ping`` and ``POST /infer`` with its name; ``stop()``
    closes it (a server gone down)."""

    def __init__(self, name: str) -> None:
        me = self
        self.name, self.count, self.failing = name, 0, False

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                self._send({"status": "healthy"})

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                me.count += 1
                if me.failing:  # an answer, but an error: never resent, never lost
                    data = b'{"error": "model crashed"}'
                    self.send_response(500)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self._send({"output": me.name})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def routed(tmp_path: Path) -> Iterator[tuple[HAProxyRouter, _Server, _Server]]:
    require_haproxy()
    src, tgt = _Server("source"), _Server("target")
    router = HAProxyRouter.start(src.url, tgt.url, workdir=tmp_path / "haproxy", timeout_s=10)
    try:
        yield router, src, tgt
    finally:
        router.close()
        src.stop()
        tgt.stop()


def _served(router: HAProxyRouter, n: int) -> list[str]:
    with httpx.Client(base_url=router.url, timeout=10) as c:
        return [c.post("/infer", json={"input": i}).headers[SERVER_HEADER] for i in range(n)]


@needs_haproxy
def test_haproxy_moves_weights_without_a_reload_and_its_counters_agree_with_the_answers(routed) -> None:
    router, src, tgt = routed
    assert router.weights() == {"source": 100, "target": 0}
    assert set(_served(router, 20)) == {"source"}  # all traffic on the source at start
    pid = router.process.pid if router.process else None
    router.set_weights(50, 50)
    assert router.weights() == {"source": 50, "target": 50}
    before = router.stats()
    seen = _served(router, 40)
    after = router.stats()
    assert seen.count("target") == 20 and seen.count("source") == 20  # round robin, equal weights
    assert after["target"].requests - before["target"].requests == seen.count("target") == tgt.count
    assert after["source"].requests - before["source"].requests == seen.count("source")
    router.set_weights(0, 100)
    assert set(_served(router, 10)) == {"target"}
    assert router.process is not None and router.process.pid == pid and router.process.poll() is None  # no reload
    with pytest.raises(ValueError, match="not both be 0"):
        router.set_weights(0, 0)


@needs_haproxy
def test_no_request_is_lost_while_weights_move_under_a_4_thread_loop(routed) -> None:
    router, _, _ = routed
    stop, results, lock = threading.Event(), {"ok": 0, "failed": []}, threading.Lock()

    def loop() -> None:
        with httpx.Client(base_url=router.url, timeout=10) as c:
            while not stop.is_set():
                try:
                    ok = c.post("/infer", json={"input": 1}).status_code == 200
                    err = "" if ok else "status"
                except httpx.HTTPError as exc:
                    ok, err = False, type(exc).__name__
                with lock:
                    if ok:
                        results["ok"] += 1
                    else:
                        results["failed"].append(err)

    threads = [threading.Thread(target=loop) for _ in range(4)]
    for t in threads:
        t.start()
    for target in (10, 50, 100, 0):
        time.sleep(0.3)
        router.set_weights(100 - target, target)
    time.sleep(0.3)
    stop.set()
    for t in threads:
        t.join()
    assert results["failed"] == [] and results["ok"] > 100


@needs_haproxy
def test_a_drained_or_downed_server_takes_no_new_request_and_the_router_says_so(routed) -> None:
    router, src, tgt = routed
    router.set_weights(50, 50)
    router.drain("target")
    assert set(_served(router, 10)) == {"source"} and router.stats()["target"].state.startswith("DRAIN")
    router.ready("target")
    tgt.stop()  # the target goes down: health checks every second, down after two failures
    deadline = time.monotonic() + 10
    while not router.stats()["target"].state.startswith("DOWN"):
        assert time.monotonic() < deadline, router.stats()
        time.sleep(0.2)
    assert set(_served(router, 10)) == {"source"}


@needs_haproxy
def test_a_router_that_cannot_be_reached_or_lacks_the_servers_is_named(routed, tmp_path: Path) -> None:
    router, _, _ = routed
    with pytest.raises(ProviderError, match=r"cannot reach its admin socket .*nowhere\.sock"):
        HAProxyRouter.attach(str(tmp_path / "nowhere.sock"), "http://127.0.0.1:1", backend="migration",
                             servers={"source": "source", "target": "target"})
    with pytest.raises(ProviderError, match=r"no server migration/blue"):
        HAProxyRouter.attach(str(router.socket_path), router.url, backend="migration",
                             servers={"source": "source", "target": "blue"})
    attached = HAProxyRouter.attach(str(router.socket_path), router.url, backend="migration",
                                    servers={"source": "source", "target": "target"})
    attached.set_weights(70, 30)
    assert router.weights() == {"source": 70, "target": 30}
    attached.close()  # not ours: still running
    assert router.process is not None and router.process.poll() is None


SCRIPT_ROUTER = '''
import json, pathlib, sys
state = pathlib.Path(sys.argv[1])
if sys.argv[2] == "set":
    if sys.argv[3] == "13":
        sys.exit("refused: 13 is not allowed")
    state.write_text(json.dumps({"source": int(sys.argv[3]), "target": int(sys.argv[4])}))
elif sys.argv[2] == "get":
    print(state.read_text() if state.exists() else "not json")
'''


def test_a_command_router_sets_and_reads_back_weights_and_names_each_failure(tmp_path: Path) -> None:
    script = tmp_path / "router.py"
    script.write_text(SCRIPT_ROUTER)
    state = tmp_path / "weights.json"
    r = CommandRouter("http://127.0.0.1:9", [sys.executable, str(script), str(state), "set", "{source}", "{target}"],
                      [sys.executable, str(script), str(state), "get"])
    with pytest.raises(ProviderError, match="printed 'not json'"):
        r.weights()
    r.set_weights(90, 10)
    assert r.weights() == {"source": 90, "target": 10} and r.stats()["target"].weight == 10
    with pytest.raises(ProviderError, match=r"exited 1: refused: 13 is not allowed"):
        r.set_weights(13, 87)
    gone = CommandRouter("http://127.0.0.1:9", [str(tmp_path / "missing")], [str(tmp_path / "missing")])
    with pytest.raises(ProviderError, match="could not run"):
        gone.set_weights(100, 0)


def _rows(n_source: int, n_target: int, *, lost: int = 0) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i in range(n_source + n_target + lost):
        server = "source" if i < n_source else "target" if i < n_source + n_target else ""
        rows.append({"request": i, "input_index": 0, "sent_s": 0.01 * i, "total_s": 0.05, "server": server,
                     "status": "COMPLETED" if server else "LOST", "output": [0.0],
                     **({} if server else {"error": "ReadError: reset"})})
    return rows


def test_a_routed_window_fails_closed_on_each_thing_it_checks() -> None:
    from runbook_lib.phases.routed import Window, judge_window

    def judge(rows: list[dict[str, Any]], *, pct: int = 10, delta: dict[str, int] | None = None,
              states: dict[str, str] | None = None, read: dict[str, int] | None = None) -> Any:
        w = Window("step 1", pct, 0.0, 10.0, rows, delta or {"source": 90, "target": 10},  # type: ignore[arg-type]
                   states or {"source": "UP", "target": "UP"}, read or {"source": 100 - pct, "target": pct})
        return judge_window(w, tolerance=0.05, bound_s=1.0, accepted=lambda r: True, before=None)

    ok = judge(_rows(90, 10))
    assert ok.passed and ok.router_share_replay == 0.1 == ok.router_share_counters and ok.lost == 0
    lost = judge(_rows(90, 10, lost=1))
    assert not lost.passed and lost.lost == 1 and "1 request(s) lost (first sent at 1.00 s: ReadError" in lost.problems[0]
    read = judge(_rows(90, 10), read={"source": 100, "target": 0})
    assert not read.passed and "weights read back {'source': 100, 'target': 0}, not the 90/10 set" in read.problems
    apart = judge(_rows(90, 10), delta={"source": 70, "target": 30})
    assert not apart.passed and any("from the router's counters 0.300 differ" in p for p in apart.problems)
    down = judge(_rows(100, 0), states={"source": "UP", "target": "DOWN"})
    assert any("the router reports target DOWN" in p for p in down.problems)
    assert any("share 0.000 is not its weight 10 %" in p for p in down.problems)
    assert judge(_rows(100, 0), pct=0, delta={"source": 100, "target": 0},
                 states={"source": "UP", "target": "DRAIN"}).passed  # after a rollback: drained, all on source
    # Fail closed on what cannot be shown: no request in the window, counters that cannot be read
    # (a command router whose read-back has no stats), a router counting nothing; and the source
    # failing requests fails a step too.
    assert "no replayed request was sent in the window" in judge([], delta={"source": 0, "target": 0}).problems[0]
    blind = judge(_rows(90, 10), delta={"source": -1, "target": -1})
    assert not blind.passed and any("counters could not be read" in p for p in blind.problems)
    silent = judge(_rows(90, 10), delta={"source": 0, "target": 0})
    assert any("the router counted no request while the replay had 100 answered" in p for p in silent.problems)
    src_fail = _rows(90, 10)
    src_fail[0].update(status="FAILED", failure="ERROR_BODY", error="CUDA error: out of memory")
    assert "the source failed 1 request(s); ERROR_BODY x1; first: CUDA error: out of memory" in judge(src_fail).problems
    # The rollback window: the target's falling share and its own failures are not judged there,
    # the rest is (weights all-source, the source up).
    w = Window("rollback", 0, 0.0, 10.0, _rows(95, 5), {"source": 95, "target": 5},  # type: ignore[arg-type]
               {"source": "UP", "target": "DRAIN"}, {"source": 100, "target": 0})
    assert judge_window(w, tolerance=0.05, bound_s=1.0, accepted=lambda r: True, before=None, rollback=True).passed
    w.weights_read = {"source": 90, "target": 10}
    w.states = {"source": "DOWN", "target": "DRAIN"}
    back = judge_window(w, tolerance=0.05, bound_s=1.0, accepted=lambda r: True, before=None, rollback=True)
    assert not back.passed and any("source DOWN" in p for p in back.problems)
    assert any("weights read back {'source': 90, 'target': 10}" in p for p in back.problems)


def test_a_window_whose_replay_fell_behind_is_judged_only_on_failures_and_holds_the_cutover() -> None:
    """A replay that sends later than measure.max_send_lateness_s puts requests in the wrong window:
    its shares then disagree with the router's counters for no fault of the router's. The window
    fails on that alone (lost and failed requests still count), naming the lateness and the fix."""
    from runbook_lib.phases.routed import Window, judge_window

    rows = _rows(60, 40)  # 40 % on the target at a 10 % weight: what a slipping schedule looks like
    for r in rows:
        r["intended_s"] = r["sent_s"] - (0.5 if r["request"] % 2 else 0.0)  # half sent 0.5 s late
    w = Window("step 1", 10, 0.0, 10.0, rows, {"source": 90, "target": 10},  # type: ignore[arg-type]
               {"source": "UP", "target": "UP"}, {"source": 90, "target": 10})
    got = judge_window(w, tolerance=0.05, bound_s=1.0, accepted=lambda r: True, before=None, max_lateness_s=0.1,
                       rate_per_s=800.0)
    assert not got.passed and got.problems == (got.replay_behind,)
    assert got.replay_behind.startswith("the replay fell behind its schedule: 50 of 100 requests sent more than "
                                        "0.1 s late (worst 0.50 s)")
    assert "lower cutover.router.arrival_rate_per_s (now 800/s)" in got.replay_behind
    rows[3].update(status="FAILED", failure="ERROR_BODY", error="boom", server="source")
    both = judge_window(w, tolerance=0.05, bound_s=1.0, accepted=lambda r: True, before=None, max_lateness_s=0.1)
    assert both.problems[0].startswith("the source failed 1 request(s)") and both.problems[-1] == both.replay_behind
    on_time = judge_window(w, tolerance=0.05, bound_s=1.0, accepted=lambda r: True, before=None, max_lateness_s=1.0)
    assert on_time.replay_behind == "" and any("share 0.400 is not its weight 10 %" in p for p in on_time.problems)
    # phase 05's gate: a cutover whose only failing windows fell behind is INCONCLUSIVE (HOLD), not FAIL
    from runbook_lib.evidence.records import InferenceStep
    from runbook_lib.phases.cutover import slices_verdict

    step = [InferenceStep(step=1, target_percent=10, mode="drain (haproxy router)", passed=False)]
    assert slices_verdict(step, [got]) is None
    assert slices_verdict(step, [both]) is False and slices_verdict(step, [on_time]) is False
    assert slices_verdict([step[0].model_copy(update={"passed": True})], []) is True
    # its detail ends with what failed the first failing step: a window's problems (the first
    # window is the steady state, named by its own clause), or a client-split step's p95
    from runbook_lib.phases.cutover import first_failure

    steady = judge_window(Window("steady state before the first step", 0, 0.0, 10.0, _rows(100, 0),
                                 {"source": 100, "target": 0}, {"source": "UP", "target": "UP"},  # type: ignore[arg-type]
                                 {"source": 100, "target": 0}),
                          tolerance=0.05, bound_s=1.0, accepted=lambda r: True, before=None)
    assert steady.passed and first_failure(step, [steady, on_time]) == (
        "; step 1 failed: the source failed 1 request(s); ERROR_BODY x1; first: boom; the target's share from the "
        "replay 0.400 and from the router's counters 0.100 differ by more than 0.090; the target's share 0.400 is not "
        "its weight 10 %")
    slow = InferenceStep(step=3, target_percent=100, passed=False, target_p95_s=0.61, p95_bound_s=0.5)
    assert first_failure([step[0].model_copy(update={"passed": True}), slow], []) == (
        "; step 3 failed: the target's p95 0.610 s is above the bound 0.500 s")
    assert first_failure([slow.model_copy(update={"target_failed_as": "FAILED x1"})], []) == ""


def test_every_replayed_request_is_counted_in_exactly_one_window() -> None:
    # Windows start before their weights change and run to the next window's start: a request
    # lost while a step was being judged (after its judged part) is counted in that step, and
    # fails it.
    from runbook_lib.evidence.records import RoutedWindow
    from runbook_lib.phases.routed import evidence, whole_spans

    rows = [{"request": i, "sent_s": float(i), "status": "COMPLETED", "server": "source"} for i in range(10)]
    rows[4] = {"request": 4, "sent_s": 4.0, "status": "LOST", "server": ""}
    judged = [RoutedWindow(window="steady", target_percent=0, passed=True, start_s=0.0, end_s=3.0),
              RoutedWindow(window="step 1", target_percent=10, passed=True, start_s=3.5, end_s=4.0),
              RoutedWindow(window="step 2", target_percent=50, passed=True, start_s=6.0, end_s=8.0)]
    spans = whole_spans(judged, rows)  # type: ignore[arg-type]
    assert [w.sent for w in spans] == [4, 2, 4] and sum(w.sent for w in spans) == len(rows)
    assert [w.lost for w in spans] == [0, 1, 0] and [w.end_s for w in spans] == [3.5, 6.0, 8.0]
    assert not spans[1].passed and "1 request(s) lost after the judged part of the window" in spans[1].problems[-1]
    ev = evidence("haproxy", "http://127.0.0.1:1", 1.0, spans, rows)  # type: ignore[arg-type]
    assert (ev.requests, ev.lost, ev.first_lost_at_s, ev.first_lost_window) == (10, 1, 4.0, "step 1")


def test_a_router_that_outlives_the_run_is_set_back_to_the_source_and_read_back(tmp_path: Path) -> None:
    from runbook_lib.params import RouterParams
    from runbook_lib.phases.routed import restore_source

    script = tmp_path / "router.py"
    script.write_text(SCRIPT_ROUTER)
    state = tmp_path / "weights.json"
    state.write_text(json.dumps({"source": 0, "target": 100}))  # the cutover left all traffic on the target
    rp = RouterParams(kind="command", url="http://127.0.0.1:9",
                      set_command=(sys.executable, str(script), str(state), "set", "{source}", "{target}"),
                      read_command=(sys.executable, str(script), str(state), "get"))
    ok, seen = restore_source(rp, tmp_path)  # type: ignore[misc]
    assert ok and json.loads(state.read_text()) == {"source": 100, "target": 0} and "read back" in seen
    broken = rp.model_copy(update={"set_command": (str(tmp_path / "missing"),)})
    ok, seen = restore_source(broken, tmp_path)  # type: ignore[misc]
    assert not ok and "could not be set back to the source" in seen
    assert restore_source(RouterParams(kind="haproxy"), tmp_path) is None  # the runbook's own: stopped in phase 05
    assert restore_source(RouterParams(), tmp_path) is None  # the client split holds no router


def _moved(router: HAProxyRouter, on_step: Any, *, rate: float = 40.0, window_s: float = 1.5) -> tuple[list[Any], list[Any]]:
    """phase 05's routed cutover (routed.move) through ``router`` under a real replay at ``rate``
    requests/s: steps of 10, 50 and 100 %, windows of ``window_s``, a 2 s rollback limit;
    ``on_step(k)`` runs before step k's weights move. Returns the windows (whole spans) and rows."""
    from runbook_lib.phases.routed import Replay, StepRule, move, whole_spans

    rule = StepRule(window_s=window_s, tolerance=0.1, bound_s=1.0, accepted=lambda r: r.get("output") in ("source", "target"),
                    rollback_within_s=2.0, timeout_s=10.0)
    replay = Replay(router.url, [(i, f"input {i}") for i in range(50)], rate_per_s=rate, timeout_s=10.0, seed=1)
    replay.start()
    try:
        windows = move(replay, router, [10, 50, 100], rule, before_step=lambda k, pct: on_step(k))
    finally:
        replay.stop()
    rows = sorted(replay.rows, key=lambda r: r["sent_s"])
    return whole_spans(windows, rows), rows


@needs_haproxy
def test_a_failing_step_rolls_back_under_load_with_nothing_lost(routed) -> None:
    # The target starts answering errors at the 50 % step while the replay runs through HAProxy:
    # that step fails, the target is set to 0 and drained under load, nothing is lost, the source
    # serves everything within the 2 s limit, and every replayed request is in one window.
    router, _src, tgt = routed

    def on_step(k: int) -> None:
        tgt.failing = k == 1

    windows, rows = _moved(router, on_step)
    assert [w.window for w in windows] == ["steady state before the first step", "step 1", "step 2", "rollback"]
    assert [w.passed for w in windows] == [True, True, False, True], [w.problems for w in windows]
    assert any(p.startswith("the target failed") for p in windows[2].problems)
    back = windows[3]
    assert back.lost == 0 and back.source_serves_all_after_s is not None and back.source_serves_all_after_s <= 2.0
    assert back.weights_read == {"source": 100, "target": 0}
    assert sum(w.sent for w in windows) == len(rows) and not any(r["status"] == "LOST" for r in rows)
    late = [r for r in rows if r["sent_s"] > back.start_s + 2.0]
    assert late and all(r["server"] == "source" for r in late)


@needs_haproxy
def test_a_target_the_router_reports_down_mid_step_rolls_back(routed) -> None:
    # The target's server goes away during the 50 % step: HAProxy's health check marks it DOWN
    # (checked every second, two failures), requests that cannot connect are retried on the
    # source (connection failures only), and the window, reading the router's states as it runs,
    # fails on the DOWN and rolls back.
    router, _src, tgt = routed

    def on_step(k: int) -> None:
        if k == 1:
            threading.Timer(0.2, tgt.stop).start()

    windows, rows = _moved(router, on_step, window_s=3.0)  # longer than two failed checks a second apart
    step2 = windows[2]
    assert not step2.passed and any("the router reports target DOWN" in p for p in step2.problems), step2.problems
    assert windows[-1].window == "rollback" and windows[-1].lost == 0


def test_the_client_split_is_a_router_that_counts_what_it_sent() -> None:
    # The embedded default behind the same interface: weights set and read back, the target's
    # share of the requests it picks close to its weight (seeded), counters of what it picked,
    # a drained target takes none and reads DRAIN, weights that cannot be are refused.
    from runbook_lib.traffic.router import ClientRouter

    r = ClientRouter(seed=7)
    assert r.weights() == {"source": 100, "target": 0} and not any(r.pick(100))
    r.set_weights(90, 10)
    assert r.weights() == {"source": 90, "target": 10}
    picked = r.pick(2000)
    assert abs(sum(picked) / 2000 - 0.10) < 0.02
    stats = r.stats()
    assert stats["target"].requests == sum(picked) and stats["source"].requests == 100 + 2000 - sum(picked)
    r.drain("target")
    assert not any(r.pick(200)) and r.stats()["target"].state == "DRAIN"
    r.set_weights(50, 50)  # a weight set again takes the side back
    assert r.stats()["target"].state == "UP" and any(r.pick(200))
    with pytest.raises(ValueError, match="not both be 0"):
        r.set_weights(0, 0)


def test_a_router_that_will_not_read_back_all_source_stops_before_the_first_step(tmp_path: Path) -> None:
    # A command router whose read-back keeps the target's 10 %: the phase stops before any
    # weight moves, naming what it read.
    from runbook_lib.phases.routed import all_on_source

    script = tmp_path / "router.py"
    script.write_text(SCRIPT_ROUTER)
    state = tmp_path / "weights.json"
    stuck = CommandRouter("http://127.0.0.1:9", [sys.executable, "-c", "pass"],
                          [sys.executable, "-c", 'print(\'{"source": 90, "target": 10}\')'])
    with pytest.raises(ProviderError, match=r"weights read back \{'source': 90, 'target': 10\} after setting all "
                                            r"traffic on the source; nothing was moved"):
        all_on_source(stuck)
    ok = CommandRouter("http://127.0.0.1:9", [sys.executable, str(script), str(state), "set", "{source}", "{target}"],
                       [sys.executable, str(script), str(state), "get"])
    all_on_source(ok)
    assert json.loads(state.read_text()) == {"source": 100, "target": 0}
