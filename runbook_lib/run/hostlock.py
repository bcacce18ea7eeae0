"""One timed phase at a time on a machine: the host lock that keeps runbook runs on one host from
measuring each other.

Phases 04 and 05 judge time (p95 ratios, throughput, cold starts, each cutover slice's latency
bound). A second runbook run working on the same machine meanwhile (a worker start, a parity check,
a kernel importing torch) takes CPU from the sides being timed, and a round slowed that way widens
the interval past the margin: the comparison reads HOLD where alone it reads GO. So every phase a
runbook run executes holds this lock: shared for a phase that times nothing, exclusive for a timed
phase when ``measure.exclusive`` is true (the default). Two runs' untimed phases overlap; a timed
phase waits for the phases running now to end and keeps new ones out until it ends.

The lock is ``flock(2)`` on a file (``RUNBOOK_HOST_LOCK``, default ``runbook-host-<uid>.lock`` in the
temporary directory), so a killed run releases it with its process. ``flock`` does not queue
waiters, so an exclusive request could wait forever behind shared phases that keep overlapping; a
turnstile file beside it (``<lock>.turnstile``) is held while a phase waits for the lock itself, so
a waiting exclusive phase lets no new phase in ahead of it (the classic readers-writer turnstile).

``flock`` does not say who holds a lock, so each holder also writes a line about itself in the
holders directory beside it (``<lock>.holders/<pid>``: the run, the phase, the mode and since
when, UTC) and removes it on release; a waiting phase names the holders whose process is alive.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from runbook_lib._time import utc_now
from runbook_lib.errors import ParamsError

LOCK_ENV = "RUNBOOK_HOST_LOCK"
TIMED_PHASES = ("04", "05")  # the phases whose gates judge time (docs/reference/gates.md)


def lock_path() -> Path:
    """The host lock's file: ``$RUNBOOK_HOST_LOCK`` if set, else ``runbook-host-<uid>.lock`` in
    :func:`tempfile.gettempdir` (one per user: runs of one user coordinate)."""
    given = os.environ.get(LOCK_ENV, "").strip()
    return Path(given) if given else Path(tempfile.gettempdir()) / f"runbook-host-{os.getuid()}.lock"


def exclusive_for(phase: str, *, exclusive: bool, serves: bool = True) -> bool:
    """Whether ``phase`` ("01".."06") takes the lock exclusively: a timed phase (:data:`TIMED_PHASES`)
    of a run whose ``measure.exclusive`` is true. Phase 05 times only a workload that ``serves``
    requests (each slice's p95 against phase 04's bound); a training job's or a checkpoint's slices
    are judged on checkpoints and parity, not time, so that phase 05 holds the lock shared."""
    return exclusive and phase in TIMED_PHASES and (phase != "05" or serves)


@dataclass
class Held:
    """The lock as a phase holds it: ``exclusive`` or shared, and the seconds it waited for it."""

    exclusive: bool
    waited_s: float = 0.0


def _open(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise ParamsError(f"the host lock {path} cannot be opened ({exc.strerror}); point {LOCK_ENV} at a "
                          "writable file, or set measure.exclusive: false to run without waiting for other "
                          "runs' timed phases") from exc


class LockWaitStopped(Exception):
    """The wait for the host lock was given up: ``stopped()`` said so (a signal was received)."""


POLL_S = 0.05  # how often a waiting phase retries the lock, seconds


def _take(fd: int, mode: int, stopped: Callable[[], bool], waiting: Callable[[], None]) -> None:
    """Take ``flock(fd, mode)``, polling so a recorded signal can end the wait (the runner's signal
    handler records a signal and returns, and a blocking ``flock`` would then resume); ``waiting``
    is called before each wait."""
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if stopped():
                raise LockWaitStopped("stopped while waiting for the host lock") from None
            waiting()
            time.sleep(POLL_S)


def holders(path: Path) -> list[str]:
    """Who holds (or awaits) the lock at ``path``: one line per live process that registered in
    ``<path>.holders`` (``run <id> phase <NN> (exclusive|shared), PID <pid>, since <UTC>``); files
    of processes that are gone are skipped."""
    out = []
    for f in sorted(path.with_name(path.name + ".holders").glob("*")):
        try:
            who = json.loads(f.read_text())
            pid = int(who["pid"])
            os.kill(pid, 0)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        out.append(f"run {who.get('run') or '?'} phase {who.get('phase') or '?'} ({who.get('mode')}), PID {pid}, "
                   f"since {who.get('since')}")
    return out


@contextmanager
def _registered(path: Path, who: dict[str, str]) -> Iterator[None]:
    """This process listed as a holder of ``path`` for the ``with`` block (best effort: a holders
    directory that cannot be written only loses the names a waiting run would show)."""
    d = path.with_name(path.name + ".holders")
    f = d / str(os.getpid())
    try:
        d.mkdir(mode=0o700, exist_ok=True)
        f.write_text(json.dumps({"pid": os.getpid(), **who}))
    except OSError:
        pass
    try:
        yield
    finally:
        try:
            f.unlink()
        except OSError:
            pass


@contextmanager
def host_lock(exclusive: bool, *, path: Path | None = None, on_wait: Callable[[str], None] | None = None,
              stopped: Callable[[], bool] = lambda: False, run: str = "", phase: str = "") -> Iterator[Held]:
    """Hold the host lock for the ``with`` block: exclusively (no other runbook run's phase runs
    meanwhile) or shared (waits only while another run's timed phase holds or awaits it).

    Args:
        exclusive: True for a timed phase (:func:`exclusive_for`).
        path: the lock file (default :func:`lock_path`); its turnstile is ``<path>.turnstile``.
        on_wait: called once with a one-line message when the lock is not free at once.
        stopped: polled while waiting; when it returns True the wait ends with
            :class:`LockWaitStopped` (the runner passes "a signal was received").
        run, phase: who this holder is, for the message another run's wait prints.

    Yields:
        :class:`Held`, whose ``waited_s`` (seconds, float) is the time spent waiting.

    Raises:
        ParamsError: the lock file cannot be opened (exit 2), naming ``RUNBOOK_HOST_LOCK``.
        LockWaitStopped: ``stopped()`` returned True before the lock was taken.
    """
    path = path or lock_path()
    turnstile = _open(path.with_name(path.name + ".turnstile"))
    try:
        lock = _open(path)
    except ParamsError:
        os.close(turnstile)
        raise
    t0 = time.monotonic()
    told = False

    def tell() -> None:
        nonlocal told
        if on_wait is not None and not told:
            told = True
            others = [h for h in holders(path) if f"PID {os.getpid()}," not in h]
            on_wait(f"waiting for another runbook run's {'phase' if exclusive else 'timed phase'} on this host to "
                    f"end: {'; '.join(others) if others else 'a process that did not name itself'} (host lock "
                    f"{path}; measure.exclusive: false runs a timed phase without waiting)")

    since = utc_now()
    try:
        with _registered(path, {"run": run, "phase": phase, "mode": "exclusive" if exclusive else "shared",
                                "since": since}):
            _take(turnstile, fcntl.LOCK_EX, stopped, tell)
            try:
                _take(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, stopped, tell)
            finally:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
            yield Held(exclusive, time.monotonic() - t0)
    finally:
        os.close(lock)  # closing the descriptor releases its flock
        os.close(turnstile)
