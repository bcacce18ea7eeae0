"""A live source (``source.provider: live``): the team's running service, which the runbook did
not start and must not change. Its pacing (checked by hand-worked schedules and by a real
loopback server's own arrival log), the provider that refuses everything, the params that refuse
what cannot be kept to the declared rate, and the gates that never compare what was not measured.
The whole six-phase run against a live server is tests/test_e2e_service_faults.py's."""

from __future__ import annotations

import bisect
import json
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from runbook_lib import gates as g
from runbook_lib.errors import NotFound, ParamsError, ProviderError
from runbook_lib.params import Service, load_params
from runbook_lib.phases.compare.judge import live_source_gates
from runbook_lib.providers import create_provider
from runbook_lib.providers.base import EndpointSpec, PodSpec
from runbook_lib.service.pacing import PACE_MARGIN, Pacer, pacer_for, spaced
from runbook_lib.service.protocols import client_for, listed_models

from .faulty_service import send_json
from .test_providers import Clock
from .test_replay import serving

LIVE = {"provider": "live", "name": "source-live", "release": "chat 1.4 (live)", "price_usd_per_hour": 0.44,
        "url": "http://127.0.0.1:9/", "max_rate_per_s": 10,
        "storage_usd_per_gb_month": None}  # demo-service's source declares it; a live one may not (None: removed)


# -- pacing ----------------------------------------------------------------------------------------

def test_a_pacer_spaces_request_starts_by_its_margin_over_the_rate() -> None:
    clock = Clock()
    p = Pacer(10.0, clock=clock, sleep=clock.sleep)
    starts = []
    for _ in range(4):
        p.wait()
        starts.append(clock.t)
    # 10/s with a 5 % margin: 0.105 s apart, the first at once
    assert [round(b - a, 6) for a, b in zip(starts, starts[1:], strict=False)] == [0.105, 0.105, 0.105]
    assert clock.slept == pytest.approx([0.105, 0.105, 0.105]) and p.sent == 4
    clock.t += 1.0  # idle: the next goes at once
    assert p.wait() == 0.0
    assert p.settle() == pytest.approx(0.105) and clock.t == pytest.approx(starts[-1] + 1.105)


def test_one_pacer_per_url_whose_rate_only_goes_down() -> None:
    a = pacer_for("http://live.test:1/", 20.0)
    assert pacer_for("http://live.test:1", 50.0) is a and a.rate_per_s == 20.0
    assert pacer_for("http://live.test:1", 5.0) is a and a.gap_s == pytest.approx(PACE_MARGIN / 5.0)
    with pytest.raises(ValueError, match="positive rate"):
        Pacer(0.0)


def test_a_schedule_is_spaced_without_reordering_or_moving_what_is_far_enough_apart() -> None:
    # worked by hand: 0.00 stays; 0.01 -> 0.10; 0.15 -> 0.20; 0.50 stays; 0.52 -> 0.60
    assert spaced([0.0, 0.01, 0.15, 0.5, 0.52], 0.1) == pytest.approx([0.0, 0.1, 0.2, 0.5, 0.6])
    assert spaced([0.0, 0.01], 0.0) == [0.0, 0.01]


class _Logged(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    arrivals: list[float] = []
    auth: list[str] = []

    def log_message(self, *a: Any) -> None:
        pass

    def do_GET(self) -> None:
        _Logged.arrivals.append(time.time())
        send_json(self, 200, {"status": "ok"})

    def do_POST(self) -> None:
        _Logged.arrivals.append(time.time())
        _Logged.auth.append(self.headers.get("Authorization", ""))
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        send_json(self, 200, {"echo": body})


def test_a_paced_client_never_gets_past_the_rate_at_the_server_even_from_many_threads() -> None:
    """40 requests from 8 threads at once through one client paced at 20/s: the server's own
    arrival log holds no more than 20 in any one-second window, and every request carried the
    bearer token."""
    _Logged.arrivals, _Logged.auth = [], []
    svc = Service(image="acme/echo:1", protocol="http-json", samples="-", readiness={"path": "/health"})
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), _Logged)) as url:
        with client_for(svc, url, timeout_s=5.0, pacer=Pacer(20.0), headers={"Authorization": "Bearer t0k"}) as c:
            with ThreadPoolExecutor(max_workers=8) as pool:
                # the pool's 8 connections opened first: a new connection's set-up (tens of ms on a
                # busy host) delays that arrival at the server, which no pacer at the client sees
                list(pool.map(lambda i: c.runsync({"warm": i}), range(8)))
                _Logged.arrivals, _Logged.auth = [], []
                assert c.health()["workers"]["idle"] == 1
                answers = list(pool.map(lambda i: c.runsync({"i": i}), range(40)))
    assert [a["status"] for a in answers] == ["COMPLETED"] * 40
    ts = sorted(_Logged.arrivals)
    assert len(ts) == 41
    most = max(bisect.bisect_left(ts, t + 1.0) - i for i, t in enumerate(ts))
    assert most <= 20, most
    assert ts[-1] - ts[0] >= 40 * PACE_MARGIN / 20.0 - 0.05  # 41 starts, 40 gaps of 52.5 ms
    assert set(_Logged.auth) == {"Bearer t0k"}


def test_the_openai_model_list_is_read_or_nothing() -> None:
    body = json.dumps({"object": "list", "data": [{"id": "llama-3-8b", "object": "model"}, {"id": "x"}]})
    assert listed_models(body) == ["llama-3-8b", "x"]
    assert listed_models("<html>") == [] and listed_models('{"data": 3}') == [] and listed_models("[1]") == []


# -- the provider ----------------------------------------------------------------------------------

def test_the_live_provider_plans_nothing_lists_nothing_and_refuses_every_change(tmp_path: Path) -> None:
    prov = create_provider("live", profile=load_params(_params(tmp_path)).source)
    spec = PodSpec(name="x", command=("serve",), device="cpu", price_usd_per_hour=0.1, labels=())
    for call in (lambda: prov.plan_launch(spec),
                 lambda: prov.plan_endpoint(EndpointSpec(name="e", params_path="p", side="source", workers=1,
                                                         price_usd_per_hour=0.1, labels=())),
                 lambda: prov.plan_destroy("anything"), lambda: prov.lifecycle.launch(spec),
                 lambda: prov.lifecycle.stop("x"), lambda: prov.lifecycle.destroy("x"),
                 lambda: prov.lifecycle.start("x")):
        with pytest.raises(ProviderError, match="live source: a live service .* did not start it and changes nothing"):
            call()
    assert prov.list(labels={"run_id": "r"}) == []
    with pytest.raises(NotFound):
        prov.get("live")
    caps = prov.capabilities()
    assert not caps.load_balancing.supported and not caps.restart.supported and "127.0.0.1:9" in caps.network


# -- params ----------------------------------------------------------------------------------------

def _params(tmp_path: Path, **over: Any) -> Path:
    """demo-service.yaml with a live source (rate 10/s, phase 04 at 5/s) and ``over`` merged in;
    a key set to None is removed."""
    import yaml

    from runbook_lib.params import dump_yaml

    from .runs import merged, write_params

    p = write_params(tmp_path, "demo-service.yaml", "m.yaml", **merged({"source": LIVE,
                                                                       "measure": {"arrival_rate_per_s": 5}}, over))
    def kept(d: Any) -> Any:
        return {k: kept(v) for k, v in d.items() if v is not None} if isinstance(d, dict) else d

    p.write_text(dump_yaml(kept(yaml.safe_load(p.read_text()))))
    return p


def test_a_live_source_loads_with_its_declarations_a_digest_not_taken_for_a_key(tmp_path: Path) -> None:
    digest = "sha256:" + "0123456789abcdef" * 4
    mig = load_params(_params(tmp_path, source={"declared": {"digest": digest, "gpu": "L4",
                                                             "throughput_units_per_s": 12.5}},
                              workload={"service": {"image": f"ghcr.io/example/chat-server@{digest}"}}))
    assert mig.source.provider == "live" and mig.source.declared.throughput_units_per_s == 12.5
    assert mig.workload.service is not None and mig.workload.service.tag_is_digest


@pytest.mark.parametrize(("over", "says"), [
    ({"target": {**LIVE, "name": "target-live", "offers": None, "offer": None}},
     r"target.provider is 'live'.*can only be the source"),
    ({"measure": {"arrival_rate_per_s": 12}},
     r"measure.arrival_rate_per_s = 12 exceeds source.max_rate_per_s = 10.*at most 10"),
    ({"cutover": {"router": {"kind": "haproxy", "arrival_rate_per_s": 9.5}}},
     r"up to 9.5 requests/s .* plus HAProxy's health checks, up to 2 in a second, more than source.max_rate_per_s "
     r"= 10; lower cutover.router.arrival_rate_per_s to at most 8"),
    ({"gates": {"method": "sequential"}, "measure": {"rounds": None}},
     r"gates.method 'sequential' is not built for a live source.*use gates.method: fixed"),
    ({"source": {"url": "https://chat.example.com"}, "cutover": {"router": {"kind": "haproxy"}}},
     r"cannot route to the live source 'https://chat.example.com': it is https .* use router kind command"),
    ({"source": {"url": "http://gw.example.com/chat"}, "cutover": {"router": {"kind": "haproxy"}}},
     r"it has a path \(HAProxy forwards to a host and port"),
    ({"source": {"auth_ref": "env:CHAT_TOKEN"}, "cutover": {"router": {"kind": "haproxy"}}},
     r"it needs a bearer token \(source.auth_ref\), which the replay through the router does not send"),
    ({"source": {"declared": {"image": "acme/other:2"}}},
     r"source.declared.image 'acme/other:2' differs from workload.service.image"),
    ({"source": {"max_rate_per_s": 0}}, r"source.max_rate_per_s: Input should be greater than 0"),
    ({"source": {"url": "127.0.0.1:8000"}}, r"source.url: String should match pattern"),
    ({"source": {"auth_ref": "s3cr3t-token"}}, r"source.auth_ref: String should match pattern"),
    ({"source": {"pod_id": "abc"}}, r"source.pod_id: Extra inputs are not permitted"),
    ({"source": {"workers": 4, "secrets": [{"name": "HF_TOKEN", "ref": "env:HF_TOKEN"}]}},
     r"secrets, workers do not apply to a live source: the runbook runs nothing there"),
    ({"source": {"url": "http://admin:pw@127.0.0.1:9"}}, r"url carries credentials \(user:password@\).*auth_ref"),
    ({"source": {"url": "http://127.0.0.1:99999"}}, r"url 'http://127.0.0.1:99999' is not a usable http\(s\) URL"),
    ({"source": {"url": "http://127.0.0.1:9/v1/"}}, r"ends in /v1, and the openai-chat paths .* /v1/v1/"),
])
def test_what_cannot_keep_a_live_source_safe_is_refused_with_its_fix(tmp_path: Path, over: dict[str, Any],
                                                                    says: str) -> None:
    with pytest.raises(ParamsError, match=says):
        load_params(_params(tmp_path, **over))


def test_a_live_source_is_only_for_a_service(make_params: Any) -> None:
    import yaml

    from runbook_lib.params import dump_yaml

    p = make_params()  # the inference demo, its source replaced whole by a live one
    data = yaml.safe_load(p.read_text())
    data["source"] = {k: v for k, v in LIVE.items() if v is not None}
    p.write_text(dump_yaml(data))
    with pytest.raises(ParamsError, match=r"source.provider 'live' is a team's running service.*'inference'"):
        load_params(p)


# -- the gates it cannot have ----------------------------------------------------------------------

def _gates() -> list[g.GateResult]:
    return [g.throughput_ratio([], [10.0, 11.0], min_ratio=0.95, phase="04"),
            g.cold_start_ratio([], [2.0], max_ratio=1.25, phase="04"),
            g.boolean_gate("error_rate", True, phase="04", detail="none failed")]


def test_a_failing_live_source_is_named_as_the_teams_service_not_a_job_of_ours() -> None:
    got = g.baseline_health({"COMPLETED": 5, "CLIENT_ERROR": 5}, max_rate=0.0, phase="04", live_url="http://chat:8000")
    assert got.verdict == "INCONCLUSIVE" and "5 of 10 source requests failed (CLIENT_ERROR x5)" in got.detail
    assert "The live source at http://chat:8000 is the team's running service" in got.detail
    assert "TTL" not in got.detail  # a job's TTL is the runbook's endpoints' advice, not a live service's


def test_throughput_and_cold_start_are_target_only_unless_declared(tmp_path: Path) -> None:
    mig = load_params(_params(tmp_path))
    out = {r.name: r for r in live_source_gates(mig, _gates(), [10.0, 11.0], [2.0])}
    for name in ("throughput_ratio", "cold_start_ratio"):
        assert out[name].verdict == "NOT_APPLICABLE" and not out[name].blocking
    assert "target-only: 10.500 requests/s over 2 bursts" in out["throughput_ratio"].detail
    assert "target-only: target median 2.00 s" in out["cold_start_ratio"].detail
    assert out["error_rate"].verdict == "PASS"  # every other gate as it was


def test_declared_source_figures_are_compared_and_marked_declared(tmp_path: Path) -> None:
    mig = load_params(_params(tmp_path, source={"declared": {"throughput_units_per_s": 20.0, "cold_start_s": 1.0}},
                              gates={"throughput_ratio_min": 0.5}))
    out = {r.name: r for r in live_source_gates(mig, _gates(), [10.0, 11.0], [2.0])}
    # 10.5 / 20 = 0.525 >= 0.5; 2.0 / 1.0 = 2.0 > 1.25 (by hand)
    assert out["throughput_ratio"].verdict == "PASS" and out["throughput_ratio"].observed == pytest.approx(0.525)
    assert "declared (source.declared.throughput_units_per_s), not measured" in out["throughput_ratio"].method
    assert out["cold_start_ratio"].verdict == "FAIL" and out["cold_start_ratio"].observed == pytest.approx(2.0)
    assert "declared (source.declared.cold_start_s)" in out["cold_start_ratio"].method


# -- what a live source's token, rate and refusals must never do -----------------------------------

def test_a_token_that_cannot_be_a_header_is_refused_by_name_never_shown(tmp_path: Path) -> None:
    from runbook_lib.errors import AuthError
    from runbook_lib.phases.service_pods import bearer_token

    tok = tmp_path / "token"
    tok.write_text("live-token-7f3a9c\nSECRETLINE2-abcdef\n")
    mig = load_params(_params(tmp_path, source={"auth_ref": f"file:{tok}"}))
    with pytest.raises(AuthError, match=r"source.auth_ref \(file:.*token\) holds a value that cannot be a bearer") as e:
        bearer_token(mig.source)  # type: ignore[arg-type]
    assert "live-token" not in str(e.value) and "SECRETLINE2" not in str(e.value)
    tok.write_text("live-token-7f3a9c\n")  # one line, its newline ending it: the token
    assert bearer_token(mig.source) == "live-token-7f3a9c"  # type: ignore[arg-type]


def test_the_runs_leak_scan_looks_for_the_live_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runbook_lib.phases.scan import resolved_secrets

    monkeypatch.setenv("LIVE_TOKEN", "live-token-0123456789abcdef")
    values, _ = resolved_secrets(load_params(_params(tmp_path, source={"auth_ref": "env:LIVE_TOKEN"})))
    assert values["source.auth_ref"] == "live-token-0123456789abcdef"


def test_a_refused_token_stops_at_the_first_answer_naming_the_reference(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from runbook_lib.errors import AuthError
    from runbook_lib.phases.service_pods import live_ready

    from .faulty_service import serve

    log = tmp_path / "requests.jsonl"
    monkeypatch.setenv("REQUEST_LOG", str(log))
    monkeypatch.setenv("REQUIRE_TOKEN", "the-right-token")
    monkeypatch.setenv("LIVE_TOKEN", "a-wrong-token")
    srv = serve()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        mig = load_params(_params(tmp_path, source={"url": url, "auth_ref": "env:LIVE_TOKEN"}))
        with pytest.raises(AuthError, match=r"answered HTTP 401 to GET .*/health: its token, source.auth_ref "
                                            r"\(env:LIVE_TOKEN\), is refused.*nothing more was sent") as e:
            live_ready(SimpleNamespace(mig=mig), mig.source)  # type: ignore[arg-type]
    finally:
        srv.shutdown()
        srv.server_close()
    assert "a-wrong-token" not in str(e.value)
    assert len(log.read_text().splitlines()) == 1  # one knock, not one per readiness interval


def test_pacing_delays_a_request_but_never_ends_it() -> None:
    """At 0.5/s a request waits 2.1 s for its slot; its deadline (1 s here) runs from the send,
    so it completes, the wait counted in its latency."""
    svc = Service(image="acme/echo:1", protocol="http-json", samples="-", readiness={"path": "/health"})
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), _Logged)) as url:
        with client_for(svc, url, timeout_s=1.0, pacer=Pacer(0.5)) as c:
            first, second = c.runsync({"i": 1}), c.runsync({"i": 2})
    assert first["status"] == second["status"] == "COMPLETED"
    assert first["execution_s"] < 1.0 and 2.0 <= second["execution_s"] < 3.0


def test_a_replay_schedule_spaced_for_a_live_source_keeps_its_order_and_gap() -> None:
    from itertools import islice

    from runbook_lib.measure.timing import poisson_requests

    picks = [(i, f"p{i}") for i in range(5)]
    bare = [r.intended_s for r in islice(poisson_requests(picks, 50.0, 7), 300)]
    paced = [r.intended_s for r in islice(poisson_requests(picks, 50.0, 7, min_gap_s=0.05), 300)]
    assert min(b - a for a, b in zip(bare, bare[1:], strict=False)) < 0.05  # Poisson clusters at 50/s
    assert min(b - a for a, b in zip(paced, paced[1:], strict=False)) >= 0.05 - 1e-9
    assert paced[0] == bare[0] and all(p >= b for p, b in zip(paced, bare, strict=True))


def test_a_rate_too_slow_for_a_cell_is_refused_before_anything_runs_with_the_arithmetic(tmp_path: Path) -> None:
    """0.5 requests/s: phase 01's 27 paced requests (12 samples twice, readiness, two reads) take at
    least 57 s, more than a 30 s cell; `runbook run` exits 2 at once, sending nothing."""
    import io
    from contextlib import redirect_stderr

    from runbook_lib.cli import main as cli_main

    from .conftest import ROOT

    params = _params(tmp_path, source={"max_rate_per_s": 0.5}, measure={"arrival_rate_per_s": 0.5},
                     run={"cell_timeout_s": 30},
                     workload={"service": {"samples": str(ROOT / "examples" / "chat-samples.jsonl")}})
    err = io.StringIO()
    with redirect_stderr(err):
        code = cli_main(["run", str(params)])
    assert code == 2, err.getvalue()
    assert ("paced at source.max_rate_per_s = 0.5/s, so phase 01's 27 requests one at a time (readiness, two reads, "
            "12 samples twice) take at least 57 s, more than run.cell_timeout_s = 30 s") in err.getvalue()
