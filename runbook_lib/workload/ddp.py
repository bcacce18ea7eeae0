"""Data-parallel training inside one pod, launched with torchrun's conventions.

A training job whose profile sets ``world_size`` > 1 runs as that many processes on its pod. The
process the job driver runs (:mod:`runbook_lib.workload.job`) is rank 0: it starts ranks
1..N-1 as its own children with the environment torchrun gives each worker (``MASTER_ADDR``,
``MASTER_PORT``, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``:
PyTorch's "torchrun (Elastic Launch)" page, "Environment Variables"), and each joins the process
group through rank 0's TCP store at ``MASTER_ADDR:MASTER_PORT`` (``torch.distributed.TCPStore``):
``gloo`` on CPU, ``nccl`` on CUDA, rank ``r`` on ``cuda:r``. Rank 0 leads: before each step it broadcasts what every rank does next (a
:class:`Command`), so the driver's checkpoints, resumes, kills and drills act on one process
and the other ranks follow it. A rank whose leader is gone (killed, or ended by the step
watchdog) exits at once.

A distributed workload (:attr:`runbook_lib.workload.AcceptanceWorkload.distributed`) implements
:class:`Replica`; :class:`runbook_lib.workload.digits.DigitsWorkload` is the example.

The all-reduce benchmark times ``torch.distributed.all_reduce`` of a float32 tensor over every
rank as NVIDIA's nccl-tests ``all_reduce_perf`` does (5 warm-up and 20 timed iterations, its
defaults) and reports its figures with nccl-tests' formulas (:func:`bus_bandwidth`).
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Protocol

from runbook_lib.errors import WorkloadError
from runbook_lib.params import Workload
from runbook_lib.workload import make_workload
from runbook_lib.workload._torch import synchronize

if TYPE_CHECKING:
    from runbook_lib.params import Profile

SPEC_ENV = "RUNBOOK_DDP_SPEC"
"""The variable a helper rank reads its workload and profile from (JSON)."""
READY_FD_ENV = "RUNBOOK_DDP_READY_FD"
"""The file descriptor a helper rank writes one byte to once its workload loaded."""
COLLECTIVE_TIMEOUT_S = 3600.0
"""How long a rank waits in one collective. The leader may spend minutes between steps (uploads,
evaluation); a helper whose leader died does not wait for it (:func:`_follow_parent`)."""
LEADER_TIMEOUT_S = 600.0
"""How long rank 0 waits for the other ranks, to join the process group or to reach a collective
(the job driver's own limit on an attempt, ``job.CHILD_TIMEOUT_S``), seconds."""
STOP_WAIT_S = 30.0
"""How long rank 0 waits for a helper rank to exit after it said stop, seconds (then SIGKILL)."""
WARMUP_ITERS, TIMED_ITERS = 5, 20
"""nccl-tests' defaults (its ``-w`` and ``-n``: "warmup iters: 5 iters: 20" in every run's header)."""


class Command(IntEnum):
    """What rank 0 tells the other ranks to do next (broadcast as ``[command, argument]``)."""

    STOP = 0
    STEP = 1  # argument: the step; the global batch's row indices follow
    SYNC = 2  # rank 0's replica state follows (broadcast_object_list)
    BENCH = 3  # argument: float32 elements of the all-reduce


class Replica(Protocol):
    """What a distributed workload does on every rank (rank 0 calls the same methods itself)."""

    def replica_state(self) -> dict[str, Any]:
        """The state every rank must share before stepping (weights, optimizer state); rank 0's."""

    def replica_load(self, state: dict[str, Any]) -> None:
        """Take ``state`` from rank 0 and wrap the model for data-parallel steps."""

    def replica_step(self, indices: Any) -> dict[str, float]:
        """Train on this rank's share of the global batch ``indices`` (int64, ``(global batch,)``)."""

    def global_batch(self) -> int:
        """Rows in one step over all ranks: ``batch_size * world_size``."""


def backend(device: str) -> str:
    """``nccl`` for a CUDA device, ``gloo`` otherwise (PyTorch's distributed docs: "Use the NCCL
    backend for distributed GPU training. Use the Gloo backend for distributed CPU training")."""
    return "nccl" if device.startswith("cuda") else "gloo"


def rank_device(device: str, local_rank: int) -> str:
    """The device of rank ``local_rank`` on a pod whose profile names ``device``: ``cpu`` for
    every rank, or the CUDA device ``local_rank`` places past the profile's index (torchrun's
    convention: one GPU per local rank)."""
    if not device.startswith("cuda"):
        return device
    base = int(device.partition(":")[2] or 0)
    return f"cuda:{base + local_rank}"


def bus_bandwidth(size_bytes: float, seconds: float, ranks: int) -> tuple[float, float]:
    """All-reduce algorithm and bus bandwidth, bytes per second.

    ``algbw = size / time``; ``busbw = algbw * 2 (n - 1) / n`` for an all-reduce of ``n`` ranks
    (NVIDIA nccl-tests, doc/PERFORMANCE.md, "Bus bandwidth", AllReduce), so figures from 2 and 16
    ranks compare with the hardware's link speed, not with each other's algorithm.

    Raises:
        WorkloadError: ``seconds`` is not positive or ``ranks`` < 2.
    """
    if seconds <= 0 or ranks < 2:
        raise WorkloadError(f"an all-reduce of {ranks} rank(s) in {seconds} s has no bandwidth: it needs 2 or more "
                            "ranks and a positive time")
    algbw = size_bytes / seconds
    return algbw, algbw * 2 * (ranks - 1) / ranks


def _command(op: Command = Command.STOP, arg: int = 0) -> tuple[Command, int]:
    """Broadcast ``[op, arg]`` from rank 0 (``op`` is ignored elsewhere) and return what was sent."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([int(op), arg], dtype=torch.int64, device=_COMM_DEVICE[0])
    dist.broadcast(t, src=0)
    return Command(int(t[0])), int(t[1])


_COMM_DEVICE = ["cpu"]  # where this process's collectives' tensors live (its rank's device)


def time_allreduce(elements: int, device: str) -> float:
    """Seconds per all-reduce of ``elements`` float32 over every rank, the slowest rank's: a
    barrier, :data:`WARMUP_ITERS` untimed, then :data:`TIMED_ITERS` timed back to back with the
    device synchronised before each clock read. Every rank calls it."""
    import torch
    import torch.distributed as dist

    dev = torch.device(device)
    x = torch.ones(elements, dtype=torch.float32, device=dev)
    for _ in range(WARMUP_ITERS):
        dist.all_reduce(x)
    synchronize(dev)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(TIMED_ITERS):
        dist.all_reduce(x)
    synchronize(dev)
    took = torch.tensor([(time.perf_counter() - t0) / TIMED_ITERS], dtype=torch.float64, device=dev)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return float(took.item())


def _object_device(device: str) -> Any:
    """Where broadcast_object_list stages its bytes: the rank's GPU under NCCL, else the default."""
    import torch

    return torch.device(device) if device.startswith("cuda") else None


def spec(workload: Workload, profile: "Profile") -> str:
    """What a helper rank builds its workload from (JSON): the workload and the profile as the
    params declared them (defaults are derived again there: a dump of them can contradict a
    rule), with the fields every rank uses, and the profile's class."""
    declared = {**profile.model_dump(mode="json", exclude_unset=True),
                **profile.model_dump(mode="json", include={"device", "dtype", "threads", "batch_size", "world_size"})}
    return json.dumps({"workload": workload.model_dump(mode="json", exclude_unset=True), "profile": declared,
                       "profile_class": f"{type(profile).__module__}:{type(profile).__qualname__}"}, sort_keys=True)


def tcp_store(host: str, port: int, world_size: int, *, master: bool, timeout_s: float) -> Any:
    """``torch.distributed.TCPStore``: the key-value store the ranks rendezvous through. The
    master (rank 0) listens on ``host:port`` (port 0: a free port the kernel picks, read back as
    the store's ``port``) and does not wait for the others in its constructor; a client connects
    to it within ``timeout_s`` seconds (PyTorch's torch.distributed page, "TCPStore").

    Raises:
        RuntimeError: torch's own, when the port cannot be bound or the master not reached.
    """
    import torch.distributed as dist

    store_type = dist.TCPStore  # type: ignore[attr-defined]  # public, re-exported from torch._C without __all__
    return store_type(host, port, world_size, is_master=master, timeout=timedelta(seconds=timeout_s),
                      wait_for_workers=False)


class Ranks:
    """Rank 0's process group and the helper ranks it started (one per process: :func:`ranks`).

    Raises:
        WorkloadError: a helper rank did not join within :data:`LEADER_TIMEOUT_S`.
    """

    def __init__(self, workload: Workload, profile: "Profile") -> None:
        import torch.distributed as dist

        self.world_size, self.device = profile.world_size, rank_device(profile.device, 0)
        self.owner: object = None
        self.closed = False
        # Rank 0 binds the rendezvous store's port itself (port 0: the kernel's pick) before any
        # helper starts, so nothing else on the host can take the port between a pick and the bind.
        store = tcp_store("127.0.0.1", 0, self.world_size, master=True, timeout_s=LEADER_TIMEOUT_S)
        port = int(store.port)
        self.spec = spec(workload, profile)
        layout = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(self.world_size),
                  "LOCAL_WORLD_SIZE": str(self.world_size), "GROUP_RANK": "0", SPEC_ENV: self.spec}
        # each helper says it loaded the workload on a pipe (READY_FD_ENV) before it joins, so one
        # that fails to start is named at once, not after the group's timeout
        ready_r, ready_w = os.pipe()
        # the environment is a copy built before the fork (see job.spawn_attempt)
        self.helpers = [subprocess.Popen([sys.executable, "-m", "runbook_lib.workload.ddp"], pass_fds=(ready_w,),
                                         env={**os.environ, **layout, "RANK": str(r), "LOCAL_RANK": str(r),
                                              READY_FD_ENV: str(ready_w)})
                        for r in range(1, self.world_size)]
        os.close(ready_w)
        try:
            self._await_ready(ready_r)
        finally:
            os.close(ready_r)
        try:
            dist.init_process_group(backend(profile.device), store=store, rank=0,
                                    world_size=self.world_size, timeout=timedelta(seconds=LEADER_TIMEOUT_S))
        except Exception as exc:  # noqa: BLE001 - the join's own error, named with what it waited for
            self._end()
            raise WorkloadError(f"the {self.world_size - 1} helper rank(s) of a world_size {self.world_size} job did "
                                f"not join the {backend(profile.device)} process group within {LEADER_TIMEOUT_S:g} s "
                                f"({type(exc).__name__}: {exc}); see the pod log for the helpers' errors") from None
        _COMM_DEVICE[0] = self.device
        atexit.register(self.close)

    def _await_ready(self, fd: int) -> None:
        """Wait until every helper has loaded its workload (one byte each on ``fd``).

        Raises:
            WorkloadError: a helper exited first (its exit code named; its error is in the pod
                log), or they were not all ready within :data:`LEADER_TIMEOUT_S`.
        """
        import select

        ready, deadline = 0, time.monotonic() + LEADER_TIMEOUT_S
        while ready < len(self.helpers):
            dead = [(r, p.returncode) for r, p in enumerate(self.helpers, 1) if p.poll() is not None]
            late = time.monotonic() > deadline
            if dead or late:
                self._end()
                raise WorkloadError(
                    f"helper rank(s) of a world_size {self.world_size} job did not start: " + (
                        ", ".join(f"rank {r} exited with code {code}" for r, code in dead) if dead else
                        f"{len(self.helpers) - ready} not ready within {LEADER_TIMEOUT_S:g} s")
                    + "; its error is in the pod log above (the workload's load() failed there)")
            if select.select([fd], [], [], 0.1)[0]:
                ready += len(os.read(fd, 64))

    def sync(self, replica: Replica, *, changed: bool) -> None:
        """Give every rank ``replica``'s state when another workload stepped last or it ``changed``."""
        import torch.distributed as dist

        if self.owner is replica and not changed:
            return
        _command(Command.SYNC)
        state = [replica.replica_state()]
        dist.broadcast_object_list(state, src=0, device=_object_device(self.device))
        replica.replica_load(state[0])
        self.owner = replica

    def step(self, i: int, indices: Any) -> None:
        """Tell every rank to run step ``i`` on the global batch ``indices`` (int64)."""
        import torch.distributed as dist

        _command(Command.STEP, i)
        dist.broadcast(indices.to(self.device), src=0)

    def allreduce(self, size_bytes: int) -> dict[str, Any]:
        """Time an all-reduce of ``size_bytes`` (rounded down to float32 elements) over every rank.

        Returns:
            ``{"size_bytes", "ranks", "time_s", "algbw_bytes_per_s", "busbw_bytes_per_s",
            "warmup_iters", "iters"}`` (:func:`bus_bandwidth`).
        """
        elements = max(1, size_bytes // 4)
        _command(Command.BENCH, elements)
        took = time_allreduce(elements, self.device)
        algbw, busbw = bus_bandwidth(elements * 4, took, self.world_size)
        return {"size_bytes": elements * 4, "ranks": self.world_size, "time_s": took, "algbw_bytes_per_s": algbw,
                "busbw_bytes_per_s": busbw, "warmup_iters": WARMUP_ITERS, "iters": TIMED_ITERS,
                "backend": backend(self.device)}

    def close(self) -> None:
        """Stop the helper ranks and leave the process group (at exit, or before another group);
        once: a closed group's exit hook is removed, so it never reaches a newer group."""
        import torch.distributed as dist

        if self.closed:
            return
        self.closed = True
        atexit.unregister(self.close)
        if dist.is_initialized() and any(p.poll() is None for p in self.helpers):
            try:
                _command(Command.STOP)
            except Exception:  # noqa: BLE001 - a helper already gone: it is reaped below
                pass
        self._end()

    def _end(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        for p in self.helpers:
            try:
                p.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if _RANKS.get("current") is self:
            _RANKS.pop("current")


_RANKS: dict[str, Ranks] = {}
_HELPER: list[bool] = []  # non-empty in a helper rank (helper_main)


def ranks(workload: Workload, profile: "Profile") -> Ranks:
    """This process's :class:`Ranks` for this workload and profile, started on first use (and
    started again, the old ones stopped, for another workload or profile).

    Raises:
        WorkloadError: called in a helper rank (only rank 0 starts ranks), or as :class:`Ranks`.
    """
    if _HELPER:
        raise WorkloadError("a helper rank cannot start ranks of its own; only rank 0 leads (ddp.leading())")
    current = _RANKS.get("current")
    if current is not None and current.spec != spec(workload, profile):
        current.close()
        current = None
    if current is None:
        current = _RANKS["current"] = Ranks(workload, profile)
    return current


def leading() -> bool:
    """Whether this process leads its ranks (rank 0, or a job of one process), not a helper rank."""
    return not _HELPER


def current() -> Ranks | None:
    """The ranks this process started, if any."""
    return _RANKS.get("current")


def _follow_parent(parent: int) -> None:
    """End this helper rank as soon as its leader (rank 0, its parent) is gone."""
    while os.getppid() == parent:
        time.sleep(0.1)
    os._exit(0)


def _replica_from_spec() -> Any:
    import importlib

    spec = json.loads(os.environ[SPEC_ENV])
    module, _, name = spec["profile_class"].partition(":")
    profile_cls = getattr(importlib.import_module(module), name)
    local = int(os.environ["LOCAL_RANK"])
    prof = profile_cls.model_validate({**spec["profile"], "device": rank_device(spec["profile"]["device"], local)})
    return make_workload(Workload.model_validate(spec["workload"]), prof)


def helper_main() -> int:
    """Rank ``RANK`` (> 0): join the group, load the workload without an artifact, then do what
    rank 0 broadcasts until it says stop."""
    import torch
    import torch.distributed as dist

    threading.Thread(target=_follow_parent, args=(os.getppid(),), name="follow-rank0", daemon=True).start()
    _HELPER.append(True)
    wl = _replica_from_spec()
    wl.load(None)
    ready = int(os.environ[READY_FD_ENV])
    os.write(ready, b"1")
    os.close(ready)
    device = wl.profile.device
    _COMM_DEVICE[0] = device
    env = os.environ  # torchrun's layout (Ranks starts this process with it)
    store = tcp_store(env["MASTER_ADDR"], int(env["MASTER_PORT"]), int(env["WORLD_SIZE"]), master=False,
                      timeout_s=COLLECTIVE_TIMEOUT_S)  # rank 0's store (Ranks): the same keys on every rank
    dist.init_process_group(backend(device), store=store, rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]),
                            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    while True:
        op, arg = _command()
        if op == Command.STOP:
            break
        if op == Command.SYNC:
            state: list[Any] = [None]
            dist.broadcast_object_list(state, src=0, device=_object_device(device))
            wl.replica_load(state[0])
        elif op == Command.STEP:
            indices = torch.empty(wl.global_batch(), dtype=torch.int64, device=device)
            dist.broadcast(indices, src=0)
            wl.replica_step(indices)
        elif op == Command.BENCH:
            time_allreduce(arg, device)
    # The leader destroys the group. Gloo's threads here would abort an ordinary exit once their peer
    # is gone ("terminate called without an active exception", SIGABRT); this rank has nothing left
    # to save, so it leaves at once and the kernel closes its sockets.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    # run as the imported module, not as __main__, so the workload's own `ddp` is this one
    import importlib

    sys.exit(importlib.import_module("runbook_lib.workload.ddp").helper_main())
