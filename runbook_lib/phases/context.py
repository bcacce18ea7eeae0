"""The phase context: one phase of one run, with its evidence, its resources and its store;
opened by :func:`open_phase` and written by :meth:`PhaseContext.finish`."""

from __future__ import annotations

import dataclasses
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from runbook_lib import __version__
from runbook_lib._time import utc_now
from runbook_lib.errors import EvidenceError, ParamsError
from runbook_lib.evidence.manifest import PHASES, Record
from runbook_lib.evidence.records import Chain, PhaseData, checked
from runbook_lib.evidence.rundir import OnRun, RunDir
from runbook_lib.gates import GateResult, tolerance_for
from runbook_lib.layout import params_sha256
from runbook_lib.phases.agents import Agents
from runbook_lib.phases.endpoints import Endpoints
from runbook_lib.phases.evidence import Evidence
from runbook_lib.phases.resources import Resources
from runbook_lib.phases.scan import scan_run
from runbook_lib.storage import Store, store_from_params
from runbook_lib.workload import put_project_on_path

RACED_PHASES = ("03", "04")
"""The phases that rent machines for every raced candidate (``targets``): each keeps its own files
and store sets there (:meth:`PhaseContext.for_candidate`)."""


@dataclass
class PhaseContext(OnRun):
    """One phase of one run.

    Attributes:
        phase: phase id ``"01"`` .. ``"06"``.
        run: the run directory (params, project root, records).
        run_mode: ``interactive`` (a person steps through the notebook; :meth:`finish` scans the
            run for credentials) or ``headless`` (the runner scans after the phase).
        approval_ref: an approval file for headless runs.
        records: verified records of earlier phases, by phase id, with their typed data.
        started: when the phase started (UTC ISO 8601).
        store_factory: opens the run's store; called once, on first use.
        evidence: what the phase produces (files, plans, gates).
        resources: the providers of both sides and the plans that use them.
        agents: the phase's agent pods (planned and run through ``resources``).
        endpoints: the phase's serving endpoints (planned and created through ``resources``).
        cache: provider reads reused within the phase.
        candidates: the contexts of this phase on a documented alternate or a raced candidate
            (:meth:`for_candidate`), by name.
        scope: a raced candidate's own place in the run's store and the phase's directory
            (``candidates/<name>``); empty for the phase's own target.
    """

    phase: str
    run: RunDir
    run_mode: str
    approval_ref: str
    records: Chain
    started: str
    store_factory: Callable[[], Store]
    evidence: Evidence = field(init=False)
    resources: Resources = field(init=False)
    agents: Agents = field(init=False)
    endpoints: Endpoints = field(init=False)
    cache: dict[str, Any] = field(default_factory=dict, repr=False)
    candidates: dict[str, "PhaseContext"] = field(default_factory=dict, repr=False)
    scope: str = ""

    def __post_init__(self) -> None:
        self._wire(Evidence(self.run))

    def _wire(self, evidence: Evidence) -> None:
        self.evidence = evidence
        self.resources = Resources(self.phase, self.run, self.records, self.evidence, lambda: self.store,
                                   self.approval_ref, scope=self.scope)
        self.agents = Agents(self.resources)
        self.endpoints = Endpoints(self.resources)

    def for_candidate(self, name: str) -> "PhaseContext":
        """This phase on candidate ``name`` (a documented alternate, :attr:`Migration.alternates`,
        or a raced candidate, :attr:`Migration.targets`) as its target: its own providers and
        plans, the same run, store and evidence, so what it rents, judges and writes goes into
        this phase's record. A raced candidate, proven and measured beside the others in one
        phase, keeps its files under ``<phase>/candidates/<name>/`` and its store sets under
        ``runs/<run_id>/candidates/<name>/`` (:attr:`scope`). Made once per name.

        Raises:
            ParamsError: no candidate has that name.
        """
        raced = self.phase in RACED_PHASES and any(t.name == name for t in self.mig.targets)
        if name == self.mig.target.name and (self.scope or not raced):
            return self
        if name not in self.candidates:
            scope = f"candidates/{name}" if raced else ""
            other = dataclasses.replace(self, run=dataclasses.replace(self.run, mig=self.mig.with_target(name)),
                                        store_factory=lambda: self.store, cache={}, candidates={}, scope=scope)
            other._wire(self.evidence.scoped(f"{self.phase}/{scope}") if scope else self.evidence)
            self.candidates[name] = other
        return self.candidates[name]

    @property
    def store(self) -> Store:
        """The run's store, opened (and its credentials resolved) on first use: a phase that only
        plans never needs the bucket's keys."""
        if "store" not in self.cache:
            self.cache["store"] = self.store_factory()
        store: Store = self.cache["store"]
        return store

    def _repr_markdown_(self) -> str:
        m = self.mig
        return (f"**Phase {self.phase}** · run `{self.run_id}` · migration `{m.migration}` ({m.workload.kind}, "
                f"{self.run_mode})  \n**Source** {m.source.release}  \n**Target** {m.target.release}")

    def take_target(self, name: str) -> None:
        """Go on with raced candidate ``name`` as this phase's target (phase 04 after the race's
        pick): its params, providers, plans and store records (:meth:`for_candidate`), while
        what the phase writes from now on goes to its own files, not the candidate's directory."""
        cand = self.for_candidate(name)
        if cand is self:
            return
        self.run, self.scope = cand.run, cand.scope
        self.resources, self.agents, self.endpoints = cand.resources, cand.agents, cand.endpoints
        self.candidates = {}

    def run_prefix(self, *parts: str) -> str:
        """Store prefix of this run whatever the candidate: ``runs/<run_id>/<parts...>`` (a set an
        earlier phase wrote, such as the frozen source)."""
        return "/".join(("runs", self.run_id, *parts))

    def store_prefix(self, *parts: str) -> str:
        """Store prefix of this run: ``runs/<run_id>/<parts...>``; a raced candidate's
        ``runs/<run_id>/candidates/<name>/<parts...>`` (:attr:`scope`)."""
        return "/".join(("runs", self.run_id, *([self.scope] if self.scope else []), *parts))

    def set_about(self, mode: str, validation: Mapping[str, object], **model: object) -> dict[str, object]:
        """What moves with a set this host writes to the store (``about`` in its manifest, as
        :func:`runbook_lib.workload.job.provenance` gives a pod's sets): the run, the ``mode``
        that wrote it, the model and dataset identifiers (``model`` adds to them), the runtime
        of this host, the configuration (params sha256 and the workload section) and
        ``validation`` (what was checked, JSON)."""
        w = self.mig.workload
        return {"run_id": self.run_id, "mode": mode, "side": "host",
                "model": {"workload": w.entry_point, "model_id": w.model_id, "dataset_id": w.dataset_id, **model},
                "runtime": {"python": platform.python_version(), "runbook_lib": __version__},
                "configuration": {"params_sha256": params_sha256(self.run.params_path),
                                  "workload": w.model_dump(mode="json", exclude_none=True)},
                "validation": dict(validation)}

    def accepted(self, golden: Any, row: dict[str, Any]) -> bool:
        """An accepted unit (docs/reference/gates-and-decisions.md, cost per accepted unit): COMPLETED, within the SLO
        (``workload.requirements.max_request_s``, seconds from intended arrival), and its output
        within the dtype's tolerance of golden row ``row["input_index"]`` (``golden``: float64
        array, shape ``(inputs, dims)``)."""
        import numpy as np

        if row["status"] != "COMPLETED" or row["total_s"] > self.mig.workload.requirements.max_request_s:
            return False
        out = row.get("output")
        if out is None:
            return False
        ref = golden[int(row["input_index"])]
        rt, at, _ = tolerance_for(self.mig.source.dtype, self.mig.gates.parity_rtol, self.mig.gates.parity_atol)
        obs = np.asarray(out, dtype=np.float64)
        return obs.shape == ref.shape and bool(np.all(np.abs(obs - ref) <= at + rt * np.abs(ref)))

    def earlier_gates(self) -> list[GateResult]:
        """Every gate the earlier phases' records hold, in phase order."""
        return self.records.gates()

    def finish(self, data: PhaseData) -> Record:
        """Write this phase's record (chained to the previous one) with its gates, plans and files.

        In interactive mode (no runner around the kernel) the run directory is then scanned for
        the values of every declared credential, as the runner does after each headless phase.

        Args:
            data: the phase's record model (:data:`runbook_lib.evidence.records.MODELS`).

        Raises:
            EvidenceError: ``data`` is not the phase's record model or does not fit it
                (:mod:`runbook_lib.evidence.records`; nothing is written), or a credential's value was found in the run's files (they
                are redacted; the message names the files and the credentials, never a value).
        """
        # a provider API that said it is a simulator makes this phase's evidence a rehearsal's
        sims = {side: p.simulator() for c in (*self.candidates.values(), self) for side, p in c.resources.providers.items()}
        body = self.evidence.body(data, simulators={side: name for side, name in sims.items() if name})
        record = self.run.write_record(self.phase, status="completed", data=checked(self.phase, body),
                                       files=self.evidence.files,
                                       started=self.started)
        if self.run_mode == "interactive":
            check_credentials(self.run, self.phase)
        return record


def scan_phase(run: RunDir, phase: str) -> dict[str, Any]:
    """Scan ``run`` for the values of every credential its params declare and redact what is
    found. The runner calls this after each headless phase; :meth:`PhaseContext.finish` calls it
    in interactive mode.

    Returns:
        The scan summary: ``phase``, ``files`` scanned, ``findings`` (names and paths only, never
        a value; empty when clean).
    """
    res = scan_run(run.path, run.mig, redact=True)
    res["phase"] = phase
    res["findings"] = [f.__dict__ for f in res["findings"]]
    return res


def leak_message(scan: dict[str, Any]) -> str:
    """What a scan with findings says: the credentials' names and the files, never a value."""
    where = sorted({f["path"] for f in scan["findings"]})
    return (f"phase {scan['phase']}: credentials ({sorted({f['what'] for f in scan['findings']})}) found in {where}; "
            "those files were redacted. Find what printed them and run the phase again.")


def check_credentials(run: RunDir, phase: str) -> dict[str, Any]:
    """:func:`scan_phase`, raising when anything was found.

    Raises:
        EvidenceError: a credential's value was in the run's files (now redacted).
    """
    res = scan_phase(run, phase)
    if res["findings"]:
        raise EvidenceError(leak_message(res))
    return res


def proven_target(records: Chain) -> str:
    """The candidate the phases after the last record run on, by name: the pick of phase 04's race
    (``targets``), else the target phase 03 proved (the params' target, or a documented alternate
    an approval named); empty before phase 03."""
    compare = records.compare
    if compare is not None and compare.race is not None and compare.race.goes_on():
        return compare.race.goes_on()
    parity = records.parity
    return parity.target if parity is not None else ""


def on_proven_target(run: RunDir, records: Chain) -> RunDir:
    """``run`` with the target it goes on with (:func:`proven_target`)."""
    name = proven_target(records)
    if not name or name == run.mig.target.name:
        return run
    return dataclasses.replace(run, mig=run.mig.with_target(name))


def open_phase(phase: str, params_path: str, run_dir: str = "", *, run_mode: str = "interactive",
               approval_ref: str = "") -> PhaseContext:
    """Start a phase: validate params, open (or, for phase 01, create) the run, verify earlier records.

    Args:
        phase: ``"01"`` .. ``"06"``.
        params_path: the migration YAML.
        run_dir: the run directory (relative to the project root, or absolute); empty means a new
            run for phase 01 and the newest run of this migration for later phases (interactive use).
        run_mode: ``interactive`` or ``headless`` (the runner passes ``headless``).
        approval_ref: path of an approval file for headless runs.

    Raises:
        ParamsError: bad params. UsageError: the run is sealed, not a run, or has other params.
        EvidenceError: unknown phase, an earlier record is missing or altered.
    """
    if phase not in dict(PHASES):
        raise EvidenceError(f"unknown phase {phase!r}; known phases are {[p for p, _ in PHASES]}")
    where = Path(params_path)
    if not where.is_absolute() and not where.exists():  # papermill's kernel starts where papermill was called
        raise ParamsError(f"params_path {params_path!r} does not exist relative to this kernel's working directory "
                          f"{Path.cwd()}. The notebook's default (../params/demo.yaml) is relative to notebooks/, "
                          "where JupyterLab starts a kernel; papermill starts it in the directory it was called "
                          "from (unless --cwd). Pass `-p params_path <absolute path>`, or run the phase with "
                          "`runbook phase`, which also records the notebook's provenance, scans and host lock")
    if run_dir:
        run = RunDir.open(run_dir, params_path)
    elif phase == "01":
        run = RunDir.create(params_path)
    else:
        run = RunDir.latest(params_path)
    records = Chain(run.require(phase))
    run = on_proven_target(run, records)
    put_project_on_path(run.project)  # the user's workload module, as the runner's preflight found it
    return PhaseContext(phase=phase, run=run, run_mode=run_mode, approval_ref=approval_ref, records=records,
                        started=utc_now(), store_factory=lambda: store_from_params(run.mig.storage, base=str(run.project)))
