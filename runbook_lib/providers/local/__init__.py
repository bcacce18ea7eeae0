"""The embedded local provider: pods and endpoint workers are real OS processes on this machine.

A pod gets ``<root>/pods/<id>/container`` (its container disk, wiped on stop and destroy),
``<root>/pods/<id>/volume`` (survives stop, removed on destroy), an injected environment, a
device and a price. Pods are started in their own session so they outlive the notebook kernel
that launched them, as real pods do; :meth:`LocalProvider.list` finds them again by label.

An endpoint is a front-door process that holds the job queue and serves the job API on
127.0.0.1, plus ``workers`` worker processes that each load the model once
(:mod:`runbook_lib.providers.local.endpoint`).
"""

from __future__ import annotations

import json
import os
import secrets as _secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from runbook_lib import secret_refs as _secret_refs
from runbook_lib.errors import NotFound, ProviderError, ProviderTimeout
from runbook_lib.layout import POD_DEVICE_ENV
from runbook_lib.manifest import write_json_atomic
from runbook_lib.providers.api import KeySource
from runbook_lib.providers.base import (
    Capabilities,
    Capability,
    Endpoint,
    EndpointSpec,
    Plan,
    Pod,
    PodSpec,
    Provider,
    payload_capabilities,
)
from runbook_lib.providers.local import procs
from runbook_lib.providers.offers import Offer

ENDPOINT_READY_TIMEOUT_S = 120.0  # front door must publish its port within this, seconds


def _leader_running(meta: dict[str, Any]) -> bool:
    """True while the resource's leader process (the one spawned at launch) runs. Identified by
    pid *and* creation time, so a pid reused by another process after the leader was reaped
    reads as not running."""
    import psutil

    pid, created = meta.get("pid"), meta.get("pid_create_time")
    if not pid or created is None:  # never started, or exited before it could be identified
        return False
    try:
        p = psutil.Process(pid)
        if abs(p.create_time() - created) > 0.01:
            return False  # the pid now names another process
    except psutil.NoSuchProcess:
        return False
    if procs.running(p):
        return True
    procs.reap(pid)  # our exited child (the kernel that launched it): collect it, leave no zombie
    return False


class LocalProvider(Provider):
    """Local pods and endpoints under ``root``.

    Args:
        root: state directory (``.runbook/local`` by default); one per machine, shared by runs.
        clock: wall clock in epoch seconds (injected for tests).
        python: interpreter used for pod and worker processes.
        term_grace_s: on stop and destroy, seconds between SIGTERM and SIGKILL.
        on_teardown_step: called as ``(step, pids)`` at each step of stopping a resource's
            processes (``listed``, ``signalled``, ``killed``); lets a test make processes exit at
            exactly those moments.

    Stop and destroy find a resource's processes by the marker in their environment, never by a
    pid kept on disk, and treat a process that exits at any moment of the teardown as stopped
    (:mod:`runbook_lib.providers.local.procs`).
    """

    name = "local"

    def __init__(
        self,
        *,
        root: str | Path = ".runbook/local",
        clock: Callable[[], float] = time.time,
        python: str = sys.executable,
        term_grace_s: float = procs.TERM_GRACE_S,
        on_teardown_step: procs.StepHook | None = None,
        offers: tuple[Any, ...] = (),
    ) -> None:
        self.root = Path(root).resolve()
        (self.root / "pods").mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self._python = python
        self._term_grace_s = term_grace_s
        self._on_step = on_teardown_step
        self._offers = tuple(offers)
        self._withdrawn: set[str] = set()

    # -- offers ------------------------------------------------------------------------------

    def search_offers(self, req: Any, *, ports: int = 0) -> list[Offer]:
        """The profile's machines (``offers``, :class:`runbook_lib.params.LocalOffer`) as offers:
        no GPUs, loopback ports without limit, region ``local``; less those withdrawn
        (:meth:`withdraw_offer`). ``req`` is applied by the caller
        (:func:`runbook_lib.providers.offers.filter_offers`), as for every provider.

        Raises:
            ProviderError: the profile declares no offers (the side is this one machine).
        """
        if not self._offers:
            return super().search_offers(req, ports=ports)
        return [Offer(provider=self.name, offer_id=o.offer_id, gpu_name="", gpu_name_raw="", gpu_count=0, vram_mib=0,
                      vcpu=float(o.vcpu), ram_gib=float(o.ram_gib), disk_gb=float(o.disk_gb), cuda_max="",
                      usd_per_hour=float(o.usd_per_hour), interruptible_usd_per_hour=None, storage_usd_per_gb_month=0.0,
                      egress_usd_per_gb=0.0, region="local", reliability=None, availability="listed")
                for o in self._offers if o.offer_id not in self._withdrawn]

    def withdraw_offer(self, offer_id: str) -> None:
        """Take ``offer_id`` off this provider's later searches (the ``preferred_offer_removed``
        drill: a machine is no longer available). Nothing running is touched.

        Raises:
            ProviderError: no offer of the profile has that id.
        """
        known = [o.offer_id for o in self._offers]
        if offer_id not in known:
            raise ProviderError(f"cannot withdraw offer {offer_id!r}: the profile's offers are {known}", provider=self.name)
        self._withdrawn.add(offer_id)

    # -- declared capabilities ---------------------------------------------------------------

    def capabilities(self) -> Capabilities:
        import torch

        gpu = torch.cuda.is_available()
        return Capabilities(
            provider=self.name,
            udp=Capability(True, "loopback sockets, any protocol"),
            docker_compose=Capability(False, "pods are plain processes, not containers", "runbook_lib.providers.local"),
            privileged=Capability(False, "pods run as the invoking user"),
            persistent_volume=Capability(True, "volume directory survives stop, removed on destroy"),
            max_request_s=None,
            gpu=Capability(gpu, f"{torch.cuda.device_count()} CUDA device(s)" if gpu else "CPU only on this host"),
            billing="per second, from params price_usd_per_hour",
            queue_endpoints=Capability(True, "a local front door with a job queue and worker processes",
                                       "runbook_lib/providers/local/endpoint.py"),
            load_balancing=Capability(True, "one worker process serving its own HTTP port on loopback",
                                      "runbook_lib/providers/local/endpoint.py"),
            restart=Capability(False, "a stopped local pod's process is gone; its volume is kept for a new pod"),
            lifecycle="stop ends the processes and keeps the volume directory; no restart (launch a new pod); "
                      "never interrupted",
            network="loopback ports, any protocol, no proxy",
            extra=payload_capabilities(queue=True, load_balancing=True),
        )

    # -- plans -------------------------------------------------------------------------------

    def plan_launch(self, spec: PodSpec, *, dry_run: bool = False) -> Plan:  # the local provider never dry-runs
        return Plan(self.name, "launch_pod", spec.name, spec, spec.price_usd_per_hour, dry_run)

    def plan_destroy(self, resource_id: str, *, dry_run: bool = False) -> Plan:
        return Plan(self.name, "destroy", resource_id, None, 0.0, dry_run)

    # -- state files -------------------------------------------------------------------------

    def _dir(self, rid: str) -> Path:
        return self.root / "pods" / rid

    def _meta(self, rid: str) -> dict[str, Any]:
        try:
            return dict(json.loads((self._dir(rid) / "pod.json").read_text()))
        except FileNotFoundError:
            raise NotFound(f"no local pod or endpoint {rid!r} under {self.root}", provider=self.name,
                           resource_id=rid) from None

    def _save(self, rid: str, meta: dict[str, Any]) -> None:
        write_json_atomic(self._dir(rid) / "pod.json", meta)

    def _spawn(self, rid: str, argv: list[str], env_pairs: tuple[tuple[str, str], ...],
               secret_refs: tuple[tuple[str, str], ...]) -> dict[str, Any]:
        """Start the resource's leader process in its own session; returns ``pid`` and
        ``pid_create_time`` (None when it already exited: it cannot be mistaken for another)."""
        import psutil

        d = self._dir(rid)
        env = {k: v for k, v in os.environ.items() if not _is_ambient_secret(k)}
        env.update(dict(env_pairs))
        env.update(_secret_refs.resolve_refs(secret_refs))  # resolved now, injected, never written to disk
        env[procs.MARKER_ID] = rid  # with the volume path, the marker that finds its processes
        env[procs.MARKER_DIR] = str(d / "volume")
        env["PYTHONUNBUFFERED"] = "1"
        log = open(d / "log.txt", "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(
            [self._python, "-m", "runbook_lib.providers.local.pod", str(d), *argv],
            cwd=d / "container", env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        log.close()
        procs.adopt(proc)
        try:
            created: float | None = psutil.Process(proc.pid).create_time()
        except psutil.NoSuchProcess:
            created = None
        return {"pid": proc.pid, "pid_create_time": created}

    def _new(self, kind: str, spec: PodSpec | EndpointSpec, **extra: Any) -> dict[str, Any]:
        """Create the resource's directories and record it before anything is started or waited on."""
        rid = f"{'pod' if kind == 'pod' else 'ep'}-{_secrets.token_hex(4)}"
        d = self._dir(rid)
        (d / "container").mkdir(parents=True)
        (d / "volume").mkdir()
        meta = {"id": rid, "kind": kind, "name": spec.name, "labels": dict(spec.labels),
                "price_usd_per_hour": spec.price_usd_per_hour, "created_at": self._clock(),
                "secret_names": [k for k, _ in spec.secret_refs], "state": "CREATED", "pid": None, **extra}
        self._save(rid, meta)
        return meta

    def _launch(self, spec: PodSpec) -> Pod:
        meta = self._new("pod", spec, device=spec.device, command=list(spec.command),
                         env_names=[k for k, _ in spec.env])
        rid = meta["id"]
        meta.update(self._spawn(rid, list(spec.command), spec.env + ((POD_DEVICE_ENV, spec.device),),
                                spec.secret_refs))
        meta["state"] = "RUNNING"
        self._save(rid, meta)
        return self._pod(meta)

    def _create_endpoint(self, spec: EndpointSpec) -> Endpoint:
        lb = spec.mode == "load_balancing"
        meta = self._new("endpoint", spec, workers=1 if lb else spec.workers, side=spec.side, url="", mode=spec.mode)
        rid = meta["id"]
        d = self._dir(rid)
        if lb:  # one worker serving its own port: the URL answers once the model is loaded
            argv = ["-m", "runbook_lib.providers.local.endpoint", "direct", "--params", spec.params_path,
                    "--side", spec.side, "--host", "127.0.0.1", "--port", "0", "--port-file", str(d / "port"),
                    "--execution-timeout-s", str(spec.execution_timeout_s)]
        else:
            argv = ["-m", "runbook_lib.providers.local.endpoint", "serve", "--params", spec.params_path,
                    "--side", spec.side, "--workers", str(spec.workers), "--port-file", str(d / "port"),
                    "--execution-timeout-s", str(spec.execution_timeout_s), "--ttl-s", str(spec.ttl_s),
                    "--idle-timeout-s", str(spec.idle_timeout_s)]
            if spec.active_workers is not None:
                argv += ["--active-workers", str(spec.active_workers)]
        meta.update(self._spawn(rid, [self._python, *argv], spec.env, spec.secret_refs))
        meta["state"] = "RUNNING"
        self._save(rid, meta)
        deadline = time.monotonic() + ENDPOINT_READY_TIMEOUT_S
        while not (d / "port").exists():
            if not _leader_running(meta):
                tail = (d / "log.txt").read_text(errors="replace")[-2000:]
                raise ProviderError(f"endpoint {rid} front door exited before serving; log tail:\n{tail}",
                                    provider=self.name, resource_id=rid)
            if time.monotonic() > deadline:
                raise ProviderTimeout(f"endpoint {rid} did not publish its port within {ENDPOINT_READY_TIMEOUT_S} s",
                                      provider=self.name, resource_id=rid)
            time.sleep(0.02)
        meta["url"] = f"http://127.0.0.1:{(d / 'port').read_text().strip()}"
        self._save(rid, meta)
        return self._endpoint(meta)

    def _stop_processes(self, rid: str) -> dict[str, Any]:
        """Stop every process of ``rid``; a process gone at any step counts as stopped.

        Raises:
            ProviderError: a process survived SIGKILL within the bounded wait (named by pid).
        """
        rec = procs.stop(rid, str(self._dir(rid) / "volume"), term_grace_s=self._term_grace_s, hook=self._on_step)
        if rec.survivors:
            raise ProviderError(f"local {rid}: processes {rec.survivors} still run after SIGTERM, {self._term_grace_s} "
                                f"s, SIGKILL and {procs.KILL_WAIT_S} s (found {rec.found}); check them with `ps` and "
                                "run the teardown again", provider=self.name, resource_id=rid)
        return rec.to_dict()

    def _stop(self, rid: str) -> dict[str, Any]:
        meta = self._meta(rid)
        if meta["state"] in ("STOPPED", "DESTROYED"):
            return {"note": f"already {meta['state'].lower()}"}
        procs = self._stop_processes(rid)
        shutil.rmtree(self._dir(rid) / "container", ignore_errors=True)
        (self._dir(rid) / "container").mkdir(exist_ok=True)
        meta.update(state="STOPPED", ended_at=meta.get("ended_at") or self._clock())
        meta.setdefault("teardowns", []).append({"action": "stop", "processes": procs})
        self._save(rid, meta)
        return {"processes": procs, "container_disk": "wiped", "volume": "kept"}

    def _destroy(self, rid: str) -> dict[str, Any]:
        try:
            meta = self._meta(rid)
        except NotFound:
            return {"note": "no record: never existed here, or already wiped"}
        if meta["state"] == "DESTROYED":
            return {"note": "already destroyed"}
        procs = self._stop_processes(rid)  # a stopped pod has none left; listing again costs little
        for sub in ("container", "volume"):
            shutil.rmtree(self._dir(rid) / sub, ignore_errors=True)
        meta.update(state="DESTROYED", ended_at=meta.get("ended_at") or self._clock())
        meta.setdefault("teardowns", []).append({"action": "destroy", "processes": procs})
        self._save(rid, meta)
        return {"processes": procs, "container_disk": "removed", "volume": "removed"}

    # -- reads -------------------------------------------------------------------------------

    def _refresh(self, meta: dict[str, Any]) -> dict[str, Any]:
        """A RUNNING resource whose leader has exited becomes EXITED with the exit record the
        leader wrote; a leader killed by a signal writes none (``exit_code`` None, said in
        ``status_detail``). Written atomically, so a concurrent reader sees one state or the other."""
        if meta["state"] == "RUNNING" and meta.get("pid") and not _leader_running(meta):
            try:
                ex = json.loads((self._dir(meta["id"]) / "exit.json").read_text())
            except FileNotFoundError:
                ex = {"detail": "exited without an exit record: killed by a signal, or the machine restarted"}
            meta.update(state="EXITED", exit_code=ex.get("exit_code"), ended_at=ex.get("ended_at", self._clock()),
                        status_detail=ex.get("detail", f"exited with code {ex.get('exit_code')}"))
            self._save(meta["id"], meta)
        return meta

    def _pod(self, meta: dict[str, Any]) -> Pod:
        d = self._dir(meta["id"])
        return Pod(meta["id"], meta["name"], meta["state"], meta["labels"], meta["price_usd_per_hour"],
                   meta["created_at"], meta.get("ended_at"), meta.get("exit_code"),
                   str(d / "volume"), str(d / "container"), status_detail=meta.get("status_detail", ""))

    def _endpoint(self, meta: dict[str, Any]) -> Endpoint:
        return Endpoint(meta["id"], meta["name"], meta["state"], meta.get("url", ""), meta["workers"],
                        meta["labels"], meta["price_usd_per_hour"], meta["created_at"], meta.get("ended_at"),
                        mode=meta.get("mode", "queue"))

    def get(self, resource_id: str) -> Pod | Endpoint:
        meta = self._refresh(self._meta(resource_id))
        return self._endpoint(meta) if meta["kind"] == "endpoint" else self._pod(meta)

    def list(self, *, labels: dict[str, str]) -> list[Pod | Endpoint]:
        out: list[Pod | Endpoint] = []
        for f in sorted((self.root / "pods").glob("*/pod.json")):
            try:  # a record is written atomically; one removed under us is simply not listed
                meta = json.loads(f.read_text())
                if all(meta["labels"].get(k) == v for k, v in labels.items()):
                    out.append(self.get(meta["id"]))
            except (FileNotFoundError, NotFound):
                continue
        return out

    def log_tail(self, resource_id: str, n_bytes: int = 4000) -> str:
        """Last ``n_bytes`` of a pod's combined stdout/stderr."""
        try:
            return (self._dir(resource_id) / "log.txt").read_text(errors="replace")[-n_bytes:]
        except FileNotFoundError:
            return ""

    def wait_exit(self, resource_id: str, *, timeout_s: float, finished: Callable[[], bool] | None = None,
                  poll_s: float = 0.1, sleep: Callable[[float], None] = time.sleep) -> Pod:
        """Wait until a pod has exited, or ``finished()`` says its work is done.

        Raises:
            ProviderTimeout: still running after ``timeout_s`` seconds.
            ProviderError: ``resource_id`` is an endpoint (endpoints do not exit).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            pod = self.get(resource_id)
            if not isinstance(pod, Pod):
                raise ProviderError(f"{resource_id} is an endpoint; only pods exit", provider=self.name,
                                    resource_id=resource_id)
            if pod.state != "RUNNING" or (finished is not None and finished()):
                return pod
            if time.monotonic() > deadline:
                raise ProviderTimeout(f"pod {resource_id} still running after {timeout_s} s; log tail:\n"
                                      f"{self.log_tail(resource_id, 1500)}", provider=self.name,
                                      resource_id=resource_id)
            sleep(poll_s)


def _is_ambient_secret(name: str) -> bool:
    """Credentials in the operator's environment are not inherited by pods: only the secrets a
    profile names are injected (scoped credentials)."""
    return bool(_secret_refs.CREDENTIAL_WORDS & set(name.upper().split("_")))


def default_key(ref: str = "") -> KeySource:
    """The local provider rents nothing and takes no API key.

    Raises:
        ProviderError: always; a local profile has no ``api_key_ref``.
    """
    raise ProviderError("the local provider takes no API key (it rents nothing): a local profile has no api_key_ref",
                        provider="local")


def create(*, root: str | Path = ".runbook/local", profile: Any = None, **kwargs: Any) -> LocalProvider:
    """Registry factory: ``profile`` (a :class:`runbook_lib.params.LocalProfile`, or None) gives
    the machines the provider offers."""
    return LocalProvider(root=root, offers=tuple(getattr(profile, "offers", ())), **kwargs)
