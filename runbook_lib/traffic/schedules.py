"""Schedules: what starts a workload on a schedule, and which side it starts.

Seed 001 asks for a source inventory that covers schedules, and its example "shifts scheduled
jobs while the source environment remains available for one rollback window". A schedule here is
a pointer with two positions: it starts the workload on the ``source`` or on the ``target``
(read back as ``both`` when both would start, ``neither`` when none would). Phase 01 reads each
one (:func:`read_all`), phase 02 finds its target equivalent (:meth:`Schedule.equivalent`), phase
05 points it at the target after the last cutover step and reads it back (:func:`shift`), and a
rollback (phase 05's own, or phase 06 on NO-GO or HOLD) points it back at the source.

Three kinds, declared in ``source.schedules`` (:class:`runbook_lib.params.ScheduleParams`):

* :class:`AirflowSchedule`: a DAG, over Airflow's stable REST API (v2, Airflow 3):
  ``GET /api/v2/dags/{dag_id}`` (``is_paused``, ``timetable_summary``),
  ``PATCH /api/v2/dags/{dag_id}?update_mask=is_paused`` and
  ``GET``/``PATCH /api/v2/variables/{key}``; a token from ``POST /auth/token`` (user and password
  from the environment, by name) or a bearer token from the environment. ``shift: pause`` pauses
  the source's DAG and unpauses the target's pre-existing one (paused first, so the two never run
  together); ``shift: variable`` sets the Variable the DAG reads.
  https://airflow.apache.org/docs/apache-airflow/stable/stable-rest-api-ref.html
* :class:`CronSchedule`: an entry in a crontab file the runbook may edit: the source's entry is
  replaced by the target's (crontab(5)); the file is written whole and renamed into place.
* :class:`CommandSchedule`: a user's ``read_command`` (prints ``{"side": ..., "schedule": ...}``)
  and ``set_command`` (``{side}`` filled in), like the command router.

Every failure to read or change a schedule is a :class:`~runbook_lib.errors.ProviderError` that
names the schedule, what was asked and what came back; a credential's value is never in it.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

import httpx

from runbook_lib.errors import AuthError, ProviderError
from runbook_lib.params import ScheduleParams
from runbook_lib.traffic.router import run_command

SOURCE, TARGET, BOTH, NEITHER = "source", "target", "both", "neither"
SIDES = (SOURCE, TARGET)
HTTP_TIMEOUT_S = 10.0
COMMAND_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ScheduleState:
    """A schedule as read: which side it starts (``source``, ``target``, ``both`` or
    ``neither``), when it runs (``cadence``: a cron expression or Airflow's timetable summary;
    empty when the command does not say) and what was read, in words (``detail``)."""

    name: str
    kind: str
    side: str
    cadence: str
    detail: str


@dataclass(frozen=True)
class Equivalent:
    """Phase 02's finding for one schedule: what starts the target (``target``), whether it
    runs as the source's does (``same_cadence``; None when it cannot be told) and why."""

    target: str
    same_cadence: bool | None
    reason: str


@dataclass(frozen=True)
class Shifted:
    """One schedule pointed at ``to``: the side it started before and after (read back), and
    the error when changing it failed (then ``after`` is what could be read, or ``""``)."""

    name: str
    kind: str
    to: str
    before: str
    after: str
    detail: str
    error: str = ""

    @property
    def ok(self) -> bool:
        """True when the read-back says the schedule starts ``to`` and nothing failed."""
        return not self.error and self.after == self.to


class Schedule(Protocol):
    """What phases 01, 02, 05 and 06 ask of a schedule."""

    name: str
    kind: str

    def read(self) -> ScheduleState:
        """Which side the schedule starts now.

        Raises:
            ProviderError: it could not be read (unreachable, refused, malformed)."""
        ...

    def point(self, side: str) -> None:
        """Make the schedule start ``side`` (``source`` or ``target``).

        Raises:
            ProviderError: the change was refused or could not be made."""
        ...

    def equivalent(self) -> Equivalent:
        """What starts the target once the schedule is pointed there.

        Raises:
            ProviderError: there is none (a missing DAG or Variable), or it cannot be read."""
        ...


def _side(source_on: bool, target_on: bool) -> str:
    return BOTH if source_on and target_on else SOURCE if source_on else TARGET if target_on else NEITHER


def _check_side(side: str) -> None:
    if side not in SIDES:
        raise ValueError(f"a schedule is pointed at 'source' or 'target', not {side!r}")


class AirflowSchedule:
    """A DAG on an Airflow API server (module docstring).

    Args:
        p: the schedule's params (``kind: airflow``).
    """

    kind = "airflow"

    def __init__(self, p: ScheduleParams) -> None:
        self.p, self.name = p, p.name
        self.base = p.api_url.rstrip("/")
        self._client: httpx.Client | None = None

    def _http(self) -> httpx.Client:
        if self._client is not None:
            return self._client
        client = httpx.Client(base_url=self.base, timeout=HTTP_TIMEOUT_S)
        if self.p.token_env:
            client.headers["Authorization"] = f"Bearer {_env(self.p.token_env, self.name)}"
        elif self.p.username_env:
            body = {"username": _env(self.p.username_env, self.name), "password": _env(self.p.password_env, self.name)}
            r = self._call(client, "POST", "/auth/token", json=body, what="log in")
            if r.status_code not in (200, 201) or "access_token" not in r.json():
                raise AuthError(f"schedule {self.name}: Airflow at {self.base} refused the login of the user in "
                                f"${self.p.username_env} (HTTP {r.status_code}); check that user and the password "
                                f"in ${self.p.password_env}")
            client.headers["Authorization"] = f"Bearer {r.json()['access_token']}"
        self._client = client
        return client

    def _call(self, client: httpx.Client, method: str, path: str, *, what: str, **kw: Any) -> httpx.Response:
        try:
            return client.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise ProviderError(f"schedule {self.name}: could not {what} at Airflow {self.base}{path} "
                                f"({type(exc).__name__}: {exc}); check api_url and that the API server runs") from None

    def _json(self, method: str, path: str, *, what: str, **kw: Any) -> dict[str, Any]:
        r = self._call(self._http(), method, path, what=what, **kw)
        if r.status_code in (401, 403):
            raise AuthError(f"schedule {self.name}: Airflow refused to {what} ({method} {path}: HTTP {r.status_code}); "
                            "the API user needs read and edit access to the DAGs and Variables named")
        if r.status_code == 404:
            raise ProviderError(f"schedule {self.name}: Airflow at {self.base} has no {what.split(' ', 1)[-1]} "
                                f"({method} {path}: HTTP 404)")
        if r.status_code >= 300:
            raise ProviderError(f"schedule {self.name}: Airflow refused to {what} ({method} {path}: HTTP "
                                f"{r.status_code}): {r.text[:300]}")
        try:
            body = r.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise ProviderError(f"schedule {self.name}: Airflow answered {method} {path} with {r.text[:200]!r}, "
                                "not a JSON object")
        return body

    def _dag(self, dag_id: str) -> dict[str, Any]:
        return self._json("GET", f"/api/v2/dags/{dag_id}", what=f"read DAG {dag_id}")

    def _variable(self) -> str:
        body = self._json("GET", f"/api/v2/variables/{self.p.variable}", what=f"read Variable {self.p.variable}")
        return str(body.get("value"))

    def read(self) -> ScheduleState:
        src = self._dag(self.p.dag_id)
        cadence = str(src.get("timetable_summary") or "")
        if self.p.shift == "pause":
            tgt = self._dag(self.p.target_dag_id)
            side = _side(not src["is_paused"], not tgt["is_paused"])
            detail = (f"DAG {self.p.dag_id} {'paused' if src['is_paused'] else 'unpaused'} ({cadence or 'no schedule'}), "
                      f"DAG {self.p.target_dag_id} {'paused' if tgt['is_paused'] else 'unpaused'} "
                      f"({tgt.get('timetable_summary') or 'no schedule'})")
            return ScheduleState(self.name, self.kind, side, cadence, detail)
        value = self._variable()
        on = not src["is_paused"]
        side = (SOURCE if value == self.p.source_value else TARGET if value == self.p.target_value else NEITHER) \
            if on else NEITHER
        detail = (f"DAG {self.p.dag_id} {'unpaused' if on else 'paused'} ({cadence or 'no schedule'}), Variable "
                  f"{self.p.variable} = {value!r}")
        return ScheduleState(self.name, self.kind, side, cadence, detail)

    def _pause(self, dag_id: str, paused: bool) -> None:
        self._json("PATCH", f"/api/v2/dags/{dag_id}", params={"update_mask": "is_paused"},
                   json={"is_paused": paused}, what=f"{'pause' if paused else 'unpause'} DAG {dag_id}")

    def point(self, side: str) -> None:
        _check_side(side)
        if self.p.shift == "pause":
            on, off = (self.p.target_dag_id, self.p.dag_id) if side == TARGET else (self.p.dag_id, self.p.target_dag_id)
            self._pause(off, True)  # paused first: the two DAGs never run together
            self._pause(on, False)
            return
        value = self.p.target_value if side == TARGET else self.p.source_value
        self._json("PATCH", f"/api/v2/variables/{self.p.variable}", params={"update_mask": "value"},
                   json={"key": self.p.variable, "value": value}, what=f"set Variable {self.p.variable}")

    def equivalent(self) -> Equivalent:
        src = self._dag(self.p.dag_id)
        if self.p.shift == "variable":
            self._variable()
            return Equivalent(f"DAG {self.p.dag_id} with Variable {self.p.variable} = {self.p.target_value!r}", True,
                              "the same DAG and timetable; the Variable it reads names the target")
        tgt = self._dag(self.p.target_dag_id)
        a, b = src.get("timetable_summary"), tgt.get("timetable_summary")
        return Equivalent(f"DAG {self.p.target_dag_id} ({b or 'no schedule'}, "
                          f"{'paused' if tgt['is_paused'] else 'unpaused'})", a == b,
                          "the target's DAG runs on the source's timetable" if a == b else
                          f"the target's DAG runs on {b!r}, the source's on {a!r}: when the workload runs changes at "
                          "cutover")


def _env(name: str, schedule: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        raise AuthError(f"schedule {schedule}: the environment variable {name} is not set; export it (the runbook "
                        "reads credentials by name at run time, never from params)")
    return value


def _cadence(entry: str) -> str:
    """The time fields of a crontab entry (or its ``@`` keyword)."""
    fields = entry.split()
    return fields[0] if fields[0].startswith("@") else " ".join(fields[:5])


class CronSchedule:
    """An entry in a crontab file (module docstring).

    Args:
        p: the schedule's params (``kind: cron``).
        project: the directory a relative ``file`` is relative to.
    """

    kind = "cron"

    def __init__(self, p: ScheduleParams, *, project: Path) -> None:
        self.p, self.name = p, p.name
        self.path = Path(p.file) if Path(p.file).is_absolute() else project / p.file
        self.entries = {SOURCE: p.line.strip(), TARGET: p.target_line.strip()}

    def _lines(self) -> list[str]:
        try:
            return self.path.read_text().splitlines()
        except OSError as exc:
            raise ProviderError(f"schedule {self.name}: cannot read crontab file {self.path} "
                                f"({type(exc).__name__}: {exc}); check source.schedules' file") from None

    def read(self) -> ScheduleState:
        active = {ln.strip() for ln in self._lines() if ln.strip() and not ln.lstrip().startswith("#")}
        side = _side(self.entries[SOURCE] in active, self.entries[TARGET] in active)
        entry = self.entries[TARGET if side == TARGET else SOURCE]
        said = {SOURCE: f"the source's entry is there: {entry!r}", TARGET: f"the target's entry is there: {entry!r}",
                BOTH: f"both entries are there: {self.entries[SOURCE]!r} and {self.entries[TARGET]!r}",
                NEITHER: f"neither entry is there (the source's is {entry!r})"}[side]
        return ScheduleState(self.name, self.kind, side, _cadence(entry), f"{self.path}: {said}")

    def point(self, side: str) -> None:
        _check_side(side)
        other = TARGET if side == SOURCE else SOURCE
        lines = self._lines()
        stripped = [ln.strip() for ln in lines]
        if self.entries[side] in stripped and self.entries[other] not in stripped:
            return
        if self.entries[other] not in stripped:
            raise ProviderError(f"schedule {self.name}: {self.path} has neither side's entry, so there is nothing to "
                                f"point at the {side}; expected {self.entries[other]!r}")
        new = [self.entries[side] if ln.strip() == self.entries[other] else ln for ln in lines]
        text = "\n".join(_once(new, self.entries[side])) + "\n"
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.chmod(tmp, self.path.stat().st_mode & 0o777)
            os.replace(tmp, self.path)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            raise ProviderError(f"schedule {self.name}: cannot rewrite {self.path} ({type(exc).__name__}: {exc}); "
                                "the file is unchanged") from None

    def equivalent(self) -> Equivalent:
        a, b = _cadence(self.entries[SOURCE]), _cadence(self.entries[TARGET])
        return Equivalent(f"{self.path}: {self.entries[TARGET]!r}", a == b,
                          "the target's entry runs at the source's times" if a == b else
                          f"the target's entry runs at {b!r}, the source's at {a!r}")


def _once(lines: list[str], entry: str) -> list[str]:
    """``lines`` with ``entry`` kept at its first place only (pointing twice adds no second run)."""
    out, seen = [], False
    for ln in lines:
        if ln.strip() == entry:
            if seen:
                continue
            seen = True
        out.append(ln)
    return out


class CommandSchedule:
    """A user's schedule behind two commands (module docstring).

    Args:
        p: the schedule's params (``kind: command``).
        project: the commands' working directory.
    """

    kind = "command"

    def __init__(self, p: ScheduleParams, *, project: Path) -> None:
        self.p, self.name, self.project = p, p.name, project

    def _run(self, argv: Sequence[str], what: str) -> str:
        return run_command(argv, what=f"schedule {self.name}: {what}", timeout_s=COMMAND_TIMEOUT_S, cwd=self.project)

    def read(self) -> ScheduleState:
        out = self._run(self.p.read_command, "read_command")
        try:
            body = json.loads(out)
            assert isinstance(body, dict) and body.get("side") in (SOURCE, TARGET, BOTH, NEITHER)
        except (ValueError, AssertionError):
            raise ProviderError(f"schedule {self.name}: read_command {list(self.p.read_command)} printed "
                                f"{out.strip()[:200]!r}, not JSON like {{\"side\": \"source\", \"schedule\": "
                                "\"0 2 * * *\"}} (side: source, target, both or neither)") from None
        return ScheduleState(self.name, self.kind, str(body["side"]), str(body.get("schedule") or ""),
                             f"read_command said {json.dumps(body, sort_keys=True)[:300]}")

    def point(self, side: str) -> None:
        _check_side(side)
        self._run([a.replace("{side}", side) for a in self.p.set_command], "set_command")

    def equivalent(self) -> Equivalent:
        self.read()
        return Equivalent(f"set_command {list(self.p.set_command)} with side target", None,
                          "the user's set_command points it at the target; the read-back says where it points")


def make(p: ScheduleParams, *, project: Path) -> Schedule:
    """The schedule ``p`` declares, its relative paths and commands under ``project``."""
    if p.kind == "airflow":
        return AirflowSchedule(p)
    return CronSchedule(p, project=project) if p.kind == "cron" else CommandSchedule(p, project=project)


def read_all(schedules: Sequence[Schedule]) -> list[ScheduleState]:
    """Each schedule as read now, in order.

    Raises:
        ProviderError: one could not be read (it names which)."""
    return [s.read() for s in schedules]


def shift(schedules: Sequence[Schedule], to: str) -> list[Shifted]:
    """Point every schedule at ``to`` (``source`` or ``target``) and read each back. A schedule
    that already starts ``to`` is left as it is. A failure does not stop the others: each
    :class:`Shifted` says what happened (its ``error``, and what could be read after it)."""
    out: list[Shifted] = []
    for s in schedules:
        before = after = detail = err = ""
        try:
            state = s.read()
            before = state.side
            if before != to:
                s.point(to)
            state = s.read()
            after, detail = state.side, state.detail
            if after != to:
                err = f"read back, it starts {after!r}, not the {to}: {detail}"
        except ProviderError as exc:
            err = str(exc)
        out.append(Shifted(s.name, s.kind, to, before, after, detail, err))
    return out
