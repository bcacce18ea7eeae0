"""What creates, stops and destroys local pods and endpoints: real OS processes on this machine.

A pod's leader process runs its command (:mod:`runbook_lib.providers.local.pod`) in its own
session, so it outlives the notebook kernel that launched it, as real pods do. An endpoint's
leader is a front door holding the job queue and serving the job API on 127.0.0.1, with
``workers`` worker processes that each load the model once, or (``load_balancing``) one worker
serving its own port (:mod:`runbook_lib.providers.local.endpoint`).

Stop and destroy find a resource's processes by the marker in their environment, never by a pid
kept on disk, and treat a process that exits at any moment of the teardown as stopped
(:mod:`runbook_lib.providers.local.procs`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Any

from runbook_lib import secret_refs as _secret_refs
from runbook_lib._http import free_port as free_port  # re-exported: the simulators and tests import it here
from runbook_lib.errors import NotFound, ProviderError, ProviderTimeout
from runbook_lib.layout import POD_DEVICE_ENV
from runbook_lib.providers.base import Endpoint, EndpointSpec, Lifecycle, Pod, PodSpec
from runbook_lib.providers.local import procs
from runbook_lib.providers.local.state import PROVIDER, StateDir

ENDPOINT_READY_TIMEOUT_S = 120.0  # front door must publish its port within this, seconds
ENDPOINT_MODULE = "runbook_lib.providers.local.endpoint"


def _is_ambient_secret(name: str) -> bool:
    """Credentials in the operator's environment are not inherited by pods: only the secrets a
    profile names are injected (scoped credentials)."""
    return bool(_secret_refs.CREDENTIAL_WORDS & set(name.upper().split("_")))


RUNBOOK_ENV_PREFIX = "RUNBOOK_"
"""The runbook's own variables; a service pod inherits and is given none of them."""


def endpoint_argv(spec: EndpointSpec, port_file: str) -> list[str]:
    """The endpoint module's arguments for ``spec``: a front door with ``spec.workers`` workers
    (``queue``), or one worker serving its own port on loopback (``load_balancing``); either
    writes the port it listens on to ``port_file``."""
    if spec.mode == "load_balancing":  # one worker serving its own port: it answers once the model is loaded
        return ["-m", ENDPOINT_MODULE, "direct", "--params", spec.params_path, "--side", spec.side,
                "--host", "127.0.0.1", "--port", "0", "--port-file", port_file,
                "--execution-timeout-s", str(spec.execution_timeout_s)]
    argv = ["-m", ENDPOINT_MODULE, "serve", "--params", spec.params_path, "--side", spec.side,
            "--workers", str(spec.workers), "--port-file", port_file,
            "--execution-timeout-s", str(spec.execution_timeout_s), "--ttl-s", str(spec.ttl_s),
            "--idle-timeout-s", str(spec.idle_timeout_s)]
    if spec.active_workers is not None:
        argv += ["--active-workers", str(spec.active_workers)]
    return argv


class LocalLifecycle(Lifecycle):
    """Local pods and endpoints as processes, recorded in ``state``.

    Args:
        state: the provider's state directory.
        python: interpreter used for pod and worker processes.
        term_grace_s: on stop and destroy, seconds between SIGTERM and SIGKILL.
        on_step: called as ``(step, pids)`` at each step of stopping a resource's processes
            (``listed``, ``signalled``, ``killed``); lets a test make processes exit at exactly
            those moments.
    """

    def __init__(self, state: StateDir, *, python: str, term_grace_s: float, on_step: procs.StepHook | None) -> None:
        self.state = state
        self.python = python
        self.term_grace_s = term_grace_s
        self.on_step = on_step

    def _spawn(self, rid: str, argv: list[str], env_pairs: tuple[tuple[str, str], ...],
               secret_refs: tuple[tuple[str, str], ...], *, service: bool = False) -> dict[str, Any]:
        """Start the resource's leader process in its own session; returns ``pid`` and
        ``pid_create_time`` (None when it already exited: it cannot be mistaken for another).
        A ``service`` pod inherits none of the runbook's own ``RUNBOOK_*`` variables."""
        import psutil

        d = self.state.dir(rid)
        env = {k: v for k, v in os.environ.items()
               if not _is_ambient_secret(k) and not (service and k.startswith(RUNBOOK_ENV_PREFIX))}
        env.update(dict(env_pairs))
        env.update(_secret_refs.resolve_refs(secret_refs))  # resolved now, injected, never written to disk
        env[procs.MARKER_ID] = rid  # with the volume path, the marker that finds its processes
        env[procs.MARKER_DIR] = str(d / "volume")
        env["PYTHONUNBUFFERED"] = "1"
        log = open(d / "log.txt", "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(
            [self.python, "-m", "runbook_lib.providers.local.pod", str(d), *argv],
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

    def launch(self, spec: PodSpec) -> Pod:
        """Record the pod, then run ``spec.command`` as its leader with ``spec.env``, the resolved
        ``spec.secret_refs`` and ``RUNBOOK_DEVICE``. A ``spec.service`` pod gets no ``RUNBOOK_*``
        variable; ``{port}`` in its command becomes a free loopback port, published as
        ``spec.ports[0]`` (the pod's ``host["ports"]``), as a container runtime maps a port."""
        command = list(spec.command)
        host: dict[str, Any] = {}
        if spec.service:
            port = free_port()
            command = [a.replace("{port}", str(port)) for a in command]
            host = {"image": spec.image, "stand_in": True, "command": command,
                    "env_names": sorted({k for k, _ in spec.env} | {k for k, _ in spec.secret_refs}),
                    "ports": {p: f"127.0.0.1:{port}" for p in spec.ports[:1]}}
        meta = self.state.new("pod", spec, device=spec.device, command=command,
                              env_names=[k for k, _ in spec.env], host=host)
        rid = meta["id"]
        env = spec.env if spec.service else spec.env + ((POD_DEVICE_ENV, spec.device),)
        meta.update(self._spawn(rid, command, env, spec.secret_refs, service=spec.service))
        meta["state"] = "RUNNING"
        self.state.save(rid, meta)
        return self.state.pod(meta)

    def create_endpoint(self, spec: EndpointSpec) -> Endpoint:
        """Record the endpoint, start its leader and wait until it publishes its port (its URL).

        Raises:
            ProviderError: the leader exited before serving (the message has its log tail).
            ProviderTimeout: no port within :data:`ENDPOINT_READY_TIMEOUT_S` seconds.
        """
        lb = spec.mode == "load_balancing"
        meta = self.state.new("endpoint", spec, workers=1 if lb else spec.workers, side=spec.side, url="",
                              mode=spec.mode)
        rid = meta["id"]
        d = self.state.dir(rid)
        argv = endpoint_argv(spec, str(d / "port"))
        meta.update(self._spawn(rid, [self.python, *argv], spec.env, spec.secret_refs))
        meta["state"] = "RUNNING"
        self.state.save(rid, meta)
        deadline = time.monotonic() + ENDPOINT_READY_TIMEOUT_S
        while not (d / "port").exists():
            if not procs.leader_running(meta.get("pid"), meta.get("pid_create_time")):
                tail = self.state.log_tail(rid, 2000)
                raise ProviderError(f"endpoint {rid} front door exited before serving; log tail:\n{tail}",
                                    provider=PROVIDER, resource_id=rid)
            if time.monotonic() > deadline:
                raise ProviderTimeout(f"endpoint {rid} did not publish its port within {ENDPOINT_READY_TIMEOUT_S} s",
                                      provider=PROVIDER, resource_id=rid)
            time.sleep(0.02)
        meta["url"] = f"http://127.0.0.1:{(d / 'port').read_text().strip()}"
        self.state.save(rid, meta)
        return self.state.endpoint(meta)

    def _stop_processes(self, rid: str) -> dict[str, Any]:
        """Stop every process of ``rid``; a process gone at any step counts as stopped.

        Raises:
            ProviderError: a process survived SIGKILL within the bounded wait (named by pid).
        """
        rec = procs.stop(rid, str(self.state.dir(rid) / "volume"), term_grace_s=self.term_grace_s, hook=self.on_step)
        if rec.survivors:
            raise ProviderError(f"local {rid}: processes {rec.survivors} still run after SIGTERM, {self.term_grace_s} "
                                f"s, SIGKILL and {procs.KILL_WAIT_S} s (found {rec.found}); check them with `ps` and "
                                "run the teardown again", provider=PROVIDER, resource_id=rid)
        return rec.to_dict()

    def stop(self, resource_id: str) -> dict[str, Any]:
        """End the processes and wipe the container disk; the volume is kept.

        Raises:
            NotFound: no record of ``resource_id``. ProviderError: a process survived SIGKILL.
        """
        meta = self.state.read(resource_id)
        if meta["state"] in ("STOPPED", "DESTROYED"):
            return {"note": f"already {meta['state'].lower()}"}
        stopped = self._stop_processes(resource_id)
        container = self.state.dir(resource_id) / "container"
        shutil.rmtree(container, ignore_errors=True)
        container.mkdir(exist_ok=True)
        meta.update(state="STOPPED", ended_at=meta.get("ended_at") or self.state.clock())
        meta.setdefault("teardowns", []).append({"action": "stop", "processes": stopped})
        self.state.save(resource_id, meta)
        return {"processes": stopped, "container_disk": "wiped", "volume": "kept"}

    def start(self, resource_id: str) -> None:
        """A stopped local pod's processes are gone and are not started again.

        Raises:
            ProviderError: always (``capabilities().restart`` says so; launch a new pod).
        """
        raise ProviderError(f"{PROVIDER} cannot start a stopped resource; launch a new one", provider=PROVIDER)

    def destroy(self, resource_id: str) -> dict[str, Any]:
        """End the processes and remove both disks; the record stays, DESTROYED.

        Raises:
            ProviderError: a process survived SIGKILL.
        """
        try:
            meta = self.state.read(resource_id)
        except NotFound:
            return {"note": "no record: never existed here, or already wiped"}
        if meta["state"] == "DESTROYED":
            return {"note": "already destroyed"}
        stopped = self._stop_processes(resource_id)  # a stopped pod has none left; listing again costs little
        for sub in ("container", "volume"):
            shutil.rmtree(self.state.dir(resource_id) / sub, ignore_errors=True)
        meta.update(state="DESTROYED", ended_at=meta.get("ended_at") or self.state.clock())
        meta.setdefault("teardowns", []).append({"action": "destroy", "processes": stopped})
        self.state.save(resource_id, meta)
        return {"processes": stopped, "container_disk": "removed", "volume": "removed"}
