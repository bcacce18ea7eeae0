"""``make demo-fleet``: the fleet DAG over ``params/fleet`` (three local checkpoint migrations, at
most two in flight) run by Airflow's own in-process runner (``dag.test()``), the runs kept in a
loopback S3 bucket (moto's server from the project's environment).

One migration pre-approves nothing: each phase that rents or moves something asks in Airflow, and
the release manager approves it through Airflow's REST API (:mod:`runbook_airflow.demo`), as the
"Required Actions" page does. Another must end NO-GO, failing the DAG run. The script prints each
migration's decision and the DAG run's state, and verifies every stored run with ``runbook verify``.

Run with .venv-airflow's Python (``make demo-fleet``). Options:

* ``--dag ID``: run that DAG instead of ``runbook_fleet`` (``runbook_<params stem>`` runs one
  migration of the folder);
* ``--answer Approve|Reject``: what the release manager answers a held phase (default Approve);
  ``--reject STEM`` (repeatable): reject the held phases of that migration whatever ``--answer``
  says; ``--decide GO|NO-GO``: the answer to a HOLD (default NO-GO);
* ``--project DIR`` and ``--fleet DIR``: another runbook project and params folder (relative to
  it) than this repository's ``params/fleet``;
* ``--summary FILE``: also write what was printed as JSON (the tests read it);
* ``RUNBOOK_DEMO_S3=http://127.0.0.1:PORT``: use that S3 endpoint (a bucket is created in it)
  instead of starting moto's server.

Exit 0 when the DAG run ended and every stored run was sealed and verifies; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RUNBOOK = REPO / ".venv" / "bin" / "runbook"
BUCKET, PREFIX = "runbook-fleet", "runs"
RESPONDER = "release-manager"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bucket(endpoint: str) -> None:
    """Create the demo's bucket at ``endpoint`` (moto accepts any credentials and an unsigned PUT)."""
    for _ in range(100):
        try:
            urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT"), timeout=2)
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"no S3 endpoint answered on {endpoint}")


def _airflow_env(home: Path, password: str, project: Path, fleet: str) -> None:
    """Airflow's configuration, by environment, before Airflow is imported: a fresh home (its SQLite
    metadata database), this integration's DAGs folder, and the release manager's login."""
    (home / "passwords.json").write_text(json.dumps({RESPONDER: password}))
    os.environ.update(AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False",
                      AIRFLOW__CORE__DAGS_FOLDER=str(Path(__file__).resolve().parent / "dags"),
                      AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=f"{RESPONDER}:admin",
                      AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(home / "passwords.json"),
                      RUNBOOK_PROJECT=str(project), RUNBOOK_STORE=f"s3://{BUCKET}/{PREFIX}", RUNBOOK_FLEET=fleet,
                      RUNBOOK_FLEET_LIMIT="2", RUNBOOK_SLOT_POKE_S="5", RUNBOOK_EXECUTABLE=str(RUNBOOK))


def _choice(detail: dict[str, Any], args: argparse.Namespace) -> str:
    """The release manager's answer to one request: a held phase's (Approve or Reject; its subject
    ends with the migration's params stem) or a HOLD's (GO or NO-GO)."""
    if "Approve" not in detail["options"]:
        return str(args.decide)
    stem = str(detail["subject"]).rsplit(": ", 1)[-1]
    return "Reject" if stem in args.reject else str(args.answer)


def _answering(manager: Any, args: argparse.Namespace, stop: threading.Event, said: list[str]) -> None:
    """Answer each pending request as :func:`_choice` says, once a second until ``stop``."""
    while not stop.wait(1.0):
        for detail in manager.pending():
            line = manager.answer(detail, _choice(detail, args))
            said.append(line)
            print(f"  [Airflow] {line}", flush=True)


def _runbook(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(RUNBOOK), *args], cwd=project, capture_output=True, text=True, check=False)


def _report(dag: Any, run: Any, answered: list[str], project: Path, fleet: str) -> dict[str, Any]:
    """Each migration's decision, reasons and ``runbook verify`` exit, from the store."""
    import runbook_dags

    runbook = runbook_dags.runbook
    tis = {(ti.task_id.rsplit(".", 1)[-1], ti.map_index): str(ti.state) for ti in run.get_task_instances()}
    stems = [Path(f).stem for f in sorted((project / fleet).glob("*.yaml"))]
    if dag.dag_id != "runbook_fleet":
        stems = [s for s in stems if dag.dag_id == f"runbook_{s}"]
    out: dict[str, Any] = {"dag_id": dag.dag_id, "dag_run_id": run.run_id, "dag_run_state": str(run.state),
                           "answered": answered, "migrations": []}
    for i, stem in enumerate(stems):
        loc = runbook.location(f"{fleet}/{stem}.yaml", run.run_id)
        st = _runbook(project, "status", loc, "--json")
        status = json.loads(st.stdout[st.stdout.index("{"):]) if st.returncode == 0 else {}
        verify = _runbook(project, "verify", loc)
        index = i if dag.dag_id == "runbook_fleet" else -1
        out["migrations"].append({"params": stem, "location": loc, "decision": status.get("decision", "UNREADABLE"),
                                  "reasons": status.get("reasons", []), "sealed": status.get("sealed", False),
                                  "verify_exit": verify.returncode,
                                  "decision_task": tis.get(("decision", index), "none")})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dag", default="runbook_fleet")
    ap.add_argument("--answer", choices=["Approve", "Reject"], default="Approve")
    ap.add_argument("--reject", action="append", default=[], metavar="STEM")
    ap.add_argument("--decide", choices=["GO", "NO-GO"], default="NO-GO")
    ap.add_argument("--project", default=str(REPO))
    ap.add_argument("--fleet", default="params/fleet")
    ap.add_argument("--summary")
    args = ap.parse_args(argv)
    project = Path(args.project).resolve()
    endpoint, s3 = os.environ.get("RUNBOOK_DEMO_S3", ""), None
    if not endpoint:
        endpoint = f"http://127.0.0.1:{_free_port()}"
        s3 = subprocess.Popen([str(REPO / ".venv" / "bin" / "moto_server"), "-H", "127.0.0.1", "-p",
                               endpoint.rsplit(":", 1)[1]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ.update(AWS_ENDPOINT_URL_S3=endpoint, AWS_ACCESS_KEY_ID="demo", AWS_SECRET_ACCESS_KEY="demo",
                      AWS_REGION="us-east-1")
    stop = threading.Event()
    with tempfile.TemporaryDirectory(prefix="runbook-airflow-home-") as home:
        try:
            _bucket(endpoint)
            password = secrets.token_urlsafe(16)
            _airflow_env(Path(home), password, project, args.fleet)
            from airflow.utils.db import initdb  # Airflow reads its configuration on import
            from runbook_airflow.demo import ReleaseManager

            initdb()
            sys.path.insert(0, os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
            import runbook_dags

            dag = runbook_dags.fleet if args.dag == "runbook_fleet" else getattr(runbook_dags, args.dag)
            answered: list[str] = []
            manager = ReleaseManager(RESPONDER, password)
            threading.Thread(target=_answering, args=(manager, args, stop, answered), daemon=True).start()
            run = dag.test()
            stop.set()
            summary = _report(dag, run, answered, project, args.fleet)
        finally:
            stop.set()
            if s3 is not None:
                s3.terminate()
                s3.wait()
    print(f"\n{summary['dag_id']} run {summary['dag_run_id']}: {summary['dag_run_state']}")
    for m in summary["migrations"]:
        print(f"  {m['params']:<38} {m['decision']:<8} decision task {m['decision_task']:<8} "
              f"verify exit {m['verify_exit']}  {m['location']}")
        for r in m["reasons"][:3]:
            print(f"      - {r}")
    if args.summary:
        Path(args.summary).write_text(json.dumps(summary, indent=2))
    done = summary["dag_run_state"] in ("success", "failed")
    return 0 if done and all(m["sealed"] and m["verify_exit"] == 0 for m in summary["migrations"]) else 1


if __name__ == "__main__":
    sys.exit(main())
