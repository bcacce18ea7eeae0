"""The cutover's replay (runbook_lib.traffic.replay) against a real HTTP server on loopback: it sends
phase 04's Poisson schedule from a process of its own, never resends, and says of each request
who answered, or that nobody did."""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import numpy as np
import pytest

from runbook_lib.measure.timing import poisson_schedule
from runbook_lib.params import Service
from runbook_lib.traffic.replay import Replay, classify, classify_answer
from runbook_lib.traffic.router import SERVER_HEADER

from . import faulty_service


@pytest.fixture
def server() -> Iterator[str]:
    """A server answering ``POST /infer`` as ``source`` (header and output, the input echoed);
    ``{"input": "boom"}`` gets an error answer, ``"gone"`` one from no server."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            status, named, out = ((500, True, {"error": "crashed"}) if body["input"] == "boom" else
                                  (502, False, {"error": "no server"}) if body["input"] == "gone" else
                                  (200, True, {"output": body["input"]}))
            data = json.dumps(out).encode()
            self.send_response(status)
            if named:
                self.send_header(SERVER_HEADER, "source")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    with serving(ThreadingHTTPServer(("127.0.0.1", 0), Handler)) as url:
        yield url


@contextmanager
def serving(httpd: ThreadingHTTPServer) -> Iterator[str]:
    """``httpd`` serving from a daemon thread, as its loopback URL; shut down and closed after."""
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_replay_sends_phase_04s_schedule_from_its_own_process_and_never_resends(server) -> None:
    url = server
    picks = [(i, f"sentence {i}") for i in range(7)]
    replay = Replay(url, picks, rate_per_s=50.0, timeout_s=5.0, seed=11)
    replay.start()
    try:
        assert replay.pid is not None and replay.pid != os.getpid() and replay.running()  # a process of its own
        time.sleep(1.5)
        assert replay.sent_between(0.0, replay.now())  # rows arrive while it runs
    finally:
        replay.stop()
    assert not replay.running()
    rows = sorted(replay.rows, key=lambda r: r["request"])
    n = len(rows)
    assert n > 40 and [r["request"] for r in rows] == list(range(n))  # each request once, none resent
    assert np.allclose([r["intended_s"] for r in rows], poisson_schedule(n, 50.0, 11))  # phase 04's schedule
    assert all(r["status"] == "COMPLETED" and r["server"] == "source" for r in rows)
    assert [r["output"] for r in rows[:8]] == [f"sentence {i % 7}" for i in range(8)]  # the inputs, cycled
    late = np.array([r["sent_s"] - r["intended_s"] for r in rows])
    assert late.min() >= 0 and np.percentile(late, 50) < 0.01  # sent at its time, not when the last ended
    assert replay.in_flight_before(1e9) == 0


def test_an_error_answer_is_failed_and_no_answer_from_a_server_is_lost(server) -> None:
    url = server
    replay = Replay(url, [(0, "boom"), (1, "gone"), (2, "fine")], rate_per_s=30.0, timeout_s=5.0, seed=3)
    replay.start()
    time.sleep(0.5)
    replay.stop()
    by_input = {r["input_index"]: r for r in replay.rows}
    assert by_input[0]["status"] == "FAILED" and by_input[0]["server"] == "source"
    assert by_input[1]["status"] == "LOST" and "no server named" in by_input[1]["error"]
    assert by_input[2]["status"] == "COMPLETED"
    assert classify(None, "", {}, "ConnectError: refused")["status"] == "LOST"


def test_a_replay_that_cannot_start_says_why(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runbook_lib.errors import ProviderError

    replay = Replay("http://127.0.0.1:9", [(0, object())], rate_per_s=1.0, timeout_s=1.0, seed=0)  # not JSON
    with pytest.raises(TypeError):
        replay.start()
    monkeypatch.setattr("runbook_lib.traffic.replay.sys.executable", str(tmp_path / "no-python"))
    with pytest.raises(ProviderError, match="could not start"):
        Replay("http://127.0.0.1:9", [(0, "x")], rate_per_s=1.0, timeout_s=1.0, seed=0).start()


class _Named(faulty_service.Faulty):
    """The misbehaving chat server with every answer named ``target``, as the router names it;
    a prompt ``anon`` gets an answer with no name (the router answering on its own)."""

    def end_headers(self) -> None:
        if "anon" not in getattr(self, "_prompt", ""):
            self.send_header(SERVER_HEADER, "target")
        super().end_headers()

    def fault(self, prompt: str) -> str:
        self._prompt = prompt
        return super().fault(prompt)


@pytest.fixture
def chat() -> Iterator[str]:
    with serving(faulty_service.Server(("127.0.0.1", 0), _Named)) as url:
        yield url


def test_a_service_is_replayed_over_its_own_protocol_and_each_failure_is_lost_or_failed_by_name(chat: str) -> None:
    # The chat service's own streamed request through the replay: a whole answer completes; an
    # error object in a 200 stream is an answer (FAILED, ERROR_BODY); a cut stream or a stall past
    # the gap never answered (LOST, named); an answer no server named is the router's own (LOST).
    service = Service(image="x", protocol="openai-chat", samples="s.jsonl", max_gap_s=1.0)
    prompts = ["hello", "error200", "cut", "gap", "html502", "anon"]
    picks = [(i, [{"role": "user", "content": p}]) for i, p in enumerate(prompts)]
    replay = Replay(chat, picks, rate_per_s=20.0, timeout_s=5.0, seed=3, service=service.model_dump(mode="json"))
    replay.start()
    time.sleep(1.0)
    replay.stop()
    by = {prompts[r["input_index"]]: r for r in sorted(replay.rows, key=lambda r: -r["request"])}
    assert set(by) == set(prompts), by.keys()
    assert by["hello"]["status"] == "COMPLETED" and by["hello"]["server"] == "target" and by["hello"]["http_status"] == 200
    assert by["hello"]["output"]["text"] == "Hello world!" and by["hello"]["failure"] == ""
    assert (by["error200"]["status"], by["error200"]["failure"]) == ("FAILED", "ERROR_BODY")
    assert faulty_service.ERROR_TEXT in by["error200"]["error"] and by["error200"]["output"] is None
    assert (by["html502"]["status"], by["html502"]["failure"]) == ("FAILED", "WRONG_CONTENT_TYPE")
    assert (by["cut"]["status"], by["cut"]["failure"]) == ("LOST", "STREAM_CUT")
    assert (by["gap"]["status"], by["gap"]["failure"]) == ("LOST", "TIMED_OUT")
    assert by["anon"]["status"] == "LOST" and "no server named" in by["anon"]["error"]


def test_a_runpod_job_unfinished_at_runsync_is_not_polled_through_a_router() -> None:
    # Its /status/{id} poll could reach the other side: named, and never sent.
    from runbook_lib.service.protocols import RunpodHandler

    polls: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            polls.append(self.path)
            faulty_service.send_json(self, 200, {"id": "job-1", "status": "IN_PROGRESS"})

        do_GET = do_POST

    service = Service(image="x", protocol="runpod-handler", samples="s.jsonl")
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), Handler)) as url:
        with RunpodHandler(service, url, timeout_s=2.0, server_header=SERVER_HEADER) as routed:
            got = routed.runsync({"x": 1})
        assert (got["status"], got["stage"]) == ("TIMED_OUT", "status poll") and "is not sent" in got["error"]
        assert polls == ["/runsync"] and classify_answer(got)["status"] == "LOST"
        polls.clear()
        with RunpodHandler(service, url, timeout_s=0.5) as direct:  # no router: polled to the deadline
            assert direct.runsync({"x": 1})["status"] == "TIMED_OUT"
        assert polls[0] == "/runsync" and polls[1:] and set(polls[1:]) == {"/status/job-1"}
