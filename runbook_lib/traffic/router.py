"""Routers: what moves real traffic between the source and the target during a cutover.

A router splits the requests sent to one front URL between two servers, ``source`` and
``target``, by weight (0-100 each), and reports its own counters; phase 05 sets the weights
step by step and reads them back. Two implementations:

* :class:`HAProxyRouter`: HAProxy driven through its runtime API on the admin socket (``set
  server <backend>/<server> weight N``, ``get weight``, ``set server ... state drain|ready``,
  ``show stat``; HAProxy management guide, "Unix Socket commands"): no reload, so requests in
  flight are never cut. :meth:`HAProxyRouter.start` runs one on loopback in front of two URLs
  (the demo's); :meth:`HAProxyRouter.attach` drives an existing one by socket path, backend and
  server names. The backend retries a request only when its connection failed (HAProxy's default
  ``retry-on conn-failure``): a request that reached a server is never sent again. Every answer
  carries ``X-Runbook-Server`` naming the server that gave it, so a caller can count who served.
* :class:`CommandRouter`: a user's own router, driven by a declared set-weights command and a
  read-back command (JSON), so any gateway can be used.
* :class:`ClientRouter`: the runbook's own split (the embedded default): no front URL; the phase
  asks it which side each of its own test requests goes to, and it counts what it sent.

Every failure to reach or drive a router is a :class:`~runbook_lib.errors.ProviderError` naming
the router, what was asked and what came back.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from runbook_lib._http import free_port
from runbook_lib.errors import ProviderError

SIDES = ("source", "target")
SERVER_HEADER = "X-Runbook-Server"
"""The answer header naming the server (``source`` or ``target``) that gave it."""
MAX_WEIGHT = 100
"""Weights are percentages; HAProxy accepts 0-256 (management guide, ``set weight``)."""
SOCKET_TIMEOUT_S = 5.0
START_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ServerStat:
    """One server as the router counts it: its weight, state (``UP``, ``DOWN``, ``DRAIN``,
    ``MAINT``, ``no check``), requests it was sent in all (HAProxy ``stot``), answers by class
    (``hrsp_2xx``, ``hrsp_5xx``), connection and response errors (``econ``, ``eresp``) and the
    requests it holds now (``scur``)."""

    weight: int
    state: str
    requests: int
    answered_2xx: int = 0
    answered_5xx: int = 0
    errors: int = 0
    in_flight: int = 0


class Router(Protocol):
    """What phase 05 drives: a front URL, weights set and read back, drain, counters."""

    kind: str
    url: str

    def set_weights(self, source: int, target: int) -> None: ...

    def weights(self) -> dict[str, int]: ...

    def drain(self, side: str) -> None: ...

    def stats(self) -> dict[str, ServerStat]: ...

    def close(self) -> None: ...


def _check_weights(source: int, target: int) -> None:
    if not (0 <= source <= MAX_WEIGHT and 0 <= target <= MAX_WEIGHT) or source + target == 0:
        raise ValueError(f"weights must lie in 0..{MAX_WEIGHT} and not both be 0, got source {source}, target {target}")


def _host_port(url: str) -> str:
    rest = url.split("://", 1)[-1].split("/", 1)[0]
    if ":" not in rest:
        raise ValueError(f"{url!r} names no port; a router needs host:port for each server")
    return rest


def executable(name: str) -> str | None:
    """The path of executable ``name``: on PATH, in ``/usr/sbin`` or ``/usr/local/sbin`` (where
    Debian puts HAProxy, off a user's PATH), or ``name`` itself when it is an executable file;
    None when there is none."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")
    if found:
        return found
    return name if Path(name).is_file() and os.access(name, os.X_OK) else None


def haproxy_config(*, frontend_port: int, socket_path: Path, source: str, target: str, backend: str = "migration",
                   timeout_s: float = 30.0, check_path: str = "/ping", check_status: int = 200) -> str:
    """An HAProxy configuration in front of ``source`` and ``target`` (``host:port``): a loopback
    frontend, one backend with both servers (source weight 100, target 0), health checks of
    ``GET check_path`` expecting ``check_status`` every second, connection-failure retries only,
    the serving server named in :data:`SERVER_HEADER`, and an admin-level runtime socket at
    ``socket_path``."""
    return f"""global
    stats socket {socket_path} mode 600 level admin
    maxconn 1024

defaults
    mode http
    timeout connect 2s
    timeout client {timeout_s:g}s
    timeout server {timeout_s:g}s
    timeout queue {timeout_s:g}s
    retries 2
    option redispatch

frontend runbook_front
    bind 127.0.0.1:{frontend_port}
    default_backend {backend}

backend {backend}
    balance roundrobin
    option httpchk GET {check_path}
    http-check expect status {check_status}
    http-response set-header {SERVER_HEADER} %s
    server source {source} weight {MAX_WEIGHT} check inter 1s fall 2 rise 1
    server target {target} weight 0 check inter 1s fall 2 rise 1
"""


class HAProxyRouter:
    """HAProxy through its runtime API (management guide, "Unix Socket commands").

    Args:
        socket_path: the admin socket (``stats socket ... level admin``).
        url: the frontend URL traffic is sent to.
        backend: the backend holding the two servers.
        servers: the server names for ``source`` and ``target`` in that backend.
        process: the HAProxy process this object started (stopped by :meth:`close`), or None.
    """

    kind = "haproxy"

    def __init__(self, socket_path: Path, url: str, *, backend: str = "migration",
                 servers: dict[str, str] | None = None, process: subprocess.Popen[bytes] | None = None,
                 workdir: Path | None = None) -> None:
        self.socket_path = Path(socket_path)
        self.url = url
        self.backend = backend
        self.servers = servers or {s: s for s in SIDES}
        self.process = process
        self.workdir = workdir

    @classmethod
    def start(cls, source_url: str, target_url: str, *, binary: str = "haproxy", timeout_s: float = 30.0,
              workdir: Path | None = None, check_path: str = "/ping", check_status: int = 200) -> HAProxyRouter:
        """Run HAProxy on loopback in front of ``source_url`` and ``target_url`` (all traffic on the
        source, each server checked by ``GET check_path`` answering ``check_status``: an endpoint's
        ``/ping``, a service's readiness), wait for its admin socket, and return it.

        Raises:
            ProviderError: no HAProxy binary (Debian: ``apt-get install haproxy``), its
                configuration was refused, or its socket did not answer within
                :data:`START_TIMEOUT_S` (its output is named).
        """
        exe = executable(binary)
        if exe is None:
            raise ProviderError(f"router haproxy: no {binary!r} binary on this machine; install Debian's haproxy "
                                "package (`make haproxy` as root) or name the binary in cutover.router.binary")
        work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="runbook-haproxy-"))
        work.mkdir(parents=True, exist_ok=True)
        # A unix socket's path is short (HAProxy: at most 97 bytes): the socket lives in a private
        # (0700) directory of its own under the system's temporary directory, not in ``work``.
        sock = Path(tempfile.mkdtemp(prefix="rb-haproxy-")) / "admin.sock"
        port = free_port()
        cfg = work / "haproxy.cfg"
        cfg.write_text(haproxy_config(frontend_port=port, socket_path=sock, source=_host_port(source_url),
                                      target=_host_port(target_url), timeout_s=timeout_s, check_path=check_path,
                                      check_status=check_status))
        log = open(work / "haproxy.log", "wb")  # noqa: SIM115 - handed to the process
        proc = subprocess.Popen([exe, "-db", "-f", str(cfg)], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env=dict(os.environ))  # a copy: see workload/job.py's _child
        log.close()
        router = cls(sock, f"http://127.0.0.1:{port}", process=proc, workdir=work)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                shutil.rmtree(sock.parent, ignore_errors=True)
                raise ProviderError(f"router haproxy exited at start (code {proc.returncode}): "
                                    f"{(work / 'haproxy.log').read_text()[-800:]}")
            try:
                router.command("show info")
                return router
            except ProviderError:
                if time.monotonic() > deadline:
                    router.close()
                    raise ProviderError(f"router haproxy: its admin socket {sock} did not answer within "
                                        f"{START_TIMEOUT_S:g} s") from None
                time.sleep(0.05)

    @classmethod
    def attach(cls, socket_path: str, url: str, *, backend: str, servers: dict[str, str]) -> HAProxyRouter:
        """Drive an HAProxy someone else runs, by its admin socket; checks that the socket answers
        and that ``backend`` holds both ``servers``.

        Raises:
            ProviderError: the socket does not answer, or the backend or a server is not there.
        """
        router = cls(Path(socket_path), url, backend=backend, servers=servers)
        have = {row["svname"] for row in router._rows() if row["pxname"] == backend}
        missing = [f"{backend}/{name}" for name in servers.values() if name not in have]
        if missing:
            raise ProviderError(f"router haproxy at {socket_path}: no server {', '.join(missing)} (the backend has "
                                f"{sorted(have - {'BACKEND', 'FRONTEND'}) or 'nothing'}); name the backend and servers "
                                "in cutover.router")
        return router

    def command(self, line: str) -> str:
        """Send one runtime API command and return HAProxy's answer.

        Raises:
            ProviderError: the socket cannot be reached or answered an error.
        """
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(SOCKET_TIMEOUT_S)
                s.connect(str(self.socket_path))
                s.sendall(line.encode() + b"\n")
                chunks = []
                while True:
                    data = s.recv(65536)
                    if not data:
                        break
                    chunks.append(data)
        except OSError as exc:
            raise ProviderError(f"router haproxy: cannot reach its admin socket {self.socket_path} "
                                f"({type(exc).__name__}: {exc}) for {line!r}") from None
        answer = b"".join(chunks).decode(errors="replace")
        if answer.lstrip().lower().startswith(("unknown command", "no such", "permission denied", "require")):
            raise ProviderError(f"router haproxy: {line!r} answered {answer.strip()[:300]!r}")
        return answer

    def set_weights(self, source: int, target: int) -> None:
        """Set both servers' weights (percent), without a reload.

        Raises:
            ValueError: a weight outside 0..100, or both 0.
            ProviderError: HAProxy refused a command.
        """
        _check_weights(source, target)
        for side, w in (("source", source), ("target", target)):
            answer = self.command(f"set server {self.backend}/{self.servers[side]} weight {w}").strip()
            if answer:
                raise ProviderError(f"router haproxy: set weight {w} on {self.backend}/{self.servers[side]} answered "
                                    f"{answer[:300]!r}")

    def weights(self) -> dict[str, int]:
        """Each side's current weight as HAProxy reports it (``get weight``: "current (initial N)")."""
        out = {}
        for side in SIDES:
            answer = self.command(f"get weight {self.backend}/{self.servers[side]}").strip()
            try:
                out[side] = int(answer.split()[0])
            except (IndexError, ValueError):
                raise ProviderError(f"router haproxy: get weight {self.backend}/{self.servers[side]} answered "
                                    f"{answer[:200]!r}") from None
        return out

    def drain(self, side: str) -> None:
        """Stop sending new requests to ``side``; those it holds finish (``state drain``)."""
        self.command(f"set server {self.backend}/{self.servers[side]} state drain")

    def ready(self, side: str) -> None:
        """Undo :meth:`drain`."""
        self.command(f"set server {self.backend}/{self.servers[side]} state ready")

    def _rows(self) -> list[dict[str, str]]:
        text = self.command("show stat")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if not lines or not lines[0].startswith("# "):
            raise ProviderError(f"router haproxy: show stat answered {text[:200]!r}")
        return list(csv.DictReader(io.StringIO("\n".join([lines[0][2:], *lines[1:]]))))

    def stats(self) -> dict[str, ServerStat]:
        """Each side's counters (``show stat``)."""
        rows = {row["svname"]: row for row in self._rows() if row["pxname"] == self.backend}

        def num(row: dict[str, str], key: str) -> int:
            return int(row.get(key) or 0)

        out = {}
        for side in SIDES:
            row = rows.get(self.servers[side])
            if row is None:
                raise ProviderError(f"router haproxy: show stat lists no {self.backend}/{self.servers[side]}")
            out[side] = ServerStat(weight=num(row, "weight"), state=row.get("status", ""), requests=num(row, "stot"),
                                   answered_2xx=num(row, "hrsp_2xx"), answered_5xx=num(row, "hrsp_5xx"),
                                   errors=num(row, "econ") + num(row, "eresp"), in_flight=num(row, "scur"))
        return out

    def close(self) -> None:
        """Stop the HAProxy this object started (graceful: SIGUSR1 lets requests in flight finish,
        then SIGTERM after 5 s); one it attached to is left running."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(10)  # SIGUSR1: soft stop
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.terminate()
                self.process.wait(timeout=5)
        shutil.rmtree(self.socket_path.parent, ignore_errors=True)  # the private socket directory start() made


class ClientRouter:
    """The client-side split (``cutover.router.kind: client``): the caller sends its own requests
    and asks :meth:`pick` which side each goes to, the target with probability ``target / (source
    + target)`` of the weights set (``numpy.random.default_rng(seed)``), none to a drained side.
    Its counters are the requests it picked for each side. No traffic but the caller's passes it."""

    kind = "client"
    url = ""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self._weights = {"source": MAX_WEIGHT, "target": 0}
        self._drained: set[str] = set()
        self._sent = dict.fromkeys(SIDES, 0)

    def set_weights(self, source: int, target: int) -> None:
        _check_weights(source, target)
        self._weights = {"source": source, "target": target}
        self._drained -= {side for side, w in self._weights.items() if w > 0}

    def weights(self) -> dict[str, int]:
        return dict(self._weights)

    def drain(self, side: str) -> None:
        self._drained.add(side)

    def pick(self, n: int) -> list[bool]:
        """Which of ``n`` requests go to the target (True) rather than the source, counted."""
        total = sum(self._weights.values())
        share = 0.0 if "target" in self._drained else self._weights["target"] / total
        if "source" in self._drained and share > 0:
            share = 1.0
        to_target = [bool(x) for x in self._rng.random(n) < share]
        self._sent["target"] += sum(to_target)
        self._sent["source"] += n - sum(to_target)
        return to_target

    def stats(self) -> dict[str, ServerStat]:
        return {side: ServerStat(weight=self._weights[side], state="DRAIN" if side in self._drained else "UP",
                                 requests=self._sent[side]) for side in SIDES}

    def close(self) -> None:
        pass


def run_command(argv: Sequence[str], *, what: str, timeout_s: float, cwd: Path | None = None) -> str:
    """Run a user's command (a router's or a schedule's) and return what it printed.

    Args:
        argv: the command. what: how errors name it (``router command: read``).
        timeout_s: how long it may take, seconds. cwd: its working directory.

    Raises:
        ProviderError: it could not start, ran past ``timeout_s``, or exited non-zero (its exit
            status and the tail of what it printed).
    """
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, cwd=cwd,
                              env={**os.environ})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ProviderError(f"{what} {list(argv)} could not run ({type(exc).__name__}: {exc})") from None
    if done.returncode != 0:
        raise ProviderError(f"{what} {list(argv)} exited {done.returncode}: "
                            f"{(done.stderr or done.stdout).strip()[-300:]}")
    return done.stdout


class CommandRouter:
    """A user's router driven by commands: ``set`` runs with ``{source}`` and ``{target}`` replaced
    by the weights and must exit 0; ``read`` prints the weights as JSON (``{"source": 90,
    "target": 10}``) and each side's counters (``"stats": {"source": {"requests": N, "state":
    "UP"}, ...}``: phase 05 checks the target's share against them, so a read-back without them
    fails every step; a state not given is ``NOT REPORTED``); ``drain`` (optional) runs with
    ``{side}``.

    Args:
        url: the URL traffic is sent to (the user's router).
        set_command: argv of the set-weights command.
        read_command: argv of the read-back command.
        drain_command: argv of the drain command, or empty.
        timeout_s: how long each command may take.
    """

    kind = "command"

    def __init__(self, url: str, set_command: Sequence[str], read_command: Sequence[str],
                 drain_command: Sequence[str] = (), *, timeout_s: float = 10.0, cwd: Path | None = None) -> None:
        self.url = url
        self.set_command, self.read_command, self.drain_command = tuple(set_command), tuple(read_command), \
            tuple(drain_command)
        self.timeout_s = timeout_s
        self.cwd = cwd

    def _run(self, argv: Sequence[str], what: str) -> str:
        return run_command(argv, what=f"router command: {what}", timeout_s=self.timeout_s, cwd=self.cwd)

    def _read(self) -> dict[str, object]:
        out = self._run(self.read_command, "read")
        try:
            body = json.loads(out)
            assert isinstance(body, dict)
            return body
        except (ValueError, AssertionError):
            raise ProviderError(f"router command: read {list(self.read_command)} printed {out.strip()[:200]!r}, not "
                                'a JSON object like {"source": 90, "target": 10}') from None

    def set_weights(self, source: int, target: int) -> None:
        _check_weights(source, target)
        self._run([a.format(source=source, target=target) for a in self.set_command], "set")

    def weights(self) -> dict[str, int]:
        body = self._read()
        try:
            return {side: int(body[side]) for side in SIDES}  # type: ignore[call-overload]
        except (KeyError, TypeError, ValueError):
            raise ProviderError(f"router command: read printed {body!r}: it needs integer source and target "
                                "weights") from None

    def drain(self, side: str) -> None:
        if self.drain_command:
            self._run([a.format(side=side) for a in self.drain_command], "drain")

    def stats(self) -> dict[str, ServerStat]:
        body = self._read()
        weights = self.weights()
        counted = body.get("stats") if isinstance(body.get("stats"), dict) else {}
        assert isinstance(counted, dict)
        return {side: ServerStat(weight=weights[side], state=str((counted.get(side) or {}).get("state", "NOT REPORTED")),
                                 requests=int((counted.get(side) or {}).get("requests", -1)))
                for side in SIDES}

    def close(self) -> None:
        pass
