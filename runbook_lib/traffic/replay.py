"""The cutover's replay: open-loop traffic through a router, from its own process.

Phase 05 through a real router (:mod:`runbook_lib.phases.routed`) sends the workload's sample
inputs through the router the whole time the weights move. The sending runs in a child process
(``python -m runbook_lib.traffic.replay CONFIG EVENTS``), so nothing the phase does (judging a window,
reading the router, its kernel's own garbage collection) delays a request; it is phase 04's
generator: a Poisson schedule (:func:`runbook_lib.measure.timing.poisson_requests`) kept by
:func:`runbook_lib.measure.timing.dispatch`, each request sent at its intended time
(:func:`runbook_lib.measure.timing.send_at`) and never resent.

The child appends one JSON line per event to ``EVENTS``: ``{"e": "start", "t0": T}`` first (its
:func:`time.perf_counter` at the schedule's start: CLOCK_MONOTONIC on Linux, the same clock in
every process), then ``{"e": "sent", "request": i, "sent_s": s}`` as each request leaves and
``{"e": "done", ...row}`` when it ends, and ``{"e": "end"}`` once SIGTERM or SIGINT stopped it
and every request in flight has ended. :class:`Replay` is the parent's handle.

An endpoint (``kind: inference``) is sent ``POST /infer`` with ``{"input": ...}``. A service
(``kind: service``) is sent its own protocol's request by its own client
(:func:`runbook_lib.service.protocols.client_for`, told the router's :data:`SERVER_HEADER`), so
a routed request fails in the same named ways as in phase 04, and :func:`classify_answer`
sorts each named failure into lost or failed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, TypedDict

from runbook_lib.errors import ProviderError
from runbook_lib.measure.timing import Request, dispatch, poisson_requests, send_at
from runbook_lib.params import Service
from runbook_lib.service.protocols import client_for
from runbook_lib.traffic.router import SERVER_HEADER

REPLAY_MAX_IN_FLIGHT = 128
"""Requests the replay keeps in flight at most, as phase 04's open loop (each waits at most its timeout)."""
START_TIMEOUT_S = 60.0
"""How long the parent waits for the child to start its schedule (imports included)."""


class ReplayRow(TypedDict, total=False):
    """One replayed request: seconds since the replay started, who answered."""

    request: int
    input_index: int
    intended_s: float
    sent_s: float
    done_s: float
    total_s: float
    status: str
    server: str
    http_status: int | None
    output: Any
    error: str
    failure: str


def classify(status_code: int | None, server: str, body: dict[str, Any], error: str = "") -> dict[str, Any]:
    """How a replayed request ended: ``COMPLETED`` (HTTP 200 with an ``output`` from a named
    server), ``FAILED`` (a server answered, with an error), or ``LOST`` (no server answered: the
    connection was refused, reset or timed out, or the router answered on its own)."""
    if status_code is None:
        return {"status": "LOST", "server": "", "http_status": None, "output": None, "error": error,
                "failure": "TIMED_OUT" if "Timeout" in error.split(":")[0] else "CLIENT_ERROR"}
    out = {"server": server, "http_status": status_code, "output": body.get("output")}
    out["status"] = "COMPLETED" if status_code == 200 and body.get("output") is not None else \
        "FAILED" if server else "LOST"
    out["failure"] = "" if out["status"] == "COMPLETED" else "HTTP_STATUS" if status_code != 200 else "BAD_BODY"
    if not server:
        out["error"] = f"HTTP {status_code} from the router, no server named: {error[:120]}"
    return out


LOST_KINDS = ("STREAM_CUT", "TIMED_OUT", "CLIENT_ERROR")
"""A service's named failures that leave a request unanswered (:data:`runbook_lib.service.protocols.FAILURE_KINDS`):
a stream cut (by a weight change or a server that went away), no whole answer in time, or no
connection. Every other named failure is an answer, an error one."""


def classify_answer(answer: dict[str, Any]) -> dict[str, Any]:
    """How a replayed service request ended, from its client's answer
    (:meth:`runbook_lib.service.protocols.ServiceClient.runsync` behind a router, so it carries
    ``server``): ``COMPLETED`` (the protocol's whole answer from a named server), ``LOST`` (one of
    :data:`LOST_KINDS`, or nothing named a server: the router answered on its own) or ``FAILED``
    (a server answered with an error: an error object in a 200 body, an error status, a body that
    is not the protocol's). ``failure`` keeps the named kind, ``error`` the client's words."""
    server, status = str(answer.get("server") or ""), str(answer.get("status"))
    error = str(answer.get("error") or "")
    out: dict[str, Any] = {"server": server, "http_status": answer.get("http_status"), "output": answer.get("output"),
                           "failure": "" if status == "COMPLETED" else status, "error": error}
    if status == "COMPLETED" and server:
        out["status"] = "COMPLETED"
    elif status in LOST_KINDS or not server:
        out["status"] = "LOST"
        if not server and status not in LOST_KINDS:
            out["error"] = f"{status} from the router, no server named: {error[:160]}"
    else:
        out["status"] = "FAILED"
    if out["status"] != "COMPLETED":
        out["output"] = None
    return out


def _child(config_path: Path, events_path: Path) -> int:
    """The replay process: send until SIGTERM or SIGINT, writing events (module docstring)."""
    import httpx

    cfg = json.loads(config_path.read_text())
    stop, lock = threading.Event(), threading.Lock()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    picks = [(int(i), p) for i, p in cfg["picks"]]
    http = httpx.Client(base_url=cfg["url"], timeout=cfg["timeout_s"],
                        limits=httpx.Limits(max_connections=REPLAY_MAX_IN_FLIGHT,
                                            max_keepalive_connections=REPLAY_MAX_IN_FLIGHT))
    service = None
    if cfg.get("service") is not None:
        service = client_for(Service.model_validate(cfg["service"]), cfg["url"], timeout_s=cfg["timeout_s"],
                             server_header=SERVER_HEADER, max_connections=REPLAY_MAX_IN_FLIGHT)

    def send(payload: Any) -> dict[str, Any]:
        """One request, classified (:func:`classify_answer` or :func:`classify`)."""
        if service is not None:
            return classify_answer(service.runsync(payload))
        try:
            r = http.post(cfg["path"], json={"input": payload})
            is_json = r.headers.get("content-type", "").startswith("application/json")
            return classify(r.status_code, r.headers.get(SERVER_HEADER, ""), r.json() if is_json else {}, r.text)
        except (httpx.HTTPError, ValueError) as exc:
            return classify(None, "", {}, f"{type(exc).__name__}: {exc}")

    with open(events_path, "a", buffering=1) as events:
        def write(event: dict[str, Any]) -> None:
            with lock:
                events.write(json.dumps(event) + "\n")

        t0 = time.perf_counter()
        write({"e": "start", "t0": t0})

        def one(req: Request) -> None:
            sent = send_at(req.intended_s, t0)
            write({"e": "sent", "request": req.index, "sent_s": sent})
            ended = send(req.payload)
            done = time.perf_counter() - t0
            write({"e": "done", "request": req.index, "input_index": req.input_index, "intended_s": req.intended_s,
                   "sent_s": sent, "done_s": done, "total_s": done - req.intended_s, **ended})

        dispatch(poisson_requests(picks, cfg["rate_per_s"], cfg["seed"], min_gap_s=cfg.get("min_gap_s", 0.0)), one, t0=t0,
                 max_in_flight=REPLAY_MAX_IN_FLIGHT, stop=stop)
        http.close()
        if service is not None:
            service.close()
        write({"e": "end"})
    return 0


class Replay:
    """Traffic through the router from its own process (module docstring): open-loop Poisson
    arrivals at ``rate_per_s`` of ``picks`` (``(golden index, payload)``, cycled), each sent once
    as ``POST path`` with a ``timeout_s`` second limit, or, given ``service`` (a
    :class:`runbook_lib.params.Service` as ``model_dump(mode="json")`` gives it), as that
    service's protocol request with ``timeout_s`` as its deadline; ``min_gap_s``: no two arrivals
    closer than that (a live source's pacing, the whole schedule being able to reach it). Rows (:class:`ReplayRow`): ``request``,
    ``input_index``, ``intended_s``, ``sent_s`` and ``done_s`` (seconds since the schedule's
    start), ``total_s`` (from intended), ``status`` (:func:`classify`), ``server`` (who
    answered), ``output``, ``failure`` (the named kind of a request not completed: a service's
    :data:`runbook_lib.service.protocols.FAILURE_KINDS`, an endpoint's ``HTTP_STATUS``,
    ``BAD_BODY``, ``TIMED_OUT`` or ``CLIENT_ERROR``) and ``error``."""

    def __init__(self, url: str, picks: list[tuple[int, Any]], *, rate_per_s: float, timeout_s: float,
                 seed: int, path: str = "/infer", service: dict[str, Any] | None = None,
                 min_gap_s: float = 0.0) -> None:
        self.config = {"url": url, "picks": picks, "rate_per_s": rate_per_s, "timeout_s": timeout_s, "seed": seed,
                       "path": path, "service": service, "min_gap_s": min_gap_s}
        self.timeout_s = timeout_s
        self.rows: list[ReplayRow] = []
        self._sent: dict[int, float] = {}  # request -> sent_s, until it ends
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._offset = 0
        self._partial = b""
        self.t0 = 0.0

    def start(self) -> None:
        """Start the replay process and wait for its schedule to start.

        Raises:
            ProviderError: it did not start within :data:`START_TIMEOUT_S` (its output named).
            TypeError: an input is not JSON (the requests carry them as JSON).
        """
        config = json.dumps(self.config)  # the inputs go as JSON, as they are sent
        self._tmp = tempfile.TemporaryDirectory(prefix="runbook-replay-")
        tmp = Path(self._tmp.name)
        (tmp / "config.json").write_text(config)
        self.events = tmp / "events.jsonl"
        self.events.touch()
        try:
            with open(tmp / "replay.log", "wb") as log:
                self._proc = subprocess.Popen([sys.executable, "-m", "runbook_lib.traffic.replay", str(tmp / "config.json"),
                                               str(self.events)], stdout=log, stderr=subprocess.STDOUT,
                                              env=dict(os.environ))  # a copy: see workload/job.py's _child
        except OSError as exc:
            self._cleanup()
            raise ProviderError(f"the cutover's replay could not start ({sys.executable}: {exc})") from None
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.t0:
            self._poll()
            if self.t0:
                break
            if self._proc.poll() is not None or time.monotonic() > deadline:
                why = (tmp / "replay.log").read_text(errors="replace")[-500:]
                self._kill()
                self._cleanup()
                raise ProviderError(f"the cutover's replay did not start (exit {self._proc.returncode}): {why}")
            time.sleep(0.02)

    @property
    def pid(self) -> int | None:
        """The replay process's id (None before :meth:`start`)."""
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        """Whether the replay process is still running."""
        return self._proc is not None and self._proc.poll() is None

    def _poll(self) -> None:
        """Read the events appended since the last read (none once :meth:`stop` has read the last)."""
        if self._tmp is None:
            return
        with open(self.events, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()  # a line still being written
        for line in lines:
            ev = json.loads(line)
            kind = ev.pop("e")
            if kind == "start":
                self.t0 = float(ev["t0"])
            elif kind == "sent":
                self._sent[int(ev["request"])] = float(ev["sent_s"])
            elif kind == "done":
                self._sent.pop(int(ev["request"]), None)
                self.rows.append(ev)

    def now(self) -> float:
        """Seconds since the replay's schedule started (the same clock as its rows)."""
        return time.perf_counter() - self.t0

    def in_flight_before(self, t: float) -> int:
        """Requests sent before ``t`` (seconds since start) that have not ended yet."""
        self._poll()
        return sum(1 for sent in self._sent.values() if sent < t)

    def sent_between(self, start: float, end: float) -> list[ReplayRow]:
        """Rows of the requests sent in ``[start, end)`` (seconds since start) that have ended."""
        self._poll()
        return [r for r in self.rows if start <= r["sent_s"] < end]

    def stop(self) -> None:
        """Stop sending and wait for every request in flight to end (each within its timeout);
        a request the process could not finish (killed after that) is a ``LOST`` row."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=self.timeout_s + 10)
            except subprocess.TimeoutExpired:
                self._kill()
        self._poll()
        for i, sent in sorted(self._sent.items()):
            self.rows.append({"request": i, "sent_s": sent, "status": "LOST", "server": "", "http_status": None,
                              "output": None, "error": "the replay process ended before this request did",
                              "failure": "TIMED_OUT"})
        self._sent.clear()
        self._cleanup()

    def _cleanup(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


if __name__ == "__main__":
    sys.exit(_child(Path(sys.argv[1]), Path(sys.argv[2])))
