"""Vast.ai's wire: the REST requests the adapter sends, each one method that takes and returns
the API's own JSON shapes (docs/reference/providers.md, Vast.ai). No policy lives here (which
offer, what a status means, when a failed create left an instance): that is the adapter's
(:mod:`runbook_lib.providers.vast`), as dstack's Vast.ai backend keeps its API client apart
(dstackai/dstack ``src/dstack/_internal/core/backends/vastai/api_client.py``)."""

from __future__ import annotations

import json
import shlex
from typing import Any

from runbook_lib.providers.api import ApiClient

BASE_URL = "https://console.vast.ai"
PAGE_LIMIT = 25  # /api/v1/instances/ pages hold at most 25 (show_instances.yaml)


def docker_env(flags: str) -> tuple[dict[str, str], list[str]]:
    """A template's ``env`` (Docker flags: ``-e K=V -p 8000:8000``) as its variables and ports."""
    env: dict[str, str] = {}
    ports: list[str] = []
    words = shlex.split(flags or "")
    for flag, value in zip(words, words[1:], strict=False):
        if flag == "-e" and "=" in value:
            k, v = value.split("=", 1)
            env[k] = v
        elif flag == "-p":
            ports.append(value)
    return env, ports


class VastWire:
    """One method per Vast.ai request.

    Args:
        api: the REST client (base ``https://console.vast.ai`` unless overridden).
    """

    def __init__(self, api: ApiClient) -> None:
        self.api = api
        self.serverless = ServerlessWire(api)

    def search(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """``POST /api/v0/bundles/``: the offers a search body selects."""
        return list(self.api.request_object("POST", "/api/v0/bundles/", body=body).get("offers", []))

    def rent(self, offer_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``PUT /api/v0/asks/{id}/``: rent an offer (``success`` and ``new_contract``, the
        instance id); a creating request."""
        return self.api.request_object("PUT", f"/api/v0/asks/{offer_id}/", body=body, creates=True)

    def instance(self, instance_id: str) -> dict[str, Any] | None:
        """``GET /api/v0/instances/{id}/?owner=me``: the instance, or None when Vast lists none."""
        body = self.api.request_object("GET", f"/api/v0/instances/{instance_id}/", params={"owner": "me"})
        inst = body.get("instances")
        return dict(inst) if inst else None

    def instances(self) -> list[dict[str, Any]]:
        """Every instance, following ``next_token`` pages of ``GET /api/v1/instances/``."""
        out: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": PAGE_LIMIT}
        while True:
            body = self.api.request_object("GET", "/api/v1/instances/", params=params)
            out += list(body.get("instances", []))
            token = body.get("next_token")
            if not token:
                return out
            params = {"limit": PAGE_LIMIT, "after_token": token}

    def set_state(self, instance_id: str, state: str) -> None:
        """``PUT /api/v0/instances/{id}/`` with ``{"state": "stopped" | "running"}``."""
        self.api.request("PUT", f"/api/v0/instances/{instance_id}/", body={"state": state})

    def destroy(self, instance_id: str) -> None:
        """``DELETE /api/v0/instances/{id}/``. Raises NotFound: no such instance."""
        self.api.request("DELETE", f"/api/v0/instances/{instance_id}/", body={})


class ServerlessWire:
    """One method per Vast.ai Serverless request: templates, endpoints and workergroups on the
    console API, the worker list on the autoscaler (whose base URL is passed in). Reached as
    :attr:`VastWire.serverless`.

    Args:
        api: the REST client, as :class:`VastWire`'s.
    """

    def __init__(self, api: ApiClient) -> None:
        self.api = api

    def create_template(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /api/v0/template/``: ``{"success", "template": {"id", "hash_id", ...}}``; a
        creating request (docs.vast.ai "Creating and using templates with the API")."""
        return self.api.request_object("POST", "/api/v0/template/", body=body, creates=True)

    def delete_template(self, hash_id: str) -> None:
        """``DELETE /api/v0/template/`` with ``{"hash_id"}``. Raises NotFound: no such template."""
        self.api.request("DELETE", "/api/v0/template/", body={"hash_id": hash_id})

    def create_endpoint(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /api/v0/endptjobs/``: ``{"success", "result": <endpoint id>}`` (vastai 1.9.1
        ``api/endpoints.py``); a creating request."""
        return self.api.request_object("POST", "/api/v0/endptjobs/", body=body, creates=True)

    def endpoints(self) -> list[dict[str, Any]]:
        """``GET /api/v0/endptjobs/``: the account's endpoints (``results``)."""
        return list(self.api.request_object("GET", "/api/v0/endptjobs/").get("results") or [])

    def delete_endpoint(self, endpoint_id: str) -> dict[str, Any]:
        """``DELETE /api/v0/endptjobs/{id}/``: the endpoint, its workergroups and their workers
        (``deleted_workers``). Raises NotFound: no such endpoint."""
        return self.api.request_object("DELETE", f"/api/v0/endptjobs/{endpoint_id}/",
                                       body={"client_id": "me", "endptjob_id": int(endpoint_id)})

    def create_workergroup(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /api/v0/autojobs/``: ``{"success", "id"}`` (the async client reads ``id``, an
        older docs page ``result``); a creating request."""
        return self.api.request_object("POST", "/api/v0/autojobs/", body=body, creates=True)

    def workergroups(self) -> list[dict[str, Any]]:
        """``GET /api/v0/autojobs/``: the account's workergroups (``results``)."""
        return list(self.api.request_object("GET", "/api/v0/autojobs/").get("results") or [])

    def endpoint_workers(self, autoscaler_url: str, endpoint_id: str) -> list[dict[str, Any]]:
        """``POST {autoscaler}/get_endpoint_workers/`` with ``{"id", "api_key"}``: each worker's
        instance ``id`` and ``status`` (a dict with ``error_msg`` when the endpoint is not ready:
        no workers)."""
        out = self.api.request("POST", "/get_endpoint_workers/", base_url=autoscaler_url,
                               body={"id": int(endpoint_id), "api_key": self.api.key.resolve()})
        return list(out) if isinstance(out, list) else []

    def template(self, hash_id: str) -> dict[str, Any]:
        """``GET /api/v0/template/`` selected by ``hash_id`` (vastai 1.9.1 ``api/offers.py``): the
        template, or ``{}`` when none has it."""
        body = self.api.request_object("GET", "/api/v0/template/",
                                       params={"select_filters": json.dumps({"hash_id": {"eq": hash_id}}),
                                               "select_cols": json.dumps(["*"])})
        found = body.get("templates") or []
        return dict(found[0]) if found else {}
