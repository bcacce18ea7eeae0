"""The conformance suite every provider in the provider table passes. A subclass supplies the
``env`` fixture: a :class:`ProviderEnv` with the provider, a launch spec factory, a count of the
calls that changed something at the provider's API (0 for local), and an endpoint spec factory.

It covers plans and approvals, launch / list / destroy, stop and start (or the declared refusal
to start), readiness, a missing resource, and endpoints (or the declared refusal to create one)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import pytest

from runbook_lib.errors import ApprovalRequired, NotFound, ProviderError
from runbook_lib.evidence.approvals import Approval
from runbook_lib.providers.base import (
    Capabilities,
    Endpoint,
    EndpointSpec,
    Lifecycle,
    Pod,
    PodSpec,
    Readiness,
    Teardown,
    plan_start,
    plan_stop,
)


@dataclass
class ProviderEnv:
    provider: Any
    spec: Callable[[str, tuple[tuple[str, str], ...]], PodSpec]
    writes: Callable[[], int]  # requests that create, change or destroy something so far
    endpoint_spec: Callable[[tuple[tuple[str, str], ...]], EndpointSpec]


def approve(plan: Any) -> Approval:
    return Approval(plan.fingerprint, "contract-test", "2026-11-29T00:00:00Z", "test")


class ProviderContract:
    """Tests shared by every provider."""

    def test_capabilities_are_declared_data(self, env: ProviderEnv) -> None:
        caps = env.provider.capabilities()
        assert isinstance(caps, Capabilities) and caps.provider == env.provider.name
        for cap in (caps.udp, caps.docker_compose, caps.privileged, caps.persistent_volume, caps.gpu,
                    *caps.extra.values()):
            assert cap.detail, f"{env.provider.name}: a capability without a reason"
            assert cap.limit is None or cap.limit > 0
        assert caps.billing
        for cap in (caps.queue_endpoints, caps.restart):
            assert cap.detail
        assert caps.lifecycle and caps.network  # what survives a stop, how ports are reached

    def test_the_whole_interface_is_declared_and_answers(self, env: ProviderEnv) -> None:
        labels = (("run_id", "contract-iface"), ("role", "canary"))
        assert isinstance(env.provider.lifecycle, Lifecycle) and env.provider.attempts == []  # set by the adapter
        plan = env.provider.plan_launch(env.spec("c-iface", labels), dry_run=False)
        pod = env.provider.apply(plan, approve(plan))
        assert isinstance(pod, Pod)
        described = env.provider.describe(pod.id)
        assert described["id"] == pod.id and described["provider"] == env.provider.name
        assert isinstance(env.provider.log_tail(pod.id), str)
        done = env.provider.wait_exit(pod.id, timeout_s=120, finished=lambda: True)  # finished: returns at once
        assert done.id == pod.id
        d = env.provider.plan_destroy(pod.id, dry_run=False)
        env.provider.apply(d, approve(d))
        with pytest.raises(NotFound):
            env.provider.describe("no-such-resource-0000")

    def test_plans_are_pure_and_fingerprinted(self, env: ProviderEnv) -> None:
        spec = env.spec("c-pure", (("run_id", "contract-pure"),))
        a, b = env.provider.plan_launch(spec, dry_run=False), env.provider.plan_launch(spec, dry_run=False)
        assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 64
        # what a dry run showed, and the same launch in a later run, is approved by the same fingerprint
        assert env.provider.plan_launch(spec, dry_run=True).fingerprint == a.fingerprint
        rerun = env.spec("c-pure", (("run_id", "contract-pure-2"),))
        assert env.provider.plan_launch(rerun, dry_run=False).fingerprint == a.fingerprint
        dearer = replace(spec, price_usd_per_hour=spec.price_usd_per_hour * 2)
        assert env.provider.plan_launch(dearer, dry_run=False).fingerprint != a.fingerprint
        assert env.provider.plan_destroy("x", dry_run=False).action == "destroy"
        assert env.writes() == 0

    def test_apply_without_matching_approval_creates_nothing(self, env: ProviderEnv) -> None:
        labels = (("run_id", "contract-noapproval"),)
        plan = env.provider.plan_launch(env.spec("c-noapp", labels), dry_run=False)
        other = env.provider.plan_launch(env.spec("c-other", labels), dry_run=False)
        for approval in (None, approve(other)):
            with pytest.raises(ApprovalRequired, match="not approved"):
                env.provider.apply(plan, approval)
        assert env.writes() == 0
        assert env.provider.list(labels=dict(labels)) == []

    def test_dry_run_applies_nothing(self, env: ProviderEnv) -> None:
        labels = (("run_id", "contract-dry"),)
        plan = env.provider.plan_launch(env.spec("c-dry", labels), dry_run=True)
        assert env.provider.apply(plan, approve(plan)) is None
        assert env.writes() == 0 and env.provider.list(labels=dict(labels)) == []

    def test_launch_list_by_label_destroy_idempotent(self, env: ProviderEnv) -> None:
        labels = (("run_id", "contract-life"), ("role", "canary"))
        plan = env.provider.plan_launch(env.spec("c-life", labels), dry_run=False)
        pod = env.provider.apply(plan, approve(plan))
        assert isinstance(pod, Pod) and pod.state in ("CREATED", "RUNNING", "EXITED")
        assert pod.labels.get("run_id") == "contract-life"
        assert [r.id for r in env.provider.list(labels={"run_id": "contract-life"})] == [pod.id]
        assert env.provider.list(labels={"run_id": "another-run"}) == []
        assert not env.provider.is_gone(pod.id)
        done = []
        for _ in range(2):  # destroying twice is not an error
            d = env.provider.plan_destroy(pod.id, dry_run=False)
            done.append(env.provider.apply(d, approve(d)))
        assert env.provider.is_gone(pod.id)
        assert all(isinstance(t, Teardown) and t.action == "destroy" and t.resource_id == pod.id for t in done)
        assert done[0].found != "gone" and done[0].detail  # it says what it found and did
        assert done[1].found in ("gone", "DESTROYED")  # the second found nothing left to destroy
        left = env.provider.list(labels={"run_id": "contract-life"})  # gone, or listed as DESTROYED
        assert all(r.id == pod.id and r.state == "DESTROYED" for r in left)

    def test_get_of_a_missing_resource_is_not_found(self, env: ProviderEnv) -> None:
        with pytest.raises(NotFound):
            env.provider.get("no-such-resource-0000")
        assert env.provider.list(labels={"run_id": "contract-none"}) == []

    def test_a_launched_pod_becomes_ready(self, env: ProviderEnv) -> None:
        spec = env.spec("c-ready", (("run_id", "contract-ready"),))
        plan = env.provider.plan_launch(spec, dry_run=False)
        pod = env.provider.apply(plan, approve(plan))
        try:
            ready = env.provider.lifecycle.readiness(env.provider.get(pod.id), spec)
            assert isinstance(ready, Readiness) and ready.ready and ready.state == "RUNNING", ready.problems
        finally:
            d = env.provider.plan_destroy(pod.id, dry_run=False)
            env.provider.apply(d, approve(d))

    def test_stop_keeps_the_pod_and_start_is_supported_or_refused(self, env: ProviderEnv) -> None:
        spec = env.spec("c-stop", (("run_id", "contract-stop"),))
        plan = env.provider.plan_launch(spec, dry_run=False)
        pod = env.provider.apply(plan, approve(plan))
        try:
            stop = plan_stop(env.provider, pod.id, dry_run=False)
            assert stop.action == "stop" and stop.spec is None
            done = env.provider.apply(stop, approve(stop))
            assert isinstance(done, Teardown) and done.action == "stop"
            assert env.provider.get(pod.id).state in ("STOPPED", "EXITED")  # compute released ...
            assert not env.provider.is_gone(pod.id)  # ... the pod (and its volume) kept
            if env.provider.capabilities().restart.supported:
                start = plan_start(env.provider, pod.id, dry_run=False, price_usd_per_hour=spec.price_usd_per_hour)
                assert start.action == "start" and start.cost_usd_per_hour == spec.price_usd_per_hour
                back = env.provider.apply(start, approve(start))
                assert isinstance(back, Pod) and back.id == pod.id
                assert env.provider.lifecycle.readiness(env.provider.get(pod.id), spec).ready
            else:
                before = env.writes()
                with pytest.raises(ProviderError, match="cannot start a stopped resource"):
                    plan_start(env.provider, pod.id, dry_run=False)
                assert env.writes() == before
        finally:
            d = env.provider.plan_destroy(pod.id, dry_run=False)
            env.provider.apply(d, approve(d))

    @pytest.mark.parametrize("mode", ["queue", "load_balancing"])
    def test_endpoints_are_created_and_destroyed_or_refused(self, env: ProviderEnv, mode: str) -> None:
        labels = (("run_id", "contract-endpoint"), ("role", "endpoint"))
        spec = replace(env.endpoint_spec(labels), mode=mode)
        caps = env.provider.capabilities()
        if not (caps.load_balancing if mode == "load_balancing" else caps.queue_endpoints).supported:
            with pytest.raises(ProviderError, match=f"cannot serve a {mode} endpoint"):  # refused before any call
                env.provider.plan_endpoint(spec, dry_run=False)
            assert env.writes() == 0 and env.provider.list(labels=dict(labels)) == []
            return
        plan = env.provider.plan_endpoint(spec, dry_run=False)
        assert plan.action == "create_endpoint" and plan.cost_usd_per_hour == spec.price_usd_per_hour * spec.workers
        ep = env.provider.apply(plan, approve(plan))
        assert isinstance(ep, Endpoint) and ep.url and ep.mode == mode
        assert [r.id for r in env.provider.list(labels={"run_id": "contract-endpoint"})] == [ep.id]
        d = env.provider.plan_destroy(ep.id, dry_run=False)
        assert isinstance(env.provider.apply(d, approve(d)), Teardown)
        assert env.provider.is_gone(ep.id)

    def test_unknown_resource_is_gone(self, env: ProviderEnv) -> None:
        assert env.provider.is_gone("no-such-resource-0000")
        d = env.provider.plan_destroy("no-such-resource-0000", dry_run=False)
        done = env.provider.apply(d, approve(d))  # destroying what is already gone is a success
        assert isinstance(done, Teardown) and done.found == "gone"


def local_env(tmp_path: Path, params_path: Path) -> ProviderEnv:
    """The local provider; its endpoints serve ``params_path``'s workload (keep it light)."""
    import sys

    from runbook_lib.providers.local import LocalProvider

    prov = LocalProvider(root=tmp_path / "state")

    def spec(name: str, labels: tuple[tuple[str, str], ...]) -> PodSpec:
        return PodSpec(name=name, command=(sys.executable, "-c", "import time; time.sleep(30)"), device="cpu",
                       price_usd_per_hour=0.1, labels=labels)

    def endpoint(labels: tuple[tuple[str, str], ...]) -> EndpointSpec:
        return EndpointSpec(name="c-endpoint", params_path=str(params_path), side="target", workers=1,
                            price_usd_per_hour=0.2, labels=labels,
                            env=(("PYTHONPATH", str(Path(__file__).resolve().parents[2])),))  # tests.fixture_workloads

    return ProviderEnv(prov, spec, lambda: 0, endpoint)
