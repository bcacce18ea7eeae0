"""Where a project keeps its things: the project root a params file belongs to, and the
directories under it (``reports/``, ``notebooks/``, ``.runbook/``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

REPORTS_DIR = "reports"  # run directories: reports/<run_id>
NOTEBOOKS_DIR = "notebooks"  # the phase notebooks
STATE_DIR = ".runbook"  # provider state under the project root: .runbook/<provider>

# The files of a run directory (reports/<run_id>/) that more than one module reads or writes,
# each named once; paths relative to the run directory.
KEPT_PARAMS = "params.yaml"  # the params the run started with (their bytes are checked at every phase)
RECEIPT = "receipt.json"  # phase 06: the decision, why, and every gate
MANIFEST = "manifest.json"  # the seal: what ran, on what, every record and notebook by sha256
COMPLETION_MARKER = "_SUCCESS"  # written last, after the manifest; a run without it is not complete
RESOLUTION = "resolution.json"  # a person's (or the deadline's) decision on a HOLD run, after the seal
ROUTE = "route.json"  # the traffic route's share and history (phases 05 and 06)
CLEANUP_RECORD = "cleanup.json"  # `runbook cleanup`: what it found and destroyed
ROLLBACK_POINT = "05/rollback_point.json"  # what restoring the source needs, and when the window closes
GOLDEN_OUTPUTS = "01/golden_outputs.npy"  # the source's outputs on the fixed inputs, float
SERVICE_GOLDEN = "01/service_golden.json"  # kind service: the source's answer to each sample input
GOLDEN_INFERENCE_OUTPUTS = "01/golden_inference_outputs.npy"  # a checkpoint entry point's answers
GOLDEN_FINAL_OUTPUTS = "01/golden_final_outputs.npy"  # a training job's outputs after its last step
CANARY_OUTPUTS = "03/canary/outputs.npy"  # the canary's outputs on the same inputs
CANARY_INFERENCE_OUTPUTS = "03/canary/inference_outputs.npy"

# What the runbook puts into a pod's or worker's environment, each named once.
POD_PARAMS_ENV = "RUNBOOK_PARAMS_YAML"  # the run's params (KEPT_PARAMS' text)
POD_DEVICE_ENV = "RUNBOOK_DEVICE"  # the side's device (``cpu``, ``cuda``, ``cuda:1``)
POD_SIDE_ENV = "RUNBOOK_SIDE"  # ``source`` or ``target``
POD_FAULT_ENV = "RUNBOOK_FAULT"  # a drill's or a simulator's injected fault (``worker_crash``, ...)
POD_CANDIDATE_ENV = "RUNBOOK_CANDIDATE"  # the candidate a target pod or worker runs as (an alternate, a raced one)
CRASH_EVERY = 7
"""The ``worker_crash`` fault: a worker dies after serving this many requests, holding the next."""
POD_ID_ENV = "LOCAL_POD_ID"  # the local provider's id of the pod, in its processes (their marker; Runpod's RUNPOD_POD_ID)
POD_VOLUME_ENV = "LOCAL_POD_VOLUME"  # the local pod's persistent volume directory (set by the provider)


def project_root(params_path: str | Path) -> Path:
    """The project a params file belongs to: the parent of the ``params/`` directory holding it
    (the layout ``runbook init`` writes); else the nearest ancestor holding ``pyproject.toml``;
    else the file's directory. ``reports/``, ``notebooks/`` and ``.runbook/`` resolve against it."""
    p = Path(params_path).resolve()
    if p.parent.name == "params":
        return p.parent.parent
    for d in p.parents:
        if (d / "pyproject.toml").exists():
            return d
    return p.parent


def params_sha256(path: str | Path) -> str:
    """sha256 (hex) of the params file's bytes, as recorded in the run manifest."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
