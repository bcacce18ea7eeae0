"""A local queue-based endpoint: a front door that holds the job queue and worker processes that
load the model once and pull jobs in batches.

The client-facing API follows Runpod Serverless' queue endpoints
(https://docs.runpod.io/serverless/endpoints/operations): ``POST /run``, ``POST /runsync``,
``GET /status/{id}``, ``POST /cancel/{id}``, ``GET /health``; job states IN_QUEUE,
IN_PROGRESS, COMPLETED, FAILED, CANCELLED, TIMED_OUT. A job IN_PROGRESS longer than the
execution timeout is TIMED_OUT and its worker is replaced; a job older than its TTL is
forgotten (status answers 404). Workers talk to the front door over ``/worker/*``.

Usage: ``python -m runbook_lib.providers.local.endpoint serve|work ...`` (started by
:class:`runbook_lib.providers.local.LocalProvider`).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from runbook_lib.params import load_params
from runbook_lib.workload import make_workload

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT")
RUNSYNC_WAIT_S = 90.0  # /runsync answers with the current status after this, seconds (as Runpod)
TAKE_WAIT_S = 1.0  # a worker's long poll for jobs, seconds
REAPER_INTERVAL_S = 0.05
LISTEN_BACKLOG = 512  # http.server's default of 5 resets connections under a burst of clients


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG


class FrontDoor:
    """Job queue, job table and worker supervision for one endpoint."""

    def __init__(self, *, worker_argv: list[str], workers: int, execution_timeout_s: float, ttl_s: float) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.queue: collections.deque[str] = collections.deque()
        self.cond = threading.Condition()
        self.execution_timeout_s = execution_timeout_s
        self.ttl_s = ttl_s
        self.worker_argv = worker_argv
        self.workers: dict[str, dict[str, Any]] = {}
        self.first_ready_at: float | None = None
        self.started_at = time.time()
        self.cold_starts: list[dict[str, Any]] = []
        for _ in range(workers):
            self._spawn_worker()

    # -- workers -----------------------------------------------------------------------------

    def _spawn_worker(self) -> None:
        wid = f"w-{secrets.token_hex(3)}"
        proc = subprocess.Popen([*self.worker_argv, "--worker-id", wid], stdin=subprocess.DEVNULL)
        self.workers[wid] = {"proc": proc, "state": "initializing", "spawned_at": time.time(), "jobs": set()}

    def worker_ready(self, wid: str, init_s: float) -> None:
        with self.cond:
            w = self.workers.get(wid)
            if w is None:
                return
            w["state"] = "idle"
            now = time.time()
            self.cold_starts.append({"worker": wid, "init_s": init_s, "ready_after_spawn_s": now - w["spawned_at"]})
            if self.first_ready_at is None:
                self.first_ready_at = now
            self.cond.notify_all()

    def _replace_worker(self, wid: str, reason: str) -> None:
        w = self.workers.pop(wid, None)
        if w is None:
            return
        if w["proc"].poll() is None:
            w["proc"].kill()
        for jid in w["jobs"]:
            job = self.jobs.get(jid)
            if job and job["status"] == "IN_PROGRESS":
                job.update(status="FAILED", error=reason, completed_at=time.time())
        self._spawn_worker()

    # -- jobs --------------------------------------------------------------------------------

    def submit(self, payload: Any) -> dict[str, Any]:
        jid = f"job-{secrets.token_hex(8)}"
        with self.cond:
            self.jobs[jid] = {"id": jid, "status": "IN_QUEUE", "input": payload, "submitted_at": time.time()}
            self.queue.append(jid)
            self.cond.notify_all()
            return self.public(jid)

    def public(self, jid: str) -> dict[str, Any]:
        job = self.jobs[jid]
        out = {k: v for k, v in job.items() if k not in ("input",)}
        if "started_at" in job:
            wait = job["started_at"] - job["submitted_at"]
            init = 0.0
            if self.first_ready_at is None or self.first_ready_at > job["submitted_at"]:
                ready = self.first_ready_at or job["started_at"]
                init = max(0.0, min(job["started_at"], ready) - job["submitted_at"])
            out["init_s"] = init
            out["queue_s"] = max(0.0, wait - init)
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

    def take(self, wid: str, max_jobs: int) -> list[dict[str, Any]]:
        deadline = time.monotonic() + TAKE_WAIT_S
        with self.cond:
            while not self.queue:
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self.cond.wait(left)
            taken: list[dict[str, Any]] = []
            now = time.time()
            while self.queue and len(taken) < max_jobs:
                jid = self.queue.popleft()
                job = self.jobs[jid]
                job.update(status="IN_PROGRESS", started_at=now, worker=wid)
                taken.append({"id": jid, "input": job["input"]})
            w = self.workers.get(wid)
            if w is not None:
                w["state"] = "running"
                w["jobs"] = {t["id"] for t in taken}
            return taken

    def done(self, wid: str, results: list[dict[str, Any]]) -> None:
        with self.cond:
            now = time.time()
            for r in results:
                job = self.jobs.get(r["id"])
                if job is None or job["status"] != "IN_PROGRESS" or job.get("worker") != wid:
                    continue  # cancelled, timed out or expired meanwhile: the late result is dropped
                if "error" in r:
                    job.update(status="FAILED", error=r["error"])
                else:
                    job.update(status="COMPLETED", output=r["output"])
                job.update(completed_at=now, execution_s=r.get("execution_s"), batch_size=r.get("batch_size"))
            w = self.workers.get(wid)
            if w is not None:
                w["state"] = "idle"
                w["jobs"] = set()
            self.cond.notify_all()

    def health(self) -> dict[str, Any]:
        with self.cond:
            counts = collections.Counter(j["status"] for j in self.jobs.values())
            states = collections.Counter(w["state"] for w in self.workers.values())
            return {
                "jobs": {"inQueue": counts["IN_QUEUE"], "inProgress": counts["IN_PROGRESS"],
                         "completed": counts["COMPLETED"], "failed": counts["FAILED"],
                         "cancelled": counts["CANCELLED"], "timedOut": counts["TIMED_OUT"]},
                "workers": {"idle": states["idle"], "running": states["running"],
                            "initializing": states["initializing"]},
                "cold_starts": list(self.cold_starts),
            }

    def reap(self) -> None:
        """Enforce execution timeouts and TTLs, and replace workers that died."""
        while True:
            time.sleep(REAPER_INTERVAL_S)
            with self.cond:
                now = time.time()
                for wid, w in list(self.workers.items()):
                    code = w["proc"].poll()
                    if code is not None:
                        self._replace_worker(wid, f"worker {wid} exited with code {code}")
                for jid, job in list(self.jobs.items()):
                    if job["status"] == "IN_PROGRESS" and now - job["started_at"] > self.execution_timeout_s:
                        job.update(status="TIMED_OUT", completed_at=now,
                                   error=f"execution timeout {self.execution_timeout_s} s exceeded")
                        self._replace_worker(job["worker"], "execution timeout")
                    if now - job["submitted_at"] > self.ttl_s:
                        if jid in self.queue:
                            self.queue.remove(jid)
                        del self.jobs[jid]
                self.cond.notify_all()


def _handler(door: FrontDoor) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet: the pod log is evidence, not a trace
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
            body = self._body()
            if parts == ["run"]:
                return self._send(200, door.submit(body.get("input")))
            if parts == ["runsync"]:
                job = door.submit(body.get("input"))
                return self._send(200, door.wait_terminal(job["id"], RUNSYNC_WAIT_S) or job)
            if len(parts) == 2 and parts[0] == "cancel":
                res = door.cancel(parts[1])
                return self._send(200 if res else 404, res or {"error": f"job {parts[1]} not found"})
            if parts == ["worker", "ready"]:
                door.worker_ready(body["worker"], float(body["init_s"]))
                return self._send(200, {})
            if parts == ["worker", "take"]:
                return self._send(200, {"jobs": door.take(body["worker"], int(body["max"]))})
            if parts == ["worker", "done"]:
                door.done(body["worker"], body["results"])
                return self._send(200, {})
            return self._send(404, {"error": f"no route POST {self.path}"})

    return Handler


def serve(args: argparse.Namespace) -> int:
    server = _Server(("127.0.0.1", 0), None)  # type: ignore[arg-type]
    url = f"http://127.0.0.1:{server.server_address[1]}"
    worker_argv = [sys.executable, "-m", "runbook_lib.providers.local.endpoint", "work", "--params", args.params,
                   "--side", args.side, "--url", url]
    door = FrontDoor(worker_argv=worker_argv, workers=args.workers,
                     execution_timeout_s=args.execution_timeout_s, ttl_s=args.ttl_s)
    server.RequestHandlerClass = _handler(door)
    threading.Thread(target=door.reap, daemon=True).start()
    tmp = Path(args.port_file).with_suffix(".tmp")
    tmp.write_text(str(server.server_address[1]))
    tmp.replace(args.port_file)
    server.serve_forever()
    return 0


def work(args: argparse.Namespace) -> int:
    """Worker: load the workload once, then pull up to ``batch_size`` jobs at a time."""
    import psutil

    spawned = psutil.Process().create_time()
    import httpx

    mig = load_params(args.params)
    profile = getattr(mig, args.side)
    wl = make_workload(mig.workload, profile)
    wl.load()
    init_s = time.time() - spawned  # process start + imports + weight load
    crash_every = 7 if profile.fault == "worker_crash" else 0
    slow_s = 0.25 if profile.fault == "slow_worker" else 0.0
    served = 0
    with httpx.Client(base_url=args.url, timeout=30.0) as http:
        http.post("/worker/ready", json={"worker": args.worker_id, "init_s": init_s})
        while True:
            jobs = http.post("/worker/take", json={"worker": args.worker_id, "max": profile.batch_size}).json()["jobs"]
            if not jobs:
                continue
            served += len(jobs)
            if crash_every and served >= crash_every:
                os._exit(3)  # drill: the worker dies holding its batch
            t0 = time.perf_counter()
            if slow_s:
                time.sleep(slow_s)  # drill: a slower target
            try:
                outputs = wl.infer([j["input"] for j in jobs])
                dt = time.perf_counter() - t0
                results = [{"id": j["id"], "output": o, "execution_s": dt, "batch_size": len(jobs)}
                           for j, o in zip(jobs, outputs, strict=True)]
            except Exception as exc:  # noqa: BLE001 - reported as the job's failure
                results = [{"id": j["id"], "error": f"{type(exc).__name__}: {exc}"} for j in jobs]
            http.post("/worker/done", json={"worker": args.worker_id, "results": results})


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
    w = sub.add_parser("work")
    w.add_argument("--params", required=True)
    w.add_argument("--side", required=True)
    w.add_argument("--url", required=True)
    w.add_argument("--worker-id", required=True)
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return serve(args) if args.cmd == "serve" else work(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
