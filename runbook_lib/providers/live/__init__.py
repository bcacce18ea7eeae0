"""The ``live`` provider: a service the team runs today at a URL (``source.provider: live``),
which the runbook did not start and must not change.

It is a provider only so that every path that would create, stop or destroy something on the
source meets a refusal instead of a default: it plans nothing, launches nothing, lists nothing
(so phase 06's teardown finds nothing of the run's there) and declares every capability
unsupported with the reason. What the runbook does with a live source (paced requests over its
own API) is in :mod:`runbook_lib.phases.service_pods` and :mod:`runbook_lib.service.pacing`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, NoReturn

from runbook_lib.errors import NotFound, ProviderError
from runbook_lib.providers.api import KeySource
from runbook_lib.providers.base import (
    Capabilities,
    Capability,
    Endpoint,
    EndpointSpec,
    Lifecycle,
    Plan,
    Pod,
    PodSpec,
    Provider,
)

NOT_OURS = ("a live service (source.url): the runbook did not start it and changes nothing about it; it only sends "
            "requests paced at source.max_rate_per_s")
"""Why every capability of a live source is unsupported, and what the runbook does there instead."""


def _refuse(action: str) -> NoReturn:
    raise ProviderError(f"cannot {action} on the live source: {NOT_OURS}. Nothing was sent to it", provider="live")


class LiveLifecycle(Lifecycle):
    """Refuses every primitive: nothing on a live source is created, stopped or destroyed."""

    def launch(self, spec: PodSpec) -> Pod:
        _refuse(f"launch pod {spec.name!r}")

    def create_endpoint(self, spec: EndpointSpec) -> Endpoint:
        _refuse(f"create endpoint {spec.name!r}")

    def stop(self, resource_id: str) -> dict[str, Any] | None:
        _refuse(f"stop {resource_id!r}")

    def start(self, resource_id: str) -> None:
        _refuse(f"start {resource_id!r}")

    def destroy(self, resource_id: str) -> dict[str, Any] | None:
        _refuse(f"destroy {resource_id!r}")


class LiveProvider(Provider):
    """A live source: plans and primitives refused (:data:`NOT_OURS`), nothing listed."""

    name = "live"
    dry_run_default = False
    http_port_protocol = "tcp"

    def __init__(self, url: str = "") -> None:
        self.url = url
        self.lifecycle = LiveLifecycle()
        self.attempts = []

    def capabilities(self) -> Capabilities:
        no = Capability(False, NOT_OURS, "runbook_lib/providers/live/__init__.py")
        return Capabilities(provider="live", udp=no, docker_compose=no, privileged=no, persistent_volume=no,
                            max_request_s=None, gpu=Capability(False, "declared, not observed (source.declared.gpu)"),
                            billing="the team's own, unknown to the runbook (source.price_usd_per_hour is declared)",
                            queue_endpoints=no, load_balancing=no, restart=no,
                            lifecycle="not ours: its restarts and interruptions are the team's",
                            network=f"reached at its URL {self.url or '(source.url)'}, as its users reach it")

    def plan_launch(self, spec: PodSpec, *, dry_run: bool | None = None) -> Plan:
        _refuse(f"plan a pod launch ({spec.name!r})")

    def plan_endpoint(self, spec: EndpointSpec, *, dry_run: bool | None = None) -> Plan:
        _refuse(f"plan an endpoint ({spec.name!r})")

    def plan_destroy(self, resource_id: str, *, dry_run: bool | None = None) -> Plan:
        _refuse(f"plan destroying {resource_id!r}")

    def wait_exit(self, resource_id: str, *, timeout_s: float, finished: Callable[[], bool] | None = None) -> Pod:
        raise NotFound(f"no resource {resource_id!r} on the live source: the runbook runs nothing there",
                       provider="live", resource_id=resource_id)

    def log_tail(self, resource_id: str, n_bytes: int = 4000) -> str:
        return ""

    def get(self, resource_id: str) -> Pod | Endpoint:
        raise NotFound(f"no resource {resource_id!r} on the live source: the runbook creates nothing there",
                       provider="live", resource_id=resource_id)

    def list(self, *, labels: dict[str, str]) -> list[Pod | Endpoint]:
        return []


def default_key(ref: str = "") -> KeySource:
    """A live source takes no provider API key (its own API's token is ``source.auth_ref``).

    Raises:
        ProviderError: always.
    """
    raise ProviderError("the live provider takes no API key: a live source's own token is source.auth_ref",
                        provider="live")


def create(*, root: str | Path = "", profile: Any = None, **kwargs: Any) -> LiveProvider:
    """Registry factory: ``profile`` (a :class:`runbook_lib.params.LiveProfile`) gives the URL."""
    return LiveProvider(url=str(getattr(profile, "url", "")))
