"""The host lock (runbook_lib.run.hostlock): timed phases run alone among runbook runs on one machine.

Each case takes the real ``flock(2)`` lock on a file under tmp_path, from threads (each opens its
own descriptor, so they conflict as processes do) and from a second process."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runbook_lib.errors import ParamsError
from runbook_lib.run.hostlock import LOCK_ENV, LockWaitStopped, exclusive_for, holders, host_lock, lock_path


def _hold(path: Path, exclusive: bool, taken: threading.Event, release: threading.Event,
          order: list[str], name: str) -> threading.Thread:
    def run() -> None:
        with host_lock(exclusive, path=path):
            order.append(name)
            taken.set()
            release.wait(10)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_only_the_timed_phases_of_an_exclusive_run_take_the_lock_exclusively(monkeypatch, tmp_path: Path) -> None:
    assert [p for p in ("01", "02", "03", "04", "05", "06") if exclusive_for(p, exclusive=True)] == ["04", "05"]
    assert not any(exclusive_for(p, exclusive=False) for p in ("04", "05"))
    # a training job's or a checkpoint's slices are judged on checkpoints, not time: phase 05 shared
    assert [p for p in ("04", "05") if exclusive_for(p, exclusive=True, serves=False)] == ["04"]
    monkeypatch.setenv(LOCK_ENV, str(tmp_path / "h.lock"))
    assert lock_path() == tmp_path / "h.lock"
    monkeypatch.delenv(LOCK_ENV)
    assert lock_path().name.startswith("runbook-host-") and lock_path().suffix == ".lock"


def test_shared_phases_overlap_and_an_exclusive_one_waits_for_them_then_runs_alone(tmp_path: Path) -> None:
    path, order = tmp_path / "h.lock", []
    a_taken, b_taken, release = threading.Event(), threading.Event(), threading.Event()
    a = _hold(path, False, a_taken, release, order, "a")
    b = _hold(path, False, b_taken, release, order, "b")
    assert a_taken.wait(5) and b_taken.wait(5)  # two untimed phases at once
    said: list[str] = []
    threading.Timer(0.6, release.set).start()
    with host_lock(True, path=path, on_wait=said.append) as held:
        order.append("timed")
    a.join(5), b.join(5)
    assert sorted(order[:2]) == ["a", "b"] and order[2] == "timed"
    assert 0.5 < held.waited_s < 5 and held.exclusive
    assert len(said) == 1 and "measure.exclusive: false" in said[0] and str(path) in said[0]


def test_a_waiting_timed_phase_lets_no_new_phase_in_ahead_of_it(tmp_path: Path) -> None:
    """The turnstile: with a shared holder and a timed phase waiting, a phase that asks later
    starts only after the timed one has run."""
    path, order = tmp_path / "h.lock", []
    first, release_first = threading.Event(), threading.Event()
    holder = _hold(path, False, first, release_first, order, "untimed, running")
    assert first.wait(5)
    timed_taken, release_timed = threading.Event(), threading.Event()
    timed = _hold(path, True, timed_taken, release_timed, order, "timed")
    time.sleep(0.3)  # the timed phase is waiting for the running one
    late_taken, release_late = threading.Event(), threading.Event()
    late = _hold(path, False, late_taken, release_late, order, "untimed, asked later")
    time.sleep(0.3)
    assert not late_taken.is_set() and not timed_taken.is_set()
    release_first.set()
    assert timed_taken.wait(5)
    time.sleep(0.3)
    assert not late_taken.is_set()  # the timed phase runs alone
    release_timed.set()
    assert late_taken.wait(5)
    release_late.set()
    for t in (holder, timed, late):
        t.join(5)
    assert order == ["untimed, running", "timed", "untimed, asked later"]


def test_a_lock_held_by_another_process_is_waited_for_and_freed_when_it_dies(tmp_path: Path) -> None:
    path = tmp_path / "h.lock"
    code = ("import sys, time; from pathlib import Path; from runbook_lib.run.hostlock import host_lock\n"
            "with host_lock(True, path=Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(LockWaitStopped):  # a signal recorded while waiting ends the wait
            with host_lock(False, path=path, stopped=lambda: True):
                pass
        threading.Timer(0.5, proc.kill).start()  # killed, not released: the kernel frees its flock
        with host_lock(False, path=path) as held:
            assert 0.3 < held.waited_s < 10
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_waiting_phase_names_who_holds_the_lock_and_a_dead_holder_is_not_named(tmp_path: Path) -> None:
    path = tmp_path / "h.lock"
    code = ("import sys, time; from pathlib import Path; from runbook_lib.run.hostlock import host_lock\n"
            "with host_lock(True, path=Path(sys.argv[1]), run='r-other', phase='04'):\n"
            "    print('held', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    told: list[str] = []
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        threading.Timer(0.5, proc.kill).start()
        with host_lock(False, path=path, on_wait=told.append, run="r-mine", phase="02"):
            assert any("run r-mine phase 02 (shared)" in h for h in holders(path))
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    [line] = told
    assert f"run r-other phase 04 (exclusive), PID {proc.pid}, since 20" in line
    # the killed holder never removed its line, but a process that is gone is not named; ours is gone on release
    assert (path.with_name("h.lock.holders") / str(proc.pid)).exists() and holders(path) == []


def test_a_lock_file_that_cannot_be_opened_is_a_usage_error_naming_the_variable(tmp_path: Path) -> None:
    (tmp_path / "real").write_text("")
    (tmp_path / "link.lock").symlink_to(tmp_path / "real")  # never followed
    with pytest.raises(ParamsError, match=LOCK_ENV):
        with host_lock(True, path=tmp_path / "link.lock"):
            pass
    with pytest.raises(ParamsError, match="measure.exclusive: false"):
        with host_lock(True, path=tmp_path / "missing-dir" / "h.lock"):
            pass
