"""Find and stop the OS processes of one local pod or endpoint, treating "already gone" as done.

Every step here reads state that can change under it: a process listed a moment ago may have
exited before its status is read, before it is signalled, or before it is waited on. Each of
those is a successful stop, never an error. Processes are found by a marker in their
environment (``LOCAL_POD_ID`` and ``LOCAL_POD_VOLUME``, set by the provider at spawn and
inherited by every child), not by a pid kept on disk, because a pid is reused once its process
is reaped. A zombie (exited, not yet reaped by its parent) counts as stopped.

psutil's ``Process.send_signal``/``kill`` check that the pid still names the same process
(creation time) before signalling, so a listed process whose pid was reused is never signalled
(https://psutil.readthedocs.io/en/latest/#psutil.Process.send_signal).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from runbook_lib.layout import POD_ID_ENV, POD_VOLUME_ENV

MARKER_ID = POD_ID_ENV
MARKER_DIR = POD_VOLUME_ENV
TERM_GRACE_S = 5.0  # SIGTERM, then SIGKILL after this many seconds
KILL_WAIT_S = 5.0  # after SIGKILL, how long to wait for the kernel to remove the processes
POLL_S = 0.05
MAX_ROUNDS = 5  # a process may spawn a child while it is being stopped: list and stop again

_LEADERS: dict[int, subprocess.Popen[bytes]] = {}  # pid -> leader this process started (see adopt)


def adopt(proc: subprocess.Popen[bytes]) -> None:
    """Keep the ``Popen`` of a leader this process started, for the process's lifetime.

    A local pod outlives the call that launched it, as a machine outlives an API request, so
    nothing waits on the ``Popen`` where it was made. Kept here, it is reaped by :func:`reap`
    (no zombie lingers) and is never garbage-collected while the pod still runs (``Popen``
    warns about that: https://docs.python.org/3/library/subprocess.html#subprocess.Popen).
    """
    for pid in list(_LEADERS):
        reap(pid)
    _LEADERS[proc.pid] = proc


StepHook = Callable[[str, list[int]], None]
"""Called with a step name and the pids concerned: ``listed`` (after a listing, before any
signal), ``signalled`` (after SIGTERM, before waiting), ``killed`` (after SIGKILL)."""


@dataclass
class ProcessStop:
    """What stopping one resource's processes found and did (evidence; pids are this host's).

    Attributes:
        found: pids carrying the resource's marker at the first listing.
        gone_before_signal: listed, but exited before SIGTERM reached them.
        terminated: sent SIGTERM.
        killed: still running after the grace period, sent SIGKILL.
        survivors: still running at the deadline (the stop failed; the caller raises).
        rounds: listings made (a child spawned during the stop is found by the next one).
        seconds: wall time of the whole stop, seconds.
    """

    found: list[int] = field(default_factory=list)
    gone_before_signal: list[int] = field(default_factory=list)
    terminated: list[int] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)
    rounds: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def running(p: Any) -> bool:
    """True while ``p`` (a ``psutil.Process``) is the same process and has not exited; a zombie,
    a vanished process and a reused pid all read as not running."""
    import psutil

    try:
        return bool(p.is_running()) and p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True  # exists, and we cannot tell more: assume it runs


def find(rid: str, volume_dir: str) -> list[Any]:
    """Live processes whose environment marks them as resource ``rid`` under ``volume_dir``.

    A process that exits while the table is read is skipped (psutil reports unreadable
    attributes as None instead of raising)."""
    import psutil

    out = []
    me = os.getpid()
    for p in psutil.process_iter(["environ"], ad_value=None):
        env = p.info.get("environ")
        if p.pid == me or not env:
            continue
        if env.get(MARKER_ID) == rid and env.get(MARKER_DIR) == volume_dir and running(p):
            out.append(p)
    return out


def _signal(procs: list[Any], sig: int) -> tuple[list[int], list[int]]:
    """Send ``sig`` to each process; returns ``(signalled pids, pids already gone)``."""
    import psutil

    sent, gone = [], []
    for p in procs:
        if not running(p):  # exited since it was listed (a zombie is signalled harmlessly, but say it)
            gone.append(p.pid)
            reap(p.pid)
            continue
        try:
            p.send_signal(sig)
            sent.append(p.pid)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            gone.append(p.pid)
        except psutil.AccessDenied:
            sent.append(p.pid)  # still listed as running; the wait decides
    return sent, gone


def _wait(procs: list[Any], timeout_s: float) -> list[Any]:
    """Wait until none of ``procs`` runs or ``timeout_s`` passes; returns those still running.
    Those that were children of this process are reaped once they exit, so they do not linger
    as zombies."""
    deadline = time.monotonic() + timeout_s
    live = list(procs)
    while True:
        still = []
        for p in live:
            if running(p):
                still.append(p)
            else:
                reap(p.pid)
        live = still
        if not live or time.monotonic() >= deadline:
            return live
        time.sleep(POLL_S)


def reap(pid: int) -> None:
    """Collect the exit status of ``pid`` if it is an exited child of this process (through its
    adopted ``Popen`` when it has one, which is then forgotten); anything else (not our child,
    already reaped) is left alone."""
    proc = _LEADERS.get(pid)
    if proc is not None:
        if proc.poll() is not None:
            _LEADERS.pop(pid, None)
        return
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def leader_running(pid: int | None, created: float | None) -> bool:
    """True while a resource's leader process (the one spawned at launch, ``pid`` created at
    epoch second ``created``) runs. Identified by pid *and* creation time, so a pid reused by
    another process after the leader was reaped reads as not running; a leader never started, or
    exited before it could be identified (either None), does not run. An exited leader that is
    our child is reaped here (no zombie is left)."""
    import psutil

    if not pid or created is None:
        return False
    try:
        p = psutil.Process(pid)
        if abs(p.create_time() - created) > 0.01:
            return False  # the pid now names another process
    except psutil.NoSuchProcess:
        return False
    if running(p):
        return True
    reap(pid)  # our exited child (the kernel that launched it): collect it, leave no zombie
    return False


def stop(rid: str, volume_dir: str, *, term_grace_s: float = TERM_GRACE_S, kill_wait_s: float = KILL_WAIT_S,
         hook: StepHook | None = None) -> ProcessStop:
    """Stop every process of resource ``rid``: SIGTERM, wait ``term_grace_s`` seconds, SIGKILL
    what is left, wait ``kill_wait_s`` seconds; repeat the listing (at most ``MAX_ROUNDS``) until
    it is empty, so a child spawned during the stop is caught too.

    Bounded in time: at most ``MAX_ROUNDS * (term_grace_s + kill_wait_s)`` seconds.

    Returns:
        The :class:`ProcessStop` record; ``survivors`` is empty on success.
    """
    t0 = time.monotonic()
    rec = ProcessStop()
    procs = find(rid, volume_dir)
    while procs and rec.rounds < MAX_ROUNDS:
        rec.rounds += 1
        pids = [p.pid for p in procs]
        if rec.rounds == 1:
            rec.found = pids
        if hook is not None:
            hook("listed", pids)
        sent, gone = _signal(procs, signal.SIGTERM)
        rec.terminated += sent
        rec.gone_before_signal += gone
        if hook is not None:
            hook("signalled", sent)
        left = _wait(procs, term_grace_s)
        if left:
            sent, _ = _signal(left, signal.SIGKILL)
            rec.killed += sent
            if hook is not None:
                hook("killed", sent)
            left = _wait(left, kill_wait_s)
        rec.survivors = [p.pid for p in left]
        procs = find(rid, volume_dir)
    if procs:
        rec.survivors = sorted(set(rec.survivors) | {p.pid for p in procs})
    for pid in list(_LEADERS):  # collect the leaders that have exited (this one among them): no zombie,
        reap(pid)               # and no never-waited Popen for the interpreter to warn about at exit
    rec.rounds = max(rec.rounds, 1)
    rec.seconds = round(time.monotonic() - t0, 3)
    return rec
