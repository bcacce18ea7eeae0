"""Authenticated JSON over httpx for the remote providers, with every failure translated in one place.

One :class:`ApiClient` per provider surface (Runpod REST v2, Runpod job API, Vast.ai). It
resolves the API key lazily from a reference (``env:VAR`` / ``file:/path`` / the provider's
standard key files), sends it as ``Authorization: Bearer``, retries 429 and 502/503/504 (a
request that creates something: 429 only, see :meth:`ApiClient.request`), and turns every other answer into the runbook's exception tree (:mod:`runbook_lib.errors`). The key
never appears in a message: bodies quoted in errors are cut short and scrubbed of it.

Rate limits: ``Retry-After`` (RFC 9110 section 10.2.3, seconds) wins; else the reset ``t`` of a
``RateLimit`` header (IETF httpapi-ratelimit-headers, as Runpod's v2 spec declares it); else our
own exponential backoff starting at 0.15 s x 1.5 (vast-cli's schedule; Vast's 429 is plain text
without ``Retry-After``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from runbook_lib import secret_refs as _secret_refs
from runbook_lib._http import Backoff, retry_after_s  # noqa: F401 - retry_after_s: public here, as before
from runbook_lib.errors import (
    AuthError,
    BadRequest,
    CreateOutcomeUnknown,
    NotFound,
    ProviderError,
    ProviderTimeout,
    RateLimited,
)

RETRY_STATUSES = frozenset({429, 502, 503, 504})
SIMULATOR_HEADER = "X-Runbook-Simulator"  # a loopback simulator names itself in every answer
BACKOFF_START_S = 0.15  # vast-cli vastai/api/client.py: first retry after 0.15 s ...
BACKOFF_FACTOR = 1.5  # ... each next one 1.5 x longer
MAX_RETRY_WAIT_S = 60.0  # never sleep longer than this on one answer, seconds
QUOTE_CHARS = 300  # how much of an error body a message quotes


@dataclass
class KeySource:
    """Where a provider's API key may come from, tried in order (names only, never values).

    Attributes:
        provider: registry name, for messages.
        refs: ``env:VAR`` / ``file:/path`` references; ``file:`` paths may start with ``~``.
        toml_key: for ``.toml`` files, the key holding the value in any table (Runpod's
            ``~/.runpod/config.toml`` keeps ``api_key`` under a profile table).
    """

    provider: str
    refs: tuple[str, ...]
    toml_key: str = "api_key"
    _value: str | None = field(default=None, repr=False)

    def resolve(self) -> str:
        """The key value.

        Raises:
            AuthError: no reference resolves; the message lists the references tried.
        """
        if self._value:
            return self._value
        for ref in self.refs:
            value = _read_ref(ref, self.toml_key)
            if value:
                self._value = value
                return value
        raise AuthError(
            f"{self.provider}: no API key found; tried {', '.join(self.refs)}. Set one of them (or name another "
            "reference with api_key_ref on the source or target profile; the key itself never goes in params), "
            "then run again. Nothing was created.", provider=self.provider)

    def present(self) -> bool:
        """True when some reference resolves (no value is returned)."""
        try:
            self.resolve()
        except AuthError:
            return False
        return True


def _read_ref(ref: str, toml_key: str) -> str | None:
    kind, _, where = ref.partition(":")
    if kind == "file" and where.endswith(".toml"):
        import tomllib

        p = Path(where).expanduser()
        if not p.is_file():
            return None
        try:
            data = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError:
            raise AuthError(f"key file {where} is not valid TOML; fix or remove it") from None
        tables = [data] + [v for v in data.values() if isinstance(v, dict)]
        found = [t[toml_key] for t in tables if isinstance(t.get(toml_key), str)]
        return found[0].strip() if found else None
    return _secret_refs.resolve("API key", ref, required=False)


def api_url(configured: str, env_var: str, default: str) -> str:
    """The base URL of a provider API: the params value when set, else the environment variable
    ``env_var``, else the provider's documented address. A rehearsal points it at a simulator."""
    import os

    return (configured or os.environ.get(env_var, "") or default).rstrip("/")


def problem_text(body: Any, raw: str) -> str:
    """One line out of an error body: RFC 9457 problem JSON (``title``/``detail``/``errors``),
    Vast's ``{error, msg|message}``, GraphQL ``errors[].message``, or the raw text."""
    if isinstance(body, dict):
        parts = [str(body[k]) for k in ("title", "error", "detail", "msg", "message") if body.get(k)]
        errs = body.get("errors")
        if isinstance(errs, list):
            parts += [e.get("message", str(e)) if isinstance(e, dict) else str(e) for e in errs]
        if parts:
            return "; ".join(parts)
    return raw.strip()


class ApiClient:
    """JSON requests to one provider API.

    Args:
        provider: registry name (``runpod``, ``vast``), used in every error.
        base_url: scheme and host (``https://api.runpod.io``).
        key: where the API key comes from.
        transport: an httpx transport; tests and the fixture mode inject one, None means the network.
        timeout_s: per-request timeout, seconds.
        max_retries: retries of a 429/502/503/504 before giving up.
        sleep: injected for tests, so backoff does not wait.
        classify: provider hook ``(status, body, text) -> ProviderError | None`` that recognises
            provider-specific failures (a capacity error inside a 400) before the generic mapping.
    """

    def __init__(self, *, provider: str, base_url: str, key: KeySource, transport: Any = None,
                 timeout_s: float = 30.0, max_retries: int = 5, sleep: Callable[[float], None] = time.sleep,
                 classify: Callable[[int, Any, str], ProviderError | None] | None = None) -> None:
        self.provider = provider
        self.base_url = base_url.rstrip("/")
        self.key = key
        self.transport = transport  # None: the network
        self._timeout_s = timeout_s
        self._backoff = Backoff(max_retries, BACKOFF_START_S, BACKOFF_FACTOR, MAX_RETRY_WAIT_S)
        self._sleep = sleep
        self._classify = classify
        self._http: Any = None
        self.waits_s: list[float] = []  # every backoff slept, seconds (evidence of rate limiting)
        self.simulator = ""  # what an answer's X-Runbook-Simulator header said: the API is a simulator

    def _client(self) -> Any:
        import httpx

        if self._http is None:
            self._http = httpx.Client(base_url=self.base_url, timeout=self._timeout_s, transport=self.transport,
                                      headers={"Accept": "application/json"})
        return self._http

    def close(self) -> None:
        if self._http is not None:
            self._http.close()

    def _scrub(self, text: str) -> str:
        key = self.key._value
        text = text[:QUOTE_CHARS]
        return text.replace(key, "<redacted>") if key else text

    def request(self, method: str, path: str, *, params: dict[str, Any] | None = None, body: Any = None,
                base_url: str | None = None, creates: bool = False) -> Any:
        """Send one request; return the decoded JSON body (None for an empty body).

        ``creates``: the request creates (and bills) a resource. It is then retried only on 429
        (the provider refused it unprocessed, RFC 6585 section 4); a 5xx, a timeout or a
        connection dropped after sending raise :class:`CreateOutcomeUnknown` instead, because a
        second try could rent a second machine. The caller looks the resource up by its labels.

        Raises:
            CreateOutcomeUnknown: ``creates`` and the answer does not say whether it happened.
            AuthError: no key, or 401/403. NotFound: 404. BadRequest: 400/422 the provider hook
            did not classify. RateLimited: still 429 after ``max_retries`` retries.
            ProviderTimeout: the request timed out. ProviderError: anything else (5xx,
            transport failure, a body that is not JSON).
        """
        import httpx

        url = (base_url.rstrip("/") if base_url else "") + path
        headers = {"Authorization": f"Bearer {self.key.resolve()}"}
        what = f"{self.provider}: {method} {path}"
        for attempt in range(self._backoff.retries + 1):
            try:
                r = self._client().request(method, url, params=params, json=body, headers=headers)
            except httpx.HTTPError as exc:
                sent = not isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))  # it may have been done
                if creates and sent and isinstance(exc, (httpx.TimeoutException, httpx.RemoteProtocolError,
                                                         httpx.ReadError)):
                    raise CreateOutcomeUnknown(f"{what}: no answer ({type(exc).__name__}); the resource may have "
                                               "been created", provider=self.provider) from None
                if isinstance(exc, httpx.TimeoutException):
                    raise ProviderTimeout(f"{what} timed out after {self._timeout_s} s ({type(exc).__name__}); "
                                          "the provider is slow or unreachable, try again later",
                                          provider=self.provider) from None
                raise ProviderError(f"{what} failed before an answer: {type(exc).__name__}: {self._scrub(str(exc))}",
                                    provider=self.provider) from None
            self.simulator = self.simulator or r.headers.get(SIMULATOR_HEADER, "")
            text = r.text
            try:
                data = r.json() if text.strip() else None
            except ValueError:
                data = None
            if creates and r.status_code >= 500:
                raise CreateOutcomeUnknown(f"{what} answered HTTP {r.status_code} "
                                           f"({self._scrub(problem_text(data, text))}); the resource may have been "
                                           "created", provider=self.provider)
            if r.status_code in RETRY_STATUSES and attempt < self._backoff.retries:
                wait = self._backoff.wait_s(attempt, r.headers)
                self.waits_s.append(wait)
                self._sleep(wait)
                continue
            if r.status_code < 400:
                if text.strip() and data is None:
                    raise ProviderError(f"{what} answered HTTP {r.status_code} with a body that is not JSON: "
                                        f"{self._scrub(text)!r}", provider=self.provider)
                return data
            raise self._error(r.status_code, data, text, what, attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def request_object(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """:meth:`request` for an endpoint that answers a JSON object: the object, or ``{}`` for an
        empty body or any other JSON value (the wire clients read fields from it). Raises as
        :meth:`request`."""
        out = self.request(method, path, **kwargs)
        return dict(out) if isinstance(out, dict) else {}

    def _error(self, status: int, data: Any, text: str, what: str, attempts: int) -> ProviderError:
        detail = self._scrub(problem_text(data, text))
        if self._classify is not None:
            err = self._classify(status, data, text)
            if err is not None:
                err.args = (f"{what}: {self._scrub(str(err))}",)
                return err
        if status in (401, 403):
            return AuthError(f"{what} was refused (HTTP {status}: {detail}); check that the key named by "
                             f"{', '.join(self.key.refs)} is valid and has the needed scope", provider=self.provider)
        if status == 404:
            return NotFound(f"{what}: not found (HTTP 404: {detail})", provider=self.provider)
        if status == 429:
            return RateLimited(f"{what}: still rate limited after {attempts} retries (waited "
                               f"{sum(self.waits_s):.2f} s in all); slow down or try later", provider=self.provider)
        if status in (400, 409, 410, 422):
            return BadRequest(f"{what} was rejected (HTTP {status}: {detail}); fix the request", provider=self.provider)
        return ProviderError(f"{what} answered HTTP {status}: {detail}", provider=self.provider)
