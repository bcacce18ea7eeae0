"""A fake Runpod API (REST ``/v2`` pods, serverless endpoints, catalog; the GraphQL spot path;
the job API on ``api.runpod.ai``) built from the recorded shapes in ``recorded/``
(``docs/reference/providers.md`` section 2.4). Pods walk PROVISIONING -> RUNNING as they are
polled; ``FixtureApi``'s ``script`` queues failure answers."""

from __future__ import annotations

from typing import Any

from runbook_lib.providers.fixtures import SOURCE_POD, FixtureApi, load


class FakeApi(FixtureApi):
    """Runpod's answers (see :class:`runbook_lib.providers.fixtures.FixtureApi` for the arguments)."""

    error_content_type = "application/problem+json"  # RFC 9457 problem details

    def unauthorized(self) -> Any:
        return self._json(401, load("runpod", "problem_401.json"))

    def answer(self, request: Any, body: Any) -> Any:

        m, host, parts = request.method, request.url.host, request.url.path.strip("/").split("/")
        if host == "api.runpod.ai":
            return self.job_api(m, parts)
        if m == "GET" and parts == ["v2", "catalog", "gpus"]:
            return self._json(200, load("runpod", "catalog_gpus_availability.json"))
        if parts[:2] == ["v2", "pods"]:
            return self._pods(m, parts, body)
        if parts[:2] == ["v2", "serverless"]:
            return self._serverless(m, parts, body)
        if m == "POST" and parts == ["graphql"]:
            if self._next("spot", "ok") == "supply":
                return self._json(200, load("runpod", "graphql_200_errors_supply.json"))
            pid = f"fx{next(self._ids):04d}rp"
            inp = body["variables"]["input"]
            pod = load("runpod", "pod_create_201.json", id=pid, name=inp["name"], image=inp["imageName"], args="",
                       gpu=inp["gpuTypeId"])
            pod["env"] = {e["key"]: e["value"] for e in inp["env"]}
            self.state[pid] = pod
            return self._json(200, load("runpod", "graphql_spot_ok.json", id=pid, image=inp["imageName"]))
        return self._json(404, {"title": "Not Found", "status": 404, "detail": f"no route {m} {request.url.path}"})

    def _pods(self, m: str, parts: list[str], body: Any) -> Any:
        """``/v2/pods``: create (with the scripted capacity, rate and gateway faults), list, get,
        start or stop, delete."""
        import httpx

        if m == "POST" and len(parts) == 2:
            answer = self._next("create", "ok")
            if answer == "capacity":
                return self._json(400, load("runpod", "problem_400_capacity.json"))
            if answer == "rate":
                return self._json(429, load("runpod", "problem_429.json"), **{
                    "Retry-After": "2", "RateLimit": '"minute";r=0;t=2, "hour";r=2900;t=1800'})
            if answer == "invalid":
                return self._json(422, load("runpod", "problem_422.json"))
            pid = f"fx{next(self._ids):04d}rp"
            pod = load("runpod", "pod_create_201.json", id=pid, name=body["name"], image=body["image"],
                       args=body.get("args", ""), gpu=body["gpu"]["id"])
            pod.update(env=body.get("env", {}), ports=body.get("ports", []), disk=body.get("disk", 20),
                       gpu=body["gpu"], registry=body.get("registry"))
            pod["cost"] = 0.69 * body["gpu"].get("count", 1)
            self.state[pid] = pod
            if answer == "created_then_502":  # the gateway failed after the pod was created
                return self._json(502, {"title": "Bad Gateway", "status": 502, "detail": "upstream timed out"})
            return self._json(201, pod)
        if m == "GET" and len(parts) == 2:
            pods = [load("runpod", "pod_source_running.json")] + [self.poll_pod(p) for p in self.state
                                                                   if p.endswith("rp")]
            return self._json(200, {"pods": [p for p in pods if p is not None]})
        pid = parts[2]
        if pid == SOURCE_POD and m == "GET":
            return self._json(200, load("runpod", "pod_source_running.json"))
        if not pid.endswith("rp") or pid not in self.state or self.state[pid].get("status") == "TERMINATED":
            return self._json(404, {"title": "Not Found", "status": 404, "detail": f"pod {pid} not found"})
        if m == "GET":
            return self._json(200, self.poll_pod(pid))
        if m == "POST" and parts[-1] == "action":
            if body.get("action") == "start":
                self.state[pid].update(load("runpod", "pod_get_running.json"))
            else:
                self.state[pid].update(load("runpod", "pod_get_exited.json"))
            return self._json(200, self.state[pid])
        if m == "DELETE":
            self.state[pid]["status"] = "TERMINATED"
            return httpx.Response(204)
        return self._json(404, {"title": "Not Found", "status": 404, "detail": f"no route {m} /{'/'.join(parts)}"})

    def _serverless(self, m: str, parts: list[str], body: Any) -> Any:
        """``/v2/serverless``: create (with the scripted gateway fault), list, get, workers, delete."""
        import httpx

        if m == "POST" and len(parts) == 2:
            eid = f"fx{next(self._ids):04d}ep"
            ep = load("runpod", "endpoint_create.json", id=eid, name=body["name"], image=body["image"])
            ep.update(env=body.get("env", {}), workers=body.get("workers", ep["workers"]),
                      timeout=body.get("timeout", ep["timeout"]), gpu=body.get("gpu", ep["gpu"]),
                      flashboot=body.get("flashboot", ep["flashboot"]), type=body.get("type", ep.get("type")))
            if body.get("ports"):
                ep["ports"] = list(body["ports"])
            self.state[eid] = ep
            if self._next("endpoint", "ok") == "created_then_502":
                return self._json(502, {"title": "Bad Gateway", "status": 502, "detail": "upstream timed out"})
            return self._json(200, ep)
        if m == "GET" and len(parts) == 2:
            return self._json(200, {"endpoints": [v for k, v in self.state.items()
                                                  if k.endswith("ep") and not v.get("deleted")]})
        eid = parts[2]
        if not eid.endswith("ep") or eid not in self.state or self.state[eid].get("deleted"):
            return self._json(404, {"title": "Not Found", "status": 404, "detail": f"endpoint {eid} not found"})
        if m == "GET" and parts[-1] == "workers":
            return self._json(200, load("runpod", f"endpoint_workers_{self._next('workers', 'unhealthy')}.json"))
        if m == "GET":
            return self._json(200, self.state[eid])
        if m == "DELETE":
            self.state[eid]["deleted"] = True
            return httpx.Response(204)
        return self._json(404, {"title": "Not Found", "status": 404, "detail": f"no route {m} /{'/'.join(parts)}"})

    def poll_pod(self, pid: str) -> dict[str, Any] | None:
        pod = self.state[pid]
        if pod.get("status") in ("TERMINATED",):
            return None
        if pod.get("status") == "PROVISIONING" or self.script.get("poll"):
            nxt = self._next("poll", "RUNNING")
            if nxt == "RUNNING":
                pod.update(load("runpod", "pod_get_running.json"))
                for p in pod["runtime"]["ports"]:
                    if p["ip"]:
                        p["ip"] = self.ip
            else:
                pod["status"] = nxt
        elif pod.get("status") == "RUNNING" and self._agent_poll(pod, bool(pod.get("ports"))):
            pod.update(load("runpod", "pod_get_exited.json"))
        return pod

    def job_api(self, m: str, parts: list[str]) -> Any:
        op = parts[2] if len(parts) > 2 else ""
        if m == "POST" and op in ("run", "runsync"):
            answer = self._next("runsync", "in_queue") if op == "runsync" else "in_queue"
            if answer == "rate":
                return rate_limited(self)
            jid = f"job-{next(self._ids):04d}"
            self._jobs[jid] = []
            return self._json(200, job_answer(answer, jid) if answer != "in_queue" else load("runpod", "job_run.json", id=jid))
        if m == "GET" and op == "status":
            jid = parts[3]
            state = self._next("job", "completed")
            if state == "rate":
                return rate_limited(self)
            if state == "ttl" or jid not in self._jobs:
                return self._json(404, load("runpod", "job_status_404_ttl.json"))
            return self._json(200, job_answer(state, jid))
        if m == "POST" and op == "cancel":
            return self._json(200, load("runpod", "job_cancel.json", id=parts[3]))
        if m == "POST" and op == "retry":
            return self._json(200, load("runpod", "job_retry.json", id=parts[3]))
        if m == "POST" and op == "purge-queue":
            return self._json(200, load("runpod", "purge_queue.json"))
        if m == "GET" and op == "health":
            return self._json(200, load("runpod", "health.json"))
        return self._json(404, {"error": "no route"})


JOB_RETRY_AFTER_S = "1"
"""The ``Retry-After`` (seconds) of a scripted 429 on the job API."""


def job_answer(state: str, jid: str) -> dict[str, Any]:
    """Job ``jid``'s record in state ``state`` (a ``job_status_*.json`` shape); ``completed_empty``
    is a COMPLETED job whose handler returned nothing (no ``output``)."""
    if state == "completed_empty":
        return {k: v for k, v in load("runpod", "job_status_completed.json", id=jid).items() if k != "output"}
    return dict(load("runpod", f"job_status_{state}.json", id=jid))


def rate_limited(api: Any) -> Any:
    """The job API's 429: refused unprocessed (runpod/docs: each job operation has a per-endpoint
    rate limit, and "excess -> 429"; docs/reference/providers.md 2.2), with ``Retry-After``."""
    return api._json(429, load("runpod", "problem_429.json"), **{"Retry-After": JOB_RETRY_AFTER_S})
