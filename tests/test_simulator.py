"""The provider simulators: the real adapters over real HTTP on 127.0.0.1, a local process behind
every pod and instance, their own key, and marks that make a run that used them a rehearsal."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest
import yaml

from runbook_lib.cli import main as cli_main
from runbook_lib.errors import EXIT_USAGE, ApprovalRequired, AuthError
from runbook_lib.evidence.approvals import Approval, replacement, require
from runbook_lib.params import load_params
from runbook_lib.providers import create_provider
from runbook_lib.providers.api import KeySource
from runbook_lib.providers.base import PodSpec
from runbook_lib.providers.simulator import Machines, SimServer, sim_module, simulate
from runbook_lib.run.rehearse import SHORTER, shorter, write_copy

from .conftest import ROOT

PARAMS = load_params(ROOT / "params" / "runpod-to-vast-train.yaml")
KEY = "sim-test-key-0123456789abcdef"
OFFERS = {"runpod": ("NVIDIA GeForce RTX 4090",), "vast": ("8812345",)}


@pytest.fixture(params=["runpod", "vast"])
def sim(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, SimServer, Any]]:
    name = request.param
    script = getattr(request, "param_script", None)
    srv = simulate(name, state_dir=tmp_path / "sim", key=KEY, script=script)
    prof = (PARAMS.source if name == "runpod" else PARAMS.target).model_copy(update={"api_url": srv.url})
    prov = create_provider(name, profile=prof, key=KeySource(name, ("env:NONE",), _value=KEY), poll_s=0.1)
    try:
        yield name, srv, prov
    finally:
        prov.close()
        srv.close()


def _spec(name: str, command: str, run_id: str) -> PodSpec:
    return PodSpec(name="job", command=("python", "-c", command), device="cpu", price_usd_per_hour=0.4,
                   labels=(("run_id", run_id), ("role", "canary")), image="ghcr.io/example/agent:1",
                   offers=OFFERS[name], disk_gb=40)


def _ok(plan: Any) -> Approval:
    return Approval(plan.fingerprint, "test", "2026-11-30T00:00:00Z", "test")


def test_a_pod_runs_its_command_as_a_process_and_is_destroyed(sim: tuple[str, SimServer, Any], tmp_path: Path) -> None:
    name, srv, prov = sim
    marker = tmp_path / "ran.txt"
    plan = prov.plan_launch(_spec(name, f"open({str(marker)!r}, 'w').write('ran')", "sim-run"), dry_run=False)
    pod = prov.apply(plan, _ok(plan))
    done = prov.wait_exit(pod.id, timeout_s=60)
    assert marker.read_text() == "ran"  # the command really ran, with this interpreter
    assert done.state == "EXITED"
    assert prov.simulator() == name  # it said what it is
    d = prov.plan_destroy(pod.id, dry_run=False)
    prov.apply(d, _ok(d))
    assert prov.list(labels={"run_id": "sim-run"}) == [] and prov.is_gone(pod.id)
    summary = srv.request_summary()
    assert sum(n for k, n in summary.items() if k.startswith(("POST /v2/pods", "PUT /api/v0/asks"))) == 1


def test_a_wrong_key_is_refused_in_the_providers_own_shape(sim: tuple[str, SimServer, Any]) -> None:
    name, srv, _ = sim
    prof = (PARAMS.source if name == "runpod" else PARAMS.target).model_copy(update={"api_url": srv.url})
    wrong = create_provider(name, profile=prof, key=KeySource(name, ("env:NONE",), _value="not-the-key"))
    with pytest.raises(AuthError, match="HTTP 401"):
        wrong.list(labels={"run_id": "x"})
    wrong.close()


@pytest.mark.parametrize("name", ["runpod", "vast"])
def test_a_502_after_create_on_the_wire_leaves_one_machine(name: str, tmp_path: Path) -> None:
    srv = simulate(name, state_dir=tmp_path / "sim", key=KEY, script={"create": ["created_then_502"]})
    try:
        prof = (PARAMS.source if name == "runpod" else PARAMS.target).model_copy(update={"api_url": srv.url})
        prov = create_provider(name, profile=prof, key=KeySource(name, ("env:NONE",), _value=KEY), poll_s=0.1)
        plan = prov.plan_launch(_spec(name, "import time; time.sleep(30)", "sim-502"), dry_run=False)
        pod = prov.apply(plan, _ok(plan))
        assert [p.id for p in prov.list(labels={"run_id": "sim-502"})] == [pod.id]
        assert prov.attempts[0].outcome == "adopted"
        creates = {k: n for k, n in srv.request_summary().items() if k.startswith(("POST /v2/pods", "PUT /api"))}
        assert list(creates.values()) == [1]
        prov.close()
    finally:
        srv.close()


def test_only_a_simulator_is_preapproved_by_preapproved_simulator(tmp_path: Path) -> None:
    plan = SimpleNamespace(fingerprint="f" * 64, provider="vast", action="launch_pod", target="x",
                           to_dict=lambda: {"fingerprint": "f" * 64})
    got = require(plan, run_dir=tmp_path, preapproved_local=False, simulator="vast")
    assert "preapproved_simulator" in got.method and "simulator" in got.method
    with pytest.raises(ApprovalRequired):
        require(SimpleNamespace(**{**plan.__dict__, "fingerprint": "e" * 64}), run_dir=tmp_path,
                preapproved_local=False, simulator="")


def test_the_rehearsal_copy_lists_every_override_and_leaves_the_params_alone(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "params").mkdir(parents=True)
    (project / "pyproject.toml").write_text("")
    real = project / "params" / "m.yaml"
    real.write_text((ROOT / "params" / "runpod-to-vast-train.yaml").read_text())
    before = real.read_bytes()
    reh = SimpleNamespace(sims={"runpod": SimpleNamespace(url="http://127.0.0.1:1"),
                                "vast": SimpleNamespace(url="http://127.0.0.1:2")}, s3_url="http://127.0.0.1:3", faults={})
    out = write_copy(real, reh)  # type: ignore[arg-type]
    assert real.read_bytes() == before and out.parent == project / ".runbook" / "rehearsal"
    mig = load_params(out)
    assert mig.rehearsal is not None and mig.rehearsal.of == "params/m.yaml"
    assert (mig.source.dry_run, mig.target.dry_run, mig.source.device) == (False, False, "cpu")
    assert mig.target.api_url == "http://127.0.0.1:2" and mig.storage.endpoint_url == "http://127.0.0.1:3"
    assert "target.api_url = http://127.0.0.1:2" in mig.rehearsal.overrides
    written = yaml.safe_load(out.read_text())
    changed = {o.split(" = ")[0] for o in mig.rehearsal.overrides}
    original = yaml.safe_load(before)
    for dotted in changed:  # every difference from the real params is listed
        node_a, node_b = original, written
        for part in dotted.split("."):
            node_a = (node_a or {}).get(part) if isinstance(node_a, dict) else None
            node_b = node_b[part]
        assert node_a != node_b or dotted.endswith("device"), dotted


# What the failed first try's detail names, where the script's fault has one to name.
FAULT_DETAIL = {"gone": "410", "exited_oci_error": "OCI runtime"}


@pytest.mark.parametrize("name,script,outcome", [
    ("vast", {"create": ["gone"]}, "no capacity"),  # the offer was taken between search and create (410)
    ("vast", {"create": ["rate"]}, "ready"),  # Vast's plain-text 429: our own backoff, then created
    ("vast", {"create": ["bid_fail"]}, "no capacity"),  # a failed bid that still made an instance: destroyed
    ("vast", {"poll": ["exited_oci_error"]}, "failed readiness"),  # the container never started
    ("runpod", {"create": ["capacity"]}, "no capacity"),  # 400 "no longer any instances available"
    ("runpod", {"create": ["rate"]}, "ready"),  # 429 with Retry-After, honoured
])
def test_scripted_faults_on_the_wire_end_in_the_documented_outcome(name: str, script: dict[str, list[str]],
                                                                   outcome: str, tmp_path: Path) -> None:
    srv = simulate(name, state_dir=tmp_path / "sim", key=KEY, script=script)
    prof = (PARAMS.source if name == "runpod" else PARAMS.target).model_copy(update={"api_url": srv.url})
    prov = create_provider(name, profile=prof, key=KeySource(name, ("env:NONE",), _value=KEY), poll_s=0.1,
                           sleep=lambda s: None)
    try:
        offers = OFFERS[name] * 2 if name == "runpod" else ("8812345", "8812501")
        spec = _spec(name, "import time; time.sleep(30)", "sim-fault")
        spec = PodSpec(**{**spec.__dict__, "offers": offers})
        plan = prov.plan_launch(spec, dry_run=False)
        pod = prov.apply(plan, _ok(plan))
        assert prov.attempts[0].outcome == outcome and prov.attempts[-1].outcome == "ready"
        [fault] = [step for steps in script.values() for step in steps]
        assert FAULT_DETAIL.get(fault, "") in prov.attempts[0].detail, prov.attempts[0]  # what the failed try says
        assert [p.id for p in prov.list(labels={"run_id": "sim-fault"})] == [pod.id]  # failed tries destroyed
    finally:
        prov.close()
        srv.close()


def test_an_offer_that_lies_about_its_machine_is_caught_by_readiness(tmp_path: Path) -> None:
    # Offer 8812345 lists host CUDA 12.8; the machine really has 11.8, below target.offer.cuda_min 12.4.
    srv = simulate("vast", state_dir=tmp_path / "sim", key=KEY, lies={"8812345": {"cuda_max_good": 11.8}})
    prof = PARAMS.target.model_copy(update={"api_url": srv.url})
    prov = create_provider("vast", profile=prof, key=KeySource("vast", ("env:NONE",), _value=KEY), poll_s=0.1)
    try:
        spec = PodSpec(**{**_spec("vast", "import time; time.sleep(30)", "sim-lie").__dict__,
                          "offers": ("8812345", "8812501")})
        plan = prov.plan_launch(spec, dry_run=False)
        pod = prov.apply(plan, _ok(plan))
        first = prov.attempts[0]
        assert first.offer_id == "8812345" and first.outcome == "failed readiness" and "CUDA" in first.detail
        assert prov.is_gone(first.resource_id)  # the machine that lied was destroyed
        assert prov.attempts[-1].offer_id == "8812501" and pod.id != first.resource_id
    finally:
        prov.close()
        srv.close()


@pytest.mark.parametrize(("faults", "message"), [
    ({"aws": {"script": {}}}, "unknown providers ['aws']"),
    ("vast", "must be an object of provider: faults"),
    ({"vast": {"scripts": {"create": ["gone"]}}}, "under vast: unknown keys ['scripts']; use script, lies and limits"),
    ({"vast": ["gone"]}, "the vast faults must be an object"),
    ({"vast": {"script": {"creat": ["outbid"]}}}, "unknown script operation 'creat'"),  # would drill nothing
    ({"vast": {"script": {"create": ["boom"]}}}, "unknown create answers ['boom']"),
    ({"vast": {"script": {"create": "outbid"}}}, "script create must be a list of answers"),
    ({"vast": {"script": "outbid"}}, "script must be an object"),
    ({"vast": {"lies": [1]}}, "lies must be an object"),
    ({"vast": {"limits": {"outbid_after": 2}}}, "unknown limits ['outbid_after']; the vast simulator has "
                                                "['outbid_after_s', 'serverless_idle_s']"),
    ({"runpod": {"limits": {"job_ttl_s": "2"}}}, "limit job_ttl_s must be a positive number of seconds, got '2'"),
    ({"runpod": {"limits": {"proxy_timeout_s": 0}}}, "limit proxy_timeout_s must be a positive number"),
    ({"runpod": {"limits": {"proxy_timeout_s": float("inf")}}}, "limit proxy_timeout_s must be a positive number"),
])
def test_a_bad_faults_file_is_refused_before_anything_starts(tmp_path: Path, capsys, faults: Any,
                                                             message: str) -> None:
    bad = tmp_path / "faults.json"
    bad.write_text(json.dumps(faults))
    assert cli_main(["rehearse", str(ROOT / "params" / "runpod-to-vast.yaml"), "--faults", str(bad)]) == EXIT_USAGE
    out = capsys.readouterr()
    assert message in out.err and "simulators:" not in out.out  # no simulator was started


def test_an_instance_outbid_mid_run_stops_its_process_and_reads_interrupted(tmp_path: Path) -> None:
    srv = simulate("vast", state_dir=tmp_path / "sim", key=KEY, script={"create": ["outbid"]},
                   limits={"outbid_after_s": 0.5})
    prov = create_provider("vast", profile=PARAMS.target.model_copy(update={"api_url": srv.url}),
                           key=KeySource("vast", ("env:NONE",), _value=KEY), poll_s=0.1)
    try:
        plan = prov.plan_launch(_spec("vast", "import time; time.sleep(60)", "sim-outbid"), dry_run=False)
        pod = prov.apply(plan, _ok(plan))
        done = prov.wait_exit(pod.id, timeout_s=30, poll_s=0.1)
        assert done.state == "STOPPED" and done.interrupted and "outbid" in done.status_detail
        again = prov.get(pod.id)
        assert again.state == "STOPPED" and getattr(again, "interrupted", False)  # it stays stopped, not restarted
        assert srv.api.machines.state(pod.id)[0] == "EXITED"  # its process was stopped with it
    finally:
        prov.close()
        srv.close()


def test_unknown_simulator_limits_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown limits \['proxy_s'\]; the vast simulator has \['outbid_after_s', 'serverless_idle_s'\]"):
        simulate("vast", state_dir=tmp_path, key=KEY, limits={"proxy_s": 1})


def test_a_replacement_is_approved_only_as_the_approved_launch_on_its_untried_offers(tmp_path: Path) -> None:
    prov = create_provider("vast", profile=PARAMS.target, key=KeySource("vast", ("env:NONE",), _value=KEY))
    spec = PodSpec(**{**_spec("vast", "pass", "r-repl").__dict__, "offers": ("8812345", "8812501")})
    plan = prov.plan_launch(spec, dry_run=False)
    first = Approval(plan.fingerprint, "alice", "2026-11-30T00:00:00Z", "approval file")
    later = prov.plan_launch(PodSpec(**{**spec.__dict__, "offers": ("8812501",)}), dry_run=False)
    got = replacement(later, of=plan, approval=first, run_dir=tmp_path)
    assert got.fingerprint == later.fingerprint and got.approved_by == "alice" and plan.fingerprint[:16] in got.method
    assert (tmp_path / "approvals" / f"{later.fingerprint[:16]}.json").exists()  # recorded like any approval
    pricier = prov.plan_launch(PodSpec(**{**spec.__dict__, "offers": ("8812501",), "price_usd_per_hour": 9.0}),
                               dry_run=False)
    elsewhere = prov.plan_launch(PodSpec(**{**spec.__dict__, "offers": ("8812400",)}), dry_run=False)
    for bad in (pricier, elsewhere):
        with pytest.raises(ApprovalRequired, match="is not a replacement of approved plan"):
            replacement(bad, of=plan, approval=first, run_dir=tmp_path)
    prov.close()


SSE_SERVER = """
import sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for i in range(3):
            data = f"data: {sys.argv[2]} {i}\\n\\n".encode()
            self.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(data), data)); self.wfile.flush()
            time.sleep(0.4)
        self.wfile.write(b"0\\r\\n\\r\\n")
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@pytest.mark.parametrize("name", ["runpod", "vast"])
def test_a_service_image_runs_its_stand_in_and_streams_through_the_published_port(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    import httpx

    from runbook_lib.providers.base import http_port, http_url

    image = "ghcr.io/example/chat-server:1.4"
    (tmp_path / "sse.py").write_text(SSE_SERVER)  # every stand-in argument is a template: the code lives in a file
    srv = simulate(name, state_dir=tmp_path / "sim", key=KEY,
                   stand_ins={image: ["python", str(tmp_path / "sse.py"), "{port}", "{GREETING}"]})
    prof = (PARAMS.source if name == "runpod" else PARAMS.target).model_copy(update={"api_url": srv.url})
    if name == "runpod":
        prof = prof.model_copy(update={"proxy_url": srv.url + "/proxy/{pod_id}-{port}"})
    prov = create_provider(name, profile=prof, key=KeySource(name, ("env:NONE",), _value=KEY), poll_s=0.1)
    monkeypatch.setenv("SIM_TEST_REGISTRY_LOGIN", "-u team -p not-shown ghcr.io")
    spec = PodSpec(name="chat", command=("transformers", "serve", "/models/chat"), device="cpu",
                   price_usd_per_hour=0.4, labels=(("run_id", "svc-run"), ("role", "service-canary")),
                   env=(("GREETING", "hello"),), image=image, ports=(http_port(prov, 8000),), offers=OFFERS[name],
                   disk_gb=40, service=True, registry_ref=("REGISTRY_LOGIN", "env:SIM_TEST_REGISTRY_LOGIN"))
    try:
        plan = prov.plan_launch(spec, dry_run=False)
        pod = prov.apply(plan, _ok(plan))
        url = http_url(prov, pod, 8000)
        assert (url.startswith(f"{srv.url}/proxy/{pod.id}-8000") if name == "runpod"
                else url.startswith("http://127.0.0.1:") and not url.endswith(":8000"))
        deadline = time.monotonic() + 30
        while True:  # the stand-in binds its port a moment after the machine starts
            try:
                t0 = time.monotonic()
                with httpx.stream("GET", f"{url}/events", timeout=10) as r:
                    arrivals = [(time.monotonic() - t0, chunk) for chunk in r.iter_text() if chunk.strip()]
                if r.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the stand-in never answered"
            time.sleep(0.2)
        text = "".join(c for _, c in arrivals)
        assert [ln for ln in text.splitlines() if ln] == ["data: hello 0", "data: hello 1", "data: hello 2"]
        assert arrivals[0][0] < 0.3 and arrivals[-1][0] > 0.7  # each event arrived as sent, not buffered to the end
        seen = prov.describe(pod.id)
        assert seen["image"] == image and seen["command"] == ["transformers", "serve", "/models/chat"]
        assert seen["env_names"] == ["GREETING"]  # no RUNBOOK_* variable reached the service, nor the login
        assert prov.get(pod.id).labels == {"run_id": "svc-run", "role": "service-canary"}
        assert prov.get(pod.id).name == "chat"
        raw = srv.api.state[pod.id]  # type: ignore[attr-defined]
        assert (raw["registry"] if name == "runpod" else raw["_image_login"]) in ("-u team -p not-shown ghcr.io", True)
    finally:
        prov.close()
        srv.close()


def test_a_destroyed_machine_never_starts_again(tmp_path: Path) -> None:
    # A Vast.ai Serverless worker the autoscaler wakes (a restart) after its workergroup was
    # deleted: nothing starts again, so no worker outlives its endpoint's teardown.
    machines = Machines(tmp_path)
    machines.start("8000001", ["python", "-c", "import time; time.sleep(60)"], {})
    assert machines.state("8000001")[0] == "RUNNING"
    machines.destroy("8000001")
    machines.restart("8000001")
    assert machines.state("8000001") == ("GONE", None)
    assert [(r.id, r.state) for r in machines.local.list(labels={"sim": "8000001"}) if r.state != "DESTROYED"] == []


def test_a_rehearsal_shortens_a_measurement_and_never_lengthens_one() -> None:
    # params/runpod-to-vast.yaml asks for 500 requests a round: the rehearsal sends SHORTER's 60.
    # A fault drill's params asking for 10 keep their 10 (no override is listed for them). A
    # margin tighter than SHORTER's (the file's 1.10) is widened to SHORTER's; a wider one stands.
    data = yaml.safe_load((ROOT / "params" / "runpod-to-vast.yaml").read_text())
    assert data["measure"]["requests_per_round"] == 500
    assert shorter(data)["measure.requests_per_round"] == SHORTER["inference"]["measure.requests_per_round"] == 60
    data["measure"].update(requests_per_round=10, warmup_requests=2, rounds=True)
    got = shorter(data)
    assert "measure.requests_per_round" not in got and "measure.warmup_requests" not in got
    assert got["measure.rounds"] == 4  # `true` is not a count: SHORTER's applies
    assert got["gates.latency_p95_ratio_max"] == 3.0
    # The offered load only lowers too: 20/s becomes 10/s, a drill's own 5/s stands.
    assert got["measure.arrival_rate_per_s"] == 10 < data["measure"]["arrival_rate_per_s"]
    data["measure"]["arrival_rate_per_s"] = 5.0
    assert "measure.arrival_rate_per_s" not in shorter(data)
    assert (got["gates.throughput_ratio_min"], data["gates"]["throughput_ratio_min"]) == (0.3, 0.95)
    data["gates"].update(latency_p95_ratio_max=10.0, throughput_ratio_min=0.1, cold_start_ratio_max=3.0)
    wide = shorter(data)
    assert "gates.latency_p95_ratio_max" not in wide and "gates.throughput_ratio_min" not in wide
    assert wide["gates.cold_start_ratio_max"] == 4.0  # 3.0 is tighter than a rehearsal's 4.0
    assert shorter({"workload": {"kind": "checkpoint"}}) == {}


def test_rehearse_by_default_runs_the_four_migrations_make_rehearse_names() -> None:
    # The e2e cases rehearse them in two runs (test_e2e_rehearse.py: training and both services;
    # test_e2e_drills.py's money drill: inference); the default names all four, as the Makefile.
    from runbook_lib.cli import REHEARSED, build_parser

    args = build_parser().parse_args(["rehearse"])
    assert args.params == list(REHEARSED) == ["params/runpod-to-vast.yaml", "params/runpod-to-vast-train.yaml",
                                              "params/runpod-to-vast-service.yaml",
                                              "params/runpod-serverless-to-vast-handler.yaml"]
    rule = (ROOT / "Makefile").read_text().split("\nrehearse:", 1)[1].split("\n\n", 1)[0]
    assert all(p in rule for p in REHEARSED) and all((ROOT / p).is_file() for p in REHEARSED)


HANDLER_SERVER = """
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send({})

    def do_POST(self):
        job = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self._send({"id": "local", "status": "COMPLETED", "output": {"twice": job["input"]["n"] * 2}})

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_handler_endpoints_worker_that_dies_holding_a_job_is_replaced_and_the_job_delivered_again(
        tmp_path: Path) -> None:
    """A team's handler on a Runpod Serverless endpoint under the ``endpoint: worker_crash``
    fault: its worker dies holding its eighth job; the endpoint starts another worker and delivers
    the job again, so every job completes with the handler's answer, the first seven from one
    worker and the rest from its replacement (``workerId``, as Runpod's job API reports it)."""
    import httpx

    from runbook_lib.layout import CRASH_EVERY
    from runbook_lib.providers.base import EndpointSpec

    image = "ghcr.io/example/handler:1"
    (tmp_path / "handler.py").write_text(HANDLER_SERVER)
    srv = simulate("runpod", state_dir=tmp_path / "sim", key=KEY, script={"endpoint": ["worker_crash"]},
                   stand_ins={image: ["python", str(tmp_path / "handler.py"), "{port}"]})
    prof = PARAMS.source.model_copy(update={"api_url": srv.url, "job_api_url": srv.url})
    prov = create_provider("runpod", profile=prof, key=KeySource("runpod", ("env:NONE",), _value=KEY), poll_s=0.1)
    try:
        spec = EndpointSpec(name="handler", params_path="", side="source", workers=1, price_usd_per_hour=0.5,
                            labels=(("run_id", "crash"),), image=image, gpu_types=("ADA_24",), active_workers=1,
                            service=True)
        plan = prov.plan_endpoint(spec, dry_run=False)
        ep = prov.apply(plan, _ok(plan))
        jobs = [httpx.post(f"{srv.url}/v2/{ep.id}/runsync", json={"input": {"n": n}}, timeout=120,
                           headers={"Authorization": f"Bearer {KEY}"}).json() for n in range(10)]
        assert [j["status"] for j in jobs] == ["COMPLETED"] * 10
        assert [j["output"] for j in jobs] == [{"twice": 2 * n} for n in range(10)]
        workers = [j["workerId"] for j in jobs]
        assert len(set(workers[:CRASH_EVERY])) == 1 and len(set(workers[CRASH_EVERY:])) == 1
        assert workers[CRASH_EVERY] != workers[0]  # the eighth job was delivered again, to the replacement
        assert jobs[CRASH_EVERY]["delayTime"] > jobs[1]["delayTime"]  # it waited for the new worker to start
    finally:
        prov.close()
        srv.close()


DRILL_HANDLER = """
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

records = {}

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        job = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["input"]
        key = job.get("request_id")
        if key in records:
            out = {**records[key], "replayed": True}
        else:
            time.sleep(job.get("hold_s", 0))
            out = {"twice": job["n"] * 2}
            if key:
                records[key] = out
                out = {**out, "replayed": False}
        data = json.dumps({"id": "local", "status": "COMPLETED", "output": out}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_handlers_job_drills_pass_where_it_honours_them_and_fail_where_it_does_not(tmp_path: Path) -> None:
    """Phase 04's job drills against a team's handler on a Runpod Serverless endpoint (the
    simulator's front door, the handler's stand-in behind it): one job delivered twice under one
    idempotency key is answered from the handler's record (PASS), and FAILs when the handler does
    not mark the replay where params say; a job the handler keeps working on is ended TIMED_OUT
    by its per-job execution timeout and the next job is served (PASS), and a job that finishes
    inside the timeout FAILs the drill."""
    from runbook_lib.phases.compare.drills import hung_then_served, redelivered
    from runbook_lib.providers.base import EndpointSpec
    from runbook_lib.service.protocols import client_for

    image = "ghcr.io/example/handler:1"
    (tmp_path / "handler.py").write_text(DRILL_HANDLER)
    srv = simulate("runpod", state_dir=tmp_path / "sim", key=KEY,
                   stand_ins={image: ["python", str(tmp_path / "handler.py"), "{port}"]})
    prof = PARAMS.source.model_copy(update={"api_url": srv.url, "job_api_url": srv.url})
    prov = create_provider("runpod", profile=prof, key=KeySource("runpod", ("env:NONE",), _value=KEY), poll_s=0.1)
    svc = load_params(ROOT / "params" / "runpod-serverless-to-vast-handler.yaml").workload.service
    assert svc is not None

    def golden(out: Any) -> bool:
        return bool(out == {"twice": 6})

    try:
        spec = EndpointSpec(name="handler", params_path="", side="target", workers=1, price_usd_per_hour=0.5,
                            labels=(("run_id", "drills"),), image=image, gpu_types=("ADA_24",), active_workers=1,
                            execution_timeout_s=60.0, service=True)
        plan = prov.plan_endpoint(spec, dry_run=False)
        ep = prov.apply(plan, _ok(plan))
        kw: dict[str, Any] = {"headers": prov.job_api_headers(), "readiness": ("/health", 200)}  # type: ignore[attr-defined]
        with client_for(svc, ep.url, timeout_s=60, **kw) as c, \
                client_for(svc, ep.url, timeout_s=60, policy={"executionTimeout": 1000}, **kw) as hang:
            ok = redelivered(c, {"n": 3}, key_field="request_id", key="k-1", replayed="replayed", matches=golden)
            assert ok.verdict == "PASS" and "replayed: first False, second True" in ok.observation
            unmarked = redelivered(c, {"n": 3}, key_field="request_id", key="k-2", replayed="cached", matches=golden)
            assert unmarked.verdict == "FAIL" and "runs twice" in unmarked.observation
            wrong = redelivered(c, {"n": 3}, key_field="request_id", key="k-3", replayed="replayed",
                                matches=lambda out: False)
            assert wrong.verdict == "FAIL" and "does not match the golden" in wrong.observation
            hung = hung_then_served(hang, {"n": 1, "hold_s": 30}, c, {"n": 3}, limit_s=1.0, matches=golden)
            assert hung.verdict == "PASS" and "TIMED_OUT by the endpoint" in hung.observation, hung.observation
            quick = hung_then_served(hang, {"n": 1, "hold_s": 0.1}, c, {"n": 3}, limit_s=1.0, matches=golden)
            assert quick.verdict == "FAIL" and "hung job COMPLETED" in quick.observation
    finally:
        prov.close()
        srv.close()


LB_SERVER = """
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

time.sleep(0.3)  # the model loads before the server listens

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(200, {"status": "healthy"}) if self.path == "/ping" else self._send(404, {})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self._send(200, {"upper": body["text"].upper()})

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_services_load_balancing_endpoint_routes_to_its_worker_and_scales_to_zero(tmp_path: Path) -> None:
    """A team's HTTP service on a Runpod Serverless LOAD_BALANCER endpoint: created as Runpod
    documents one (type, the worker's PORT and PORT_HEALTH on the service's port, the port
    published), reached at its own URL with the Runpod key; /ping answers 204 while the first
    worker starts and 200 once it serves; requests go straight to the worker's server; with
    workers.min 0 the idle worker stops after the idle timeout, and the next request waits for a
    new one (a cold start from zero)."""
    import httpx

    from runbook_lib.params import Service
    from runbook_lib.providers.base import EndpointSpec
    from runbook_lib.service.protocols import client_for

    image = "ghcr.io/example/upper:1"
    (tmp_path / "server.py").write_text(LB_SERVER)
    srv = simulate("runpod", state_dir=tmp_path / "sim", key=KEY,
                   stand_ins={image: ["python", str(tmp_path / "server.py"), "{port}"]})
    prof = PARAMS.source.model_copy(update=sim_module("runpod").overrides(srv.url))
    prov = create_provider("runpod", profile=prof, key=KeySource("runpod", ("env:NONE",), _value=KEY), poll_s=0.1)
    svc = Service.model_validate({"image": image, "protocol": "http-json", "samples": "s.jsonl", "port": 8000,
                                  "readiness": {"path": "/ping"},
                                  "request": {"method": "POST", "path": "/upper", "body": {"text": "{input}"}}})
    try:
        spec = EndpointSpec(name="upper", params_path="", side="target", workers=1, price_usd_per_hour=0.5,
                            labels=(("run_id", "lb"),), image=image, gpu_types=("ADA_24",), active_workers=0,
                            idle_timeout_s=1.0, execution_timeout_s=60.0, service=True, mode="load_balancing", port=8000)
        plan = prov.plan_endpoint(spec, dry_run=False)
        ep = prov.apply(plan, _ok(plan))
        assert ep.mode == "load_balancing" and ep.url == f"{srv.url}/lb/{ep.id}"
        seen = prov.describe(ep.id)  # type: ignore[attr-defined]
        assert seen["endpoint"]["type"] == "LOAD_BALANCER" and {"PORT", "PORT_HEALTH"} <= set(seen["env_names"])
        assert srv.api.state[ep.id]["env"]["PORT"] == "8000" and srv.api.state[ep.id]["ports"] == ["8000/http"]  # type: ignore[attr-defined]
        assert httpx.get(f"{ep.url}/ping").status_code == 401  # the Runpod key, as the job API takes it
        auth = prov.job_api_headers()  # type: ignore[attr-defined]
        assert prov.workers(ep.id) == []  # type: ignore[attr-defined]  # none kept running
        pings = [httpx.get(f"{ep.url}/ping", headers=auth).status_code]
        while pings[-1] != 200 and len(pings) < 200:
            time.sleep(0.05)
            pings.append(httpx.get(f"{ep.url}/ping", headers=auth).status_code)
        assert pings[0] == 204 and pings[-1] == 200  # the first /ping started a worker; initializing, then healthy
        with client_for(svc, ep.url, timeout_s=60, headers=auth, readiness=("/ping", 200)) as c:
            warm = c.runsync("to be")
            assert warm["status"] == "COMPLETED" and warm["output"] == {"upper": "TO BE"}
            assert [w["status"] for w in prov.workers(ep.id)] == ["IDLE"]  # type: ignore[attr-defined]
            deadline = time.monotonic() + 30
            while prov.workers(ep.id) and time.monotonic() < deadline:  # type: ignore[attr-defined]
                time.sleep(0.2)
            assert prov.workers(ep.id) == []  # type: ignore[attr-defined]  # scaled to zero after 1 s idle
            cold = c.runsync("or not")
            assert cold["status"] == "COMPLETED" and cold["output"] == {"upper": "OR NOT"}
            assert cold["execution_s"] > warm["execution_s"] + 0.25  # it waited for a worker to start and load
        prov.apply(prov.plan_destroy(ep.id, dry_run=False), _ok(prov.plan_destroy(ep.id, dry_run=False)))
        assert httpx.get(f"{ep.url}/ping", headers=auth).status_code == 404
    finally:
        prov.close()
        srv.close()


def test_a_throttled_handler_endpoints_job_times_out_named_as_a_capacity_problem_then_runs(tmp_path: Path) -> None:
    """A team's handler endpoint under the ``endpoint: throttled`` fault: its workers wait for a
    GPU (``throttled_s``), so /health and the worker list say THROTTLED, and a job whose deadline
    passes meanwhile fails TIMED_OUT with the endpoint's own word for why (a capacity problem, not
    the service); once a GPU is free the same endpoint serves."""
    from runbook_lib.providers.base import EndpointSpec
    from runbook_lib.service.protocols import client_for

    image = "ghcr.io/example/handler:1"
    (tmp_path / "handler.py").write_text(HANDLER_SERVER)
    srv = simulate("runpod", state_dir=tmp_path / "sim", key=KEY, script={"endpoint": ["throttled"]},
                   limits={"throttled_s": 3.0}, stand_ins={image: ["python", str(tmp_path / "handler.py"), "{port}"]})
    prof = PARAMS.source.model_copy(update={"api_url": srv.url, "job_api_url": srv.url})
    prov = create_provider("runpod", profile=prof, key=KeySource("runpod", ("env:NONE",), _value=KEY), poll_s=0.1)
    svc = load_params(ROOT / "params" / "runpod-serverless-to-vast-handler.yaml").workload.service
    assert svc is not None
    try:
        spec = EndpointSpec(name="handler", params_path="", side="source", workers=1, price_usd_per_hour=0.5,
                            labels=(("run_id", "throttled"),), image=image, gpu_types=("ADA_24",), active_workers=1,
                            service=True)
        plan = prov.plan_endpoint(spec, dry_run=False)
        ep = prov.apply(plan, _ok(plan))
        kw: dict[str, Any] = {"headers": prov.job_api_headers(), "readiness": ("/health", 200)}  # type: ignore[attr-defined]
        assert [w["status"] for w in prov.workers(ep.id)] == ["THROTTLED"]  # type: ignore[attr-defined]
        with client_for(svc, ep.url, timeout_s=0.5, **kw) as short:
            lost = short.runsync({"n": 1})
        assert lost["status"] == "TIMED_OUT" and "1 worker(s) THROTTLED" in lost["error"], lost
        assert "a capacity problem, not the service" in lost["error"]
        with client_for(svc, ep.url, timeout_s=60, **kw) as c:
            served = c.runsync({"n": 2})
        assert served["status"] == "COMPLETED" and served["output"] == {"twice": 4}
        # no longer throttled (the job the short client gave up on may still be running)
        assert [w["status"] for w in prov.workers(ep.id)] in (["IDLE"], ["RUNNING"])  # type: ignore[attr-defined]
    finally:
        prov.close()
        srv.close()


def test_a_vast_serverless_worker_that_dies_holding_a_request_fails_it_named_and_is_started_again(
        tmp_path: Path) -> None:
    """A team's handler on a Vast.ai Serverless endpoint under the ``workergroup: worker_crash``
    fault: its worker's PyWorker dies holding its eighth request. That request fails, named by
    where it broke and the worker's URL (a request that reached a worker is never resent); the
    autoscaler starts the failed worker again and the next requests, routed once it is ready,
    complete with the handler's answer (one sent in the moment after the crash may fail as the
    lost one did, named, never answered wrong)."""
    from runbook_lib.layout import CRASH_EVERY
    from runbook_lib.providers.base import EndpointSpec
    from runbook_lib.service.protocols import VastRouted

    image = "ghcr.io/example/handler:1"
    (tmp_path / "handler.py").write_text(HANDLER_SERVER)
    srv = simulate("vast", state_dir=tmp_path / "sim", key=KEY, script={"workergroup": ["worker_crash"]},
                   stand_ins={image: ["python", str(tmp_path / "handler.py"), "{port}"]})
    mig = load_params(ROOT / "params" / "runpod-serverless-to-vast-handler.yaml")
    prof = mig.target.model_copy(update=sim_module("vast").overrides(srv.url))
    prov = create_provider("vast", profile=prof, key=KeySource("vast", ("env:NONE",), _value=KEY), poll_s=0.1)
    settings = (("max_workers", 1), ("cold_workers", 1), ("min_load", 1.0), ("min_cold_load", 0.0),
                ("target_util", 0.9), ("cold_mult", 2.5), ("search_params", "gpu_name=RTX_4090"), ("gpu_ram", 24.0),
                ("onstart", ""), ("pyworker", (("repo", "https://github.com/example/pw"), ("route", "/runsync"),
                                               ("healthcheck", "/"))))
    try:
        spec = EndpointSpec(name="handler", params_path="", side="target", workers=1, price_usd_per_hour=0.45,
                            labels=(("run_id", "crash"),), image=image, mode="serverless", port=8000, service=True,
                            settings=settings)
        plan = prov.plan_endpoint(spec, dry_run=False)
        ep = prov.apply(plan, _ok(plan))
        name, key = prov.route_auth(ep.id)  # type: ignore[attr-defined]
        assert mig.workload.service is not None
        with VastRouted(mig.workload.service, ep.url, endpoint_name=name, endpoint_key=key, worker_route="/runsync",
                        timeout_s=60) as c:
            got = [c.runsync({"n": n}) for n in range(CRASH_EVERY + 4)]
        said = [(g["status"], g.get("stage"), str(g.get("error"))[:200]) for g in got]
        assert [g["status"] for g in got[:CRASH_EVERY]] == ["COMPLETED"] * CRASH_EVERY, said
        lost = got[CRASH_EVERY]
        assert lost["status"] in ("CLIENT_ERROR", "STREAM_CUT") and "/runsync" in lost["error"], said
        assert "(worker http://127.0.0.1:" in lost["error"] and "http_status" not in lost  # no answer came
        # the worker is started again: the last two complete; the one sent just after the crash is
        # answered right, or fails named as the lost one did (never a wrong answer)
        nxt = got[CRASH_EVERY + 1]
        assert (nxt["status"], nxt["output"]) == ("COMPLETED", {"twice": 2 * (CRASH_EVERY + 1)}) or \
            nxt["status"] in ("CLIENT_ERROR", "STREAM_CUT"), said
        assert [(g["status"], g["output"]) for g in got[-2:]] == [
            ("COMPLETED", {"twice": 2 * n}) for n in range(CRASH_EVERY + 2, CRASH_EVERY + 4)], said
    finally:
        prov.close()
        srv.close()
