"""Teardown that cannot race: processes exit at chosen moments while a local pod or endpoint is
stopped or destroyed, and every case ends in a verified teardown.

The moments come from the provider's ``on_teardown_step`` hook (``listed``: after the process
listing, before any signal; ``signalled``: after SIGTERM, before the wait) and from killing a
pod before its destroy begins. Processes are found afterwards by the marker every pod process
carries in its environment (``LOCAL_POD_ID``), independently of the provider's own listing.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from runbook_lib.errors import ProviderError, StorageError
from runbook_lib.evidence.approvals import Approval, require
from runbook_lib.measure.timing import JobClient
from runbook_lib.providers.base import EndpointSpec, Pod, PodSpec, Teardown, plan_stop
from runbook_lib.providers.local import LocalProvider
from runbook_lib.storage.local import FileStore

from .conftest import ROOT

LABELS = (("run_id", "race"),)

# A pod that starts two children (a process tree, as a real workload's data loaders), writes
# their pids to its volume, then waits.
TREE = ("import os, pathlib, subprocess, sys, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']) for _ in range(2)]\n"
        "pathlib.Path(os.environ['LOCAL_POD_VOLUME'], 'kids').write_text(' '.join(str(k.pid) for k in kids))\n"
        "time.sleep(600)\n")


def _approve(plan, tmp_path: Path) -> Approval:
    return require(plan, run_dir=tmp_path / "run", preapproved_local=True)


def _marked(rid: str) -> list[int]:
    """Live (non-zombie) processes whose environment names pod ``rid``."""
    out = []
    for p in psutil.process_iter(["environ", "status"], ad_value=None):
        env = p.info["environ"] or {}
        if env.get("LOCAL_POD_ID") == rid and p.info["status"] not in (psutil.STATUS_ZOMBIE, None):
            out.append(p.pid)
    return out


def _launch_tree(prov: LocalProvider, tmp_path: Path, code: str = TREE, min_procs: int = 4):
    """Launch ``code`` as a pod and wait until it wrote ``kids`` to its volume."""
    spec = PodSpec(name="tree", command=(sys.executable, "-c", code), device="cpu", price_usd_per_hour=0.1,
                   labels=LABELS)
    plan = prov.plan_launch(spec)
    pod = prov.apply(plan, _approve(plan, tmp_path))
    deadline = time.monotonic() + 30
    while not (Path(pod.volume_dir) / "kids").exists():
        assert time.monotonic() < deadline, prov.log_tail(pod.id)
        time.sleep(0.02)
    assert len(_marked(pod.id)) >= min_procs  # TREE: _local_pod leader, the command, two children
    return pod


def _destroy(prov: LocalProvider, rid: str, tmp_path: Path) -> Teardown:
    plan = prov.plan_destroy(rid)
    done = prov.apply(plan, _approve(plan, tmp_path))
    assert isinstance(done, Teardown)
    return done


def _sigkill(pids: list[int]) -> None:
    """SIGKILL each pid and wait until none runs (exited, or a zombie not yet reaped)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while any(_runs(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.01)


def _runs(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _assert_gone(prov: LocalProvider, rid: str) -> None:
    assert prov.get(rid).state == "DESTROYED"
    assert prov.is_gone(rid)
    assert _marked(rid) == []
    res = prov.get(rid)
    if isinstance(res, Pod):
        assert not Path(res.volume_dir).exists() and not Path(res.container_dir).exists()


def test_pod_killed_before_the_destroy_lists_it(tmp_path: Path) -> None:
    prov = LocalProvider(root=tmp_path / "state")
    pod = _launch_tree(prov, tmp_path)
    _sigkill(_marked(pod.id))
    done = _destroy(prov, pod.id, tmp_path)
    _assert_gone(prov, pod.id)
    assert done.action == "destroy" and done.detail["processes"]["survivors"] == []


def test_processes_exit_between_listing_and_status(tmp_path: Path) -> None:
    seen: list[tuple[str, list[int]]] = []

    def hook(step: str, pids: list[int]) -> None:
        seen.append((step, pids))
        if step == "listed" and len(seen) == 1:
            _sigkill(pids)  # every listed process exits before its status is read or it is signalled

    prov = LocalProvider(root=tmp_path / "state", on_teardown_step=hook)
    pod = _launch_tree(prov, tmp_path)
    done = _destroy(prov, pod.id, tmp_path)
    _assert_gone(prov, pod.id)
    procs = done.detail["processes"]
    assert sorted(procs["found"]) == sorted(seen[0][1]) and len(procs["found"]) >= 4
    assert procs["gone_before_signal"], procs  # it says what it found already gone
    assert procs["survivors"] == [] and procs["killed"] == []


def test_processes_exit_between_signal_and_wait(tmp_path: Path) -> None:
    def hook(step: str, pids: list[int]) -> None:
        if step == "signalled":
            _sigkill(pids)

    prov = LocalProvider(root=tmp_path / "state", on_teardown_step=hook)
    pod = _launch_tree(prov, tmp_path)
    done = _destroy(prov, pod.id, tmp_path)
    _assert_gone(prov, pod.id)
    assert done.detail["processes"]["terminated"] and done.detail["processes"]["survivors"] == []


def test_a_process_that_ignores_sigterm_is_killed_within_the_bound(tmp_path: Path) -> None:
    stubborn = ("import os, pathlib, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "pathlib.Path(os.environ['LOCAL_POD_VOLUME'], 'kids').write_text('')\ntime.sleep(600)\n")
    prov = LocalProvider(root=tmp_path / "state", term_grace_s=0.5)
    pod = _launch_tree(prov, tmp_path, stubborn, min_procs=2)
    t0 = time.monotonic()
    done = _destroy(prov, pod.id, tmp_path)
    assert time.monotonic() - t0 < 10
    _assert_gone(prov, pod.id)
    assert done.detail["processes"]["killed"], done.detail  # SIGTERM ignored: SIGKILL after the grace


def test_a_child_spawned_during_the_stop_is_found_and_stopped(tmp_path: Path) -> None:
    # On SIGTERM the command starts a new child (outside its own process group) and exits: the
    # next listing by marker finds the child.
    respawn = ("import os, pathlib, signal, subprocess, sys, time\n"
               "def on_term(*_):\n"
               "    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
               "    os._exit(0)\n"
               "signal.signal(signal.SIGTERM, on_term)\n"
               "pathlib.Path(os.environ['LOCAL_POD_VOLUME'], 'kids').write_text('')\ntime.sleep(600)\n")
    prov = LocalProvider(root=tmp_path / "state", term_grace_s=1.0)
    pod = _launch_tree(prov, tmp_path, respawn, min_procs=2)
    done = _destroy(prov, pod.id, tmp_path)
    _assert_gone(prov, pod.id)
    assert done.detail["processes"]["rounds"] >= 2


def test_destroy_is_idempotent_and_says_what_it_found(tmp_path: Path) -> None:
    prov = LocalProvider(root=tmp_path / "state")
    pod = _launch_tree(prov, tmp_path)
    first = _destroy(prov, pod.id, tmp_path)
    again = _destroy(prov, pod.id, tmp_path)
    never = _destroy(prov, "pod-00000000", tmp_path)
    assert first.found == "RUNNING" and again.found == "DESTROYED" and never.found == "gone"
    assert again.detail == {"note": "already destroyed"}
    _assert_gone(prov, pod.id)


def test_stop_races_like_destroy_and_keeps_the_volume(tmp_path: Path) -> None:
    prov = LocalProvider(root=tmp_path / "state",
                         on_teardown_step=lambda step, pids: _sigkill(pids[:1]) if step == "listed" else None)
    pod = _launch_tree(prov, tmp_path)
    plan = plan_stop(prov, pod.id, dry_run=False)
    done = prov.apply(plan, _approve(plan, tmp_path))
    assert isinstance(done, Teardown) and done.detail["volume"] == "kept"
    st = prov.get(pod.id)
    assert st.state == "STOPPED" and (Path(st.volume_dir) / "kids").exists()
    assert _marked(pod.id) == []


def test_a_pod_killed_by_a_signal_reads_as_exited_without_an_exit_code(tmp_path: Path) -> None:
    prov = LocalProvider(root=tmp_path / "state")
    pod = _launch_tree(prov, tmp_path)
    _sigkill(_marked(pod.id))
    done = prov.wait_exit(pod.id, timeout_s=30)
    assert done.state == "EXITED" and done.exit_code is None
    assert "killed by a signal" in done.status_detail
    _destroy(prov, pod.id, tmp_path)
    _assert_gone(prov, pod.id)


def test_endpoint_worker_exits_between_listing_and_status(tmp_path: Path, make_params,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # The report that opened this work: a worker exited between being listed and its status being
    # read, and the destroy crashed. Here one worker is killed exactly there.
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    params = make_params(workload={"entry_point": "tests.fixture_workloads:SleepWorkload"},
                         target={"batch_size": 1, "workers": 2})
    killed: list[int] = []

    def hook(step: str, pids: list[int]) -> None:
        if step == "listed" and not killed:
            workers = [p for p in pids if "work" in " ".join(psutil.Process(p).cmdline())]
            killed.extend(workers[:1])
            _sigkill(killed)

    prov = LocalProvider(root=tmp_path / "state", on_teardown_step=hook)
    spec = EndpointSpec(name="e", params_path=str(params), side="target", workers=2, price_usd_per_hour=0.2,
                        labels=LABELS)
    plan = prov.plan_endpoint(spec, dry_run=False)
    ep = prov.apply(plan, _approve(plan, tmp_path))
    client = JobClient(ep.url)
    try:
        client.wait_ready(timeout_s=60)
    finally:
        client.close()
    done = _destroy(prov, ep.id, tmp_path)
    assert killed and done.detail["processes"]["survivors"] == []
    _assert_gone(prov, ep.id)


def test_an_endpoint_whose_front_door_dies_fails_fast(tmp_path: Path) -> None:
    prov = LocalProvider(root=tmp_path / "state", python="/bin/false")  # the front door cannot even start
    spec = EndpointSpec(name="e", params_path="unused.yaml", side="target", workers=1, price_usd_per_hour=0.2,
                        labels=LABELS)
    plan = prov.plan_endpoint(spec, dry_run=False)
    t0 = time.monotonic()
    with pytest.raises(ProviderError, match="front door exited before serving"):
        prov.apply(plan, _approve(plan, tmp_path))
    assert time.monotonic() - t0 < 20
    [ep] = prov.list(labels={"run_id": "race"})
    _destroy(prov, ep.id, tmp_path)
    _assert_gone(prov, ep.id)


class VanishingMarkerStore(FileStore):
    """A file store in which another writer removes a set's completion marker right after a reader
    has checked for it (the moment between a check and a read)."""

    def get_bytes(self, key: str) -> bytes:
        if key.endswith("_SUCCESS"):
            self.delete(key)
        return super().get_bytes(key)


def test_a_marker_removed_while_a_set_is_read_is_an_incomplete_set(tmp_path: Path) -> None:
    store = VanishingMarkerStore(tmp_path / "store")
    (tmp_path / "w.bin").write_bytes(b"weights")
    info = store.put_file(tmp_path / "w.bin", "set/w.bin")
    store.commit_set("set", [info], run_id="r1")
    with pytest.raises(StorageError, match="no completion marker _SUCCESS: the set is incomplete"):
        store.read_manifest("set", run_id="r1")


def test_objects_replaced_under_a_reader_never_crash_it(tmp_path: Path) -> None:
    # A writer replaces and removes one object while a reader heads and reads it: every read sees
    # one whole version or none, and never an unexplained OSError.
    import threading

    store = FileStore(tmp_path / "store")
    versions = {b"a" * 70_000, b"b" * 90_000}
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            for v in versions:
                store.put_bytes(v, "obj")
            store.delete("obj")

    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(1500):
            info = store.head("obj")
            assert info is None or info.size_bytes in (70_000, 90_000)
            try:
                assert store.get_bytes("obj") in versions
            except StorageError as exc:
                assert "does not exist" in str(exc)
    finally:
        stop.set()
        t.join()


def test_a_reused_pid_is_never_taken_for_the_pod(tmp_path: Path) -> None:
    # The provider keeps the leader's pid in its record. After the pod dies that pid can name
    # another process; simulated here by pointing the record at a live stranger. The pod must
    # read as exited, and its destroy must leave the stranger alone.
    import json
    import subprocess

    prov = LocalProvider(root=tmp_path / "state")
    pod = _launch_tree(prov, tmp_path)
    _sigkill(_marked(pod.id))
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        record = tmp_path / "state" / "pods" / pod.id / "pod.json"
        meta = json.loads(record.read_text())
        assert meta["state"] == "RUNNING"  # not refreshed since the kill
        meta["pid"] = stranger.pid  # same number, another process (different creation time)
        record.write_text(json.dumps(meta))
        assert prov.get(pod.id).state == "EXITED"
        _destroy(prov, pod.id, tmp_path)
        _assert_gone(prov, pod.id)
        assert stranger.poll() is None  # never signalled
    finally:
        stranger.kill()
        stranger.wait()


def test_phase_teardown_of_a_resource_gone_since_it_was_listed(make_params, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # Phase 06 lists the run's resources, then destroys each. One that vanished in between is
    # judged on the labels it was listed with and ends as a teardown that found it gone; an id
    # nobody knows is "nothing to destroy"; a live resource of another run still needs its own
    # approval.
    from runbook_lib.errors import ApprovalRequired
    from runbook_lib.evidence.rundir import RunDir
    from runbook_lib.phases import open_phase

    params = make_params(approvals={"preapproved_local": False})
    (tmp_path / "reports").mkdir(exist_ok=True)
    run = RunDir.create(params, path=tmp_path / "reports" / "20261130T000000Z-race-000001")
    ctx = open_phase("06", str(params), str(run.path))
    vanished = ctx.resources.destroy("target", "pod-0badc0de", labels={"run_id": ctx.run_id, "role": "canary"})
    unknown = ctx.resources.destroy("target", "pod-00000000")
    assert isinstance(vanished, Teardown) and vanished.found == "gone"
    assert isinstance(unknown, Teardown) and unknown.found == "gone"
    assert [p.method for p in ctx.evidence.plans] == [
        "teardown of a resource this run created under an approved launch",
        "nothing to destroy: the provider no longer knows it"]
    prov = LocalProvider(root=tmp_path / ".runbook" / "local")
    stranger = prov.apply(*_planned_launch(prov, tmp_path, (("run_id", "another-run"),)))
    try:
        with pytest.raises(ApprovalRequired):
            ctx.resources.destroy("target", stranger.id)
        assert prov.get(stranger.id).state == "RUNNING"
    finally:
        _destroy(prov, stranger.id, tmp_path)


def _planned_launch(prov: LocalProvider, tmp_path: Path, labels: tuple[tuple[str, str], ...]) -> tuple:
    spec = PodSpec(name="s", command=(sys.executable, "-c", "import time; time.sleep(600)"), device="cpu",
                   price_usd_per_hour=0.1, labels=labels)
    plan = prov.plan_launch(spec)
    return plan, _approve(plan, tmp_path)
