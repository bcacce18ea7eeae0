"""A Runpod Serverless worker written as the official ``runpod`` SDK documents one: a handler
that takes a job and returns its output, started with ``runpod.serverless.start``. It stands for a
team's own handler image in the runbook's ``runpod-handler`` tests: run locally, the SDK serves
its own HTTP API (``--rp_serve_api``: ``/run``, ``/runsync``, ``/status/{id}``, ``/stream/{id}``).

Its answer to ``{"text": ...}`` is deterministic: the text's word count, its characters and the
words reversed, after :data:`EXECUTION_S` of waiting that stands for a model's forward pass (a
real handler's answer takes tens of milliseconds; a 2 ms answer would leave phase 04's p95 to the
scheduler's jitter, which on a shared 2-core host is as large as the answer itself).

Usage: ``.venv-runpod/bin/python examples/runpod_handler.py --rp_serve_api --rp_api_host 127.0.0.1
--rp_api_port 8000``
"""

from __future__ import annotations

from typing import Any

import time

import runpod

EXECUTION_S = 0.02
"""Seconds each job waits before answering, standing for the model's execution time."""


def handler(job: dict[str, Any]) -> dict[str, Any]:
    """The job's output: ``{"words": n, "chars": n, "reversed": [...]}`` of ``job["input"]["text"]``."""
    time.sleep(EXECUTION_S)
    text = str((job.get("input") or {}).get("text", ""))
    words = text.split()
    return {"words": len(words), "chars": len(text), "reversed": words[::-1]}


if __name__ == "__main__":
    runpod.serverless.start({"handler": handler})
