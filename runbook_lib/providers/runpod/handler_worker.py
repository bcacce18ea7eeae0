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
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from runbook_lib.providers.local.endpoint import SPAWNED_AT_ENV, _Server, run_front_door
from runbook_lib.providers.local.lifecycle import free_port

READY_PATH = "/"  # what the SDK's local API answers 200 once it serves (its Swagger page)
READY_WAIT_S = 120.0  # a stand-in that does not answer within this is a worker that never starts
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent() -> None:
    """In the stand-in's child process, before exec: be killed when the worker dies (Linux
    ``prctl(PR_SET_PDEATHSIG, SIGKILL)``), so a worker stopped by its front door leaves nothing."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def start_stand_in(argv: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    """Start the stand-in with ``{port}`` set to a free port; returns the process and its URL."""
    port = free_port()
    cmd = [a.replace("{port}", str(port)) for a in argv]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)  # noqa: PLW1509
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(http: Any, proc: subprocess.Popen[bytes], url: str) -> None:
    """Until the stand-in answers ``GET /`` with 200.

    Raises:
        SystemExit: it exited, or did not answer within :data:`READY_WAIT_S` (the worker exits
            and its front door replaces it, as Runpod replaces a worker whose image fails).
    """
    import httpx

    deadline = time.monotonic() + READY_WAIT_S
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"handler stand-in exited with code {proc.returncode} before it served")
        try:
            if http.get(f"{url}{READY_PATH}", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"handler stand-in did not answer GET {url}{READY_PATH} within {READY_WAIT_S:g} s")
        time.sleep(0.05)


def relay(http: Any, url: str, job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One job through the stand-in's ``POST /runsync``: ``{"id", "output", "execution_s"}``, or
    ``{"id", "error"}`` when the handler failed or answered no whole job."""
    import httpx

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
    one job at a time and relay it (:func:`relay`)."""
    import httpx

    spawned = float(os.environ.get(SPAWNED_AT_ENV) or time.time())
    argv = json.loads(args.command)
    proc, url = start_stand_in(argv)
    with httpx.Client(timeout=30.0) as http:
        wait_ready(http, proc, url)
        init_s = time.time() - spawned
        http.post(f"{args.url}/worker/ready", json={"worker": args.worker_id, "init_s": init_s,
                                                    "process_start_s": init_s})
        while proc.poll() is None:
            jobs = http.post(f"{args.url}/worker/take", json={"worker": args.worker_id, "max": 1}).json()["jobs"]
            if jobs:
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
