"""Every way a service's answer can fail ends as a named failure, within its deadline: the
protocol clients against a loopback server scripted to misbehave (:mod:`tests.faulty_service`),
and the phase 04 gate that counts them names the server's own words."""

from __future__ import annotations

import math
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import numpy as np
import pandas as pd
import pytest

from runbook_lib.errors import ParamsError
from runbook_lib.params import Service
from runbook_lib.phases.serving import failures_named
from runbook_lib.service import preflight, protocols

from . import faulty_service
from .faulty_service import ERROR_TEXT, send_json

DEADLINE_S = 1.5
GAP_S = 0.5


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    srv = faulty_service.serve()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _svc(**over: Any) -> Service:
    return Service.model_validate({"image": "example/chat:1", "protocol": "openai-chat", "samples": "s.jsonl",
                                   "max_gap_s": GAP_S, "max_answer_bytes": 16_384, **over})


def _ask(url: str, prompt: str, **over: Any) -> tuple[dict[str, Any], float]:
    with protocols.client_for(_svc(**over), url, timeout_s=DEADLINE_S) as c:
        t0 = time.perf_counter()
        got = c.runsync([{"role": "user", "content": prompt}])
        return got, time.perf_counter() - t0


@pytest.mark.parametrize(("fault", "kind", "stage", "says"), [
    ("error200", "ERROR_BODY", "mid-stream", ERROR_TEXT),
    ("error200-raw", "ERROR_BODY", "mid-stream", "CUDA error"),
    ("html502", "WRONG_CONTENT_TYPE", "headers", "502 Bad Gateway"),
    ("cut", "STREAM_CUT", "mid-stream", "broke after 2 chunks"),
    ("noterm", "STREAM_CUT", "mid-stream", "no finish_reason"),
    ("onlydone", "STREAM_CUT", "mid-stream", "only [DONE]"),
    ("oversize", "OVERSIZE", "mid-stream", "max_answer_bytes (16384 bytes)"),
    ("empty", "EMPTY", "first token", "no content"),
])
def test_each_streamed_failure_shape_is_a_named_failure_with_the_servers_words(
        url: str, fault: str, kind: str, stage: str, says: str) -> None:
    got, took = _ask(url, fault)
    assert (got["status"], got["stage"]) == (kind, stage), got
    assert says in got["error"] and got["output"] is None
    assert url in got["error"]  # which service, at which URL
    assert took < DEADLINE_S + 0.5


@pytest.mark.parametrize(("fault", "stage", "why"), [
    ("trickle", "first token", "request_timeout_s (1.5 s)"),  # comments every 0.2 s never reset the deadline
    ("gap", "mid-stream", "max_gap_s (0.5 s)"),  # one chunk, then silence past the gap
    ("silent", "headers", "request_timeout_s (1.5 s)"),  # no status line at all
])
def test_a_stalled_service_fails_its_request_as_timed_out_naming_the_stage_within_the_deadline(
        url: str, fault: str, stage: str, why: str) -> None:
    got, took = _ask(url, fault)
    assert (got["status"], got["stage"]) == ("TIMED_OUT", stage), got
    assert why in got["error"] and url in got["error"]
    assert took < DEADLINE_S + 0.5  # the deadline holds, stream included: never the cell timeout


def test_whole_answers_fail_on_an_error_object_an_empty_answer_and_a_wrong_content_type(url: str) -> None:
    got, _ = _ask(url, "error200", stream=False)
    assert got["status"] == "ERROR_BODY" and ERROR_TEXT in got["error"]
    got, _ = _ask(url, "empty", stream=False)
    assert got["status"] == "EMPTY"
    got, _ = _ask(url, "html502", stream=False)
    assert got["status"] == "WRONG_CONTENT_TYPE" and "text/html" in got["error"]
    got, _ = _ask(url, "hello", stream=False)
    assert got["status"] == "COMPLETED" and got["metrics"]["tokens_from"] == "usage"


def test_without_usage_tokens_are_never_counted_from_chunks(url: str, tmp_path: Any) -> None:
    got, _ = _ask(url, "nousage")
    m = got["metrics"]
    assert got["status"] == "COMPLETED" and m["tokens_from"] == "none"
    assert math.isnan(m["output_tokens"]) and math.isnan(m["tpot_s"]) and m["itl_s"] == []
    assert m["ttft_s"] > 0  # TTFT needs no token count
    # a tokenizer the params name counts the text instead: a word-level vocabulary built here
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"Hello": 0, "world": 1, "!": 2, "[UNK]": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    with protocols.client_for(_svc(tokenizer=str(tmp_path)), url, timeout_s=DEADLINE_S, project=tmp_path) as c:
        got = c.runsync([{"role": "user", "content": "nousage"}])
    # "Hello world!" is 3 tokens of that vocabulary (Hello, world, !), worked by hand
    assert got["metrics"]["tokens_from"] == "tokenizer" and got["metrics"]["output_tokens"] == 3.0
    with pytest.raises(ParamsError, match="tokenizer.json"):
        protocols.client_for(_svc(tokenizer="nowhere"), url, project=tmp_path)


def test_a_refused_connection_is_a_client_error_at_connect() -> None:
    got, took = _ask("http://127.0.0.1:9", "hello")
    assert (got["status"], got["stage"]) == ("CLIENT_ERROR", "connect") and took < DEADLINE_S


def test_error_text_is_scrubbed_of_credential_shapes() -> None:
    key = "rpa_" + "A1b2C3d4E5f6G7h8I9j0K1l2"
    said = protocols.said(f"auth failed for {key} (Authorization: Bearer sk-abc123)")
    assert key not in said and "sk-abc123" not in said and said.count("[REDACTED]") == 2


class _Json(BaseHTTPRequestHandler):
    """An http-json service and a runpod-handler job API that answer errors with status 200."""

    def log_message(self, *a: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        answers = {"/predict": {"result": None, "error": {"message": "model not loaded"}},
                   "/ok": {"result": [1, 2], "error": None},
                   "/runsync": {"id": "j1", "status": "COMPLETED", "output": None}}
        send_json(self, 200, answers[self.path])


@pytest.fixture
def json_url() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Json)
    import threading

    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_http_json_fails_on_its_declared_error_path_and_a_handler_job_without_output_is_empty(json_url: str) -> None:
    svc = Service(image="i:1", protocol="http-json", samples="-", request={"path": "/predict"})
    with protocols.client_for(svc, json_url) as c:
        got = c.runsync({"x": 1})
    assert got["status"] == "ERROR_BODY" and "error: model not loaded" in got["error"]
    svc = Service(image="i:1", protocol="http-json", samples="-", request={"path": "/ok"})
    with protocols.client_for(svc, json_url) as c:
        assert c.runsync({"x": 1})["status"] == "COMPLETED"  # "error": null is no error
    svc = Service(image="i:1", protocol="runpod-handler", samples="-")
    with protocols.client_for(svc, json_url) as c:
        got = c.runsync({"x": 1})
    assert got["status"] == "EMPTY" and "j1 COMPLETED with no output" in got["error"]


def test_protocol_defaults_stream_and_readiness_and_refuse_streams_not_built() -> None:
    chat = Service(image="i:1", protocol="openai-chat", samples="-")
    handler = Service(image="i:1", protocol="runpod-handler", samples="-")
    web = Service(image="i:1", protocol="http-json", samples="-")
    assert (chat.stream, chat.readiness.path) == (True, "/health")
    assert (handler.stream, handler.readiness.path) == (False, "/")
    assert (web.stream, web.readiness.path) == (False, "/health")
    assert Service(image="i:1", protocol="runpod-handler", samples="-", readiness={"status": 200}).readiness.path == "/"
    with pytest.raises(ValueError, match="/stream/"):
        Service(image="i:1", protocol="runpod-handler", samples="-", stream=True)


def test_the_preflight_names_the_field_to_change(url: str) -> None:
    with protocols.client_for(_svc(), url, timeout_s=DEADLINE_S) as c:
        checks, got = preflight.preflight(c, _svc(), [{"role": "user", "content": "nousage"}])
    by = {x.name: x for x in checks}
    assert got["status"] == "COMPLETED" and all(x.ok for x in checks)
    assert "not measurable" in by["tokens"].detail and "workload.service.tokenizer" in by["tokens"].detail
    with protocols.client_for(_svc(), url, timeout_s=DEADLINE_S) as c, \
            pytest.raises(preflight.ServicePreflightFailed, match="max_gap_s") as e:
        preflight.preflight(c, _svc(), [{"role": "user", "content": "gap"}])
    assert "TIMED_OUT at mid-stream" in str(e.value)
    svc = _svc(protocol="http-json", request={"path": "/v1/chat/completions", "body": {"messages": "{input}"}},
               checks=[{"path": "data.0.embedding"}], stream=False)
    with protocols.client_for(svc, url, timeout_s=DEADLINE_S) as c, \
            pytest.raises(preflight.ServicePreflightFailed, match="workload.service.checks"):
        preflight.preflight(c, svc, [{"role": "user", "content": "hello"}])


def test_failures_are_named_by_kind_with_the_first_ones_words() -> None:
    s = pd.DataFrame({"side": ["target"] * 4, "round": [1, 1, 3, 3], "intended_s": [0.2, 0.1, 0.0, 0.3],
                      "status": ["COMPLETED", "ERROR_BODY", "ERROR_BODY", "TIMED_OUT"],
                      "stage": [None, "mid-stream", "headers", "first token"],
                      "error": [None, "POST u: CUDA error", "POST u: later", "POST u: slow"]})
    mask = np.array([False, True, True, True])
    bursts = pd.DataFrame({"failed_by_status": ['{"ERROR_BODY": 2}', "{}"]})
    said = failures_named(s, mask, bursts)
    assert said == ("ERROR_BODY x2, TIMED_OUT x1; first (round 1, at mid-stream): POST u: CUDA error; "
                    "saturation bursts: ERROR_BODY x2")
    assert failures_named(s, np.zeros(4, dtype=bool)) == ""


def test_a_cutover_step_with_a_failed_request_fails_naming_it_and_never_times_it() -> None:
    from runbook_lib.phases.cutover import judge_step

    ok = [{"status": "COMPLETED", "accepted": True, "total_s": 0.1, "served": True, "round": 0,
           "intended_s": float(i), "stage": None, "error": None} for i in range(20)]
    bad = {"status": "ERROR_BODY", "accepted": False, "total_s": 0.001, "served": True, "round": 0, "intended_s": 3.5,
           "stage": "mid-stream", "error": f"POST u: {ERROR_TEXT}"}
    step = judge_step([*ok, bad], step=2, pct=50, mode="drain", requests=21, drain=None, bound=1.0)
    assert not step.passed and step.target_failures == 1 and step.target_p95_s == pytest.approx(0.1)
    assert step.target_failed_as == f"ERROR_BODY x1; first (round 0, at mid-stream): POST u: {ERROR_TEXT}"
    assert judge_step(ok, step=1, pct=10, mode="drain", requests=20, drain=None, bound=1.0).passed
