"""The Vast.ai simulator: the fake API (``fake.py``) over HTTP, with a local process behind every
instance.

A created instance runs its ``args`` (``python`` is this interpreter) with its ``env`` (the
``-p`` port options excluded). Each ``-p`` port is mapped to a random free external port, as
Vast does (docs.vast.ai/guides/instances/connect/networking): the instance's ``ports`` map
answers it, and the process finds it in ``VAST_TCP_PORT_<port>`` and, since there is no
container network here, binds it through ``RUNBOOK_SIM_BIND_<port>``. ``actual_status``
follows the process in Vast's vocabulary
(``loading`` until it starts, ``running``, then ``exited`` with its exit code in ``status_msg``).
A stop ends the process and keeps the instance (and its disk, which still bills); a start runs
the command again; a delete destroys it. Under the ``create: outbid`` fault the instance is
outbid ``outbid_after_s`` (a simulator limit) after it starts running: its process is stopped
and it reads ``stopped`` with Vast's outbid ``status_msg``. Machine facts come from the offer it
was created on (``recorded/bundles_search_ondemand.json``). An instance created for an image
with a stand-in (:meth:`~runbook_lib.providers.simulator.MachineBacked.machine_command`) runs the
stand-in, told its first mapped port. See :mod:`runbook_lib.providers.simulator`.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
import uuid
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from runbook_lib.layout import POD_FAULT_ENV
from runbook_lib.providers.fixtures import load
from runbook_lib.providers.local.endpoint import BIND_ENV
from runbook_lib.providers.simulator import HOST, MachineBacked, free_port
from runbook_lib.providers.vast.fake import FakeApi
from runbook_lib.providers.vast.pyworker import signed_message
from runbook_lib.providers.vast.wire import docker_env

LIMITS: dict[str, float] = {"outbid_after_s": 3.0, "serverless_idle_s": 2.0}
"""The waits a test or user may set when the simulator starts (seconds), with their defaults:
``outbid_after_s``, how long after it starts running an instance created under the ``create:
outbid`` fault is outbid; ``serverless_idle_s``, how long a Serverless worker of an endpoint with
``min_load`` 0 may go without a routed request before the simulator's autoscaler stops it
(Vast.ai's engine decides that from its own load history, which nothing here models)."""

SCRIPTS: dict[str, frozenset[str]] = {
    "create": frozenset({"ok", "gone", "bid_fail", "rate", "created_then_502", "worker_crash", "outbid"}),
    "poll": frozenset({"null_status", "loading", "running", "exited_oci_error", "outbid_stopped"}),
    "search": frozenset({"ok", "rate"}),
    "workergroup": frozenset({"ok", "invalid", "worker_crash"}),
}
"""The operations a ``script`` may name and the answers each may serve
(:class:`runbook_lib.providers.fixtures.FixtureApi` describes them)."""

KEY_ENV = "VAST_API_KEY"  # where the adapter finds its key (runbook_lib.providers.vast.default_key)
KEY_PREFIX = "sim-vast-"  # a simulator key's prefix: evidence can be searched for it


def exports(url: str, key: str) -> dict[str, str]:
    """The environment that points the Vast.ai adapter at a simulator at ``url`` accepting ``key``."""
    return {"RUNBOOK_VAST_API_URL": url, "RUNBOOK_VAST_AUTOSCALER_URL": url, KEY_ENV: key}


def overrides(url: str) -> dict[str, str]:
    """A Vast.ai profile's params fields that point it at a simulator at ``url``."""
    return {"api_url": url, "autoscaler_url": url}


ROUTE_PATHS = ("/route/", "/pubkey/", "/get_endpoint_workers/")
"""The autoscaler's paths (``https://run.vast.ai`` on Vast.ai; the simulator's own URL here,
``autoscaler_url`` in params): served outside the lock, each with its own key check."""


class SimApi(MachineBacked, FakeApi):
    """Vast.ai's answers with real processes behind its instances (arguments: :class:`MachineBacked`).

    A Serverless workergroup's workers are machines too: each runs Vast's PyWorker
    (:mod:`runbook_lib.providers.vast.pyworker`: the adapter) in front of the template image's
    stand-in, ``max(1, cold_workers)`` of them (at most the endpoint's ``max_workers``), started
    when the workergroup is created and destroyed with it or its endpoint. They are not listed
    among the account's instances. The autoscaler (``/route/``) hands out an idle worker's URL
    with the simulator's RSA signature of it (``/pubkey/`` serves the key); a worker is
    ``loading`` until its PyWorker listens (it listens once its server answers its health check
    and it has the key), then ``idle``. An endpoint with ``min_load`` 0 scales to zero: a worker
    no request was routed to for ``serverless_idle_s`` (:data:`LIMITS`) is stopped (``stopped``,
    Vast.ai's Inactive), and a ``/route/`` of positive cost finding no worker up starts a stopped
    one, which loads as a new one does (docs.vast.ai "Worker states": Inactive is "created but
    stopped"; "Serverless architecture": the engine activates inactive workers); a worker whose
    process died (``error``) is started again the same way. Under the ``workergroup:
    worker_crash`` fault the workergroup's workers die holding their eighth request."""

    _scaling = threading.Lock()  # the autoscaler's answers run outside the API's lock, one at a time

    def answer(self, request: Any, body: Any) -> Any:
        self.base_url = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        m, parts = request.method, request.url.path.strip("/").split("/")
        known = parts[:3] == ["api", "v0", "instances"] and len(parts) == 4 and parts[3] in self.state \
            and not self.state[parts[3]].get("destroyed")
        if known and m == "DELETE":
            self.machines.destroy(parts[3])
        elif known and m == "PUT":
            if (body or {}).get("state") == "running":
                self.machines.restart(parts[3])
            else:
                self.machines.stop(parts[3])
        group = m == "POST" and len(parts) >= 3 and parts[2] in ("autojobs", "workergroups")
        if group and (self.script.get("workergroup") or [""])[0] == "worker_crash":
            self.script["workergroup"][0] = "ok"  # created as asked; its workers will crash (a drill)
            self._crashing_group = True
        fault = (self.script.get("create") or [""])[0] if m == "PUT" and parts[:3] == ["api", "v0", "asks"] else ""
        crash, outbid = fault == "worker_crash", fault == "outbid"
        if crash or outbid:  # created as asked; then the worker crashes, or the instance is outbid (drills)
            self.script["create"][0] = "ok"
        before = set(self.state)
        response = super().answer(request, body)
        created = set(self.state) - before
        if m == "PUT" and parts[:3] == ["api", "v0", "asks"] and created:
            iid = created.pop()
            self.state[iid].update(self.lies.get(parts[3], {}))  # the machine may not be what the offer said
            self.state[iid]["start_date"] = time.time()  # the recorded shape's date is fixed; this one starts now
            options = ((body or {}).get("env") or {}).items()
            env = {k: str(v) for k, v in options if not k.startswith("-p ")}
            portmap = {f"{k.split()[1].split(':')[-1]}/tcp": free_port() for k, _ in options if k.startswith("-p ")}
            self.state[iid]["_portmap"] = portmap
            if outbid:
                self.state[iid]["_outbid_after_s"] = self.limits["outbid_after_s"]
            if crash:
                env[POD_FAULT_ENV] = "worker_crash"
            command, stand_in = self.machine_command(str((body or {}).get("image", "")),
                                                     list((body or {}).get("args") or []), env,
                                                     next(iter(portmap.values()), None))
            for key, external in portmap.items():
                port = key.split("/")[0]
                env[f"VAST_TCP_PORT_{port}"] = str(external)
                if not stand_in:  # the runbook's own worker binds it; a stand-in is told {port}
                    env[BIND_ENV.format(port=port)] = f"{HOST}:{external}"
            if self.state[iid].get("actual_status") != "stopped":  # a failed bid leaves a stopped instance
                self.machines.start(iid, command, env)
        return response

    def poll_instance(self, iid: str, *, advance: bool = True) -> dict[str, Any]:
        inst = self.state[iid]
        if self.script.get("poll") or inst.get("intended_status") == "stopped":
            return super().poll_instance(iid, advance=advance) if self.script.get("poll") else inst
        state, code = self.machines.state(iid)
        if state == "RUNNING" and inst.get("actual_status") == "running" and "_outbid_after_s" in inst \
                and time.time() - inst["_running_since"] >= inst["_outbid_after_s"]:
            # A higher bid took the machine: Vast stops the instance and keeps its disk.
            self.machines.stop(iid)
            del inst["_outbid_after_s"]
            inst.update(load("vast", "instance_outbid_stopped.json")["instances"])
            return inst
        if state == "RUNNING" and inst.get("actual_status") != "running":
            inst["_running_since"] = time.time()
            inst.update(load("vast", "instance_running.json")["instances"])
            inst["public_ipaddr"] = f" {HOST}\n"
            inst["ports"] = {k: [{"HostIp": "0.0.0.0", "HostPort": str(v)}] for k, v in inst.get("_portmap", {}).items()}
        elif state != "RUNNING" and inst.get("actual_status") == "running":
            inst.update(actual_status="exited", status_msg=f"container exited (code {code})")
        return inst

    # -- Serverless ---------------------------------------------------------------------------------

    @property
    def key_pair(self) -> Any:
        """The autoscaler's RSA key (made on first use)."""
        if getattr(self, "_rsa", None) is None:
            self._rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        return self._rsa

    def workergroup_created(self, row: dict[str, Any]) -> None:
        """Start the workergroup's workers (the class docstring says how many and what runs)."""
        ep = self.serverless["endptjobs"][str(row["endpoint_id"])]
        template = next((t for t in self.serverless.get("template", {}).values()
                         if t["hash_id"] == row.get("template_hash")), None)
        if template is None:
            return
        env, _ = docker_env(str(template.get("env", "")))
        if getattr(self, "_crashing_group", False):  # the workergroup: worker_crash fault
            env[POD_FAULT_ENV] = "worker_crash"
            self._crashing_group = False
        stand_in, _ = self.machine_command(str(template.get("image", "")), "", env, None, keep_port=True)
        count = min(max(1, int(ep.get("cold_workers") or 0)), max(1, int(ep.get("max_workers") or 1)))
        workers = self.serverless.setdefault("workers", {})
        for _ in range(count):
            wid = str(8_000_000 + next(self._ids))
            port = free_port()
            command = ["python", "-m", "runbook_lib.providers.vast.pyworker", "--port", str(port),
                       "--route", env.get("PYWORKER_ROUTE", "/"), "--pubkey-url", f"{self.base_url}/pubkey/",
                       "--ready-path", env.get("PYWORKER_HEALTHCHECK", "/"), "--command", json.dumps(stand_in)]
            workers[wid] = {"id": int(wid), "endpoint_id": row["endpoint_id"], "workergroup_id": row["id"],
                            "url": f"http://{HOST}:{port}", "started_at": time.time(), "routed_at": time.time(),
                            "stopped": False}
            self.machines.start(wid, command, env)

    def workergroup_deleted(self, row: dict[str, Any]) -> list[int]:
        workers = self.serverless.get("workers", {})
        gone = [wid for wid, w in workers.items() if w["workergroup_id"] == row["id"]]
        for wid in gone:
            self.machines.destroy(wid)
            del workers[wid]
        return [int(w) for w in gone]

    def _worker_status(self, w: dict[str, Any]) -> str:
        if w.get("stopped"):
            return "stopped"
        if self.machines.state(str(w["id"]))[0] != "RUNNING":
            return "error"
        try:
            with socket.create_connection((HOST, int(w["url"].rsplit(":", 1)[1])), timeout=0.5):
                w.setdefault("ready_at", time.time())
                return "idle"
        except OSError:
            return "loading"

    def passthrough(self, request: Any) -> Any:
        """The autoscaler's ``/route/``, ``/pubkey/`` and ``/get_endpoint_workers/`` (docs.vast.ai
        "Route" and "Worker List"); anything else is None (the console API, under the lock)."""
        import httpx

        path = request.url.path
        if path not in ROUTE_PATHS:
            return None
        self.requests.append((request.method, request.url.host + path, None))
        if path == "/pubkey/":
            pem = self.key_pair.public_key().public_bytes(serialization.Encoding.PEM,
                                                          serialization.PublicFormat.SubjectPublicKeyInfo)
            return httpx.Response(200, content=pem, headers={"content-type": "text/plain"})
        body = json.loads(request.content or b"{}")
        with self._scaling:
            return self._autoscaler(request, path, body)

    def _autoscaler(self, request: Any, path: str, body: dict[str, Any]) -> Any:
        import httpx

        self._scale_down()
        workers = list(self.serverless.get("workers", {}).values())
        if path == "/get_endpoint_workers/":
            if request.headers.get("authorization") != f"Bearer {self.key}" and body.get("api_key") != self.key:
                return self.unauthorized()
            return self._json(200, [{"id": w["id"], "status": self._worker_status(w), "started_at": w["started_at"],
                                     "reqs_working": 0} for w in workers if str(w["endpoint_id"]) == str(body.get("id"))])
        ep = next((e for e in self.serverless.get("endptjobs", {}).values()
                   if e.get("endpoint_name") == body.get("endpoint")), None)
        if ep is None or body.get("api_key") != ep["api_key"]:
            return httpx.Response(401, json={"error": "invalid endpoint or api_key"})
        mine = [w for w in workers if w["endpoint_id"] == ep["id"]]
        ready = [w for w in mine if self._worker_status(w) == "idle"]
        if not ready and float(body.get("cost") or 0) > 0 and \
                not any(self._worker_status(w) == "loading" for w in mine):  # a stopped or failed worker starts again
            self._activate(next((w for w in mine if w.get("stopped") or self._worker_status(w) == "error"), None))
        if not ready:
            counts: dict[str, int] = {}
            for w in mine:
                counts[self._worker_status(w)] = counts.get(self._worker_status(w), 0) + 1
            return self._json(200, {"endpoint": ep["endpoint_name"], "status": counts})
        self._reqnum = getattr(self, "_reqnum", 0) + 1
        w = ready[self._reqnum % len(ready)]
        w["routed_at"] = time.time()
        signature = self.key_pair.sign(signed_message(w["url"]), padding.PKCS1v15(), hashes.SHA256())
        return self._json(200, {"endpoint": ep["endpoint_name"], "url": w["url"], "cost": body.get("cost", 100),
                                "reqnum": self._reqnum, "request_idx": self._reqnum,
                                "signature": base64.b64encode(signature).decode(), "__request_id": str(uuid.uuid4())})

    def _scale_down(self) -> None:
        """Stop each idle worker of a ``min_load`` 0 endpoint that no request was routed to for
        ``serverless_idle_s`` (checked whenever the autoscaler is asked, which is when it could
        be seen)."""
        idle_s = self.limits["serverless_idle_s"]
        for w in self.serverless.get("workers", {}).values():
            ep = self.serverless.get("endptjobs", {}).get(str(w["endpoint_id"]), {})
            if float(ep.get("min_load") or 0) == 0 and self._worker_status(w) == "idle" \
                    and time.time() - max(w["routed_at"], w["ready_at"]) > idle_s:
                self.machines.stop(str(w["id"]))
                w["stopped"] = True

    def _activate(self, w: dict[str, Any] | None) -> None:
        """Start a stopped or failed worker again (it loads, then serves, as a new one does)."""
        if w is None:
            return
        self.machines.restart(str(w["id"]))
        w.update(stopped=False, started_at=time.time(), routed_at=time.time())
        w.pop("ready_at", None)
