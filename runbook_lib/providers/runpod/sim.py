"""The Runpod simulator: the fake API (``fake.py``) over HTTP, with a local process behind every pod.

A created pod runs its ``args`` (``python`` is this interpreter) with its ``env``; its status
follows the process (``RUNNING`` while it runs, ``EXITED`` once it ends) in Runpod's own shapes.
A stop ends the process and wipes the container disk (the volume survives, as on Runpod); a
start runs the command again; a delete destroys it (``TERMINATED``). See
:mod:`runbook_lib.providers.simulator`.
"""

from __future__ import annotations

from typing import Any

from runbook_lib.providers.fixtures import load
from runbook_lib.providers.runpod.fake import FakeApi
from runbook_lib.providers.simulator import HOST, MachineBacked


class SimApi(MachineBacked, FakeApi):
    """Runpod's answers with real processes behind its pods (arguments: :class:`MachineBacked`)."""

    def answer(self, request: Any, body: Any) -> Any:
        m, parts = request.method, request.url.path.strip("/").split("/")
        pod_path = parts[:2] == ["v2", "pods"] and len(parts) >= 3 and parts[2] in self.state
        if pod_path and m == "DELETE":
            self.machines.destroy(parts[2])
        elif pod_path and m == "POST" and parts[-1] == "action":
            if (body or {}).get("action") == "start":
                self.machines.restart(parts[2])
            else:
                self.machines.stop(parts[2])
        before = set(self.state)
        response = super().answer(request, body)
        created = [k for k in set(self.state) - before if k.endswith("rp")]
        if m == "POST" and parts == ["v2", "pods"] and created:  # also after a 502 that still created it
            pid = created[0]
            pod = self.state[pid]
            self.machines.start(pid, pod.get("args") or "", {k: str(v) for k, v in (pod.get("env") or {}).items()})
        return response

    def poll_pod(self, pid: str) -> dict[str, Any] | None:
        pod = self.state[pid]
        if pod.get("status") == "TERMINATED":
            return None
        if self.script.get("poll"):  # a scripted fault wins over the process
            return super().poll_pod(pid)
        state, code = self.machines.state(pid)
        if state == "RUNNING" and pod.get("status") != "RUNNING":
            pod.update(load("runpod", "pod_get_running.json"))
            for p in pod["runtime"]["ports"]:
                if p["ip"]:
                    p["ip"] = HOST
        elif state != "RUNNING" and pod.get("status") == "RUNNING":
            pod.update(load("runpod", "pod_get_exited.json"))
            pod["lastStatusChange"] = f"Exited by container: exit code {code}"
        return pod
