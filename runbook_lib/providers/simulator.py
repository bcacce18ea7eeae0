"""Loopback simulators of the remote providers' APIs, for rehearsing a migration before paying for it.

A simulator is a provider's fake API (``<provider>/fake.py``, the recorded wire shapes) served
over real HTTP on 127.0.0.1, with real machines behind it: every pod or instance it creates
runs the command it was given as a local process, through the local provider
(:class:`runbook_lib.providers.local.LocalProvider`: process groups, race-free teardown). There
is no container engine here, so the image is recorded by name and the project's own interpreter
runs the command (``python`` in the command means ``sys.executable``). Everything the adapters
send is exactly what they send to the real service; only the base URL differs.

Every answer carries ``X-Runbook-Simulator: <provider>`` so a run that talked to a simulator is
marked as a rehearsal, never mistaken for a real migration. The simulator demands the Bearer
key it was started with and answers a wrong one with the provider's own error shape.
"""

from __future__ import annotations

import importlib
import importlib.util
import shlex
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol, cast

from runbook_lib._time import utc_now
from runbook_lib.errors import NotFound, ProviderError
from runbook_lib.evidence.approvals import Approval
from runbook_lib.providers import PROVIDERS, REMOTE
from runbook_lib.providers.api import SIMULATOR_HEADER
from runbook_lib.providers.base import PodSpec, plan_stop
from runbook_lib.providers.fixtures import FixtureApi
from runbook_lib.providers.local import LocalProvider
from runbook_lib.providers.local.endpoint import LISTEN_BACKLOG
from runbook_lib.providers.local.lifecycle import free_port  # the simulators' ports, as the local provider's

HOST = "127.0.0.1"  # every simulated machine's address


__all__ = ["HOST", "SIMULATOR_HEADER", "MachineBacked", "Machines", "SimServer", "free_port", "simulate",
           "stand_in_problems"]



def _approval(plan: Any) -> Any:
    """The simulated provider's own consent to run what the runbook asked for: the runbook
    approved the plan before it sent the request, so the machine behind the API just starts."""
    return Approval(plan.fingerprint, "simulator", utc_now(), "simulator: the API accepted the create request")


@dataclass
class Machines:
    """The processes behind a simulator's pods and instances.

    Args:
        root: state directory; each machine is a local pod under ``root/machines``.
    """

    root: Path
    ids: dict[str, str] = field(default_factory=dict)  # simulated resource id -> local pod id
    commands: dict[str, tuple[tuple[str, ...], tuple[tuple[str, str], ...]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.local = LocalProvider(root=Path(self.root) / "machines")
        # The console API (a DELETE) and the autoscaler (which starts a stopped worker again) run
        # on different request threads: a start, restart or destroy of one machine is one step.
        self._lock = threading.RLock()

    @staticmethod
    def argv(command: str | list[str]) -> tuple[str, ...]:
        """The command as argv; ``python`` (the image's interpreter) becomes this interpreter."""
        parts = shlex.split(command) if isinstance(command, str) else [str(c) for c in command]
        return tuple(sys.executable if i == 0 and p in ("python", "python3") else p for i, p in enumerate(parts))

    def start(self, rid: str, command: str | list[str], env: dict[str, str]) -> None:
        """Run ``command`` with ``env`` as the machine of resource ``rid`` (an empty command: the
        image's own entry point, which cannot run here, so the machine idles)."""
        argv = self.argv(command) or (sys.executable, "-c", "import time; time.sleep(86400)")
        pairs = tuple((k, str(v)) for k, v in env.items())
        spec = PodSpec(name=rid, command=argv, device="cpu", price_usd_per_hour=0.0, labels=(("sim", rid),),
                       env=pairs)
        with self._lock:
            self.commands[rid] = (argv, pairs)
            plan = self.local.plan_launch(spec, dry_run=False)
            self.ids[rid] = self.local.apply(plan, _approval(plan)).id  # type: ignore[union-attr]

    def restart(self, rid: str) -> None:
        """Start ``rid``'s command again after a stop (its container disk is new). A destroyed
        machine never starts again: a restart that comes after its destroy (a worker the autoscaler
        wakes as its endpoint is deleted) does nothing."""
        with self._lock:
            if rid not in self.commands:
                return
            argv, pairs = self.commands[rid]
            self.start(rid, list(argv), dict(pairs))

    def state(self, rid: str) -> tuple[str, int | None]:
        """``(state, exit_code)``: ``RUNNING``, ``EXITED`` or ``GONE`` (never started or destroyed)."""
        local = self.ids.get(rid)
        if local is None:
            return "GONE", None
        try:
            pod = self.local.get(local)
        except NotFound:
            return "GONE", None
        return ("RUNNING" if pod.state == "RUNNING" else "EXITED"), getattr(pod, "exit_code", None)

    def stop(self, rid: str) -> None:
        """Stop ``rid``'s processes (compute released)."""
        with self._lock:
            local = self.ids.get(rid)
            if local is not None:
                plan = plan_stop(self.local, local, dry_run=False)
                self.local.apply(plan, _approval(plan))

    def destroy(self, rid: str) -> None:
        """Destroy ``rid``'s processes and disks, for good (:meth:`restart` no longer starts it); a
        machine already gone is fine."""
        with self._lock:
            self.commands.pop(rid, None)
            local = self.ids.pop(rid, None)
            if local is not None:
                plan = self.local.plan_destroy(local, dry_run=False)
                self.local.apply(plan, _approval(plan))

    def close(self) -> None:
        """Destroy every machine (the simulator is shutting down)."""
        for rid in list(self.ids):
            try:
                self.destroy(rid)
            except ProviderError:
                pass  # reported by the local provider's teardown record; shutting down regardless


class MachineBacked:
    """Mixin of a simulator's API (before its provider's fake API in the bases): the machines
    behind its resources, and answers that report 127.0.0.1 as their address.

    Args:
        provider: the provider's registry name.
        machines: the process backend.
        **kwargs: :class:`runbook_lib.providers.fixtures.FixtureApi`'s arguments (``key``, ``script``).
    """

    def __init__(self, provider: str, *, machines: Machines, **kwargs: Any) -> None:
        super().__init__(provider, ip=HOST, **kwargs)  # type: ignore[call-arg]
        self.machines = machines
        self.lies: dict[str, dict[str, Any]] = {}  # offer id -> facts the machine really has
        self.limits: dict[str, float] = dict(sim_module(provider).LIMITS)
        self.stand_ins: dict[str, tuple[str, ...]] = {}  # image -> the local command that serves for it

    def machine_command(self, image: str, command: str | list[str], env: dict[str, str],
                        port: int | None, *, keep_port: bool = False) -> tuple[list[str] | str, bool]:
        """What a machine created for ``image`` runs, and whether it is a stand-in: the command it
        was given, or, when a stand-in is declared for ``image`` (:func:`stand_in_problems`), the
        stand-in with ``{port}`` set to the local port that serves the published API port and
        ``{NAME}`` to the machine's environment value of NAME. A stand-in naming a variable the
        machine does not have runs as a command that exits with that error (the launch's
        readiness then reports it), as an image that cannot start would. ``keep_port``: ``{port}``
        stays in the argv, for a worker runtime that starts the stand-in on a port of its own
        (:mod:`runbook_lib.providers.runpod.handler_worker`)."""
        argv = self.stand_ins.get(image)
        if argv is None:
            return command, False
        try:
            return [a.format_map({**env, "port": "{port}" if keep_port else str(port or "")}) for a in argv], True
        except (KeyError, ValueError, IndexError) as exc:
            why = f"stand-in for {image}: placeholder {exc} is not in the machine's environment ({sorted(env)})"
            return [sys.executable, "-c", f"import sys; sys.exit({why!r})"], True


class SimServer:
    """``api`` served over HTTP on ``host:port`` (0: a free port) in a background thread.

    Attributes:
        url: ``http://127.0.0.1:<port>``, the base URL to give the adapter.
    """

    def __init__(self, api: FixtureApi, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.api = api
        lock = threading.Lock()
        name = api.provider

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # a streamed chunk leaves at once, not after the peer's delayed ACK

            def log_message(self, *args: Any) -> None:  # the API keeps its own request log
                pass

            def _serve(self) -> None:
                import httpx

                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size) if size else b""
                request = httpx.Request(self.command, f"http://{self.headers.get('Host', host)}{self.path}",
                                        headers=[(k, v) for k, v in self.headers.items()], content=body)
                try:
                    response = api.passthrough(request)
                    if response is None:
                        with lock:
                            response = api.handle(request)
                except Exception as exc:  # noqa: BLE001 - a simulator bug answers 500, like a real server
                    response = httpx.Response(500, json={"error": "simulator", "msg": f"{type(exc).__name__}: {exc}"})
                streamed = response.headers.get("content-type", "").startswith("text/event-stream")
                self.send_response(response.status_code)
                for k, v in response.headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header(SIMULATOR_HEADER, name)
                if streamed:  # server-sent events pass through chunk by chunk, as a real proxy streams them
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for chunk in response.iter_raw():
                        if not chunk:  # an empty chunk would end the body
                            continue
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    return
                payload = response.content
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve  # noqa: N815 - http.server's names

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = LISTEN_BACKLOG  # a saturation burst connects all at once

        self.server = Server((host, port), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name=f"sim-{name}", daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stop serving and destroy every machine the simulator started."""
        self.server.shutdown()
        self.server.server_close()
        pool = getattr(self.api, "_proxy_http", None)
        if pool is not None:
            pool.close()
        machines = getattr(self.api, "machines", None)
        if isinstance(machines, Machines):
            machines.close()

    def request_summary(self) -> dict[str, int]:
        """Requests served, by ``METHOD /path`` with resource ids folded (``{id}``)."""
        out: dict[str, int] = {}
        for method, path, _ in self.api.requests:
            parts = path.split("/", 1)[-1].strip("/").split("/")
            shape = "/".join("{id}" if any(c.isdigit() for c in p) and p not in ("v0", "v1", "v2") else p for p in parts)
            key = f"{method} /{shape}"
            out[key] = out.get(key, 0) + 1
        return dict(sorted(out.items()))


class SimModule(Protocol):
    """What a provider's simulator (``runbook_lib/providers/<name>/sim.py``) declares."""

    LIMITS: dict[str, float]  # the waits and limits a run may set (seconds), with their defaults
    SCRIPTS: dict[str, frozenset[str]]  # the operations a fault script may name, and their answers
    KEY_ENV: str  # the variable the adapter reads its key from
    KEY_PREFIX: str  # what a simulator key starts with

    def exports(self, url: str, key: str) -> dict[str, str]:
        """The environment that points the adapter at a simulator at ``url``."""
        ...

    def overrides(self, url: str) -> dict[str, Any]:
        """The profile's params fields that point it at a simulator at ``url``."""
        ...


def simulated() -> tuple[str, ...]:
    """The remote providers that have a simulator (a ``sim`` module in their package), in the
    provider table's order."""
    return tuple(name for name in PROVIDERS if name in REMOTE
                 and importlib.util.find_spec(f"{PROVIDERS[name]}.sim") is not None)


def sim_module(provider: str) -> SimModule:
    """The simulator module of ``provider``.

    Raises:
        ValueError: ``provider`` has no simulator (the message names those that do).
    """
    if provider not in simulated():
        raise ValueError(f"no simulator for provider {provider!r}; there are simulators for {list(simulated())}")
    return cast(SimModule, importlib.import_module(f"{PROVIDERS[provider]}.sim"))


def stand_in_problems(stand_ins: Any) -> list[str]:
    """What is wrong with a simulator's stand-ins (``{image: [argv...]}``), each as a sentence;
    empty when they are valid. A stand-in is the local command a simulated machine runs when it is
    created for that image (there is no container runtime here), as the local provider runs
    ``workload.service.stand_in``; ``{port}`` and ``{NAME}`` are filled per machine."""
    if not isinstance(stand_ins, dict):
        return [f"stand-ins must be an object of image: [command, args...], got {stand_ins!r}"]
    return [f"stand-in for {image!r} must be a non-empty list of strings, got {argv!r}"
            for image, argv in stand_ins.items()
            if not isinstance(image, str) or not isinstance(argv, (list, tuple)) or not argv
            or not all(isinstance(a, str) for a in argv)]


def fault_problems(provider: str, faults: Any) -> list[str]:
    """What is wrong with one simulator's faults (``{"script", "lies", "limits"}``), each as a
    sentence; empty when they are valid. A misspelled operation or answer would run the drill
    without its fault, so everything is checked against the simulator's ``SCRIPTS`` and ``LIMITS``
    (:class:`SimModule`)."""
    import math

    if not isinstance(faults, dict):
        return [f"the {provider} faults must be an object with script, lies and limits, got {faults!r}"]
    out = [f"unknown keys {sorted(set(faults) - {'script', 'lies', 'limits'})}; use script, lies and limits"] \
        if set(faults) - {"script", "lies", "limits"} else []
    script, lies, limits = faults.get("script") or {}, faults.get("lies") or {}, faults.get("limits") or {}
    module = sim_module(provider)
    scripts, known_limits = module.SCRIPTS, module.LIMITS
    if not isinstance(script, dict):
        out.append(f"script must be an object of operation: [answers], got {script!r}")
        script = {}
    for op, answers in script.items():
        if op not in scripts:
            out.append(f"unknown script operation {op!r}; the {provider} simulator has {sorted(scripts)}")
        elif not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
            out.append(f"script {op} must be a list of answers, got {answers!r}")
        elif set(answers) - scripts[op]:
            out.append(f"unknown {op} answers {sorted(set(answers) - scripts[op])}; {op} answers "
                       f"{sorted(scripts[op])}")
    if not isinstance(lies, dict) or not all(isinstance(v, dict) for v in lies.values()):
        out.append(f"lies must be an object of offer id: {{field: value}}, got {lies!r}")
    if not isinstance(limits, dict):
        out.append(f"limits must be an object of name: seconds, got {limits!r}")
        limits = {}
    for key, value in limits.items():
        if key not in known_limits:
            out.append(f"unknown limits [{key!r}]; the {provider} simulator has {sorted(known_limits)}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
            out.append(f"limit {key} must be a positive number of seconds, got {value!r}")
    return out


def simulate(provider: str, *, state_dir: str | Path, key: str, host: str = "127.0.0.1", port: int = 0,
             script: dict[str, list[str]] | None = None, lies: dict[str, dict[str, Any]] | None = None,
             limits: dict[str, float] | None = None,
             stand_ins: dict[str, list[str] | tuple[str, ...]] | None = None) -> SimServer:
    """Start the simulator of remote provider ``provider`` and return its server.

    Args:
        state_dir: where its machines keep their disks and logs.
        key: the Bearer key it accepts (give the adapter the same one, e.g. ``RUNPOD_API_KEY``).
        script: scripted faults, served first (the operations and answers of
            :class:`runbook_lib.providers.fixtures.FixtureApi`, e.g. ``{"create": ["created_then_502"]}``).
        lies: per offer id, machine facts that differ from what the offer listed (Vast.ai: instance
            fields such as ``{"cuda_max_good": 11.8}``): the machine is not what was advertised, and
            readiness must catch it.
        limits: overrides of the simulator's ``LIMITS``.
        stand_ins: per image, the local command its machines run instead of the command they
            were given (:meth:`MachineBacked.machine_command`); more can be added to
            ``server.api.stand_ins`` while it serves.

    Raises:
        ValueError: ``provider`` has no simulator, ``limits`` names a limit it does not have, or
            a stand-in is not a list of strings.
    """
    module: Any = sim_module(provider)
    api = module.SimApi(provider, machines=Machines(Path(state_dir) / provider), key=key, script=script)
    problems = fault_problems(provider, {"script": script or {}, "lies": lies or {}, "limits": limits or {}})
    if problems:
        raise ValueError(f"bad faults for the {provider} simulator: {'; '.join(problems)}")
    problems = stand_in_problems(stand_ins or {})
    if problems:
        raise ValueError(f"bad stand-ins for the {provider} simulator: {'; '.join(problems)}")
    api.stand_ins = {image: tuple(argv) for image, argv in (stand_ins or {}).items()}
    api.lies = dict(lies or {})
    api.limits = {**module.LIMITS, **{k: float(v) for k, v in (limits or {}).items()}}
    return SimServer(api, host=host, port=port)
