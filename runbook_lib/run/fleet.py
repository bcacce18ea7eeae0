"""Slots that bound how many migrations of a fleet are in flight at once.

A fleet orchestrator (the Airflow fleet DAG in ``integrations/airflow``) starts a migration for
every params file in a folder. The machines they rent, the approvals they wait for and the hosts
they are timed on are finite, so at most ``limit`` of them may be between taking a slot (before
phase 01) and giving it back (after phase 06's seal). Airflow's own limits count task instances,
not a chain of six tasks, so the limit lives beside the runs, in the same store and with the same
conditional writes as their leases (:mod:`runbook_lib.run.runstore`).

A slot is the object ``<base>/.runstore/.slots/<k>.json`` (``k`` from 0 to ``limit - 1``) under
the runs' base ``s3://bucket/base``; it names the run that holds it. It is taken with
``If-None-Match: *`` (two runs never take one slot) and given back with ``If-Match``. A slot held
by a run that is sealed (its last push lists ``manifest.json``: the migration ended, even if the
task that gives the slot back never ran) is taken over with ``If-Match`` on what was read.

S3 conditional writes: https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runbook_lib._time import utc_now
from runbook_lib.errors import UsageError
from runbook_lib.layout import MANIFEST
from runbook_lib.run.runstore import CONTROL, RunLocation, RunStore

SLOTS = ".slots"  # <base>/.runstore/.slots/<k>.json; a run id never starts with a dot
MAX_LIMIT = 64


@dataclass(frozen=True)
class Slot:
    """One slot as read: its index, the run holding it (empty when free) and since when (UTC ISO 8601)."""

    index: int
    run_id: str
    since: str


def _key(index: int) -> str:
    return f"{CONTROL}/{SLOTS}/{index}.json"


def _checked(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise UsageError(f"--limit {limit}: migrations in flight must be 1 to {MAX_LIMIT}")
    return limit


def _sealed(location: RunLocation, store: Any) -> bool:
    state = RunStore(location, store).state()
    return state is not None and MANIFEST in state.files


def slots(location: RunLocation, limit: int, store: Any = None) -> list[Slot]:
    """Every slot of the fleet under ``location``'s base, free or held, in index order.

    Raises:
        UsageError: ``limit`` outside 1 to :data:`MAX_LIMIT`. StorageError: the store failed.
    """
    runstore = RunStore(location, store)
    out = []
    for k in range(_checked(limit)):
        got = runstore.read(_key(k))
        body = json.loads(got[0]) if got else {}
        out.append(Slot(k, str(body.get("run_id", "")), str(body.get("since", ""))))
    return out


def take_slot(location: RunLocation, limit: int, store: Any = None) -> tuple[Slot | None, list[Slot]]:
    """Take a slot for ``location``'s run: the one it already holds (a retried task), else a free
    one, else one whose run is sealed.

    Returns:
        ``(slot, held)``: the slot now held by this run, or None when every slot is held by a run
        in flight; ``held`` lists the slots as read (who holds each), for the caller to say.

    Raises:
        UsageError: ``limit`` outside 1 to :data:`MAX_LIMIT`. StorageError: the store failed.
    """
    runstore = RunStore(location, store)
    body = json.dumps({"run_id": location.run_id, "since": utc_now()}).encode()
    read: list[Slot] = []
    for k in range(_checked(limit)):
        got = runstore.read(_key(k))
        if got is None:
            if runstore.put_if(_key(k), body) is not None:
                return Slot(k, location.run_id, utc_now()), read
            got = runstore.read(_key(k))  # taken between the two requests
            if got is None:
                continue
        held = json.loads(got[0])
        slot = Slot(k, str(held.get("run_id", "")), str(held.get("since", "")))
        if slot.run_id == location.run_id:
            return slot, read
        if _sealed(RunLocation(location.bucket, location.base, slot.run_id), runstore.store) and \
                runstore.put_if(_key(k), body, etag=got[1]) is not None:
            return Slot(k, location.run_id, utc_now()), read
        read.append(slot)
    return None, read


def give_slot(location: RunLocation, limit: int, store: Any = None) -> Slot | None:
    """Give back the slot ``location``'s run holds (nothing when it holds none).

    Returns:
        The slot given back, or None.

    Raises:
        UsageError: ``limit`` outside 1 to :data:`MAX_LIMIT`. StorageError: the store failed.
    """
    from botocore.exceptions import ClientError

    runstore = RunStore(location, store)
    for k in range(_checked(limit)):
        got = runstore.read(_key(k))
        if got is None or json.loads(got[0]).get("run_id") != location.run_id:
            continue
        try:
            runstore.store.client.delete_object(Bucket=runstore.store.bucket,
                                                Key=runstore.store.object_key(_key(k)), IfMatch=got[1])
        except ClientError:  # taken over meanwhile (this run was sealed): it is another run's now
            return None
        return Slot(k, location.run_id, str(json.loads(got[0]).get("since", "")))
    return None
