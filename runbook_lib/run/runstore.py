"""A run directory kept in object storage, so each phase of one migration may run on another worker.

An orchestrator (Airflow's Celery or Kubernetes executor) places each task on whichever worker is
free, while a phase reads and writes its run directory on a local disk. A run location
``s3://bucket/base/<run_id>`` bridges the two: before a phase, the worker takes the run's lease,
pulls the run's last completed push into ``<project>/reports/<run_id>`` (every file checked
against the sha256 that push recorded) and checks the record chain; the phase runs as it does on
one machine, host lock included; then the worker pushes what changed and, last, the run's state
(its completion marker), and gives the lease back.

Layout under ``s3://bucket/base/``:

* ``<run_id>/<path>``: the run's files, exactly the run directory, so ``aws s3 sync
  s3://bucket/base/<run_id> DIR`` followed by ``runbook verify DIR`` checks it with standard
  tools;
* ``.runstore/<run_id>/state.json``: the last completed push (its generation, the phase, the
  worker, and every file's sha256 and size), written after every file it lists, with S3's
  conditional writes (``If-None-Match: *`` for the first, ``If-Match: <ETag>`` after), so two
  workers can never both move the run forward from the same state;
* ``.runstore/<run_id>/lease.json``: who holds the run now. Taken with ``If-None-Match: *``,
  renewed with ``If-Match`` while the phase runs, removed with ``If-Match`` at the end. A lease
  not renewed for its time to live (judged by the store's clock: its ``Last-Modified`` against
  the ``Date`` of the read, never the worker's) belongs to a worker that died, and the next worker
  takes it over, saying so.

S3 conditional writes: https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html
(``PreconditionFailed``, HTTP 412, when the condition does not hold); moto's server, which the
tests run, enforces both conditions on PutObject and ``If-Match`` on DeleteObject.

A local provider's pods are processes on one host, under one project's ``.runbook/local``: a
migration whose source or target is ``local`` keeps every phase on the worker that ran phase 01,
and a phase started elsewhere is refused before anything runs (:func:`pinned_here`).

The store's identity and endpoint come from boto3's own configuration chain, by name at run time:
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (or a profile, or an instance role),
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` for a store other than AWS, ``AWS_REGION``.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path, PurePosixPath
from typing import Any

from runbook_lib._time import utc_now
from runbook_lib.errors import EvidenceError, StorageError, UsageError
from runbook_lib.evidence.manifest import read_chain, sha256_file
from runbook_lib.layout import REPORTS_DIR, STATE_DIR
from runbook_lib.storage.base import ObjectInfo

CONTROL = ".runstore"  # beside the runs under the base prefix: <base>/.runstore/<run_id>/
STATE_KEY = "state.json"
LEASE_KEY = "lease.json"
LEASE_TTL_S = 120.0  # a lease not renewed for this long is a dead worker's; renewed every third of it
COPIES_DIR = "runstore"  # <project>/.runbook/runstore/<run_id>.json: which run location a local copy mirrors
SCHEMA = 1
_LOCATION = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(?P<base>.*?))?/(?P<run>[^/]+)/?$")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def is_location(value: str | Path) -> bool:
    """Whether a run argument names a run in object storage (``s3://...``) rather than a directory."""
    return str(value).startswith("s3://")


@dataclass(frozen=True)
class RunLocation:
    """Where a run lives in object storage.

    Attributes:
        bucket: the S3 bucket. base: the key prefix holding runs (``""`` at the bucket's root).
        run_id: the run's id, the last part of the URL.
    """

    bucket: str
    base: str
    run_id: str

    @classmethod
    def parse(cls, url: str) -> RunLocation:
        """``s3://bucket[/base...]/<run_id>``.

        Raises:
            UsageError: not such a URL, or the run id is not a run id (letters, digits, ``._-``).
        """
        m = _LOCATION.match(url.strip())
        if m is None or not _RUN_ID.match(m["run"]) or m["run"] == CONTROL:
            raise UsageError(f"run location {url!r} is not s3://<bucket>[/<prefix>]/<run_id> (a bucket name of 3 "
                             "to 63 lower-case letters, digits, dots or hyphens, then the run's id); name the run "
                             "as `runbook run --reports s3://<bucket>/<prefix>` printed it")
        return cls(m["bucket"], (m["base"] or "").strip("/"), m["run"])

    @classmethod
    def under(cls, base_url: str, run_id: str) -> RunLocation:
        """The location of run ``run_id`` under ``s3://bucket[/base]`` (``runbook run --reports``)."""
        return cls.parse(base_url.rstrip("/") + "/" + run_id)

    @property
    def base_url(self) -> str:
        return f"s3://{self.bucket}" + (f"/{self.base}" if self.base else "")

    @property
    def url(self) -> str:
        return f"{self.base_url}/{self.run_id}"

    def run_key(self, rel: str) -> str:
        """Store key (under :attr:`base_url`) of the run's file ``rel``."""
        return f"{self.run_id}/{rel}"

    def control_key(self, name: str) -> str:
        return f"{CONTROL}/{self.run_id}/{name}"


def open_base(base_url: str) -> Any:
    """The :class:`~runbook_lib.storage.s3.S3Store` at ``s3://bucket[/base]``, its identity, endpoint
    and region from boto3's configuration chain (``AWS_*`` variables, a profile or an instance
    role; ``AWS_REGION`` else ``us-east-1``)."""
    from runbook_lib.storage.s3 import S3Store

    return S3Store.from_url(base_url, region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION", ""))


def worker_identity(project: Path) -> dict[str, Any]:
    """This worker as a push or a lease names it: host name, project directory, process id."""
    return {"host": socket.gethostname(), "project": str(project), "pid": os.getpid()}


@dataclass
class RunState:
    """The last completed push of a run (``.runstore/<run_id>/state.json``).

    Attributes:
        generation: pushes so far (1 after the first). phase: the phase that pushed it, and
            ``status`` how that phase ended (``completed``, ``held``, ``failed``, ``sealed`` ...).
        worker: :func:`worker_identity` of the worker that pushed it. files: every run file by
            relative POSIX path: ``{"sha256": hex, "size_bytes": int}``. history: one entry per push.
        etag: the state object's ETag as read (the condition of the next push); not stored.
    """

    run_id: str
    generation: int = 0
    phase: str = ""
    status: str = ""
    pushed_at: str = ""
    worker: dict[str, Any] = field(default_factory=dict)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    etag: str = ""

    def to_json(self) -> bytes:
        body = {"schema": SCHEMA, "run_id": self.run_id, "generation": self.generation, "phase": self.phase,
                "status": self.status, "pushed_at": self.pushed_at, "worker": self.worker, "files": self.files,
                "history": self.history}
        return json.dumps(body, indent=2, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, etag: str, where: str) -> RunState:
        """Raises EvidenceError: the state is not a run state this runbook writes, or names a file
        outside the run (an absolute path, or one with ``..``)."""
        try:
            body = json.loads(data)
            state = cls(str(body["run_id"]), int(body["generation"]), str(body["phase"]), str(body["status"]),
                        str(body["pushed_at"]), dict(body["worker"]), dict(body["files"]), list(body["history"]), etag)
        except (ValueError, KeyError, TypeError) as exc:
            raise EvidenceError(f"{where} is not a run state the runbook wrote ({exc}); the run's store was "
                                "changed by hand. Restore it, or start the migration again") from None
        for rel in state.files:
            p = PurePosixPath(rel)
            if p.is_absolute() or ".." in p.parts or not rel or rel.startswith(CONTROL):
                raise EvidenceError(f"{where} lists {rel!r}, a path outside the run; the state was tampered with")
        return state


def _error_code(exc: Exception) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


def _precondition_failed(exc: Exception) -> bool:
    return _error_code(exc) in ("PreconditionFailed", "ConditionalRequestConflict") or \
        getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode") == 412


class RunStore:
    """One run's files and control objects at a :class:`RunLocation`.

    Args:
        location: the run's location. store: an :class:`~runbook_lib.storage.s3.S3Store` at its
            base (default :func:`open_base`; tests pass one with a client of their own).
    """

    def __init__(self, location: RunLocation, store: Any = None) -> None:
        self.location = location
        self.store = store if store is not None else open_base(location.base_url)

    # -- the run's state -----------------------------------------------------------------------

    def read(self, key: str) -> tuple[bytes, str, float] | None:
        """An object's bytes, ETag and age by the store's clock (seconds since its Last-Modified,
        at the response's Date), or None when it does not exist."""
        from botocore.exceptions import ClientError

        with self.store.errors.translating("get", key):
            try:
                r = self.store.client.get_object(Bucket=self.store.bucket, Key=self.store.object_key(key))
            except ClientError as exc:
                if _error_code(exc) in ("NoSuchKey", "404"):
                    return None
                raise
        date = r.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        age = (parsedate_to_datetime(date) - r["LastModified"]).total_seconds() if date else 0.0
        return bytes(r["Body"].read()), str(r["ETag"]), age

    def put_if(self, key: str, data: bytes, *, etag: str = "") -> str | None:
        """Put ``data`` at ``key`` only if it does not exist (``etag`` empty) or still has ``etag``;
        the new ETag, or None when the condition did not hold."""
        from botocore.exceptions import ClientError

        cond = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
        try:
            r = self.store.client.put_object(Bucket=self.store.bucket, Key=self.store.object_key(key), Body=data,
                                             ContentType="application/json", **cond)
        except ClientError as exc:
            if _precondition_failed(exc):
                return None
            with self.store.errors.translating("put", key):
                raise
        return str(r["ETag"])

    def state(self) -> RunState | None:
        """The run's last completed push, or None before the first."""
        key = self.location.control_key(STATE_KEY)
        got = self.read(key)
        return None if got is None else RunState.from_json(got[0], got[1], self.store.url(key))

    # -- pull / push ---------------------------------------------------------------------------

    def pull(self, dest: Path, state: RunState | None = None) -> RunState | None:
        """Make ``dest`` hold exactly the run's last completed push: each listed file fetched
        unless ``dest`` already has it with the listed sha256, each fetched file checked against
        that sha256 and size as it streams, files the push does not list removed.

        Args:
            dest: the local copy. state: the run's state when the caller has just read it (under
                the lease); default: read it now.

        Returns:
            The state pulled, or None when the run has no push yet (``dest`` untouched).

        Raises:
            StorageError: an object is missing or its bytes differ from the state (a push cut off
                while it rewrote a file, or a file changed in the store by hand); the file named.
        """
        state = state or self.state()
        if state is None:
            return None
        dest.mkdir(parents=True, exist_ok=True)
        for rel, info in sorted(state.files.items()):
            local = dest / rel
            if local.is_file() and not local.is_symlink() and sha256_file(local) == info["sha256"]:
                continue
            key = self.location.run_key(rel)
            try:
                self.store.get_file(key, local, expect=ObjectInfo(key, int(info["size_bytes"]), str(info["sha256"])))
            except StorageError as exc:
                raise StorageError(f"pulling run {state.run_id} (push {state.generation}, phase {state.phase}): {exc}. "
                                   "The run's files in the store no longer match its last completed push; a push "
                                   "that was cut off, or a change by hand. Nothing was run.") from None
        listed = set(state.files)
        for f in sorted(dest.rglob("*"), reverse=True):
            rel = f.relative_to(dest).as_posix()
            if (f.is_file() or f.is_symlink()) and rel not in listed:
                f.unlink()
            elif f.is_dir() and not any(f.iterdir()):
                f.rmdir()
        return state

    def push(self, src: Path, *, after: RunState | None, phase: str, status: str, worker: dict[str, Any]) -> RunState:
        """Push ``src`` as the run's next state: every file that differs from ``after`` (the state
        this worker pulled, None for a new run) uploaded with its sha256, then the state itself,
        conditional on ``after``'s ETag, then every object under the run that the new state does
        not list deleted (files the run no longer has, and what a cut-off push left).

        Returns:
            The new state (its generation one more than ``after``'s).

        Raises:
            EvidenceError: the state changed in the store since ``after`` was read: another worker
                pushed this run meanwhile (its lease was lost); nothing of this push is the run's.
            StorageError: an upload failed (the run's state is still ``after``).
        """
        files: dict[str, dict[str, Any]] = {}
        for f in sorted(src.rglob("*")):
            if f.is_file() and not f.is_symlink():
                files[f.relative_to(src).as_posix()] = {"sha256": sha256_file(f), "size_bytes": f.stat().st_size}
        before = after.files if after else {}
        for rel, info in files.items():
            if before.get(rel) != info:
                self.store.put_file(src / rel, self.location.run_key(rel), sha256=info["sha256"])
        gen = (after.generation if after else 0) + 1
        now = utc_now()
        new = RunState(self.location.run_id, gen, phase, status, now, worker, files,
                       [*(after.history if after else []), {"generation": gen, "phase": phase, "status": status,
                                                            "pushed_at": now, "worker": worker}])
        etag = self.put_if(self.location.control_key(STATE_KEY), new.to_json(), etag=after.etag if after else "")
        if etag is None:
            raise EvidenceError(f"run {self.location.url} was pushed by another worker since this one pulled it "
                                f"(push {after.generation if after else 0}); phase {phase}'s files were uploaded but "
                                "are not the run's. Its lease was lost: run the phase again from the run's state")
        new.etag = etag
        for key in self.store.list(self.location.run_id):  # files the run no longer has, and a cut-off push's
            if key.split("/", 1)[1] not in files:
                self.store.delete(key)
        return new

    def lease(self, *, phase: str, worker: dict[str, Any], ttl_s: float = LEASE_TTL_S,
              echo: Callable[[str], None] = print) -> Lease:
        """The run's lease for ``phase`` (a context manager: :class:`Lease`)."""
        return Lease(self, phase=phase, worker=worker, ttl_s=ttl_s, echo=echo)


class Lease:
    """Who works on a run now: taken on entry, renewed every third of ``ttl_s`` while held, given
    back on exit. Two phases of one run never run at once.

    Raises (on entry):
        UsageError: another worker holds the run's lease and renewed it within ``ttl_s`` (exit 2;
            nothing ran). The message names the holder, its phase and since when.
    """

    def __init__(self, runstore: RunStore, *, phase: str, worker: dict[str, Any], ttl_s: float,
                 echo: Callable[[str], None]) -> None:
        self.runstore, self.phase, self.worker, self.ttl_s, self.echo = runstore, phase, worker, ttl_s, echo
        self.key = runstore.location.control_key(LEASE_KEY)
        self.token = uuid.uuid4().hex
        self.etag = ""
        self.lost = ""  # why a renewal failed, when one did
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _body(self) -> bytes:
        return json.dumps({"token": self.token, "phase": self.phase, "worker": self.worker, "renewed_at": utc_now(),
                           "ttl_s": self.ttl_s}).encode()

    def __enter__(self) -> Lease:
        etag = self.runstore.put_if(self.key, self._body())
        if etag is None:
            got = self.runstore.read(self.key)
            if got is None:  # given back between the two requests
                etag = self.runstore.put_if(self.key, self._body())
            else:
                etag = self._take_over(*got)
        if etag is None:
            raise UsageError(f"run {self.runstore.location.url}: its lease changed hands while phase {self.phase} "
                             "tried to take it; run the phase again")
        self.etag = etag
        self._thread = threading.Thread(target=self._renew, name=f"runstore-lease-{self.phase}", daemon=True)
        self._thread.start()
        return self

    def _take_over(self, data: bytes, etag: str, age_s: float) -> str | None:
        try:
            held = json.loads(data)
        except ValueError:
            held = {}
        ttl = float(held.get("ttl_s") or self.ttl_s)
        who = held.get("worker") or {}
        holder = f"phase {held.get('phase', '?')} on {who.get('host', '?')} (PID {who.get('pid', '?')})"
        if age_s <= ttl:
            raise UsageError(f"run {self.runstore.location.url} is being worked on: {holder} holds its lease, renewed "
                             f"{age_s:.0f} s ago (a lease lapses {ttl:.0f} s after its last renewal). Two phases of "
                             f"one run never run at once; phase {self.phase} ran nothing. Run it when that phase has "
                             "ended")
        self.echo(f"run {self.runstore.location.url}: the lease of {holder} lapsed {age_s - ttl:.0f} s ago (not "
                  f"renewed for {age_s:.0f} s, its time to live {ttl:.0f} s); phase {self.phase} takes it over")
        return self.runstore.put_if(self.key, self._body(), etag=etag)

    def _renew(self) -> None:
        from botocore.exceptions import BotoCoreError

        while not self._stop.wait(self.ttl_s / 3):
            try:
                etag = self.runstore.put_if(self.key, self._body(), etag=self.etag)
            except (StorageError, BotoCoreError) as exc:  # the store unreachable for a while: the next try may reach it
                self.echo(f"run {self.runstore.location.url}: renewing the lease failed ({exc}); trying again")
                continue
            if etag is None:
                self.lost = "another worker took the run's lease over"
                self.echo(f"run {self.runstore.location.url}: {self.lost}; this phase's push will be refused")
                return
            self.etag = etag

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.lost:
            return
        from botocore.exceptions import ClientError

        try:
            self.runstore.store.client.delete_object(Bucket=self.runstore.store.bucket,
                                                     Key=self.runstore.store.object_key(self.key), IfMatch=self.etag)
        except ClientError as err:  # taken over meanwhile: it is the other worker's now
            if not _precondition_failed(err):
                self.echo(f"run {self.runstore.location.url}: giving the lease back failed ({_error_code(err)}); it "
                          f"lapses {self.ttl_s:.0f} s after its last renewal")


# -- a worker's copy of a run -------------------------------------------------------------------

def local_copy(project: Path, location: RunLocation) -> Path:
    """``<project>/reports/<run_id>``, where a worker keeps its copy of a run in object storage.

    A directory already there that is not a copy of ``location`` (its note under
    ``.runbook/runstore/`` names another location, or there is none) is never overwritten.

    Raises:
        UsageError: ``reports/<run_id>`` exists and is not this location's copy.
    """
    path = project / REPORTS_DIR / location.run_id
    note = project / STATE_DIR / COPIES_DIR / f"{location.run_id}.json"
    if path.exists() and any(path.iterdir()):
        try:
            mirrors = json.loads(note.read_text()).get("location")
        except (OSError, ValueError):
            mirrors = None
        if mirrors != location.url:
            raise UsageError(f"{path} exists and is not a copy of {location.url} "
                             f"({'it mirrors ' + str(mirrors) if mirrors else 'a run of this worker'}); move it "
                             "away before working on the stored run here (nothing was changed)")
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text(json.dumps({"location": location.url}))
    (project / REPORTS_DIR).mkdir(exist_ok=True)
    return path


def pinned_here(state: RunState | None, providers: tuple[str, ...], project: Path, phase: str) -> None:
    """Refuse a phase of a migration that runs on the ``local`` provider anywhere but the worker
    (host and project directory) that pushed the run before: its pods are processes there.

    Raises:
        UsageError: such a phase on another worker (exit 2; nothing ran).
    """
    if state is None or "local" not in providers or not state.worker:
        return
    here = worker_identity(project)
    there = state.worker
    if (there.get("host"), there.get("project")) != (here["host"], here["project"]):
        raise UsageError(f"phase {phase}: this migration runs on the local provider, whose pods and endpoints are "
                         f"processes on {there.get('host')} under {there.get('project')}/.runbook/local; this worker "
                         f"({here['host']}, {here['project']}) cannot reach them. Run every phase of a local migration "
                         "on the worker that ran phase 01 (an Airflow DAG pins its tasks to one queue), or migrate "
                         "between remote providers (Runpod, Vast.ai), whose machines every worker reaches")


@contextmanager
def worked_on(location: RunLocation, project: Path, *, phase: str, providers: tuple[str, ...], store: Any = None,
              ttl_s: float = LEASE_TTL_S, echo: Callable[[str], None] = print) -> Iterator[StoredRun]:
    """Work on a stored run for ``phase``: its lease taken, its last push pulled into
    :func:`local_copy` and checked (:func:`pinned_here`); yields a :class:`StoredRun` whose
    :meth:`~StoredRun.push` the caller calls after each phase (and after a seal); the lease is
    given back on exit, whatever happened.

    Raises:
        UsageError: the run is leased by another worker, the local copy's place is taken, or a
            local migration's phase is on another worker. StorageError: the pull found a file
            that differs from the run's state.
    """
    runstore = RunStore(location, store)
    worker = worker_identity(project)
    with runstore.lease(phase=phase, worker=worker, ttl_s=ttl_s, echo=echo) as lease:
        path = local_copy(project, location)
        state = runstore.state()
        pinned_here(state, providers, project, phase)
        runstore.pull(path, state)
        if state is not None:
            read_chain(path)  # every record linked to the one before, every file it lists as it recorded it
        yield StoredRun(runstore, lease, path, state, worker)


@dataclass
class StoredRun:
    """A stored run as one worker holds it: its local copy ``path`` and the state last pulled or
    pushed, under ``lease``."""

    runstore: RunStore
    lease: Lease
    path: Path
    state: RunState | None
    worker: dict[str, Any]

    def require_run(self, doing: str) -> None:
        """Refuse ``doing`` (``phase 02``, ``resolve``) on a location nothing was pushed to.

        Raises:
            UsageError: no push yet (exit 2; nothing ran).
        """
        if self.state is None:
            raise UsageError(f"{self.runstore.location.url} holds no run, so {doing} cannot run there: nothing was "
                             "pushed to it. Check the bucket, prefix and run id, or start the run with `runbook phase "
                             "01 PARAMS LOCATION`")

    def push(self, phase: str, status: str) -> RunState:
        """Push the local copy as the run's next state (:meth:`RunStore.push`).

        Raises:
            EvidenceError: the lease was lost, or another worker pushed meanwhile.
        """
        if self.lease.lost:
            raise EvidenceError(f"run {self.runstore.location.url}: {self.lease.lost} while phase {phase} ran; its "
                                "files stay on this worker and are not the run's. Run the phase again")
        self.state = self.runstore.push(self.path, after=self.state, phase=phase, status=status, worker=self.worker)
        return self.state


def pull_for_reading(location: RunLocation, dest: Path, store: Any = None) -> RunState:
    """Pull a stored run into ``dest`` to read it (``runbook verify``, ``list``, ``report``): no
    lease, the last completed push only.

    Raises:
        UsageError: the location holds no run (no push yet). StorageError: as :meth:`RunStore.pull`.
    """
    state = RunStore(location, store).pull(dest)
    if state is None:
        raise UsageError(f"{location.url} holds no run: nothing was pushed there (check the bucket, prefix and run id)")
    return state


def stored_runs(base_url: str, store: Any = None) -> list[RunLocation]:
    """Every run under ``s3://bucket[/base]`` that has a pushed state, by run id."""
    store = store if store is not None else open_base(base_url)
    ids = {k.split("/")[1] for k in store.list(CONTROL) if k.endswith("/" + STATE_KEY) and k.count("/") == 2}
    return [RunLocation.under(base_url, i) for i in sorted(ids)]
