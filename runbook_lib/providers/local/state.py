"""The local provider's state directory: one record per pod or endpoint, and its disks and log.

Under ``<root>/pods/<id>/``: ``pod.json`` (the resource's record, written atomically, so a
concurrent reader sees one state or the other), ``container/`` (its container disk), ``volume/``
(survives stop), ``log.txt`` (what its processes print) and ``exit.json`` (the exit record the
leader process writes, :mod:`runbook_lib.providers.local.pod`).
"""

from __future__ import annotations

import json
import secrets as _secrets
from pathlib import Path
from typing import Any, Callable

from runbook_lib.errors import NotFound
from runbook_lib.evidence.manifest import write_json_atomic
from runbook_lib.providers.base import Endpoint, EndpointSpec, Pod, PodSpec
from runbook_lib.providers.local import procs

PROVIDER = "local"


class StateDir:
    """The records of every local pod and endpoint under ``root`` (one per machine, shared by runs).

    Args:
        root: the state directory (``<root>/pods`` is created).
        clock: wall clock in epoch seconds (injected for tests).
    """

    def __init__(self, root: Path, clock: Callable[[], float]) -> None:
        self.root = root
        self.clock = clock
        (root / "pods").mkdir(parents=True, exist_ok=True)

    def dir(self, rid: str) -> Path:
        """The directory of resource ``rid`` (it may not exist)."""
        return self.root / "pods" / rid

    def read(self, rid: str) -> dict[str, Any]:
        """The record of ``rid`` as last saved.

        Raises:
            NotFound: no record: never created here, or already wiped.
        """
        try:
            return dict(json.loads((self.dir(rid) / "pod.json").read_text()))
        except FileNotFoundError:
            raise NotFound(f"no local pod or endpoint {rid!r} under {self.root}", provider=PROVIDER,
                           resource_id=rid) from None

    def save(self, rid: str, meta: dict[str, Any]) -> None:
        """Write the record of ``rid`` atomically."""
        write_json_atomic(self.dir(rid) / "pod.json", meta)

    def new(self, kind: str, spec: PodSpec | EndpointSpec, **extra: Any) -> dict[str, Any]:
        """Create a ``kind`` (``pod`` or ``endpoint``) resource's directories and record it, in
        state CREATED, before anything is started or waited on; returns the record."""
        rid = f"{'pod' if kind == 'pod' else 'ep'}-{_secrets.token_hex(4)}"
        d = self.dir(rid)
        (d / "container").mkdir(parents=True)
        (d / "volume").mkdir()
        meta = {"id": rid, "kind": kind, "name": spec.name, "labels": dict(spec.labels),
                "price_usd_per_hour": spec.price_usd_per_hour, "created_at": self.clock(),
                "secret_names": [k for k, _ in spec.secret_refs], "state": "CREATED", "pid": None, **extra}
        self.save(rid, meta)
        return meta

    def refresh(self, meta: dict[str, Any]) -> dict[str, Any]:
        """A RUNNING resource whose leader has exited becomes EXITED with the exit record the
        leader wrote; a leader killed by a signal writes none (``exit_code`` None, said in
        ``status_detail``). Saved when it changes."""
        if meta["state"] == "RUNNING" and meta.get("pid") and not procs.leader_running(meta.get("pid"),
                                                                                       meta.get("pid_create_time")):
            try:
                ex = json.loads((self.dir(meta["id"]) / "exit.json").read_text())
            except FileNotFoundError:
                ex = {"detail": "exited without an exit record: killed by a signal, or the machine restarted"}
            meta.update(state="EXITED", exit_code=ex.get("exit_code"), ended_at=ex.get("ended_at", self.clock()),
                        status_detail=ex.get("detail", f"exited with code {ex.get('exit_code')}"))
            self.save(meta["id"], meta)
        return meta

    def pod(self, meta: dict[str, Any]) -> Pod:
        """The pod a record describes."""
        d = self.dir(meta["id"])
        return Pod(meta["id"], meta["name"], meta["state"], meta["labels"], meta["price_usd_per_hour"],
                   meta["created_at"], meta.get("ended_at"), meta.get("exit_code"),
                   str(d / "volume"), str(d / "container"), status_detail=meta.get("status_detail", ""),
                   host=dict(meta.get("host") or {}))

    def endpoint(self, meta: dict[str, Any]) -> Endpoint:
        """The endpoint a record describes."""
        return Endpoint(meta["id"], meta["name"], meta["state"], meta.get("url", ""), meta["workers"],
                        meta["labels"], meta["price_usd_per_hour"], meta["created_at"], meta.get("ended_at"),
                        mode=meta.get("mode", "queue"))

    def get(self, rid: str) -> Pod | Endpoint:
        """``rid`` as it is now (:meth:`refresh` first).

        Raises:
            NotFound: no record of ``rid``.
        """
        meta = self.refresh(self.read(rid))
        return self.endpoint(meta) if meta["kind"] == "endpoint" else self.pod(meta)

    def list(self, labels: dict[str, str]) -> list[Pod | Endpoint]:
        """Every recorded resource (any state) whose labels include ``labels``; a record removed
        while the directory is read is simply not listed."""
        out: list[Pod | Endpoint] = []
        for f in sorted((self.root / "pods").glob("*/pod.json")):
            try:
                meta = json.loads(f.read_text())
                if all(meta["labels"].get(k) == v for k, v in labels.items()):
                    out.append(self.get(meta["id"]))
            except (FileNotFoundError, NotFound):
                continue
        return out

    def log_tail(self, rid: str, n_bytes: int) -> str:
        """The last ``n_bytes`` of ``rid``'s combined stdout/stderr ("" when it has no log)."""
        try:
            return (self.dir(rid) / "log.txt").read_text(errors="replace")[-n_bytes:]
        except FileNotFoundError:
            return ""
