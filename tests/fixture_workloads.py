"""Small workloads for provider and endpoint tests: real processes, no model load."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from runbook_lib.workload import AcceptanceWorkload


class SleepWorkload(AcceptanceWorkload):
    """Inference workload whose request payload is seconds to sleep; returns ``[payload * 2]``.

    A payload of ``"boom"`` raises, so a job FAILS.
    """

    kind = "inference"

    def identity(self) -> dict[str, Any]:
        return {"model_id": "sleep"}

    def load(self, artifact_dir: Path | None = None) -> None:
        pass

    def export_artifact(self, dest_dir: Path) -> list[Path]:
        return []

    def num_steps(self) -> int:
        return 1

    def step(self, i: int) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> int:
        return 0

    def outputs(self) -> np.ndarray:
        return np.zeros((1, 1), dtype=np.float32)

    def infer(self, inputs: list[Any]) -> list[Any]:
        out = []
        for x in inputs:
            if x == "boom":
                raise ValueError("payload asked to fail")
            time.sleep(float(x))
            out.append([float(x) * 2])
        return out
