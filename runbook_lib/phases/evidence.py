"""What a phase produces: the files its record hashes, the plans it showed or applied, the gates
it judged, and the record body built from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runbook_lib.evidence.records import PhaseData, PlanRow
from runbook_lib.evidence.rundir import RunDir
from runbook_lib.gates import GateResult, holds
from runbook_lib.storage import Store


@dataclass
class Evidence:
    """One phase's evidence.

    Attributes:
        run: the run directory.
        files: paths (relative to the run) the phase produced, hashed into its record.
        plans: every plan the phase showed (dry-run) or applied, with who approved it and how.
        gates: the gates the phase judged.
        scope: where a raced candidate's files go (``03/candidates/<name>``, :meth:`scoped`): a
            file ``03/x`` of the candidate is ``03/candidates/<name>/x``, a file outside the
            phase's directory (an approval) stays where it is; empty for the phase's own.
    """

    run: RunDir
    files: list[str] = field(default_factory=list)
    plans: list[PlanRow] = field(default_factory=list)
    gates: list[GateResult] = field(default_factory=list)
    scope: str = ""

    def scoped(self, scope: str) -> "Evidence":
        """This phase's evidence for one raced candidate: the same files, plans and gates (one
        record), its files under ``<phase dir>/<scope>/``."""
        return Evidence(self.run, self.files, self.plans, self.gates, scope)

    def where(self, rel: str) -> str:
        """``rel`` as this view writes it (:func:`scoped_path`)."""
        return scoped_path(self.scope, rel)

    def path(self, rel: str) -> Path:
        """Absolute path of a file this phase produces; registered for hashing into the record."""
        rel = self.where(rel)
        p = self.run.file(rel)
        if rel not in self.files:
            self.files.append(rel)
        return p

    def fetch(self, store: Store, prefix: str, rel_dir: str) -> dict[str, Path]:
        """Download a verified set from ``store`` into ``<run>/rel_dir`` (re-hashing every byte);
        the files become evidence of this phase."""
        paths = store.fetch_set(prefix, self.run.path / self.where(rel_dir))
        for p in paths.values():
            rel = str(p.relative_to(self.run.path))
            if rel not in self.files:
                self.files.append(rel)
        return paths

    def write_json(self, rel: str, data: Any) -> Path:
        """Write evidence ``rel`` as indented JSON, atomically (temporary name, fsync, rename), and
        register it for this phase's record."""
        self.path(rel)
        return self.run.write_json(self.where(rel), data)

    def add_gates(self, *results: GateResult) -> list[GateResult]:
        self.gates.extend(results)
        return list(results)

    def body(self, data: PhaseData, **fields: Any) -> PhaseData:
        """The record data: ``data`` (the phase's model) with the gates, the plans, whether a
        blocking gate stops (FAIL) or holds (INCONCLUSIVE or ERROR, or NOT_APPLICABLE with nothing
        covering it: :func:`runbook_lib.gates.holds`) the migration, and ``fields``. Never cut
        over on inconclusive evidence: such a gate holds the migration before the next phase
        (docs/reference/gates.md section 5.2)."""
        return data.model_copy(update={
            "gates": tuple(self.gates), "plans": tuple(self.plans),
            "stop_migration": any(g.blocking and g.verdict == "FAIL" for g in self.gates),
            "hold_migration": holds(self.gates),
            **fields})


def scoped_path(scope: str, rel: str) -> str:
    """``rel`` (a path in the run directory) as a raced candidate's view of its phase writes and
    reads it: a path in the phase's directory moved under ``scope`` (``03/candidates/<name>``:
    ``03/canary/outputs.npy`` is ``03/candidates/<name>/canary/outputs.npy``); any other path, and
    every path when ``scope`` is empty, unchanged."""
    phase_dir = scope.split("/", 1)[0]
    if not scope or not rel.startswith(phase_dir + "/"):
        return rel
    return f"{scope}/{rel[len(phase_dir) + 1:]}"
