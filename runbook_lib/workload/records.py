"""Idempotency records of an endpoint's handler: per job, the result in durable storage and a
completion marker, so a job delivered again returns what was recorded instead of running the
workload (and its side effects) a second time.

The serverless guidance this project follows (docs/reference/providers.md 2.3a:
"Retries require idempotent handlers. Map job IDs to idempotency records and copy outputs
promptly to durable storage") asks for exactly this. Layout under the records prefix (the run's
``runs/<run_id>/jobs/<side>``)::

    <key>/output.json         the handler's result: {"output", "execution_s", "batch_size", ...}
    <key>/_DONE               completion marker, written after output.json
    <key>/executions/<n>.json one object per real execution of the workload for this key

A key is the job's ``request_id`` when its input envelope carries one (a client that submits a
request again after losing its answer sends the same id), else the job id (a provider that
redelivers a job, or ``/retry``, keeps the id). The record is written *before* the job is
reported COMPLETED, so a worker whose disk is wiped afterwards loses nothing.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from typing import Any

from runbook_lib.errors import WorkloadError
from runbook_lib.storage import Store

DRILL_KEY = "runbook_drill"
"""Key of a drill envelope ``{"runbook_drill": name, "input": payload}`` (phase 04's drills)."""
DRILLS = ("crash_after_record", "hang", "wipe_disk")
"""What a drill envelope may ask of a worker: die after the result is recorded and before it is
reported (``crash_after_record``), never answer (``hang``), or wipe its scratch disk after
answering (``wipe_disk``)."""
RECORDS_ENV = "RUNBOOK_JOB_RECORDS"
"""Store prefix of the handler's idempotency records (set by the runbook when it creates the
endpoint; unset: no records, every delivery runs)."""
STORE_ENV = "RUNBOOK_STORE_URL"
"""The store URL as a worker sees it (a local directory made absolute)."""
DRILLS_ENV = "RUNBOOK_DRILLS"
"""``1`` when the endpoint was created for phase 04's drills: only then does a worker obey a
drill envelope (:data:`DRILLS`); otherwise it refuses one."""
KEY_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
MARKER = "_DONE"


def unwrap(job_input: Any) -> tuple[Any, str, str]:
    """Split a job input into ``(payload, drill, request_id)``.

    A plain payload has no drill and no request id. An envelope is a dict with ``input`` and
    either ``runbook_drill`` (one of :data:`DRILLS`) or ``request_id`` (1-128 characters of
    ``[A-Za-z0-9_.-]``), or both.

    Raises:
        WorkloadError: an envelope names an unknown drill or a malformed request id.
    """
    if not isinstance(job_input, dict) or "input" not in job_input or not (
            DRILL_KEY in job_input or "request_id" in job_input):
        return job_input, "", ""
    drill = str(job_input.get(DRILL_KEY) or "")
    rid = str(job_input.get("request_id") or "")
    if drill and drill not in DRILLS:
        raise WorkloadError(f"unknown drill {drill!r} in a job input; known: {', '.join(DRILLS)}")
    if rid and not KEY_RE.match(rid):
        raise WorkloadError(f"request_id {rid[:40]!r} is not 1-128 characters of [A-Za-z0-9_.-]; send a UUID")
    return job_input["input"], drill, rid


def job_key(job_id: str, request_id: str = "") -> str:
    """The idempotency key: the request id when the client sent one, else the job id.

    Raises:
        WorkloadError: the job id is not usable as a store key (1-128 of ``[A-Za-z0-9_.-]``).
    """
    key = request_id or job_id
    if not KEY_RE.match(key):
        raise WorkloadError(f"job id {key[:40]!r} cannot key an idempotency record (1-128 of [A-Za-z0-9_.-])")
    return key


class JobRecords:
    """One endpoint side's idempotency records in ``store`` under ``prefix`` (module docstring).

    Args:
        store: the run's store (durable: a bucket or a shared directory, never the worker's disk).
        prefix: ``runs/<run_id>/jobs/<side>``.
        worker: this worker's id, recorded with each execution.
    """

    def __init__(self, store: Store, prefix: str, *, worker: str = "") -> None:
        self.store, self.prefix, self.worker = store, prefix.rstrip("/"), worker

    def _key(self, key: str, name: str) -> str:
        return f"{self.prefix}/{key}/{name}"

    def recorded(self, key: str) -> dict[str, Any] | None:
        """The recorded result of ``key`` when its marker exists, else None (never run, or a run
        that died before recording: the job must run)."""
        if self.store.head(self._key(key, MARKER)) is None:
            return None
        return dict(json.loads(self.store.get_bytes(self._key(key, "output.json"))))

    def executed(self, key: str) -> None:
        """Count one real execution of the workload for ``key`` (the side effect a test counts)."""
        body = {"worker": self.worker, "at_epoch_s": time.time()}
        self.store.put_bytes(json.dumps(body).encode(), self._key(key, f"executions/{time.time_ns()}-"
                                                                          f"{secrets.token_hex(3)}.json"))

    def record(self, key: str, result: dict[str, Any]) -> None:
        """Write ``result`` then the completion marker (the marker only after the result is durable)."""
        self.store.put_bytes(json.dumps({**result, "recorded_by": self.worker,
                                         "recorded_at_epoch_s": time.time()}).encode(),
                             self._key(key, "output.json"))
        self.store.put_bytes(b"", self._key(key, MARKER))

    def executions(self, key: str) -> int:
        """How many times the workload really ran for ``key``."""
        return len(self.store.list(self._key(key, "executions/")))
