"""Clients of a service over its own protocol, with per-request metrics.

Each client answers :meth:`~ServiceClient.runsync` with a job-shaped answer (``status``,
``output``, ``execution_s``, ``metrics``), so phase 04's open-loop generator
(:func:`runbook_lib.measure.run_open_loop`) and phase 05's slices send service requests exactly
as they send endpoint jobs; and :meth:`~ServiceClient.health` in the shape the endpoints report
(``workers``, ``jobs``), from what the client itself sees.

Metric definitions are vLLM ``bench serve``'s (its ``vllm.benchmarks.serve`` module; summarised in
docs/reference/gates.md 3.6): TTFT is the time from sending the request to the first streamed
chunk with content; ITL the gaps between successive content chunks; TPOT per request
``(E2E - TTFT) / (output tokens - 1)``; E2E latency from send to the last byte. Output tokens are
the server's ``usage.completion_tokens`` when it reports usage, else the content chunks counted.
One difference, by design: the latency the gates judge (``total_s`` in phase 04's samples) runs
from the request's *intended* arrival, not from its send (the MLPerf definition,
docs/reference/gates.md 3.5), so a load generator that falls behind cannot hide a queue.
"""

from __future__ import annotations

import json
import math
import threading
import time
from typing import Any

import httpx

from runbook_lib.errors import ProviderError
from runbook_lib.params import Service

PROTOCOL_PATHS = {"openai-chat": "/v1/chat/completions", "runpod-handler": "/runsync"}
"""The path each protocol calls (``http-json``: its declared ``request.path``)."""

STREAM_CUT = "STREAM_CUT"
"""Status of a streamed answer that ended before its last chunk (no ``finish_reason`` and no
``[DONE]``): a failed request, never a short success."""


class ProtocolMismatch(ProviderError):
    """The service answers 404 on the protocol's path: it speaks another protocol."""


class ServiceClient:
    """What every protocol's client shares: an HTTP client on ``url``, the request counter
    :meth:`health` reports, and the readiness probe.

    Args:
        service: ``workload.service`` of params.
        url: the service's base URL (``http://host:port``).
        timeout_s: per request, seconds (connect, read and write each).
    """

    protocol = ""

    def __init__(self, service: Service, url: str, *, timeout_s: float = 60.0) -> None:
        self.service = service
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, timeout=timeout_s)
        self._lock = threading.Lock()
        self.in_flight = 0

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def path(self) -> str:
        return PROTOCOL_PATHS.get(self.protocol, self.service.request.path)

    def health(self) -> dict[str, Any]:
        """The readiness check's answer in an endpoint's health shape: one worker, ``idle`` when
        ``GET readiness.path`` answers the declared status, else ``unhealthy``; jobs in progress
        are the requests this client has in flight (a service has no queue the runbook can see).

        Raises:
            ProviderError: the service cannot be reached (connection refused, timed out).
        """
        r = self.service.readiness
        try:
            got = self.http.get(r.path)
        except httpx.HTTPError as exc:
            raise ProviderError(f"service at {self.url} cannot be reached for GET {r.path}: {exc}") from exc
        ok = got.status_code == r.status
        return {"status": got.status_code, "body": got.text[:200],
                "workers": {"idle": 1 if ok else 0, "running": 0, "unhealthy": 0 if ok else 1},
                "jobs": {"inQueue": 0, "inProgress": self.in_flight}}

    def runsync(self, payload: Any) -> dict[str, Any]:
        """Send one request and wait for its whole answer; never retried (a request that reached
        the service is not resent). Returns ``status`` (``COMPLETED``, ``FAILED`` with
        ``http_status``, :data:`STREAM_CUT`, or ``CLIENT_ERROR`` when it could not be sent),
        ``output`` (None unless completed), ``execution_s`` (send to last byte, seconds) and
        ``metrics`` (the protocol's per-request figures, seconds and counts)."""
        with self._lock:
            self.in_flight += 1
        t0 = time.perf_counter()
        try:
            out = self._call(payload, t0)
        except httpx.HTTPError as exc:
            out = {"status": "CLIENT_ERROR", "output": None, "error": f"{type(exc).__name__}: {exc}"}
        finally:
            with self._lock:
                self.in_flight -= 1
        out.setdefault("execution_s", time.perf_counter() - t0)
        out.setdefault("metrics", {})
        return out

    def _call(self, payload: Any, t0: float) -> dict[str, Any]:
        raise NotImplementedError

    def _failed(self, resp: httpx.Response) -> dict[str, Any]:
        body = resp.text[:300]
        return {"status": "FAILED", "output": None, "http_status": resp.status_code,
                "error": f"HTTP {resp.status_code} on {self.path}: {body}"}

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


class OpenAIChat(ServiceClient):
    """``openai-chat``: ``POST /v1/chat/completions`` at temperature 0 with the declared seed and
    ``max_tokens``, streamed (server-sent events) when ``service.stream``.

    ``output`` is ``{"text", "chunks", "finish_reason"}``: the answer's text, its content
    chunks as streamed (one per decoding step the server flushed; a byte-level token that ends
    mid-character arrives merged with the next), and why it stopped. ``metrics``: ``ttft_s``,
    ``tpot_s``, ``itl_s`` (list of gaps), ``output_tokens`` (NaN where not measurable: a
    non-streamed answer has no TTFT or ITL)."""

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

    def _call(self, payload: Any, t0: float) -> dict[str, Any]:
        if not self.service.stream:
            resp = self.http.post(self.path, json=self.body(payload))
            done = time.perf_counter()
            if resp.status_code != 200:
                return self._failed(resp)
            data = resp.json()
            choice = (data.get("choices") or [{}])[0]
            text = (choice.get("message") or {}).get("content") or ""
            tokens = (data.get("usage") or {}).get("completion_tokens")
            return {"status": "COMPLETED", "execution_s": done - t0,
                    "output": {"text": text, "chunks": [text], "finish_reason": choice.get("finish_reason")},
                    "metrics": {"ttft_s": math.nan, "tpot_s": math.nan, "itl_s": [],
                                "output_tokens": float(tokens) if tokens is not None else math.nan}}
        chunks: list[str] = []
        stamps: list[float] = []
        finish, usage_tokens, done_marker = None, None, False
        with self.http.stream("POST", self.path, json=self.body(payload)) as resp:
            if resp.status_code != 200:
                resp.read()
                return self._failed(resp)
            try:
                for line in resp.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done_marker = True
                        break
                    event = json.loads(data)
                    usage = event.get("usage") or {}
                    if usage.get("completion_tokens") is not None:
                        usage_tokens = int(usage["completion_tokens"])
                    for choice in event.get("choices") or []:
                        content = (choice.get("delta") or {}).get("content")
                        if content:
                            stamps.append(time.perf_counter())
                            chunks.append(content)
                        finish = choice.get("finish_reason") or finish
            except (httpx.HTTPError, json.JSONDecodeError) as exc:
                return {"status": STREAM_CUT, "output": None,
                        "error": f"stream from {self.path} broke after {len(chunks)} chunks: {exc}"}
        end = time.perf_counter()
        if finish is None and not done_marker:
            return {"status": STREAM_CUT, "output": None,
                    "error": f"stream from {self.path} ended after {len(chunks)} chunks with no finish_reason and no "
                             "[DONE]: the answer is incomplete"}
        tokens = usage_tokens if usage_tokens is not None else len(chunks)
        ttft = stamps[0] - t0 if stamps else math.nan
        e2e = end - t0
        return {"status": "COMPLETED", "execution_s": e2e,
                "output": {"text": "".join(chunks), "chunks": chunks, "finish_reason": finish},
                "metrics": {"ttft_s": ttft, "tpot_s": (e2e - ttft) / (tokens - 1) if tokens > 1 and stamps else math.nan,
                            "itl_s": [b - a for a, b in zip(stamps, stamps[1:], strict=False)], "output_tokens": float(tokens)}}


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


class HttpJson(ServiceClient):
    """``http-json``: ``request.method request.path`` with the body template filled from the
    sample input; ``output`` is the JSON answer. ``metrics`` is empty (no tokens)."""

    protocol = "http-json"

    def _call(self, payload: Any, t0: float) -> dict[str, Any]:
        req = self.service.request
        kw: dict[str, Any] = {} if req.method == "GET" else {"json": fill(req.body, payload)}
        resp = self.http.request(req.method, self.path, **kw)
        if resp.status_code >= 300:
            return self._failed(resp)
        try:
            return {"status": "COMPLETED", "output": resp.json()}
        except json.JSONDecodeError:
            return {"status": "FAILED", "output": None, "http_status": resp.status_code,
                    "error": f"answer from {self.path} is not JSON: {resp.text[:200]!r}"}


class RunpodHandler(ServiceClient):
    """``runpod-handler``: a Runpod Serverless worker as the official ``runpod`` SDK runs it, over
    its job API: ``POST /runsync`` with ``{"input": <sample>}``; a job still ``IN_QUEUE`` or
    ``IN_PROGRESS`` when ``/runsync`` returns is polled at ``/status/{id}`` until it ends (never
    submitted again). ``output`` is the job's output; queue and execution seconds come from the
    job's own ``delayTime`` and ``executionTime`` (milliseconds, docs/reference/providers.md 2.4)
    where the API reports them (Runpod's does; the SDK's local ``--rp_serve_api`` does not: NaN).
    A job ``FAILED``, ``CANCELLED`` or ``TIMED_OUT`` is a failed request with the job's error."""

    protocol = "runpod-handler"
    POLL_S = 0.05

    def _call(self, payload: Any, t0: float) -> dict[str, Any]:
        resp = self.http.post("/runsync", json={"input": payload})
        if resp.status_code >= 300:
            return self._failed(resp)
        job = resp.json()
        while job.get("status") in ("IN_QUEUE", "IN_PROGRESS") and job.get("id"):
            time.sleep(self.POLL_S)
            st = self.http.get(f"/status/{job['id']}")
            if st.status_code == 405:  # the SDK's local API answers status to POST only
                st = self.http.post(f"/status/{job['id']}")
            if st.status_code >= 300:
                return self._failed(st)
            job = st.json()
        timing = {k: float(job[src]) / 1000.0 for k, src in (("queue_s", "delayTime"), ("execution_s", "executionTime"))
                  if job.get(src) is not None}
        if job.get("status") != "COMPLETED":
            return {"status": str(job.get("status") or "FAILED"), "output": None, **timing,
                    "error": f"job {job.get('id')}: {str(job.get('error'))[:300]}"}
        return {"status": "COMPLETED", "output": job.get("output"), "job_id": job.get("id"),
                "queue_s": timing.get("queue_s", math.nan), "execution_s": timing.get("execution_s", time.perf_counter() - t0)}


def client_for(service: Service, url: str, *, timeout_s: float = 60.0) -> ServiceClient:
    """The client of ``service.protocol`` on ``url``."""
    cls: type[ServiceClient] = {"openai-chat": OpenAIChat, "runpod-handler": RunpodHandler}.get(service.protocol,
                                                                                                HttpJson)
    return cls(service, url, timeout_s=timeout_s)
