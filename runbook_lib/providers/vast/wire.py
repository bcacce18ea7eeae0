"""Vast.ai's wire: the REST requests the adapter sends, each one method that takes and returns
the API's own JSON shapes (docs/reference/providers.md, Vast.ai). No policy lives here (which
offer, what a status means, when a failed create left an instance): that is the adapter's
(:mod:`runbook_lib.providers.vast`), as dstack's Vast.ai backend keeps its API client apart
(dstackai/dstack ``src/dstack/_internal/core/backends/vastai/api_client.py``)."""

from __future__ import annotations

from typing import Any

from runbook_lib.providers.api import ApiClient

BASE_URL = "https://console.vast.ai"
PAGE_LIMIT = 25  # /api/v1/instances/ pages hold at most 25 (show_instances.yaml)


class VastWire:
    """One method per Vast.ai request.

    Args:
        api: the REST client (base ``https://console.vast.ai`` unless overridden).
    """

    def __init__(self, api: ApiClient) -> None:
        self.api = api

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
