"""Execute the phase notebooks with papermill, honestly.

Plain papermill marks every cell "completed" after a cell timeout or a dead kernel
(docs/reference/notebooks.md section 1.7). The runner therefore asks nbclient to interrupt a timed
out cell and raise, catches ``DeadKernelError`` itself, stamps the executed notebook with its
own status (``metadata.runbook``), marks cells that never ran as such, and writes a ``failed``
phase record naming the notebook and cell. The executed notebook is always kept.

Phases 01..05 run in order until one fails or a blocking gate says stop; phase 06 always runs
so every run ends decided and torn down. Then ``manifest.json`` and, last, ``_SUCCESS``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from jupyter_client.manager import AsyncKernelManager
from traitlets import CaselessStrEnum, default

from runbook_lib._time import utc_now
from runbook_lib.errors import (
    EXIT_BY_DECISION,
    EXIT_FAILED,
    FULL_DISK,
    EvidenceError,
    ParamsError,
    PhaseFailed,
    ProviderError,
    WorkloadError,
    os_error_line,
)
from runbook_lib.evidence import records
from runbook_lib.evidence.manifest import PHASE_PLOTS, PHASES, PLOT_METADATA_KEY, phase_name
from runbook_lib.evidence.rundir import RunDir
from runbook_lib.evidence.seal import seal_run, sealed_decision
from runbook_lib.evidence.signing import load_signer
from runbook_lib.evidence.text import printable
from runbook_lib.layout import COMPLETION_MARKER, MANIFEST, REPORTS_DIR, project_root
from runbook_lib.params import LiveProfile, Migration, load_params
from runbook_lib.phases import leak_message, scan_phase, service_pods
from runbook_lib.run.cleanup import CleanupAborted, cleanup_run, summary
from runbook_lib.run.fulldisk import NO_SPACE, full_disk_error, remove_partial
from runbook_lib.run.hostlock import Held, LockWaitStopped, exclusive_for, host_lock
from runbook_lib.run.interrupt import Interrupts, exit_code
from runbook_lib.run.phase_notebooks import NotebookSource, phase_notebook, phase_notebooks
from runbook_lib.service import samples
from runbook_lib.service.pacing import PACE_MARGIN, SCHEDULE_MARGIN
from runbook_lib.traffic.router import executable
from runbook_lib.workload import put_project_on_path, request_payload_problems, require_processes, workload_class

KERNEL_NAME = "python3"
INTERRUPTED = "Interrupted"  # ename of a phase stopped by SIGINT/SIGTERM


class _StoppedBeforeCell(Exception):
    """Raised by the runner's cell hook: the run was interrupted, so cell ``cell_index`` is not run."""

    def __init__(self, cell_index: int) -> None:
        super().__init__(f"interrupted before cell {cell_index}")
        self.cell_index = cell_index


@dataclass
class PhaseOutcome:
    """How one phase ended: ``completed``, ``failed``, ``held`` (an approval is missing),
    ``interrupted`` or ``skipped``, with wall seconds, the reason, and (for a phase that ran) its
    gate verdicts and whether its record stops or holds the migration."""

    phase: str
    status: str
    seconds: float = 0.0
    reason: str = ""
    verdicts: list[str] = field(default_factory=list)
    stop: bool = False
    dry_run: bool = False
    notebook_source: dict[str, Any] | None = None  # NotebookSource.to_dict(): which notebook ran it
    lock_wait_s: float = 0.0  # seconds waited for the host lock before the phase began (runbook_lib.run.hostlock)
    note: str = ""  # one more line the run prints under the phase's (phase 04: the sequential gates' rounds)
    disk_full: bool = False  # failed for want of disk (runbook_lib.run.fulldisk): no further phase can write

    @classmethod
    def completed(cls, phase: str, seconds: float, data: records.PhaseData, *, notebook_source: dict[str, Any],
                  lock_wait_s: float) -> "PhaseOutcome":
        """A phase that ran to its end, from its record's data: its gates' verdicts, whether it
        stops or holds the migration, whether it only planned, and its note (:func:`sequential_line`)."""
        return cls(phase, "completed", seconds, verdicts=[x.verdict for x in data.gates], stop=data.stops,
                   dry_run=data.dry_run, notebook_source=notebook_source, lock_wait_s=lock_wait_s,
                   note=sequential_line(data))


@dataclass
class RunResult:
    """A finished run: its directory, the decision (or ``FAILED``), the exit code, per-phase outcomes."""

    run_dir: Path
    decision: str
    exit_code: int
    outcomes: list[PhaseOutcome] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)


def _failed_cell(nb: Any) -> int:
    """Index of the code cell that papermill started but whose execute reply never came (dead
    kernel); -1 when none can be told."""
    for i, cell in enumerate(nb.cells):
        started = (cell.get("metadata", {}).get("papermill") or {}).get("start_time")
        replied = "shell.execute_reply" in (cell.get("metadata", {}).get("execution") or {})
        if cell.cell_type == "code" and started and not replied:
            return i
    return -1


def _stamp(output: Path, *, status: str, cell_index: int, ename: str, evalue: str) -> None:
    """Write the runner's honest status into the executed notebook; cells after the failing one
    are marked ``not-run`` (papermill would call them completed)."""
    import nbformat

    if not output.exists():
        return
    nb = nbformat.read(output, as_version=4)
    nb.metadata.setdefault("runbook", {}).update(status=status, failed_cell_index=cell_index, ename=ename,
                                                 evalue=evalue, stamped_at=utc_now())
    cells = [c for c in nb.cells if "papermill-error-cell-tag" not in c.get("metadata", {}).get("tags", [])]
    for i, cell in enumerate(cells):  # indices as executed: papermill's error banners are not counted
        pm = cell.get("metadata", {}).get("papermill")
        if pm is None:
            continue
        if i == cell_index:
            pm["status"] = "failed"
        elif cell_index >= 0 and i > cell_index:
            pm["status"] = "not-run"
    nbformat.write(nb, output)


def stamp_provenance(nb_path: Path, **fields: Any) -> None:
    """Write the runner's provenance of a phase into its executed notebook's
    ``metadata.runbook`` (beside ``notebook_source``, :func:`scrub_paths`): ``host_lock`` (``mode``
    ``exclusive`` or ``shared``, ``waited_s`` seconds) and ``secret_scan`` (the scan summary of
    :func:`runbook_lib.phases.context.scan_phase`: names and paths, never a value). The seal reads them
    back (:func:`runbook_lib.evidence.seal.notebook_provenance`), so a run made phase by phase, each
    phase in its own process, is sealed with every phase's provenance. Nothing is written for a
    notebook that does not exist or does not read (cut off by a full disk)."""
    import nbformat

    if not nb_path.exists():
        return
    try:
        nb = nbformat.read(nb_path, as_version=4)
    except nbformat.reader.NotJSONError:
        return
    nb.metadata.setdefault("runbook", {}).update(fields)
    nbformat.write(nb, nb_path)


def scrub_paths(nb_path: Path, root: Path, source: NotebookSource | None = None) -> None:
    """Make the paths papermill writes into an executed notebook's metadata (parameters, input and
    output paths) relative to the project, so reports do not carry usernames or home directories;
    with ``source``, record which notebook ran (``metadata.runbook.notebook_source``) and name it as
    papermill's input path."""
    import nbformat

    if not nb_path.exists():
        return
    try:
        nb = nbformat.read(nb_path, as_version=4)
    except nbformat.reader.NotJSONError:  # cut off by a full disk: the phase's failure already says so
        return
    meta = nb.metadata.get("papermill", {})
    if source is not None:
        shown = source.to_dict(root)
        nb.metadata.setdefault("runbook", {})["notebook_source"] = shown
        meta["input_path"] = shown["path"]

    def rel(v: Any) -> Any:
        if isinstance(v, str) and Path(v).is_absolute() and Path(v).is_relative_to(root):  # not /root2 under /root
            return str(Path(v).relative_to(root)) or "."
        return v

    for key in ("input_path", "output_path"):
        if key in meta:
            meta[key] = rel(meta[key])
    for k, v in list(meta.get("parameters", {}).items()):
        meta["parameters"][k] = rel(v)
    for cell in nb.cells:
        if "injected-parameters" in cell.get("metadata", {}).get("tags", []):
            cell.source = cell.source.replace(str(root) + "/", "")
    nbformat.write(nb, nb_path)


def plots_shown(nb_path: Path) -> list[str]:
    """The plots an executed notebook shows: for each ``image/png`` output, the plot named in its
    metadata (:data:`runbook_lib.evidence.manifest.PLOT_METADATA_KEY`), or ``"<unnamed>"``; in order."""
    import nbformat

    nb = nbformat.read(nb_path, as_version=4)
    return [str((o.get("metadata", {}).get("image/png") or {}).get(PLOT_METADATA_KEY, "<unnamed>"))
            for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if "image/png" in o.get("data", {})]


def missing_plots(phase: str, nb_path: Path) -> list[str]:
    """The plots :data:`runbook_lib.evidence.manifest.PHASE_PLOTS` expects ``phase`` to show that its
    executed notebook does not show (an edited notebook that stopped displaying them, or a display
    path that depends on the kernel's plotting backend)."""
    shown = set(plots_shown(nb_path)) if nb_path.exists() else set()
    return [p for p in PHASE_PLOTS.get(phase, ()) if p not in shown]


def cleared(path: Path) -> Any:
    """The notebook at ``path`` as an ``nbformat`` node with no outputs, execution counts or saved
    widget state: a copy saved in JupyterLab after running cells executes exactly as a clean one,
    and no output of an earlier session (a stale approval button) reaches the executed report."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


class PhaseKernelManager(AsyncKernelManager):
    """nbclient's kernel manager, except that its kernel listens on Unix sockets of its own and
    shutting it down does not interrupt it first.

    Sockets: over TCP (jupyter_client's default), ``write_connection_file`` binds five ports to
    port 0, reads them and closes them, and the kernel binds them again once it has started; any
    process that binds a port meanwhile takes it, and the kernel dies with ``ZMQError: Address
    already in use`` (a CI run lost a phase so, beside servers and other kernels starting on
    loopback). With ``transport = "ipc"`` the kernel binds ``<ip>-<n>`` files instead, and ``ip``
    is a path no other kernel uses (:func:`kernel_socket_prefix`), so there is nothing to race
    for; jupyter_client removes the files when the kernel shuts down (``cleanup_ipc_files``).

    Shutdown: jupyter_client sends SIGINT to a kernel before every shutdown request, running or idle
    (``KernelManager._async_shutdown_kernel``; its ``shutdown_wait_time`` help: "the kernel will be
    immediately sent an interrupt (SIGINT), followed by a shutdown_request message"). After a
    phase's last cell there is nothing to interrupt, and a kernel still inside a message handler
    logged ``KeyboardInterrupt caught in kernel.`` to the run's terminal during a GO run. A cell
    timeout (nbclient's ``interrupt_on_timeout``) and the runner's own signal forwarding
    (:mod:`runbook_lib.run.interrupt`) still interrupt the kernel as before."""

    transport = CaselessStrEnum(["tcp", "ipc"], default_value="ipc", config=True)

    @default("ip")
    def _ip_default(self) -> str:
        return kernel_socket_prefix()

    async def _async_interrupt_kernel(self) -> None:
        if self.shutting_down:
            return
        await super()._async_interrupt_kernel()

    interrupt_kernel = _async_interrupt_kernel  # the async manager's public name for it


def kernel_socket_prefix() -> str:
    """A fresh path prefix for one kernel's Unix sockets (``<prefix>-1`` .. ``-5``): in the
    temporary directory, named by 12 random hex digits, short enough for a socket path (108
    bytes on Linux, ``sun_path``)."""
    return str(Path(tempfile.gettempdir()) / f"runbook-kernel-{uuid.uuid4().hex[:12]}")


def execute_phase(phase: str, params_path: Path, run_dir: Path, *, cell_timeout_s: int,
                  notebooks_dir: Path | None = None, approval_ref: str = "", interrupts: Interrupts | None = None,
                  cwd: Path | None = None, source: NotebookSource | None = None) -> Path:
    """Run one phase notebook into ``run_dir/NN_<phase>.ipynb``, from its outputs-cleared copy
    (:func:`cleared`).

    Args:
        notebooks_dir: a directory holding the phase notebook (``--notebooks``); None: the
            project's ``notebooks/`` copy if it has one, else the packaged one
            (:func:`runbook_lib.run.phase_notebooks.phase_notebook`).
        cwd: the kernel's working directory and the project (default: the params file's project).
        source: the notebook, already resolved (overrides ``notebooks_dir``).
        interrupts: the run's signal handler; when it has seen SIGINT/SIGTERM, a failure of the
            phase is reported as ``Interrupted`` (ename) and the notebook stamped ``interrupted``.

    Raises:
        PhaseFailed: a cell raised, timed out, the kernel died, or the run was interrupted (the
            notebook is kept and stamped; the message names notebook, cell, error name and value).
    """
    import nbformat
    import papermill as pm

    name = phase_name(phase)
    project = cwd or project_root(params_path)
    source = source or phase_notebook(phase, project=project, given=notebooks_dir)
    out = run_dir / f"{name}.ipynb"
    staging = tempfile.TemporaryDirectory(prefix="runbook-nb-")
    src = Path(staging.name) / f"{name}.ipynb"
    nbformat.write(cleared(source.path), src)
    params = {"params_path": str(params_path), "run_dir": str(run_dir), "run_mode": "headless",
              "approval_ref": approval_ref}

    def stop_if_interrupted(cell: Any, cell_index: int, **_: Any) -> None:
        # A kernel acts on SIGINT only while a cell runs; a signal that came while it started or
        # between two cells must still keep the next cell from running.
        if interrupts is not None and interrupts.signum:
            raise _StoppedBeforeCell(cell_index)

    try:
        pm.execute_notebook(
            str(src), str(out), parameters=params, kernel_name=KERNEL_NAME,
            cwd=str(project),
            progress_bar=False, log_output=False, execution_timeout=cell_timeout_s, interrupt_on_timeout=True,
            # The kernel's start-up messages stay out of the run's terminal; its errors still show.
            extra_arguments=["--IPKernelApp.log_level=ERROR"],
            on_cell_execute=stop_if_interrupted, kernel_manager_class=PhaseKernelManager,
            error_on_timeout={"ename": "CellTimeoutError",
                              "evalue": f"cell exceeded run.cell_timeout_s = {cell_timeout_s} s",
                              "traceback": [f"CellTimeoutError: cell exceeded {cell_timeout_s} s"]},
        )
    except Exception as exc:  # noqa: BLE001 - a cell's error, a dead kernel, a timeout, or what an interrupt broke
        failed = _phase_failure(phase, out, exc, interrupts, cell_timeout_s)
        if failed is None:
            raise
        raise failed from None
    finally:
        staging.cleanup()
    return out


def _phase_failure(phase: str, out: Path, exc: Exception, interrupts: Interrupts | None,
                   cell_timeout_s: int) -> PhaseFailed | None:
    """What papermill's exception ``exc`` means for the phase whose notebook is ``out``, with the
    notebook stamped: a cell's error, a cell timeout, a dead kernel, or (once a signal came) an
    interruption; None for any other exception, which is a bug to raise as it is."""
    import nbformat
    import papermill as pm
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    interrupted = interrupts is not None and bool(interrupts.signum)
    if isinstance(exc, OSError) and exc.errno in FULL_DISK:  # papermill saving the notebook after a cell
        return PhaseFailed(f"phase {phase} failed: {os_error_line(exc)}; {out.name} was cut off mid-write and is "
                           "not stamped", phase=phase, notebook=str(out), ename=NO_SPACE)
    cell_error = exc if isinstance(exc, pm.PapermillExecutionError) else None
    full = full_disk_error(ename=cell_error.ename, evalue=cell_error.evalue) if cell_error is not None else None
    if cell_error is not None and full is not None and not interrupted:  # a cell's own write met a full disk
        try:
            _stamp(out, status="failed", cell_index=cell_error.cell_index, ename=NO_SPACE, evalue=cell_error.evalue)
        except OSError:
            pass  # the same disk: the notebook stays as papermill left it (removed if it is not whole)
        return PhaseFailed(f"phase {phase} failed in {out.name}, cell {cell_error.cell_index}: {os_error_line(full)}",
                           phase=phase, notebook=str(out), cell_index=cell_error.cell_index, ename=NO_SPACE)
    if isinstance(exc, pm.PapermillExecutionError):
        idx, ename, evalue = exc.cell_index, exc.ename, exc.evalue
        if interrupted and interrupts is not None:
            ename, evalue = INTERRUPTED, f"stopped by {interrupts.name} at {interrupts.received_at}"
        elif ename == "KeyboardInterrupt":  # otherwise the runner sends SIGINT only on a cell timeout
            ename, evalue = "CellTimeoutError", f"cell exceeded run.cell_timeout_s = {cell_timeout_s} s and was interrupted"
    elif interrupted or isinstance(exc, (DeadKernelError, CellTimeoutError)):
        if isinstance(exc, _StoppedBeforeCell):
            idx, cause = exc.cell_index, f"before cell {exc.cell_index} ran"
        else:
            idx = _failed_cell(nbformat.read(out, as_version=4)) if out.exists() else -1
            cause = f"{type(exc).__name__}: {exc}"
        ename = INTERRUPTED if interrupted else type(exc).__name__
        evalue = (f"stopped by {interrupts.name} at {interrupts.received_at} ({cause})"
                  if interrupted and interrupts is not None else str(exc))
    else:
        return None
    status = "interrupted" if ename == INTERRUPTED else "failed"
    _stamp(out, status=status, cell_index=idx, ename=ename, evalue=evalue)
    return PhaseFailed(f"phase {phase} {status} in {out.name}, cell {idx}: {ename}: {evalue}",
                       phase=phase, notebook=str(out), cell_index=idx, ename=ename)


def _prefixed(say: Callable[[str], None], prefix: str) -> Callable[[str], None]:
    return lambda message: say(prefix + message)


@contextmanager
def _host_lock(phase: str, exclusive: bool, interrupts: Interrupts | None,
               echo: Callable[[str], None] | None, run: str = "") -> Iterator[Held]:
    """The host lock for one phase of run ``run``; a signal received while waiting for it
    interrupts the phase before its notebook starts (``PhaseFailed`` with ename ``Interrupted``)."""
    try:
        with host_lock(exclusive, on_wait=echo, stopped=lambda: bool(interrupts and interrupts.signum),
                       run=run, phase=phase) as held:
            yield held
    except LockWaitStopped as exc:
        raise PhaseFailed(f"phase {phase} {exc}: it did not start", phase=phase, notebook="",
                          ename=INTERRUPTED) from None


def escaped(say: Callable[[str], None]) -> Callable[[str], None]:
    """``say`` with every control or format character of each line escaped
    (:func:`runbook_lib.evidence.resolve.printable`): params strings and recorded reasons reach a terminal
    shown, never obeyed."""
    return lambda text: say("\n".join(printable(line) for line in text.split("\n")))


def phase_out_of_order(run: RunDir, phase: str) -> str | None:
    """Why ``phase`` cannot run yet in ``run``, or None: phases 02 to 05 each need every earlier
    phase completed (phase 06 decides from whatever records there are, and 01 starts a run). A
    phase run early would fail after waiting for the host lock and leave a record that breaks the
    evidence chain for the phase that was missing, so the refusal comes before anything runs. A
    phase after one that stopped the migration (:func:`stopped_by`) is not refused: ``runbook run``
    skips it, and a person who runs it by hand chooses to (``runbook phase`` and ``runbook status``
    say the migration was stopped)."""
    if phase in ("01", "06"):
        return None
    records = run.records()
    for pid, _name in PHASES:
        if pid == phase:
            return None
        rec = records.get(pid)
        if rec is None or rec.status != "completed":
            state = "has not run" if rec is None else f"is {rec.status}"
            return (f"phase {phase} needs every earlier phase completed, and phase {pid} ({phase_name(pid)}) {state} "
                    f"in {run.path.name}; run `runbook phase {pid} {run.params_path} {run.path}` first (nothing was "
                    "run)")
    return None


def stopped_by(record: dict[str, Any]) -> str:
    """Why a completed phase's record (its JSON body; the flags are in its ``data``) stops the
    migration, or ``""``: a blocking gate failed (``stop_migration``) or was inconclusive
    (``hold_migration``); the gates named."""
    data = record.get("data") or {}
    if not (data.get("stop_migration") or data.get("hold_migration")):
        return ""
    gates = [f"{g.get('name')} {g.get('verdict')}" for g in data.get("gates") or []
             if g.get("blocking") and g.get("verdict") not in ("PASS", "NOT_APPLICABLE")]
    kind = "a blocking gate failed" if data.get("stop_migration") else "a blocking gate was inconclusive"
    return kind + (f" ({', '.join(gates)})" if gates else "")


def run_phase(run: RunDir, phase: str, *, notebooks_dir: Path | None = None, approval_ref: str = "",
              cell_timeout_s: int | None = None, interrupts: Interrupts | None = None,
              scans: list[dict[str, Any]] | None = None, echo: Callable[[str], None] | None = None) -> PhaseOutcome:
    """The one way a phase runs headlessly (``runbook run`` and ``runbook phase`` alike): execute its
    notebook into the run, make the paths in it relative, scan the run for credentials (redacting
    what is found), check the phase wrote its record, and record a failure when it did not finish.

    Args:
        run: the run, opened or created (:class:`runbook_lib.evidence.rundir.RunDir`).
        notebooks_dir: ``--notebooks DIR``; None: the project's copy of the phase notebook if it has
            one, else the packaged one. Which ran is recorded in the outcome and the notebook.
        cell_timeout_s: per-cell limit, seconds (default ``run.cell_timeout_s`` from params).
        scans: the run's list of scan summaries; this phase's is appended.
        echo: told when the phase waits for the host lock (:mod:`runbook_lib.run.hostlock`): every phase
            holds it, phases 04 and 05 exclusively unless ``measure.exclusive`` is false.

    Returns:
        The outcome; ``failed`` / ``held`` / ``interrupted`` outcomes have a record with the
        notebook, cell and error written for them. Never raises for a phase that failed.
    """
    t0 = time.perf_counter()
    started = utc_now()
    source = phase_notebook(phase, project=run.project, given=notebooks_dir)
    shown = source.to_dict(run.project)
    exclusive = exclusive_for(phase, exclusive=run.mig.measure.exclusive, serves=run.mig.workload.serves)
    waited = 0.0
    try:
        with _host_lock(phase, exclusive, interrupts, echo, run=run.run_id) as held:
            waited = held.waited_s
            try:
                execute_phase(phase, run.params_path, run.path,
                              cell_timeout_s=cell_timeout_s or run.mig.run.cell_timeout_s, approval_ref=approval_ref,
                              interrupts=interrupts, cwd=run.project, source=source)
            finally:
                if interrupts is not None:
                    interrupts.phase_ended()
                nb_path = run.path / f"{phase_name(phase)}.ipynb"
                scrub_paths(nb_path, run.project, source)
                scan = scan_phase(run, phase)
                stamp_provenance(nb_path, host_lock={"mode": "exclusive" if held.exclusive else "shared",
                                                     "waited_s": waited}, secret_scan=scan)
                if scans is not None:
                    scans.append(scan)
        if scan["findings"]:
            raise PhaseFailed(leak_message(scan), phase=phase, notebook=str(run.path / f"{phase_name(phase)}.ipynb"),
                              ename="SecretLeak")
        rec = run.records().get(phase)
        nb_out = run.path / f"{phase_name(phase)}.ipynb"
        if rec is None:
            raise PhaseFailed(f"phase {phase} ran but wrote no record", phase=phase, notebook=str(nb_out))
        missing = missing_plots(phase, nb_out)
        if missing:
            expected = PHASE_PLOTS[phase]
            raise PhaseFailed(
                f"phase {phase} finished, but its executed notebook {nb_out.name} does not show "
                f"{', '.join(missing)} ({len(expected) - len(missing)} of the {len(expected)} expected plots shown: "
                f"{', '.join(plots_shown(nb_out)) or 'none'}); the evidence would be incomplete. The plot files are "
                f"{'in the run' if all((run.path / m).exists() for m in missing) else 'not all written'}; "
                f"check that the notebook ({shown['path']}) still displays the phase's result.",
                phase=phase, notebook=str(nb_out), ename="MissingPlot")
        typed = records.parse(rec)
        reseal_after_phase_06(run, phase)
        return PhaseOutcome.completed(phase, time.perf_counter() - t0, typed, notebook_source=shown, lock_wait_s=waited)
    except (PhaseFailed, EvidenceError, OSError) as caught:
        exc = caught
        if isinstance(caught, OSError):  # the runner's own writes after the notebook: the scrub, a redaction
            full = full_disk_error(caught)
            if full is None:
                raise
            exc = PhaseFailed(f"phase {phase} failed: {os_error_line(full)}", phase=phase,
                              notebook=str(run.path / f"{phase_name(phase)}.ipynb"), ename=NO_SPACE)
        out = PhaseOutcome(phase, "failed", time.perf_counter() - t0, str(exc), notebook_source=shown,
                           lock_wait_s=waited)
        return _record_failure(run, out, exc, started=started, interrupts=interrupts)


def _record_failure(run: RunDir, out: PhaseOutcome, exc: Exception, *, started: str,
                    interrupts: Interrupts | None) -> PhaseOutcome:
    """``out`` (a phase that did not complete, ``exc`` why) with its status told from the error
    (``interrupted``, ``held`` for a missing approval, else ``failed``), and its record written into
    the run: the notebook, cell and error. A record the disk or the chain refuses is named in the
    outcome's reason instead."""
    ename = getattr(exc, "ename", "")
    out.status = "interrupted" if ename == INTERRUPTED else "held" if ename == "ApprovalRequired" else "failed"
    out.stop, out.disk_full = out.status == "held", ename == NO_SPACE
    nb = getattr(exc, "notebook", "")
    files = [Path(nb).name] if nb and Path(nb).exists() else []
    data: dict[str, Any] = {"error": str(exc), "notebook": Path(nb).name if nb else None,
                            "cell_index": getattr(exc, "cell_index", -1), "ename": ename,
                            "notebook_source": out.notebook_source}
    if out.status == "interrupted" and interrupts is not None:
        data.update(signal=interrupts.name, signal_received_at=interrupts.received_at)
    try:
        run.write_record(out.phase, status=out.status, started=started, files=files, data=data)
    except EvidenceError as inner:
        out.reason += f" (could not write the {out.status} record: {inner})"
    except OSError as inner:  # the disk that cut the notebook off holds the record too
        out.reason += f" (could not write the {out.status} record: {os_error_line(inner)})"
    return out

def reseal_after_phase_06(run: RunDir, phase: str) -> None:
    """Seal the run again once phase 06's executed notebook is saved, scrubbed and scanned (for
    any other ``phase``, nothing).

    Phase 06 seals the run from its own kernel (:func:`runbook_lib.phases.decide.finish`), while
    papermill is still to save the cell that sealed it; its notebook as saved last is what the seal
    must list (a closed-world seal lists every file, :mod:`runbook_lib.evidence.closedworld`). The decision
    and completeness are the kernel's seal's. Nothing is done when phase 06 did not seal."""
    if phase != "06":
        return
    try:
        sealed = json.loads((run.path / MANIFEST).read_text())
    except (OSError, ValueError):
        return
    seal_run(run.path, run.mig, run.params_path, decision=str(sealed.get("decision")),
             complete=(run.path / COMPLETION_MARKER).exists(),
             extra={k: sealed[k] for k in ("secret_scans", "interrupted") if k in sealed})


def service_preflight(mig: Migration, project: Path) -> None:
    """A service's inputs, checked before anything runs: the sample inputs load, and each local
    side's stand-in command names only placeholders it can fill.

    Raises:
        ParamsError: the samples file is missing or malformed, or a stand-in cannot be formed.
    """
    assert mig.workload.service is not None
    params_path = project / "params" / "_.yaml"  # samples and {project} resolve against the project root
    inputs = samples.load_samples(mig.workload.service, params_path)
    live_source_fits(mig, len(inputs))
    for side in ("source", "target"):
        try:
            service_pods.command_for(mig, side, params_path)
        except ProviderError as exc:
            raise ParamsError(f"{exc}; nothing was run", field="workload.service.stand_in") from None


def live_source_fits(mig: Migration, n_samples: int) -> None:
    """A live source's paced phases, checked against ``run.cell_timeout_s`` before anything runs:
    phase 01 sends it its readiness check, two reads of what it is and every sample twice, one at
    a time; phase 04 its warm-up one at a time and each source round's requests no closer than the
    schedule's gap. At ``source.max_rate_per_s`` those take at least the seconds computed here
    (:data:`~runbook_lib.service.pacing.PACE_MARGIN`, :data:`~runbook_lib.service.pacing.SCHEDULE_MARGIN`
    gaps); a cell that cannot hold them would end the run on its timeout, blaming nothing.

    Raises:
        ParamsError: a phase's paced requests cannot fit one cell (the arithmetic and the fixes).
    """
    lp = mig.source if isinstance(mig.source, LiveProfile) else None
    if lp is None:
        return
    m, limit = mig.measure, mig.run.cell_timeout_s
    rounds = m.rounds + m.max_extra_rounds  # the fixed method: params refuse the sequential one for a live source
    need = {"01": ((3 + 2 * n_samples) * PACE_MARGIN / lp.max_rate_per_s,
                   f"{3 + 2 * n_samples} requests one at a time (readiness, two reads, {n_samples} samples twice)"),
            "04": ((m.warmup_requests + 1) * PACE_MARGIN / lp.max_rate_per_s
                   + (rounds // 2) * m.requests_per_round * SCHEDULE_MARGIN / lp.max_rate_per_s,
                   f"warm-up and up to {rounds // 2} source rounds of {m.requests_per_round} requests")}
    for phase, (least_s, what) in need.items():
        if least_s > limit:
            raise ParamsError(f"the live source is paced at source.max_rate_per_s = {lp.max_rate_per_s:g}/s, so phase "
                              f"{phase}'s {what} take at least {least_s:.0f} s, more than run.cell_timeout_s = {limit} "
                              "s allows one cell; raise run.cell_timeout_s or source.max_rate_per_s (if the service "
                              "can take it), or send fewer requests; nothing was run", field="source.max_rate_per_s",
                              value=lp.max_rate_per_s)


def router_preflight(mig: Migration) -> None:
    """Phase 05's router, checked on this machine before anything runs: the HAProxy the runbook
    would start (``cutover.router.binary``, when no ``socket`` names a running one) and each
    command of a command router (``set_command``, ``read_command``, ``drain_command``) can be
    executed here, so a missing one stops the run at once instead of after phases 01-04.

    Raises:
        ParamsError: an executable is not found (named, with where it was looked for).
    """
    r = mig.cutover.router
    need: list[tuple[str, str]] = []
    if r.kind == "haproxy" and not r.socket:
        need.append(("cutover.router.binary", r.binary))
    if r.kind == "command":
        need += [(f"cutover.router.{name}", argv[0]) for name, argv in
                 (("set_command", r.set_command), ("read_command", r.read_command), ("drain_command", r.drain_command))
                 if argv]
    for name, exe in need:
        if executable(exe) is None:
            fix = ("install Debian's haproxy package (`make haproxy` as root) or name the binary there"
                   if name.endswith("binary") else "give a path or a command on PATH")
            raise ParamsError(f"{name}: no executable {exe!r} on this machine (looked on PATH and in /usr/sbin, "
                              f"/usr/local/sbin); phase 05 would fail after phases 01-04 ran: {fix}; nothing was run",
                              field=name, value=exe)


def preflight(mig: Migration, project: Path, notebooks_dir: Path | None = None) -> list[NotebookSource]:
    """Checks that need no resources, before a run directory exists.

    Returns:
        The notebook each phase will run (project copy, ``notebooks_dir``, or packaged).

    Raises:
        UsageError: ``notebooks_dir`` lacks a phase notebook, or one is not a readable notebook.
        ParamsError: ``workload.entry_point`` cannot be imported (the project directory is put on
            the import path first, :func:`runbook_lib.workload.put_project_on_path`), is not a
            class for its kind, or a serving workload's golden request is not a JSON value.
        AuthError: ``evidence.signing_key`` is set and names no readable ed25519 private key (the
            run would otherwise end sealed but unsigned).
        ParamsError: also, an executable phase 05's router needs is missing (:func:`router_preflight`).
    """
    if mig.evidence.signing_key:
        load_signer(mig.evidence.signing_key)
    router_preflight(mig)
    if mig.workload.kind == "service":
        service_preflight(mig, project)
        return phase_notebooks(project=project, given=notebooks_dir)
    put_project_on_path(project)
    try:
        require_processes(workload_class(mig.workload), source=mig.source, target=mig.target,
                          **{a.name: a for a in (*mig.alternates, *mig.targets[1:])})
        problems = request_payload_problems(mig.workload, mig.source)
    except WorkloadError as exc:
        raise ParamsError(f"workload.entry_point: {exc}; nothing was run", field="workload.entry_point",
                          value=mig.workload.entry_point) from None
    if problems:
        raise ParamsError(f"workload.entry_point {mig.workload.entry_point!r}: {'; '.join(problems)}; nothing was run",
                          field="workload.entry_point", value=mig.workload.entry_point)
    return phase_notebooks(project=project, given=notebooks_dir)


def run_migration(params_path: str | Path, *, reports_dir: str | Path = REPORTS_DIR, approval_ref: str = "",
                  notebooks_dir: str | Path | None = None, echo: Callable[[str], None] | None = None,
                  run_path: Path | None = None,
                  after_phase: Callable[[PhaseOutcome], None] | None = None) -> RunResult:
    """Run all six phases of a migration headlessly.

    Args:
        params_path: migration YAML (validated before anything runs).
        reports_dir: where ``<run_id>/`` is created.
        run_path: the run directory itself, instead of a new one under ``reports_dir`` (a
            worker's copy of a stored run, :mod:`runbook_lib.run.runstore`).
        after_phase: called with each phase's outcome once the phase has ended and written its
            record (a stored run pushes there); skipped phases are not passed.
        approval_ref: approval file for plans on non-preapproved providers.
        notebooks_dir: phase notebooks (default, per phase: the project's ``notebooks/`` copy if
            it has one, else the packaged notebook).
        echo: progress line sink (default: a tqdm bar's ``write``).

    Returns:
        The :class:`RunResult`; its exit code is 0 GO, 1 NO-GO, 3 HOLD, 4 failed run, 130 / 143
        interrupted by SIGINT / SIGTERM (the current phase stopped, the run's resources torn down
        by :func:`runbook_lib.run.cleanup.cleanup_run`, the run sealed as ``INTERRUPTED``). When
        phase 06 itself failed (its kernel did not start, a cell raised), its teardown may not
        have run: :func:`~runbook_lib.run.cleanup.cleanup_run` follows, and the manifest keeps
        what it destroyed as ``teardown_after_phase_06``.

    Raises:
        ParamsError: the params file is invalid (nothing ran, no run directory is created).
    """
    from tqdm import tqdm

    params = Path(params_path).resolve()
    mig = load_params(params)
    root = project_root(params)
    nb_dir = Path(notebooks_dir).resolve() if notebooks_dir else None
    sources = preflight(mig, root, nb_dir)
    run = RunDir.create(params, reports_dir=reports_dir, path=run_path)
    run_dir = run.path
    outcomes: list[PhaseOutcome] = []
    scans: list[dict[str, Any]] = []
    failed = stopped = dry = False
    bar = tqdm(total=len(PHASES), desc=mig.migration, unit="phase", file=sys.stderr, leave=False,
               disable=not sys.stderr.isatty())
    say = escaped(echo or bar.write)
    say(f"run {run_dir.name}: {mig.source.release}  ->  {mig.target.release}")
    say(f"notebooks: {notebooks_line(sources)}")
    with Interrupts() as intr:
        for pid, name in PHASES:
            full = any(o.disk_full for o in outcomes)
            if intr.signum or full or (pid != "06" and (failed or stopped or (dry and pid in ("04", "05")))):
                reason = (f"interrupted by {intr.name}" if intr.signum else
                          "the disk is full: no phase can write its evidence" if full else
                          "earlier phase failed" if failed else
                          "stopped: a blocking gate failed or was inconclusive, or an approval is missing"
                          if stopped else "dry-run: phases 01-03 only planned; 04-05 need what those plans would create")
                outcomes.append(PhaseOutcome(pid, "skipped", 0.0, reason))
                say(f"  {pid} {name:<20} skipped ({reason})")
                bar.update(1)
                continue
            out = run_phase(run, pid, notebooks_dir=nb_dir, approval_ref=approval_ref, interrupts=intr, scans=scans,
                            echo=_prefixed(say, f"  {pid} "))
            outcomes.append(out)
            if after_phase is not None:
                after_phase(out)
            failed = failed or out.status == "failed"
            stopped = stopped or out.stop
            dry = dry or out.dry_run
            _say_outcome(say, pid, name, out)
            bar.update(1)
        bar.close()
        if intr.signum:
            return stop_interrupted(intr, run, outcomes, scans, say)
    if any(o.disk_full for o in outcomes):
        return stop_full_disk(run, outcomes, scans, say)
    return _sealed(run, outcomes, scans, say, failed=failed)


def _sealed(run: RunDir, outcomes: list[PhaseOutcome], scans: list[dict[str, Any]], say: Callable[[str], None], *,
            failed: bool) -> RunResult:
    """The end of a run whose six phases ran or were skipped: the teardown phase 06 did not do when
    it failed, the decision from the receipt (``FAILED`` without one or after a failed phase), and
    the seal."""
    extra: dict[str, Any] = {"secret_scans": scans}
    if outcomes[-1].status == "failed":
        extra["teardown_after_phase_06"] = teardown_after_failed_phase_06(run, say)
    receipt = records.load_receipt(run.path)
    reasons: list[str] = [o.reason for o in outcomes if o.status in ("failed", "held")]
    if receipt is not None:
        reasons = receipt.reasons + [r for r in reasons if not any(r in x for x in receipt.reasons)]
    exit_code = EXIT_FAILED if failed or receipt is None else EXIT_BY_DECISION[receipt.decision]
    decision = sealed_decision(receipt.decision if receipt else None, failed=failed or receipt is None)
    seal_run(run.path, run.mig, run.params_path, decision=decision, phases=[o.__dict__ for o in outcomes],
             complete=not failed, extra=extra)
    return RunResult(run.path, decision, exit_code, outcomes, reasons)


def _say_outcome(say: Callable[[str], None], pid: str, name: str, out: PhaseOutcome) -> None:
    """The line ``runbook run`` prints for a phase that ran: its time without any wait for the
    host lock (the wait said after it), its gates' verdicts and its note; or how it ended."""
    if out.status != "completed":
        say(f"  {pid} {name:<20} {out.status.upper()} after {out.seconds:.1f} s: {out.reason}")
        return
    say(f"  {pid} {name:<20} completed in {out.seconds - out.lock_wait_s:5.1f} s  gates: "
        + (", ".join(f"{v} x{out.verdicts.count(v)}" for v in sorted(set(out.verdicts))) or "none")
        + (f"  (after waiting {out.lock_wait_s:.1f} s for another run on this host)" if out.lock_wait_s >= 0.5 else ""))
    if out.note:
        say(f"  {pid} {out.note}")


def stop_full_disk(run: RunDir, outcomes: list[PhaseOutcome], scans: list[dict[str, Any]],
                   say: Callable[[str], None], *, phases_from_records: bool = False) -> RunResult:
    """After a phase failed for want of disk (``runbook run`` and ``runbook phase`` alike): remove
    the notebooks the disk cut off, tear down what the run created by its label (on Runpod or
    Vast.ai a stopped machine still bills its disk), and seal the run ``FAILED`` if the disk now
    allows it. Each step that cannot write says so and goes on: a full disk never leaves a
    resource running for want of a record.

    Returns:
        The run's result: decision ``FAILED``, exit 4, the full disk's line (path, free space) first.
    """
    line = next(o.reason for o in outcomes if o.disk_full)
    removed = remove_partial(run.path)
    if removed:
        say(f"removed {', '.join(removed)}: cut off by the full disk, not evidence")
    say("tearing down what this run created (its launch approvals cover it)")
    teardown = _tear_down(run, say, again="once there is space")
    try:
        seal_run(run.path, run.mig, run.params_path, decision="FAILED",
                 phases=None if phases_from_records else [o.__dict__ for o in outcomes], complete=False,
                 extra={"secret_scans": scans, "disk_full": {"reason": line, "removed": removed, "teardown": teardown}})
    except OSError as exc:
        say(f"the run is not sealed: {os_error_line(exc)}")
    return RunResult(run.path, "FAILED", EXIT_FAILED, outcomes, [line])


def notebooks_line(sources: list[NotebookSource]) -> str:
    """One line saying which notebooks run the phases, e.g. ``packaged (all six)`` or
    ``project notebooks/: 01 02 03 05 06 (same cells as packaged), 04 (edited)``."""
    if all(s.origin == "packaged" for s in sources):
        return "packaged (all six)"
    parts = []
    for origin in ("project", "given"):
        mine = [s for s in sources if s.origin == origin]
        if mine:
            same = [s.phase for s in mine if s.same_as_packaged]
            edited = [s.phase for s in mine if not s.same_as_packaged]
            where = f"project {mine[0].path.parent.name}/" if origin == "project" else f"--notebooks {mine[0].path.parent}"
            parts.append(f"{where}: " + ", ".join(x for x in (" ".join(same) + " (same cells as packaged)" if same else "",
                                                              " ".join(edited) + " (edited)" if edited else "") if x))
    rest = [s.phase for s in sources if s.origin == "packaged"]
    return "; ".join(parts) + (f"; packaged: {' '.join(rest)}" if rest else "")


def stop_interrupted(intr: Interrupts, run: RunDir, outcomes: list[PhaseOutcome], scans: list[dict[str, Any]],
                     say: Callable[[str], None], *, phases_from_records: bool = False) -> RunResult:
    """After SIGINT/SIGTERM/SIGHUP (``runbook run`` and ``runbook phase`` alike): tear down what the
    run created (unless a second signal said not to, or arrives meanwhile), say what was destroyed
    and what is left, and seal the run as ``INTERRUPTED`` without a completion marker.

    Args:
        intr: the handler that saw the signal (its ``signum`` is set).
        outcomes: the phases this process ran (or skipped), in order.
        phases_from_records: the manifest lists the phases from the run's records (``runbook
            phase``, whose earlier phases ran in other processes) instead of ``outcomes``.

    Returns:
        The run's result, exit code 128 + the signal number.
    """
    run_dir = run.path
    finish = f"runbook cleanup {_shown(run_dir)}"
    teardown: dict[str, Any] = {"skipped": True, "finish_with": finish}
    intr.wait_kernels_gone()
    if intr.skip_teardown:
        say(f"teardown skipped (second {intr.name}); what this run created may still bill: run `{finish}`")
    else:
        say("tearing down what this run created (its launch approvals cover it; Ctrl-C again to stop)")
        intr.tearing_down = True
        try:
            teardown = _tear_down(run, say, again="to try again")
        finally:
            intr.tearing_down = False
    code = exit_code(intr.signum or 2)
    decision = "INTERRUPTED"
    seal_run(run_dir, run.mig, run.params_path, decision=decision,
             phases=None if phases_from_records else [o.__dict__ for o in outcomes], complete=False,
             extra={"secret_scans": scans, "interrupted": {"signal": intr.name, "received_at": intr.received_at,
                                                           "signals_received": intr.count, "exit_code": code,
                                                           "kernel_killed": intr.kernel_killed,
                                                           "teardown": teardown}})
    reasons = [f"interrupted by {intr.name} at {intr.received_at}"] + [o.reason for o in outcomes
                                                                      if o.status == "interrupted"]
    return RunResult(run_dir, decision, code, outcomes, reasons)


def teardown_after_failed_phase_06(run: RunDir, say: Callable[[str], None]) -> dict[str, Any]:
    """After phase 06 failed (``runbook run`` and ``runbook phase 06`` alike): phase 06 is the
    teardown, and what it did not destroy still bills, so destroy what the run created, found by
    its label, as ``runbook cleanup`` would. Returns the teardown's record
    (:meth:`runbook_lib.run.cleanup.CleanupResult.to_dict`)."""
    say("phase 06 failed: tearing down what this run created (its launch approvals cover it)")
    return _tear_down(run, say, again="once phase 06's failure is fixed")


def _tear_down(run: RunDir, say: Callable[[str], None], *, again: str) -> dict[str, Any]:
    """Destroy what the run created, found by its label (:func:`runbook_lib.run.cleanup.cleanup_run`),
    saying what was destroyed and what is left (and when to run ``runbook cleanup``: ``again``);
    returns the teardown's record (``aborted`` when a second signal stopped it)."""
    finish = f"runbook cleanup {_shown(run.path)}"
    try:
        res = cleanup_run(run.path, mig=run.mig, project=run.project, echo=say)
    except CleanupAborted as exc:
        say(f"teardown stopped ({exc}); finish it with `{finish}`")
        return {"aborted": True, "why": str(exc), "finish_with": finish}
    say(f"teardown: {summary(res)}")
    if not res.clean:
        say(f"not everything is gone: run `{finish}` {again}")
    return res.to_dict()


def _shown(run_dir: Path) -> str:
    """The run directory as a person would type it (relative to the working directory if inside)."""
    try:
        return str(run_dir.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(run_dir)


def environment_ok() -> None:
    """Fail early with a clear message when the notebook kernel cannot be found."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    except NoSuchKernel:
        raise PhaseFailed(f"Jupyter kernel {KERNEL_NAME!r} is not installed for {sys.executable}; "
                          "install ipykernel into this environment (make demo does)", phase="00", notebook="") from None
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")


def sequential_line(data: records.PhaseData) -> str:
    """For phase 04's record data judged sequentially, how many rounds it needed: ``sequential
    gates: decided at pair 3 of 8 (3 rounds a side)`` or ``... undecided after 8 pair(s) of 8 ...``;
    a race's: ``race: 5 pair(s) of 8; a picked, b eliminated at pair 4, ...``; empty for any other
    record, or under the fixed method."""
    seq = data.sequential if isinstance(data, records.CompareData) else None
    if seq is None:
        return ""
    race = data.race if isinstance(data, records.CompareData) else None
    if race is not None and race.entries:
        fates = ", ".join(f"{e.name} {e.fate}" + (f" at pair {e.exit_pair}" if e.exit_pair else "") for e in race.entries)
        return f"race: {seq.pairs_measured} pair(s) of {seq.max_rounds}; {fates}"
    if seq.stopped_at_pair is not None:
        return f"sequential gates: decided at pair {seq.stopped_at_pair} of {seq.max_rounds} ({seq.stopped_at_pair} rounds a side)"
    return (f"sequential gates: undecided after {seq.pairs_measured} pair(s) of {seq.max_rounds} "
            f"({seq.pairs_measured} rounds a side)")
