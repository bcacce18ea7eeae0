"""Runpod's wire: the REST v2 and GraphQL requests the adapter sends, each one method that takes
and returns the API's own JSON shapes (docs/reference/providers.md section 2). No policy lives
here (which offer, what a status means, when to retry a create): that is the adapter's
(:mod:`runbook_lib.providers.runpod`): a small client, and the adapter over it, as dstack's
Vast.ai backend is built (dstackai/dstack ``src/dstack/_internal/core/backends/vastai``)."""

from __future__ import annotations

from typing import Any

from runbook_lib.errors import NoCapacity, ProviderError
from runbook_lib.providers.api import ApiClient

REST_URL = "https://api.runpod.io"
JOB_URL = "https://api.runpod.ai"
CAPACITY_WORDS = ("no longer any instances available", "supply_constraint")
"""What Runpod's no-capacity answers say: the 400 problem's detail and GraphQL's
``extensions.code`` [unverified: third-party fixtures]."""


def classify(status: int, body: Any, text: str) -> ProviderError | None:
    """The :class:`ApiClient` hook: a 400/409 naming no capacity is :class:`NoCapacity`."""
    words = (text or "").lower()
    if status in (400, 409) and any(w in words for w in CAPACITY_WORDS):
        return NoCapacity("no capacity for the requested GPU type (HTTP %d); try the next ranked offer" % status,
                          provider="runpod")
    return None


class RunpodWire:
    """One method per Runpod request.

    Args:
        api: the REST v2 client (base ``https://api.runpod.io`` unless overridden); GraphQL goes
            through it too.
    """

    def __init__(self, api: ApiClient) -> None:
        self.api = api

    def catalog_gpus(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        """``GET /v2/catalog/gpus``: the GPU types with prices per GPU and availability."""
        return list(self.api.request_object("GET", "/v2/catalog/gpus", params=params).get("gpus", []))

    def create_pod(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v2/pods``: a creating request (:class:`~runbook_lib.errors.CreateOutcomeUnknown`
        when the answer does not say whether it happened)."""
        return self.api.request_object("POST", "/v2/pods", body=body, creates=True)

    def rent_spot(self, query: str, variables: dict[str, Any]) -> dict[str, Any]:
        """``POST /graphql`` ``podRentInterruptable`` (deprecated GraphQL; errors come as HTTP 200
        with ``errors``); a creating request."""
        return self.api.request_object("POST", "/graphql", body={"query": query, "variables": variables}, creates=True)

    def get_pod(self, pod_id: str) -> dict[str, Any]:
        """``GET /v2/pods/{id}``. Raises NotFound: no such pod."""
        return self.api.request_object("GET", f"/v2/pods/{pod_id}")

    def list_pods(self) -> list[dict[str, Any]]:
        """``GET /v2/pods``."""
        return list(self.api.request_object("GET", "/v2/pods").get("pods", []))

    def pod_action(self, pod_id: str, action: str) -> None:
        """``POST /v2/pods/{id}/action`` with ``{"action": "start" | "stop"}``."""
        self.api.request("POST", f"/v2/pods/{pod_id}/action", body={"action": action})

    def delete(self, path: str) -> None:
        """``DELETE`` a pod (``/v2/pods/{id}``) or an endpoint (``/v2/serverless/{id}``). Raises
        NotFound: nothing there."""
        self.api.request("DELETE", path)

    def create_endpoint(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v2/serverless``: a creating request."""
        return self.api.request_object("POST", "/v2/serverless", body=body, creates=True)

    def get_endpoint(self, endpoint_id: str) -> dict[str, Any]:
        """``GET /v2/serverless/{id}``. Raises NotFound: no such endpoint."""
        return self.api.request_object("GET", f"/v2/serverless/{endpoint_id}")

    def list_endpoints(self) -> list[dict[str, Any]]:
        """``GET /v2/serverless``."""
        return list(self.api.request_object("GET", "/v2/serverless").get("endpoints", []))

    def endpoint_workers(self, endpoint_id: str) -> list[dict[str, Any]]:
        """``GET /v2/serverless/{id}/workers``: each worker's id and status."""
        return list(self.api.request_object("GET", f"/v2/serverless/{endpoint_id}/workers").get("workers", []))
