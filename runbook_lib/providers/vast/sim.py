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

import time
from typing import Any

from runbook_lib.layout import POD_FAULT_ENV
from runbook_lib.providers.fixtures import load
from runbook_lib.providers.local.endpoint import BIND_ENV
from runbook_lib.providers.simulator import HOST, MachineBacked, free_port
from runbook_lib.providers.vast.fake import FakeApi

LIMITS: dict[str, float] = {"outbid_after_s": 3.0}
"""The waits a test or user may set when the simulator starts (seconds), with their defaults:
``outbid_after_s``, how long after it starts running an instance created under the ``create:
outbid`` fault is outbid."""

SCRIPTS: dict[str, frozenset[str]] = {
    "create": frozenset({"ok", "gone", "bid_fail", "rate", "created_then_502", "worker_crash", "outbid"}),
    "poll": frozenset({"null_status", "loading", "running", "exited_oci_error", "outbid_stopped"}),
    "search": frozenset({"ok", "rate"}),
}
"""The operations a ``script`` may name and the answers each may serve
(:class:`runbook_lib.providers.fixtures.FixtureApi` describes them)."""

KEY_ENV = "VAST_API_KEY"  # where the adapter finds its key (runbook_lib.providers.vast.default_key)
KEY_PREFIX = "sim-vast-"  # a simulator key's prefix: evidence can be searched for it


def exports(url: str, key: str) -> dict[str, str]:
    """The environment that points the Vast.ai adapter at a simulator at ``url`` accepting ``key``."""
    return {"RUNBOOK_VAST_API_URL": url, KEY_ENV: key}


def overrides(url: str) -> dict[str, str]:
    """A Vast.ai profile's params fields that point it at a simulator at ``url``."""
    return {"api_url": url}


class SimApi(MachineBacked, FakeApi):
    """Vast.ai's answers with real processes behind its instances (arguments: :class:`MachineBacked`)."""

    def answer(self, request: Any, body: Any) -> Any:
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
