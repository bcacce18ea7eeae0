"""Providers: one contract suite for local, runpod and vast (``live`` creates nothing: its refusals
are tests/test_live_source.py's), then each remote provider's failure
shapes against recorded-shape fixtures served through an injected httpx transport (no network;
polling and backoff use an injected clock and sleep)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.errors import AuthError, BadRequest, NoCapacity, NotFound, ProviderError, RateLimited, WorkloadError
from runbook_lib.measure.timing import served_status
from runbook_lib.params import PROVIDER_TABLE, load_params
from runbook_lib.providers import REMOTE, create_provider
from runbook_lib.providers.api import KeySource, retry_after_s
from runbook_lib.providers.base import EndpointSpec, PodSpec, plan_start, plan_stop
from runbook_lib.providers.fixtures import FIXTURE_KEY, SOURCE_POD, FixtureApi, fixture_api
from runbook_lib.providers.offers import canonical_gpu, filter_offers

from .conftest import ROOT
from .contract.provider_contract import ProviderContract, ProviderEnv, approve, local_env

PARAMS = load_params(ROOT / "params" / "runpod-to-vast.yaml")
WRITES = ("POST /v2/pods", "DELETE", "PUT /api/v0/asks", "POST /v2/serverless", "POST /graphql")


class Clock:
    """Injected monotonic clock; sleeping advances it."""

    def __init__(self) -> None:
        self.t = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


def remote(name: str, *, script: dict[str, list[str]] | None = None, profile: Any = None,
           probe: Any = lambda h, p: True) -> tuple[Any, FixtureApi, Clock]:
    fake = fixture_api(name, script=script)
    clock = Clock()
    prof = profile or next(p for p in (PARAMS.source, PARAMS.target) if p.provider == name)  # the side it serves
    prov = create_provider(name, profile=prof, transport=fake.transport,
                           key=KeySource(name, ("env:TEST_KEY",), _value=FIXTURE_KEY),
                           clock=clock, sleep=clock.sleep, probe=probe, http_probe=lambda url: True)
    return prov, fake, clock


def writes(fake: FixtureApi) -> int:
    return sum(1 for m, path, _ in fake.requests if any(f"{m} {path}".replace("api.runpod.io", "").replace(
        "console.vast.ai", "").startswith(w) or m == w for w in WRITES))


def ranked(prov: Any) -> tuple[str, ...]:
    offers, _ = filter_offers(prov.search_offers(prov.profile.offer), prov.profile.offer)
    return tuple(o.offer_id for o in offers)


def remote_spec(prov: Any, offers: tuple[str, ...]) -> Any:
    def spec(name: str, labels: tuple[tuple[str, str], ...]) -> PodSpec:
        return PodSpec(name=name, command=("python", "-m", "runbook_lib.workload.job", "agent", "accept"),
                       device="cuda", price_usd_per_hour=0.45, labels=labels, image="ghcr.io/example/agent:1",
                       ports=(f"8000/{prov.capabilities().http_port_protocol}",), offers=offers, disk_gb=40)
    return spec


def remote_endpoint_spec(offers: tuple[str, ...]) -> Any:
    def spec(labels: tuple[tuple[str, str], ...]) -> EndpointSpec:
        # offers: where a load_balancing worker's machine may be rented (a Vast.ai instance, a Runpod pod)
        return EndpointSpec(name="c-endpoint", params_path="p.yaml", side="target", workers=1, price_usd_per_hour=0.3,
                            labels=labels, image="ghcr.io/example/agent:1", gpu_types=("ADA_24",), offers=offers,
                            disk_gb=40)
    return spec


class TestContract(ProviderContract):
    """Every provider in the table that creates resources passes the contract suite."""

    @pytest.fixture(params=[e for e in PROVIDER_TABLE if e.creates],
                    ids=[e.name for e in PROVIDER_TABLE if e.creates])
    def env(self, request: pytest.FixtureRequest, tmp_path: Path, make_params: Any) -> ProviderEnv:
        if not request.param.remote:  # the machine the runbook runs on
            params = make_params(workload={"entry_point": "tests.fixture_workloads:SleepWorkload"},
                                 target={"batch_size": 1, "workers": 1})
            return local_env(tmp_path, params)
        prov, fake, _ = remote(request.param.name)
        offers = ranked(prov)
        fake.requests.clear()
        return ProviderEnv(prov, remote_spec(prov, offers), lambda: writes(fake), remote_endpoint_spec(offers))


def test_the_table_feeds_the_registry_and_the_params_schema() -> None:
    import typing

    from runbook_lib.params import AnyProfile
    from runbook_lib.providers import PROVIDERS

    assert dict(PROVIDERS) == {e.name: e.adapter for e in PROVIDER_TABLE}
    assert set(typing.get_args(AnyProfile)) == {e.profile for e in PROVIDER_TABLE}
    assert REMOTE == {e.name for e in PROVIDER_TABLE if e.remote}
    for e in PROVIDER_TABLE:
        assert e.profile.model_fields["provider"].default == e.name


# -- offers ----------------------------------------------------------------------------------------

def test_canonical_gpu_names_agree_across_providers() -> None:
    assert canonical_gpu("NVIDIA GeForce RTX 4090") == canonical_gpu("RTX 4090") == canonical_gpu("RTX_4090")
    assert canonical_gpu("NVIDIA A100-SXM4-80GB") == canonical_gpu("A100 SXM4") == "A100 SXM"


def test_vast_offers_are_post_filtered_and_normalized() -> None:
    from runbook_lib.offer_query import parse_query

    prov, fake, _ = remote("vast")
    offers = prov.search_offers(PARAMS.target.offer)
    body = fake.requests[0][2]
    # explicit defaults and converted ranges are sent (the server may still ignore them)
    assert body["verified"] == {"eq": True} and body["rentable"] == {"eq": True} and body["rented"] == {"eq": False}
    assert body["gpu_ram"] == {"gte": int(24 * 1024 * 0.98)} and body["cuda_max_good"] == {"gte": 12.4}
    assert body["inet_down"] == {"gte": 200} and body["type"] == "on-demand" and body["allocated_storage"] == 40
    ok, table = filter_offers(offers, PARAMS.target.offer)
    assert [o.offer_id for o in ok] == ["8812345", "8812501"]  # cheapest first (0.40 + 40 GB x 0.20/720)
    why = {r["offer_id"]: r["reasons"] for r in table}
    assert "A100 SXM" in why["8812399"]  # the server returned a GPU we did not ask for
    assert "host CUDA 12.2 below 12.4" in why["8812400"]
    first = ok[0]
    assert first.ram_gib == pytest.approx(257000 * 16 / 64 / 1000)  # host RAM pro-rated to our cores, Vast's GB
    # One unit with the query language users paste: ram_gib_min N accepts the share cpu_ram>=N accepts
    # (the adapter divided by 1024 and the parser multiplied by 1000: 64.25 was refused as 62.7 GiB).
    share_mb = 257000 * 16 / 64
    assert parse_query(f"cpu_ram>={share_mb / 1000}")["cpu_ram"]["gte"] <= share_mb
    req = PARAMS.target.offer.model_copy(update={"ram_gib_min": share_mb / 1000})
    assert "8812345" in [o.offer_id for o in filter_offers(offers, req)[0]]
    assert first.hourly_usd(40) == pytest.approx(0.40 + 40 * 0.20 / 30 / 24)


def test_vast_cli_query_language() -> None:
    from runbook_lib.errors import ParamsError
    from runbook_lib.offer_query import parse_query

    q = parse_query("gpu_name=RTX_4090 num_gpus>=1 cuda_vers>=12.4 cpu_ram>=32 duration>2 dph<0.5 rented=any")
    assert q == {"gpu_name": {"eq": "RTX 4090"}, "num_gpus": {"gte": 1}, "cuda_max_good": {"gte": 12.4},
                 "cpu_ram": {"gte": 32000}, "duration": {"gt": 172800}, "dph_total": {"lt": 0.5}}
    assert parse_query("gpu_name in [RTX_4090,RTX_3090]") == {"gpu_name": {"in": ["RTX 4090", "RTX 3090"]}}
    with pytest.raises(ParamsError, match="cannot parse 'gpu_name~4090'"):
        parse_query("num_gpus>=1 gpu_name~4090")


def test_runpod_catalog_prices_per_gpu_times_count_and_cuda() -> None:
    prov, fake, _ = remote("runpod")
    offers = prov.search_offers(PARAMS.source.offer)
    assert fake.requests[0][1] == "api.runpod.io/v2/catalog/gpus"
    by = {o.gpu_name: o for o in offers}
    assert set(by) == {"RTX 4090", "A100 SXM", "MI300X"}
    assert by["RTX 4090"].usd_per_hour == 0.69 and by["RTX 4090"].cuda_max == "12.8"
    assert by["A100 SXM"].cuda_max == "12.4"  # 12.8 is listed as not available
    assert by["RTX 4090"].vcpu is None  # not in the v2 catalog: re-checked on the canary
    ok, table = filter_offers(offers, PARAMS.source.offer)
    assert [o.gpu_name for o in ok] == ["RTX 4090"]
    assert "no stock" in {r["gpu_name"]: r["reasons"] for r in table}["MI300X"]


# -- launch, capacity, readiness ---------------------------------------------------------------------

def test_vast_capacity_tries_next_offer_and_destroys_a_failed_bid_contract() -> None:
    prov, fake, clock = remote("vast", script={"create": ["gone", "bid_fail", "ok"]})
    spec = remote_spec(prov, ("8812345", "8812501", "8812345"))("canary", (("run_id", "r-cap"),))
    pod = prov.lifecycle.launch(spec)
    outcomes = [(a.offer_id, a.outcome) for a in prov.attempts]
    assert outcomes == [("8812345", "no capacity"), ("8812501", "no capacity"), ("8812345", "ready")]
    left = prov.attempts[1].resource_id
    assert left and ("DELETE", f"console.vast.ai/api/v0/instances/{left}/", {}) in fake.requests
    assert pod.state == "RUNNING" and pod.host["public_ip"] == "203.0.113.51"  # whitespace stripped
    assert pod.host["ports"]["8000/tcp"] == "203.0.113.51:41080"  # HostPort string -> int
    create = [b for m, p, b in fake.requests if m == "PUT" and "/asks/" in p][-1]
    assert create["env"]["-p 8000:8000"] == "1" and create["label"].startswith("runbook:")
    assert "price" not in create  # on-demand: no bid


def test_vast_oci_error_fails_readiness_fast_and_is_destroyed() -> None:
    prov, fake, _ = remote("vast", script={"poll": ["loading", "exited_oci_error"]})
    spec = remote_spec(prov, ("8812345",))("canary", (("run_id", "r-oci"),))
    with pytest.raises(NoCapacity, match="OCI runtime create failed") as exc:
        prov.lifecycle.launch(spec)
    assert "8812345: failed readiness" in str(exc.value)
    assert prov.attempts[0].outcome == "failed readiness"
    assert any(m == "DELETE" for m, _, _ in fake.requests)


def test_readiness_rechecks_the_machine_not_the_offer() -> None:
    prov, fake, _ = remote("vast")
    spec = remote_spec(prov, ("8812345",))("canary", (("run_id", "r-hw"),))
    iid = prov.lifecycle.create_on_offer(spec, "8812345", {})
    fake.state[iid].update(gpu_name="RTX 3090", disk_space=16.0)  # what the host really gave us
    ready = prov.lifecycle.wait_ready(iid, spec, timeout_s=60, poll_s=1)
    assert not ready.ready and ready.final  # waiting cannot fix the wrong machine
    assert any("RTX 3090" in p for p in ready.problems) and any("16.0 GB disk" in p for p in ready.problems)


def test_unreachable_port_times_out_on_injected_clock() -> None:
    prov, _, clock = remote("vast", probe=lambda h, p: False)
    spec = remote_spec(prov, ("8812345",))("canary", (("run_id", "r-port"),))
    iid = prov.lifecycle.create_on_offer(spec, "8812345", {})
    from runbook_lib.errors import ProviderTimeout

    with pytest.raises(ProviderTimeout, match="not reachable"):
        prov.lifecycle.wait_ready(iid, spec, timeout_s=30, poll_s=10)
    assert clock.t >= 30 and clock.slept == [10, 10, 10]


def test_outbid_instance_reports_interruption() -> None:
    prov, fake, _ = remote("vast", script={"poll": ["outbid_stopped"]})
    spec = remote_spec(prov, ("8812345",))("canary", (("run_id", "r-bid"),))
    iid = prov.lifecycle.create_on_offer(spec, "8812345", {})
    pod = prov.get(iid)
    assert pod.state == "STOPPED" and "outbid" in pod.status_detail


def test_runpod_capacity_error_moves_on_and_records_tries() -> None:
    prov, fake, _ = remote("runpod", script={"create": ["capacity", "ok"]})
    spec = remote_spec(prov, ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090"))("canary", (("run_id", "r-rp"),))
    pod = prov.lifecycle.launch(spec)
    assert [a.outcome for a in prov.attempts] == ["no capacity", "ready"]
    assert "no capacity" in prov.attempts[0].detail
    body = [b for m, p, b in fake.requests if m == "POST" and p.endswith("/v2/pods")][-1]
    assert body["cloud"] == "SECURE" and body["gpu"] == {"id": "NVIDIA GeForce RTX 4090", "count": 1}
    assert body["env"]["RUNBOOK_LABELS"] == 'runbook:{"run_id":"r-rp"}' and body["ports"] == ["8000/http"]
    assert pod.host["ports"]["8000/http"] == f"{pod.id}-8000.proxy.runpod.net:443"


def test_runpod_422_is_a_bad_request_with_the_validation_messages() -> None:
    prov, _, _ = remote("runpod", script={"create": ["invalid"]})
    spec = remote_spec(prov, ("NVIDIA GeForce RTX 4090",))("canary", (("run_id", "r-422"),))
    with pytest.raises(BadRequest, match="mutually exclusive"):
        prov.lifecycle.launch(spec)


def test_runpod_429_honours_retry_after_then_succeeds() -> None:
    prov, _, clock = remote("runpod", script={"create": ["rate", "rate", "ok"]})
    spec = remote_spec(prov, ("NVIDIA GeForce RTX 4090",))("canary", (("run_id", "r-429"),))
    prov.lifecycle.launch(spec)
    assert prov.api.waits_s == [2.0, 2.0]


def test_vast_plain_text_429_backs_off_ourselves_then_gives_up() -> None:
    prov, _, clock = remote("vast", script={"search": ["rate"] * 9})
    with pytest.raises(RateLimited, match="still rate limited after 5 retries"):
        prov.search_offers(PARAMS.target.offer)
    assert prov.api.waits_s == pytest.approx([0.15 * 1.5 ** i for i in range(5)])


def test_retry_after_and_ratelimit_headers() -> None:
    assert retry_after_s({"retry-after": "7"}) == 7.0
    assert retry_after_s({"ratelimit": '"minute";r=0;t=30, "hour";r=2900;t=1800'}) == 30.0
    assert retry_after_s({"ratelimit": '"minute";r=12;t=30'}) is None
    assert retry_after_s({}) is None


def test_vast_listing_follows_pages_and_destroy_404_is_gone() -> None:
    prov, fake, _ = remote("vast")
    spec = remote_spec(prov, ("8812345",))("canary", (("run_id", "r-page"),))
    iid = prov.lifecycle.create_on_offer(spec, "8812345", {})
    assert [p.id for p in prov.list(labels={"run_id": "r-page"})] == [iid]  # found on page 2
    for _ in range(2):  # the second answers 404 no_such_instance: already gone, not an error
        plan = prov.plan_destroy(iid, dry_run=False)
        prov.apply(plan, approve(plan))
    assert prov.is_gone(iid) and prov.list(labels={"run_id": "r-page"}) == []


def test_runpod_spot_needs_graphql_option_and_maps_supply_constraint() -> None:
    prof = PARAMS.source.model_copy(update={"runpod_graphql_spot": True})
    prov, fake, _ = remote("runpod", script={"spot": ["supply", "ok"]}, profile=prof)
    spec = PodSpec(name="spot", command=("true",), device="cuda", price_usd_per_hour=0.3, labels=(("run_id", "s"),),
                   image="img:1", offers=("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090"),
                   interruptible_bid_usd_per_hour=0.3)
    with pytest.warns(DeprecationWarning, match="GraphQL is deprecated"):
        pod = prov.lifecycle.launch(spec)
    assert [a.outcome for a in prov.attempts] == ["no capacity", "ready"] and pod.labels["run_id"] == "s"


# -- job API and queue diagnosis ----------------------------------------------------------------------

def test_runpod_job_api_expired_ttl_is_expired_not_a_crash() -> None:
    prov, fake, _ = remote("runpod", script={"job": ["in_queue", "completed", "ttl", "failed"]})
    jobs = prov.job_client("fx0001ep", "")
    job = jobs.run({"text": "hello"})
    assert job["status"] == "IN_QUEUE"
    assert jobs.status(job["id"])["status"] == "IN_QUEUE"
    assert jobs.status(job["id"])["status"] == "COMPLETED"
    assert jobs.status(job["id"])["status"] == "EXPIRED"
    assert "no kernel image" in jobs.status(job["id"])["error"]
    assert jobs.cancel(job["id"])["status"] == "CANCELLED" and jobs.health()["workers"]["unhealthy"] == 2
    assert jobs.retry(job["id"]) == {"id": job["id"], "status": "IN_QUEUE"}  # same id, requeued
    assert jobs.purge_queue()["removed"] == 17
    assert all(p.startswith("api.runpod.ai/v2/fx0001ep/") for _, p, _ in fake.requests)


def test_runpod_job_client_polls_a_runsync_that_answers_early_and_counts_an_empty_completed() -> None:
    # runsync answers IN_PROGRESS (its 90 s wait ran out); /status answers 429 (retried after
    # Retry-After; real waits here, 1.5 s), then COMPLETED with no output: served nothing. A 429 on
    # runsync is not retried.
    prov, fake, _ = remote("runpod", script={"runsync": ["in_progress", "rate"], "job": ["rate", "completed_empty"]})
    jobs = prov.job_client("fx0001ep", "")
    t0 = time.monotonic()
    job = jobs.runsync({"text": "hello"})
    assert job["status"] == "COMPLETED" and "output" not in job and served_status(job) == "NO_OUTPUT"
    assert time.monotonic() - t0 >= 0.5 + 1.0  # the first poll's wait, then the 429's Retry-After
    with pytest.raises(ProviderError, match="rate limited"):
        jobs.runsync({"text": "again"})
    assert [p.rsplit("/", 2)[-2] if "/status/" in p else p.rsplit("/", 1)[-1] for _, p, _ in fake.requests] == \
        ["runsync", "status", "status", "runsync"]


def test_runpod_queue_diagnosis_reads_worker_states() -> None:
    prov, _, _ = remote("runpod", script={"workers": ["unhealthy", "throttled"]})
    plan = prov.plan_endpoint(EndpointSpec(name="ep", params_path="p.yaml", side="target", workers=2,
                                           price_usd_per_hour=0.3, labels=(("run_id", "q"),), image="img:1",
                                           gpu_types=("ADA_24",)), dry_run=False)
    ep = prov.apply(plan, approve(plan))
    with pytest.raises(WorkloadError, match="UNHEALTHY .*crash-looping"):
        prov.diagnose_queue(ep.id)
    with pytest.raises(NoCapacity, match="THROTTLED"):
        prov.diagnose_queue(ep.id)


def test_a_runpod_queue_endpoint_is_created_on_the_pools_of_its_gpu_priority_or_its_offer_gpus() -> None:
    """Serverless selects hardware by pool; a GPU model stands for its pool (Runpod's pool table,
    docs.runpod.io/flash/configuration/gpu-types: RTX 4090 and L4 are ADA_24, A40 is AMPERE_48)."""
    def spec(gpu_types: tuple[str, ...]) -> EndpointSpec:
        return EndpointSpec(name="ep", params_path="p.yaml", side="source", workers=1, price_usd_per_hour=0.3,
                            labels=(("run_id", "pools"),), image="img:1", gpu_types=gpu_types)

    prov, fake, _ = remote("runpod")  # the source profile: offer.gpu_names ["RTX 4090"], no gpu_priority
    plan = prov.plan_endpoint(spec(()), dry_run=False)
    assert plan.spec.gpu_types == ("ADA_24",)  # shown in the plan, covered by its approval
    prov.apply(plan, approve(plan))
    [body] = [b for m, path, b in fake.requests if m == "POST" and path.endswith("/v2/serverless")]
    assert body["gpu"]["pools"] == ["ADA_24"]
    ranked_pools = prov.plan_endpoint(spec(("NVIDIA GeForce RTX 4090", "AMPERE_48", "A40", "HOPPER_141")), dry_run=True)
    assert ranked_pools.spec.gpu_types == ("ADA_24", "AMPERE_48", "HOPPER_141")  # order kept, duplicates dropped
    with pytest.raises(ProviderError, match=r"GPU 'GTX 1080' is in no Serverless pool .* name its pool in the "
                                            r"profile's gpu_priority"):
        prov.plan_endpoint(spec(("GTX 1080",)), dry_run=True)


# -- credentials -------------------------------------------------------------------------------------

def test_missing_key_names_the_references_and_calls_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    fake = fixture_api("runpod")
    prov = create_provider("runpod", profile=PARAMS.source.model_copy(update={"api_key_ref": ""}),
                           transport=fake.transport)
    with pytest.raises(AuthError, match=r"tried env:RUNPOD_API_KEY, file:~/.runpod/config.toml"):
        prov.describe(SOURCE_POD)
    assert fake.requests == []


def test_key_from_runpod_config_toml_and_refused_key_not_echoed(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".runpod").mkdir()
    planted = "rpa_" + "Z9" * 20
    (tmp_path / ".runpod" / "config.toml").write_text(f'[default]\napi_key = "{planted}"\n')
    fake = fixture_api("runpod")
    prov = create_provider("runpod", profile=PARAMS.source.model_copy(update={"api_key_ref": ""}),
                           transport=fake.transport)
    with pytest.raises(AuthError, match="refused") as exc:  # the fake accepts only the fixture key
        prov.describe(SOURCE_POD)
    assert planted not in str(exc.value) and planted not in repr(exc.value.args)


def test_source_description_lists_env_names_never_values() -> None:
    prov, _, _ = remote("runpod")
    d = prov.describe(SOURCE_POD)
    assert d["env_names"] == ["AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "LOG_LEVEL", "MODEL_ID", "RUNPOD_API_KEY"]
    assert d["gpu_name"] == "NVIDIA GeForce RTX 4090" and d["cuda_max"] == "12.8"
    assert "RUNPOD_SECRET" not in repr(d)


def test_not_found_is_translated() -> None:
    prov, _, _ = remote("runpod")
    with pytest.raises(NotFound, match="no pod or endpoint nope"):
        prov.get("nope")


# -- phase 02 against declared capabilities ----------------------------------------------------------

def test_runpod_target_maps_udp_and_long_requests_to_no_equivalent(tmp_path: Path) -> None:
    """Vast -> Runpod for a service with a UDP port and 5-minute HTTP requests: both have no
    equivalent on Runpod (TCP/HTTP only; the HTTP proxy cuts responses at 100 s), which blocks cutover."""
    from types import SimpleNamespace

    import yaml

    from runbook_lib.params import validate
    from runbook_lib.phases import freeze, mapping

    data = yaml.safe_load((ROOT / "params" / "runpod-to-vast.yaml").read_text())
    data["source"], data["target"] = data["target"], data["source"]
    data["target"].pop("pod_id")
    data["workload"]["requirements"].update(ports=[{"port": 8000, "protocol": "http"},
                                                   {"port": 9000, "protocol": "udp"}], max_request_s=300)
    mig = validate(data)
    prov, _, _ = remote("runpod", profile=mig.target)
    vast, _, _ = remote("vast", profile=mig.source)
    ctx = SimpleNamespace(mig=mig, resources=SimpleNamespace(provider=lambda side: prov if side == "target" else vast,
                                                             dry_run=lambda side: True),
                          evidence=SimpleNamespace(write_json=lambda *a: None))
    from runbook_lib.evidence.manifest import read_chain, write_record
    from runbook_lib.evidence.records import Chain, checked

    write_record(tmp_path, "01", status="completed", data=checked("01", {
        "requirements": freeze.requirements(ctx),
        "freeze": {"environment": None, "source_pod": {"cuda_max": "12.8", "image": mig.source.image}}}))
    ctx.records = Chain({r.phase: r for r in read_chain(tmp_path)})
    offers = mapping.target_offers(ctx)
    assert offers is not None and offers.ranked == ("NVIDIA GeForce RTX 4090",)
    rows = {r.dependency: r for r in mapping.dependency_map(ctx, offers)}
    assert rows["port 9000/udp"].status == "no equivalent" and "UDP not supported" in rows["port 9000/udp"].reason
    assert rows["port 8000/http"].status == "no equivalent" and "proxy" in rows["port 8000/http"].reason
    assert rows["memory"].status == "adapter needed"  # the v2 catalog publishes no RAM: re-checked on the canary
    # what a stop keeps and how ports are reached differ between Vast and Runpod: mapped, not assumed
    life, net = rows["lifecycle (stop, restart, interruption)"], rows["network mode"]
    assert life.status == net.status == "adapter needed"
    assert "container disk" in life.source and "/workspace volume" in life.target
    assert "random external port" in net.source and "proxy" in net.target
    gate = mapping.dependency_gate(list(rows.values()))
    assert gate.verdict == "FAIL" and "port 9000/udp" in gate.detail and gate.blocking


@pytest.mark.parametrize("name", ["runpod", "vast"])
def test_stop_then_start_is_planned_and_readiness_rechecks(name: str) -> None:
    prov, fake, _ = remote(name)
    offers = ranked(prov)
    spec = remote_spec(prov, offers[:1])("canary", (("run_id", f"r-ss-{name}"),))
    pod = prov.lifecycle.launch(spec)
    for action, plan_of in (("stop", plan_stop), ("start", plan_start)):
        plan = plan_of(prov, pod.id, dry_run=False)
        assert plan.action == action
        prov.apply(plan, approve(plan))
    assert prov.lifecycle.readiness(prov.get(pod.id), spec).ready  # back, on the hardware asked for
    changes = [(m, path, body) for m, path, body in fake.requests
               if path.endswith("/action") or (m == "PUT" and "/instances/" in path)]
    assert len(changes) == 2, changes  # one stop request, one start request


def test_stopped_instance_still_bills_and_is_destroyed_by_its_plan() -> None:
    prov, fake, _ = remote("vast", script={"poll": ["outbid_stopped"]})
    spec = remote_spec(prov, ("8812345",))("canary", (("run_id", "r-stop"),))
    iid = prov.lifecycle.create_on_offer(spec, "8812345", {})
    assert prov.get(iid).state == "STOPPED"
    [listed] = prov.list(labels={"run_id": "r-stop"})
    assert listed.state == "STOPPED" and listed.price_usd_per_hour > 0  # storage keeps billing
    plan = prov.plan_destroy(iid, dry_run=False)
    prov.apply(plan, approve(plan))
    assert prov.is_gone(iid) and prov.list(labels={"run_id": "r-stop"}) == []


def test_remote_wait_ends_at_the_completion_marker_not_a_container_exit() -> None:
    prov, _, clock = remote("runpod")
    spec = remote_spec(prov, ranked(prov)[:1])("agent", (("run_id", "r-wait"),))
    pod = prov.lifecycle.launch(spec)
    marker = iter([False, False, True])  # the agent's result set appears on the third look
    done = prov.wait_exit(pod.id, timeout_s=600, poll_s=10, finished=lambda: next(marker))
    assert done.state == "RUNNING" and clock.slept == [10, 10]
    from runbook_lib.errors import ProviderTimeout

    with pytest.raises(ProviderTimeout, match="still RUNNING after 30 s"):
        prov.wait_exit(pod.id, timeout_s=30, poll_s=10, finished=lambda: False)


def test_teardown_of_what_the_run_created_needs_no_second_approval(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The launch was approved; destroying that resource is covered (a destroy plan's fingerprint
    names an id no one can know in advance). A resource of another run still needs its own record."""
    from runbook_lib.errors import ApprovalRequired
    from runbook_lib.phases import open_phase

    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "params").mkdir()
    text = (ROOT / "params" / "runpod-to-vast.yaml").read_text().replace("dry_run: true", "dry_run: false")
    (tmp_path / "params" / "m.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    ctx = open_phase("01", str(tmp_path / "params" / "m.yaml"), run_mode="headless")
    prov, fake, _ = remote("runpod", profile=ctx.mig.source)
    ctx.resources.providers["source"] = prov
    spec = remote_spec(prov, ranked(prov)[:1])
    ours = prov.lifecycle.launch(spec("ours", (("run_id", ctx.run_id), ("side", "source"))))
    theirs = prov.lifecycle.launch(spec("theirs", (("run_id", "another-run"), ("side", "source"))))
    ctx.resources.destroy("source", ours.id)
    assert prov.is_gone(ours.id)
    assert ctx.evidence.plans[-1].method == "teardown of a resource this run created under an approved launch"
    assert (ctx.run_dir / "approvals").is_dir()
    with pytest.raises(ApprovalRequired, match="has no approval record"):
        ctx.resources.destroy("source", theirs.id)
    assert not prov.is_gone(theirs.id)


# -- money safety: a create is never retried blindly ------------------------------------------------

def _creates(fake: FixtureApi) -> list[str]:
    return [f"{m} {p}" for m, p, _ in fake.requests
            if (m == "POST" and p.endswith(("/v2/pods", "/v2/serverless"))) or (m == "PUT" and "/asks/" in p)]


@pytest.mark.parametrize("name", ["runpod", "vast"])
def test_a_502_after_create_adopts_the_one_machine_it_made(name: str) -> None:
    prov, fake, _ = remote(name, script={"create": ["created_then_502"]})
    spec = remote_spec(prov, ranked(prov)[:2])("canary", (("run_id", "r-502"), ("role", "canary")))
    pod = prov.lifecycle.launch(spec)
    assert len(_creates(fake)) == 1  # one create request, never a second
    assert [r.id for r in prov.list(labels={"run_id": "r-502"})] == [pod.id]  # exactly one machine
    assert prov.attempts[0].outcome == "adopted" and "found" in prov.attempts[0].detail
    assert prov.attempts[-1].outcome == "ready"


def test_a_502_with_nothing_created_fails_without_a_second_create() -> None:
    # The gateway failed and the listing shows nothing: nothing was created, nothing is retried.
    prov, fake, _ = remote("runpod")
    calls = []

    def gateway(request: Any) -> Any:
        import httpx

        if request.method == "POST" and request.url.path == "/v2/pods":
            calls.append(request.url.path)
            return httpx.Response(502, json={"title": "Bad Gateway", "status": 502})
        return fake.handle(request)

    prov2 = create_provider("runpod", profile=PARAMS.source, transport=__import__("httpx").MockTransport(gateway),
                            key=KeySource("runpod", ("env:TEST_KEY",), _value=FIXTURE_KEY),
                            clock=lambda: 0.0, sleep=lambda s: None, probe=lambda h, p: True)
    spec = remote_spec(prov2, ("NVIDIA GeForce RTX 4090",))("canary", (("run_id", "r-none"),))
    with pytest.raises(ProviderError, match="nothing was created and nothing was retried"):
        prov2.lifecycle.launch(spec)
    assert calls == ["/v2/pods"]


def test_an_endpoint_create_answered_502_is_adopted_not_repeated() -> None:
    prov, fake, _ = remote("runpod", script={"endpoint": ["created_then_502"]})
    plan = prov.plan_endpoint(remote_endpoint_spec(())((("run_id", "r-ep502"), ("role", "endpoint"))), dry_run=False)
    ep = prov.apply(plan, approve(plan))
    assert len(_creates(fake)) == 1
    assert [r.id for r in prov.list(labels={"run_id": "r-ep502"})] == [ep.id]


def test_a_create_is_retried_on_429_only() -> None:
    from runbook_lib.errors import CreateOutcomeUnknown
    from runbook_lib.providers.api import ApiClient

    answers = iter([429, 503])

    def handler(request: Any) -> Any:
        import httpx

        return httpx.Response(next(answers), json={"title": "busy"}, headers={"Retry-After": "0"})

    api = ApiClient(provider="runpod", base_url="https://api.runpod.io", key=KeySource("runpod", ("env:X",),
                    _value=FIXTURE_KEY), transport=__import__("httpx").MockTransport(handler), sleep=lambda s: None)
    with pytest.raises(CreateOutcomeUnknown, match="HTTP 503"):
        api.request("POST", "/v2/pods", body={}, creates=True)
    assert api.waits_s == [0.0]  # the 429 was waited out once, the 503 was not retried


def test_base_urls_come_from_params_then_the_environment_then_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx

    seen: list[str] = []

    def record(request: Any) -> Any:
        seen.append(f"{request.url.scheme}://{request.url.host}:{request.url.port}{request.url.path}")
        return httpx.Response(200, json={"offers": [], "pods": []})

    key = KeySource("x", ("env:TEST_KEY",), _value=FIXTURE_KEY)
    monkeypatch.setenv("RUNBOOK_VAST_API_URL", "http://127.0.0.1:9002")
    vast = create_provider("vast", profile=PARAMS.target, transport=httpx.MockTransport(record), key=key)
    vast.search_offers(PARAMS.target.offer)
    own = PARAMS.target.model_copy(update={"api_url": "http://127.0.0.1:9003/"})
    create_provider("vast", profile=own, transport=httpx.MockTransport(record), key=key).search_offers(own.offer)
    monkeypatch.delenv("RUNBOOK_VAST_API_URL")
    create_provider("vast", profile=PARAMS.target, transport=httpx.MockTransport(record), key=key).search_offers(
        PARAMS.target.offer)
    assert seen == ["http://127.0.0.1:9002/api/v0/bundles/", "http://127.0.0.1:9003/api/v0/bundles/",
                    "https://console.vast.ai:None/api/v0/bundles/"]  # httpx: no explicit port


def test_the_runpod_job_client_sends_the_key_to_the_configured_job_api(monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx

    seen: list[tuple[str, str]] = []

    def record(request: Any) -> Any:
        seen.append((str(request.url), request.headers.get("authorization", "")))
        return httpx.Response(200, json={"workers": {"idle": 1}})

    monkeypatch.setenv("RUNBOOK_RUNPOD_JOB_API_URL", "http://127.0.0.1:9004")
    prov = create_provider("runpod", profile=PARAMS.source, transport=httpx.MockTransport(record),
                           key=KeySource("runpod", ("env:TEST_KEY",), _value=FIXTURE_KEY))
    prov.job_client("ep123", "https://ignored.example/v2/ep123").health()
    assert seen == [("http://127.0.0.1:9004/v2/ep123/health", f"Bearer {FIXTURE_KEY}")]
