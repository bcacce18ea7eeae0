"""The runbook's DAGs for one project, configured by name from the worker's environment.

Copy (or link) this file into Airflow's DAGs folder on every worker, with the project checked out
and ``make`` run there (the ``runbook`` command its tasks call), and set:

* ``RUNBOOK_PROJECT``: the project's directory (default: this file's project, two levels up from
  ``integrations/``);
* ``RUNBOOK_STORE``: ``s3://BUCKET/PREFIX`` where runs are kept (the store's credentials and
  endpoint come from the workers' ``AWS_*`` variables, never from here);
* ``RUNBOOK_FLEET``: the folder of params files the fleet DAG maps over (default ``params/fleet``),
  and ``RUNBOOK_FLEET_LIMIT`` its migrations in flight (default 2);
* ``RUNBOOK_QUEUE``: a Celery queue every task is pinned to (needed when a migration runs on the
  local provider; docs/how-to/airflow.md);
* ``RUNBOOK_EXECUTABLE``: the ``runbook`` command (default ``<project>/.venv/bin/runbook``).

It defines ``runbook_fleet`` and one ``runbook_<params stem>`` DAG per params file in the folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from runbook_airflow import Runbook, fleet_dag, migration_dag

_project = os.environ.get("RUNBOOK_PROJECT") or str(Path(__file__).resolve().parents[3])
_fleet = os.environ.get("RUNBOOK_FLEET", "params/fleet")
_queue = os.environ.get("RUNBOOK_QUEUE") or None
_store = os.environ.get("RUNBOOK_STORE", "")

if _store:
    runbook = Runbook(_project, _store, os.environ.get("RUNBOOK_EXECUTABLE", ""))
    fleet = fleet_dag(_fleet, runbook, limit=int(os.environ.get("RUNBOOK_FLEET_LIMIT", "2")), queue=_queue,
                      poke_interval_s=float(os.environ.get("RUNBOOK_SLOT_POKE_S", "30")))
    for _params in sorted((Path(_project) / _fleet).glob("*.yaml")):
        _dag = migration_dag(_params.relative_to(_project).as_posix(), runbook, queue=_queue)
        globals()[_dag.dag_id] = _dag
