"""A local queue-based endpoint: a front door that holds the job queue and worker processes that
load the model once and pull jobs in batches.

The client-facing API follows Runpod Serverless' queue endpoints
(https://docs.runpod.io/serverless/endpoints/operations): ``POST /run``, ``POST /runsync``,
``GET /status/{id}``, ``POST /cancel/{id}``, ``POST /retry/{id}``, ``POST /purge-queue``,
``GET /health``; job states IN_QUEUE,
IN_PROGRESS, COMPLETED, FAILED, CANCELLED, TIMED_OUT. A job IN_PROGRESS longer than the
execution timeout is TIMED_OUT and its worker is replaced; a job older than its TTL is
forgotten (status answers 404). A job whose worker died holding it is delivered again, under
its own id, up to :data:`MAX_DELIVERIES` times in all (queue endpoints retry automatically,
docs.runpod.io/serverless/endpoints/overview); the handler's idempotency record
(:mod:`runbook_lib.workload.records`) makes a second delivery of a finished job return the
recorded result instead of running it again. Request bodies above the declared limits
(:data:`PAYLOAD_LIMITS`) are refused with 413; a result above the response limit, or an empty
one, makes the job FAILED, never COMPLETED. Workers talk to the front door over ``/worker/*``.

A ``load_balancing`` endpoint is one ``direct`` worker instead: its own HTTP server, with no
front door (the contract is :class:`runbook_lib.measure.timing.WorkerClient`'s). It loads the model
before it binds its port, so a reachable port means a ready worker; concurrent requests are
batched up to the profile's ``batch_size`` inside the worker, and nothing is queued or retried
for the caller.

Usage: ``python -m runbook_lib.providers.local.endpoint serve|work|direct ...`` (started by
:class:`runbook_lib.providers.local.LocalProvider`, or as a remote worker's command with
``--params env:RUNBOOK_PARAMS_YAML``).
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from runbook_lib.errors import WorkloadError
from runbook_lib.layout import CRASH_EVERY, POD_FAULT_ENV
from runbook_lib.measure.timing import INIT_PARTS
from runbook_lib.params import pod_params
from runbook_lib.providers.base import PAYLOAD_LIMITS
from runbook_lib.storage import pod_store
from runbook_lib.workload import make_workload
from runbook_lib.workload.job import params_file
from runbook_lib.workload.records import DRILLS_ENV, RECORDS_ENV, STORE_ENV, JobRecords, job_key, unwrap

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT")
RUNSYNC_WAIT_S = 90.0  # /runsync answers with the current status after this, seconds (as Runpod)
TAKE_WAIT_S = 1.0  # a worker's long poll for jobs, seconds
REAPER_INTERVAL_S = 0.05
LISTEN_BACKLOG = 512  # http.server's default of 5 resets connections under a burst of clients
BIND_ENV = "RUNBOOK_SIM_BIND_{port}"
"""Set by a provider simulator (no container engine, so no network namespace and no NAT): the
``host:port`` that stands for container port ``{port}``; a ``direct`` worker binds there
instead of ``0.0.0.0:{port}``. Real providers never set it."""
# ``slow_worker`` drill: seconds added to every batch. The demo source's total p95 is about
# 0.27 s, so a target p95 of several times that stays beyond a 2.0 margin even when one of two
# source rounds is twice as slow on a busy host.
SLOW_S = 0.5
SPAWNED_AT_ENV = "RUNBOOK_SPAWNED_AT"  # epoch seconds at which the front door started a worker
MAX_DELIVERIES = 3
"""A job is handed to a worker at most this many times when its workers keep dying; then FAILED."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG


class WorkerPool:
    """The worker processes of one queue endpoint, each ``initializing``, ``idle`` or ``running``,
    scaled as Runpod's endpoint settings say (docs.runpod.io/serverless/endpoints, "Endpoint
    settings"): ``active`` workers are kept running; up to ``maximum`` are started while jobs wait
    with no idle or starting worker to take them; a worker beyond ``active`` that has been idle
    ``idle_timeout_s`` seconds is stopped. ``active=0`` scales to zero, so the next job pays a cold
    start (its ``init_s``). Holds no lock: the front door calls it holding its own.

    Args:
        argv: a worker's command (``--worker-id`` is added).
        maximum: most workers at once. active: workers kept running (at most ``maximum``).
        idle_timeout_s: seconds an idle worker beyond the active ones keeps running.
    """

    def __init__(self, argv: list[str], *, maximum: int, active: int, idle_timeout_s: float) -> None:
        self.argv = argv
        self.maximum = maximum
        self.active = min(active, maximum)
        self.idle_timeout_s = idle_timeout_s
        self.workers: dict[str, dict[str, Any]] = {}
        """Worker id -> ``proc`` (its Popen), ``state``, ``spawned_at``, ``ready_at``,
        ``idle_since`` (epoch seconds) and ``jobs`` (the ids it holds)."""
        self.cold_starts: list[dict[str, Any]] = []
        for _ in range(self.active):
            self.spawn()

    def spawn(self) -> None:
        """Start one worker process (``initializing`` until it reports ready)."""
        wid = f"w-{secrets.token_hex(3)}"
        proc = subprocess.Popen([*self.argv, "--worker-id", wid], stdin=subprocess.DEVNULL,
                                env={**os.environ, SPAWNED_AT_ENV: repr(time.time())})
        self.workers[wid] = {"proc": proc, "state": "initializing", "spawned_at": time.time(), "jobs": set()}

    def ready(self, wid: str, init: dict[str, float]) -> bool:
        """Worker ``wid`` has loaded its model: it is idle, and ``init`` (its initialisation split)
        is kept as a cold start with the seconds from spawn to ready. False for a worker no longer
        on the books."""
        w = self.workers.get(wid)
        if w is None:
            return False
        now = time.time()
        w.update(state="idle", ready_at=now, idle_since=now)
        self.cold_starts.append({"worker": wid, **init, "ready_after_spawn_s": now - w["spawned_at"]})
        return True

    def scale_up(self, queued: int) -> None:
        """Start workers (up to the maximum) for the ``queued`` jobs that no idle or starting
        worker will take."""
        ready = sum(1 for w in self.workers.values() if w["state"] in ("idle", "initializing"))
        for _ in range(min(queued - ready, self.maximum - len(self.workers))):
            self.spawn()

    def busy(self, wid: str, jids: set[str]) -> None:
        """Worker ``wid`` now runs jobs ``jids``."""
        w = self.workers.get(wid)
        if w is not None:
            w.update(state="running", jobs=jids)

    def idle(self, wid: str, now: float) -> None:
        """Worker ``wid`` finished its jobs at epoch second ``now``."""
        w = self.workers.get(wid)
        if w is not None:
            w.update(state="idle", jobs=set(), idle_since=now)

    def replace(self, wid: str) -> set[str] | None:
        """Take worker ``wid`` off the books (killed if it still runs) and keep ``active`` workers
        running; returns the job ids it held, or None when it was not on the books."""
        w = self.workers.pop(wid, None)
        if w is None:
            return None
        if w["proc"].poll() is None:
            w["proc"].kill()
        if len(self.workers) < self.active:
            self.spawn()
        return set(w["jobs"])

    def exited(self) -> list[tuple[str, int]]:
        """``(worker id, exit code)`` of every worker whose process has exited."""
        return [(wid, code) for wid, w in list(self.workers.items()) if (code := w["proc"].poll()) is not None]

    def scale_down(self, now: float) -> None:
        """Stop the workers beyond ``active`` idle longer than ``idle_timeout_s`` at epoch second
        ``now`` (the longest idle first)."""
        idle = sorted((w["idle_since"], wid) for wid, w in self.workers.items() if w["state"] == "idle")
        for since, wid in idle[:max(0, len(self.workers) - self.active)]:
            if now - since > self.idle_timeout_s:
                w = self.workers.pop(wid)
                w["proc"].kill()
                w["proc"].wait()

    def states(self) -> dict[str, int]:
        """How many workers are ``idle``, ``running`` and ``initializing``."""
        counts = collections.Counter(w["state"] for w in self.workers.values())
        return {k: counts[k] for k in ("idle", "running", "initializing")}


class FrontDoor:
    """Job queue and job table of one endpoint, served over its workers (:attr:`pool`, a
    :class:`WorkerPool`, scaled as Runpod's endpoint settings say). One lock (:attr:`cond`)
    guards both."""

    def __init__(self, *, worker_argv: list[str], workers: int, execution_timeout_s: float, ttl_s: float,
                 limits: dict[str, int] | None = None, active: int | None = None,
                 idle_timeout_s: float = 5.0) -> None:
        self.limits = dict(limits or PAYLOAD_LIMITS["queue"])
        self.jobs: dict[str, dict[str, Any]] = {}
        self.queue: collections.deque[str] = collections.deque()
        self.cond = threading.Condition()
        self.execution_timeout_s = execution_timeout_s
        self.ttl_s = ttl_s
        self.started_at = time.time()
        self.pool = WorkerPool(worker_argv, maximum=workers, active=workers if active is None else active,
                               idle_timeout_s=idle_timeout_s)

    # -- workers -----------------------------------------------------------------------------

    def worker_ready(self, wid: str, init: dict[str, float]) -> None:
        """Worker ``wid`` has loaded its model: ``init`` is its initialisation split
        (:data:`INIT_PARTS` and ``init_s``, seconds) and ``gc_frozen_objects`` (the objects its
        load left, frozen out of later collections), kept as a cold start."""
        with self.cond:
            if self.pool.ready(wid, init):
                self.cond.notify_all()

    def _replace_worker(self, wid: str, reason: str) -> None:
        """Replace worker ``wid`` (:meth:`WorkerPool.replace`); each job it held IN_PROGRESS is
        delivered again, first in the queue, or FAILED after :data:`MAX_DELIVERIES`."""
        held = self.pool.replace(wid)
        if held is None:
            return
        for jid in held:
            job = self.jobs.get(jid)
            if not job or job["status"] != "IN_PROGRESS":
                continue
            if job["deliveries"] >= MAX_DELIVERIES:
                job.update(status="FAILED", completed_at=time.time(),
                           error=f"{reason}; delivered {job['deliveries']} times (the limit), not again")
            else:  # redelivered first, under its own id: the handler's record makes this safe
                for k in ("started_at", "worker"):
                    job.pop(k, None)
                job.update(status="IN_QUEUE", last_error=reason)
                self.queue.appendleft(jid)
        self.pool.scale_up(len(self.queue))

    # -- jobs --------------------------------------------------------------------------------

    def submit(self, payload: Any, policy: dict[str, Any] | None = None) -> dict[str, Any]:
        """Queue a job. ``policy`` is Runpod's per-job execution policy: ``executionTimeout`` and
        ``ttl`` in milliseconds override the endpoint's execution timeout and TTL for this job
        (docs/reference/providers.md, Runpod job API, Timeouts/TTL)."""
        jid = f"job-{secrets.token_hex(8)}"
        policy = policy or {}
        with self.cond:
            self.jobs[jid] = {"id": jid, "status": "IN_QUEUE", "input": payload, "submitted_at": time.time(),
                              "deliveries": 0,
                              "execution_timeout_s": float(policy.get("executionTimeout") or
                                                           self.execution_timeout_s * 1000) / 1000,
                              "ttl_s": float(policy.get("ttl") or self.ttl_s * 1000) / 1000}
            self.queue.append(jid)
            self.pool.scale_up(len(self.queue))
            self.cond.notify_all()
            return self.public(jid)

    def public(self, jid: str) -> dict[str, Any]:
        job = self.jobs[jid]
        out = {k: v for k, v in job.items() if k not in ("input", "execution_timeout_s", "ttl_s")}
        if "started_at" in job:
            # The part of the wait spent on the worker that took the job becoming ready (a cold
            # start the job waited through) is init; the rest is queue.
            wait = job["started_at"] - job["submitted_at"]
            ready = job.get("worker_ready_at")
            init = max(0.0, min(job["started_at"], ready) - job["submitted_at"]) if ready is not None else 0.0
            out["init_s"] = init
            out["queue_s"] = max(0.0, wait - init)
        out.pop("worker_ready_at", None)
        return out

    def wait_terminal(self, jid: str, timeout_s: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while jid in self.jobs and self.jobs[jid]["status"] not in TERMINAL:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            return self.public(jid) if jid in self.jobs else None

    def cancel(self, jid: str) -> dict[str, Any] | None:
        with self.cond:
            job = self.jobs.get(jid)
            if job is None:
                return None
            if job["status"] in ("IN_QUEUE", "IN_PROGRESS"):
                job.update(status="CANCELLED", completed_at=time.time())
                if jid in self.queue:
                    self.queue.remove(jid)
                self.cond.notify_all()
            return self.public(jid)

    def retry(self, jid: str) -> dict[str, Any] | None:
        """Requeue a FAILED or TIMED_OUT job under its own id (Runpod's ``/retry``); a job in any
        other state is answered as it is. None when the endpoint no longer knows it (TTL)."""
        with self.cond:
            job = self.jobs.get(jid)
            if job is None:
                return None
            if job["status"] in ("FAILED", "TIMED_OUT"):
                for k in ("started_at", "completed_at", "worker", "error", "output", "execution_s", "batch_size",
                          "replayed", "last_error"):
                    job.pop(k, None)
                job.update(status="IN_QUEUE", retries=job.get("retries", 0) + 1, deliveries=0)
                self.queue.append(jid)
                self.pool.scale_up(len(self.queue))
                self.cond.notify_all()
            return self.public(jid)

    def purge(self) -> dict[str, Any]:
        """Drop every queued job (Runpod's ``/purge-queue``: in-progress jobs keep running); the
        purged jobs are CANCELLED, so a caller polling one learns it will not run."""
        with self.cond:
            removed = list(self.queue)
            self.queue.clear()
            now = time.time()
            for jid in removed:
                self.jobs[jid].update(status="CANCELLED", completed_at=now, error="purged from the queue")
            self.cond.notify_all()
            return {"removed": len(removed), "status": "completed"}

    def take(self, wid: str, max_jobs: int) -> list[dict[str, Any]]:
        """Up to ``max_jobs`` queued jobs for worker ``wid``, waiting up to :data:`TAKE_WAIT_S`
        for one. A worker no longer on the books (stopped, replaced) takes nothing: its long poll
        may outlive it, and a job handed to it would never be answered."""
        deadline = time.monotonic() + TAKE_WAIT_S
        with self.cond:
            while not self.queue or wid not in self.pool.workers:
                left = deadline - time.monotonic()
                if left <= 0 or wid not in self.pool.workers:
                    return []
                self.cond.wait(left)
            taken: list[dict[str, Any]] = []
            now = time.time()
            w = self.pool.workers.get(wid)
            while self.queue and len(taken) < max_jobs:
                jid = self.queue.popleft()
                job = self.jobs[jid]
                job.update(status="IN_PROGRESS", started_at=now, worker=wid, deliveries=job["deliveries"] + 1,
                           worker_ready_at=(w or {}).get("ready_at"))
                taken.append({"id": jid, "input": job["input"]})
            self.pool.busy(wid, {t["id"] for t in taken})
            return taken

    def done(self, wid: str, results: list[dict[str, Any]]) -> None:
        with self.cond:
            now = time.time()
            for r in results:
                job = self.jobs.get(r["id"])
                if job is None or job["status"] != "IN_PROGRESS" or job.get("worker") != wid:
                    continue  # cancelled, timed out or expired meanwhile: the late result is dropped
                size = len(json.dumps(r.get("output")).encode()) if "error" not in r else 0
                if "error" in r:
                    job.update(status="FAILED", error=r["error"])
                elif r.get("output") is None:
                    job.update(status="FAILED", error="the handler returned no output (an empty result is a failure)")
                elif size > self.limits["response_bytes"]:
                    job.update(status="FAILED", error=f"result of {size} bytes exceeds the endpoint's response limit of "
                                                      f"{self.limits['response_bytes']} bytes; return a store URL instead")
                else:
                    job.update(status="COMPLETED", output=r["output"])
                job.update(completed_at=now, execution_s=r.get("execution_s"), batch_size=r.get("batch_size"),
                           replayed=bool(r.get("replayed")))
            self.pool.idle(wid, now)
            self.cond.notify_all()

    def health(self) -> dict[str, Any]:
        with self.cond:
            counts = collections.Counter(j["status"] for j in self.jobs.values())
            return {
                "jobs": {"inQueue": counts["IN_QUEUE"], "inProgress": counts["IN_PROGRESS"],
                         "completed": counts["COMPLETED"], "failed": counts["FAILED"],
                         "cancelled": counts["CANCELLED"], "timedOut": counts["TIMED_OUT"]},
                "workers": self.pool.states(),
                "cold_starts": list(self.pool.cold_starts),
            }

    def sweep(self) -> None:
        """One pass of the reaper: replace workers that died (redelivering what they held), stop
        workers idle past the idle timeout beyond the active ones, time out jobs past their
        execution timeout (replacing their worker) and forget jobs past their TTL."""
        with self.cond:
            now = time.time()
            for wid, code in self.pool.exited():
                self._replace_worker(wid, f"worker {wid} exited with code {code}")
            self.pool.scale_down(now)
            for jid, job in list(self.jobs.items()):
                if job["status"] == "IN_PROGRESS" and now - job["started_at"] > job["execution_timeout_s"]:
                    job.update(status="TIMED_OUT", completed_at=now,
                               error=f"execution timeout {job['execution_timeout_s']} s exceeded")
                    self._replace_worker(job["worker"], "execution timeout")
                if now - job["submitted_at"] > job["ttl_s"]:
                    if jid in self.queue:
                        self.queue.remove(jid)
                    del self.jobs[jid]
            self.cond.notify_all()

    def reap(self) -> None:
        """:meth:`sweep` every :data:`REAPER_INTERVAL_S` seconds, for ever (a daemon thread)."""
        while True:
            time.sleep(REAPER_INTERVAL_S)
            self.sweep()


class _JsonHandler(BaseHTTPRequestHandler):
    """JSON in, JSON out, over HTTP/1.1 keep-alive; quiet (the pod log is evidence, not a trace)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n) or b"{}")


def _handler(door: FrontDoor) -> type[BaseHTTPRequestHandler]:
    class Handler(_JsonHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server naming
            parts = self.path.strip("/").split("/")
            if parts == ["health"]:
                return self._send(200, door.health())
            if len(parts) == 2 and parts[0] == "status":
                with door.cond:
                    found = parts[1] in door.jobs
                    body = door.public(parts[1]) if found else {"error": f"job {parts[1]} not found (expired TTL or unknown)"}
                return self._send(200 if found else 404, body)
            return self._send(404, {"error": f"no route GET {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            parts = self.path.strip("/").split("/")
            limit = door.limits.get(f"{parts[0]}_request_bytes") if parts in (["run"], ["runsync"]) else None
            size = int(self.headers.get("Content-Length") or 0)
            if limit is not None and size > limit:
                self.rfile.read(size)  # read, so the connection stays usable for the next request
                return self._send(413, {"error": f"request body of {size} bytes exceeds /{parts[0]}'s limit of {limit} "
                                                  f"bytes; put large inputs in the store and send their URL"})
            body = self._body()
            if parts == ["run"]:
                return self._send(200, door.submit(body.get("input"), body.get("policy")))
            if parts == ["runsync"]:
                job = door.submit(body.get("input"), body.get("policy"))
                return self._send(200, door.wait_terminal(job["id"], RUNSYNC_WAIT_S) or job)
            if len(parts) == 2 and parts[0] in ("cancel", "retry"):
                res = door.cancel(parts[1]) if parts[0] == "cancel" else door.retry(parts[1])
                return self._send(200 if res else 404, res or {"error": f"job {parts[1]} not found"})
            if parts == ["purge-queue"]:
                return self._send(200, door.purge())
            if parts == ["worker", "ready"]:
                door.worker_ready(body["worker"], {k: float(body[k]) for k in ("init_s", *INIT_PARTS, "gc_frozen_objects")
                                                   if k in body})
                return self._send(200, {})
            if parts == ["worker", "take"]:
                return self._send(200, {"jobs": door.take(body["worker"], int(body["max"]))})
            if parts == ["worker", "done"]:
                door.done(body["worker"], body["results"])
                return self._send(200, {})
            return self._send(404, {"error": f"no route POST {self.path}"})

    return Handler


def serve(args: argparse.Namespace) -> int:
    args.params = params_file(args.params)  # the workers read the same file
    server = _Server(("127.0.0.1", 0), None)  # type: ignore[arg-type]
    url = f"http://127.0.0.1:{server.server_address[1]}"
    worker_argv = [sys.executable, "-m", "runbook_lib.providers.local.endpoint", "work", "--params", args.params,
                   "--side", args.side, "--url", url]
    return run_front_door(server, worker_argv, args)


def run_front_door(server: ThreadingHTTPServer, worker_argv: list[str], args: argparse.Namespace) -> int:
    """Serve a :class:`FrontDoor` over workers started as ``worker_argv`` on ``server`` (bound,
    not yet serving) until killed; its port is written to ``args.port_file`` (atomically) once it
    listens. ``args`` carries ``workers``, ``active_workers``, ``idle_timeout_s``,
    ``execution_timeout_s`` and ``ttl_s`` as ``serve`` parses them."""
    door = FrontDoor(worker_argv=worker_argv, workers=args.workers,
                     execution_timeout_s=args.execution_timeout_s, ttl_s=args.ttl_s,
                     active=args.active_workers, idle_timeout_s=args.idle_timeout_s)
    server.RequestHandlerClass = _handler(door)
    threading.Thread(target=door.reap, daemon=True).start()
    tmp = Path(args.port_file).with_suffix(".tmp")
    tmp.write_text(str(server.server_address[1]))
    tmp.replace(args.port_file)
    server.serve_forever()
    return 0


@dataclass
class Drill:
    """A worker's drill settings: die after ``crash_every`` requests (0: never), add ``slow_s``
    seconds to every batch; ``served`` counts requests so far. ``duplicate_side_effects`` is the
    broken handler (the ``duplicate_side_effects`` fault): it never looks up its idempotency
    record, so a redelivered job runs again. ``drills_enabled``: drill envelopes are obeyed
    (:data:`DRILLS_ENV`)."""

    crash_every: int = 0
    slow_s: float = 0.0
    served: int = 0
    duplicate_side_effects: bool = False
    drills_enabled: bool = False


def run_batch(wl: Any, inputs: list[Any], drill: Drill) -> list[dict[str, Any]]:
    """One batch through the workload, drills first: per input ``{"output", "execution_s",
    "batch_size"}`` (seconds for the whole batch), or ``{"error"}`` for every input when it raises."""
    if not inputs:
        return []
    drill.served += len(inputs)
    if drill.crash_every and drill.served >= drill.crash_every:
        os._exit(3)  # drill: the worker dies holding its batch
    t0 = time.perf_counter()
    if drill.slow_s:
        time.sleep(drill.slow_s)  # drill: a slower worker
    try:
        outputs = wl.infer(inputs)
    except Exception as exc:  # noqa: BLE001 - reported as each request's failure
        return [{"error": f"{type(exc).__name__}: {exc}"} for _ in inputs]
    dt = time.perf_counter() - t0
    return [{"output": o, "execution_s": dt, "batch_size": len(inputs)} for o in outputs]


@dataclass
class Handled:
    """A batch's answers (``results``: one ``{"id", ...}`` per job, in order) and what the drill
    envelopes asked to happen after the answers are recorded (``after``: ``crash_after_record``,
    ``wipe_disk``)."""

    results: list[dict[str, Any]]
    after: set[str]


def handle_jobs(wl: Any, jobs: list[dict[str, Any]], drill: Drill, records: JobRecords | None,
                scratch: Path) -> Handled:
    """The handler: for each job ``{"id", "input"}``, return the recorded result when its
    idempotency record exists (``replayed``), else run it (in one batch with the others), count
    the execution, write the result to the worker's disk (``scratch``) and then to the record in
    the store, marker last. A ``hang`` drill never returns; ``crash_after_record`` applies only to
    the delivery that wrote the record."""
    answers: dict[str, dict[str, Any]] = {}
    todo: list[tuple[str, Any, str, str]] = []
    after: set[str] = set()
    for j in jobs:
        try:
            payload, name, rid = unwrap(j["input"])
            key = job_key(j["id"], rid)
        except WorkloadError as exc:
            answers[j["id"]] = {"error": str(exc)}
            continue
        if name and not drill.drills_enabled:
            answers[j["id"]] = {"error": f"drill {name!r} refused: this endpoint was not created for drills "
                                         f"({DRILLS_ENV} is not 1)"}
            continue
        if name == "hang":
            threading.Event().wait()  # drill: the handler never answers; the execution timeout must fire
        rec = records.recorded(key) if records is not None and not drill.duplicate_side_effects else None
        if rec is not None:
            answers[j["id"]] = {**{k: rec[k] for k in ("output", "execution_s", "batch_size") if k in rec},
                                "replayed": True}
        else:
            todo.append((j["id"], payload, key, name))
    for (jid, _, key, name), r in zip(todo, run_batch(wl, [t[1] for t in todo], drill), strict=True):
        answers[jid] = r
        if "error" in r or records is None:
            continue
        fresh = name != "crash_after_record" or records.recorded(key) is None
        records.executed(key)
        scratch.mkdir(parents=True, exist_ok=True)
        (scratch / f"{key}.json").write_text(json.dumps(r))
        records.record(key, r)
        if name and fresh:
            after.add(name)
    return Handled([{"id": j["id"], **answers[j["id"]]} for j in jobs], after)




@dataclass
class WorkerSetup:
    """A worker's side profile, loaded workload, initialisation split (:data:`INIT_PARTS` plus
    ``init_s``, seconds, and ``gc_frozen_objects``, a count), drill settings and the migration params."""

    profile: Any
    wl: Any
    init: dict[str, float]
    drill: Drill
    mig: Any


def _device_init(device: str) -> None:
    """Create the CUDA context and synchronise a first allocation on ``device`` (nothing on CPU)."""
    if not device.startswith("cuda"):
        return
    import torch

    dev = torch.device(device)
    torch.zeros(1, device=dev)
    torch.cuda.synchronize(dev)


def _loaded(args: argparse.Namespace) -> WorkerSetup:
    """Load the side's workload, timing each part of the initialisation. The drill is a local
    profile's ``fault`` or, when it sets none (as a remote profile does), ``RUNBOOK_FAULT`` in the
    environment (set only by a provider simulator's scripted fault)."""
    import psutil

    # psutil's create time counts from the boot time, which Linux gives in whole seconds: the
    # front door's own clock at spawn is exact, so it is used when the door started this worker.
    spawned = float(os.environ.get(SPAWNED_AT_ENV) or psutil.Process().create_time())
    t_main = time.time()
    # Importing torch and transformers and loading a model creates hundreds of thousands of
    # long-lived objects and few cycles: with the collector on, each full collection re-walks
    # all of them (six pauses growing to 0.3 s, about 1 s of a 7 s start measured on the 2-core
    # test machine). It stays off until the load is done and what it left is frozen.
    gc.disable()
    mig = pod_params(params_file(args.params))
    profile = getattr(mig, args.side)
    wl = make_workload(mig.workload, profile)
    wl.preload()
    t_imports = time.time()
    _device_init(profile.device)
    t_device = time.time()
    wl.load()
    t_loaded = time.time()
    # A serving process keeps its model for life: freezing what the load left (gc.freeze, in
    # microseconds) spares every later full collection a walk over the framework's objects, a
    # pause of 0.1 to 0.3 s measured here that would otherwise land on whichever batch runs then.
    # Source: https://docs.python.org/3/library/gc.html#gc.freeze
    gc.freeze()
    gc.enable()
    fault = getattr(profile, "fault", "none")
    if fault == "none":
        fault = os.environ.get(POD_FAULT_ENV, "none")
    drill = Drill(CRASH_EVERY if fault == "worker_crash" else 0, SLOW_S if fault == "slow_worker" else 0.0,
                  duplicate_side_effects=fault == "duplicate_side_effects",
                  drills_enabled=os.environ.get(DRILLS_ENV) == "1")
    init = dict(zip(INIT_PARTS, (t_main - spawned, t_imports - t_main, t_device - t_imports, t_loaded - t_device),
                    strict=True))
    return WorkerSetup(profile, wl, {**init, "init_s": t_loaded - spawned, "gc_frozen_objects": float(gc.get_freeze_count())},
                  drill, mig)


def job_records(mig: Any, worker: str) -> JobRecords | None:
    """The handler's idempotency records (:data:`RECORDS_ENV` under :data:`STORE_ENV`, the
    params' store when unset), or None when the endpoint was created without them. An S3 store is
    opened through the endpoint's store grant (:func:`runbook_lib.storage.pod_store`), never
    with the run's keys."""
    prefix = os.environ.get(RECORDS_ENV, "")
    if not prefix:
        return None
    url = os.environ.get(STORE_ENV) or mig.storage.url
    return JobRecords(pod_store(mig.storage, url), prefix, worker=worker)


def work(args: argparse.Namespace) -> int:
    """Worker: load the workload once, then pull up to ``batch_size`` jobs at a time through
    :func:`handle_jobs`; its scratch disk is ``./worker-<id>``."""
    import shutil

    import httpx

    ld = _loaded(args)
    profile, wl, drill = ld.profile, ld.wl, ld.drill
    records = job_records(ld.mig, args.worker_id)
    scratch = Path.cwd() / f"worker-{args.worker_id}"
    with httpx.Client(base_url=args.url, timeout=30.0) as http:
        http.post("/worker/ready", json={"worker": args.worker_id, **ld.init})
        while True:
            jobs = http.post("/worker/take", json={"worker": args.worker_id, "max": profile.batch_size}).json()["jobs"]
            if not jobs:
                continue
            handled = handle_jobs(wl, jobs, drill, records, scratch)
            if "crash_after_record" in handled.after:
                os._exit(3)  # drill: the result is durable, the worker dies before reporting it
            http.post("/worker/done", json={"worker": args.worker_id, "results": handled.results})
            if "wipe_disk" in handled.after:
                shutil.rmtree(scratch, ignore_errors=True)  # drill: the worker's disk is gone


class DirectWorker:
    """A ``load_balancing`` worker's state: requests waiting inside the worker, batched up to
    ``batch_size`` by one inference thread (the app owns its backlog; nothing is retried)."""

    def __init__(self, wl: Any, *, batch_size: int, init: dict[str, float], drill: Drill) -> None:
        self.wl, self.batch_size, self.init, self.drill = wl, batch_size, init, drill
        self.cond = threading.Condition()
        self.pending: collections.deque[dict[str, Any]] = collections.deque()
        self.busy = False
        self.counts = collections.Counter[str]()

    def infer(self, payload: Any, timeout_s: float) -> dict[str, Any]:
        """Run one request in the next batch; its answer, or ``{"error"}`` after ``timeout_s``."""
        slot: dict[str, Any] = {"input": payload, "at": time.perf_counter(), "done": threading.Event()}
        with self.cond:
            self.pending.append(slot)
            self.cond.notify_all()
        if not slot["done"].wait(timeout_s):
            return {"error": f"no answer within {timeout_s} s"}
        return dict(slot["result"])

    def loop(self) -> None:
        while True:
            with self.cond:
                while not self.pending:
                    self.cond.wait()
                batch = [self.pending.popleft() for _ in range(min(self.batch_size, len(self.pending)))]
                self.busy = True
            t0 = time.perf_counter()
            results = run_batch(self.wl, [b["input"] for b in batch], self.drill)
            with self.cond:
                self.busy = False
                for b, r in zip(batch, results, strict=True):
                    self.counts["failed" if "error" in r else "completed"] += 1
                    b["result"] = r if "error" in r else {**r, "queue_s": t0 - b["at"]}
                    b["done"].set()

    def health(self) -> dict[str, Any]:
        with self.cond:
            return {"jobs": {"inQueue": len(self.pending), "inProgress": int(self.busy),
                             "completed": self.counts["completed"], "failed": self.counts["failed"]},
                    "workers": {"idle": int(not self.busy), "running": int(self.busy), "initializing": 0},
                    "cold_starts": [{"worker": "direct", **self.init, "ready_after_spawn_s": self.init["init_s"]}]}


def _direct_handler(worker: DirectWorker, timeout_s: float) -> type[BaseHTTPRequestHandler]:
    class Handler(_JsonHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server naming
            if self.path == "/ping":
                return self._send(200, {"status": "healthy"})
            if self.path == "/health":
                return self._send(200, worker.health())
            return self._send(404, {"error": f"no route GET {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            limits = PAYLOAD_LIMITS["load_balancing"]
            size = int(self.headers.get("Content-Length") or 0)
            if size > limits["request_bytes"]:
                self.rfile.read(size)
                return self._send(413, {"error": f"request body of {size} bytes exceeds the worker's limit of "
                                                  f"{limits['request_bytes']} bytes"})
            body = self._body()
            if self.path != "/infer":
                return self._send(404, {"error": f"no route POST {self.path}"})
            out = worker.infer(body.get("input"), timeout_s)
            if "error" not in out and len(json.dumps(out.get("output")).encode()) > limits["response_bytes"]:
                out = {"error": f"result exceeds the worker's response limit of {limits['response_bytes']} bytes"}
            return self._send(500 if "error" in out else 200, out)

    return Handler


def direct(args: argparse.Namespace) -> int:
    """``load_balancing`` worker: load the model, then bind and serve :class:`DirectWorker`."""
    ld = _loaded(args)
    worker = DirectWorker(ld.wl, batch_size=ld.profile.batch_size, init=ld.init, drill=ld.drill)
    bind = os.environ.get(BIND_ENV.format(port=args.port), "")
    host, port = (bind.rsplit(":", 1)[0], int(bind.rsplit(":", 1)[1])) if bind else (args.host, args.port)
    server = _Server((host, port), _direct_handler(worker, args.execution_timeout_s))
    threading.Thread(target=worker.loop, daemon=True).start()
    if args.port_file:
        tmp = Path(args.port_file).with_suffix(".tmp")
        tmp.write_text(str(server.server_address[1]))
        tmp.replace(args.port_file)
    server.serve_forever()
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="_local_endpoint")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--params", required=True)
    s.add_argument("--side", required=True)
    s.add_argument("--workers", type=int, default=1)
    s.add_argument("--port-file", required=True)
    s.add_argument("--execution-timeout-s", type=float, default=600.0)
    s.add_argument("--ttl-s", type=float, default=86_400.0)
    s.add_argument("--active-workers", type=int, default=None, help="workers kept running (default: --workers)")
    s.add_argument("--idle-timeout-s", type=float, default=5.0, help="an idle worker beyond the active ones stops")
    w = sub.add_parser("work")
    w.add_argument("--params", required=True)
    w.add_argument("--side", required=True)
    w.add_argument("--url", required=True)
    w.add_argument("--worker-id", required=True)
    d = sub.add_parser("direct")
    d.add_argument("--params", required=True)
    d.add_argument("--side", required=True)
    d.add_argument("--host", default="0.0.0.0", help="inside a container: every interface (the port is published)")
    d.add_argument("--port", type=int, default=8000, help="0: a free port (written to --port-file)")
    d.add_argument("--port-file", default="")
    d.add_argument("--execution-timeout-s", type=float, default=600.0)
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return {"serve": serve, "work": work, "direct": direct}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
