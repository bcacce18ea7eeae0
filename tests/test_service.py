"""``workload.kind: service``: the protocol clients against a real HTTP server on loopback (its
timing schedule is the golden for the metrics), the comparators against values worked by hand,
the params and samples checks, and service pods on the real local provider (``{port}``
published, no runbook variable inside, a readiness that never comes)."""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest
import yaml

from runbook_lib.errors import ParamsError
from runbook_lib.params import JsonCheck, Migration, SecretRef, Service, load_params
from runbook_lib.phases import service_pods
from runbook_lib.providers.base import PodSpec
from runbook_lib.providers.local import LocalProvider, procs
from runbook_lib.service import compare, protocols, samples

from .conftest import ROOT
from .faulty_service import send_json

FIRST_S = 0.08  # the test server's delay before the first chunk, seconds
GAP_S = 0.1  # its delay between chunks
CHUNKS = ["Hel", "lo", " wor", "ld", "!"]


class _Chat(BaseHTTPRequestHandler):
    """A chat server speaking OpenAI's wire format: ``stream`` answers are server-sent events,
    one ``chat.completion.chunk`` per chunk after :data:`FIRST_S`, then :data:`GAP_S` apart, a
    ``finish_reason`` chunk with ``usage`` and ``[DONE]``; the prompt ``cut`` ends the stream
    after two chunks with neither."""

    disable_nagle_algorithm = True  # each chunk leaves when it is written (TCP_NODELAY), as a streaming server's do

    def log_message(self, *a: Any) -> None:
        pass

    def do_GET(self) -> None:
        code = 200 if self.path == "/health" else 404
        self._json(code, {"status": "ok"} if code == 200 else {"detail": "Not Found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/echo":
            return self._json(200, {"data": [{"embedding": [float(len(str(body)))] * 3}], "input": body})
        if self.path != "/v1/chat/completions":
            return self._json(404, {"detail": "Not Found"})
        prompt = body["messages"][-1]["content"]
        if not body.get("stream"):
            return self._json(200, {"choices": [{"message": {"content": "".join(CHUNKS)}, "finish_reason": "stop"}],
                                    "usage": {"completion_tokens": len(CHUNKS)}})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        time.sleep(FIRST_S)
        for i, c in enumerate(CHUNKS):
            if prompt == "cut" and i == 2:
                self.wfile.flush()
                return
            if i:
                time.sleep(GAP_S)
            self._event({"choices": [{"delta": {"content": c}, "index": 0}]})
        self._event({"choices": [{"delta": {}, "finish_reason": "stop", "index": 0}],
                     "usage": {"completion_tokens": len(CHUNKS)}})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _event(self, obj: dict[str, Any]) -> None:
        self.wfile.write(f"data: {json.dumps(obj)}\n\n".encode())
        self.wfile.flush()

    def _json(self, code: int, obj: dict[str, Any]) -> None:
        send_json(self, code, obj)


@pytest.fixture
def server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _svc(**over: Any) -> Service:
    return Service.model_validate({"image": "example/chat:1", "protocol": "openai-chat", "samples": "s.jsonl", **over})


def test_a_streamed_answer_is_timed_as_vllm_bench_serve_defines_ttft_itl_and_tpot(server: str) -> None:
    with protocols.client_for(_svc(), server) as c:
        got = c.runsync([{"role": "user", "content": "hello"}])
    m = got["metrics"]
    assert got["status"] == "COMPLETED"
    assert got["output"]["text"] == "Hello world!" and got["output"]["chunks"] == CHUNKS
    assert m["output_tokens"] == len(CHUNKS)  # the server's usage.completion_tokens
    # the server waited FIRST_S before the first chunk and GAP_S between chunks: nothing can arrive
    # sooner than it was sent, and the first token was seen before the last was sent (streamed, not
    # buffered). A loaded machine may delay one chunk and bunch the next, so single gaps are not bounded.
    last_sent = FIRST_S + (len(CHUNKS) - 1) * GAP_S
    assert len(m["itl_s"]) == len(CHUNKS) - 1 and all(x >= 0 for x in m["itl_s"])
    assert FIRST_S <= m["ttft_s"] < last_sent
    assert m["ttft_s"] + sum(m["itl_s"]) >= last_sent * 0.999
    assert m["tpot_s"] == pytest.approx((got["execution_s"] - m["ttft_s"]) / (len(CHUNKS) - 1))


def test_a_stream_cut_mid_way_is_a_failed_request_never_a_short_success(server: str) -> None:
    with protocols.client_for(_svc(), server) as c:
        got = c.runsync([{"role": "user", "content": "cut"}])
    assert got["status"] == protocols.STREAM_CUT and got["output"] is None
    assert "no finish_reason" in got["error"] or "broke" in got["error"]


def test_a_non_streamed_answer_has_tokens_but_no_ttft(server: str) -> None:
    with protocols.client_for(_svc(stream=False), server) as c:
        got = c.runsync([{"role": "user", "content": "hi"}])
    assert got["status"] == "COMPLETED" and got["output"]["text"] == "Hello world!"
    assert got["metrics"]["output_tokens"] == 5 and math.isnan(got["metrics"]["ttft_s"])


def test_a_protocol_mismatch_names_the_path_and_the_protocols(server: str) -> None:
    svc = _svc(protocol="http-json", request={"method": "POST", "path": "/v2/predict"})
    with protocols.client_for(svc, server) as c, pytest.raises(protocols.ProtocolMismatch) as e:
        c.check_protocol({"x": 1})
    assert "/v2/predict" in str(e.value) and "openai-chat" in str(e.value) and "http-json" in str(e.value)


def test_http_json_fills_the_body_template_and_health_reports_in_flight_requests(server: str) -> None:
    svc = _svc(protocol="http-json", request={"method": "POST", "path": "/echo", "body": {"q": "{input.text}",
                                                                                          "all": "{input}"}})
    with protocols.client_for(svc, server) as c:
        got = c.runsync({"text": "abc"})
        health = c.health()
    assert got["output"]["input"] == {"q": "abc", "all": {"text": "abc"}}
    assert health["workers"] == {"idle": 1, "running": 0, "unhealthy": 0} and health["jobs"]["inProgress"] == 0


def test_chat_answers_are_compared_exactly_and_located_by_chunk_and_character() -> None:
    gold = {"text": "Hello world!", "chunks": CHUNKS}
    assert compare.compare_chat(gold, dict(gold)).match
    got = compare.compare_chat(gold, {"text": "Hello wind", "chunks": ["Hel", "lo", " wi", "nd"]})
    # worked by hand: "Hello w" is shared (7 characters); chunks "Hel", "lo" agree, " wor" != " wi"
    assert not got.match and got.first_diff_char == 7 and got.first_diff_token == 2


def test_json_checks_hold_each_path_to_its_tolerance() -> None:
    gold = {"v": [1.0, 0.0], "n": 100.0, "s": "a"}
    seen = {"v": [0.6, 0.8], "n": 100.5, "s": "a"}
    # cosine([1, 0], [0.6, 0.8]) = 0.6 by hand: tolerance 0.4 allows >= 0.6, 0.3 needs >= 0.7
    assert compare.check(JsonCheck(path="v", compare="cosine", tolerance=0.4), gold, seen) is None
    assert "cosine similarity 0.600000" in (compare.check(JsonCheck(path="v", compare="cosine", tolerance=0.3),
                                                          gold, seen) or "")
    assert compare.check(JsonCheck(path="n", compare="absolute", tolerance=0.5), gold, seen) is None
    assert compare.check(JsonCheck(path="n", compare="absolute", tolerance=0.4), gold, seen) is not None
    assert compare.check(JsonCheck(path="n", compare="relative", tolerance=0.005), gold, seen) is None  # 0.5 <= 0.5
    assert compare.check(JsonCheck(path="s"), gold, seen) is None
    assert "missing" in (compare.check(JsonCheck(path="v.5"), gold, seen) or "")
    assert compare.compare_json((), gold, seen).match is False


def _mig(**service: Any) -> dict[str, Any]:
    return {"migration": "m", "workload": {"kind": "service", "model_id": "x",
                                           "service": {"image": "i:1", "protocol": "openai-chat",
                                                       "samples": "s.jsonl", **service}},
            "source": {"name": "a", "provider": "local", "release": "r", "price_usd_per_hour": 1},
            "target": {"name": "b", "provider": "local", "release": "r", "price_usd_per_hour": 1}}


def test_service_params_refuse_runbook_variables_and_what_belongs_to_other_kinds() -> None:
    Migration.model_validate(_mig())
    with pytest.raises(ValueError, match="RUNBOOK_"):
        Migration.model_validate(_mig(env={"RUNBOOK_DEVICE": "cpu"}))
    bad = _mig()
    bad["workload"]["entry_point"] = "a:B"
    with pytest.raises(ValueError, match="do not apply to kind 'service'"):
        Migration.model_validate(bad)
    bad = _mig()
    del bad["workload"]["service"]
    with pytest.raises(ValueError, match="needs workload.service"):
        Migration.model_validate(bad)


def test_samples_that_are_not_json_lines_are_refused_naming_the_line(tmp_path: Path) -> None:
    (tmp_path / "params").mkdir()
    (tmp_path / "s.jsonl").write_text('{"prompt": "a"}\n\nnot json\n')
    with pytest.raises(ParamsError, match=r"s.jsonl:3 is not JSON"):
        samples.load_samples(_svc(), tmp_path / "params" / "m.yaml")
    (tmp_path / "s.jsonl").write_text('{"text": "no prompt"}\n')
    with pytest.raises(ParamsError, match="openai-chat sample"):
        samples.load_samples(_svc(), tmp_path / "params" / "m.yaml")
    (tmp_path / "s.jsonl").write_text('{"prompt": "a"}\n{"messages": [{"role": "user", "content": "b"}]}\n')
    assert samples.load_samples(_svc(), tmp_path / "params" / "m.yaml") == [
        [{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]


def _http_server_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[LocalProvider, Any]:
    monkeypatch.setenv("RUNBOOK_LEAK_CHECK", "1")  # the runner's own variable must not reach the service
    prov = LocalProvider(root=tmp_path / "local")
    spec = PodSpec(name="svc", command=(sys.executable, "-m", "http.server", "{port}", "--bind", "127.0.0.1"),
                   device="cpu", price_usd_per_hour=0.0, labels=(("run_id", "t"),), env=(("GREETING", "hi"),),
                   image="example/static:1", ports=("8000/http",), service=True)
    return prov, prov.lifecycle.launch(spec)


def test_a_local_service_pod_publishes_its_port_and_carries_no_runbook_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prov, pod = _http_server_pod(tmp_path, monkeypatch)
    try:
        addr = pod.host["ports"]["8000/http"]
        assert addr.startswith("127.0.0.1:") and "{port}" not in " ".join(pod.host["command"])
        deadline = time.monotonic() + 20
        seen: dict[str, Any] = {}
        while time.monotonic() < deadline:
            seen = prov.describe(pod.id)
            if seen["processes"]:
                break
            time.sleep(0.1)
        assert seen["image"] == "example/static:1" and seen["stand_in"] is True
        assert seen["env_names"] == ["GREETING"]
        assert [p["runbook_env"] for p in seen["processes"]] == [[]]  # not RUNBOOK_LEAK_CHECK, not RUNBOOK_DEVICE
        assert any("http.server" in a for a in seen["processes"][0]["cmdline"])
    finally:
        _gone(prov, pod.id)


def _gone(prov: LocalProvider, pod_id: str) -> None:
    """Destroy the pod and reap its leader here, so no ``Popen`` of it outlives the test."""
    prov.lifecycle.destroy(pod_id)
    procs.reap(prov.state.read(pod_id)["pid"])


def test_a_readiness_that_never_comes_names_the_last_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prov, pod = _http_server_pod(tmp_path, monkeypatch)  # http.server answers 404 on /health
    mig = load_params(Path(__file__).resolve().parent.parent / "params" / "demo-service.yaml")
    svc = mig.workload.service
    assert svc is not None
    mig = mig.model_copy(update={"workload": mig.workload.model_copy(update={"service": svc.model_copy(update={
        "readiness": svc.readiness.model_copy(update={"timeout_s": 3.0, "interval_s": 0.1})})})})
    res = SimpleNamespace(mig=mig, provider=lambda side: prov)
    try:
        with pytest.raises(service_pods.NotReady) as e:
            service_pods.wait_ready(res, "target", pod, started=time.perf_counter())  # type: ignore[arg-type]
    finally:
        _gone(prov, pod.id)
    msg = str(e.value)
    assert "readiness.timeout_s = 3 s" in msg and "the last answer" in msg
    assert "HTTP 404" in msg or "cannot be reached" in msg


def test_a_remote_service_side_runs_the_services_own_image_and_nothing_else() -> None:
    ok = _mig()
    ok["target"] = {"name": "b", "provider": "vast", "release": "r", "price_usd_per_hour": 1}  # no image: the service's
    assert Migration.model_validate(ok).target.provider == "vast"
    bad = _mig()
    bad["target"] = {**ok["target"], "image": "ghcr.io/example/runbook-agent:1"}
    with pytest.raises(ValueError, match=r"target.image 'ghcr.io/example/runbook-agent:1' differs from "
                                         r"workload.service.image"):
        Migration.model_validate(bad)
    other = yaml.safe_load((ROOT / "params" / "runpod-to-vast.yaml").read_text())
    del other["target"]["image"]
    with pytest.raises(ValueError, match=r"target.image is missing"):
        Migration.model_validate(other)


def test_parity_short_of_its_minimum_fails_unless_the_source_disagreed_with_itself() -> None:
    from runbook_lib.evidence.records import ServiceAnswerRow
    from runbook_lib.phases.service import parity_gate

    svc = _svc(parity={"min_exact_match": 0.75})
    rows = [ServiceAnswerRow(sample=i, status="COMPLETED", match=i != 2, first_diff_token=None if i != 2 else 3,
                             first_diff_char=None if i != 2 else 9, detail="" if i != 2 else "differs") for i in range(4)]
    assert parity_gate(svc, rows, ()).verdict == "PASS"  # 3 of 4 = 0.75 meets 0.75
    rows[0] = rows[2].model_copy(update={"sample": 0})
    got = parity_gate(svc, rows, ())
    assert (got.verdict, got.observed) == ("FAIL", 0.5) and "first differing input 0 at chunk 3 (character 9)" in got.detail
    noisy = parity_gate(svc, rows, (ServiceAnswerRow(sample=1, match=False, detail="source differs from itself"),))
    assert noisy.verdict == "INCONCLUSIVE" and "not deterministic at temperature 0" in noisy.detail


def test_phase_02_maps_a_service_s_registry_login_and_its_answers_against_the_target_s_proxy() -> None:
    import dataclasses

    from runbook_lib.phases.mapping import service_rows

    base = load_params(Path(__file__).resolve().parent.parent / "params" / "demo-service.yaml")
    caps = LocalProvider(root="/nonexistent-never-written").capabilities()

    def rows(service: dict[str, Any] | None = None, secrets: tuple[dict[str, Any], ...] = (), max_request_s: float = 5,
             proxy_s: float | None = None) -> dict[str, Any]:
        svc = base.workload.service
        assert svc is not None
        wl = base.workload.model_copy(update={
            "service": svc.model_copy(update=service or {}),
            "requirements": base.workload.requirements.model_copy(update={"max_request_s": max_request_s})})
        tgt = base.target.model_copy(update={"secrets": tuple(SecretRef.model_validate(x) for x in secrets)})
        ctx = SimpleNamespace(mig=base.model_copy(update={"workload": wl, "target": tgt}))
        got = service_rows(ctx, dataclasses.replace(caps, max_request_s=proxy_s))  # type: ignore[arg-type]
        return {r.dependency.split(" ")[0]: r for r in got}

    assert rows()["registry"].status == "equivalent" and rows()["protocol"].status == "equivalent"
    blocked = rows({"private_image": True})["registry"]
    assert blocked.status == "no equivalent" and "workload.service.registry_credential" in blocked.reason
    undeclared = rows({"private_image": True, "registry_credential": "REGISTRY_LOGIN"})["registry"]
    assert undeclared.status == "no equivalent" and "not declared in target.secrets" in undeclared.reason
    declared = rows({"private_image": True, "registry_credential": "REGISTRY_LOGIN"},
                    secrets=({"name": "REGISTRY_LOGIN", "ref": "env:REGISTRY_LOGIN"},))["registry"]
    assert declared.status == "equivalent"
    # Runpod's proxy ends a request after 100 s: answers allowed 300 s cannot all get through it
    proxy = rows(max_request_s=300, proxy_s=100)["protocol"]
    assert proxy.status == "no equivalent" and "after 100 s" in str(proxy.target)
    assert rows(max_request_s=60, proxy_s=100)["protocol"].status == "equivalent"
