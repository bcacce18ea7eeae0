"""The acceptance-job contract (seed 000): load the model, read sample inputs, run a few steps or
requests, save an artifact, reload it, and survive one failure-and-resume.

A workload is a class named in params as ``workload.entry_point: "module:Class"`` that
subclasses :class:`AcceptanceWorkload`. The job driver (:mod:`runbook_lib.workload.job`)
checkpoints its :meth:`~AcceptanceWorkload.state_dict` every few steps, kills it once mid-run
and resumes it from the newest checkpoint that verifies. Endpoint workers call
:meth:`~AcceptanceWorkload.infer`. Torch is imported inside the implementations, not here.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runbook_lib.errors import WorkloadError

if TYPE_CHECKING:
    import numpy as np

    from runbook_lib.params import Profile, Workload


class AcceptanceWorkload(ABC):
    """Base class of every acceptance workload.

    Args:
        workload: the ``workload`` section of params.
        profile: the side it runs on (device, dtype, threads, batch size).
    """

    kind: str = ""
    distributed: bool = False
    """Whether the class runs as ``world_size`` data-parallel processes when a profile asks for
    more than one (it then implements :class:`runbook_lib.workload.ddp.Replica`)."""

    def __init__(self, workload: "Workload", profile: "Profile") -> None:
        self.workload = workload
        self.profile = profile

    @abstractmethod
    def identity(self) -> dict[str, Any]:
        """Immutable identities: model id, weights / dataset sha256. JSON-serialisable."""

    @abstractmethod
    def load(self, artifact_dir: Path | None = None) -> None:
        """Load model and data. ``artifact_dir`` holds a frozen artifact from :meth:`export_artifact`
        (weights or checkpoint); ``None`` loads the packaged default.

        Raises:
            WorkloadError: the artifact is unusable.
        """

    def preload(self) -> None:
        """Import the libraries :meth:`load` needs, reading no artifact, checkpoint or data. The
        failure drill's resume process calls it while it stands by, so the measured restore is
        the model's, not the interpreter's imports. The default imports torch."""
        import torch  # noqa: F401

    @abstractmethod
    def export_artifact(self, dest_dir: Path) -> list[Path]:
        """Write the artifact that defines this workload's state (weights, checkpoint) into
        ``dest_dir`` and return the files written."""

    @abstractmethod
    def num_steps(self) -> int:
        """Steps in one acceptance run (training steps, or inference batches over the samples)."""

    @abstractmethod
    def step(self, i: int) -> dict[str, float]:
        """Run step ``i`` (0-based) and return its scalar metrics (e.g. ``{"loss": 0.31}``)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume after step ``i``: for torch.save. Tensors, numbers, strings
        and containers of them only: checkpoints are read back with ``torch.load(weights_only=True)``."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> int:
        """Restore a state; return the next step to run."""

    @abstractmethod
    def outputs(self) -> "np.ndarray":
        """Golden outputs for parity, float32: embeddings ``(n, 384)`` or eval logits ``(n, 10)``."""

    def inference_outputs(self) -> "np.ndarray | None":
        """The model's answers to fixed inputs, float32 ``(n, dims)``, when they are not what
        :meth:`outputs` returns; None (the default) when there are none. A ``kind: checkpoint``
        entry point overrides it so phases 01 and 03 check inference too (``inference_parity``),
        not only the loaded tensors."""
        return None

    def infer(self, inputs: list[Any]) -> list[Any]:  # pragma: no cover - inference only
        """Serve one request batch (endpoint workers). Training workloads do not serve."""
        raise WorkloadError(f"{type(self).__name__} is a {self.kind} workload and serves no requests")

    def request_inputs(self, n: int, seed: int) -> list[tuple[int, Any]]:  # pragma: no cover - inference only
        """``n`` request payloads for load tests, drawn with ``seed`` from the golden inputs, as
        ``(golden_row_index, payload)`` so every response can be checked against its golden row.
        Each payload is what JSON carries (dicts, lists, strings, finite numbers, booleans,
        None): it is the job's ``input``. Drawn from the inputs, not the model: the runner calls
        it (through :meth:`golden_requests`) before :meth:`load` and before anything is rented."""
        raise WorkloadError(f"{type(self).__name__} is a {self.kind} workload and serves no requests")

    def golden_requests(self) -> list[Any]:
        """Every golden request payload, in golden row order (inference). Phase 02 compares the
        largest with the endpoints' payload limits. The default draws ``request_inputs`` and keeps
        each golden row it reaches (4 x ``sample_size`` draws); a workload that can list its
        inputs directly should override this.

        Raises:
            WorkloadError: a training workload (it serves no requests).
        """
        seen = dict(self.request_inputs(4 * self.workload.sample_size, seed=0))
        return [seen[i] for i in sorted(seen)]


def load_workload_class(entry_point: str) -> type[AcceptanceWorkload]:
    """Import ``module:Class`` and check it is an :class:`AcceptanceWorkload`.

    Raises:
        WorkloadError: the module or class cannot be imported, is not a workload, or leaves an
            abstract method unimplemented (named).
    """
    module_name, _, attr = entry_point.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise WorkloadError(
            f"workload.entry_point {entry_point!r} cannot be imported: {exc}. Name a class in a module of "
            "the project directory (the one holding params/) or of an installed package, e.g. "
            "runbook_lib.workload.embed:EmbeddingWorkload"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, AcceptanceWorkload)):
        raise WorkloadError(f"workload.entry_point {entry_point!r} is not an AcceptanceWorkload subclass")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:  # found here, before anything is rented, not as a TypeError in a pod's log
        raise WorkloadError(f"workload.entry_point {entry_point!r} leaves {len(missing)} method(s) abstract: "
                            f"{', '.join(missing)}; implement each (runbook_lib.workload.AcceptanceWorkload "
                            "documents its contract), or the class cannot be created in any pod")
    return cls


CHECKPOINT_LOADER = ("runbook_lib.workload.checkpoint_set", "CheckpointWorkload")
"""Module and class every ``kind: checkpoint`` entry point subclasses (the safe loader)."""


def make_workload(workload: "Workload", profile: "Profile") -> AcceptanceWorkload:
    """Instantiate the workload named in params for one side.

    Raises:
        WorkloadError: as :func:`workload_class`.
    """
    return workload_class(workload)(workload, profile)


def workload_class(workload: "Workload") -> type[AcceptanceWorkload]:
    """The class ``workload.entry_point`` names, checked for its kind (the runner calls it before
    anything is rented).

    Raises:
        WorkloadError: as :func:`load_workload_class`; also a ``kind: checkpoint`` entry point that
            does not subclass :class:`runbook_lib.workload.checkpoint_set.CheckpointWorkload`
            (the checkpoint is frozen, verified and loaded safely by that class, never by user code).
    """
    cls = load_workload_class(workload.entry_point)
    if workload.kind == "checkpoint":
        # by qualified name: checkpoint_set imports this module
        if not any((c.__module__, c.__qualname__) == CHECKPOINT_LOADER for c in cls.__mro__):
            raise WorkloadError(f"workload.entry_point {workload.entry_point!r} is for kind 'checkpoint' but does not "
                                "subclass runbook_lib.workload.checkpoint_set.CheckpointWorkload: subclass it and "
                                "override inference_outputs() (the checkpoint is still loaded by it, safely)")
    return cls


def require_processes(cls: type[AcceptanceWorkload], **profiles: "Profile") -> None:
    """Check each side's ``world_size`` against what ``cls`` can run (the runner calls it before
    anything is rented).

    Raises:
        WorkloadError: a side asks for more than one process and ``cls`` is not
            :attr:`AcceptanceWorkload.distributed`.
    """
    many = [f"{side}.world_size {p.world_size}" for side, p in profiles.items() if p.world_size > 1]
    if many and not cls.distributed:
        raise WorkloadError(f"{' and '.join(many)}: {cls.__module__}.{cls.__qualname__} runs in one process (its "
                            "class does not set distributed = True and implement runbook_lib.workload.ddp.Replica); "
                            "set world_size: 1 or use a data-parallel workload such as "
                            "runbook_lib.workload.digits:DigitsWorkload")


def put_project_on_path(project: str | os.PathLike[str]) -> None:
    """Make a user's workload module importable wherever this run imports it: ``project`` (the
    directory holding ``params/``, :func:`runbook_lib.layout.project_root`) on ``sys.path`` for
    this process, and on ``PYTHONPATH`` for the processes it starts (the phase kernels, local pods
    and endpoint workers, and a rehearsal's simulated machines, which inherit this environment).
    Added after the entries already there. A real remote pod imports from its image: install
    the module there."""
    where = str(Path(project).resolve())
    if where not in sys.path:
        sys.path.append(where)
    current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if where not in current:
        os.environ["PYTHONPATH"] = os.pathsep.join([*current, where])


def request_payload_problems(workload: "Workload", profile: "Profile", *, limit: int = 5) -> list[str]:
    """What keeps a serving workload's golden requests from travelling as JSON job inputs, each
    a sentence naming the request, its type and the reason (at most ``limit``); empty when every
    one can, or when the workload serves no requests. JSON here is RFC 8259: no NaN or Infinity.

    Raises:
        WorkloadError: the class cannot be created, or its :meth:`AcceptanceWorkload.golden_requests`
            fails before :meth:`AcceptanceWorkload.load` (it must read inputs, not the model).
    """
    if not workload.serves or workload.kind == "service":
        return []
    try:
        requests = workload_class(workload)(workload, profile).golden_requests()
    except WorkloadError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code: named, never a traceback
        raise WorkloadError(f"workload.entry_point {workload.entry_point!r}: golden_requests() failed before load() "
                            f"({type(exc).__name__}: {exc}); the runner draws the requests before anything is "
                            "rented, so they must come from the inputs, not the model") from None
    out = []
    for i, payload in enumerate(requests):
        try:
            json.dumps({"input": payload}, allow_nan=False)
        except (TypeError, ValueError) as exc:
            out.append(f"golden request {i} is a {type(payload).__name__} that JSON cannot carry ({exc}); return "
                       "lists, dicts, strings and finite numbers (e.g. array.tolist())")
        if len(out) >= limit:
            break
    return out
