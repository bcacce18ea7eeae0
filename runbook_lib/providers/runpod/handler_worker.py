"""Runpod's serverless worker runtime, as the Runpod simulator runs it for a team's handler image
(``workload.kind: service`` on a Runpod Serverless queue endpoint).

On Runpod an endpoint's workers run the image's entry point, whose handler calls
``runpod.serverless.start`` and takes jobs from Runpod's queue. There is no container runtime
here, so each worker runs the image's stand-in instead (``rehearsal.stand_ins``: the same handler
under the official SDK's local API, ``--rp_serve_api``, on a free port) and relays each job it
takes to the stand-in's ``POST /runsync``. The queue, the scaling (``workers.min``, ``workers.max``,
``idleTimeout``, so a scale-to-zero endpoint's first job waits for a cold start), the execution
timeout, the TTL and the redelivery of a job whose worker died are the local front door's
(:class:`runbook_lib.providers.local.endpoint.FrontDoor`), the same as for the runbook's own
worker.

A worker is ready once the stand-in answers ``GET /`` (the SDK's local API serves its Swagger page
there, runpod 1.12.0 ``rp_fastapi.py``); its ``init_s`` is the seconds from spawn to that answer.
A worker killed by its front door takes its stand-in with it (``PR_SET_PDEATHSIG``).

Usage: ``python -m runbook_lib.providers.runpod.handler_worker serve|work ...`` (``serve`` is
started by the simulator, with the stand-in's argv as JSON, ``{port}`` in it filled per worker).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import httpx

from runbook_lib.layout import CRASH_EVERY, POD_FAULT_ENV
from runbook_lib.providers.local.endpoint import SPAWNED_AT_ENV, _Server, run_front_door
from runbook_lib.providers.stand_in import start_stand_in, wait_ready

READY_PATH = "/"  # what the SDK's local API answers 200 once it serves (its Swagger page)


def relay(http: Any, url: str, job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One job through the stand-in's ``POST /runsync``: ``{"id", "output", "execution_s"}``, or
    ``{"id", "error"}`` when the handler failed or answered no whole job."""
    t0 = time.perf_counter()
    try:
        r = http.post(f"{url}/runsync", json={"input": job["input"]}, timeout=timeout_s)
        body = r.json()
    except (httpx.HTTPError, ValueError) as exc:
        return {"id": job["id"], "error": f"handler: {type(exc).__name__}: {exc}"[:400]}
    took = time.perf_counter() - t0
    if r.status_code != 200 or not isinstance(body, dict):
        return {"id": job["id"], "error": f"handler answered HTTP {r.status_code}: {str(body)[:300]}"}
    if body.get("status") != "COMPLETED" or "error" in body:
        return {"id": job["id"], "error": str(body.get("error") or f"handler job {body.get('status')}")[:400]}
    return {"id": job["id"], "output": body.get("output"), "execution_s": took}


def work(args: argparse.Namespace) -> int:
    """A worker: start the stand-in, report ready with its start time as ``init_s``, then take
    one job at a time and relay it (:func:`relay`). Under the simulator's ``endpoint:
    worker_crash`` fault (``RUNBOOK_FAULT=worker_crash`` in the endpoint's environment) it
    dies holding the job it takes after :data:`~runbook_lib.layout.CRASH_EVERY`
    jobs, so its front door replaces it and delivers that job again, as Runpod retries a job whose
    worker died (docs.runpod.io/serverless/endpoints/overview)."""
    crash_after = CRASH_EVERY if os.environ.get(POD_FAULT_ENV) == "worker_crash" else 0
    served = 0
    spawned = float(os.environ.get(SPAWNED_AT_ENV) or time.time())
    argv = json.loads(args.command)
    proc, url = start_stand_in(argv)
    with httpx.Client(timeout=30.0) as http:
        wait_ready(http, proc, url, READY_PATH)
        init_s = time.time() - spawned
        http.post(f"{args.url}/worker/ready", json={"worker": args.worker_id, "init_s": init_s,
                                                    "process_start_s": init_s})
        while proc.poll() is None:
            jobs = http.post(f"{args.url}/worker/take", json={"worker": args.worker_id, "max": 1}).json()["jobs"]
            if jobs and crash_after and served >= crash_after:
                os._exit(3)  # the fault: dead while holding the job
            if jobs:
                served += len(jobs)
                results = [relay(http, url, j, args.execution_timeout_s) for j in jobs]
                http.post(f"{args.url}/worker/done", json={"worker": args.worker_id, "results": results})
    return 3  # the stand-in died: the worker dies too, and its front door replaces it


def serve(args: argparse.Namespace) -> int:
    """The endpoint's front door over handler workers (:func:`work`)."""
    server = _Server(("127.0.0.1", 0), None)  # type: ignore[arg-type]
    url = f"http://127.0.0.1:{server.server_address[1]}"
    worker_argv = [sys.executable, "-m", "runbook_lib.providers.runpod.handler_worker", "work", "--url", url,
                   "--command", args.command, "--execution-timeout-s", str(args.execution_timeout_s)]
    return run_front_door(server, worker_argv, args)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="handler_worker")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--command", required=True, help="the stand-in's argv as JSON, {port} in it")
    s.add_argument("--workers", type=int, default=1)
    s.add_argument("--active-workers", type=int, default=0)
    s.add_argument("--idle-timeout-s", type=float, default=5.0)
    s.add_argument("--execution-timeout-s", type=float, default=600.0)
    s.add_argument("--ttl-s", type=float, default=86_400.0)
    s.add_argument("--port-file", required=True)
    w = sub.add_parser("work")
    w.add_argument("--url", required=True)
    w.add_argument("--command", required=True)
    w.add_argument("--execution-timeout-s", type=float, default=600.0)
    w.add_argument("--worker-id", required=True)
    args = ap.parse_args(argv)
    return {"serve": serve, "work": work}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
