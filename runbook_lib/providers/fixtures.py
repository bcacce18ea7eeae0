"""Recorded-shape fixtures of the remote providers' APIs, served as an httpx transport.

Each provider package keeps its recorded shapes in ``<provider>/recorded/`` and its fake API
(a :class:`FixtureApi` subclass) in ``<provider>/fake.py``; the recorded files follow the documented request and response shapes (field
lists in ``docs/reference/providers.md`` sections 2.4 and 3.9), including the failure
shapes: capacity errors, 429 with and without ``Retry-After``, an expired job TTL, an outbid
instance, an OCI error in ``status_msg``, an exited container, paginated listings.

:class:`FixtureApi` is a small stateful fake of each API built from them: created pods and
instances live in memory and walk through their provider's states as they are polled, and a
``script`` queues failure answers per operation. It is how the tests reach the providers (no
live network), and the documented test option ``runbook run --provider-fixtures`` uses it to
show what phases 01 to 03 would plan against each provider.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
from pathlib import Path
from typing import Any

from runbook_lib.params import REMOTE_PROVIDERS

HERE = Path(__file__).parent  # runbook_lib/providers: <provider>/recorded/<file>
FIXTURE_KEY = "fixture-key"  # the Bearer value the fake APIs accept; not a credential
ENV = "RUNBOOK_PROVIDER_FIXTURES"
"""When set (to a directory), remote providers talk to :class:`FixtureApi` and log every request
line (method, host, path; never headers) to ``<dir>/<provider>-requests.log``."""
SOURCE_POD = "src7h2kq9x"  # the running source pod in runpod/pod_source_running.json


def load(provider: str, fixture: str, **subst: Any) -> Any:
    """A fixture file; in its JSON strings, ``{{key}}`` placeholders are replaced by ``subst`` values."""
    text = (HERE / provider / "recorded" / fixture).read_text()
    if not fixture.endswith(".json"):
        return text

    def fill(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: fill(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fill(x) for x in v]
        if isinstance(v, str):
            for k, x in subst.items():
                v = v.replace("{{%s}}" % k, str(x))
        return v

    return fill(json.loads(text))


def _public(v: Any) -> Any:
    """``v`` without the fake's own bookkeeping (keys starting with ``_``), as the API would answer."""
    if isinstance(v, dict):
        return {k: _public(x) for k, x in v.items() if not str(k).startswith("_")}
    if isinstance(v, list):
        return [_public(x) for x in v]
    return v


class FixtureApi:
    """A fake provider API: the state, script, request log and transport every fake shares;
    a provider's subclass answers in :meth:`answer`. Build one with :func:`fixture_api`.

    Args:
        provider: a remote provider's registry name.
        script: operation -> answers served first, in order. Runpod operations: ``create``
            (``ok``, ``capacity``, ``rate``, ``unauthorized``, ``invalid``, ``created_then_502``),
            ``endpoint`` (``ok``, ``created_then_502``; simulator: ``worker_crash``, its
            workers die every 7 jobs, a handler's worker holding its eighth; ``throttled``, its
            workers wait ``throttled_s`` for a GPU), ``poll`` (pod
            statuses), ``spot`` (``ok``, ``supply``), ``job`` (answers to ``/status``: ``in_queue``,
            ``in_progress``, ``completed``, ``completed_empty``, ``failed``, ``timed_out``,
            ``ttl``, ``rate``), ``runsync`` (answers to ``/runsync``: ``in_queue``,
            ``in_progress``, ``completed_empty``, ``rate``), ``workers`` (``unhealthy``,
            ``throttled``). Vast operations: ``create`` (``ok``, ``gone``, ``bid_fail``,
            ``rate``, ``created_then_502``; simulator: ``worker_crash``, the instance's serving
            worker dies after 7 requests; ``outbid``, the instance is outbid mid-run), ``poll`` (``null_status``, ``loading``, ``running``,
            ``exited_oci_error``, ``outbid_stopped``), ``search`` (``rate``), ``workergroup``
            (``ok``, ``invalid``: a Serverless workergroup's create is refused with 400; simulator:
            ``worker_crash``, its workers die holding their eighth request).
        log_dir: append request lines to ``<log_dir>/<provider>-requests.log``.
        ip: the public address reported for running machines (tests probe it).
        state_path: keep the fake account's pods and instances in this JSON file, so the phases of
            one run (separate notebook kernels) see one account.
        agent_exits_after: a pod that publishes no ports (an agent) exits after this many polls
            while running (None: it keeps running).
        key: the Bearer key it accepts (the fixture key by default; a simulator's own).
    """

    error_content_type = "application/json"

    def __init__(self, provider: str, *, script: dict[str, list[str]] | None = None, log_dir: str | Path = "",
                 ip: str = "203.0.113.51", state_path: str | Path = "", agent_exits_after: int | None = None,
                 key: str = FIXTURE_KEY) -> None:
        self.provider = provider
        self.key = key
        self.script = {k: list(v) for k, v in (script or {}).items()}
        self.log_dir = Path(log_dir) if log_dir else None
        self.ip = ip
        self.requests: list[tuple[str, str, Any]] = []
        self.state: dict[str, dict[str, Any]] = {}
        self.state_path = Path(state_path) if state_path else None
        self.agent_exits_after = agent_exits_after
        self._ids = itertools.count(1)
        self._jobs: dict[str, list[str]] = {}
        if self.state_path is not None and self.state_path.exists():
            saved = json.loads(self.state_path.read_text())
            self.state = saved["state"]
            self._ids = itertools.count(saved["next_id"])

    def _save(self) -> None:
        if self.state_path is not None:
            nxt = next(self._ids)
            self._ids = itertools.count(nxt)
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            self.state_path.write_text(json.dumps({"state": self.state, "next_id": nxt}))

    def _agent_poll(self, rec: dict[str, Any], serves: bool) -> bool:
        """Count a running poll of an agent pod; True when it should now exit."""
        if self.agent_exits_after is None or serves:
            return False
        rec["_polls"] = rec.get("_polls", 0) + 1
        return bool(rec["_polls"] > self.agent_exits_after)

    @property
    def transport(self) -> Any:
        import httpx

        return httpx.MockTransport(self.handle)

    def _next(self, op: str, default: str) -> str:
        queue = self.script.get(op)
        return queue.pop(0) if queue else default

    def _json(self, status: int, body: Any, **headers: str) -> Any:
        import httpx

        ctype = self.error_content_type if status >= 400 else "application/json"
        return httpx.Response(status, content=json.dumps(_public(body)).encode(),
                              headers={"content-type": ctype, **headers})

    def handle(self, request: Any) -> Any:

        body = json.loads(request.content) if request.content else None
        self.requests.append((request.method, request.url.host + request.url.path, body))
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with open(self.log_dir / f"{self.provider}-requests.log", "a") as f:
                f.write(f"{request.method} {request.url.host}{request.url.path}\n")
        if request.headers.get("authorization") != f"Bearer {self.key}":
            return self.unauthorized()
        response = self.answer(request, body)
        self._save()
        return response

    def unauthorized(self) -> Any:
        """The provider's answer to a wrong key."""
        import httpx

        return httpx.Response(401, json={"error": "unauthorized"})

    def answer(self, request: Any, body: Any) -> Any:
        """The provider's answer to an authorized request (``body``: parsed JSON or None)."""
        raise NotImplementedError

    def passthrough(self, request: Any) -> Any:
        """A simulator's answer to a request served outside its lock (one that waits on a
        machine, such as a job API ``runsync``), or None for every other request. Fakes have none."""
        return None


def transport_from_env(provider: str) -> Any:
    """The fixture transport when :data:`ENV` is set, else None (the network). One fake account
    per directory, shared by the run's kernels; agent pods exit after two polls (they run no
    agent: the store never sees their results)."""
    where = os.environ.get(ENV)
    if not where:
        return None
    return fixture_api(provider, log_dir=where, state_path=Path(where) / f"{provider}-state.json",
                       agent_exits_after=2).transport


def fixture_api(provider: str, **kwargs: Any) -> FixtureApi:
    """The fake API of remote provider ``provider`` (its package's ``fake.FakeApi``), built with
    :class:`FixtureApi`'s arguments.

    Raises:
        ValueError: ``provider`` is not a remote provider (the local provider needs no fake).
    """
    if provider not in REMOTE_PROVIDERS:
        raise ValueError(f"no fixtures for provider {provider!r}; remote providers: {sorted(REMOTE_PROVIDERS)}")
    cls: type[FixtureApi] = importlib.import_module(f"runbook_lib.providers.{provider}.fake").FakeApi
    return cls(provider, **kwargs)
