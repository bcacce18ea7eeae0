"""Request and job timing: open-loop load against a queue endpoint, saturation throughput, and the
raw samples every summary is computed from.

Latency is counted from each request's *intended* arrival time (MLPerf LoadGen; a client that
falls behind its schedule therefore shows up as latency, never hidden). Per request we keep the
queue, init (waiting on a cold worker) and execution components the endpoint reports. Raw
samples are kept in seconds in CSV files next to the executed notebooks.
"""

from __future__ import annotations

import gc
import json
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypedDict, TypeVar, Union

import numpy as np

from runbook_lib._http import Backoff
from runbook_lib.errors import ProviderError, ProviderTimeout, StorageError
from runbook_lib.service.protocols import ServiceClient

SAMPLE_COLUMNS = ("side", "round", "request", "intended_s", "sent_s", "done_s", "total_s", "queue_s",
                  "init_s", "execution_s", "status", "batch_size", "input_index")
"""Columns of a latency sample table; ``*_s`` in seconds relative to the round start, or
durations in seconds (``total_s``, ``queue_s``, ``init_s``, ``execution_s``)."""

POLL_START_S = 0.5
POLL_MAX_S = 5.0
"""Status polls of a job the endpoint has not finished start 0.5 s apart and double up to 5 s.
Runpod limits ``/status`` to 2000 requests per 10 s per endpoint (docs/reference/providers.md,
Runpod job API, rate limits): at most two polls a second per job keeps the 64 jobs a saturation
burst holds in flight (:func:`run_saturation`) at 128 a second. ``/runsync`` answers a finished job
itself (within 90 s), so latency samples do not depend on this cadence."""
READ_RETRIES = 5
"""A read (``status``, ``health``) answered 429, or whose connection failed, is sent again up to
this many times, after ``Retry-After`` when the answer gives one (else the poll cadence). Reads
change nothing, so they are the only requests retried blindly; a submission never is."""
READ_BACKOFF = Backoff(READ_RETRIES, POLL_START_S, 2.0, POLL_MAX_S * 12)
""":data:`READ_RETRIES` on the poll cadence (0.5 s doubling), at most 60 s per wait."""
INIT_PARTS = ("process_start_s", "imports_s", "device_init_s", "weight_load_s")
"""A worker's initialisation, split (seconds): interpreter start and this module's imports,
the workload's library imports (:meth:`runbook_lib.workload.AcceptanceWorkload.preload`), device initialisation (CUDA
context and a synchronised first allocation; 0 on CPU) and the weight load. ``init_s`` is their sum."""
DISPATCH_LEAD_S = 0.002  # a request is handed to its worker this early; the worker sleeps to its time
SPIN_S = 0.0002  # ...and spins only the last 0.2 ms (short enough not to starve other threads)


JobAnswer = dict[str, Any]
"""A job's answer as the endpoint's API returns it: Runpod's ``/runsync`` and ``/status/{id}``
body (``id``, ``status``, ``output``, ``delayTime``, ``executionTime``, ...; docs.runpod.io
serverless endpoints "Operations"), or a load-balancing worker's answer in the same shape."""


class JobClocks(TypedDict, total=False):
    """:class:`JobClient`'s clocks, seconds (its arguments of the same names)."""

    execution_timeout_s: float
    ttl_s: float
    client_timeout_s: float


def job_clocks(m: Any) -> JobClocks:
    """A queue endpoint's job client clocks from ``measure`` (:class:`runbook_lib.params.Measure`):
    the TTL sent with each job when params set one, and the client timeout."""
    out: JobClocks = {"client_timeout_s": float(m.client_timeout_s)}
    if m.job_ttl_s is not None:
        out["ttl_s"] = float(m.job_ttl_s)
    return out



class JobClient:
    """Client of a queue endpoint's job API (``/run``, ``/runsync``, ``/status/{id}``,
    ``/cancel/{id}``, ``/health``), as Runpod Serverless defines it
    (https://docs.runpod.io/serverless/endpoints/operations).

    Three clocks bound a job: the endpoint's execution timeout (the handler runs too long:
    ``TIMED_OUT``) and its TTL (the job lives too long, run or not: ``/status`` answers 404,
    reported ``EXPIRED``), both sent with every job as Runpod's execution ``policy`` when given;
    and the client timeout (:meth:`wait`): the caller gives up, cancels the job and keeps its id
    (``CLIENT_TIMEOUT``), so no job is silently lost.

    Args:
        url: endpoint base URL.
        http: an ``httpx.Client`` (injected; tests pass one with a mock transport).
        timeout_s: one HTTP request's timeout, seconds (above ``/runsync``'s 90 s wait).
        execution_timeout_s: each job's ``policy.executionTimeout``, seconds; None: the endpoint's.
        ttl_s: each job's ``policy.ttl``, seconds; None: the endpoint's (Runpod: 24 h).
        client_timeout_s: :meth:`runsync`'s default client timeout, seconds; None: wait for ever.
        sleep, clock: injected in tests.
    """

    def __init__(self, url: str, *, http: Any = None, timeout_s: float = 120.0,
                 execution_timeout_s: float | None = None, ttl_s: float | None = None,
                 client_timeout_s: float | None = None,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
        import httpx

        self._http = http or httpx.Client(base_url=url, timeout=timeout_s,
                                          limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))
        self.policy = {k: int(round(v * 1000)) for k, v in (("executionTimeout", execution_timeout_s),
                                                            ("ttl", ttl_s)) if v is not None}
        self.client_timeout_s = client_timeout_s
        self._sleep, self._clock = sleep, clock

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> JobClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _json(self, method: str, path: str, *, read: bool = False, **kw: Any) -> dict[str, Any]:
        import httpx

        retries = READ_BACKOFF.retries if read else 0
        for attempt in range(retries + 1):
            last = attempt == retries
            try:
                r = self._http.request(method, path, **kw)
            except httpx.HTTPError as exc:
                if last:
                    raise ProviderError(f"{method} {path} failed: {type(exc).__name__}: {exc}") from exc
                self._sleep(READ_BACKOFF.wait_s(attempt))
                continue
            if r.status_code == 429 and not last:
                self._sleep(READ_BACKOFF.wait_s(attempt, r.headers))
                continue
            break
        if r.status_code == 404 and path.startswith("/status/"):
            return {"id": path.rsplit("/", 1)[-1], "status": "EXPIRED",
                    "error": "job not found: its TTL expired or it never existed"}
        if r.status_code >= 400:
            what = "rate limited (a machinery failure: the endpoint refused the request unprocessed)" \
                if r.status_code == 429 else f"HTTP {r.status_code}"
            raise ProviderError(f"{method} {path} answered {what}: {r.text[:200]}")
        return dict(r.json())

    def _submit(self, path: str, payload: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"input": payload}
        if self.policy:
            body["policy"] = dict(self.policy)
        return self._json("POST", path, json=body)

    def run(self, payload: Any) -> dict[str, Any]:
        """Submit a job; returns ``{"id", "status": "IN_QUEUE"}``.

        Raises:
            ProviderError: the submission failed or was refused (429); it is not retried.
        """
        return self._submit("/run", payload)

    def runsync(self, payload: Any, *, client_timeout_s: float | None = None) -> JobAnswer:
        """Submit and wait for a terminal state (the endpoint answers a finished job within 90 s;
        one still queued or running is then polled, :meth:`wait`, until ``client_timeout_s``
        from submission; default: the client's).

        Raises:
            ProviderError: the submission failed or was refused (429); it is not retried.
        """
        limit = self.client_timeout_s if client_timeout_s is None else client_timeout_s
        t0 = self._clock()
        job = self._submit("/runsync", payload)
        return self.wait(job, client_timeout_s=None if limit is None else limit - (self._clock() - t0))

    def wait(self, job: dict[str, Any], *, client_timeout_s: float | None = None) -> dict[str, Any]:
        """Poll ``job`` (a record with its ``id``) at :data:`POLL_START_S` doubling to
        :data:`POLL_MAX_S` until it is terminal. After ``client_timeout_s`` seconds the client
        gives up: it cancels the job and returns its record with ``status`` ``CLIENT_TIMEOUT``
        (or the terminal state it reached meanwhile, collected), ``cancelled`` and the id kept. The
        last wait is cut to the deadline and the job polled once more there: the client never gives
        up before ``client_timeout_s`` has passed, and its error says how long it waited.
        """
        start = self._clock()
        deadline = None if client_timeout_s is None else start + client_timeout_s
        interval = POLL_START_S
        while job.get("status") in ("IN_QUEUE", "IN_PROGRESS"):
            now = self._clock()
            if deadline is not None and now >= deadline:
                try:
                    after = self.cancel(job["id"])
                except ProviderError:  # the endpoint no longer knows it: read what it says
                    after = self.status(job["id"])
                if after.get("status") not in ("CANCELLED", "IN_QUEUE", "IN_PROGRESS"):
                    return after  # it finished before the cancel: collected, not lost
                return {**job, "status": "CLIENT_TIMEOUT", "cancelled": after.get("status") == "CANCELLED",
                        "error": f"the client gave up after {now - start:.1f} s (client timeout {client_timeout_s:g} s); "
                                 f"job {job['id']} was "
                                 f"{'cancelled' if after.get('status') == 'CANCELLED' else 'left ' + str(after.get('status'))}"}
            # the last wait is cut to the deadline, so the job gets its whole client timeout
            self._sleep(interval if deadline is None else min(interval, deadline - now))
            interval = min(POLL_MAX_S, interval * 2)
            job = self.status(job["id"])
        return job

    def status(self, job_id: str) -> dict[str, Any]:
        """Job record; ``status`` is ``EXPIRED`` when the endpoint no longer knows the id (TTL).
        A 429 or a failed connection is retried (:data:`READ_RETRIES`)."""
        return self._json("GET", f"/status/{job_id}", read=True)

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a queued or running job; returns ``{"id", "status": "CANCELLED"}``."""
        return self._json("POST", f"/cancel/{job_id}")

    def retry(self, job_id: str) -> dict[str, Any]:
        """Requeue a FAILED or TIMED_OUT job under the same id (Runpod ``/retry``, within result
        retention); returns ``{"id", "status": "IN_QUEUE"}``."""
        return self._json("POST", f"/retry/{job_id}")

    def purge_queue(self) -> dict[str, Any]:
        """Drop every queued job (in-progress jobs keep running); returns ``{"removed": n, ...}``."""
        return self._json("POST", "/purge-queue")

    def health(self) -> dict[str, Any]:
        """Job counts and worker states; a 429 or a failed connection is retried (:data:`READ_RETRIES`)."""
        return self._json("GET", "/health", read=True)

    def wait_ready(self, *, timeout_s: float, clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
        """Wait until at least one worker is idle or running.

        Raises:
            ProviderTimeout: no worker became ready in ``timeout_s`` seconds (the message gives
                the worker states, so "still initializing" is not mistaken for "no capacity").
        """
        deadline = clock() + timeout_s
        while True:
            h = self.health()
            if h["workers"]["idle"] + h["workers"]["running"] > 0:
                return h
            if clock() > deadline:
                raise ProviderTimeout(f"no endpoint worker ready after {timeout_s} s; workers: {h['workers']}")
            sleep(0.05)


class WorkerClient:
    """Client of a ``load_balancing`` endpoint: one worker's own HTTP server, reached straight,
    with no queue in front of it (docs.runpod.io/serverless/load-balancing/overview: "no queuing
    mechanism for request backlog"; no automatic retries either: the caller owns both).

    The worker contract (:mod:`runbook_lib.providers.local.endpoint` ``direct``):

    * ``GET /ping``: 200 ``{"status": "healthy"}`` (the health check of
      docs.runpod.io/serverless/load-balancing/build-a-worker); the worker binds its port only
      once the model is loaded, so there is no "loading" answer.
    * ``POST /infer`` ``{"input": x}``: 200 ``{"output", "queue_s", "execution_s",
      "batch_size"}`` (seconds spent waiting for the model inside the worker, and running it).
    * ``GET /health``: the queue endpoint's shape (``workers``, ``cold_starts``), for one worker.

    :meth:`runsync` answers like :meth:`JobClient.runsync` (``status`` ``COMPLETED`` or
    ``FAILED``), so one measurement serves both modes.

    Args:
        url: the worker's base URL (a Vast.ai instance's ``http://ip:mapped_port``).
        http: an ``httpx.Client`` (injected in tests).
        timeout_s: per request, seconds.
    """

    def __init__(self, url: str, *, http: Any = None, timeout_s: float = 120.0) -> None:
        import httpx

        self._http = http or httpx.Client(base_url=url, timeout=timeout_s,
                                          limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))

    def close(self) -> None:
        self._http.close()

    def runsync(self, payload: Any) -> JobAnswer:
        """One request, straight to the worker; a refusal is this request's ``FAILED`` (never retried).

        Raises:
            ProviderError: the worker could not be reached (refused, reset or timed out).
        """
        import httpx

        try:
            r = self._http.post("/infer", json={"input": payload})
        except httpx.HTTPError as exc:
            raise ProviderError(f"POST /infer failed: {type(exc).__name__}: {exc}") from exc
        if r.status_code != 200:
            return {"status": "FAILED", "error": f"HTTP {r.status_code}: {r.text[:200]}"}
        return {"status": "COMPLETED", "init_s": 0.0, **r.json()}

    def health(self) -> dict[str, Any]:
        """The worker's report in the queue endpoint's shape (``workers``, ``cold_starts``).

        Raises:
            ProviderError: the worker could not be reached or answered an error.
        """
        import httpx

        try:
            r = self._http.get("/health")
        except httpx.HTTPError as exc:
            raise ProviderError(f"GET /health failed: {type(exc).__name__}: {exc}") from exc
        if r.status_code != 200:
            raise ProviderError(f"GET /health answered HTTP {r.status_code}: {r.text[:200]}")
        return dict(r.json())


ServingClient = Union[JobClient, WorkerClient, "ServiceClient"]
"""What a measurement sends requests through: a ``queue`` endpoint's job API, a
``load_balancing`` worker, or a team's service over its protocol
(:class:`runbook_lib.service.protocols.ServiceClient`); each answers :meth:`JobClient.runsync`
and ``health``."""


@dataclass(frozen=True)
class Request:
    """One request of a schedule: ``intended_s`` after the round start, with its payload."""

    index: int
    intended_s: float
    payload: Any
    input_index: int


def served_status(job: dict[str, Any]) -> str:
    """A job's status as the measurement counts it: its own, except that a ``COMPLETED`` job
    that returned no output is ``NO_OUTPUT``, a failure (a handler that returned nothing, or an
    output the provider dropped, served the caller nothing)."""
    status = str(job.get("status"))
    return "NO_OUTPUT" if status == "COMPLETED" and job.get("output") is None else status


def job_timings(job: dict[str, Any]) -> dict[str, float]:
    """Queue, init and execution seconds of a finished job record. The local endpoint reports
    ``queue_s``/``init_s``/``execution_s``; Runpod reports ``delayTime`` (queued until a worker
    took the job) and ``executionTime``, in milliseconds (docs/reference/providers.md 2.4, job
    API): those become ``queue_s`` and ``execution_s``, and ``init_s`` is unknown (NaN)."""
    def seconds(local: str, runpod_ms: str) -> float:
        if job.get(local) is not None:
            return float(job[local])
        return float(job[runpod_ms]) / 1000.0 if job.get(runpod_ms) is not None else float("nan")

    return {"queue_s": seconds("queue_s", "delayTime"), "init_s": seconds("init_s", ""),
            "execution_s": seconds("execution_s", "executionTime")}


def poisson_schedule(n: int, rate_per_s: float, seed: int) -> np.ndarray:
    """Intended arrival offsets (seconds, shape ``(n,)``, float64) of a Poisson process.

    Inter-arrival gaps are exponential with mean ``1 / rate_per_s``, drawn with
    ``numpy.random.default_rng(seed)`` so both sides see the same schedule.
    """
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.exponential(1.0 / rate_per_s, size=n))


TOKEN_METRICS = ("ttft_s", "tpot_s", "output_tokens")
"""Per-request figures a token-streaming service reports (:class:`runbook_lib.service.protocols.OpenAIChat`):
time to first token and time per output token (seconds), output tokens (count); NaN for other
answers. Inter-token gaps travel beside them as ``itl_s`` (a list per request)."""


def token_metrics(job: dict[str, Any]) -> dict[str, Any]:
    """The :data:`TOKEN_METRICS` of an answer (NaN where it has none) and its ``itl_s`` gaps
    (seconds; empty when it has none)."""
    m = job.get("metrics") or {}
    return {**{k: float(m.get(k, np.nan)) for k in TOKEN_METRICS}, "itl_s": list(m.get("itl_s") or [])}


def failure_of(job: dict[str, Any]) -> dict[str, str | None]:
    """A failed answer's ``stage`` (where it failed, :data:`runbook_lib.service.protocols.STAGES`)
    and ``error`` (the server's own words, at most 200 characters, scrubbed by the client); both
    None for a completed one. The samples keep them, so every gate that counts a failure can say
    what it was."""
    if served_status(job) == "COMPLETED":
        return {"stage": None, "error": None}
    err = job.get("error")
    return {"stage": str(job["stage"]) if job.get("stage") else None,
            "error": str(err)[:200] if err is not None else None}


def send_at(intended_s: float, t0: float) -> float:
    """Wait until ``intended_s`` seconds after ``t0`` (:func:`time.perf_counter`): sleep, then spin
    the last :data:`SPIN_S` (``sleep`` overshoots by about 0.1 ms). Returns when it was, seconds
    after ``t0`` (later than intended when the caller was handed the request late)."""
    wait = intended_s - (time.perf_counter() - t0)
    if wait > SPIN_S:
        time.sleep(wait - SPIN_S)
    while time.perf_counter() - t0 < intended_s:
        pass
    return time.perf_counter() - t0


def dispatch(requests: Iterable[Request], one: Callable[[Request], None], *, t0: float, max_in_flight: int,
             stop: threading.Event | None = None) -> None:
    """Phase 04's open-loop schedule keeper, also the cutover's replay (:mod:`runbook_lib.traffic.replay`):
    hand each of ``requests`` (in ``intended_s`` order, possibly endless) to a pool of
    ``max_in_flight`` threads :data:`DISPATCH_LEAD_S` before its intended time, whatever earlier
    ones are doing; ``one(request)`` sends it (at its time: :func:`send_at`). Returns when
    ``requests`` ends or ``stop`` is set, once every request handed over has ended."""
    with ThreadPoolExecutor(max_workers=max_in_flight) as pool:
        for req in requests:
            delay = req.intended_s - DISPATCH_LEAD_S - (time.perf_counter() - t0)
            if stop is not None:
                if stop.wait(max(delay, 0.0)):  # True once set, at once when it already was
                    break
            elif delay > 0:
                time.sleep(delay)
            pool.submit(one, req)


def run_open_loop(client: ServingClient, requests: list[Request], *, side: str, round_id: int,
                  max_in_flight: int = 128) -> list[dict[str, Any]]:
    """Send ``requests`` at their intended times regardless of completions (open loop,
    :func:`dispatch`).

    Returns:
        One sample dict per request with :data:`SAMPLE_COLUMNS` plus ``output`` (the response).
    """
    results: list[dict[str, Any]] = [{} for _ in requests]
    t0 = time.perf_counter()
    lock = threading.Lock()

    def one(req: Request) -> None:
        sent = send_at(req.intended_s, t0)  # handed over DISPATCH_LEAD_S early: the pool's pick-up is not latency
        try:
            job = client.runsync(req.payload)
        except ProviderError as exc:
            job = {"status": "CLIENT_ERROR", "error": str(exc)}
        done = time.perf_counter() - t0
        row = {"side": side, "round": round_id, "request": req.index, "intended_s": req.intended_s,
               "sent_s": sent, "done_s": done, "total_s": done - req.intended_s, **job_timings(job),
               "status": served_status(job),
               "batch_size": job.get("batch_size", np.nan), "input_index": req.input_index,
               "output": job.get("output"), **token_metrics(job), **failure_of(job)}
        with lock:
            results[req.index] = row

    dispatch(requests, one, t0=t0, max_in_flight=max_in_flight)
    return results


def poisson_requests(picks: list[tuple[int, Any]], rate_per_s: float, seed: int, *,
                     chunk: int = 1000, min_gap_s: float = 0.0) -> Iterator[Request]:
    """An endless open-loop schedule of ``picks`` (``(input index, payload)``, cycled): Poisson
    arrivals at ``rate_per_s``, :func:`poisson_schedule` chunk by chunk (seeds ``seed``,
    ``seed + 1``, ...), each chunk after the last; with ``min_gap_s`` each arrival is moved later,
    when needed, to come at least that long after the one before (a paced live source's schedule,
    as :func:`runbook_lib.service.pacing.spaced` does)."""
    offset, i, k = 0.0, 0, 0
    while True:
        for t in poisson_schedule(chunk, rate_per_s, seed + k) + offset:
            at = max(float(t), offset + min_gap_s) if min_gap_s > 0 and i else float(t)
            idx, payload = picks[i % len(picks)]
            yield Request(i, at, payload, idx)
            i += 1
            offset = at
        k += 1


def run_saturation(client: ServingClient, payloads: list[Any], *, max_in_flight: int = 64) -> dict[str, Any]:
    """Submit all ``payloads`` at once and time until the last completes.

    Returns:
        ``{"requests", "completed", "failed", "elapsed_s", "throughput_units_per_s",
        "failed_by_status"}``; throughput counts only COMPLETED requests, per second of wall
        time; ``failed_by_status`` is a JSON object, served status -> count of the failures.
    """
    def one(payload: Any) -> dict[str, Any]:
        try:
            return client.runsync(payload)
        except ProviderError as exc:  # a refused or reset connection is a failed request, not a crash
            return {"status": "CLIENT_ERROR", "error": str(exc)}

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max_in_flight) as pool:
        jobs = list(pool.map(one, payloads))
    elapsed = time.perf_counter() - t0
    statuses = [served_status(j) for j in jobs]
    ok = statuses.count("COMPLETED")
    failed = {s: statuses.count(s) for s in sorted(set(statuses)) if s != "COMPLETED"}
    return {"requests": float(len(payloads)), "completed": float(ok), "failed": float(len(payloads) - ok),
            "elapsed_s": elapsed, "throughput_units_per_s": ok / elapsed if elapsed > 0 else 0.0,
            "failed_by_status": json.dumps(failed)}


T = TypeVar("T")

MACHINERY_ERRORS: tuple[type[BaseException], ...] = (ProviderError, StorageError, OSError)
"""Exceptions that mean the measuring broke (a provider call, a connection, the store), not that
the target failed a request: a failed request is a sample (``FAILED``, ``CLIENT_ERROR``) and is
evidence; these are retried and never judged (docs/reference/gates.md section 5.1, ERROR)."""


@dataclass
class CollectorPauses:
    """What CPython's cyclic garbage collector did in the measuring process while
    :func:`frozen_heap` held it: ``frozen_objects`` moved out of its reach at entry, then
    ``collections`` (``full_collections`` of them generation 2), the longest and the summed pause,
    seconds. Phase 04 keeps it in its record as ``load_generator_gc``."""

    frozen_objects: int = 0
    collections: int = 0
    full_collections: int = 0
    longest_pause_s: float = 0.0
    total_pause_s: float = 0.0


@contextmanager
def frozen_heap() -> Iterator[CollectorPauses]:
    """Keep the load generator's own garbage collection out of the latency it measures.

    A collection stops every thread of the process, and a full one (generation 2) walks every
    tracked object: in a kernel that has imported torch, pandas and transformers that is about
    0.1 to 0.2 s (0.18 s measured in phase 04 on the 2-core test machine). Inside a round it
    delays the completion time of every request in flight and, on a host with few cores, takes a
    core from the workers being measured, so it lands in one round and not another and shows up
    as an A/A difference. On entry this collects once and then freezes every surviving object
    (``gc.freeze``: "move them to a permanent generation and ignore them in all the future
    collections", https://docs.python.org/3/library/gc.html#gc.freeze), so later collections walk
    only the objects the measurement itself creates. On exit the heap is unfrozen, unless it was
    already frozen on entry. The collections that still happen are counted, not prevented.

    Yields:
        :class:`CollectorPauses`, filled in while the block runs.
    """
    frozen_before = gc.get_freeze_count()
    gc.collect()
    gc.freeze()
    pauses = CollectorPauses(frozen_objects=gc.get_freeze_count())
    started: list[float] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter()]
            return
        if not started:
            return
        took = time.perf_counter() - started[0]
        pauses.collections += 1
        pauses.full_collections += int(info.get("generation") == 2)
        pauses.longest_pause_s = max(pauses.longest_pause_s, took)
        pauses.total_pause_s += took

    gc.callbacks.append(count)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(count)
        if frozen_before == 0:
            gc.unfreeze()


@dataclass(frozen=True)
class Attempted(Generic[T]):
    """One measurement taken with retries: its value (None when every attempt failed) and every
    attempt, in order.

    Attributes:
        what: which measurement (``"round 3 target open-loop"``).
        kind: the measurement kind, which says which gates it feeds (``cold_start``, ``open_loop``,
            ``saturation``, ``health``, ``training_round``).
        side: ``source`` or ``target``.
        value: what the measurement returned, or None.
        attempts: ``{"attempt", "ok", "seconds", "error"}`` per attempt; ``seconds`` is the
            attempt's wall time, ``error`` is ``"<ExceptionClass>: <message>"`` or None.
        waited_s: seconds slept between attempts (excluded from timings built on this value).
    """

    what: str
    kind: str
    side: str
    value: T | None
    attempts: tuple[dict[str, Any], ...]
    waited_s: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.attempts) and bool(self.attempts[-1]["ok"])

    @property
    def error(self) -> str | None:
        """The last attempt's error, or None when the measurement succeeded."""
        return None if self.ok or not self.attempts else self.attempts[-1]["error"]

    def to_rows(self) -> list[dict[str, Any]]:
        """One evidence row per attempt."""
        return [{"what": self.what, "kind": self.kind, "side": self.side, **a} for a in self.attempts]


def with_retries(fn: Callable[[int], T], *, what: str, kind: str, side: str, retries: int, interval_s: float,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.perf_counter,
                 retry_on: tuple[type[BaseException], ...] = MACHINERY_ERRORS) -> Attempted[T]:
    """Take a measurement, retrying it when the measuring machinery fails.

    ``fn(attempt)`` (attempt 0, 1, ...) is called until it returns; an exception in ``retry_on``
    is recorded and retried after ``interval_s`` seconds, up to ``retries`` times after the first
    attempt (Argo Rollouts' defaults are 4 consecutive errors tolerated, 10 s apart:
    ``DefaultConsecutiveErrorLimit``, ``DefaultErrorRetryInterval``; docs/reference/gates.md 5.1).
    Any other exception propagates at once: it is not a machinery failure.

    Args:
        fn: the measurement; receives the 0-based attempt number.
        retries: retries after the first attempt (so at most ``retries + 1`` attempts).
        interval_s: seconds slept between attempts.
        sleep, clock: injected so tests need not wait.

    Returns:
        The :class:`Attempted` record; ``value`` is None when every attempt failed (the gates fed
        by it are then INCONCLUSIVE, never FAIL or PASS).
    """
    attempts: list[dict[str, Any]] = []
    waited = 0.0
    for k in range(retries + 1):
        if k:
            sleep(interval_s)
            waited += interval_s
        t0 = clock()
        try:
            value = fn(k)
        except retry_on as exc:
            attempts.append({"attempt": k + 1, "ok": False, "seconds": clock() - t0,
                             "error": f"{type(exc).__name__}: {exc}"[:500]})
            continue
        attempts.append({"attempt": k + 1, "ok": True, "seconds": clock() - t0, "error": None})
        return Attempted(what, kind, side, value, tuple(attempts), waited)
    return Attempted(what, kind, side, None, tuple(attempts), waited)

