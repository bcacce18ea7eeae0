"""A Runpod Serverless worker written as the official ``runpod`` SDK documents one: a handler
that takes a job and returns its output, started with ``runpod.serverless.start``. It stands for a
team's own handler image in the runbook's ``runpod-handler`` tests: run locally, the SDK serves
its own HTTP API (``--rp_serve_api``: ``/run``, ``/runsync``, ``/status/{id}``, ``/stream/{id}``).

Its answer to ``{"text": ...}`` is deterministic: the text's word count, its characters and the
words reversed, after :data:`EXECUTION_S` of waiting that stands for a model's forward pass (a
real handler's answer takes tens of milliseconds; a 2 ms answer would leave phase 04's p95 to the
scheduler's jitter, which on a shared 2-core host is as large as the answer itself).

Two things a careful team's handler has, which phase 04's job drills use
(``workload.service.drills`` in params):

* an idempotency record: a job whose input carries ``request_id`` is answered once; the answer is
  kept under that id in :data:`RECORDS_ENV`'s directory and a job delivered again with the same id
  gets it back with ``replayed: true`` instead of running again. A real handler keeps its records
  where a lost worker's replacement finds them (the endpoint's network volume, ``/runpod-volume``,
  or an object store); the default here is the worker's own disk;
* ``hold_s``: the job works that many seconds more, standing for a request the model is slow on.

Usage: ``.venv-runpod/bin/python examples/runpod_handler.py --rp_serve_api --rp_api_host 127.0.0.1
--rp_api_port 8000``
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import runpod

EXECUTION_S = 0.02
"""Seconds each job waits before answering, standing for the model's execution time."""
RECORDS_ENV = "HANDLER_RECORDS_DIR"
"""The directory of the idempotency records (unset: ``handler-records`` in the working directory)."""


def _record(request_id: str) -> Path:
    root = Path(os.environ.get(RECORDS_ENV) or "handler-records")
    return root / f"{hashlib.sha256(request_id.encode()).hexdigest()}.json"


def handler(job: dict[str, Any]) -> dict[str, Any]:
    """The job's output: ``{"words": n, "chars": n, "reversed": [...]}`` of ``job["input"]["text"]``;
    with ``request_id`` in the input also ``replayed`` (false when it ran, true when it was
    answered from the record of an earlier delivery)."""
    inp = job.get("input") or {}
    request_id = str(inp.get("request_id") or "")
    if request_id and _record(request_id).exists():
        return {**json.loads(_record(request_id).read_text()), "replayed": True}
    time.sleep(EXECUTION_S + float(inp.get("hold_s") or 0))
    text = str(inp.get("text", ""))
    words = text.split()
    out: dict[str, Any] = {"words": len(words), "chars": len(text), "reversed": words[::-1]}
    if request_id:  # recorded whole before it is answered, so a second delivery finds all of it or nothing
        path = _record(request_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump(out, f)
        os.replace(f.name, path)
        out["replayed"] = False
    return out


if __name__ == "__main__":
    runpod.serverless.start({"handler": handler})
