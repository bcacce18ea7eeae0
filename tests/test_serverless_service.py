"""A team's Runpod handler on a Runpod Serverless queue endpoint (``source.serverless`` /
``target.serverless``): what is refused before anything runs, what the Runpod adapter sends and
reads back (against the recorded shapes, through the fake API), that plans approved before the
endpoint spec grew its service fields keep their fingerprints, and what phase 02 says when the
service changes where it runs. The whole migration is rehearsed by tests/test_e2e_rehearse.py;
the official ``runpod`` client runs jobs on such an endpoint in tests/test_official_clients.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from runbook_lib.errors import ParamsError, ProviderError
from runbook_lib.params import dump_yaml, load_params
from runbook_lib.phases.compare import goodput
from runbook_lib.phases.mapping import ADAPTER, EQUIVALENT, POD_HAS_NO, serving_row
from runbook_lib.providers.base import EndpointSpec, Plan
from runbook_lib.providers.vast import search_params as vast_search_params

from .conftest import ROOT
from .runs import merged, write_params
from .test_providers import approve, remote

HANDLER = "runpod-serverless-to-vast-handler.yaml"


def _params(tmp_path: Path, **over: Any) -> Path:
    return write_params(tmp_path, HANDLER, "m.yaml", **over)


@pytest.mark.parametrize(("over", "says"), [
    ({"workload": {"service": {"protocol": "http-json", "drills": {"idempotency_key": "", "replayed": "",
                                                                    "hang": None}}}},
     r"source.serverless runs a team's Runpod handler .* on a Runpod Serverless queue endpoint; this workload is "
     r"protocol 'http-json'"),
    ({"workload": {"service": {"protocol": "http-json"}}},
     r"workload.service.drills is set for protocol 'http-json': the redeliver and hung_worker drills reach a service "
     r"through a job API \(runpod-handler\) only"),
    ({"workload": {"service": {"drills": {"idempotency_key": "input.request_id"}}}},
     r"workload.service.drills.idempotency_key: .*got 'input.request_id'"),  # a field name, shown
    ({"workload": {"service": {"drills": {"idempotency_key": ""}}}},
     r"workload.service.drills.replayed names where the handler says it answered from its record, but "
     r"idempotency_key is empty"),
    ({"workload": {"service": {"private_image": True, "registry_credential": "REG"}}},
     r"source.serverless with a private image: the runbook sends no registry login for a Runpod Serverless queue "
     r"endpoint \(POST /v2/serverless has no registry field"),
    ({"measure": {"cold_starts": 3}, "target": {"serverless": None}},
     r"measure.cold_starts = 3: cold starts from zero are compared between two Serverless endpoints, and the target "
     r"is a pod"),
    ({"source": {"serverless": {"type": "LOAD_BALANCER"}}},
     r"source.serverless runs a team's HTTP server .* on a Runpod Serverless load-balancing endpoint; this workload is "
     r"protocol 'runpod-handler', .*set type: QUEUE"),
    ({"cutover": {"router": {"kind": "haproxy"}}},
     r"cutover.router.kind 'haproxy' cannot route this cutover: the source is a serverless endpoint"),
    ({"source": {"pod_id": "abc123"}}, r"source.pod_id names a pod, but source.serverless runs the service on a Runpod "
                                       r"Serverless queue endpoint"),
    ({"workload": {"requirements": {"max_request_s": 90}}},
     r"max_request_s = 90 exceeds source.serverless.execution_timeout_s = 60: the endpoint would end a request that "
     r"long TIMED_OUT"),
    ({"target": {"workers": 3, "gpu_priority": ["ADA_24"]}},
     r"target.gpu_priority, target.workers are not read for a Vast.ai Serverless side"),
    ({"workload": {"service": {"command": []}}},
     r"target.serverless on Vast.ai runs workload.service.command as its template's onstart.*it is empty"),
])
def test_what_a_service_endpoint_cannot_do_is_refused_with_its_fix(tmp_path: Path, over: dict[str, Any],
                                                                   says: str) -> None:
    with pytest.raises(ParamsError, match=says):
        load_params(_params(tmp_path, **over))


def test_the_rehearsed_params_load_and_an_inference_workload_cannot_take_serverless(tmp_path: Path) -> None:
    mig = load_params(ROOT / "params" / HANDLER)
    assert mig.source.serverless is not None and mig.source.serverless.flashboot == "FLASHBOOT"  # type: ignore[union-attr]
    data = yaml.safe_load((ROOT / "params" / "runpod-to-vast.yaml").read_text())
    p = write_params(tmp_path, "runpod-to-vast.yaml", "inf.yaml",
                     **merged({"source": {"serverless": {"type": "QUEUE"}}}))
    assert data["workload"]["kind"] == "inference"
    with pytest.raises(ParamsError, match=r"this workload is kind 'inference'.*follows endpoint_mode"):
        load_params(p)


def _service_spec(**over: Any) -> EndpointSpec:
    base = dict(name="m-endpoint-source", params_path="", side="source", workers=3, price_usd_per_hour=0.99,
                labels=(("run_id", "r-7"), ("side", "source"), ("role", "endpoint-source")),
                execution_timeout_s=60.0, env=(("MODEL_DIR", "/models/a"),), image="ghcr.io/example/text-handler:2.1",
                gpu_types=("ADA_24",), active_workers=1, idle_timeout_s=7.0, service=True, flashboot="FLASHBOOT")
    return EndpointSpec(**{**base, **over})  # type: ignore[arg-type]


def test_a_service_endpoint_gets_the_services_environment_only_and_is_read_back_as_runpod_reports_it() -> None:
    prof = load_params(ROOT / "params" / HANDLER).source
    prov, fake, _ = remote("runpod", profile=prof)
    plan = prov.plan_endpoint(_service_spec(), dry_run=False)
    ep = prov.apply(plan, approve(plan))
    body = next(b for m, path, b in fake.requests if m == "POST" and path.endswith("/v2/serverless"))
    # the team's handler sees its own variables and nothing of the runbook; the labels ride in the name
    assert body["env"] == {"MODEL_DIR": "/models/a"}
    assert body["name"].startswith("m-endpoint-source | ") and "r-7" in body["name"]
    assert (body["type"], body["gpu"], body["workers"], body["timeout"], body["flashboot"]) == (
        "QUEUE", {"pools": ["ADA_24"], "count": 1}, {"min": 1, "max": 3, "idleTimeout": 7}, 60_000, "FLASHBOOT")
    assert ep.name == "m-endpoint-source" and ep.labels == {"run_id": "r-7", "side": "source",
                                                           "role": "endpoint-source"}
    assert ep.url.endswith(f"/v2/{ep.id}")  # the job API as the adapter reaches it
    seen = prov.describe(ep.id)
    assert seen["image"] == "ghcr.io/example/text-handler:2.1" and seen["env_names"] == ["MODEL_DIR"]
    assert seen["command"] == [] and seen["ports"] == {}
    s = seen["endpoint"]
    assert (s["type"], s["workers_min"], s["workers_max"], s["idle_timeout_s"], s["gpu_pools"],
            s["execution_timeout_ms"], s["flashboot"]) == ("QUEUE", 1, 3, 7, ["ADA_24"], 60_000, "FLASHBOOT")
    assert [r.id for r in prov.list(labels={"run_id": "r-7"})] == [ep.id]  # found again by its labels


def test_an_endpoint_plan_without_the_service_fields_keeps_the_fingerprint_it_was_approved_by() -> None:
    spec = EndpointSpec(name="m-endpoint-target", params_path="params/demo.yaml", side="target", workers=2,
                        price_usd_per_hour=0.5, labels=(("run_id", "r1"), ("side", "target")), image="img:1",
                        gpu_types=("ADA_24",), active_workers=0, idle_timeout_s=5.0)
    plan = Plan("runpod", "create_endpoint", "m-endpoint-target", spec, 1.0, False)
    # computed with the code at 667cde4, before EndpointSpec had ``service`` and ``flashboot``
    assert plan.fingerprint == "aebe15245c1ab32c05dfcaa7effaaabefa7229df150c27c6f7f9c7ca35ae4e8a"
    served = Plan("runpod", "create_endpoint", "m-endpoint-target", _service_spec(), 1.0, False)
    assert served.fingerprint != Plan("runpod", "create_endpoint", "m-endpoint-target",
                                      _service_spec(flashboot="OFF"), 1.0, False).fingerprint


def test_phase_02_names_what_a_pod_has_no_equivalent_for_and_each_changed_endpoint_setting(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "params" / HANDLER).read_text())
    del data["target"]["serverless"]  # the handler on a Vast.ai instance, its SDK's HTTP API on a mapped port
    data["measure"]["cold_starts"] = 0  # a pod does not scale to zero
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "pod.yaml").write_text(dump_yaml(data))
    mig = load_params(tmp_path / "params" / "pod.yaml")
    row = serving_row(mig.source, mig.target)
    assert row.status == ADAPTER and row.target == "a vast pod"
    assert all(item in row.reason for item in POD_HAS_NO) and "--rp_serve_api" in row.reason
    assert "workers 1 min of 1 max, idle timeout 5 s, execution timeout 60 s" in row.source
    back = serving_row(mig.target, mig.source)
    assert back.status == ADAPTER and "entry point runs (workload.service.command does not)" in back.reason
    data["target"] = {**data["source"], "name": "runpod-handler-b", "release": "text-handler 2.1 (B)",
                      "idle_timeout_s": 30, "serverless": {"type": "QUEUE"}}
    (tmp_path / "params" / "both.yaml").write_text(dump_yaml(data))
    both = load_params(tmp_path / "params" / "both.yaml")
    changed = serving_row(both.source, both.target)
    assert changed.status == ADAPTER and changed.reason.startswith("idle timeout, execution timeout, flashboot change")
    assert serving_row(both.source, both.source).status == EQUIVALENT


def _vast_spec() -> EndpointSpec:
    settings = (("max_workers", 2), ("cold_workers", 1), ("min_load", 1.0), ("min_cold_load", 0.0),
                ("target_util", 0.9), ("cold_mult", 2.5), ("search_params", "gpu_name=RTX_4090"), ("gpu_ram", 24.0),
                ("onstart", "python -u /handler.py --rp_serve_api &"),
                ("pyworker", (("repo", "https://github.com/example/pw"), ("route", "/runsync"), ("healthcheck", "/"))))
    return EndpointSpec(name="m-endpoint-target", params_path="", side="target", workers=2, price_usd_per_hour=0.45,
                        labels=(("run_id", "r-9"), ("side", "target")), env=(("MODEL_DIR", "/models/a b"),),
                        image="ghcr.io/example/text-handler:2.1", mode="serverless", port=8000, service=True,
                        settings=settings)


def test_a_vast_serverless_endpoint_is_a_template_an_endpoint_and_a_workergroup_read_back_and_deleted() -> None:
    prof = load_params(ROOT / "params" / HANDLER).target
    prov, fake, _ = remote("vast", profile=prof)
    plan = prov.plan_endpoint(_vast_spec(), dry_run=False)
    ep = prov.apply(plan, approve(plan))
    sent = {path.split("/api/v0/")[-1]: b for m, path, b in fake.requests if m == "POST"}
    # the template: the service's environment, the adapter's, the API port published; private
    assert sent["template/"]["env"] == ("-e 'MODEL_DIR=/models/a b' -e PYWORKER_REPO=https://github.com/example/pw "
                                        "-e PYWORKER_ROUTE=/runsync -e PYWORKER_HEALTHCHECK=/ -p 8000:8000")
    assert sent["template/"]["private"] is True and sent["template/"]["onstart"].endswith("--rp_serve_api &")
    assert sent["endptjobs/"]["endpoint_name"].startswith("m-endpoint-target | ") and "r-9" in \
        sent["endptjobs/"]["endpoint_name"]
    assert (sent["endptjobs/"]["max_workers"], sent["endptjobs/"]["cold_workers"]) == (2, 1)
    group = sent["autojobs/"]
    assert (group["endpoint_id"], group["search_params"], group["gpu_ram"]) == (int(ep.id[4:]), "gpu_name=RTX_4090",
                                                                                24.0)
    assert group["template_hash"] == fake.serverless["template"][next(iter(fake.serverless["template"]))]["hash_id"]
    seen = prov.describe(ep.id)
    assert seen["image"] == "ghcr.io/example/text-handler:2.1" and seen["command"] == []
    assert seen["env_names"] == ["MODEL_DIR", "PYWORKER_HEALTHCHECK", "PYWORKER_REPO", "PYWORKER_ROUTE"]
    assert seen["endpoint"]["pyworker"] == {"repo": "https://github.com/example/pw", "route": "/runsync",
                                            "healthcheck": "/"}
    assert [r.id for r in prov.list(labels={"run_id": "r-9"})] == [ep.id]  # found again by its labels
    prov.apply(prov.plan_destroy(ep.id, dry_run=False), approve(prov.plan_destroy(ep.id, dry_run=False)))
    assert all(not fake.serverless.get(t) for t in ("template", "endptjobs", "autojobs"))


def test_a_vast_workergroup_refused_leaves_no_endpoint_or_template() -> None:
    prof = load_params(ROOT / "params" / HANDLER).target
    prov, fake, _ = remote("vast", profile=prof, script={"workergroup": ["invalid"]})
    plan = prov.plan_endpoint(_vast_spec(), dry_run=False)
    with pytest.raises(ProviderError, match="valid endpoint identifier"):
        prov.apply(plan, approve(plan))
    assert all(not fake.serverless.get(t) for t in ("template", "endptjobs", "autojobs"))


def test_the_workergroups_offer_search_is_the_profiles_offer_in_the_clis_query_language() -> None:
    req = load_params(ROOT / "params" / HANDLER).target.offer
    assert vast_search_params(req) == ("num_gpus>=1 num_gpus<=1 gpu_name=RTX_4090 gpu_ram>=24 cuda_max_good>=12.4 "
                                       "reliability>=0.98 dph_total<=0.6 verified=True rentable=True rented=False")


def test_phase_02_names_the_pyworker_adapter_a_vast_serverless_target_needs(tmp_path: Path) -> None:
    mig = load_params(ROOT / "params" / HANDLER)
    row = serving_row(mig.source, mig.target)
    assert row.status == ADAPTER and row.target.startswith("Vast.ai Serverless endpoint: workers 1 cold of 1 max")
    for said in ("does not run there unchanged", "HandlerConfig route is /runsync", "model_healthcheck_url is /",
                 "POST https://run.vast.ai/route/", "auth_data", "Phase 03 proves the image with this adapter"):
        assert said in row.reason, said
    data = yaml.safe_load((ROOT / "params" / HANDLER).read_text())
    data["source"], data["target"] = data["target"], {**data["source"], "name": "back", "release": "b"}
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "back.yaml").write_text(dump_yaml(data))
    with pytest.raises(ParamsError, match="source.serverless on Vast.ai: a Vast.ai Serverless endpoint is built as a "
                                          "target only"):
        load_params(tmp_path / "params" / "back.yaml")


def test_e2e_latency_runs_from_the_send_to_the_answer_not_the_endpoints_execution_time() -> None:
    # a serverless endpoint's executionTime leaves out its queue, a cold start and a Vast.ai /route/
    d = pd.DataFrame({"sent_s": [1.0, 2.0], "done_s": [1.5, 2.25], "execution_s": [0.02, 0.02]})
    assert list(goodput.e2e_seconds(d)) == [0.5, 0.25]
    assert list(goodput.e2e_seconds(d.drop(columns=["sent_s"]))) == [0.02, 0.02]  # no send time: what was measured


CHAT = "runpod-to-vast-service.yaml"
LB_SOURCE = {"secrets": [], "serverless": {"type": "LOAD_BALANCER"}}
LB_SERVICE = {"private_image": False, "registry_credential": "", "readiness": {"path": "/ping"}}


@pytest.mark.parametrize(("over", "says"), [
    ({"source": {"secrets": [], "serverless": {"type": "QUEUE"}}, "workload": {"service": LB_SERVICE}},
     r"source.serverless runs a team's Runpod handler .* this workload is protocol 'openai-chat', .*set type: "
     r"LOAD_BALANCER"),
    ({"source": LB_SOURCE, "workload": {"service": {**LB_SERVICE, "readiness": {"path": "/health"}}}},
     r"source.serverless type LOAD_BALANCER: Runpod sends a worker requests only once GET /ping .* answers 200 .*"
     r"readiness.path is '/health'"),
    ({"source": LB_SOURCE, "workload": {"service": LB_SERVICE, "requirements": {"max_request_s": 400}}},
     r"max_request_s = 400 exceeds the 330 s a Runpod load-balancing endpoint serves a request before it answers 524; "
     r"lower max_request_s or run the service on a pod"),
    ({"source": LB_SOURCE, "workload": {"service": {**LB_SERVICE, "readiness": {"path": "/ping", "status": 204}}}},
     r"a worker is healthy when /ping answers 200 .*readiness.status is 204"),
    ({"source": LB_SOURCE, "workload": {"service": {**LB_SERVICE, "env": {"PORT": "9000"}}}},
     r"workload.service.env sets PORT, which a Runpod load-balancing endpoint sets itself to workload.service.port"),
    ({"source": {**LB_SOURCE, "lb_url": "https://{endpoint_id}.x/{pod_id}"}, "workload": {"service": LB_SERVICE}},
     r"lb_url .* has a placeholder other than \{endpoint_id\}"),
    ({"source": LB_SOURCE, "workload": {"service": LB_SERVICE}, "cutover": {"router": {"kind": "haproxy"}}},
     r"the source is a serverless endpoint, reached through its provider's own front door \(Runpod's load balancer"),
])
def test_what_a_load_balancing_endpoint_cannot_serve_is_refused_with_its_fix(tmp_path: Path, over: dict[str, Any],
                                                                            says: str) -> None:
    with pytest.raises(ParamsError, match=says):
        load_params(write_params(tmp_path, CHAT, "m.yaml", **merged(over)))


def test_phase_02_says_how_a_service_leaves_a_load_balancing_endpoint_for_a_pod(tmp_path: Path) -> None:
    mig = load_params(write_params(tmp_path, CHAT, "m.yaml", **merged({"source": LB_SOURCE,
                                                                       "workload": {"service": LB_SERVICE}})))
    row = serving_row(mig.source, mig.target)
    assert row.status == ADAPTER and row.source.startswith("Runpod Serverless LOAD_BALANCER")
    assert "requests routed to workers whose /ping answers 200 and cut at 5.5 min" in row.source
    assert "for the pod's HTTP port: the same paths" in row.reason and "routing by /ping health" in row.reason
    back = serving_row(mig.target, mig.source)
    assert "moves behind Runpod's load balancer" in back.reason and "/ping on PORT_HEALTH" in back.reason


def test_the_redeliver_drill_compares_answers_without_the_replay_marker_wherever_its_path_points() -> None:
    from runbook_lib.phases.compare.drills import redelivered

    class Handler:  # answers from its record on the second delivery, the marker nested in a list
        def __init__(self) -> None:
            self.seen: set[str] = set()

        def runsync(self, job: dict[str, Any]) -> dict[str, Any]:
            again = job["request_id"] in self.seen
            self.seen.add(job["request_id"])
            return {"status": "COMPLETED", "execution_s": 0.01,
                    "output": {"words": 2, "meta": [{"replayed": again, "node": "a"}]}}

    got = redelivered(Handler(), {"text": "to be"}, key_field="request_id", key="k", replayed="meta.0.replayed",  # type: ignore[arg-type]
                      matches=lambda out: out == {"words": 2, "meta": [{"node": "a"}]})
    assert got.verdict == "PASS", got.observation


def test_phase_02_maps_each_runpod_endpoint_setting_to_vast_and_names_what_has_no_equivalent() -> None:
    from runbook_lib.phases.mapping import vast_settings_rows

    mig = load_params(ROOT / "params" / HANDLER)
    rows = {r.dependency.removeprefix("endpoint setting: "): r for r in vast_settings_rows(mig.source, mig.target)}
    assert list(rows) == ["type", "max workers", "min workers and scale to zero", "idle timeout", "execution timeout",
                          "flashboot"]
    assert rows["max workers"].status == EQUIVALENT  # 1 and 1
    assert all(r.status == ADAPTER for n, r in rows.items() if n != "max workers")  # named, never dropped
    assert rows["idle timeout"].target == "none" and "no equivalent" in rows["idle timeout"].reason
    assert rows["min workers and scale to zero"].target.startswith("min_load 1: capacity kept")
    assert rows["execution timeout"].source == "timeout 60 s" and "hung_worker" in rows["execution timeout"].reason
    assert vast_settings_rows(mig.target, mig.source) == []  # only a Runpod endpoint moving to a Vast.ai one
