"""A release manager who answers Airflow's human-in-the-loop requests through Airflow's REST API.

In production a person answers them on Airflow's "Required Actions" page, which calls the same
endpoints: ``GET /api/v2/dags/~/dagRuns/~/hitlDetails?response_received=false`` lists what waits,
``PATCH /api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/{map_index}/hitlDetails``
answers one, and Airflow records who answered and when. ``make demo-fleet`` runs no API server
process: it serves Airflow's own API application in process (Starlette's test client over
``airflow.api_fastapi.app.create_app``), with its real routes, its real authorisation (the simple
auth manager, one user with a password) and the metadata database the DAG run uses.

Airflow REST API, Human-in-the-loop: https://airflow.apache.org/docs/apache-airflow/stable/stable-rest-api-ref.html
"""

from __future__ import annotations

from typing import Any


class ReleaseManager:
    """Airflow's API as user ``name`` (``AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS`` names it, with a
    role, and the passwords file holds ``password``), answering pending requests.

    Raises (on creation):
        RuntimeError: Airflow refused the login (the status and body said).
    """

    def __init__(self, name: str, password: str) -> None:
        from airflow.api_fastapi.app import create_app
        from fastapi.testclient import TestClient

        self.name = name
        self.client = TestClient(create_app(apps="core"))
        r = self.client.post("/auth/token", json={"username": name, "password": password})
        if r.status_code != 201:
            raise RuntimeError(f"Airflow's API refused {name}'s login: HTTP {r.status_code} {r.text[:200]}")
        self.client.headers["Authorization"] = f"Bearer {r.json()['access_token']}"

    def pending(self) -> list[dict[str, Any]]:
        """Every request no one has answered yet, across DAGs and runs."""
        r = self.client.get("/api/v2/dags/~/dagRuns/~/hitlDetails", params={"response_received": "false"})
        r.raise_for_status()
        return list(r.json()["hitl_details"])

    def answer(self, detail: dict[str, Any], option: str) -> str:
        """Choose ``option`` for one pending request; a line saying what was answered.

        Raises:
            RuntimeError: Airflow refused the answer (an option the request does not offer, or one
                answered already); its status and body said.
        """
        ti = detail["task_instance"]
        path = (f"/api/v2/dags/{ti['dag_id']}/dagRuns/{ti['dag_run_id']}/taskInstances/{ti['task_id']}/"
                f"{ti['map_index']}/hitlDetails")
        r = self.client.patch(path, json={"chosen_options": [option], "params_input": {}})
        if r.status_code != 200:
            raise RuntimeError(f"Airflow refused {self.name}'s answer to {ti['task_id']}: HTTP {r.status_code} "
                               f"{r.text[:200]}")
        return f"{self.name} chose {option} for {ti['task_id']}[{ti['map_index']}]: {detail['subject']}"
