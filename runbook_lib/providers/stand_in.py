"""A simulated machine's stand-in for an image's server, started by a worker runtime the
simulators run in its place (Runpod's serverless worker,
:mod:`runbook_lib.providers.runpod.handler_worker`; Vast.ai's PyWorker,
:mod:`runbook_lib.providers.vast.pyworker`): on a free port, polled until ready, and killed with
the worker that started it."""

from __future__ import annotations

import ctypes
import signal
import subprocess
import time
from typing import Any

import httpx

from runbook_lib.providers.local.lifecycle import free_port

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


def wait_ready(http: Any, proc: subprocess.Popen[bytes], url: str, path: str) -> None:
    """Until the stand-in answers ``GET path`` with 200.

    Raises:
        SystemExit: it exited, or did not answer within :data:`READY_WAIT_S` (the worker exits
            and its front door replaces it, as Runpod replaces a worker whose image fails).
    """
    deadline = time.monotonic() + READY_WAIT_S
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"handler stand-in exited with code {proc.returncode} before it served")
        try:
            if http.get(f"{url}{path}", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"handler stand-in did not answer GET {url}{path} within {READY_WAIT_S:g} s")
        time.sleep(0.05)


