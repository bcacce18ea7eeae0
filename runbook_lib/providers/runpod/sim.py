"""The Runpod simulator: the fake API (``fake.py``) over HTTP, with local processes behind every
pod and serverless endpoint.

A created pod runs its ``args`` (``python`` is this interpreter) with its ``env``; its status
follows the process (``RUNNING`` while it runs, ``EXITED`` once it ends) in Runpod's own shapes.
A stop ends the process and wipes the container disk (the volume survives, as on Runpod); a
start runs the command again; a delete destroys it (``TERMINATED``). A pod's HTTP ports are
served through the simulator's proxy, ``/proxy/{pod_id}-{port}/...`` (the adapter's
``proxy_url``): 502 until the process listens, 524 for an answer slower than the
``proxy_timeout_s`` limit (Runpod's proxy: 100 s); server-sent events pass through as they
arrive. A pod created for an image with a stand-in
(:meth:`~runbook_lib.providers.simulator.MachineBacked.machine_command`) runs the stand-in,
told the local port its first HTTP port is served on.

A created serverless (queue) endpoint runs the image's handler as the runbook's worker image
does: the local front door with up to ``workers.max`` worker processes, ``workers.min`` kept
running and the others stopped after ``workers.idleTimeout`` seconds idle
(:mod:`runbook_lib.providers.local.endpoint`), reading the run's params from the endpoint's
``RUNBOOK_PARAMS_YAML`` and its side from ``RUNBOOK_SIDE``. The job API (``/v2/{id}/run``,
``runsync``, ``status``, ``cancel``, ``retry``, ``purge-queue``, ``health``) is passed through to
that front door outside the simulator's lock (``runsync`` waits up to 90 s), and its answers are
put in Runpod's shapes: ``delayTime`` and ``executionTime`` in milliseconds, a forgotten job a
404 (jobs are forgotten ``job_ttl_s`` after submission, a simulator limit). Scripted job answers
are served on the wire, each on the next request it names: ``job`` answers ``/status`` in place
of the front door (a state's recorded shape for that job id; ``completed_empty``: COMPLETED with
no ``output``; ``ttl``: 404; ``rate``: 429 with ``Retry-After``); ``runsync`` answers
``/runsync``: ``in_queue``/``in_progress`` submit the job for real and answer that non-terminal
state (the caller must poll ``/status``), ``completed_empty`` drops a COMPLETED answer's
``output``, ``rate`` refuses it (429, nothing submitted). Under the ``endpoint: throttled`` fault an
endpoint's workers wait ``throttled_s`` (a limit) for a GPU before any can start: its ``/health``
and worker list say ``THROTTLED``, and its jobs wait as queued jobs do.

A created ``LOAD_BALANCER`` endpoint (a team's HTTP server) has no front door: its worker is the
image's stand-in, served at ``/lb/{endpoint_id}/<path>`` (the adapter's ``lb_url``) with the
Runpod key. Any request, ``/ping`` included, starts a worker when none runs (Runpod's own
behaviour for a ``/ping`` to a scaled-to-zero endpoint is unverified); ``/ping`` answers the
worker's own, or 204 (initializing) until it listens; any other request waits up to
``FRONT_DOOR_WAIT_S`` for the worker's ``/ping`` to answer 200 (else 400, as Runpod answers a
request no worker can take) and is forwarded, streamed, cut at ``lb_timeout_s`` with a 524. The
simulator runs at most one worker per load-balancing endpoint; with ``workers.min`` 0 it is
stopped ``workers.idleTimeout`` seconds after its last request ended.
See :mod:`runbook_lib.providers.simulator`.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from runbook_lib._time import utc_now
from runbook_lib.layout import POD_FAULT_ENV, POD_PARAMS_ENV, POD_SIDE_ENV
from runbook_lib.providers.fixtures import load
from runbook_lib.providers.local.endpoint import BIND_ENV
from runbook_lib.providers.runpod.fake import FakeApi, job_answer, rate_limited
from runbook_lib.providers.simulator import HOST, MachineBacked, free_port

LIMITS: dict[str, float] = {"job_ttl_s": 86_400.0, "proxy_timeout_s": 100.0, "lb_timeout_s": 330.0,
                            "throttled_s": 5.0}
"""The waits and limits a test or user may set when the simulator starts (seconds), with their
defaults. ``job_ttl_s``: a serverless job is forgotten this long after it was submitted, run or
not (its ``/status`` then answers 404); 24 h is Runpod's default execution policy ``ttl``
(docs/reference/providers.md, Runpod job API, Timeouts/TTL). ``proxy_timeout_s``: the pod HTTP
proxy answers 524 to a request that takes longer (Runpod's proxy: 100 s, runpod/docs
pods/configuration/expose-ports.mdx). ``lb_timeout_s``: a load-balancing endpoint answers 524 to a
request that takes longer (5.5 min, docs.runpod.io/serverless/load-balancing/overview).
``throttled_s``: how long the workers of an endpoint created under the ``endpoint: throttled``
fault wait for a GPU before they can start."""

SCRIPTS: dict[str, frozenset[str]] = {
    "create": frozenset({"ok", "capacity", "rate", "unauthorized", "invalid", "created_then_502"}),
    "endpoint": frozenset({"ok", "created_then_502", "worker_crash", "throttled"}),
    "poll": frozenset({"PROVISIONING", "STARTING", "RUNNING", "EXITED", "ERROR"}),
    "spot": frozenset({"ok", "supply"}),
    "job": frozenset({"in_queue", "in_progress", "completed", "completed_empty", "failed", "timed_out", "ttl", "rate"}),
    "runsync": frozenset({"in_queue", "in_progress", "completed_empty", "rate"}),
    "workers": frozenset({"unhealthy", "throttled"}),
}
"""The operations a ``script`` may name and the answers each may serve
(:class:`runbook_lib.providers.fixtures.FixtureApi` describes them)."""

LB = "/lb/{endpoint_id}"
"""Where the simulator serves a load-balancing endpoint, after its base URL (the ``lb_url`` to
give the adapter)."""
PROXY = "/proxy/{pod_id}-{port}"
"""Where the simulator serves a pod's HTTP port, after its base URL (the ``proxy_url`` to give
the adapter)."""

KEY_ENV = "RUNPOD_API_KEY"  # where the adapter finds its key (runbook_lib.providers.runpod.default_key)
KEY_PREFIX = "sim-rp-"  # a simulator key's prefix: evidence can be searched for it


def exports(url: str, key: str) -> dict[str, str]:
    """The environment that points the Runpod adapter at a simulator at ``url`` accepting ``key``."""
    return {"RUNBOOK_RUNPOD_API_URL": url, "RUNBOOK_RUNPOD_JOB_API_URL": url, "RUNBOOK_RUNPOD_PROXY_URL": url + PROXY,
            "RUNBOOK_RUNPOD_LB_URL": url + LB, KEY_ENV: key}


def overrides(url: str) -> dict[str, str]:
    """A Runpod profile's params fields that point it at a simulator at ``url``."""
    return {"api_url": url, "job_api_url": url, "proxy_url": url + PROXY, "lb_url": url + LB}


FRONT_DOOR_WAIT_S = 120.0  # a job sent before the endpoint's front door listens waits this long, seconds
JOB_OPS = ("run", "runsync", "status", "cancel", "retry", "purge-queue", "health")
WORKER_STATUS = {"idle": "IDLE", "running": "RUNNING", "initializing": "INITIALIZING"}


def runpod_job(job: dict[str, Any]) -> dict[str, Any]:
    """A local front door's job record in the job API's shape (runpod/docs
    ``serverless/endpoints/operation-reference.mdx``): ``delayTime`` (submitted until a worker
    took it, including a cold worker's start) and ``executionTime``, both in ms."""
    out: dict[str, Any] = {"id": job["id"], "status": job["status"]}
    if "queue_s" in job:
        out["delayTime"] = int(round((job["queue_s"] + job.get("init_s", 0.0)) * 1000))
    if job.get("execution_s") is not None:
        out["executionTime"] = int(round(job["execution_s"] * 1000))
    for k, v in (("output", "output"), ("error", "error"), ("worker", "workerId")):
        if k in job:
            out[v] = job[k]
    return out


def _relay(answer: Any, done: Any = None) -> Any:
    """A streamed answer's bytes as they arrive; a pause longer than the proxy's limit ends the
    stream there (its status is already sent), as a proxy cuts a stalled stream. ``done`` is
    called when the stream ends, however it ends."""
    import httpx

    try:
        yield from answer.iter_raw()
    except httpx.TimeoutException:
        return
    finally:
        answer.close()
        if done is not None:
            done()


class SimApi(MachineBacked, FakeApi):
    """Runpod's answers with real processes behind its pods and endpoints (arguments:
    :class:`MachineBacked`)."""

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
        endpoint = self._endpoint_id(parts[:3]) if parts[:2] == ["v2", "serverless"] else ""
        if endpoint and m == "DELETE":
            self.machines.destroy(endpoint)
        if endpoint and m == "GET" and parts[-1] == "workers":
            lb = self.lb.serves(endpoint)
            return self._json(200, {"workers": self.lb.workers(endpoint) if lb else self._workers(endpoint)})
        fault = (self.script.get("endpoint") or [""])[0] if m == "POST" and parts == ["v2", "serverless"] else ""
        crash, throttled = fault == "worker_crash", fault == "throttled"
        if crash or throttled:  # created as asked; its workers will crash, or wait for a GPU (drills)
            self.script["endpoint"][0] = "ok"
        before = set(self.state)
        response = super().answer(request, body)
        created = set(self.state) - before
        for rid in created:  # the recorded shapes carry a fixed date; a simulated machine starts now
            self.state[rid]["createdAt"] = utc_now()
        if m == "POST" and parts == ["v2", "pods"] and created:  # also after a 502 that still created it
            pid = created.pop()
            pod = self.state[pid]
            env = {k: str(v) for k, v in (pod.get("env") or {}).items()}
            # Each HTTP port is served behind the proxy (/proxy/{pod_id}-{port}/...); without a
            # container network the process binds the local port the proxy forwards to.
            pod["_portmap"] = {p.split("/")[0]: free_port() for p in pod.get("ports") or [] if p.endswith("/http")}
            first = next(iter(pod["_portmap"].values()), None)
            command, stand_in = self.machine_command(str(pod.get("image", "")), pod.get("args") or "", env, first)
            if not stand_in:  # the runbook's own worker binds where the proxy forwards; a stand-in is told {port}
                for port, local in pod["_portmap"].items():
                    env[BIND_ENV.format(port=port)] = f"{HOST}:{local}"
            self.machines.start(pid, command, env)
        elif m == "POST" and parts == ["v2", "serverless"] and created:
            eid = created.pop()
            if self.lb.serves(eid):  # workers.min kept running; more start on demand
                self.lb.created(eid)
            elif throttled:  # no GPU for its workers yet: the front door starts once one is free
                self.state[eid]["_throttled_until"] = time.monotonic() + self.limits["throttled_s"]
                timer = threading.Timer(self.limits["throttled_s"], self._unthrottled, args=(eid,))
                timer.daemon = True
                timer.start()
            else:
                self._start_endpoint(eid, crash=crash)
        return response

    def _endpoint_id(self, parts: list[str]) -> str:
        eid = parts[2] if len(parts) > 2 else ""
        ep = self.state.get(eid)
        return eid if eid.endswith("ep") and ep is not None and not ep.get("deleted") else ""

    def _port_file(self, eid: str) -> Any:
        return self.machines.root / f"{eid}.port"

    def _start_endpoint(self, eid: str, *, crash: bool = False) -> None:
        ep = self.state[eid]
        env = {k: str(v) for k, v in (ep.get("env") or {}).items()}
        if crash:
            env[POD_FAULT_ENV] = "worker_crash"
        scaling = ep.get("workers") or {}
        workers = max(1, int(scaling.get("max") or 1))
        door = ["--workers", str(workers), "--active-workers", str(int(scaling.get("min") or 0)),
                "--idle-timeout-s", str(float(scaling.get("idleTimeout") or 5)),
                "--port-file", str(self._port_file(eid)),
                "--execution-timeout-s", str(float(ep.get("timeout") or 600_000) / 1000),
                "--ttl-s", str(self.limits["job_ttl_s"])]
        if str(ep.get("image", "")) in self.stand_ins:  # a team's handler: its stand-in under Runpod's worker runtime
            stand_in, _ = self.machine_command(str(ep["image"]), "", env, None, keep_port=True)
            command = ["python", "-m", "runbook_lib.providers.runpod.handler_worker", "serve",
                       "--command", json.dumps(stand_in), *door]
        else:
            command = ["python", "-m", "runbook_lib.providers.local.endpoint", "serve", "--params",
                       f"env:{POD_PARAMS_ENV}", "--side", env.get(POD_SIDE_ENV, "source"), *door]
        self._port_file(eid).unlink(missing_ok=True)
        self.machines.start(eid, command, env)

    def _front_door(self, eid: str, wait_s: float) -> str:
        """The URL of endpoint ``eid``'s front door once it listens (waiting up to ``wait_s``, and
        through a throttle), or ''."""
        deadline = time.monotonic() + wait_s
        while True:
            f = self._port_file(eid)
            if f.exists():
                return f"http://{HOST}:{f.read_text().strip()}"
            waiting = self._throttled(eid) or (self.state.get(eid) or {}).get("_throttled_until") and \
                self.machines.state(eid)[0] == "GONE"  # the throttle just ended; its front door is starting
            if time.monotonic() >= deadline or (self.machines.state(eid)[0] != "RUNNING" and not waiting):
                return ""
            time.sleep(0.05)

    def _unthrottled(self, eid: str) -> None:
        """A GPU is free: start ``eid``'s front door, unless the endpoint was deleted meanwhile."""
        if not self.state[eid].get("deleted"):
            self._start_endpoint(eid)

    def _throttled(self, eid: str) -> bool:
        """``eid``'s workers are still waiting for a GPU (the ``endpoint: throttled`` fault)."""
        return time.monotonic() < float((self.state.get(eid) or {}).get("_throttled_until") or 0)

    def _workers(self, eid: str) -> list[dict[str, Any]]:
        import httpx

        url = self._front_door(eid, 0)
        if not url:
            return [{"id": f"{eid}-w0", "status": "THROTTLED" if self._throttled(eid) else "INITIALIZING"}]
        health = httpx.get(f"{url}/health", timeout=10).json()
        return [{"id": f"{eid}-w{i}", "status": WORKER_STATUS.get(state, "UNHEALTHY")}
                for i, state in enumerate(s for s, n in health["workers"].items() for _ in range(n))]

    def _proxy(self, request: Any, target: str, rest: str) -> Any:
        """A request to a pod's HTTP port through the proxy (``/proxy/{pod_id}-{port}/{rest}``): 502
        while nothing listens on the port (or the pod is gone), 524 when the answer takes longer
        than ``proxy_timeout_s`` (Runpod's proxy cuts requests at 100 s; runpod/docs
        pods/configuration/expose-ports.mdx). No key: a proxy URL is public."""
        import httpx

        def page(code: int) -> Any:  # the proxy's own answer, not the pod's
            return httpx.Response(code, text=load("runpod", f"proxy_{code}.html"), headers={"content-type": "text/html"})

        pid, _, port = target.rpartition("-")
        pod = self.state.get(pid) or {}
        local = (pod.get("_portmap") or {}).get(port)
        if not local or pod.get("status") == "TERMINATED" or self.machines.state(pid)[0] != "RUNNING":
            return page(502)
        return self._forward(request, local, rest, self.limits["proxy_timeout_s"])

    def _forward(self, request: Any, local: int, rest: str, timeout_s: float, done: Any = None) -> Any:
        """``request`` sent on to ``127.0.0.1:local/rest`` and its answer relayed (a stream as it
        arrives); a 502 page when nothing answers, a 524 page past ``timeout_s``. ``done`` is
        called once the answer has been relayed whole (or failed)."""
        import httpx

        def page(code: int) -> Any:
            if done is not None:
                done()
            return httpx.Response(code, text=load("runpod", f"proxy_{code}.html"), headers={"content-type": "text/html"})

        client = self._proxy_client()
        query = f"?{request.url.query.decode()}" if request.url.query else ""
        try:
            answer = client.send(client.build_request(
                request.method, f"http://{HOST}:{local}/{rest}{query}", content=request.content,
                headers={"content-type": request.headers.get("content-type", "application/json"),
                         "accept": request.headers.get("accept", "*/*")},
                timeout=timeout_s), stream=True)  # the limit now, as a run may have set it
        except httpx.TimeoutException:
            return page(524)
        except httpx.TransportError:
            return page(502)
        kind = answer.headers.get("content-type", "application/json")
        if kind.startswith("text/event-stream"):
            return httpx.Response(answer.status_code, content=_relay(answer, done), headers={"content-type": kind})
        try:
            body = answer.read()
        except httpx.TimeoutException:
            return page(524)
        finally:
            answer.close()
        if done is not None:
            done()
        return httpx.Response(answer.status_code, content=body, headers={"content-type": kind})

    def _proxy_client(self) -> Any:
        """The proxy's one connection pool to the pods' ports (thread-safe; a client per request
        would pay for a new TLS context each time, tens of ms that are not Runpod's)."""
        import httpx

        if getattr(self, "_proxy_http", None) is None:
            self._proxy_http = httpx.Client(limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))
        return self._proxy_http

    def passthrough(self, request: Any) -> Any:
        """Job API requests (``/v2/{endpoint_id}/{op}[/{job_id}]``) go to the endpoint's front door,
        and proxy requests (``/proxy/{pod_id}-{port}/...``) to the pod's port, outside the
        simulator's lock; anything else is None (answered under the lock)."""
        import httpx

        parts = request.url.path.strip("/").split("/")
        if parts[0] == "proxy" and len(parts) >= 2:
            self.requests.append((request.method, request.url.host + request.url.path, None))
            return self._proxy(request, parts[1], "/".join(parts[2:]))
        if parts[0] == "lb" and len(parts) >= 2:
            self.requests.append((request.method, request.url.host + request.url.path, None))
            return self.lb.serve(request, parts[1], "/".join(parts[2:]))
        if len(parts) < 3 or parts[0] != "v2" or parts[2] not in JOB_OPS or not parts[1].endswith("ep"):
            return None
        self.requests.append((request.method, request.url.host + request.url.path, None))
        if request.headers.get("authorization") != f"Bearer {self.key}":
            return self.unauthorized()
        eid, op = parts[1], parts[2]
        if eid not in self.state or self.state[eid].get("deleted"):
            return self._json(404, {"error": f"endpoint {eid} not found"})
        url = self._front_door(eid, 0 if op == "health" else FRONT_DOOR_WAIT_S)
        if not url and op == "health":
            throttled = int(self._throttled(eid))
            return self._json(200, {"jobs": {"completed": 0, "failed": 0, "inProgress": 0, "inQueue": 0, "retried": 0},
                                    "workers": {"idle": 0, "running": 0, "initializing": 1 - throttled,
                                                "throttled": throttled, "unhealthy": 0}})
        if not url:
            return self._json(503, {"error": f"endpoint {eid}: no worker could start (its front door is not up)"})
        scripted = self._next({"runsync": "runsync", "status": "job"}.get(op, ""), "")
        if scripted == "rate":  # refused unprocessed: nothing reaches the front door
            return rate_limited(self)
        if op == "status" and scripted:  # the scripted answer for this job, in place of the front door's
            if scripted == "ttl":
                return self._json(404, load("runpod", "job_status_404_ttl.json"))
            return self._json(200, job_answer(scripted, parts[3]))
        path = "run" if scripted in ("in_queue", "in_progress") else "/".join(parts[2:])  # submitted for real
        answer = httpx.request(request.method, f"{url}/{path}", content=request.content,
                               headers={"content-type": "application/json"}, timeout=FRONT_DOOR_WAIT_S)
        if scripted in ("in_queue", "in_progress") and answer.status_code == 200:  # runsync answers before the end
            return self._json(200, {"id": answer.json()["id"], "status": scripted.upper()})
        if scripted == "completed_empty" and answer.status_code == 200 and answer.json().get("status") == "COMPLETED":
            return self._json(200, {k: v for k, v in runpod_job(answer.json()).items() if k != "output"})
        if answer.status_code == 404 and op == "status":
            return self._json(404, load("runpod", "job_status_404_ttl.json"))
        if answer.status_code >= 400:
            return self._json(answer.status_code, answer.json())
        body = answer.json()
        if op == "purge-queue":
            return self._json(200, body)
        if op == "health":
            jobs = body["jobs"]
            return self._json(200, {"jobs": {"completed": jobs["completed"], "failed": jobs["failed"],
                                             "inProgress": jobs["inProgress"], "inQueue": jobs["inQueue"],
                                             "retried": 0},
                                    "workers": {**body["workers"], "throttled": 0, "unhealthy": 0}})
        return self._json(200, runpod_job(body))

    @property
    def lb(self) -> LoadBalancers:
        """The load-balancing endpoints' workers (made on first use)."""
        if getattr(self, "_lb", None) is None:
            self._lb = LoadBalancers(self)
        return self._lb

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


class LoadBalancers:
    """The simulator's load-balancing endpoints (the module docstring says what they do): one
    worker each at most, the image's stand-in on a local port, run as the endpoint's machine.

    Args:
        api: the simulator whose endpoints (``state``), machines and forwarding they use.
    """

    def __init__(self, api: SimApi) -> None:
        self.api = api
        self.lock = threading.Lock()  # requests run outside the API's lock; the scaling, one at a time
        self.by_id: dict[str, dict[str, Any]] = {}  # port (0: none runs), used (Unix s), inflight

    def serves(self, eid: str) -> bool:
        """``eid`` is a ``LOAD_BALANCER`` endpoint."""
        return (self.api.state.get(eid) or {}).get("type") == "LOAD_BALANCER"

    def created(self, eid: str) -> None:
        """Start the worker of a new endpoint whose ``workers.min`` keeps one running."""
        if int((self.api.state[eid].get("workers") or {}).get("min") or 0) > 0:
            with self.lock:
                self._up(eid)

    def _state(self, eid: str) -> dict[str, Any]:
        return self.by_id.setdefault(eid, {"port": 0, "used": time.time(), "inflight": 0})

    def _up(self, eid: str) -> int:
        """The local port of ``eid``'s worker, started (the image's stand-in, told the port) when
        none runs."""
        lb = self._state(eid)
        if lb["port"] and self.api.machines.state(eid)[0] == "RUNNING":
            return int(lb["port"])
        ep = self.api.state[eid]
        env = {k: str(v) for k, v in (ep.get("env") or {}).items()}
        port = free_port()
        command, _ = self.api.machine_command(str(ep.get("image", "")), "", env, port)
        self.api.machines.start(eid, command, env)
        lb.update(port=port, used=time.time())
        return port

    def _scale_down(self) -> None:
        """Stop each idle worker of a ``workers.min`` 0 endpoint ``workers.idleTimeout`` seconds
        after its last request ended (checked whenever an endpoint is asked something)."""
        for eid, lb in self.by_id.items():
            scaling = (self.api.state.get(eid) or {}).get("workers") or {}
            if lb["port"] and lb["inflight"] == 0 and int(scaling.get("min") or 0) == 0 \
                    and time.time() - lb["used"] > float(scaling.get("idleTimeout") or 5):
                self.api.machines.stop(eid)
                lb["port"] = 0

    @staticmethod
    def _ping(port: int) -> int:
        """The worker's own ``GET /ping`` status; 0 when nothing listens yet."""
        import httpx

        try:
            return httpx.get(f"http://{HOST}:{port}/ping", timeout=2).status_code
        except httpx.HTTPError:
            return 0

    def workers(self, eid: str) -> list[dict[str, Any]]:
        """``GET /v2/serverless/{id}/workers``: the endpoint's worker, if one runs."""
        with self.lock:
            self._scale_down()
            lb = self._state(eid)
            if not lb["port"] or self.api.machines.state(eid)[0] != "RUNNING":
                return []
            ping = self._ping(int(lb["port"]))
        status = ("RUNNING" if lb["inflight"] else "IDLE") if ping == 200 else "INITIALIZING" if ping in (0, 204) \
            else "UNHEALTHY"
        return [{"id": f"{eid}-w0", "status": status}]

    def serve(self, request: Any, eid: str, rest: str) -> Any:
        """A request to endpoint ``eid``'s ``/rest`` (the module docstring says how it is served)."""
        import httpx

        api = self.api
        if request.headers.get("authorization") != f"Bearer {api.key}":
            return api.unauthorized()
        if not self.serves(eid) or api.state[eid].get("deleted"):
            return api._json(404, {"error": f"endpoint {eid} not found"})
        with self.lock:
            self._scale_down()
            port = self._up(eid)
            lb = self._state(eid)
            lb["inflight"] += 1

        def done() -> None:
            with self.lock:
                lb["inflight"] -= 1
                lb["used"] = time.time()

        if rest == "ping":
            status = self._ping(port)
            done()
            return httpx.Response(status or 204, json={"status": "healthy" if status == 200 else "initializing"})
        deadline = time.monotonic() + FRONT_DOOR_WAIT_S
        while self._ping(port) != 200:
            if time.monotonic() >= deadline or api.machines.state(eid)[0] != "RUNNING":
                done()
                return api._json(400, {"error": f"endpoint {eid}: no worker became ready (GET /ping never answered "
                                                "200)"})
            time.sleep(0.05)
        return api._forward(request, port, rest, api.limits["lb_timeout_s"], done)
