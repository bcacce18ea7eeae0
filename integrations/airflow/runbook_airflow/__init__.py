"""Airflow as a fleet's engine for the runbook: a DAG per migration, a fleet DAG over a folder.

Every task calls the project's own ``runbook`` command on its worker (never a notebook path), so
the notebooks' provenance, the secret scans, the host lock and the seal stay the runbook's. The
run lives in object storage (``runbook phase NN PARAMS s3://BUCKET/PREFIX/<run_id>``,
docs/how-to/orchestrator.md), so each task may run on another worker; a migration on the local
provider runs every task on one worker (``queue=``).

A migration's tasks, in order:

* ``phase_01`` .. ``phase_05``: ``runbook phase NN``. A phase held for an approval (exit 3) asks
  in Airflow (a human-in-the-loop request: Approve or Reject, the plans in its body); on Approve,
  ``runbook approve --by <who responded>`` writes the approval file and the phase runs again
  under it, so the run records who approved and when, as an approval file always does. A Reject
  fails the task; the decision task then records the migration NO-GO in the run
  (``runbook resolve``), naming who rejected. A phase after one whose blocking gate failed or was
  inconclusive (``runbook phase`` says it "stopped the migration") is skipped.
* ``phase_06``: runs whatever happened before it (``trigger_rule="all_done"``): it tears down what
  the run created and seals it.
* ``decision``: ``runbook status --json``. GO succeeds; NO-GO, FAILED and INTERRUPTED fail the
  task, and so the DAG run, with the receipt's reasons; a HOLD asks in Airflow for GO or NO-GO
  until the run's hold deadline and records the answer with ``runbook resolve``; no answer by
  the deadline records NO-GO and fails.

The fleet DAG maps that chain over a folder of params files (dynamic task mapping of a task
group). Airflow's own limits count task instances, not chains, so the fleet's limit on
migrations in flight is a set of slots kept beside the runs (``runbook slot take|give``): a
sensor takes one before phase 01, and a teardown task gives it back after the decision.

Airflow's human-in-the-loop operators (``apache-airflow-providers-standard``, Airflow 3.1+):
https://airflow.apache.org/docs/apache-airflow-providers-standard/stable/operators/hitl.html
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.exceptions import AirflowFailException, AirflowSkipException
from airflow.providers.standard.operators.hitl import HITLOperator
from airflow.sdk import DAG, BaseSensorOperator, task, task_group

PHASES = ("01", "02", "03", "04", "05", "06")
HELD, USAGE = 3, 2  # `runbook phase` exits 3 when held for an approval, 2 on a refusal (docs/reference/exit-codes.md)
APPROVE, REJECT = "Approve", "Reject"
STOPPED = "stopped the migration"  # `runbook phase` prints it for a completed phase that stops the migration
GO, NO_GO = "GO", "NO-GO"
_NOT_ID = re.compile(r"[^A-Za-z0-9._-]+")
_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class Runbook:
    """How a task reaches the runbook on its worker.

    Attributes:
        project: the runbook project's directory on every worker (params paths are relative to it).
        store: ``s3://BUCKET/PREFIX`` where the runs live; the store's identity and endpoint come
            from the worker's environment by name (``AWS_*``, ``AWS_ENDPOINT_URL_S3``), never from here.
        executable: the ``runbook`` command (default: ``<project>/.venv/bin/runbook``).
    """

    project: str
    store: str
    executable: str = ""

    def location(self, params_file: str, dag_run_id: str) -> str:
        """The run's location: ``<store>/<params stem>--<Airflow's run id, made a run id>``, the
        same for every task (and retry) of one DAG run."""
        stem = Path(params_file).stem
        run_id = _NOT_ID.sub("-", f"{stem}--{dag_run_id}").strip("-.")[:200]
        return f"{self.store.rstrip('/')}/{run_id}"

    def call(self, *args: str, log: Any) -> subprocess.CompletedProcess[str]:
        """Run ``runbook ARGS`` in the project, each line of its output written to the task's log."""
        exe = self.executable or str(Path(self.project) / ".venv" / "bin" / "runbook")
        proc = subprocess.run([exe, *args], cwd=self.project, capture_output=True, text=True, env=dict(os.environ),
                              check=False)
        for line in (proc.stdout + proc.stderr).splitlines():
            log.info("%s", line)
        return proc

    def status(self, location: str, log: Any) -> dict[str, Any]:
        """``runbook status LOCATION --json`` (its fields: ``runbook_lib.cli.run_status``).

        Raises:
            AirflowFailException: the run cannot be read (the command's last line said why).
        """
        proc = self.call("status", location, "--json", log=log)
        if proc.returncode != 0:
            raise AirflowFailException(f"runbook status {location}: exit {proc.returncode}: {_last(proc)}")
        return dict(json.loads(proc.stdout[proc.stdout.index("{"):]))


def _last(proc: subprocess.CompletedProcess[str]) -> str:
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return lines[-1] if lines else "(no output)"


def _responder(event: dict[str, Any]) -> str:
    """Who answered a human-in-the-loop request, as Airflow's trigger reports it."""
    who = event.get("responded_by_user") or event.get("responded_by") or {}
    if isinstance(who, dict):
        return str(who.get("name") or who.get("id") or "an Airflow user")
    return str(who or "an Airflow user")


def _plans_body(status: dict[str, Any], phase: str, location: str) -> str:
    rows = "\n".join(f"| {p['action']} | {p['target']} | {p['provider']} | `{p['fingerprint'][:16]}` |"
                     for p in status["plans_waiting"])
    return (f"Phase {phase} of `{location}` holds until its plans are approved. Approve runs the phase under "
            "an approval file naming you; Reject ends the migration NO-GO (phase 06 tears down what exists).\n\n"
            f"| action | target | provider | plan |\n|---|---|---|---|\n{rows}\n")


class RunbookPhaseOperator(HITLOperator):
    """One phase of one migration: ``runbook phase NN PARAMS LOCATION``; a held phase asks for
    approval in Airflow and runs again under it (module docstring).

    Args:
        phase: ``"01"`` .. ``"06"``. params_file: the migration's params, relative to the project
            (templated: a mapped task group passes it). runbook: :class:`Runbook`.
    """

    template_fields: Sequence[str] = ("params_file", "subject", "body")

    def __init__(self, *, phase: str, params_file: str, runbook: Runbook, **kwargs: Any) -> None:
        if phase not in PHASES:
            raise ValueError(f"phase {phase!r}: one of {', '.join(PHASES)}")
        kwargs.setdefault("task_id", f"phase_{phase}")
        super().__init__(subject=f"Approve the plans of phase {phase}", options=[APPROVE, REJECT], **kwargs)
        self.phase, self.params_file, self.runbook = phase, params_file, runbook

    def _location(self, context: Any) -> str:
        return self.runbook.location(self.params_file, context["run_id"])

    def _ended(self, context: Any, proc: subprocess.CompletedProcess[str], loc: str, who: str | None) -> Any:
        """A completed phase's result; one that stopped the migration says so to the next phase task."""
        if STOPPED in proc.stdout:
            context["ti"].xcom_push(key="stopped", value=self.phase)
        return {"phase": self.phase, "location": loc, "approved_by": who}

    def execute(self, context: Any) -> Any:
        loc = self._location(context)
        if self.phase != "06":
            ti = context["ti"]
            stopped = [s for s in (ti.xcom_pull(task_ids=t, key="stopped", map_indexes=ti.map_index)
                                   for t in sorted(self.upstream_task_ids)) if s]
            if stopped:
                raise AirflowSkipException(f"phase {stopped[0]} stopped the migration (a blocking gate failed or was "
                                           "inconclusive); phase 06 tears down and decides")
        proc = self.runbook.call("phase", self.phase, self.params_file, loc, log=self.log)
        if proc.returncode == 0:
            return self._ended(context, proc, loc, None)
        if proc.returncode != HELD or self.phase == "06":
            raise AirflowFailException(f"phase {self.phase} of {loc}: exit {proc.returncode}: {_last(proc)}")
        status = self.runbook.status(loc, self.log)
        if not status["plans_waiting"]:
            raise AirflowFailException(f"phase {self.phase} of {loc} held with no plan waiting: {_last(proc)}")
        self.subject = (f"Approve {len(status['plans_waiting'])} plan(s) of phase {self.phase}: "
                        f"{Path(self.params_file).stem}")
        self.body = _plans_body(status, self.phase, loc)
        return super().execute(context)  # defers until someone answers in Airflow

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        answer = super().execute_complete(context=context, event=event)
        who, loc = _responder(event), self._location(context)
        if answer["chosen_options"] != [APPROVE]:
            context["ti"].xcom_push(key="rejected", value={"phase": self.phase, "by": who})
            raise AirflowFailException(f"phase {self.phase}'s plans were rejected by {who} in Airflow: the migration "
                                       "is NO-GO (phase 06 tears down; the decision task records it)")
        # kept on the worker beside the run's local copy: the run's records name this file
        approval = Path(self.runbook.project) / ".runbook" / "airflow-approvals" / loc.rsplit("/", 1)[1] / \
            f"phase-{self.phase}-try-{context['ti'].try_number}.json"
        approval.parent.mkdir(parents=True, exist_ok=True)
        proc = self.runbook.call("approve", loc, "--by", f"{who} (Airflow)", "-o", str(approval), log=self.log)
        if proc.returncode != 0:
            raise AirflowFailException(f"runbook approve {loc}: exit {proc.returncode}: {_last(proc)}")
        proc = self.runbook.call("phase", self.phase, self.params_file, loc, "--approval-file", str(approval),
                                 log=self.log)
        if proc.returncode != 0:
            raise AirflowFailException(f"phase {self.phase} of {loc} after {who}'s approval: exit "
                                       f"{proc.returncode}: {_last(proc)}")
        return self._ended(context, proc, loc, who)


class RunbookDecisionOperator(HITLOperator):
    """The migration's decision as task states: GO succeeds; NO-GO, FAILED and INTERRUPTED fail with
    the receipt's reasons; a HOLD asks in Airflow for GO or NO-GO until its deadline.

    Args:
        params_file, runbook: as :class:`RunbookPhaseOperator`. phase_task_ids: the phase tasks
            whose rejection (an XCom ``rejected``) makes a held run NO-GO.
    """

    template_fields: Sequence[str] = ("params_file", "subject", "body")

    def __init__(self, *, params_file: str, runbook: Runbook, phase_task_ids: Sequence[str], **kwargs: Any) -> None:
        kwargs.setdefault("task_id", "decision")
        kwargs.setdefault("trigger_rule", "all_done")
        super().__init__(subject="Decide a held migration", options=[GO, NO_GO], **kwargs)
        self.params_file, self.runbook, self.phase_task_ids = params_file, runbook, list(phase_task_ids)

    def _location(self, context: Any) -> str:
        return self.runbook.location(self.params_file, context["run_id"])

    def _resolve(self, loc: str, *args: str) -> dict[str, Any]:
        proc = self.runbook.call("resolve", loc, *args, log=self.log)
        if proc.returncode not in (0, 1):
            raise AirflowFailException(f"runbook resolve {loc}: exit {proc.returncode}: {_last(proc)}")
        return self.runbook.status(loc, self.log)

    def _judged(self, status: dict[str, Any]) -> dict[str, Any]:
        decision, reasons = status["decision"], "; ".join(status["reasons"]) or "no reason recorded"
        if decision == GO:
            self.log.info("%s: GO", status["run_id"])
            return status
        if decision in ("IN PROGRESS", "WAITING FOR APPROVAL"):
            raise AirflowFailException(f"{status['run_id']} is not sealed ({decision}): phase 06 did not complete")
        raise AirflowFailException(f"{status['run_id']}: {decision}: {reasons}")

    def execute(self, context: Any) -> Any:
        loc = self._location(context)
        status = self.runbook.status(loc, self.log)
        if status["decision"] != "HOLD":
            return self._judged(status)
        ti = context["ti"]
        rejected = [r for r in (ti.xcom_pull(task_ids=t, key="rejected", map_indexes=ti.map_index)
                                for t in self.phase_task_ids) if r]
        if rejected:
            r = rejected[0]
            return self._judged(self._resolve(loc, "--decision", NO_GO, "--by", f"{r['by']} (Airflow)", "--reason",
                                              f"phase {r['phase']}'s plans were rejected in Airflow"))
        deadline = datetime.fromisoformat(str(status["hold_deadline"]))
        left = deadline - datetime.now(UTC)
        if left <= timedelta(0):
            return self._judged(self._resolve(loc))  # past its deadline: NO-GO, recorded
        self.response_timeout = left + timedelta(seconds=1)
        self.subject = f"HOLD: decide {Path(self.params_file).stem} by {deadline.isoformat()}"
        self.body = (f"`{loc}` ended HOLD. GO or NO-GO is recorded in the run with your name "
                     "(`runbook resolve`); no answer by the deadline records NO-GO.\n\n"
                     + "\n".join(f"- {r}" for r in status["reasons"]))
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        loc = self._location(context)
        if "error" in event:  # no answer by the hold deadline
            return self._judged(self._resolve(loc))
        answer = super().execute_complete(context=context, event=event)
        return self._judged(self._resolve(loc, "--decision", answer["chosen_options"][0], "--by",
                                          f"{_responder(event)} (Airflow)", "--reason", "decided in Airflow"))


class RunbookSlotSensor(BaseSensorOperator):
    """Waits for one of the fleet's slots for migrations in flight (``runbook slot take``)."""

    template_fields: Sequence[str] = ("params_file",)

    def __init__(self, *, params_file: str, runbook: Runbook, limit: int, **kwargs: Any) -> None:
        kwargs.setdefault("task_id", "slot")
        super().__init__(**kwargs)
        self.params_file, self.runbook, self.limit = params_file, runbook, limit

    def poke(self, context: Any) -> bool:
        loc = self.runbook.location(self.params_file, context["run_id"])
        proc = self.runbook.call("slot", "take", loc, "--limit", str(self.limit), log=self.log)
        if proc.returncode not in (0, HELD):
            raise AirflowFailException(f"runbook slot take {loc}: exit {proc.returncode}: {_last(proc)}")
        return proc.returncode == 0


def migration_tasks(params_file: Any, runbook: Runbook, *, slot_limit: int = 0, queue: str | None = None,
                    poke_interval_s: float = 30.0) -> None:
    """Create one migration's tasks in the DAG or task group being defined (module docstring):
    with ``slot_limit``, a slot sensor first and a teardown that gives the slot back last.

    Args:
        params_file: the params path relative to the project (or a mapped task group's argument).
        queue: the Celery queue of every task (a local-provider migration is pinned to one worker).
    """
    opts: dict[str, Any] = {"queue": queue} if queue else {}
    phases = [RunbookPhaseOperator(phase=p, params_file=params_file, runbook=runbook, **opts) for p in PHASES[:5]]
    teardown = RunbookPhaseOperator(phase="06", params_file=params_file, runbook=runbook, trigger_rule="all_done",
                                    **opts)
    decision = RunbookDecisionOperator(params_file=params_file, runbook=runbook,
                                       phase_task_ids=[t.task_id for t in phases], **opts)
    for a, b in zip(phases, [*phases[1:], teardown], strict=True):
        a >> b
    teardown >> decision
    if slot_limit:
        slot = RunbookSlotSensor(params_file=params_file, runbook=runbook, limit=slot_limit, mode="reschedule",
                                 poke_interval=poke_interval_s, **opts)

        @task(task_id="give_slot", **opts)
        def give_slot(params_file: str, **context: Any) -> None:
            loc = runbook.location(params_file, context["run_id"])
            proc = runbook.call("slot", "give", loc, "--limit", str(slot_limit), log=_LOG)
            if proc.returncode != 0:
                raise AirflowFailException(f"runbook slot give {loc}: exit {proc.returncode}: {_last(proc)}")

        # a teardown: it runs once the decision is done, whatever it was, and the DAG run's state
        # stays the decision's (Airflow leaves teardown tasks out of it)
        give = give_slot(params_file).as_teardown(setups=slot)
        slot >> phases[0]
        decision >> give


def migration_dag(params_file: str, runbook: Runbook, *, dag_id: str = "", queue: str | None = None) -> DAG:
    """A DAG that runs one migration, one task per phase, then its decision (module docstring).

    Args:
        params_file: the params path relative to ``runbook.project``. dag_id: default
            ``runbook_<params stem>``. queue: pin every task to one Celery queue (a migration on
            the local provider must run on one worker: docs/how-to/orchestrator.md).
    """
    stem = _NOT_ID.sub("_", Path(params_file).stem)
    with DAG(dag_id or f"runbook_{stem}", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC), catchup=False,
             tags=["runbook"], doc_md=f"Migration `{params_file}`: six phases, then the decision.") as dag:
        migration_tasks(params_file, runbook, queue=queue)
    return dag


def fleet_dag(params_dir: str, runbook: Runbook, *, limit: int = 2, dag_id: str = "runbook_fleet",
              queue: str | None = None, poke_interval_s: float = 30.0) -> DAG:
    """A DAG that runs a migration for every ``*.yaml`` in ``params_dir`` (relative to the project),
    at most ``limit`` of them in flight at once; the DAG run fails when any migration is not GO.

    Args:
        limit: migrations between taking a slot and giving it back (``runbook slot``).
        poke_interval_s: how often a migration waiting for a slot asks again.
    """
    with DAG(dag_id, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC), catchup=False, max_active_runs=1,
             tags=["runbook"], doc_md=f"Every migration in `{params_dir}`, at most {limit} in flight.") as dag:

        @task(**({"queue": queue} if queue else {}))
        def params_files() -> list[str]:
            files = sorted(p.relative_to(runbook.project).as_posix()
                           for p in (Path(runbook.project) / params_dir).glob("*.yaml"))
            if not files:
                raise AirflowFailException(f"no *.yaml params file in {Path(runbook.project) / params_dir}")
            return files

        @task_group(group_id="migration")
        def migration(params_file: str) -> None:
            migration_tasks(params_file, runbook, slot_limit=limit, queue=queue, poke_interval_s=poke_interval_s)

        migration.expand(params_file=params_files())
    return dag
