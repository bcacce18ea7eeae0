"""Clients of a service over its own protocol, with per-request metrics and named failures.

Each client answers :meth:`~ServiceClient.runsync` with a job-shaped answer (``status``,
``output``, ``execution_s``, ``metrics``), so phase 04's open-loop generator
(:func:`runbook_lib.measure.timing.run_open_loop`) and phase 05's slices send service requests exactly
as they send endpoint jobs; and :meth:`~ServiceClient.health` in the shape the endpoints report
(``workers``, ``jobs``), from what the client itself sees.

**Every request is bounded and every failure is named.** A request has one deadline,
``timeout_s`` (``measure.request_timeout_s``) from its send, for the whole answer, stream
included; a streamed answer that goes silent for ``workload.service.max_gap_s`` between two
events fails too. Connecting and waiting for the headers are bounded by httpx's own timeouts;
once the headers are in, a watchdog thread shuts the request's socket down at the deadline or
the gap, so a server that trickles keep-alive comments cannot hold a request open. A failed
answer's ``status`` is its kind (:data:`FAILURE_KINDS`), ``stage`` says where it failed
(:data:`STAGES`) and ``error`` keeps the first :data:`ERROR_CHARS` characters of the server's
own words, with anything credential-shaped replaced (:func:`scrub`).

Metric definitions are vLLM ``bench serve``'s (``vllm.benchmarks.serve``,
``calculate_metrics``; summarised in docs/reference/gates.md 3.6): TTFT is the time from sending
the request to the first streamed chunk with content; ITL the gaps between successive content
chunks; TPOT per request ``(E2E - TTFT) / (output tokens - 1)``; E2E latency from send to the
last byte. Output tokens are the server's ``usage.completion_tokens`` when it reports usage,
else the answer's text counted by the tokenizer the params name (``workload.service.tokenizer``,
``add_special_tokens=False``, as ``vllm bench serve`` re-tokenizes), else not measurable: streamed
chunks are never counted as tokens (``transformers serve`` flushes 5 to 13 chunks per 16 tokens).
Without a token count TPOT and ITL are NaN and empty, and ``metrics["tokens_from"]`` says why.
One difference, by design: the latency the gates judge (``total_s`` in phase 04's samples) runs
from the request's *intended* arrival, not from its send (the MLPerf definition,
docs/reference/gates.md 3.5), so a load generator that falls behind cannot hide a queue.
"""

from __future__ import annotations

import json
import math
import re
import socket
import threading
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, TypedDict

import httpx

from runbook_lib.errors import ParamsError, ProviderError
from runbook_lib.params import Service
from runbook_lib.secret_refs import KEY_PATTERNS
from runbook_lib.service.compare import MISSING, at_path
from runbook_lib.service.pacing import Pacer

PROTOCOL_PATHS = {"openai-chat": "/v1/chat/completions", "runpod-handler": "/runsync"}
"""The path each protocol calls (``http-json``: its declared ``request.path``)."""

FAILURE_KINDS: dict[str, str] = {
    "HTTP_STATUS": "the status is not the protocol's success status",
    "ERROR_BODY": "the answer, or one of its streamed events, carries an error object",
    "WRONG_CONTENT_TYPE": "the answer's Content-Type is not the protocol's",
    "STREAM_CUT": "the stream ended, or broke, before the protocol's end of an answer (a finish_reason)",
    "BAD_BODY": "the answer or one of its events is not the JSON the protocol sends",
    "OVERSIZE": "the answer is larger than workload.service.max_answer_bytes",
    "EMPTY": "the answer holds no content where the protocol promises some",
    "TIMED_OUT": "no whole answer within measure.request_timeout_s, or a stall past workload.service.max_gap_s",
    "CLIENT_ERROR": "the request could not be sent (connection refused or reset before an answer)",
}
"""The ways a service request fails, as its ``status``. A Runpod job's own terminal statuses
(``FAILED``, ``CANCELLED``, ``TIMED_OUT``) are kept as the job reports them."""

STREAM_CUT = "STREAM_CUT"

STAGES = ("connect", "headers", "body", "first token", "mid-stream", "status poll")
"""Where a request failed: connecting, waiting for the status line and headers, reading a whole
(non-streamed) answer, waiting for the first streamed content, between streamed content, or
polling a queued Runpod job."""

ERROR_CHARS = 200
"""Characters of the server's own error text kept per failed request."""

CONNECT_S = 10.0
"""The longest wait for a connection, seconds (never past the request's deadline)."""

WATCH_TICK_S = 0.02
"""How often the watchdog looks at the requests in flight, seconds: a deadline or a gap is
enforced within this of its moment."""

JSON_TYPES = ("application/json",)
SSE_TYPE = "text/event-stream"


Answer = dict[str, Any]
"""A service request's answer, job-shaped (:meth:`ServiceClient.runsync`): ``status``, ``output``,
``execution_s``, ``metrics``, and ``stage``/``error`` when it failed."""


class ProtocolMismatch(ProviderError):
    """The service answers 404 on the protocol's path: it speaks another protocol."""


def scrub(text: str) -> str:
    """``text`` with every credential shape of :data:`runbook_lib.secret_refs.KEY_PATTERNS` (a
    64-hex run included: a server's error has no business holding one) and every bearer token
    replaced by ``[REDACTED]``."""
    for _kind, rx in KEY_PATTERNS:
        text = rx.sub("[REDACTED]", text)
    return re.sub(r"(?i)(bearer\s+)[^\s\"']+", r"\1[REDACTED]", text)


def said(text: Any) -> str:
    """The first :data:`ERROR_CHARS` characters of a server's own words, scrubbed (:func:`scrub`)."""
    return scrub(str(text)[:ERROR_CHARS * 2])[:ERROR_CHARS]


def failed(kind: str, stage: str, error: str, **extra: Any) -> dict[str, Any]:
    """A failed answer: ``status`` ``kind`` (:data:`FAILURE_KINDS`), where (``stage``) and
    ``error``: what was called and what went wrong, with the server's own words already cut by
    :func:`said` (the whole scrubbed again and kept to 400 characters)."""
    return {"status": kind, "output": None, "stage": stage, "error": scrub(str(error))[:400], **extra}


def media_type(resp: httpx.Response) -> str:
    """The response's media type, lower-case, without parameters (``text/event-stream``)."""
    return str(resp.headers.get("content-type", "")).split(";")[0].strip().lower()


def is_json_type(mt: str) -> bool:
    """``application/json`` or a ``+json`` structured syntax suffix (RFC 6839 section 3.1)."""
    return mt in JSON_TYPES or mt.endswith("+json")


def error_text(obj: Any) -> str | None:
    """The error an OpenAI-style answer or event carries, or None: ``{"error": {"message": ...}}``
    (OpenAI's and vLLM's ErrorResponse), ``{"error": "..."}`` (``transformers serve``'s streamed
    error) or ``{"object": "error", "message": ...}`` (vLLM before its ErrorInfo wrapper)."""
    if not isinstance(obj, dict):
        return None
    err = obj.get("error")
    if err:
        if isinstance(err, dict):
            return str(err.get("message") or err)
        return str(err)
    if obj.get("object") == "error":
        return str(obj.get("message") or obj)
    return None


@lru_cache(maxsize=8)
def _tokenizer(path: str) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


def tokenizer_file(service: Service, project: Path | None) -> Path | None:
    """``workload.service.tokenizer``'s ``tokenizer.json`` (relative to ``project``), or None.

    Raises:
        ParamsError: the directory holds no ``tokenizer.json`` (exit 2: name one that does).
    """
    if not service.tokenizer:
        return None
    d = Path(service.tokenizer)
    if not d.is_absolute() and project is not None:
        d = project / d
    f = d / "tokenizer.json" if d.is_dir() or not d.suffix else d
    if not f.is_file():
        raise ParamsError(f"workload.service.tokenizer {service.tokenizer!r}: {f} does not exist; name a local "
                          "directory holding the model's tokenizer.json, or leave it out (TPOT, ITL and goodput are "
                          "then not measurable where the server sends no usage)")
    return f


class _Watch:
    """One request in flight: its deadline, the socket once the headers are in, the last event's
    time and the stage; ``why`` is set when the watchdog ended it."""

    def __init__(self, deadline: float, max_gap_s: float | None) -> None:
        self.deadline = deadline
        self.max_gap_s = max_gap_s
        self.sock: socket.socket | None = None
        self.last: float | None = None  # the last streamed event; the gap applies from the first
        self.stage = "connect"
        self.why: str | None = None
        self.server = ""  # who answered, from the router's header (ServiceClient.server_header)
        self.http_status: int | None = None  # the last response's status line
        self.lock = threading.Lock()  # the socket is shut down only while this request holds it

    def remaining(self) -> float:
        return max(self.deadline - time.perf_counter(), 0.001)


class _Watchdog:
    """Ends requests past their deadline or stalled past their gap by shutting their socket down
    (the reading thread then sees the stream end and reports TIMED_OUT). One thread per client,
    started with its first request, stopped by :meth:`close`."""

    def __init__(self) -> None:
        self._watches: set[_Watch] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, w: _Watch) -> None:
        with self._lock:
            self._watches.add(w)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="service-watchdog", daemon=True)
                self._thread.start()

    def discard(self, w: _Watch) -> None:
        with self._lock:
            self._watches.discard(w)

    def _loop(self) -> None:
        while not self._stop.wait(WATCH_TICK_S):
            now = time.perf_counter()
            with self._lock:
                watches = list(self._watches)
            for w in watches:
                with w.lock:  # a finished request releases its socket under this lock, so a pooled
                    if w.sock is None or w.why is not None:  # connection is never cut for another
                        continue
                    if now >= w.deadline:
                        w.why = "deadline"
                    elif w.max_gap_s is not None and w.last is not None and now - w.last > w.max_gap_s:
                        w.why = "gap"
                    else:
                        continue
                    try:
                        w.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)


class _Oversize(Exception):
    pass


def head(resp: httpx.Response, n: int = 2000) -> str:
    """The first ``n`` bytes or so of a body not used whole, as text (never more read)."""
    body = b""
    try:
        for chunk in resp.iter_bytes():
            body += chunk
            if len(body) >= n:
                break
    except httpx.HTTPError:
        pass
    return body[:n].decode("utf-8", "replace")


def read_capped(resp: httpx.Response, limit: int) -> bytes:
    """The whole body, at most ``limit`` bytes (``service.max_answer_bytes``).

    Raises:
        _Oversize: the body is larger (reading stops there).
    """
    buf = bytearray()
    for chunk in resp.iter_bytes():
        buf += chunk
        if len(buf) > limit:
            raise _Oversize
    return bytes(buf)


def oversize(where: str, limit: int, stage: str) -> Answer:
    """An OVERSIZE answer of the call ``where``."""
    return failed("OVERSIZE", stage, f"{where}: the answer exceeds workload.service.max_answer_bytes ({limit} bytes); "
                                     "stopped reading there")


def count_tokens(tokenizer: Path | None, text: str) -> float:
    """Output tokens of ``text`` by the ``tokenizer.json`` at ``tokenizer``, without special
    tokens, as ``vllm bench serve`` re-tokenizes (NaN without one)."""
    if tokenizer is None:
        return math.nan
    return float(len(_tokenizer(str(tokenizer)).encode(text, add_special_tokens=False).ids))


class ServiceClient:
    """What every protocol's client shares: an HTTP client on ``url``, the deadline of each
    request, the request counter :meth:`health` reports, and the readiness probe.

    Args:
        service: ``workload.service`` of params.
        url: the service's base URL (``http://host:port``).
        timeout_s: each request's deadline, seconds from its send to the last byte of its answer
            (``measure.request_timeout_s``).
        project: the project root, where ``service.tokenizer`` is relative to (None: no
            tokenizer is loaded, as for a readiness probe, which counts no tokens).
        server_header: the service is behind a router that names the server of each answer in
            this response header (phase 05's router, :data:`runbook_lib.traffic.router.SERVER_HEADER`):
            each answer carries it as ``server`` (empty when the header was absent: the router
            answered on its own), and a ``runpod-handler`` job still running when ``/runsync``
            returns is not polled (:class:`RunpodHandler`). Empty: a direct client.
        max_connections: the most connections the client opens at once (httpx's pool limit).
        pacer: every request (a readiness check, a call, a job's status poll) first waits for a
            slot of this :class:`~runbook_lib.service.pacing.Pacer` (a live source's
            ``max_rate_per_s``); the wait is part of the request's latency, not of its deadline (timeout_s runs from the send). None: unpaced.
        headers: sent with every request (a live source's ``Authorization``); never recorded.
        readiness: ``(path, status)`` of the readiness check (:meth:`health`); None:
            ``service.readiness``'s. A serverless endpoint's job API is checked at its own
            ``/health`` (:data:`runbook_lib.phases.service_pods.ENDPOINT_READINESS`).

    Raises:
        ParamsError: ``service.tokenizer`` names no ``tokenizer.json``.
    """

    protocol = ""

    def __init__(self, service: Service, url: str, *, timeout_s: float = 60.0, project: Path | None = None,
                 server_header: str = "", max_connections: int = 100, pacer: Pacer | None = None,
                 headers: dict[str, str] | None = None, readiness: tuple[str, int] | None = None) -> None:
        self.service = service
        self.readiness = readiness or (service.readiness.path, service.readiness.status)
        self.pacer = pacer
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.server_header = server_header
        self.http = httpx.Client(base_url=self.url, timeout=timeout_s, headers=headers or {},
                                 limits=httpx.Limits(max_connections=max_connections,
                                                     max_keepalive_connections=max_connections))
        self._lock = threading.Lock()
        self._watchdog = _Watchdog()
        self.in_flight = 0
        self.tokenizer_path = tokenizer_file(service, project) if project is not None else None

    def close(self) -> None:
        self._watchdog.close()
        self.http.close()

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def path(self) -> str:
        return PROTOCOL_PATHS.get(self.protocol, self.service.request.path)

    def where(self, path: str | None = None) -> str:
        """``METHOD URL`` of the protocol's call (for messages)."""
        method = self.service.request.method if self.protocol == "http-json" else "POST"
        return f"{method} {self.url}{path or self.path}"

    def health(self) -> dict[str, Any]:
        """The readiness check's answer in an endpoint's health shape: one worker, ``idle`` when
        ``GET`` of the readiness path (:attr:`readiness`) answers its status, else ``unhealthy``;
        jobs in progress are the requests this client has in flight (a service has no queue the
        runbook can see).

        Raises:
            ProviderError: the service cannot be reached (connection refused, timed out).
        """
        path, want = self.readiness
        status, _, body = peek(self, path)
        ok = status == want
        return {"status": status, "body": body[:200],
                "workers": {"idle": 1 if ok else 0, "running": 0, "unhealthy": 0 if ok else 1},
                "jobs": {"inQueue": 0, "inProgress": self.in_flight}}

    def runsync(self, payload: Any) -> dict[str, Any]:
        """Send one request and wait for its whole answer, at most ``timeout_s``; never retried
        (a request that reached the service is not resent). Returns ``status`` (``COMPLETED``,
        a kind of :data:`FAILURE_KINDS`, or a Runpod job's terminal status) with ``stage`` and
        ``error`` when it failed, ``output`` (None unless completed), ``execution_s`` (send to
        last byte, seconds), ``metrics`` (the protocol's per-request figures, seconds and
        counts) and ``http_status`` (the last response's status line; absent when none came)."""
        with self._lock:
            self.in_flight += 1
        t0 = time.perf_counter()
        if self.pacer is not None:  # the wait for a slot is the request's latency, as a queue's is; its
            self.pacer.wait()       # deadline runs from when it may be sent, so pacing never ends it
        w = _Watch(time.perf_counter() + self.timeout_s, None)
        try:
            out = self._call(payload, t0, w)
        except httpx.HTTPError as exc:
            out = self._transport_failure(exc, w)
        finally:
            self._watchdog.discard(w)
            with self._lock:
                self.in_flight -= 1
        out.setdefault("execution_s", time.perf_counter() - t0)
        out.setdefault("metrics", {})
        if w.http_status is not None:  # a whole answer's status line too, not only a failure's
            out.setdefault("http_status", w.http_status)
        if self.server_header:
            out["server"] = w.server
        return out

    def _transport_failure(self, exc: httpx.HTTPError, w: _Watch) -> dict[str, Any]:
        """A request that broke in transport: TIMED_OUT when the deadline, the gap or httpx's own
        timeout ended it, CLIENT_ERROR when nothing answered, STREAM_CUT when a stream broke."""
        if w.stage == "connect" and not isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
            w.stage = "headers"  # connected: what broke or timed out was the wait for the headers
        if w.why is not None or isinstance(exc, httpx.TimeoutException):
            return self._timed_out(w)
        if w.stage in ("connect", "headers", "status poll"):
            return failed("CLIENT_ERROR", w.stage, f"{self.where()}: {type(exc).__name__}: {exc}")
        return failed(STREAM_CUT, w.stage, f"{self.where()}: the answer broke at {w.stage}: {type(exc).__name__}: {exc}")

    def _timed_out(self, w: _Watch) -> dict[str, Any]:
        if w.why == "gap":
            why = (f"no streamed event for more than workload.service.max_gap_s ({self.service.max_gap_s:g} s) "
                   f"at {w.stage}")
        else:
            why = f"no whole answer within measure.request_timeout_s ({self.timeout_s:g} s): stalled at {w.stage}"
        return failed("TIMED_OUT", w.stage, f"{self.where()}: {why}")

    @contextmanager
    def _open(self, w: _Watch, method: str, path: str, *, gap: bool = False,
              **kw: Any) -> Iterator[httpx.Response]:
        """Send a request with ``w``'s deadline and yield its response once the headers are in,
        watched: the watchdog ends it at the deadline, and at the service's ``max_gap_s`` between
        events when ``gap`` (the reader updates ``w.last``)."""
        left = w.remaining()
        timeout = httpx.Timeout(left, connect=min(CONNECT_S, left))
        if w.stage != "status poll":  # a queued job's polls fail as polls, wherever they stall
            w.stage = "connect"
        elif self.pacer is not None:  # a poll is one more request to a paced service
            self.pacer.wait()
        w.max_gap_s = self.service.max_gap_s if gap else None
        with self.http.stream(method, path, timeout=timeout, **kw) as resp:
            w.http_status = resp.status_code
            if self.server_header:
                w.server = resp.headers.get(self.server_header, "")
            stream = resp.extensions.get("network_stream")
            w.sock = stream.get_extra_info("socket") if stream is not None else None
            self._watchdog.add(w)
            try:
                yield resp
            finally:
                with w.lock:
                    w.sock = None
                self._watchdog.discard(w)

    def _status_failure(self, resp: httpx.Response, w: _Watch) -> dict[str, Any]:
        """A non-success status: HTTP_STATUS with the server's error text (at most 2,000 bytes read)."""
        text = head(resp)
        try:
            text = error_text(json.loads(text)) or text
        except ValueError:
            pass
        return failed("HTTP_STATUS", "headers", f"HTTP {resp.status_code} on {self.where()}: {said(text)}",
                      http_status=resp.status_code)

    def _json_answer(self, resp: httpx.Response, w: _Watch) -> Any | dict[str, Any]:
        """A whole JSON answer, or a failed answer (``dict`` with ``status``) as :class:`_Failed`."""
        mt = media_type(resp)
        if not is_json_type(mt):
            body = head(resp, ERROR_CHARS) if mt.startswith("text/") else ""
            return _Failed(failed("WRONG_CONTENT_TYPE", "headers",
                                  f"{self.where()} answered Content-Type {mt or 'none'!r}, not application/json: "
                                  f"{said(body)}", http_status=resp.status_code))
        w.stage = "body"
        try:
            data = read_capped(resp, self.service.max_answer_bytes)
        except _Oversize:
            return _Failed(oversize(self.where(), self.service.max_answer_bytes, "body"))
        if w.why is not None:
            return _Failed(self._timed_out(w))
        try:
            return json.loads(data)
        except ValueError:
            return _Failed(failed("BAD_BODY", "body", f"{self.where()}: the answer is not JSON: "
                                                      f"{data[:ERROR_CHARS].decode('utf-8', 'replace')!r}"))

    def _call(self, payload: Any, t0: float, w: _Watch) -> dict[str, Any]:
        raise NotImplementedError

    def check_protocol(self, payload: Any) -> dict[str, Any]:
        """Send one sample and return its answer.

        Raises:
            ProtocolMismatch: the service answered 404 on the protocol's path (names the path and
                the protocols this runbook speaks).
        """
        got = self.runsync(payload)
        if got.get("http_status") == 404:
            raise ProtocolMismatch(
                f"the service at {self.url} answers 404 on {self.path}, the path of protocol {self.protocol!r}: it "
                f"speaks another protocol or serves another path. Protocols: openai-chat (POST "
                f"{PROTOCOL_PATHS['openai-chat']}), runpod-handler (POST /runsync, the runpod SDK's job API), "
                f"http-json (workload.service.request.method and path); set "
                f"workload.service.protocol to the one it speaks. Its answer: {got.get('error')}")
        return got


class _Failed:
    """A failed answer returned from a helper in place of a value."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer


class OpenAIChat(ServiceClient):
    """``openai-chat``: ``POST /v1/chat/completions`` at temperature 0 with the declared seed and
    ``max_tokens``, streamed (server-sent events) when ``service.stream``, with
    ``stream_options.include_usage`` (vLLM sends usage only when asked; ``transformers serve``
    always sends it, beside the finish_reason).

    ``output`` is ``{"text", "chunks", "finish_reason"}``: the answer's text, its content
    chunks as streamed (one per decoding step the server flushed; a byte-level token that ends
    mid-character arrives merged with the next), and why it stopped. ``metrics``: ``ttft_s``,
    ``tpot_s``, ``itl_s`` (list of gaps), ``output_tokens`` (NaN where not measurable: a
    non-streamed answer has no TTFT or ITL) and ``tokens_from`` (``usage``, ``tokenizer`` or
    ``none``).

    What a complete streamed answer is: a choice's ``finish_reason``. Both reference servers send
    one as the last content-bearing chunk (vLLM's ``chat_completion_stream_generator`` in
    ``vllm/entrypoints/openai/serving_chat.py``; ``transformers serve``'s
    ``transformers/cli/serving/chat_completion.py``); vLLM then sends ``data: [DONE]``, which
    ``transformers serve`` 5.24 never sends, so ``[DONE]`` alone is neither required nor
    enough. A stream that ends without a finish_reason is STREAM_CUT. An ``error`` in any event
    (vLLM streams ``{"error": {...}}`` then ``[DONE]`` with status 200; ``transformers serve``
    streams ``{"error": "..."}``, not always valid JSON) is ERROR_BODY with its message."""

    protocol = "openai-chat"

    def body(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        s = self.service
        body: dict[str, Any] = {"messages": messages, "max_tokens": s.max_tokens, "temperature": 0, "seed": s.seed,
                                "stream": s.stream}
        if s.model:
            body["model"] = s.model
        if s.stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def _tokens(self, usage_tokens: int | None, text: str) -> tuple[float, str]:
        if usage_tokens is not None:
            return float(usage_tokens), "usage"
        if self.tokenizer_path is not None:
            return count_tokens(self.tokenizer_path, text), "tokenizer"
        return math.nan, "none"

    def _call(self, payload: Any, t0: float, w: _Watch) -> dict[str, Any]:
        if not self.service.stream:
            return self._whole(payload, t0, w)
        with self._open(w, "POST", self.path, gap=True, json=self.body(payload)) as resp:
            w.stage = "headers"
            if resp.status_code != 200:
                return self._status_failure(resp, w)
            mt = media_type(resp)
            if mt != SSE_TYPE:
                body = head(resp)
                try:
                    err = error_text(json.loads(body))
                except ValueError:
                    err = None
                if err is not None:
                    return failed("ERROR_BODY", "headers", f"{self.where()}: {said(err)}")
                return failed("WRONG_CONTENT_TYPE", "headers",
                              f"{self.where()} answered Content-Type {mt or 'none'!r} to a streamed request, not "
                              f"{SSE_TYPE}: {said(body)}", http_status=resp.status_code)
            return self._stream(resp, t0, w)

    def _stream(self, resp: httpx.Response, t0: float, w: _Watch) -> dict[str, Any]:
        chunks: list[str] = []
        stamps: list[float] = []
        finish: str | None = None
        usage_tokens: int | None = None
        done_marker = False
        size, buf = 0, b""
        w.stage = "first token"
        try:
            for raw in resp.iter_bytes():
                size += len(raw)
                if size > self.service.max_answer_bytes:
                    return oversize(self.where(), self.service.max_answer_bytes, w.stage)
                buf += raw
                *lines, buf = buf.split(b"\n")
                for line_b in lines:
                    line = line_b.decode("utf-8", "replace").rstrip("\r")
                    if not line.startswith("data:"):
                        continue  # comments (": keep-alive"), event names, blank separators
                    w.last = time.perf_counter()
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done_marker = True
                        break
                    try:
                        event = json.loads(data)
                    except ValueError:
                        if '"error"' in data[:40]:  # transformers serve writes its error unescaped
                            return failed("ERROR_BODY", w.stage, f"{self.where()}: {said(data)}")
                        return failed("BAD_BODY", w.stage, f"{self.where()}: a streamed event is not JSON: {said(repr(data))}")
                    err = error_text(event)
                    if err is not None:
                        return failed("ERROR_BODY", w.stage, f"{self.where()}: {said(err)}")
                    usage = event.get("usage") if isinstance(event, dict) else None
                    if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
                        usage_tokens = int(usage["completion_tokens"])
                    for choice in (event.get("choices") if isinstance(event, dict) else None) or []:
                        content = (choice.get("delta") or {}).get("content")
                        if content:
                            stamps.append(w.last)
                            chunks.append(content)
                            w.stage = "mid-stream"
                        finish = choice.get("finish_reason") or finish
                if done_marker:
                    break
        except httpx.HTTPError as exc:
            if w.why is not None or isinstance(exc, httpx.TimeoutException):
                return self._timed_out(w)
            return failed(STREAM_CUT, w.stage, f"{self.where()}: the stream broke after {len(chunks)} chunks: "
                                               f"{type(exc).__name__}: {exc}")
        if w.why is not None:
            return self._timed_out(w)
        end = time.perf_counter()
        if finish is None:
            return failed(STREAM_CUT, w.stage, f"{self.where()}: the stream ended after {len(chunks)} chunks with no "
                                               "finish_reason" + (" (only [DONE])" if done_marker else "")
                                               + ": the answer is incomplete")
        text = "".join(chunks)
        if not text:
            return failed("EMPTY", w.stage, f"{self.where()}: the streamed answer has no content "
                                            f"(finish_reason {finish!r})")
        tokens, source = self._tokens(usage_tokens, text)
        ttft = stamps[0] - t0
        e2e = end - t0
        measurable = math.isfinite(tokens)
        return {"status": "COMPLETED", "execution_s": e2e,
                "output": {"text": text, "chunks": chunks, "finish_reason": finish},
                "metrics": {"ttft_s": ttft, "tpot_s": (e2e - ttft) / (tokens - 1) if measurable and tokens > 1
                            else math.nan,
                            "itl_s": [b - a for a, b in zip(stamps, stamps[1:], strict=False)] if measurable else [],
                            "output_tokens": tokens, "tokens_from": source}}

    def _whole(self, payload: Any, t0: float, w: _Watch) -> dict[str, Any]:
        with self._open(w, "POST", self.path, json=self.body(payload)) as resp:
            w.stage = "headers"
            if resp.status_code != 200:
                return self._status_failure(resp, w)
            data = self._json_answer(resp, w)
        if isinstance(data, _Failed):
            return data.answer
        done = time.perf_counter()
        err = error_text(data)
        if err is not None:
            return failed("ERROR_BODY", "body", f"{self.where()}: {said(err)}")
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
            return failed("BAD_BODY", "body", f"{self.where()}: no choices in the answer: {str(data)[:120]}")
        choice = data["choices"][0] if isinstance(data["choices"][0], dict) else {}
        text = (choice.get("message") or {}).get("content") or ""
        if not text:
            return failed("EMPTY", "body", f"{self.where()}: the answer has no content "
                                           f"(finish_reason {choice.get('finish_reason')!r})")
        tokens, source = self._tokens((data.get("usage") or {}).get("completion_tokens"), text)
        return {"status": "COMPLETED", "execution_s": done - t0,
                "output": {"text": text, "chunks": [text], "finish_reason": choice.get("finish_reason")},
                "metrics": {"ttft_s": math.nan, "tpot_s": math.nan, "itl_s": [], "output_tokens": tokens,
                            "tokens_from": source}}


def fill(template: Any, value: Any) -> Any:
    """The ``http-json`` body: ``template`` with each string ``"{input}"`` replaced by the sample
    input and ``"{input.KEY}"`` by its key ``KEY`` (nested dicts and lists walked)."""
    if isinstance(template, str):
        if template == "{input}":
            return value
        if template.startswith("{input.") and template.endswith("}") and isinstance(value, dict):
            return value.get(template[7:-1])
        return template
    if isinstance(template, dict):
        return {k: fill(v, value) for k, v in template.items()}
    if isinstance(template, list):
        return [fill(v, value) for v in template]
    return template


def declared_error(answer: Any, path: str) -> str | None:
    """The error at dotted ``path`` of a JSON answer (``request.error_path``), or None when the
    path is empty, absent, or holds null, false or an empty value."""
    if not path:
        return None
    v = at_path(answer, path)
    if v is MISSING or v is None or v is False or v == "" or v == [] or v == {}:
        return None
    return error_text({"error": v})


class HttpJson(ServiceClient):
    """``http-json``: ``request.method request.path`` with the body template filled from the
    sample input; ``output`` is the JSON answer. ``metrics`` is empty (no tokens). A 2xx status
    with a JSON Content-Type is a success unless ``request.error_path`` holds an error."""

    protocol = "http-json"

    def _call(self, payload: Any, t0: float, w: _Watch) -> dict[str, Any]:
        req = self.service.request
        kw: dict[str, Any] = {} if req.method == "GET" else {"json": fill(req.body, payload)}
        with self._open(w, req.method, self.path, **kw) as resp:
            w.stage = "headers"
            if not 200 <= resp.status_code < 300:
                return self._status_failure(resp, w)
            data = self._json_answer(resp, w)
        if isinstance(data, _Failed):
            return data.answer
        err = declared_error(data, req.error_path)
        if err is not None:
            return failed("ERROR_BODY", "body", f"{self.where()}: {req.error_path}: {said(err)}")
        return {"status": "COMPLETED", "output": data}


JOB_API_HEALTH = "/health"
"""A Runpod endpoint's job API health route: its ``jobs`` and ``workers`` counts
(docs/reference/providers.md 2.2)."""


def workers_said(workers: dict[str, Any]) -> str:
    """What a job API's worker counts say about a job that did not end in time, in words; empty
    when nothing explains it. ``throttled`` workers wait for a GPU in the endpoint's pools (no
    capacity, not the service); ``unhealthy`` ones crash-loop (the image or handler is broken:
    its logs say why); ``initializing`` ones with none idle or running mean a cold start
    (runpod/runpod-mcp PR #62: most "capacity" timeouts were crash-looping workers)."""
    n = {k: int(workers.get(k) or 0) for k in ("idle", "running", "initializing", "throttled", "unhealthy")}
    parts = []
    if n["throttled"]:
        parts.append(f"{n['throttled']} worker(s) THROTTLED: waiting for a GPU in the endpoint's pools, a capacity "
                     "problem, not the service (widen the pools or wait)")
    if n["unhealthy"]:
        parts.append(f"{n['unhealthy']} worker(s) UNHEALTHY: crash-looping, read the worker logs and fix the image")
    if n["initializing"] and not n["idle"] + n["running"]:
        parts.append(f"{n['initializing']} worker(s) INITIALIZING: the job waited for a cold start")
    return "; ".join(parts)


class JobPolicy(TypedDict, total=False):
    """Runpod's per-job execution policy, milliseconds (``policy`` of ``/run`` and ``/runsync``,
    docs/reference/providers.md 2.2): ``executionTimeout`` (min 5 s, max 7 days) and ``ttl``."""

    executionTimeout: int
    ttl: int


class RunpodHandler(ServiceClient):
    """``runpod-handler``: a Runpod Serverless worker as the official ``runpod`` SDK runs it, over
    its job API: ``POST /runsync`` with ``{"input": <sample>}``; a job still ``IN_QUEUE`` or
    ``IN_PROGRESS`` when ``/runsync`` returns is polled at ``/status/{id}`` until it ends or the
    deadline passes (never submitted again), except behind a router (``server_header``): there
    the poll could reach the other side, so such a job fails TIMED_OUT at ``status poll``, named.
    ``output`` is the job's output; queue and execution
    seconds come from the job's own ``delayTime`` and ``executionTime`` (milliseconds,
    docs/reference/providers.md 2.4) where the API reports them (Runpod's does; the SDK's local
    ``--rp_serve_api`` does not: NaN). A job ``FAILED``, ``CANCELLED`` or ``TIMED_OUT`` is a
    failed request with the job's error; a ``COMPLETED`` job with no output is EMPTY, one with an
    ``error`` is ERROR_BODY.

    The SDK's local API (``runpod/serverless/modules/rp_fastapi.py``, runpod 1.12.0) serves POST
    ``/run``, ``/runsync``, ``/stream/{id}`` and ``/status/{id}``, and its Swagger page at ``GET
    /`` (200); it has no ``/health`` or ``/ping`` (404), hence the protocol's readiness default
    ``/`` (:data:`runbook_lib.params.READINESS_PATHS`). Its ``/stream/{id}`` runs a generator
    handler to its end and answers one JSON list, so streaming is not a measurement here
    (``stream: true`` is refused for this protocol)."""

    protocol = "runpod-handler"
    POLL_S = 0.05

    def __init__(self, service: Service, url: str, *, policy: JobPolicy | None = None, **kw: Any) -> None:
        """``policy``: Runpod's per-job execution policy sent with every job (``executionTimeout``
        in ms, ``ttl``; docs/reference/providers.md 2.4); None: the endpoint's own. The other
        arguments as :class:`ServiceClient` takes them."""
        super().__init__(service, url, **kw)
        self.policy = policy

    def runsync(self, payload: Any) -> dict[str, Any]:
        """As :meth:`ServiceClient.runsync`; a job that did not end in time on a Runpod endpoint
        (readiness at the job API's :data:`JOB_API_HEALTH`) is explained by what the endpoint's
        ``/health`` says of its workers (:func:`workers_said`), where it says something."""
        out = super().runsync(payload)
        if out.get("status") in ("TIMED_OUT", "CLIENT_ERROR") and self.readiness[0] == JOB_API_HEALTH:
            try:
                _, _, body = peek(self, JOB_API_HEALTH)
                said_now = workers_said(json.loads(body).get("workers") or {})
            except (ProviderError, ValueError, AttributeError):
                said_now = ""
            if said_now:
                out["error"] = f"{out.get('error', '')}; the endpoint's /health: {said_now}"
        return out

    def _job(self, w: _Watch, method: str, path: str, **kw: Any) -> dict[str, Any] | _Failed:
        with self._open(w, method, path, **kw) as resp:
            if resp.status_code == 405 and path.startswith("/status/"):
                return _Failed({"status": "RETRY_POST"})
            if not 200 <= resp.status_code < 300:
                return _Failed(self._status_failure(resp, w))
            data = self._json_answer(resp, w)
        if isinstance(data, _Failed):
            return data
        if not isinstance(data, dict):
            return _Failed(failed("BAD_BODY", "body", f"{self.where(path)}: not a job: {str(data)[:120]}"))
        return data

    def _call(self, payload: Any, t0: float, w: _Watch) -> dict[str, Any]:
        body: dict[str, Any] = {"input": payload} if self.policy is None else {"input": payload, "policy": self.policy}
        job = self._job(w, "POST", "/runsync", json=body)
        if self.server_header and not isinstance(job, _Failed) and job.get("status") in ("IN_QUEUE", "IN_PROGRESS"):
            return failed("TIMED_OUT", "status poll",
                          f"{self.where()}: job {job.get('id')} was still {job.get('status')} when /runsync returned; "
                          "behind a router its /status/{id} poll is not sent (the job's id is in the path, nothing "
                          "the router can keep on the worker that holds it, so the poll could reach the other "
                          "side): the request has no whole answer")
        while not isinstance(job, _Failed) and job.get("status") in ("IN_QUEUE", "IN_PROGRESS") and job.get("id"):
            if time.perf_counter() + self.POLL_S >= w.deadline:
                return failed("TIMED_OUT", "status poll", f"{self.where()}: job {job.get('id')} still "
                                                          f"{job.get('status')} at measure.request_timeout_s "
                                                          f"({self.timeout_s:g} s)")
            time.sleep(self.POLL_S)
            w.stage = "status poll"
            got = self._job(w, "GET", f"/status/{job['id']}")
            if isinstance(got, _Failed) and got.answer.get("status") == "RETRY_POST":
                got = self._job(w, "POST", f"/status/{job['id']}")  # the SDK's local API answers status to POST only
            job = got
        return self._judged(job, t0)

    def _judged(self, job: dict[str, Any] | _Failed, t0: float, routed_s: float = 0.0) -> dict[str, Any]:
        """A finished job's answer: COMPLETED with its output and timings, else the named failure
        (the class docstring says which); ``routed_s`` seconds spent finding a worker count as queue."""
        if isinstance(job, _Failed):
            return job.answer
        timing = {k: float(job[src]) / 1000.0 for k, src in (("queue_s", "delayTime"), ("execution_s", "executionTime"))
                  if job.get(src) is not None}
        if routed_s:
            timing["queue_s"] = timing.get("queue_s", 0.0) + routed_s
        status = str(job.get("status") or "")
        if status != "COMPLETED":
            kind = status if status in ("FAILED", "CANCELLED", "TIMED_OUT") else "BAD_BODY"
            return {**failed(kind, "body", f"job {job.get('id')} {status or 'without a status'}: "
                                           f"{said(job.get('error'))}"), **timing}
        if job.get("error"):
            return {**failed("ERROR_BODY", "body", f"job {job.get('id')}: {said(error_text(job))}"), **timing}
        if job.get("output") is None:
            return {**failed("EMPTY", "body", f"job {job.get('id')} COMPLETED with no output"), **timing}
        # where the job reports no executionTime, execution runs from the call that reached a worker
        return {"status": "COMPLETED", "output": job.get("output"), "job_id": job.get("id"),
                "queue_s": timing.get("queue_s", math.nan),
                "execution_s": timing.get("execution_s", time.perf_counter() - t0 - routed_s)}


class VastRouted(RunpodHandler):
    """``runpod-handler`` on a Vast.ai Serverless endpoint through its PyWorker adapter
    (:class:`runbook_lib.params.PyWorkerAdapter`), as the ``vastai`` 1.9.1 client calls one
    (``serverless/client/client.py``, ``endpoint.py``): ``POST {autoscaler}/route/`` with
    ``{"endpoint", "api_key", "cost", "request_idx", "replay_timeout"}`` (the endpoint's own key,
    also as Bearer auth) until the answer carries a worker ``url`` (no ``url``: no worker ready
    yet, asked again after :data:`ROUTE_POLL_S`), then ``POST {url}{route}`` with ``{"auth_data":
    <that answer>, "session_id": null, "payload": {"input": <sample>}}``. The PyWorker forwards the
    payload to the handler's ``/runsync`` and passes its job back, judged as
    :class:`RunpodHandler` judges one; the seconds spent routing count as queue time. A job still
    running when the worker answers cannot be polled (``/status/{id}`` is no PyWorker route): it
    fails TIMED_OUT, named. Readiness (:meth:`health`) is a ``/route/`` of cost 0 that names a
    worker."""

    ROUTE_POLL_S = 0.2
    COST = 100  # the vastai client's default cost of a request (serverless/client/client.py)

    def __init__(self, service: Service, url: str, *, endpoint_name: str, endpoint_key: str, worker_route: str,
                 **kw: Any) -> None:
        super().__init__(service, url, headers={"Authorization": f"Bearer {endpoint_key}"}, **kw)
        self.endpoint_name, self._key, self.worker_route = endpoint_name, endpoint_key, worker_route
        self.request_idx = 0

    def where(self, path: str | None = None) -> str:
        return f"POST {self.url}/route/ then the worker's {self.worker_route}"

    def _route(self, w: _Watch, cost: float, *, once: bool = False) -> dict[str, Any] | _Failed:
        """The autoscaler's answer naming a worker, or the failure (once: the first answer, ready or
        not). A route call that breaks in transport is asked again until the deadline: it reaches
        no worker, so nothing of the request has been served (the ``vastai`` client retries it too,
        ``serverless/client/endpoint.py``)."""
        last: Any = None
        while True:
            body = {"endpoint": self.endpoint_name, "api_key": self._key, "cost": cost, "request_idx": 0,
                    "replay_timeout": 60.0}
            try:
                got = self._job(w, "POST", "/route/", json=body)
            except httpx.TransportError as exc:
                if once or time.perf_counter() + self.ROUTE_POLL_S >= w.deadline:
                    raise
                last = f"{type(exc).__name__}: {scrub(str(exc))}"
                time.sleep(self.ROUTE_POLL_S)
                continue
            if isinstance(got, _Failed) or "url" in got or once:
                return got
            last = got.get("status")
            if time.perf_counter() + self.ROUTE_POLL_S >= w.deadline:
                return _Failed(failed("TIMED_OUT", "route", f"{self.where()}: no worker of endpoint "
                                                            f"{self.endpoint_name!r} was ready within "
                                                            f"measure.request_timeout_s ({self.timeout_s:g} s); "
                                                            f"workers by status: {last}"))
            time.sleep(self.ROUTE_POLL_S)

    def _call(self, payload: Any, t0: float, w: _Watch) -> dict[str, Any]:
        auth = self._route(w, self.COST)
        if isinstance(auth, _Failed):
            return auth.answer
        routed_s = time.perf_counter() - t0
        w.stage, w.http_status = "connect", None  # the worker's answer, not the route's, is the request's
        worker = str(auth["url"]).rstrip("/")
        try:
            job = self._job(w, "POST", f"{worker}{self.worker_route}",
                            json={"auth_data": auth, "session_id": None, "payload": {"input": payload}})
        except httpx.HTTPError as exc:  # named with the worker it reached, which the route chose
            out = self._transport_failure(exc, w)
            return {**out, "error": f"{out.get('error', '')} (worker {worker})"}
        if not isinstance(job, _Failed) and job.get("status") in ("IN_QUEUE", "IN_PROGRESS"):
            return failed("TIMED_OUT", "status poll", f"{self.where()}: job {job.get('id')} was still "
                                                      f"{job.get('status')} when the worker answered; a PyWorker has "
                                                      "no /status/{id} route, so it cannot be polled")
        return self._judged(job, t0, routed_s)

    def health(self) -> dict[str, Any]:
        """Ready when a ``/route/`` of cost 0 names a worker (status 200), else 503 with the
        workers by status.

        Raises:
            ProviderError: the autoscaler cannot be reached.
        """
        w = _Watch(time.perf_counter() + min(self.timeout_s, 10.0), None)
        try:
            got = self._route(w, 0.0, once=True)
        except httpx.HTTPError as exc:
            raise ProviderError(f"the autoscaler at {self.url} cannot be reached: {scrub(str(exc))}") from exc
        if isinstance(got, _Failed):
            return {"status": int(got.answer.get("http_status") or 503), "body": str(got.answer.get("error"))[:200],
                    "workers": {"idle": 0, "running": 0, "unhealthy": 1}, "jobs": {"inQueue": 0, "inProgress": 0}}
        ok = "url" in got
        return {"status": 200 if ok else 503, "body": json.dumps(got.get("status") or {})[:200],
                "workers": {"idle": 1 if ok else 0, "running": 0, "unhealthy": 0},
                "jobs": {"inQueue": 0, "inProgress": self.in_flight}}


def peek(client: ServiceClient, path: str) -> tuple[int, dict[str, str], str]:
    """``GET path`` on ``client``'s service (paced like its every request): the status, the
    response headers (lower-case names) and the first 2,000 characters of the body, scrubbed
    (:func:`scrub`).

    Raises:
        ProviderError: the service cannot be reached.
    """
    if client.pacer is not None:
        client.pacer.wait()
    try:
        got = client.http.get(path, timeout=min(client.timeout_s, 10.0))
    except httpx.HTTPError as exc:
        raise ProviderError(f"service at {client.url} cannot be reached for GET {path}: {scrub(str(exc))}") from exc
    return got.status_code, {k.lower(): v for k, v in got.headers.items()}, scrub(got.text[:2000])


def listed_models(body: str) -> list[str]:
    """The model ids of an OpenAI ``GET /v1/models`` answer (``{"object": "list", "data": [{"id":
    ...}]}``, the OpenAI API reference's "List models"); empty when the body is not that shape."""
    try:
        doc = json.loads(body)
    except ValueError:
        return []
    items = doc.get("data") if isinstance(doc, dict) else None
    return [str(m.get("id")) for m in items if isinstance(m, dict)] if isinstance(items, list) else []


def client_for(service: Service, url: str, *, timeout_s: float = 60.0, project: Path | None = None,
               server_header: str = "", max_connections: int = 100, pacer: Pacer | None = None,
               headers: dict[str, str] | None = None, readiness: tuple[str, int] | None = None,
               policy: JobPolicy | None = None) -> ServiceClient:
    """The client of ``service.protocol`` on ``url``; ``timeout_s`` is each request's deadline;
    ``server_header``, ``max_connections``, ``pacer``, ``headers`` and ``readiness`` as
    :class:`ServiceClient` takes them, ``policy`` as :class:`RunpodHandler` does (another
    protocol has no job policy: it must be None).

    Raises:
        ValueError: ``policy`` given for a protocol that is not ``runpod-handler``.
    """
    kw: dict[str, Any] = dict(timeout_s=timeout_s, project=project, server_header=server_header,
                              max_connections=max_connections, pacer=pacer, headers=headers, readiness=readiness)
    if service.protocol == "runpod-handler":
        return RunpodHandler(service, url, policy=policy, **kw)
    if policy is not None:
        raise ValueError(f"a {service.protocol} service has no job policy to send")
    return (OpenAIChat if service.protocol == "openai-chat" else HttpJson)(service, url, **kw)
