"""A real Airflow API server on loopback, for the cases whose source job is started by an Airflow
DAG (``source.schedules`` of kind ``airflow``, runbook_lib/traffic/schedules.py).

Airflow 3.3 from .venv-airflow (locks/airflow.txt): a fresh home with its SQLite metadata database
(``airflow db migrate``), a DAGs folder whose DAGs are written into that database by ``airflow
dags reserialize``, and ``airflow api-server`` on 127.0.0.1 with the simple auth manager and one
admin user whose password is in a file. No scheduler runs, so an unpaused DAG is never started:
what the cases read and change is the DAGs' ``is_paused`` and a Variable, over the same REST API
the runbook uses. Each case uses its own pair of DAGs (``<pair>_source``, unpaused, and
``<pair>_target``, paused as Airflow creates it; both ``0 2 * * *``) and its own Variable
(``<pair>_provider`` = ``runpod``, which the source's DAG could read to pick where it trains).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
AIRFLOW = ROOT / ".venv-airflow" / "bin" / "airflow"
PAIRS = ("nightly_walk", "nightly_rollback")
USER_ENV, PASSWORD_ENV = "AIRFLOW_API_USER", "AIRFLOW_API_PASSWORD"
"""The environment variables the schedules' params name (``username_env``, ``password_env``)."""
DAGS = '''"""The team's nightly training DAGs: one per side, the same timetable."""
import pendulum
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG

for pair in {pairs!r}:
    for side in ("source", "target"):
        with DAG(f"{{pair}}_{{side}}", schedule="0 2 * * *", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
                 catchup=False, tags=["training"]) as dag:
            BashOperator(task_id="train", bash_command=f"echo train on the {{side}}")
        globals()[dag.dag_id] = dag
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class AirflowApi:
    """``airflow api-server`` started in ``home`` (:func:`start`); stop it with :meth:`stop`."""

    def __init__(self, url: str, user: str, password: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.url, self.user, self.password, self.proc, self.log = url, user, password, proc, log
        self._token = ""

    @property
    def env(self) -> dict[str, str]:
        """The credentials, by the names the params give."""
        return {USER_ENV: self.user, PASSWORD_ENV: self.password}

    def _headers(self) -> dict[str, str]:
        if not self._token:
            r = httpx.post(f"{self.url}/auth/token", json={"username": self.user, "password": self.password},
                           timeout=10)
            r.raise_for_status()
            self._token = r.json()["access_token"]
        return {"Authorization": f"Bearer {self._token}"}

    def paused(self, dag_id: str) -> bool:
        """``is_paused`` of ``dag_id`` as the API reports it."""
        r = httpx.get(f"{self.url}/api/v2/dags/{dag_id}", headers=self._headers(), timeout=10)
        r.raise_for_status()
        return bool(r.json()["is_paused"])

    def set_paused(self, dag_id: str, paused: bool) -> None:
        r = httpx.patch(f"{self.url}/api/v2/dags/{dag_id}", params={"update_mask": "is_paused"},
                        json={"is_paused": paused}, headers=self._headers(), timeout=10)
        r.raise_for_status()

    def create_variable(self, key: str, value: str) -> None:
        r = httpx.post(f"{self.url}/api/v2/variables", json={"key": key, "value": value}, headers=self._headers(),
                       timeout=10)
        r.raise_for_status()

    def variable(self, key: str) -> str:
        """The value of Airflow Variable ``key`` as the API reports it."""
        r = httpx.get(f"{self.url}/api/v2/variables/{key}", headers=self._headers(), timeout=10)
        r.raise_for_status()
        return str(r.json()["value"])

    def schedule(self, pair: str, shift: str = "pause") -> dict[str, object]:
        """``source.schedules``' entry for ``pair``: ``pause`` pauses the source's DAG and unpauses
        the target's; ``variable`` sets the Variable ``<pair>_provider`` the source's DAG reads
        from ``runpod`` to ``vast``."""
        moved = ({"target_dag_id": f"{pair}_target"} if shift == "pause" else
                 {"variable": f"{pair}_provider", "source_value": "runpod", "target_value": "vast"})
        return {"name": f"{pair}-dag", "kind": "airflow", "api_url": self.url, "dag_id": f"{pair}_source",
                "shift": shift, **moved, "username_env": USER_ENV, "password_env": PASSWORD_ENV}

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()


def start(home: Path) -> AirflowApi:
    """Set up Airflow in ``home`` and start its API server on a free loopback port; returns once
    the API answers, with each pair's source DAG unpaused (the job runs on the source today).

    Raises:
        AssertionError: .venv-airflow is missing, a set-up command failed, or the server did not
            answer within 120 s (its log's tail says why).
    """
    assert AIRFLOW.exists(), "Airflow's environment is missing: `make test-e2e` builds .venv-airflow"
    (home / "dags").mkdir(parents=True)
    (home / "dags" / "nightly.py").write_text(DAGS.format(pairs=PAIRS))
    user, password = "scheduler-admin", secrets.token_urlsafe(16)
    (home / "passwords.json").write_text(json.dumps({user: password}))
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{user}:admin",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
           "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16)}
    for args in (["db", "migrate"], ["dags", "reserialize"]):
        done = subprocess.run([str(AIRFLOW), *args], env=env, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, f"airflow {' '.join(args)}: exit {done.returncode}\n{done.stderr[-3000:]}"
    port, log = _free_port(), home / "api-server.log"
    with log.open("wb") as out:  # the server keeps its own copy of the descriptor
        proc = subprocess.Popen([str(AIRFLOW), "api-server", "-H", "127.0.0.1", "-p", str(port), "-w", "1",
                                 "--apps", "core"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    api = AirflowApi(f"http://127.0.0.1:{port}", user, password, proc, log)
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{api.url}/api/v2/monitor/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            api.stop()
            raise AssertionError(f"airflow api-server did not answer on {api.url}:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    for pair in PAIRS:
        api.set_paused(f"{pair}_source", False)
        api.create_variable(f"{pair}_provider", "runpod")
    return api
