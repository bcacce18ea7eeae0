"""Ctrl-C and SIGTERM during a headless run: stop the phase, then tear down, then exit.

The runner's process receives the signal (a terminal sends SIGINT to its foreground process
group; the notebook kernel runs in a session of its own and does not see it). The first
signal is recorded and forwarded to the kernel as SIGINT, so the running cell raises
``KeyboardInterrupt`` and papermill saves the notebook; a kernel still busy
:data:`KERNEL_GRACE_S` seconds later (a long C call, a thread pool draining) is killed. The
runner then skips the remaining phases and tears down what the run created. A second signal
while that teardown runs raises :class:`~runbook_lib.run.cleanup.CleanupAborted`, so the person who
pressed Ctrl-C twice gets their terminal back at once, with the command that finishes the job.

SIGHUP (the terminal closed, an SSH session dropped) is handled the same way: by default it
would kill the runner and leave paid resources running.

Exit codes follow the shell convention 128 + signal number: 130 for SIGINT, 143 for SIGTERM,
129 for SIGHUP (https://tldp.org/LDP/abs/html/exitcodes.html).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from types import FrameType
from typing import Any

from runbook_lib._time import utc_now
from runbook_lib.run.cleanup import CleanupAborted

KERNEL_GRACE_S = 5.0  # after forwarding SIGINT, a kernel still running this long is killed, seconds
HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def exit_code(signum: int) -> int:
    """128 + the signal number: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP."""
    return 128 + int(signum)


def _kernels() -> list[Any]:
    """Notebook kernels started by this process (papermill's, through jupyter_client)."""
    import psutil

    out = []
    for p in psutil.Process().children():
        try:
            if any("ipykernel" in part for part in p.cmdline()):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def _signal_kernels(sig: int) -> list[int]:
    """Send ``sig`` to each kernel's process group; a kernel already gone is skipped."""
    sent = []
    ours = os.getpgrp()
    for k in _kernels():
        try:
            group = os.getpgid(k.pid)
            if group == ours:  # a kernel in our own group: signal it alone, never ourselves again
                os.kill(k.pid, sig)
            else:
                os.killpg(group, sig)
            sent.append(k.pid)
        except (ProcessLookupError, PermissionError):
            continue
    return sent


class Interrupts:
    """Installed around a run: records the first SIGINT/SIGTERM and stops the phase.

    Attributes:
        signum: the first signal received, or None.
        received_at: UTC ISO time of the first signal.
        count: signals received so far.
        tearing_down: set by the runner while it tears down; a signal then aborts the teardown.
        skip_teardown: a second signal came before the teardown began; it is not started.
    """

    def __init__(self, *, kernel_grace_s: float = KERNEL_GRACE_S) -> None:
        self.signum: int | None = None
        self.received_at = ""
        self.count = 0
        self.tearing_down = False
        self.skip_teardown = False
        self.kernel_grace_s = kernel_grace_s
        self.kernel_killed: list[int] = []
        self._previous: dict[int, Any] = {}
        self._timer: threading.Timer | None = None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def __enter__(self) -> "Interrupts":
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            for sig in HANDLED:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def restore(self) -> None:
        """Put back the handlers that were there before."""
        if self._timer is not None:
            self._timer.cancel()
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.signum is None:
            self.signum, self.received_at = signum, utc_now()
        if self.tearing_down:
            raise CleanupAborted(f"{signal.Signals(signum).name} during teardown: stopped at once")
        if self.count > 1:  # a second signal before the teardown began: skip it, stop the kernel now
            self.skip_teardown = True
            self._kill_kernels()
            return
        try:
            print(f"\n{signal.Signals(signum).name}: stopping the current phase, then tearing down what this "
                  "run created (press Ctrl-C again to skip the teardown)", flush=True)
        except (OSError, ValueError):  # nobody reads stdout any more: stopping matters, not saying so
            pass
        _signal_kernels(signal.SIGINT)
        self._timer = threading.Timer(self.kernel_grace_s, self._kill_kernels)
        self._timer.daemon = True
        self._timer.start()

    def _kill_kernels(self) -> None:
        self.kernel_killed = _signal_kernels(signal.SIGKILL)

    def phase_ended(self) -> None:
        """The phase that was running when the signal came has returned: no kernel to kill."""
        if self._timer is not None:
            self._timer.cancel()

    def wait_kernels_gone(self, timeout_s: float = 10.0) -> None:
        """Wait for the kernels this process started to exit (papermill shuts them down)."""
        deadline = time.monotonic() + timeout_s
        while _kernels() and time.monotonic() < deadline:
            time.sleep(0.05)
