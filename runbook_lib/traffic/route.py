"""Where traffic goes during a cutover: the share sent to the target, persisted in the run
directory (``route.json``) with its history, so phase 06 can restore the source route whatever
phase 05 left behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runbook_lib._time import utc_now
from runbook_lib.evidence.manifest import write_json_atomic


class Route:
    """Traffic split between source and target, persisted with its history.

    Args:
        path: the route file (``<run_dir>/route.json``).
        actor: who changes the route through this object (recorded with every change).
    """

    def __init__(self, path: Path, *, actor: str = "runbook") -> None:
        self.path = path
        self.actor = actor
        self.state: dict[str, Any] = (json.loads(path.read_text()) if path.exists()
                                      else {"target_percent": 0, "history": []})

    @property
    def target_percent(self) -> int:
        return int(self.state["target_percent"])

    def set(self, percent: int, reason: str) -> None:
        """Point ``percent`` % of traffic at the target (0 = all on source) and record why."""
        self.state["target_percent"] = percent
        self.state["history"].append({"at": utc_now(), "target_percent": percent, "reason": reason,
                                      "actor": self.actor})
        write_json_atomic(self.path, self.state)
