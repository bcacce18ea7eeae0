"""Load one migration YAML into typed, frozen models; refuse bad input before anything runs.

Papermill's own parameter coercion is lossy (``-p flag false`` is the string ``'false'``), so
notebooks receive only the path of the params file and call :func:`load_params` themselves.
The YAML is read with a loader that keeps ``no``/``yes``/``on``/``off`` and dates as strings
(YAML 1.2 behaviour), so a region called ``no`` stays ``"no"``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from runbook_lib.errors import ParamsError
from runbook_lib.layout import POD_CANDIDATE_ENV, project_root
from runbook_lib.offer_query import parse_query
from runbook_lib.secret_refs import credential_findings

Device = Annotated[str, Field(pattern=r"^(cpu|cuda|cuda:\d+)$")]
DType = Literal["float32", "bfloat16", "float16"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SecretRef(_Model):
    """A credential named by reference; the value is resolved at run time, never stored.

    Attributes:
        name: the environment variable the workload receives it as (``HF_TOKEN``).
        ref: where its value is read at run time: ``env:VARNAME`` or ``file:/path/to/secret``.
        required: a value that cannot be resolved here is a ``no equivalent`` row of phase 02's
            map, which blocks the cutover (an optional one is recorded as not set).
    """

    name: str = Field(pattern=r"^[A-Z][A-Z0-9_]*$")
    ref: str = Field(pattern=r"^(env:[A-Za-z_][A-Za-z0-9_]*|file:.+)$")
    required: bool = False


class Port(_Model):
    """A port the workload listens on, with its transport protocol.

    Attributes:
        port: the port number inside the container.
        protocol: ``tcp``, ``udp`` or ``http``; phase 02 maps a UDP port as ``no equivalent``
            where the target's provider exposes none.
    """

    port: int = Field(ge=1, le=65535)
    protocol: Literal["tcp", "udp", "http"] = "tcp"


class Requirements(_Model):
    """What the workload needs from a host (phase 01 records, phase 02 maps).

    Units: ``shm_gb`` and ``disk_gb`` in GB (10**9 bytes); ``max_request_s`` in seconds.
    ``loader_workers``: data-loader worker processes the workload starts; each passes batches
    through ``/dev/shm``, so phase 03 refuses a target without one when it is above 0.

    Attributes:
        ports: the ports the workload listens on (:class:`Port`).
        shm_gb: shared memory (``/dev/shm``) it needs, GB; phase 03 compares the target's.
        loader_workers: data-loader worker processes it starts (see above).
        disk_gb: container disk it needs, GB.
        memory_gb: host RAM it needs, GB.
        gpu_memory_gb: GPU memory it needs, GB (0: no GPU needed).
        max_request_s: the latency SLO of one request, seconds: the ``latency_slo`` gate's bound,
            blocking when set in params.
        docker_compose: it needs Docker Compose on the host (phase 02 maps it against the
            target provider's capabilities).
        privileged: it needs a privileged container (mapped the same way).
        persistent_volume: it keeps state on a volume that must survive a restart.
    """

    ports: tuple[Port, ...] = ()
    shm_gb: float = Field(default=0.0, ge=0)
    loader_workers: int = Field(default=0, ge=0, le=1024)
    disk_gb: float = Field(default=1.0, ge=0)
    memory_gb: float = Field(default=1.0, ge=0)
    gpu_memory_gb: float = Field(default=0.0, ge=0)
    max_request_s: float = Field(default=30.0, gt=0)
    docker_compose: bool = False
    privileged: bool = False
    persistent_volume: bool = True


class OfferSpec(_Model):
    """Requirement ranges a remote target's offer must meet (phase 02 filters and ranks offers with
    them; the canary re-checks them on the machine it got).

    Units: VRAM and RAM in GiB; disk in GB (allocated at create, fixed for the life of a Vast
    instance); prices in USD per hour for the whole machine.

    Attributes:
        gpu_names: acceptable GPU models (any spelling: ``RTX 4090``, ``NVIDIA GeForce RTX 4090``);
            empty accepts any.
        cuda_min: the host driver must support at least this CUDA version (``"12.4"``).
        interruptible: rent at the interruptible (bid / spot) price. Runpod spot needs the
            deprecated GraphQL API and ``runpod_graphql_spot``.
        regions: data center ids, country codes or city names; empty accepts any.
        cloud: Runpod cloud (``SECURE`` or ``COMMUNITY``); always sent, the default is disputed.
        query: extra Vast.ai filters in the CLI's query language
            (``gpu_name=RTX_4090 num_gpus>=1 cuda_vers>=12.4``); RAM inputs in GB.
        gpu_count_min, gpu_count_max: how many GPUs the machine may have.
        vram_gib_min: GPU memory per GPU, at least, GiB.
        vcpu_min: virtual CPUs, at least.
        ram_gib_min: host RAM, at least, GiB.
        disk_gb: container disk to allocate, GB (fixed at create for a Vast.ai instance).
        max_usd_per_hour: the most the whole machine may cost per hour (None: no cap).
        reliability_min: Vast.ai's host reliability score, at least (0 to 1).
        max_tries: ranked offers tried when one has no capacity.
        capacity_budget_s: wall-clock budget for getting a ready canary across those tries, seconds.
        ready_timeout_s: how long one launch may take to become ready, seconds.
    """

    gpu_names: tuple[str, ...] = ()
    gpu_count_min: int = Field(default=1, ge=0)
    gpu_count_max: int = Field(default=8, ge=0)
    vram_gib_min: float = Field(default=0.0, ge=0)
    vcpu_min: float = Field(default=0.0, ge=0)
    ram_gib_min: float = Field(default=0.0, ge=0)
    disk_gb: float = Field(default=20.0, ge=8)
    cuda_min: str = Field(default="", pattern=r"^(|\d+(\.\d+){0,2})$")
    max_usd_per_hour: float | None = Field(default=None, gt=0)
    interruptible: bool = False
    regions: tuple[str, ...] = ()
    reliability_min: float = Field(default=0.0, ge=0, le=1)
    cloud: Literal["SECURE", "COMMUNITY"] = "SECURE"
    query: str = ""
    max_tries: int = Field(default=3, ge=1, le=50)
    capacity_budget_s: float = Field(default=900.0, gt=0)
    ready_timeout_s: float = Field(default=1200.0, gt=0)

    @field_validator("query")
    @classmethod
    def _query_parses(cls, v: str) -> str:
        if v:
            try:
                parse_query(v)
            except ParamsError as exc:
                raise ValueError(str(exc).removeprefix("offer.query: ")) from None
        return v

    @model_validator(mode="after")
    def _ranges(self) -> "OfferSpec":
        if self.gpu_count_min > self.gpu_count_max:
            raise ValueError(f"gpu_count_min ({self.gpu_count_min}) is above gpu_count_max ({self.gpu_count_max})")
        return self


CONSTRAINT_MINIMUMS = ("gpu_count_min", "vram_gib_min", "vcpu_min", "ram_gib_min", "disk_gb", "reliability_min")
"""The offer requirements an alternate may raise but never lower (:func:`relaxed_constraints`):
seed 001's error table, "Target capacity violates policy: delay or approve a documented
alternate; do not weaken constraints silently"."""


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".")) if v else ()


def relaxed_constraints(target: Any, alternate: Any) -> list[str]:
    """Every way ``alternate`` (a target profile) would weaken what ``target`` requires, one
    sentence each; empty when it keeps them all. The constraints: the offer minimums of
    :data:`CONSTRAINT_MINIMUMS` and ``offer.cuda_min`` (at least the target's), and the same
    device kind (``cpu`` or ``cuda``) and compute dtype. What may differ (provider, GPU model,
    cloud, region, price, endpoint mode) is shown by :func:`profile_differences`."""
    out = []
    t, a = target.offer, alternate.offer
    for name in CONSTRAINT_MINIMUMS:
        if getattr(a, name) < getattr(t, name):
            out.append(f"offer.{name} {getattr(a, name):g} is below the target's {getattr(t, name):g}")
    if _version(a.cuda_min) < _version(t.cuda_min):
        out.append(f"offer.cuda_min {a.cuda_min or 'unset'!r} is below the target's {t.cuda_min!r}")
    if alternate.device.split(":")[0] != target.device.split(":")[0]:
        out.append(f"device {alternate.device!r} is not the target's kind ({target.device!r})")
    if alternate.dtype != target.dtype:
        out.append(f"dtype {alternate.dtype!r} differs from the target's {target.dtype!r} (parity tolerances "
                   "follow the dtype)")
    return out


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): value}


PLUMBING = frozenset({"name", "release", "api_url", "api_key_ref", "poll_s", "dry_run", "secrets"})
"""Profile settings :func:`profile_differences` leaves out: names, and how the runbook reaches a
provider's API rather than what runs."""


def profile_differences(target: Any, alternate: Any) -> list[str]:
    """What ``alternate`` changes against ``target``, one ``field: before -> after`` per setting
    both profiles have (nested settings dotted, ``offer.gpu_names``), the provider first when it
    changes; the names, release texts and API plumbing (:data:`PLUMBING`) are left out, and so
    are settings only one provider's profile has (its API's addresses)."""
    before, after = (_leaves({k: v for k, v in p.model_dump(mode="json").items() if k not in PLUMBING})
                     for p in (target, alternate))
    keys = sorted(set(before) & set(after), key=lambda k: (k != "provider", k))
    def shown(v: Any) -> str:
        return "(none)" if v in ("", [], None) else str(v)

    return [f"{k}: {shown(before[k])} -> {shown(after[k])}" for k in keys if before[k] != after[k]]


def _env_names(v: dict[str, str]) -> dict[str, str]:
    """A service's environment, checked: NAME-shaped keys, none of the runbook's own ``RUNBOOK_*``."""
    bad = [k for k in v if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
    if bad:
        raise ValueError(f"environment names {bad} are not NAME-shaped (letters, digits, _)")
    runbook = [k for k in v if k.upper().startswith("RUNBOOK_")]
    if runbook:
        raise ValueError(f"{runbook}: RUNBOOK_* variables are the runbook's own; a service runs unchanged and "
                         "gets none of them")
    return v


_CRON = re.compile(r"^\s*(@(?:yearly|annually|monthly|weekly|daily|midnight|hourly)|(?:\S+\s+){4}\S+)\s+\S")
"""A crontab entry: five time fields (or an ``@`` keyword) and a command (crontab(5))."""


class ScheduleParams(_Model):
    """One thing that starts the workload on a schedule (``source.schedules``), and how phase 05
    points it at the target after the last cutover step (:mod:`runbook_lib.traffic.schedules`).

    Attributes:
        name: the schedule's name in evidence.
        kind: ``airflow`` (a DAG, read and changed over Airflow's REST API), ``cron`` (a line in
            a crontab file) or ``command`` (a user's read and set commands).
        api_url: ``airflow``: the Airflow API server's base URL (``http://host:8080``).
        dag_id: ``airflow``: the DAG that starts the workload on the source.
        shift: ``airflow``: ``pause`` (``dag_id`` is paused and the target's pre-existing
            ``target_dag_id`` unpaused) or ``variable`` (the Airflow Variable ``variable``, which
            the DAG reads, goes from ``source_value`` to ``target_value``; the DAG stays).
        target_dag_id: ``airflow`` with ``shift: pause``: the target's DAG, already deployed and paused.
        variable, source_value, target_value: ``airflow`` with ``shift: variable``.
        username_env, password_env: ``airflow``: the names of the environment variables that
            hold the API user and password (exchanged for a token at ``POST /auth/token``);
            token_env: or the name of one that holds a bearer token. Never the values.
        file: ``cron``: the crontab file the runbook edits (relative to the project, or absolute).
        line: ``cron``: the source's entry as the file has it; target_line: the entry that
            starts the target instead.
        read_command: ``command``: argv printing JSON ``{"side": "source" | "target" | "both" |
            "neither", "schedule": "..."}`` (``schedule``, optional: when it runs).
        set_command: ``command``: argv with ``{side}``, replaced by ``source`` or ``target``,
            that points the schedule at that side; must exit 0.
    """

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    kind: Literal["airflow", "cron", "command"]
    api_url: str = Field(default="", max_length=512)
    dag_id: str = Field(default="", max_length=250)
    shift: Literal["pause", "variable"] = "pause"
    target_dag_id: str = Field(default="", max_length=250)
    variable: str = Field(default="", max_length=250)
    source_value: str = Field(default="", max_length=1000)
    target_value: str = Field(default="", max_length=1000)
    username_env: str = Field(default="", pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$")
    password_env: str = Field(default="", pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$")
    token_env: str = Field(default="", pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$")
    file: str = Field(default="", max_length=1024)
    line: str = Field(default="", max_length=2000)
    target_line: str = Field(default="", max_length=2000)
    read_command: tuple[str, ...] = ()
    set_command: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _complete(self) -> "ScheduleParams":
        need = {"airflow": ("api_url", "dag_id", *(("target_dag_id",) if self.shift == "pause" else
                                                  ("variable", "source_value", "target_value"))),
                "cron": ("file", "line", "target_line"), "command": ("read_command", "set_command")}[self.kind]
        missing = [n for n in need if not getattr(self, n)]
        if missing:
            raise ValueError(f"schedule {self.name!r} (kind {self.kind}"
                             f"{', shift ' + self.shift if self.kind == 'airflow' else ''}) needs {', '.join(missing)}")
        read = (*need, "name", "kind", *(("shift",) if self.kind == "airflow" else ()))
        given = [n for n in self.model_fields_set if n not in read and getattr(self, n)]
        allowed = {"airflow": {"username_env", "password_env", "token_env"}}.get(self.kind, set())
        stray = sorted(set(given) - allowed)
        if stray:
            raise ValueError(f"schedule {self.name!r}: {', '.join(stray)} {'is' if len(stray) == 1 else 'are'} not read "
                             f"for kind {self.kind}{' with shift ' + self.shift if self.kind == 'airflow' else ''}; "
                             f"remove {'it' if len(stray) == 1 else 'them'}")
        if self.kind == "airflow":
            why = _url_problem(self.api_url)
            if why:
                raise ValueError(f"schedule {self.name!r}: api_url {self.api_url!r} is not a usable http(s) URL: {why}")
            if self.token_env and (self.username_env or self.password_env):
                raise ValueError(f"schedule {self.name!r}: give token_env, or username_env and password_env, not both")
            if bool(self.username_env) != bool(self.password_env):
                raise ValueError(f"schedule {self.name!r}: username_env and password_env go together")
            if self.shift == "pause" and self.target_dag_id == self.dag_id:
                raise ValueError(f"schedule {self.name!r}: target_dag_id is dag_id ({self.dag_id!r}); pausing one DAG "
                                 "and unpausing the same one moves nothing: name the target's own DAG")
            if self.shift == "variable" and self.source_value == self.target_value:
                raise ValueError(f"schedule {self.name!r}: source_value and target_value are both "
                                 f"{self.source_value!r}: the variable would not move the schedule")
        if self.kind == "cron":
            for field in ("line", "target_line"):
                text = getattr(self, field)
                if "\n" in text or text.lstrip().startswith("#") or not _CRON.match(text):
                    raise ValueError(f"schedule {self.name!r}: {field} {text!r} is not one crontab entry (five time "
                                     "fields or an @keyword, then the command; crontab(5))")
            if self.line.strip() == self.target_line.strip():
                raise ValueError(f"schedule {self.name!r}: line and target_line are the same entry; target_line is "
                                 "the entry that starts the target instead")
        if self.kind == "command" and "{side}" not in " ".join(self.set_command):
            raise ValueError(f"schedule {self.name!r}: set_command {list(self.set_command)} has no {{side}}: the "
                             "runbook fills it with source or target")
        return self


class ProfileBase(_Model):
    """What every side of a migration declares, whatever runs it: where the workload runs is
    chosen by ``provider``, which selects one of :data:`PROVIDER_TABLE`'s profile models.

    Attributes:
        provider: registry name of the provider (a :data:`PROVIDER_TABLE` row).
        name: the side's name in evidence.
        release: human-readable release the receipt names (image tag, git ref).
        device: ``cpu``, ``cuda`` or ``cuda:N``.
        dtype: compute dtype of the workload on this side.
        threads: torch intra-op threads per worker process.
        batch_size: requests per forward pass (inference) or samples per step (training), per
            process: a training job's global batch is ``batch_size * world_size``.
        world_size: a training job's data-parallel processes on one pod (torchrun's
            ``--nproc-per-node``): 1 runs the job in one process; more runs it with
            ``torch.distributed`` (DistributedDataParallel; gloo on CPU, NCCL on CUDA), which the
            workload's class must support (:attr:`runbook_lib.workload.AcceptanceWorkload.distributed`).
        workers: endpoint worker processes (inference only): the maximum the endpoint runs.
        active_workers: workers kept running whatever the traffic (Runpod's ``workers.min``,
            "active workers"); None: all ``workers``. Idle warm workers bill: phase 04's cost per
            accepted unit at the declared traffic (``measure.traffic_per_s``) includes them.
        idle_timeout_s: seconds a worker beyond the active ones stays up after its last job
            (Runpod's ``idleTimeout``, 5 s by default), seconds.
        model_cache: where workers find the model at start (``""`` none: downloaded or baked in
            the image; ``volume``: a network or local volume; ``hf:<model id>``: the provider's
            model cache). Declared and mapped in phase 02 (it changes cold starts); no adapter
            applies it, and phase 02 says so: set it on the provider's endpoint.
        gpu_priority: GPU types a worker may run on, most preferred first: Runpod Serverless pool
            ids (``ADA_24``) or GPU models, each standing for its pool; a Runpod queue endpoint is
            created with them as ``gpu.pools`` (empty: the pools of ``offer.gpu_names``); mapped
            in phase 02.
        endpoint_mode: how phase 04 serves an inference workload on this side (issue 12's
            names): ``queue`` (a front door with job ids, a backlog and retries: Runpod
            Serverless queue endpoints, the local front door) or ``load_balancing`` (requests
            go over HTTP straight to a worker: no backlog, no retries, the caller owns both;
            on Vast.ai, an instance's mapped port). Phase 02 maps one side's mode to the
            other's and names the adapter when they differ.
        price_usd_per_hour: on-demand price of one pod / worker, USD per hour.
        storage_usd_per_gb_month: volume price, USD per GB-month.
        egress_usd_per_gb: data-out price, USD per GB.
        secrets: secrets the workload needs, by name and reference (never by value).
        service_env: ``kind: service``: environment values this side's service gets beside
            ``workload.service.env`` (where this side keeps its model, say); not secrets.
        schedules: the source only: what starts the workload on a schedule
            (:class:`ScheduleParams`), frozen in phase 01, mapped in 02, pointed at the target in
            05 and back at the source on a rollback.
    """

    provider: str
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9-]*$")
    release: str = Field(min_length=1)
    device: Device = "cpu"
    dtype: DType = "float32"
    threads: int = Field(default=1, ge=1, le=256)
    batch_size: int = Field(default=8, ge=1, le=4096)
    world_size: int = Field(default=1, ge=1, le=64)
    workers: int = Field(default=1, ge=1, le=16)
    active_workers: int | None = Field(default=None, ge=0, le=16)
    idle_timeout_s: float = Field(default=5.0, gt=0, le=3600)
    model_cache: str = Field(default="", pattern=r"^(|volume|hf:[A-Za-z0-9_.\-/]+)$")
    gpu_priority: tuple[str, ...] = ()
    endpoint_mode: Literal["queue", "load_balancing"] = "queue"
    price_usd_per_hour: float = Field(ge=0, le=1000)
    storage_usd_per_gb_month: float = Field(default=0.0, ge=0)
    egress_usd_per_gb: float = Field(default=0.0, ge=0)
    secrets: tuple[SecretRef, ...] = ()
    service_env: dict[str, str] = Field(default_factory=dict)
    schedules: tuple[ScheduleParams, ...] = ()

    @field_validator("service_env")
    @classmethod
    def _service_env_names(cls, v: dict[str, str]) -> dict[str, str]:
        return _env_names(v)

    @model_validator(mode="after")
    def _active_within_max(self) -> "ProfileBase":
        if self.active_workers is not None and self.active_workers > self.workers:
            raise ValueError(f"active_workers ({self.active_workers}) exceeds workers ({self.workers}), the most the "
                             "endpoint runs; lower active_workers or raise workers")
        return self

    @property
    def warm_workers(self) -> int:
        """Workers kept running whatever the traffic: ``active_workers``, else all ``workers``."""
        return self.workers if self.active_workers is None else self.active_workers

    @property
    def remote(self) -> bool:
        """True for a provider that rents real machines (dry-run by default, a key needed)."""
        return False


class LocalOffer(_Model):
    """One machine a local side may be placed on: the local provider's stand-in for a
    marketplace offer (a CPU machine, no GPUs). Units: RAM in GiB, disk in GB, price in USD per
    hour for the machine.

    Attributes:
        offer_id: the offer's name, unique within the profile.
        vcpu: CPU cores the machine gives the side.
        ram_gib: memory, GiB.
        disk_gb: disk, GB.
        usd_per_hour: price of the machine, USD per hour.
    """

    offer_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    vcpu: float = Field(gt=0, le=1024)
    ram_gib: float = Field(gt=0)
    disk_gb: float = Field(gt=0)
    usd_per_hour: float = Field(ge=0, le=1000)


class LocalProfile(ProfileBase):
    """The embedded local provider: pods and endpoints are processes on this machine.

    Attributes:
        fault: deliberate fault for drills and tests (``none`` in real migrations):
            ``corrupt_checkpoint`` flips a byte of each artifact the canary downloads,
            ``worker_crash`` kills an endpoint worker every 7 requests, ``slow_worker`` adds
            0.5 s to every batch an endpoint worker serves, ``duplicate_side_effects`` is a broken
            handler that never looks up its idempotency record (a redelivered job runs twice);
            a training job's that its drills must catch: ``ignore_sigterm`` (it never saves on a
            preemption notice), ``no_watchdog`` (its step watchdog never starts) and
            ``resume_unverified`` (it resumes from its newest checkpoint file unchecked).
        offers: machines a local target may be placed on (:class:`LocalOffer`). Phase 02 ranks
            those that meet ``offer`` as it ranks a remote target's offers (cheapest first,
            :func:`runbook_lib.providers.offers.filter_offers`), and phase 04's
            ``preferred_offer_removed`` drill withdraws the first-ranked one from the provider and
            plans again. Empty: the side is this one machine and that drill is INCONCLUSIVE. Every
            local pod and worker still runs on this host, billed at ``price_usd_per_hour``.
        offer: requirement ranges those offers must meet (:class:`OfferSpec`; ``gpu_count_min``
            is 0 here, since local machines have no GPUs).
    """

    provider: Literal["local"] = "local"
    fault: Literal["none", "corrupt_checkpoint", "worker_crash", "slow_worker", "duplicate_side_effects",
                   "ignore_sigterm", "no_watchdog", "resume_unverified"] = "none"
    offers: tuple[LocalOffer, ...] = ()
    offer: OfferSpec = Field(default_factory=lambda: OfferSpec(gpu_count_min=0))

    @field_validator("offer", mode="before")
    @classmethod
    def _no_gpus_by_default(cls, v: Any) -> Any:
        # a local machine has no GPUs: an offer section that does not say otherwise asks for none
        return {"gpu_count_min": 0, **v} if isinstance(v, dict) else v

    @model_validator(mode="after")
    def _offers_consistent(self) -> "LocalProfile":
        ids = [o.offer_id for o in self.offers]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"offers names {twice} more than once; give each machine its own offer_id")
        if "offer" in self.model_fields_set and not self.offers:
            raise ValueError("offer sets requirements for the machines in offers, and offers is empty: declare the "
                             "machines (offers) or remove offer")
        return self


class RemoteProfile(ProfileBase):
    """A provider that rents real machines running a container image.

    Attributes:
        image: container image remote pods run (it must contain this package); for ``kind:
            service`` leave it out (or give ``workload.service.image`` again): the service's own
            image runs.
        api_key_ref: reference of the provider API key (``env:VAR`` / ``file:/path``); empty
            uses the provider's standard places (Runpod: ``env:RUNPOD_API_KEY``,
            ``~/.runpod/config.toml``; Vast.ai: ``env:VAST_API_KEY``,
            ``~/.config/vastai/vast_api_key``, ``~/.vast_api_key``).
        dry_run: only plan: every launch, stop and destroy is shown and recorded, nothing is
            applied. The default; set ``false`` and supply approvals to apply.
        pod_id: the existing source pod / instance that runs today (remote source); phase 01
            records what the provider reports about it.
        offer: requirement ranges for the target's offer (remote target).
        api_url: the provider API's base URL; empty: the environment variable the adapter names
            (``RUNBOOK_RUNPOD_API_URL``, ``RUNBOOK_VAST_API_URL``), else the provider's own
            address. A rehearsal points it at a simulator.
        poll_s: seconds between status reads while waiting for a machine to be ready or a job
            pod to finish (each read is one API request, within the provider's rate limits; a
            rehearsal's simulators answer at once and are polled every second).
    """

    image: str = Field(default="", max_length=512, pattern=r"^[^\s]*$",
                       description="a tag or digest of an image that contains this package")
    api_key_ref: str = Field(default="", pattern=r"^(|env:[A-Za-z_][A-Za-z0-9_]*|file:.+)$")
    dry_run: bool = True
    pod_id: str = Field(default="", pattern=r"^[A-Za-z0-9_-]{0,64}$")
    offer: OfferSpec = OfferSpec()
    api_url: str = Field(default="", pattern=r"^(|https?://[^\s]+)$")
    poll_s: float = Field(default=10.0, gt=0, le=600)

    @property
    def remote(self) -> bool:
        return True


LB_MAX_REQUEST_S = 330.0
"""The longest request a Runpod load-balancing endpoint serves before it answers 524, seconds
(docs.runpod.io/serverless/load-balancing/overview: "longer than 5.5 minutes")."""
RUNPOD_LB_ENV_NAMES = ("PORT", "PORT_HEALTH")
"""What a Runpod load-balancing endpoint's worker is told in its environment: the port of its
server and of its ``/ping`` (the same page; Runpod's default is 80 for both)."""
LB_PING = "/ping"
"""A Runpod load-balancing worker's health route, on port ``PORT_HEALTH``: 200 healthy, 204
initializing, anything else unhealthy (the same page)."""


class RunpodServerless(_Model):
    """A Runpod Serverless endpoint that serves this side's service (``workload.kind: service``),
    created with REST v2 ``POST /v2/serverless`` (docs/reference/providers.md 2.2) from the team's
    image. The endpoint's scaling is the profile's: ``workers`` is ``workers.max``,
    ``active_workers`` ``workers.min`` (None: 0, scale to zero), ``idle_timeout_s``
    ``workers.idleTimeout``, ``gpu_priority`` the GPU pools.

    * ``QUEUE`` (``protocol: runpod-handler``): the team's handler image as Runpod runs it, its
      queue fed by the job API (``https://api.runpod.ai/v2/{endpoint_id}/runsync``, the Runpod API
      key as Bearer auth) instead of a pod's ``--rp_serve_api`` port.
    * ``LOAD_BALANCER`` (``openai-chat`` or ``http-json``): Runpod routes each HTTP request
      straight to a worker's server at ``https://{endpoint_id}.api.runpod.ai/<path>`` (the same
      Bearer auth), no queue and no retries; a worker gets requests once ``GET /ping`` on its
      ``PORT_HEALTH`` answers 200 (:data:`LB_PING`), and the endpoint sets ``PORT`` and
      ``PORT_HEALTH`` to ``workload.service.port``. A request longer than 5.5 min is cut (524).

    The endpoint runs the image's own entry point: ``POST /v2/serverless`` takes no command, so
    ``workload.service.command`` applies to pod sides only, and the launch record says so.

    Attributes:
        type: ``QUEUE`` or ``LOAD_BALANCER`` (above).
        execution_timeout_s: the endpoint's ``timeout``: a queue job running longer is TIMED_OUT
            and its worker replaced, seconds (Runpod: 5 s to 7 days); sent for a load-balancing
            endpoint too, whose requests Runpod cuts at 5.5 min whatever it says.
        flashboot: Runpod's ``flashboot`` setting (``OFF``, ``FLASHBOOT``,
            ``PRIORITY_FLASHBOOT``), sent as is and frozen as Runpod reports it.
    """

    type: Literal["QUEUE", "LOAD_BALANCER"] = "QUEUE"
    execution_timeout_s: float = Field(default=600.0, ge=5, le=7 * 86_400)
    flashboot: Literal["OFF", "FLASHBOOT", "PRIORITY_FLASHBOOT"] = "OFF"


class RunpodProfile(RemoteProfile):
    """Runpod (REST v2 pods and serverless endpoints).

    Attributes:
        serverless: ``kind: service`` only: the service runs on a Runpod Serverless endpoint
            (:class:`RunpodServerless`), not on a pod; None: on a pod.
        runpod_graphql_spot: allow spot pods through the deprecated GraphQL API (retiring early
            2027); a warning is recorded.
        job_api_url: base URL of the serverless job API; empty: ``RUNBOOK_RUNPOD_JOB_API_URL``,
            else ``https://api.runpod.ai``.
        proxy_url: a pod's HTTP port through Runpod's proxy, with ``{pod_id}`` and ``{port}``;
            empty: ``RUNBOOK_RUNPOD_PROXY_URL``, else ``https://{pod_id}-{port}.proxy.runpod.net``.
        lb_url: a load-balancing endpoint's base URL, with ``{endpoint_id}``; empty:
            ``RUNBOOK_RUNPOD_LB_URL``, else ``https://{endpoint_id}.api.runpod.ai``.
    """

    provider: Literal["runpod"] = "runpod"
    serverless: RunpodServerless | None = None
    runpod_graphql_spot: bool = False
    job_api_url: str = Field(default="", pattern=r"^(|https?://[^\s]+)$")
    proxy_url: str = Field(default="", pattern=r"^(|https?://[^\s]*\{pod_id\}[^\s]*)$")
    lb_url: str = Field(default="", pattern=r"^(|https?://[^\s]*\{endpoint_id\}[^\s]*)$")

    @field_validator("lb_url")
    @classmethod
    def _lb_url_formats(cls, v: str) -> str:
        try:
            v.format(endpoint_id="x")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"lb_url {v!r} has a placeholder other than {{endpoint_id}} ({type(exc).__name__}: "
                             f"{exc}); write it as https://{{endpoint_id}}.api.runpod.ai") from None
        return v

    @model_validator(mode="after")
    def _spot_needs_graphql(self) -> "RunpodProfile":
        if self.offer.interruptible and not self.runpod_graphql_spot:
            raise ValueError("Runpod REST v2 has no spot pods; set runpod_graphql_spot: true to use the deprecated "
                             "GraphQL API (retiring early 2027), or offer.interruptible: false")
        return self


class PyWorkerAdapter(_Model):
    """The adapter a Vast.ai Serverless worker needs in front of a team's server: Vast's PyWorker
    (docs.vast.ai "The PyWorker"; ``vastai`` 1.9.1 ``serverless/server/worker.py``), from the
    team's PyWorker repository, whose ``worker.py`` builds a ``WorkerConfig`` with one
    ``HandlerConfig``. Clients no longer call the server: they ask the autoscaler's ``/route/``
    for a worker, then POST ``{"auth_data", "payload"}`` to that worker's ``route``; the PyWorker
    checks the autoscaler's signature and forwards ``payload`` to the server's same route.

    The runbook passes these to the worker's environment (the template's ``env``):
    ``PYWORKER_REPO``, ``PYWORKER_ROUTE`` and ``PYWORKER_HEALTHCHECK``, for its ``worker.py`` to
    read, and phase 02 names them as the adapter; phase 03 proves the image with it.

    Attributes:
        repo: the git URL of the PyWorker repository the worker starts (Vast's ``PYWORKER_REPO``).
        route: ``HandlerConfig.route``: the path clients POST to, forwarded to the server's same
            path (``/runsync`` for a Runpod handler under the SDK's HTTP API).
        healthcheck: ``WorkerConfig.model_healthcheck_url``'s path on the server: the worker is
            loaded once it answers 200 (``/`` for the SDK's HTTP API).
    """

    repo: str = Field(min_length=1, max_length=512, pattern=r"^(https://|git@)[^\s]+$")
    route: str = Field(default="/runsync", pattern=r"^/[^\s]*$")
    healthcheck: str = Field(default="/", pattern=r"^/[^\s]*$")


class VastServerless(_Model):
    """A Vast.ai Serverless endpoint and its workergroup that serve this side's service
    (``workload.kind: service`` with ``protocol: runpod-handler``; the target only): the endpoint
    (``POST /api/v0/endptjobs/``) with these scaling parameters, a template of the service's
    image and environment with the PyWorker adapter (``POST /api/v0/template/``), and a
    workergroup (``POST /api/v0/autojobs/``) that rents workers matching the profile's
    ``offer`` (docs.vast.ai "Serverless Parameters", "Create Endpoints and Workergroups";
    ``vastai`` 1.9.1 ``api/endpoints.py``).

    Attributes:
        max_workers: the most workers, active and inactive.
        cold_workers: workers kept loaded (active or stopped) when there is no load (the
            console's "minimum workers").
        min_load: the floor of active capacity, perf units per second.
        min_cold_load: the floor of total capacity, independent of ``cold_mult``.
        target_util: anticipated load over active capacity (0.9 leaves 11 % headroom).
        cold_mult: total capacity as a multiple of active capacity.
        gpu_ram_gb: the workergroup's estimated GPU memory need, GB.
        pyworker: the adapter (:class:`PyWorkerAdapter`).
    """

    max_workers: int = Field(default=2, ge=1, le=256)
    cold_workers: int = Field(default=1, ge=0, le=256)
    min_load: float = Field(default=1.0, ge=0)
    min_cold_load: float = Field(default=0.0, ge=0)
    target_util: float = Field(default=0.9, gt=0, le=1.0)
    cold_mult: float = Field(default=2.5, ge=1.0, le=100)
    gpu_ram_gb: float = Field(default=24.0, gt=0, le=1024)
    pyworker: PyWorkerAdapter

    @model_validator(mode="after")
    def _cold_within_max(self) -> "VastServerless":
        if self.cold_workers > self.max_workers:
            raise ValueError(f"cold_workers ({self.cold_workers}) exceeds max_workers ({self.max_workers}); lower "
                             "cold_workers or raise max_workers")
        return self


class VastProfile(RemoteProfile):
    """Vast.ai (offers searched and rented as instances; no queue endpoints in this runbook, so
    an inference workload is served ``load_balancing``: from an instance's mapped HTTP port).

    Attributes:
        serverless: ``kind: service`` only: the service runs on a Vast.ai Serverless endpoint
            through the PyWorker adapter (:class:`VastServerless`); None: on an instance.
        autoscaler_url: the Serverless autoscaler's base URL (``/route/``); empty:
            ``RUNBOOK_VAST_AUTOSCALER_URL``, else ``https://run.vast.ai``. A rehearsal points it
            at the simulator.
    """

    provider: Literal["vast"] = "vast"
    endpoint_mode: Literal["queue", "load_balancing"] = "load_balancing"
    serverless: VastServerless | None = None
    autoscaler_url: str = Field(default="", pattern=r"^(|https?://[^\s]+)$")


class LiveDeclared(_Model):
    """What params declare about a live source that the runbook cannot observe over its API; each
    is recorded as *declared*, never as observed.

    Attributes:
        image: the image the team says runs there (the target runs ``workload.service.image``).
        digest: its digest (``sha256:<64 hex>``), when the team knows it.
        provider: where it runs (free text: ``aws eks us-east-1``, ``runpod pod abc``).
        gpu: the GPU model it runs on, as the team knows it.
        throughput_units_per_s: its saturation throughput, requests per second, as the team
            measured it elsewhere: ``throughput_ratio`` compares the target's bursts with it
            (empty: the target's throughput is shown target-only, never a PASS).
        cold_start_s: its cold start (launch to first served answer), seconds: ``cold_start_ratio``
            compares the target's with it (empty: target-only).
    """

    image: str = Field(default="", max_length=512, pattern=r"^[^\s]*$")
    digest: str = Field(default="", pattern=r"^(|sha256:[0-9a-f]{64})$")
    provider: str = Field(default="", max_length=200)
    gpu: str = Field(default="", max_length=200)
    throughput_units_per_s: float | None = Field(default=None, gt=0, le=1e9)
    cold_start_s: float | None = Field(default=None, gt=0, le=86400)


class LiveProfile(ProfileBase):
    """``provider: live``: the service the team runs today, reached at ``url``, which the runbook
    did not start and must not change (source only, ``workload.kind: service``). Nothing is
    rented or launched for it: it is the baseline. Phase 01 reads what it can over the wire and
    asks it the sample inputs for the golden; phases 04 and 05 send it requests paced at no more
    than ``max_rate_per_s``; no saturation burst, drill or cold start touches it; phase 06 lists it
    as not ours. Its protocol and readiness are ``workload.service``'s.

    Attributes:
        url: the base URL of its API (the protocol's paths are appended).
        max_rate_per_s: the most requests a second the runbook may send it, every request
            counted (readiness checks, the golden, warm-up, rounds, cutover slices); request starts
            are at least ``1.05 / max_rate_per_s`` seconds apart (:mod:`runbook_lib.service.pacing`),
            and a router's rate plus HAProxy's health checks (up to two in a second) must fit it.
        auth_ref: reference of a bearer token its API needs (``env:VAR`` / ``file:/path``), sent
            as ``Authorization: Bearer ...``; empty: none. Resolved at run time, never recorded.
        declared: :class:`LiveDeclared`.
    """

    provider: Literal["live"] = "live"
    url: str = Field(pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$", max_length=2048)
    max_rate_per_s: float = Field(gt=0, le=10_000)
    auth_ref: str = Field(default="", pattern=r"^(|env:[A-Za-z_][A-Za-z0-9_]*|file:.+)$")
    declared: LiveDeclared = LiveDeclared()

    NOT_FOR_LIVE: ClassVar[tuple[str, ...]] = (
        "device", "dtype", "threads", "batch_size", "workers", "active_workers", "idle_timeout_s", "model_cache",
        "gpu_priority", "endpoint_mode", "storage_usd_per_gb_month", "secrets", "service_env")
    """Profile fields that describe what the runbook runs on a side; a live source runs nothing of
    the runbook's, so setting one is refused, not ignored (its GPU is ``declared.gpu``)."""

    @model_validator(mode="after")
    def _only_what_applies(self) -> "LiveProfile":
        unread = sorted(set(self.NOT_FOR_LIVE) & self.model_fields_set)
        if unread:
            raise ValueError(f"{', '.join(unread)} {'does' if len(unread) == 1 else 'do'} not apply to a live source: "
                             "the runbook runs nothing there and changes nothing about it; remove "
                             f"{'it' if len(unread) == 1 else 'them'} (what it runs on is source.declared)")
        parts = urlsplit(self.url)
        if "@" in parts.netloc:
            raise ValueError("url carries credentials (user:password@): they would be written wherever the URL is; "
                             "remove them and name a bearer token by reference in auth_ref")
        why = _url_problem(self.url)
        if why:
            raise ValueError(f"url {self.url!r} is not a usable http(s) URL: {why}; give the live service's base "
                             "URL as http(s)://host[:port][/prefix]")
        return self


@dataclass(frozen=True)
class ProviderEntry:
    """One provider: its registry name, the params model of a side it runs, the module whose
    ``create(**kwargs)`` builds its adapter, whether it rents real machines, and whether it
    creates anything at all (``live`` does not: it refuses every plan, so the provider contract,
    which launches and destroys, is not its test)."""

    name: str
    profile: type[ProfileBase]
    adapter: str
    remote: bool
    creates: bool = True


PROVIDER_TABLE: tuple[ProviderEntry, ...] = (
    ProviderEntry("local", LocalProfile, "runbook_lib.providers.local", remote=False),
    ProviderEntry("runpod", RunpodProfile, "runbook_lib.providers.runpod", remote=True),
    ProviderEntry("vast", VastProfile, "runbook_lib.providers.vast", remote=True),
    ProviderEntry("live", LiveProfile, "runbook_lib.providers.live", remote=False, creates=False),
)
"""The one table of providers: it feeds the registry (:mod:`runbook_lib.providers`), the params
schema (:data:`Profile`), and the tests. Adding a provider: ``runbook_lib/providers/GUIDE.md``."""

REMOTE_PROVIDERS = frozenset(e.name for e in PROVIDER_TABLE if e.remote)
"""Providers that rent real machines: they need an image and a key, and default to dry-run."""


def _provider_of(v: Any) -> str:
    """The discriminator of a side: its ``provider`` (``local`` when left out)."""
    return str(v.get("provider", "local") if isinstance(v, dict) else getattr(v, "provider", "local"))


AnyProfile = Union[LocalProfile, RunpodProfile, VastProfile, LiveProfile]
"""The profile models of :data:`PROVIDER_TABLE`, spelled out for type checkers (which cannot read
a union built from the table); a test holds the two equal."""

if TYPE_CHECKING:
    Profile = AnyProfile
else:
    Profile = Annotated[Union[tuple(Annotated[e.profile, Tag(e.name)] for e in PROVIDER_TABLE)],
                        Discriminator(_provider_of, custom_error_type="unknown_provider",
                                      custom_error_message="provider must be one of "
                                                           f"{', '.join(e.name for e in PROVIDER_TABLE)}")]
    """One side of the migration: the profile model of its ``provider`` (a discriminated union
    built from :data:`PROVIDER_TABLE`); a field another provider would need is refused, not ignored."""


_REF = r"^(|env:[A-Za-z_][A-Za-z0-9_]*|file:.+)$"


class StoreAccess(_Model):
    """How the runbook host reaches an S3-compatible store: everything but the URL.

    Attributes:
        endpoint_url: S3 API endpoint of a non-AWS store (R2, MinIO, a loopback test server).
        region: S3 region (``us-east-1`` when empty).
        checksum_mode: botocore request/response checksum setting, recorded in evidence.
        access_key_id_ref, secret_access_key_ref: credential references (``env:VAR`` or
            ``file:/path``); empty uses boto3's default chain. Resolved on the runbook host only:
            pods and endpoint workers get a short-lived store grant instead
            (:mod:`runbook_lib.storage.grants`), never these keys.
    """

    endpoint_url: str = Field(default="", pattern=r"^(|https?://.+)$")
    region: str = ""
    checksum_mode: Literal["when_required", "when_supported"] = "when_required"
    access_key_id_ref: str = Field(default="", pattern=_REF)
    secret_access_key_ref: str = Field(default="", pattern=_REF)

    @model_validator(mode="after")
    def _both_refs_or_neither(self) -> "StoreAccess":
        if bool(self.access_key_id_ref) != bool(self.secret_access_key_ref):
            given, missing = (("access_key_id_ref", "secret_access_key_ref") if self.access_key_id_ref
                              else ("secret_access_key_ref", "access_key_id_ref"))
            raise ValueError(f"{given} is set and {missing} is not: give both (a key id and its secret), or neither "
                             "to use boto3's own credential chain; one alone would sign with whatever other key the "
                             "environment holds")
        return self


class Storage(StoreAccess):
    """Where checkpoints, golden outputs and canary results go: :class:`StoreAccess` plus

    Attributes:
        url: ``file://<dir>`` (relative to the project root when not absolute) or
            ``s3://<bucket>[/<prefix>]``.
        create_bucket: create the bucket if missing (loopback test servers only).
    """

    url: str = Field(default="file://.runbook/store", pattern=r"^(file|s3)://.+")
    create_bucket: bool = False

    @field_validator("url")
    @classmethod
    def _s3_names_a_bucket(cls, v: str) -> str:
        if v.startswith("s3://") and not v[5:].split("/", 1)[0]:
            raise ValueError(f"{v!r} names no bucket; use s3://<bucket>[/<prefix>]")
        return v


READINESS_PATHS = {"openai-chat": "/health", "runpod-handler": "/", "http-json": "/health"}
"""Each protocol's default readiness path, what its reference server answers 200 on:
``openai-chat``: vLLM's OpenAI-compatible server and ``transformers serve`` both serve ``GET
/health``; ``runpod-handler``: the runpod SDK's local API (``--rp_serve_api``,
runbook_lib.service.protocols cites its routes) has no health route and answers ``GET /``;
``http-json``: ``/health``, the common convention (no reference server: set it)."""

STREAMS_BY_DEFAULT = {"openai-chat": True, "runpod-handler": False, "http-json": False}
"""``workload.service.stream`` when params leave it out: OpenAI's chat API streams server-sent
events on request (the token gates need it); a Runpod handler answers ``/runsync`` whole; an
``http-json`` service answers one JSON document."""


class ServiceReadiness(_Model):
    """When a service counts as ready: ``GET path`` answers ``status`` within ``timeout_s``
    seconds of its launch (polled every ``interval_s`` seconds; the last answer is shown when it
    never comes). ``path`` defaults per protocol (:data:`READINESS_PATHS`).

    Attributes:
        path: the readiness route (``/health`` for ``openai-chat`` and ``http-json``, ``/`` for
            ``runpod-handler`` when left out).
        status: the HTTP status that means ready.
        timeout_s: seconds from launch within which it must answer so.
        interval_s: seconds between polls.
    """

    path: str = Field(default="/health", pattern=r"^/[!-~]*$", max_length=512)
    status: int = Field(default=200, ge=100, le=599)
    timeout_s: float = Field(default=120.0, gt=0, le=3600)
    interval_s: float = Field(default=0.25, gt=0, le=60)


class JsonCheck(_Model):
    """One value an ``http-json`` answer is compared by: a dotted path into the JSON answer
    (``data.0.embedding``; list items by index) and how: ``exact`` (equal JSON), ``absolute``
    (``|a - b| <= tolerance`` for every number), ``relative`` (``|a - b| <= tolerance * |b|``)
    or ``cosine`` (vectors: cosine similarity ``>= 1 - tolerance``).

    Attributes:
        path: the dotted path to the compared value (``data.0.embedding``).
        compare: ``exact``, ``absolute``, ``relative`` or ``cosine`` (above).
        tolerance: the bound the comparison allows (0: equal).
    """

    path: str = Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*$")
    compare: Literal["exact", "absolute", "relative", "cosine"] = "exact"
    tolerance: float = Field(default=0.0, ge=0, le=1e6)


class HttpJsonRequest(_Model):
    """How an ``http-json`` service is called: ``method`` and ``path``, and a body template whose
    string values ``"{input}"`` are replaced by the sample input (any JSON value) and
    ``"{input.KEY}"`` by that key of it.

    Attributes:
        method: the HTTP method.
        path: the route called.
        body: the JSON body template (above).
        error_path: where the answer holds an error reported with a success status (below).
    """

    method: Literal["POST", "PUT", "GET"] = "POST"
    path: str = Field(default="/", pattern=r"^/[!-~]*$", max_length=512)
    body: Any = "{input}"
    # A dotted path into the JSON answer that holds the service's error when it reports one with
    # a success status (``{"error": "..."}``): a value there that is not null, false or empty
    # fails the request as ERROR_BODY with its text. Empty: the answer carries no error field.
    error_path: str = Field(default="error", max_length=256, pattern=r"^(|[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*)$")


class StandIn(_Model):
    """What runs an image where no container runtime does (the embedded local provider, and the
    simulators in a rehearsal): a local command, run in the pod's own disk and environment and
    recorded as a stand-in for ``image``. ``{port}`` is the API port the provider gives it,
    ``{project}`` the project root, ``{NAME}`` the value of service environment variable NAME.

    Attributes:
        command: the command and its arguments, with the placeholders above.
    """

    command: tuple[str, ...] = Field(min_length=1, max_length=64)


class ServiceParity(_Model):
    """How phase 03 judges the canary's answers against phase 01's golden answers.

    Attributes:
        min_exact_match: share of sample inputs whose answer must equal the golden exactly
            (``openai-chat`` at temperature 0 with a fixed seed; ``http-json`` by its checks).
            The default, 0.9, allows one input in ten to differ: greedy decoding on a different
            GPU model reorders floating-point reductions, so a token can flip where two logits
            are nearly tied; a migration onto the same hardware can demand 1.0.
    """

    min_exact_match: float = Field(default=0.9, ge=0, le=1)


class ServiceDrills(_Model):
    """What lets phase 04's job drills reach a team's ``runpod-handler`` service, which the runbook
    cannot make fail from outside: each names something the team's handler already honours.

    Attributes:
        idempotency_key: the field of a job's ``input`` (top level) the handler keys its
            idempotency record on. The ``redeliver`` drill sends one sample job twice under one
            fresh key, as a platform delivers a job again (Runpod redelivers a job whose worker
            was lost; Vast.ai's client resends a request that failed, ``retry=True``); empty:
            the drill is NOT_APPLICABLE.
        replayed: the path (:class:`JsonCheck` syntax) of the output field that is true when the
            handler answered from its record rather than running the job; empty: only the two
            answers are compared, and a handler that runs the job twice with the same answer
            passes.
        hang: a job ``input`` the handler keeps working on for longer than
            ``drills.hang_timeout_s``. The ``hung_worker`` drill sends it with that execution
            timeout (Runpod's per-job ``policy.executionTimeout``); None: NOT_APPLICABLE.
    """

    idempotency_key: str = Field(default="", max_length=128, pattern=r"^(|[A-Za-z_][A-Za-z0-9_-]*)$")
    replayed: str = Field(default="", max_length=256, pattern=r"^(|[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*)$")
    hang: Any = None

    @model_validator(mode="after")
    def _replayed_needs_a_key(self) -> "ServiceDrills":
        if self.replayed and not self.idempotency_key:
            raise ValueError("workload.service.drills.replayed names where the handler says it answered from its "
                             "record, but idempotency_key is empty: name the input field the record is keyed on")
        return self


class Service(_Model):
    """``kind: service``: a team's own service, judged from outside over its own API. Phases run
    the image unchanged with its own command; no runbook code runs inside it.

    Attributes:
        image: the image the team runs, as the provider pulls it; a tag that is not a digest is
            a risk finding in phase 01 and the digest the provider reports is pinned.
        command: its start command and arguments (empty: the image's own entrypoint).
        env: environment values it is given (not secrets: those are the profile's ``secrets``,
            by reference).
        port: the container port of its API (HTTP).
        readiness: when it is ready (:class:`ServiceReadiness`).
        protocol: how it is called and judged: ``openai-chat`` (POST /v1/chat/completions,
            streamed or not), ``runpod-handler`` (a Runpod Serverless worker under the official
            ``runpod`` SDK: its job API, ``/runsync`` then ``/status/{id}``; each sample is the
            job's ``input``, its output compared by ``checks``) or ``http-json`` (any JSON over
            HTTP: :class:`HttpJsonRequest`, compared by ``checks``).
        samples: the sample inputs, a JSON Lines file (relative to the project): ``openai-chat``
            each line ``{"messages": [...]}`` or ``{"prompt": "..."}``; ``runpod-handler`` and
            ``http-json`` any JSON value.
        model: the ``model`` field of each chat request (empty: left out; a server pinned to one
            model answers with it).
        max_tokens: output tokens per chat answer.
        stream: ``openai-chat`` requests are streamed (server-sent events), so TTFT and
            inter-token latency are measured.
        seed: the ``seed`` of each chat request; ``temperature`` is always 0.
        request: ``http-json``'s call (:class:`HttpJsonRequest`).
        checks: the compared values of an ``http-json`` answer or a ``runpod-handler`` job's
            output (:class:`JsonCheck`; none: the whole of it, exactly).
        registry_credential: the name of the profile secret that logs in to a private registry
            (Runpod's container registry auth, Vast.ai's image login); empty for a public image.
        private_image: the image needs ``registry_credential`` (phase 02 stops without it).
        stand_in: the local command standing in for ``image`` on the local provider.
        parity: :class:`ServiceParity`.
        ttft_slo_s, tpot_slo_s, e2e_slo_s: goodput SLOs (seconds): a request counts toward
            goodput when it was accepted and its time to first token, time per output token and
            end-to-end latency are within those set (vLLM ``bench serve``'s ``--goodput
            ttft:... tpot:... e2el:...``, in seconds here).
        max_answer_bytes: the largest answer read (bytes, read as a stream and never buffered
            past it); a larger one fails its request as OVERSIZE.
        max_gap_s: the longest silence between two streamed events after the first (seconds);
            a longer stall fails the request as TIMED_OUT. The whole answer is bounded by
            ``measure.request_timeout_s``.
        tokenizer: a local directory holding the model's ``tokenizer.json`` (relative to the
            project), used to count output tokens when the server sends no ``usage``; empty:
            such a server's TPOT, ITL and goodput are recorded as not measurable.
        drills: what phase 04's ``redeliver`` and ``hung_worker`` drills send a
            ``runpod-handler`` service (:class:`ServiceDrills`).
    """

    image: str = Field(min_length=1, max_length=512, pattern=r"^[^\s]+$")
    command: tuple[str, ...] = Field(default=(), max_length=64)
    env: dict[str, str] = Field(default_factory=dict)
    port: int = Field(default=8000, ge=1, le=65535)
    readiness: ServiceReadiness = ServiceReadiness()
    protocol: Literal["openai-chat", "runpod-handler", "http-json"]
    samples: str = Field(min_length=1)
    model: str = Field(default="", max_length=512)
    max_tokens: int = Field(default=16, ge=1, le=4096)
    stream: bool = True  # filled per protocol when left out (STREAMS_BY_DEFAULT)
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    request: HttpJsonRequest = HttpJsonRequest()
    checks: tuple[JsonCheck, ...] = ()
    registry_credential: str = Field(default="", pattern=r"^(|[A-Z][A-Z0-9_]*)$")
    private_image: bool = False
    stand_in: StandIn | None = None
    parity: ServiceParity = ServiceParity()
    ttft_slo_s: float | None = Field(default=None, gt=0, le=3600)
    tpot_slo_s: float | None = Field(default=None, gt=0, le=3600)
    e2e_slo_s: float | None = Field(default=None, gt=0, le=3600)
    max_answer_bytes: int = Field(default=10_000_000, ge=1024, le=1_000_000_000)
    max_gap_s: float = Field(default=10.0, gt=0, le=3600)
    tokenizer: str = Field(default="", max_length=1024)
    drills: ServiceDrills = ServiceDrills()

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return _env_names(v)

    @model_validator(mode="before")
    @classmethod
    def _protocol_defaults(cls, data: Any) -> Any:
        """``stream`` and ``readiness.path`` left out take the protocol's defaults
        (:data:`STREAMS_BY_DEFAULT`, :data:`READINESS_PATHS`)."""
        if not isinstance(data, dict) or data.get("protocol") not in STREAMS_BY_DEFAULT:
            return data
        out = dict(data)
        out.setdefault("stream", STREAMS_BY_DEFAULT[out["protocol"]])
        ready = out.get("readiness")
        if ready is None or (isinstance(ready, dict) and "path" not in ready):
            out["readiness"] = {**(ready or {}), "path": READINESS_PATHS[out["protocol"]]}
        return out

    @model_validator(mode="after")
    def _drills_where_built(self) -> "Service":
        d = self.drills
        if (d.idempotency_key or d.hang is not None) and self.protocol != "runpod-handler":
            raise ValueError(f"workload.service.drills is set for protocol {self.protocol!r}: the redeliver and "
                             "hung_worker drills reach a service through a job API (runpod-handler) only; remove it")
        return self

    @model_validator(mode="after")
    def _streams_where_built(self) -> "Service":
        if self.stream and self.protocol != "openai-chat":
            why = ("its job API streams through /stream/{id} from a generator handler, which this runbook does not "
                   "call: it judges /runsync's whole answer" if self.protocol == "runpod-handler" else
                   "an http-json service answers one JSON document")
            raise ValueError(f"workload.service.stream is true for protocol {self.protocol!r}: {why}; set stream: "
                             "false (the default for this protocol) or leave it out")
        return self

    @property
    def tag_is_digest(self) -> bool:
        """The image is named by digest (``name@sha256:<64 hex>``), which cannot move."""
        return bool(re.search(r"@sha256:[0-9a-f]{64}$", self.image))


CHECKPOINT_ENTRY_POINT = "runbook_lib.workload.checkpoint_set:CheckpointWorkload"
"""The workload of ``kind: checkpoint``: an existing checkpoint migrated without user code."""


class Workload(_Model):
    """The acceptance-job contract: an entry point ``module:Class`` and its fixed inputs.

    The class must implement :class:`runbook_lib.workload.AcceptanceWorkload`. ``kind:
    checkpoint`` migrates an existing checkpoint with no code: ``checkpoint`` names it (a file or
    a directory of shards: a path, absolute or relative to the project root, ``file://``, or
    ``s3://<bucket>/<key or prefix>``, which phase 01 copies into the run's store before anything
    is rented, reaching the bucket with ``checkpoint_store``, default: the ``storage`` section's
    endpoint, region and keys), the
    entry point defaults to :data:`CHECKPOINT_ENTRY_POINT`, each of the ``restores`` steps restores
    the whole checkpoint (read, verify, load), and ``allow_globals`` lists the non-tensor globals
    (``module.name``) the operator trusts in it, honoured only for files whose sha256 matches the
    frozen manifest (:func:`runbook_lib.portability.checkpoint.load_state`).

    Attributes:
        kind: ``inference`` (an endpoint the runbook's worker serves), ``training`` (a job that
            trains and checkpoints), ``checkpoint`` (an existing checkpoint, no code) or
            ``service`` (a team's own image, judged over its API: ``service``).
        entry_point: the workload class, ``module:Class`` (found from the project directory).
        model_id: the model's name or hub id, recorded with its identity.
        checkpoint: the checkpoint a ``checkpoint`` workload migrates (above).
        checkpoint_store: how an ``s3://`` checkpoint's bucket is reached (:class:`StoreAccess`).
        allow_globals: non-tensor globals trusted in the checkpoint (above).
        restores: restore steps a ``checkpoint`` workload measures per round.
        dataset_id: the dataset's name, recorded with its sha256.
        sample_size: fixed sample inputs the golden outputs are taken on.
        seed: the seed of every random choice the workload makes.
        train_steps: steps a ``training`` job runs.
        checkpoint_every: steps between a training job's checkpoints.
        checkpoint_location: where the job keeps its checkpoints: ``volume`` (the pod's volume,
            which outlives a stop; on Runpod and locally it is removed with the pod), ``container``
            (the container disk, gone when the pod is), or ``store`` (each checkpoint also
            committed to the run's store as a set, ``<agent prefix>/checkpoints/step-NNNNNN``,
            which outlives every pod; a resume with no checkpoint of its own takes the newest
            that verifies). The ``checkpoint_durability`` drill destroys a pod to check it.
        step_timeout_s: the job's step watchdog, seconds: a step running longer ends the job,
            naming the step (unset: no watchdog, and the ``hung_step`` drill FAILs saying so).
        learning_rate: a training job's learning rate.
        requirements: what it needs from a host (:class:`Requirements`).
        service: the team's service, for ``kind: service`` (:class:`Service`).
    """

    kind: Literal["inference", "training", "checkpoint", "service"]
    entry_point: str = Field(default="", pattern=r"^(|[A-Za-z_][\w.]*:[A-Za-z_]\w*)$")
    model_id: str = Field(min_length=1)
    checkpoint: str = ""
    checkpoint_store: StoreAccess | None = None
    allow_globals: tuple[str, ...] = ()
    restores: int = Field(default=4, ge=2, le=10_000)
    dataset_id: str = ""
    sample_size: int = Field(default=32, ge=1, le=100_000)
    seed: int = 0
    train_steps: int = Field(default=60, ge=2, le=1_000_000)
    checkpoint_every: int = Field(default=10, ge=1)
    checkpoint_location: Literal["volume", "container", "store"] = "volume"
    step_timeout_s: float | None = Field(default=None, gt=0, le=86_400)
    learning_rate: float = Field(default=0.05, gt=0, le=10)
    requirements: Requirements = Requirements()
    service: Service | None = None

    @property
    def serves(self) -> bool:
        """The workload answers requests (an inference endpoint or a service), so phases 04 and 05
        measure and route requests rather than training steps or restores."""
        return self.kind in ("inference", "service")

    @property
    def unit(self) -> str:
        """What one measured unit is: ``request`` (inference), ``training step`` (training) or
        ``restore`` (checkpoint: read, verify and load the whole checkpoint once)."""
        return {"inference": "request", "service": "request", "training": "training step"}.get(self.kind, "restore")

    @model_validator(mode="before")
    @classmethod
    def _checkpoint_entry_point(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("kind") == "checkpoint" and not data.get("entry_point"):
            return {**data, "entry_point": CHECKPOINT_ENTRY_POINT}
        return data

    @model_validator(mode="after")
    def _checkpoint_kind(self) -> "Workload":
        if self.kind == "checkpoint":
            if not self.checkpoint:
                raise ValueError("workload.kind 'checkpoint' needs workload.checkpoint: the checkpoint file or directory "
                                 "to migrate (a path, absolute or relative to the project root, or file://)")
            if self.checkpoint_store is not None and not self.checkpoint.startswith("s3://"):
                raise ValueError(f"workload.checkpoint_store is how an s3:// checkpoint's bucket is reached, but "
                                 f"workload.checkpoint is {self.checkpoint!r}; remove checkpoint_store")
            scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):", self.checkpoint)
            if scheme and not self.checkpoint.startswith(("s3://", "file://")):
                raise ValueError(f"workload.checkpoint {self.checkpoint!r} starts with {scheme.group(0)!r}, which is "
                                 "neither s3:// nor file://; give a path, file://<path> or s3://<bucket>/<key or prefix>")
            if self.checkpoint.startswith("s3://") and not self.checkpoint[5:].split("/", 1)[0]:
                raise ValueError(f"workload.checkpoint {self.checkpoint!r} names no bucket; use "
                                 "s3://<bucket>/<key or prefix>")
            if self.checkpoint_every >= self.restores:
                raise ValueError(f"checkpoint_every ({self.checkpoint_every}) must be below restores ({self.restores}) so "
                                 "the failure-and-resume drill has a checkpoint to resume; set checkpoint_every: 1")
        elif self.kind == "service":
            if self.service is None:
                raise ValueError("workload.kind 'service' needs workload.service: the image, its command, port, "
                                 "readiness check, protocol and sample inputs")
            if self.entry_point or self.checkpoint or self.allow_globals:
                raise ValueError("workload.entry_point, checkpoint and allow_globals do not apply to kind 'service': "
                                 "the service runs its own image unchanged; remove them")
        elif self.service is not None:
            raise ValueError(f"workload.service belongs to kind 'service', not {self.kind!r}; remove it or set "
                             "kind: service")
        elif not self.entry_point:
            raise ValueError(f"workload.entry_point is required for kind {self.kind!r} (module:Class)")
        elif self.checkpoint or self.allow_globals or self.checkpoint_store is not None:
            raise ValueError("workload.checkpoint, checkpoint_store and allow_globals belong to kind 'checkpoint'")
        return self

    @model_validator(mode="after")
    def _checkpoint_interval(self) -> "Workload":
        if self.kind == "training" and self.checkpoint_every >= self.train_steps:
            raise ValueError(
                f"checkpoint_every ({self.checkpoint_every}) must be below train_steps "
                f"({self.train_steps}) so the failure-and-resume drill has a checkpoint to resume"
            )
        return self


MAX_WINDOW_S = 30 * 86_400.0
"""Longest rollback window or hold deadline, seconds (30 days): a window is a promise someone
keeps the source for, and a value beyond any calendar would overflow the clock it is added to."""


class Measure(_Model):
    """Phase 04 protocol. ``arrival_rate_per_s`` is the open-loop (Poisson) request rate;
    rounds alternate source, target, target, source (RMIT interleaving). When a side has fewer
    than ``gates.min_latency_samples`` samples, up to ``max_extra_rounds`` more rounds are run
    (the budget for extending an inconclusive comparison) before the gates are judged.

    A measurement whose machinery fails (a provider call, a connection to the endpoint, the
    store; not a request the target failed, which is a sample) is retried up to
    ``error_retries`` times, ``error_retry_interval_s`` seconds apart; if every attempt fails,
    the gates it feeds are INCONCLUSIVE. Defaults are Argo Rollouts' (``consecutiveErrorLimit``
    4, ``DefaultErrorRetryInterval`` 10 s; docs/reference/gates.md sections 1 and 5.1).

    Three clocks bound a queue endpoint's job, each recorded with what it did in phase 04:
    ``request_timeout_s`` is the endpoint's execution timeout (a handler running longer is
    ``TIMED_OUT``); ``job_ttl_s`` is sent with every job as its TTL (Runpod's ``policy.ttl``:
    10 s to 7 days; None keeps the endpoint's own, Runpod's default 24 h), after which the
    endpoint forgets it run or not (``EXPIRED``); ``client_timeout_s`` is how long the runbook
    waits for a job before it cancels it, keeping its id (``CLIENT_TIMEOUT``).

    ``cold_starts`` scale-from-zero starts are measured per queue side, on an endpoint of one
    worker that stops 1 s after each job: each start is timed from submission to answer and
    split into queue, init and inference (the serverless guidance: "Measure p95 queue plus
    initialization plus inference", docs/reference/providers.md 2.3a). The runbook's own
    load-balancing side (a pod) does not scale to zero; its one cold start is its creation. A
    service's starts are measured when both sides are Serverless endpoints (``serverless``:
    Runpod queue or load-balancing, Vast.ai), on an endpoint of one worker that nothing keeps
    running; a queue's or route's wait holds the worker's start, a load-balancing request's
    whole time does.

    ``traffic_per_s`` is the production traffic the cost per accepted unit is judged at
    (requests per second; None: ``arrival_rate_per_s``), with each side's warm workers
    (``active_workers``) billed whether busy or idle.

    ``exclusive`` (default true): phases 04 and 05 run alone among the runbook runs on this
    machine, each other run's phases waiting at their start (:mod:`runbook_lib.run.hostlock`);
    phase 05 only for a workload that serves requests (a training job's or a checkpoint's slices
    are not timed).

    Attributes:
        requests_per_round: latency requests a round sends (after the warm-up).
        warmup_requests: requests sent and discarded (recorded) before each round's.
        rounds: rounds in all under ``gates.method: fixed`` (S, T, T, S blocks).
        arrival_rate_per_s: the open-loop Poisson request rate, requests per second.
        throughput_requests: requests of each round's saturation burst (throughput).
        request_timeout_s: the endpoint's execution timeout, and one deadline for a service's
            whole answer, seconds.
        job_ttl_s: each queued job's TTL, seconds (above).
        client_timeout_s: how long the runbook waits for a job before cancelling it, seconds.
        cold_starts: scale-from-zero starts per queue side (above); 0: none.
        traffic_per_s: the production traffic cost is judged at (above).
        max_extra_rounds: rounds added (fixed method) while a side has too few samples.
        max_rounds: the most pairs of rounds the sequential method measures (its budget).
    """

    requests_per_round: int = Field(default=60, ge=1, le=1_000_000)
    warmup_requests: int = Field(default=5, ge=0, le=10_000)
    rounds: int = Field(default=4, ge=4, le=100)  # S, T, T, S: at least two per side, an A/A source pair
    arrival_rate_per_s: float = Field(default=20.0, gt=0, le=100_000)
    throughput_requests: int = Field(default=64, ge=1, le=1_000_000)
    request_timeout_s: float = Field(default=30.0, gt=0, le=86_400)
    job_ttl_s: float | None = Field(default=None, ge=10, le=7 * 86_400)
    client_timeout_s: float = Field(default=300.0, gt=0, le=7 * 86_400)
    cold_starts: int = Field(default=5, ge=0, le=100)  # scale-from-zero starts per side that scales to zero; 0: none
    traffic_per_s: float | None = Field(default=None, gt=0, le=10_000_000)  # declared traffic; None: arrival_rate_per_s
    max_extra_rounds: int = Field(default=2, ge=0, le=20)
    # Phases 04 and 05 hold the host lock exclusively: no other runbook run on this machine runs a
    # phase while they time the sides (runbook_lib.run.hostlock; phase 05 only for a serving workload,
    # whose slices are timed). False: they hold it shared, like the other phases, for a run whose
    # timings nobody judges.
    exclusive: bool = True
    error_retries: int = Field(default=4, ge=0, le=20)  # retries after the first attempt (Argo: 4)
    error_retry_interval_s: float = Field(default=10.0, ge=0, le=3600)  # seconds between attempts (Argo: 10 s)
    # A request sent later than this after its intended time means the load generator fell
    # behind (coordinated omission); its round's latencies are then not a result, seconds.
    max_send_lateness_s: float = Field(default=0.1, gt=0, le=60)
    # gates.method sequential: rounds a side before the first look that may stop (2 show
    # between-round variation) and the most rounds a side it measures (its budget).
    min_rounds: int = Field(default=2, ge=2, le=50)
    max_rounds: int = Field(default=8, ge=2, le=50)
    # gates.method sequential: wall seconds the rounds may take in all (None: no limit). A pair
    # starts only while the seconds spent plus the longest pair so far fit.
    max_seconds: float | None = Field(default=None, gt=0, le=7 * 86_400)
    # Training with world_size > 1: the size of the all-reduce phase 04 times on each such side
    # (float32 sum over every process of the pod, nccl-tests' all_reduce_perf), MiB.
    allreduce_mib: float = Field(default=8.0, gt=0, le=16_384)

    @model_validator(mode="after")
    def _budget_holds_the_minimum(self) -> "Measure":
        if self.max_rounds < self.min_rounds:
            raise ValueError(f"measure.max_rounds ({self.max_rounds}) is below measure.min_rounds ({self.min_rounds}): "
                             "the budget must allow the rounds measured before the first look; raise max_rounds")
        return self

    @model_validator(mode="after")
    def _client_outlasts_the_handler(self) -> "Measure":
        if self.client_timeout_s < self.request_timeout_s:
            raise ValueError(f"measure.client_timeout_s ({self.client_timeout_s:g} s) is shorter than the execution "
                             f"timeout measure.request_timeout_s ({self.request_timeout_s:g} s): the client would "
                             "cancel jobs the endpoint still lets run; raise client_timeout_s")
        return self


class Gates(_Model):
    """Thresholds. Defaults and their sources are in :mod:`runbook_lib.gates`.

    Performance and cost gates are blocking only when their threshold is set in the params file
    (``latency_p95_ratio_max``, ``throughput_ratio_min``, ``cold_start_ratio_max``,
    ``required_saving``; the latency SLO is ``workload.requirements.max_request_s``); left at
    their defaults they are scored, reported but not deciding (docs/reference/gates.md 5.1). Parity
    and reliability gates are always blocking.

    Attributes:
        parity_rtol, parity_atol: tolerances of phase 03's output comparison (None:
            ``torch.testing.assert_close``'s defaults for the output's dtype).
        top1_agreement_min: share of inputs whose top-1 class must agree (classifiers).
        latency_p95_ratio_max: target p95 / source p95, upper bound of its interval at most this.
        throughput_ratio_min: target / source throughput, lower bound of its interval at least this.
        cold_start_ratio_max: target / source median cold start at most this.
        error_rate_max: target failures / requests at most this (0: any failure fails).
        required_saving: cost per accepted unit must fall by at least this share (0.2: 20 %
            cheaper; negative: a tolerated increase).
        loss_band_rel: the relative band a training job's mean loss over its last steps must stay in
            around the source's (widened to three times the A/A spread of two source runs).
        min_latency_samples: latency samples a side needs before its gates may pass.
        spend_limit_usd: the most the measurement may cost, USD (None: no limit); enforced
            during the run.
    """

    parity_rtol: float | None = Field(default=None, gt=0)
    parity_atol: float | None = Field(default=None, gt=0)
    top1_agreement_min: float = Field(default=1.0, ge=0, le=1)
    latency_p95_ratio_max: float = Field(default=1.10, gt=0)
    throughput_ratio_min: float = Field(default=0.95, gt=0)
    cold_start_ratio_max: float = Field(default=1.25, gt=0)
    error_rate_max: float = Field(default=0.0, ge=0, le=1)
    required_saving: float = Field(default=0.0, ge=-1, lt=1)
    loss_band_rel: float = Field(default=0.01, gt=0)
    min_latency_samples: int = Field(default=20, ge=1, le=10_000_000)
    spend_limit_usd: float | None = Field(default=None, gt=0, le=1_000_000)
    # Seconds a HOLD waits for a person (`runbook resolve`) before it resolves to NO-GO:
    # docs/reference/gates.md 5.2, a Flagger progressDeadlineSeconds analogue, 60 min proposed there.
    hold_deadline_s: float = Field(default=3600.0, gt=0, le=MAX_WINDOW_S)
    # kind: service: seconds from killing the canary to its answering again (phase 03); the
    # migration design's "acceptance thresholds for ... recovery" (seed 001). None: scored.
    recovery_s_max: float | None = Field(default=None, gt=0, le=86_400)
    # kind: service, streamed: the target's goodput (accepted requests per second within the
    # service's SLOs) over the source's must be at least this; None: scored.
    # docs/reference/gates.md 3.6 (goodput, DistServe's definition as vLLM bench serve reports it).
    goodput_ratio_min: float | None = Field(default=None, gt=0, le=10)
    # How phase 04 judges the latency p95 and throughput ratios: ``fixed``, once after
    # ``measure.rounds`` (a 90 % block-bootstrap interval over rounds); ``sequential``, after each
    # pair of rounds with anytime-valid confidence sequences, stopping as soon as every blocking
    # one is decided (``measure.min_rounds`` to ``measure.max_rounds`` a side;
    # runbook_lib.gates.sequential).
    method: Literal["fixed", "sequential"] = "fixed"
    # Training with world_size > 1 on both sides: the target's all-reduce bus bandwidth over the
    # source's (nccl-tests' busbw, measure.allreduce_mib) must be at least this; None: scored.
    allreduce_busbw_ratio_min: float | None = Field(default=None, gt=0, le=100)


DrillName = Literal["redeliver", "preferred_offer_removed", "hung_worker", "spend_limit", "output_durability",
                    "preemption_grace", "corrupt_newest", "hung_step", "checkpoint_durability"]
ENDPOINT_DRILLS: tuple[str, ...] = ("redeliver", "preferred_offer_removed", "hung_worker", "spend_limit",
                                    "output_durability")
"""The drills a serving workload runs by default (``drills.run`` unset)."""
JOB_DRILL_NAMES: tuple[str, ...] = ("preemption_grace", "corrupt_newest", "hung_step")
"""The drills the canary's agent runs on a training job (:mod:`runbook_lib.workload.jobdrills`)."""
POD_DRILL_NAMES: tuple[str, ...] = ("checkpoint_durability",)
"""The training job's drills that phase 04 runs on pods of their own (:mod:`runbook_lib.phases.compare.durability`)."""
TRAINING_DRILLS: tuple[str, ...] = (*JOB_DRILL_NAMES, *POD_DRILL_NAMES, "spend_limit", "preferred_offer_removed")
"""The drills a training job runs by default (``drills.run`` unset): those that apply to a job."""
DRILL_NAMES: tuple[str, ...] = (*ENDPOINT_DRILLS, *JOB_DRILL_NAMES, *POD_DRILL_NAMES)
DOCKER_STOP_TIMEOUT_S = 10.0
"""Seconds ``docker stop`` waits between SIGTERM and SIGKILL unless told otherwise (Docker's
"docker container stop" reference: ``--timeout``, "Seconds to wait before killing the container",
default 10); Runpod and Vast.ai run pods as containers."""


class Drills(_Model):
    """Phase 04's fault drills against the target (the serverless guidance,
    docs/reference/providers.md 2.3a: "Redeliver jobs, remove the preferred GPU, and
    time out workers to verify fallback, spending limits, and output durability").

    Attributes:
        run: the drills to run (unset: those that apply to the workload, below; ``[]`` runs none).
        blocking: the drills whose FAIL blocks the decision (NO-GO); INCONCLUSIVE (the drill
            could not be carried out) or NOT_APPLICABLE (the target has no such property: no job
            API, no offers) holds it; the others are scored. Each must also be in ``run``.
        hang_timeout_s: the execution timeout the ``hung_worker`` drill's job carries, seconds.
        preemption_grace_s: seconds between the ``preemption_grace`` drill's SIGTERM and its
            SIGKILL, the provider's grace period (default :data:`DOCKER_STOP_TIMEOUT_S`).
        max_steps_lost: training steps a preempted job may lose, its replacement re-running them
            (a job that saves on SIGTERM loses none).

    Unset, ``run`` is what applies to the workload: :data:`ENDPOINT_DRILLS` for a serving one,
    :data:`TRAINING_DRILLS` for a training job (:meth:`Migration._drills_by_kind`).
    """

    run: tuple[DrillName, ...] = ENDPOINT_DRILLS  # type: ignore[assignment]
    blocking: tuple[DrillName, ...] = ()
    hang_timeout_s: float = Field(default=2.0, gt=0, le=600)
    preemption_grace_s: float = Field(default=DOCKER_STOP_TIMEOUT_S, gt=0, le=3600)
    max_steps_lost: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _blocking_runs(self) -> "Drills":
        missing = [d for d in self.blocking if d not in self.run]
        if missing:
            raise ValueError(f"drills.blocking names {missing} that drills.run does not run; add them to run or "
                             "remove them from blocking")
        if len(set(self.run)) != len(self.run):
            raise ValueError(f"drills.run lists a drill twice: {list(self.run)}")
        return self


def _url_problem(url: str) -> str:
    """Why ``url`` cannot be sent requests to (scheme, host, port, spaces), or empty."""
    if any(c.isspace() for c in url):
        return "it contains a space"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return str(exc)
    if parts.scheme not in ("http", "https"):
        return f"its scheme is {parts.scheme or 'missing'!r}, not http or https"
    if not parts.hostname:
        return "it names no host"
    return "" if port is None or 0 < port < 65536 else f"port {port} is out of range"


HAPROXY_CHECKS_PER_S = 2.0
"""HAProxy's health checks of a server that can land in one second: one every second (``check
inter 1s``, :func:`runbook_lib.traffic.router.haproxy_config`), and with its jitter two can share a
one-second window (seen: checks 0.99999 s apart). The load a live source gets beside the replay."""


class RouterParams(_Model):
    """Phase 05's router (:mod:`runbook_lib.traffic.router`): what moves an inference cutover's traffic.

    Attributes:
        kind: ``client`` (the default): the runbook splits its own test requests between the
            sides, as before a router exists; ``haproxy``: HAProxy driven through its runtime API,
            started on loopback in front of phase 04's two endpoints or, with ``socket``, one
            already running; ``command``: a user's router, driven by ``set_command`` and
            ``read_command``. A real router carries a background replay the whole phase and
            needs ``cutover.mode: drain`` (dual_run sends each request to both sides itself).
            For ``kind: inference`` it needs both sides' ``endpoint_mode: load_balancing`` (a
            queue endpoint's job API polls ``/status/{id}``, which the router could send to the
            other side); for ``kind: service`` every protocol is routed request by request:
            openai-chat (streamed or whole), http-json, and runpod-handler through ``/runsync``
            (a job still running when ``/runsync`` returns is not polled through the router:
            it fails, named). Training and checkpoint cutovers move pods, not requests.
        binary: the HAProxy executable the runbook starts (Debian's ``haproxy``).
        socket: an existing HAProxy's admin socket (``stats socket ... level admin``); empty:
            the runbook starts its own.
        url: the existing router's front URL (with ``socket``, and for ``command``); it must name
            the server of each answer in the ``X-Runbook-Server`` header (``source`` or
            ``target``), or the answer counts as the router's own, a lost request.
        backend: the HAProxy backend holding the two servers.
        source_server: the source's server name in that backend.
        target_server: the target's server name in that backend.
        set_command: ``command``: argv run with ``{source}`` and ``{target}`` replaced by the
            weights (percent); must exit 0.
        read_command: ``command``: argv printing the weights as JSON (``{"source": 90,
            "target": 10}``).
        drain_command: ``command``: argv run with ``{side}`` to drain a side (optional).
        share_tolerance: how far the target's share may differ between the replay's count and
            the router's counters, and from the weight set, as a fraction of the step's
            requests (plus two requests at each edge of the window); beyond it the step fails
            closed.
        rollback_within_s: after a failing step, the source must serve every replayed request
            within this many seconds (the migration design's "source restoration remains
            provable").
        arrival_rate_per_s: the replay's offered load through the router, requests per second
            (Poisson arrivals); each window is ``cutover.requests_per_step`` requests at this
            rate. None: ``measure.arrival_rate_per_s``, phase 04's load.
    """

    kind: Literal["client", "haproxy", "command"] = "client"
    binary: str = Field(default="haproxy", min_length=1, max_length=512)
    socket: str = Field(default="", max_length=512)
    url: str = Field(default="", max_length=512)
    backend: str = Field(default="migration", min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    source_server: str = Field(default="source", min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    target_server: str = Field(default="target", min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    set_command: tuple[str, ...] = ()
    read_command: tuple[str, ...] = ()
    drain_command: tuple[str, ...] = ()
    share_tolerance: float = Field(default=0.05, ge=0, le=0.5)
    rollback_within_s: float = Field(default=5.0, gt=0, le=600)
    arrival_rate_per_s: float | None = Field(default=None, gt=0, le=10_000)

    @model_validator(mode="after")
    def _complete(self) -> "RouterParams":
        if self.kind == "command" and not (self.set_command and self.read_command and self.url):
            raise ValueError("router kind 'command' needs set_command, read_command and url (the router's front URL)")
        if self.kind == "command":
            text = " ".join(self.set_command)
            unfilled = [k for k in ("{source}", "{target}") if k not in text]
            if unfilled:
                raise ValueError(f"router.set_command {list(self.set_command)} has no {' or '.join(unfilled)}: the "
                                 "runbook fills them with the weights (percent) of each step, so without them every "
                                 "step would set the same weights; put both placeholders in the argv")
            if self.drain_command and "{side}" not in " ".join(self.drain_command):
                raise ValueError(f"router.drain_command {list(self.drain_command)} has no {{side}}: the runbook fills "
                                 "it with the side to drain; put the placeholder in the argv or remove drain_command")
        if self.kind != "command" and (self.set_command or self.read_command or self.drain_command):
            raise ValueError(f"set_command, read_command and drain_command are for router kind 'command', not "
                             f"{self.kind!r}; remove them")
        if self.socket and not self.url:
            raise ValueError("router.socket names an existing HAProxy: give its front URL in router.url too")
        if self.kind == "haproxy" and self.url and not self.socket:
            raise ValueError(f"router.url {self.url!r} names an existing router's front, but router.socket is empty, "
                             "so the runbook would start its own HAProxy on loopback and never use that URL; give "
                             "the existing HAProxy's admin socket in router.socket, or remove router.url")
        if self.url:
            why = _url_problem(self.url)
            if why:
                raise ValueError(f"router.url {self.url!r} is not a usable http(s) URL: {why}; give the router's "
                                 "front as http://host:port")
        return self


class Cutover(_Model):
    """Phase 05: traffic (or job) percentages per slice step and the rollback window.

    Attributes:
        mode: how work moves, by the workload's data semantics (the migration design's step 5,
            "quiesce or dual-run according to data semantics"; docs/explanation/cutover.md). ``quiesce``
            (training, its only mode: a job has one writer): the source stops at a verified
            checkpoint, the target resumes from it, then the route switches. ``drain``
            (inference default): each step's in-flight requests finish on both sides, and the
            endpoints report nothing queued or running, before the route moves. ``dual_run``
            (inference): both sides serve every request of the window; the route decides whose
            answer is returned, and the other answer is compared (shadow traffic), so the
            target carries full load and is judged on all of it from the first step.
        on_rollback: what phase 06 does with what the target wrote during the cutover (a
            training job's checkpoint sets) when the decision is not GO; every write is listed
            with its sha256 first, whatever the rule. ``keep``: left in place, the source resumes
            from the rollback point; ``copy_back``: the target's newest verified set is copied
            to ``runs/<run_id>/reconciled`` and verified, so the source can resume from the
            target's progress; ``discard``: deleted after listing.
        rollback_owner: the person who may order a rollback while the window is open (a name or
            a role address, recorded with the rollback point); empty: nobody is named, and the
            rollback point says so.
        router: what moves an inference cutover's traffic (:class:`RouterParams`).
        steps_percent: the share of traffic (or jobs) on the target at each step, strictly
            increasing and ending at 100.
        requests_per_step: requests judged at each step of an inference cutover.
        rollback_window_s: how long, seconds, the source stays able to take the traffic back;
            a window that closes early is NO-GO.
    """

    steps_percent: tuple[int, ...] = (10, 50, 100)
    requests_per_step: int = Field(default=20, ge=1, le=1_000_000)
    rollback_window_s: float = Field(default=3600.0, gt=0, le=MAX_WINDOW_S)
    rollback_owner: str = Field(default="", max_length=200)
    on_rollback: Literal["keep", "copy_back", "discard"] = "keep"
    mode: Literal["quiesce", "drain", "dual_run"] | None = None
    router: RouterParams = RouterParams()

    @field_validator("steps_percent")
    @classmethod
    def _increasing(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or any(not 0 < s <= 100 for s in v) or list(v) != sorted(set(v)) or v[-1] != 100:
            raise ValueError("must be strictly increasing percentages in (0, 100] ending at 100 (a cutover "
                             "that stops short leaves traffic split)")
        return v


class Approvals(_Model):
    """Who approves the plans a run shows before it creates, changes or destroys anything.

    Attributes:
        preapproved_local: plans on the embedded local provider are approved by these params
            (recorded as such).
        preapproved_simulator: plans on a provider whose API says it is a loopback simulator
            (``runbook simulate``, ``make rehearse``) are approved by these params: nothing real is
            created or billed; a real API never says so.
        approval_file: a JSON approval record for headless runs (``runbook approve`` writes one).
    """

    preapproved_local: bool = False
    preapproved_simulator: bool = False
    approval_file: str = ""


class Evidence(_Model):
    """How the run's seal is signed.

    Attributes:
        signing_key: a reference (``env:VAR`` holding the PEM text, or ``file:/path``) to an
            ed25519 private key in PKCS#8 PEM (``runbook keygen`` writes one); empty: the seal is
            not signed. When set, every seal of the run is signed (:mod:`runbook_lib.evidence.signing`); a
            key that cannot be read fails the run before phase 01 rather than seal it unsigned.
    """

    signing_key: str = Field(default="", pattern=_REF)


class Run(_Model):
    """Execution limits.

    Attributes:
        cell_timeout_s: bounds every notebook cell, whole seconds (nbclient's ``timeout`` is an
            integer).
        teardown_source: phase 06 also destroys the source resources the run created.
        acceptance_budget_s: wall seconds the canary's acceptance job (launch to completion
            marker, phase 03) may take: ten minutes by default, the portability guidance's
            "ten-minute acceptance job" (docs/reference/portability.md). Scored unless set.
    """

    cell_timeout_s: int = Field(default=600, ge=1, le=7 * 86_400)
    teardown_source: bool = True
    acceptance_budget_s: float = Field(default=600.0, gt=0, le=7 * 86_400)


RaceObjective = Literal["cost_per_accepted_unit", "latency_p95", "throughput"]


class Race(_Model):
    """How phase 04 picks among several ``targets`` (issue 50): every candidate that phase 03
    proved is measured beside the same source in interleaved rounds, and leaves the race as soon
    as it confidently fails a blocking gate or is confidently worse than another on ``objective``
    (:mod:`runbook_lib.gates.race`). Read only with ``targets``.

    Attributes:
        objective: what the pick minimises or maximises, subject to the blocking gates:
            ``cost_per_accepted_unit`` (USD per accepted unit, lower is better), ``latency_p95``
            (lower) or ``throughput`` (higher).
    """

    objective: RaceObjective = "cost_per_accepted_unit"


class Rehearsal(_Model):
    """Written by ``runbook rehearse`` into the copy of a params file it runs against the
    simulators: which file it rehearses and every value it changed, so the evidence says what
    differs from the real migration.

    Attributes:
        of: the rehearsed params file, relative to the project.
        sha256: sha256 of that file's bytes.
        overrides: each change as ``dotted.field = value``.
        faults: the scripted faults the simulators served (a fault drill's ``--faults`` file,
            per provider); empty for a plain rehearsal.
        stand_ins: ``kind: service``: per image, the local command the simulators' machines
            ran for it (``workload.service.stand_in``, ``{project}`` filled), so the evidence
            says no registry image ran.
    """

    of: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    overrides: tuple[str, ...] = ()
    faults: dict[str, Any] = Field(default_factory=dict)
    stand_ins: dict[str, tuple[str, ...]] = Field(default_factory=dict)


DIGEST_FIELDS = frozenset({"rehearsal.sha256", "source.declared.digest", "source.declared.image", "source.image",
                           "target.image", "workload.service.image"})
"""Fields that hold a sha256 digest by definition (an image named ``name@sha256:<64 hex>`` among
them): 64 hex digits there are a checksum, not a key."""


def pod_params(path: str | Path) -> "Migration":
    """The params a pod or endpoint worker runs with: :func:`load_params` of ``path`` with the
    candidate :data:`~runbook_lib.layout.POD_CANDIDATE_ENV` names as the target (an alternate, or
    a raced candidate: its own profile, batch size, threads and fault), so a candidate's machine
    never runs as the params' first target.

    Raises:
        ParamsError: the params are invalid, or name no such candidate.
    """
    mig = load_params(path)
    name = os.environ.get(POD_CANDIDATE_ENV, "")
    return mig.with_target(name) if name else mig


def _race_problems(mig: "Migration") -> None:
    """Raise what keeps ``mig``'s race (``targets``) from running: two or more candidates with
    their own names, the first the ``target``, each keeping the first's constraints, for a
    serving workload judged sequentially, without ``alternates``; ``race`` only with ``targets``.

    Raises:
        ValueError: every problem found, in one message.
    """
    if not mig.targets:
        if "race" in mig.model_fields_set:
            raise ValueError("race: is read only with targets: (several candidates raced in phase 04); remove "
                             "it, or list the candidates under targets:")
        return
    names = [mig.source.name, *(t.name for t in mig.targets)]
    problems = []
    if len(mig.targets) < 2:
        problems.append(f"targets lists {len(mig.targets)} candidate; a race needs two or more (one target: "
                        "use target:)")
    if mig.targets[0] != mig.target:
        problems.append("target: and targets: are both given and target is not targets[0]; give one target "
                        "(target:) or several candidates (targets:)")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        problems.append(f"the names {twice} are used more than once among source and targets; each candidate "
                        "needs its own name (it names the candidate in evidence)")
    if mig.alternates:
        problems.append("alternates: are a single target's documented stand-ins; in a race a candidate without "
                        "capacity is out and the others go on. List the alternates as targets instead")
    if mig.workload.kind not in ("inference", "service"):
        problems.append(f"a race of targets measures serving rounds; workload.kind is {mig.workload.kind!r}. "
                        "Migrate a training job to one target")
    if mig.gates.method != "sequential":
        problems.append("the race looks after every pair of rounds with anytime-valid sequences: set "
                        "gates.method: sequential (measure.min_rounds to measure.max_rounds pairs)")
    for i, cand in enumerate(mig.targets):
        if isinstance(cand, LiveProfile):
            problems.append(f"targets[{i}] ({cand.name}) is provider 'live'; a candidate is launched and torn "
                            "down by the runbook")
        elif i and relaxed_constraints(mig.targets[0], cand):
            problems.append(f"targets[{i}] ({cand.name}) relaxes the first candidate's constraints: "
                            + "; ".join(relaxed_constraints(mig.targets[0], cand)))
    if problems:
        raise ValueError("; ".join(problems))


class Migration(_Model):
    """A whole migration, as validated from one YAML file.

    Attributes:
        migration: the migration's name (lowercase letters, digits, dashes); in every run id.
        description: free text, shown in the report.
        workload: what moves (:class:`Workload`).
        source: where it runs today: a ``local``, ``runpod`` or ``vast`` profile, or ``live``: a
            running service at a URL that the runbook did not start (:class:`LiveProfile`).
        target: where it moves: a ``local``, ``runpod`` or ``vast`` profile.
        alternates: documented alternates of the target, in the order they are proposed: when no
            ranked offer of the target (or of the alternate before) becomes ready within its
            ``offer.capacity_budget_s``, phase 03 proposes the next one and proves it on its own
            canary only under an approval that names it and gives a reason (``runbook approve
            --reason``); without one the run HOLDs with a retry time. Each alternate is a target
            profile under its own name that keeps every constraint of the target
            (:func:`relaxed_constraints`); the gates are the migration's, for whichever side runs.
        targets: several candidate targets raced in one run, instead of one ``target``: each a
            target profile under its own name. Phase 02 maps every candidate, phase 03 proves each
            on its own canary (one that fails is out, with its reason), phase 04 races those left
            (:class:`Race`) and the pick goes on to phases 05 and 06. ``target`` is then the first
            candidate (set from it when left out). Needs ``gates.method: sequential`` (the race
            looks after every pair of rounds) and a serving workload.
        race: how the race picks (:class:`Race`); read only with ``targets``.
        storage: where checkpoints, golden outputs and results go (:class:`Storage`).
        measure: phase 04's protocol (:class:`Measure`).
        gates: the thresholds (:class:`Gates`).
        drills: phase 04's fault drills (:class:`Drills`).
        cutover: phase 05 (:class:`Cutover`).
        approvals: who approves plans (:class:`Approvals`).
        evidence: how the seal is signed (:class:`Evidence`).
        run: execution limits (:class:`Run`).
        rehearsal: written by ``runbook rehearse`` into its copy of the params: every override it
            made (never set by hand).
    """

    migration: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str = ""
    workload: Workload
    source: Profile
    target: Profile
    alternates: tuple[Profile, ...] = ()
    targets: tuple[Profile, ...] = ()
    race: Race = Race()
    storage: Storage = Storage()
    measure: Measure = Measure()
    gates: Gates = Gates()
    drills: Drills = Drills()
    cutover: Cutover = Cutover()
    approvals: Approvals = Approvals()
    evidence: Evidence = Evidence()
    run: Run = Run()
    rehearsal: Rehearsal | None = None

    @property
    def candidates(self) -> tuple[AnyProfile, ...]:
        """The target and its alternates, in the order phase 03 tries them; with ``targets``,
        every raced candidate in the params' order."""
        return self.targets or (self.target, *self.alternates)

    @property
    def racing(self) -> bool:
        """Whether phase 04 races several ``targets``."""
        return len(self.targets) > 1

    def with_target(self, name: str) -> "Migration":
        """These params with the candidate ``name`` (the target or an alternate) as the target:
        what the phases after phase 03 run with when its canary was proven on an alternate.

        Raises:
            ParamsError: no candidate has that name.
        """
        if name == self.target.name:
            return self
        for cand in self.targets:  # a raced candidate: the race's other candidates stay in targets
            if cand.name == name:
                return self.model_copy(update={"target": cand})
        for alt in self.alternates:
            if alt.name == name:  # the other candidates stay candidates, the params' target first
                others = (self.target, *(a for a in self.alternates if a.name != name))
                return self.model_copy(update={"target": alt, "alternates": others})
        raise ParamsError(f"no target or alternate is named {name!r}; the candidates are "
                          f"{[c.name for c in self.candidates]}. The params changed since the record was written: "
                          "run the migration again")

    @model_validator(mode="before")
    @classmethod
    def _drills_by_kind(cls, data: Any) -> Any:
        """``drills.run`` unset: the drills that apply to the workload (:class:`Drills`); and
        ``targets`` without ``target``: the first candidate is ``target`` (what every phase before
        the race's pick reads as the target's constraints)."""
        if isinstance(data, dict) and data.get("targets") and data.get("target") is None \
                and isinstance(data["targets"], (list, tuple)):
            data = {**data, "target": data["targets"][0]}
        if not isinstance(data, dict) or not isinstance(data.get("workload"), dict):
            return data
        drills = data.get("drills") if isinstance(data.get("drills"), dict) else {}
        if data["workload"].get("kind") == "training" and "run" not in (drills or {}):
            return {**data, "drills": {**(drills or {}), "run": list(TRAINING_DRILLS)}}
        return data

    @model_validator(mode="after")
    def _training_only(self) -> "Migration":
        """Job drills and data-parallel processes are for a training job."""
        many = [f"{side}.world_size {p.world_size}" for side, p in (("source", self.source), ("target", self.target))
                if p.world_size > 1]
        if many and self.workload.kind != "training":
            raise ValueError(f"{' and '.join(many)}: data-parallel processes are for a training job, not a "
                             f"{self.workload.kind} workload (its processes are workers); set world_size: 1")
        job = [d for d in self.drills.run if d in (*JOB_DRILL_NAMES, *POD_DRILL_NAMES)]
        if job and self.workload.kind != "training":
            raise ValueError(f"drills.run names {job}, drills of a training job, for a {self.workload.kind} "
                             "workload; remove them")
        return self

    @model_validator(mode="after")
    def _schedules_on_the_source(self) -> "Migration":
        if self.target.schedules:
            raise ValueError("target.schedules: schedules are what starts the workload today, on the source; each "
                             "names how it starts the target (target_dag_id, target_value, target_line or "
                             "set_command). Move them to source.schedules")
        names = [s.name for s in self.source.schedules]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"source.schedules names {twice} more than once; each schedule needs its own name")
        return self

    @model_validator(mode="after")
    def _alternates_keep_the_constraints(self) -> "Migration":
        """Source and target differ; each alternate keeps the target's constraints under a name of its
        own; a race is one the runbook can run (:func:`_race_problems`)."""
        if self.source.name == self.target.name:
            raise ValueError(f"source.name and target.name must differ, both are {self.source.name!r}")
        _race_problems(self)
        names = [self.source.name, self.target.name, *(a.name for a in self.alternates)]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"alternates: the names {twice} are used more than once among source, target and "
                             "alternates; each alternate needs its own name (it names the candidate in evidence "
                             "and in its approval)")
        for i, alt in enumerate(self.alternates):
            if isinstance(alt, LiveProfile):
                raise ValueError(f"alternates[{i}] ({alt.name}) is provider 'live': an alternate is a target the "
                                 "runbook launches and tears down; give it a local, runpod or vast profile")
            if alt.schedules:
                raise ValueError(f"alternates[{i}].schedules: schedules belong to the source; remove them")
            why = relaxed_constraints(self.target, alt)
            if why:
                raise ValueError(f"alternates[{i}] ({alt.name}) relaxes the target's constraints: {'; '.join(why)}. "
                                 "An alternate may differ in provider, GPU model, cloud, region and price, never in "
                                 "what the workload needs; raise it to the target's value")
        return self

    @model_validator(mode="after")
    def _offers_only_on_the_target(self) -> "Migration":
        if isinstance(self.source, LocalProfile) and self.source.offers:
            raise ValueError("source.offers: the source is the machine that runs today, so nothing ranks or uses "
                             "offers there; move them to target.offers or remove them")
        return self

    @model_validator(mode="after")
    def _live_source(self) -> "Migration":
        if isinstance(self.target, LiveProfile):
            raise ValueError("target.provider is 'live': the target is what the runbook launches, measures and "
                             "tears down; a live service (url) can only be the source. Give the target a local, "
                             "runpod or vast profile")
        src = self.source
        if not isinstance(src, LiveProfile):
            return self
        if self.workload.kind != "service":
            raise ValueError(f"source.provider 'live' is a team's running service, judged over its own API; "
                             f"workload.kind is {self.workload.kind!r}. Use kind: service with workload.service, or "
                             "a local, runpod or vast source")
        svc = self.workload.service
        if svc is not None and svc.protocol == "openai-chat" and src.url.rstrip("/").endswith("/v1"):
            raise ValueError(f"source.url {src.url!r} ends in /v1, and the openai-chat paths (/v1/chat/completions, "
                             "/v1/models) already start with it: requests would go to /v1/v1/...; give the base URL "
                             "without /v1")
        if svc is not None and src.declared.image and src.declared.image != svc.image:
            raise ValueError(f"source.declared.image {src.declared.image!r} differs from workload.service.image "
                             f"{svc.image!r}: the target runs workload.service.image unchanged, so it must be what the "
                             "live source runs; make them the same or leave source.declared.image out")
        if self.gates.method == "sequential":
            raise ValueError("gates.method 'sequential' is not built for a live source: its per-pair throughput and "
                             "cost traces need the source's saturation bursts, which a live source never gets, so it "
                             "would run to its last pair and HOLD; use gates.method: fixed")
        cap = src.max_rate_per_s
        if self.measure.arrival_rate_per_s > cap:
            raise ValueError(f"measure.arrival_rate_per_s = {self.measure.arrival_rate_per_s:g} exceeds "
                             f"source.max_rate_per_s = {cap:g}: phase 04's rounds send the live source that rate; "
                             f"lower measure.arrival_rate_per_s to at most {cap:g} (both sides get the same schedule)")
        if self.cutover.router.kind == "haproxy":
            parts = urlsplit(src.url)
            why = ("it is https (the runbook's HAProxy speaks plain HTTP to its servers)" if parts.scheme != "http"
                   else "it has a path (HAProxy forwards to a host and port, not a path prefix)"
                   if parts.path.strip("/") else
                   "it needs a bearer token (source.auth_ref), which the replay through the router does not send"
                   if src.auth_ref else "")
            if why:
                raise ValueError(f"cutover.router.kind 'haproxy' cannot route to the live source {src.url!r}: {why}; "
                                 "use router kind command with the team's own gateway in front of it, or kind client "
                                 "(the runbook's own split of its test requests)")
        if self.cutover.router.kind != "client":
            rate = self.cutover.router.arrival_rate_per_s or self.measure.arrival_rate_per_s
            checks = HAPROXY_CHECKS_PER_S if self.cutover.router.kind == "haproxy" else 0.0
            if rate + checks > cap:
                raise ValueError(
                    f"the routed cutover sends the live source up to {rate:g} requests/s (all of them before the first "
                    "step and after a rollback)" + (f" plus HAProxy's health checks, up to {checks:g} in a second" if checks else "")
                    + f", more than source.max_rate_per_s = {cap:g}; lower cutover.router.arrival_rate_per_s to at "
                    f"most {cap - checks:g}")
        return self

    @model_validator(mode="after")
    def _serverless_services(self) -> "Migration":
        svc = self.workload.service
        for side, prof in (("source", self.source), ("target", self.target)):
            sv = getattr(prof, "serverless", None)
            if sv is None:
                continue
            lb = isinstance(sv, RunpodServerless) and sv.type == "LOAD_BALANCER"
            where = "a Vast.ai Serverless endpoint" if isinstance(prof, VastProfile) else \
                "a Runpod Serverless load-balancing endpoint" if lb else "a Runpod Serverless queue endpoint"
            if svc is None or (svc.protocol == "runpod-handler") == lb:
                raise ValueError(
                    f"{side}.serverless runs "
                    + ("a team's HTTP server (workload.kind service, protocol openai-chat or http-json)" if lb else
                       "a team's Runpod handler (workload.kind service, protocol runpod-handler)")
                    + f" on {where}; this workload is "
                    + (f"kind {self.workload.kind!r}" if svc is None else f"protocol {svc.protocol!r}")
                    + (". An inference workload's endpoint follows endpoint_mode: remove serverless" if svc is None
                       else f", which {where} is not built to serve here: "
                       + ("set type: QUEUE (a handler's job API), or remove serverless to run it on a pod" if lb else
                          "set type: LOAD_BALANCER (an HTTP server behind Runpod's load balancer), or remove "
                          "serverless to run it on a pod" if isinstance(prof, RunpodProfile) else
                          "remove serverless to run it on a pod")))
            if isinstance(prof, VastProfile) and side == "source":
                raise ValueError("source.serverless on Vast.ai: a Vast.ai Serverless endpoint is built as a target "
                                 "only (the service moves onto it); give the source a pod, a Runpod endpoint or a "
                                 "live URL")
            if svc.private_image:
                raise ValueError(f"{side}.serverless with a private image: the runbook sends no registry login for "
                                 f"{where} (" + ("its template's docker_login fields are sent empty" if
                                                 isinstance(prof, VastProfile) else
                                                 "POST /v2/serverless has no registry field; a Runpod template "
                                                 "carries it, and templates are not built here")
                                 + "); use a public image or a pod side")
            other = "target" if side == "source" else "source"
            if self.measure.cold_starts and "cold_starts" in self.measure.model_fields_set \
                    and getattr(getattr(self, other), "serverless", None) is None:
                raise ValueError(f"measure.cold_starts = {self.measure.cold_starts}: cold starts from zero are "
                                 f"compared between two Serverless endpoints, and the {other} is "
                                 + ("a live service" if isinstance(getattr(self, other), LiveProfile) else "a pod")
                                 + ", which does not scale to zero; set measure.cold_starts: 0 (each side's first "
                                 "job after its launch still pays its cold start, judged as the launch's)")
            if isinstance(prof, RemoteProfile) and prof.pod_id:
                raise ValueError(f"{side}.pod_id names a pod, but {side}.serverless runs the service on {where}: the "
                                 "pod would be described and the endpoint never read. Remove pod_id (an endpoint "
                                 "serving today is not read yet: params declare its settings)")
            self._serverless_settings(side, prof, sv, svc)
        return self

    def _serverless_settings(self, side: str, prof: Any, sv: Any, svc: Service) -> None:
        """What a serverless side would otherwise accept and ignore, refused with its fix."""
        if isinstance(sv, VastServerless):
            unread = {"workers", "active_workers", "idle_timeout_s", "gpu_priority"} & prof.model_fields_set
            if unread:
                raise ValueError(f"{', '.join(f'{side}.{n}' for n in sorted(unread))} {'is' if len(unread) == 1 else 'are'} "
                                 f"not read for a Vast.ai Serverless side: its scaling is {side}.serverless "
                                 "(max_workers, cold_workers, min_load, target_util, cold_mult) and its GPUs are "
                                 f"{side}.offer; remove them")
            if not svc.command:
                raise ValueError(f"{side}.serverless on Vast.ai runs workload.service.command as its template's "
                                 "onstart, in front of which the PyWorker forwards requests; it is empty, so nothing "
                                 "would start the service's server. Give the command that serves "
                                 f"{sv.pyworker.route} on workload.service.port")
        elif sv.type == "LOAD_BALANCER":
            if svc.readiness.path != LB_PING:
                raise ValueError(f"{side}.serverless type LOAD_BALANCER: Runpod sends a worker requests only once GET "
                                 f"{LB_PING} on its PORT_HEALTH answers 200 (204 while it initializes); "
                                 f"workload.service.readiness.path is {svc.readiness.path!r}. Set it to {LB_PING} if "
                                 "the image serves it, or run the service on a pod")
            if svc.readiness.status != 200:
                raise ValueError(f"{side}.serverless type LOAD_BALANCER: a worker is healthy when {LB_PING} answers "
                                 f"200 (204 means initializing); workload.service.readiness.status is "
                                 f"{svc.readiness.status}: set it to 200 or leave it out")
            taken = sorted(set(RUNPOD_LB_ENV_NAMES) & set(svc.env))
            if taken:
                raise ValueError(f"workload.service.env sets {', '.join(taken)}, which a Runpod load-balancing endpoint "
                                 f"sets itself to workload.service.port ({svc.port}); remove "
                                 f"{'it' if len(taken) == 1 else 'them'} and set workload.service.port instead")
            if self.workload.requirements.max_request_s > LB_MAX_REQUEST_S:
                raise ValueError(f"workload.requirements.max_request_s = {self.workload.requirements.max_request_s:g} "
                                 f"exceeds the {LB_MAX_REQUEST_S:g} s a Runpod load-balancing endpoint serves a "
                                 "request before it answers 524; lower max_request_s or run the service on a pod")
        elif self.workload.requirements.max_request_s > sv.execution_timeout_s:
            raise ValueError(f"workload.requirements.max_request_s = {self.workload.requirements.max_request_s:g} "
                             f"exceeds {side}.serverless.execution_timeout_s = {sv.execution_timeout_s:g}: the "
                             "endpoint would end a request that long TIMED_OUT; raise execution_timeout_s or lower "
                             "max_request_s")

    @model_validator(mode="after")
    def _images(self) -> "Migration":
        svc = self.workload.service
        for side, prof in (("source", self.source), ("target", self.target)):
            if not isinstance(prof, RemoteProfile):
                continue
            if svc is None and not prof.image:
                raise ValueError(f"{side}.image is missing: a {prof.provider} pod runs a container image, and for "
                                 f"kind {self.workload.kind!r} it must contain this package; name its tag or digest")
            if svc is not None and prof.image and prof.image != svc.image:
                raise ValueError(f"{side}.image {prof.image!r} differs from workload.service.image {svc.image!r}: a "
                                 "service runs its own image unchanged on both sides; remove "
                                 f"{side}.image or make it the same")
        return self

    @model_validator(mode="after")
    def _mode_fits_the_data(self) -> "Migration":
        mode, kind = self.cutover.mode, self.workload.kind
        if kind in ("training", "checkpoint") and mode not in (None, "quiesce"):
            raise ValueError(f"cutover.mode {mode!r} does not fit a training job: it has one writer, so it moves by "
                             "quiesce (stop at a verified checkpoint, resume on the target, switch); set quiesce or "
                             "leave it out")
        router = self.cutover.router.kind
        if router != "client":
            why = self._unroutable()
            if why:
                raise ValueError(f"cutover.router.kind {router!r} cannot route this cutover: {why}")
            rate = self.cutover.router.arrival_rate_per_s or self.measure.arrival_rate_per_s
            windows = len(self.cutover.steps_percent) + 1  # the steady state, then each step
            least_s = windows * self.cutover.requests_per_step / rate
            if least_s > self.run.cell_timeout_s:
                raise ValueError(
                    f"the routed cutover's replay needs at least {least_s:.0f} s ({windows} windows of "
                    f"cutover.requests_per_step = {self.cutover.requests_per_step} requests at {rate:g}/s), more than "
                    f"run.cell_timeout_s = {self.run.cell_timeout_s} s allows phase 05's cell; raise "
                    "cutover.router.arrival_rate_per_s or run.cell_timeout_s, or lower cutover.requests_per_step")
        fixed_only, sequential_only = {"rounds", "max_extra_rounds"}, {"min_rounds", "max_rounds", "max_seconds"}
        unread = (fixed_only if self.gates.method == "sequential" else sequential_only) & self.measure.model_fields_set
        if unread:
            names = ", ".join(f"measure.{n}" for n in sorted(unread))
            raise ValueError(f"{names} {'is' if len(unread) == 1 else 'are'} not read under gates.method "
                             f"{self.gates.method!r}: the fixed method measures measure.rounds (plus max_extra_rounds), "
                             "the sequential one stops between measure.min_rounds and measure.max_rounds a side "
                             "(or at measure.max_seconds); "
                             "remove it or change gates.method")
        if kind in ("inference", "service") and mode == "quiesce":
            raise ValueError("cutover.mode 'quiesce' stops writes; an inference endpoint serves requests and moves by "
                             "drain (finish in-flight work, then switch) or dual_run (both sides serve the window); "
                             "set one of those or leave it out (drain)")
        return self

    def _unroutable(self) -> str:
        """Why a real router (HAProxy, a command router) cannot carry this cutover's traffic, or
        empty: it routes requests one by one, each to either side (:class:`RouterParams`)."""
        mode, kind = self.cutover.mode, self.workload.kind
        if kind not in ("inference", "service"):
            return (f"a {kind} cutover moves pods, not requests (workload.kind is {kind!r}); remove cutover.router")
        if mode == "dual_run":
            return ("cutover.mode dual_run sends every request to both sides itself, so no router splits them; set "
                    "cutover.mode drain, or router kind client (the runbook's own split of its test requests)")
        for side in ("source", "target"):
            sv = getattr(getattr(self, side), "serverless", None)
            if sv is None:
                continue
            how = ("Vast.ai's /route/ then a signed call to the worker it names" if isinstance(sv, VastServerless) else
                   "Runpod's load balancer at https://{id}.api.runpod.ai over https, with the Runpod key"
                   if sv.type == "LOAD_BALANCER" else
                   "Runpod's job API with the Runpod key, whose /status/{id} poll carries nothing a router can keep "
                   "on the side that holds it")
            return (f"the {side} is a serverless endpoint, reached through its provider's own front door ({how}), "
                    "not a host and port a router forwards to; use router kind client (the runbook's own split of "
                    "its test requests)")
        if kind == "inference":
            modes = {side: getattr(getattr(self, side), "endpoint_mode", None) for side in ("source", "target")}
            if any(m != "load_balancing" for m in modes.values()):
                return (f"an inference endpoint is routed only between load-balancing endpoints; source and target "
                        f"endpoint_mode are {modes['source']!r} and {modes['target']!r} (a queue endpoint's job "
                        "is polled at /status/{id}, and nothing in that path lets the router keep the poll on the "
                        "side that holds the job); set both sides' endpoint_mode: load_balancing, or router kind "
                        "client (the runbook's own split of its test requests)")
        return ""

    @property
    def cutover_mode(self) -> str:
        """``cutover.mode``, or the workload's default: ``drain`` for inference and services, ``quiesce`` for training
        and checkpoint (one writer: the checkpoint's authoritative copy moves while nothing writes it)."""
        return self.cutover.mode or ("drain" if self.workload.serves else "quiesce")


MAX_YAML_DEPTH = 32
"""Deepest nesting of mappings and lists a params file may have (the deepest real section is 4)."""
MAX_PARAMS_BYTES = 1024 * 1024
"""Largest params file read, bytes (the shipped ones are under 8 KiB)."""
MAX_INT_DIGITS = 30
"""Most digits an integer in params may have: every count, size and limit fits in far fewer, and
Python refuses to convert past 4,300 digits with a ValueError that is no params error."""


class _Yaml12Loader(yaml.SafeLoader):
    """SafeLoader that keeps dates and yes/no/on/off as strings (YAML 1.2 core schema) and refuses
    what would change a file's meaning silently or blow it up: a key given twice in one mapping
    (PyYAML keeps the last, so a second ``gates:`` would drop the first's reviewed limits), anchors
    and aliases (``&a`` / ``*a``: expanding them is how a few lines become gigabytes), nesting
    deeper than :data:`MAX_YAML_DEPTH`, and ``.inf`` / ``.nan`` (no rate, window, count or price
    is infinite)."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]  # unannotated in types-PyYAML
            raise yaml.constructor.ConstructorError(
                None, None, "an alias (*name) is not accepted in params: write the value out where it is used", mark)
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if getattr(event, "anchor", None):
            raise yaml.constructor.ConstructorError(
                None, None, f"an anchor (&{event.anchor}) is not accepted in params: write each value out",
                event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.constructor.ConstructorError(
                    None, None, f"nesting deeper than {MAX_YAML_DEPTH} levels; params sections are at most a few "
                    "levels deep", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    f"in the mapping at line {node.start_mark.line + 1}", node.start_mark,
                    f"key {key!r} is given twice (first at line {seen[key].line + 1}); a second one would replace "
                    "the first silently: merge them into one", key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> int:
        digits = sum(ch.isdigit() for ch in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {digits} digits (at most {MAX_INT_DIGITS}); no count, size or limit is "
                "that large", node.start_mark)
        return int(super().construct_yaml_int(node))

    def construct_yaml_float(self, node: Any) -> float:
        value = super().construct_yaml_float(node)
        if value != value or value in (float("inf"), float("-inf")):
            raise yaml.constructor.ConstructorError(
                None, None, f"{node.value!r} is not a finite number; give the value itself", node.start_mark)
        return float(value)


_Yaml12Loader.add_constructor("tag:yaml.org,2002:float", _Yaml12Loader.construct_yaml_float)
_Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _Yaml12Loader.construct_yaml_int)


class _NoAliasDumper(yaml.SafeDumper):
    """Writes a value that appears twice twice, never as an anchor and alias (which the loader refuses)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(data: dict[str, Any]) -> str:
    """``data`` as params YAML text that :func:`parse_yaml` reads back: keys in their order, no
    anchors or aliases."""
    return str(yaml.dump(data, Dumper=_NoAliasDumper, sort_keys=False))


_Yaml12Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp")]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


NOT_SECRET_FIELDS = frozenset({"workload.service.drills.idempotency_key"})
"""Fields whose names look like a credential's but hold a name (an input field), echoed in errors."""


def _secret_field(field: str) -> bool:
    if field in NOT_SECRET_FIELDS:
        return False
    return any(part in field for part in ("ref", "secret", "token", "password", "key"))


def parse_yaml(text: str, *, origin: str = "<string>") -> dict[str, Any]:
    """Parse migration YAML text into a plain dict (YAML 1.2 booleans, dates as strings).

    Raises:
        ParamsError: the text is not YAML or its top level is not a mapping.
    """
    try:
        data = yaml.load(text, Loader=_Yaml12Loader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ParamsError(f"{origin}: not valid YAML: {exc}. Fix the syntax and run again.") from exc
    if not isinstance(data, dict):
        raise ParamsError(
            f"{origin}: the top level must be a mapping of sections (migration, workload, source, "
            f"target, ...), got {type(data).__name__}"
        )
    return data


def operator_set(mig: Migration, setting: str) -> bool:
    """Whether the params file set ``setting`` (a dotted field path) explicitly, as pydantic's
    ``model_fields_set`` records it; a default is not a choice."""
    *parents, name = setting.split(".")
    model = mig
    for part in parents:
        if part not in model.model_fields_set:
            return False
        model = getattr(model, part)
    return name in model.model_fields_set


def _field_path(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """A pydantic error location as the YAML spells it: the profile union's tag (``source.local``,
    ``target.vast``) is not a key in the file, so it is left out."""
    tags = {e.name for e in PROVIDER_TABLE}
    return tuple(p for i, p in enumerate(loc) if not (i == 1 and loc[0] in ("source", "target") and p in tags))


def validate(data: dict[str, Any], *, origin: str = "<params>") -> Migration:
    """Validate a params mapping into a :class:`Migration`.

    Raises:
        ParamsError: names every offending field, the value seen and what is allowed; a value that
            looks like a credential is refused by field name, without echoing it.
    """
    found = [(f, kind) for f, kind in credential_findings(data) if f not in DIGEST_FIELDS]
    if found:
        lines = "\n".join(f"  - {field}: looks like {kind} (value not shown)" for field, kind in found)
        raise ParamsError(f"{origin}: params must name credentials by reference (env:VAR or file:/path), never "
                          f"hold them; nothing was run:\n{lines}", field=found[0][0])
    try:
        return Migration.model_validate(data)
    except ValidationError as exc:
        problems: list[str] = []
        first_field, first_value = "", None
        for err in exc.errors():
            field = ".".join(str(p) for p in _field_path(err["loc"])) or "(top level)"
            value = err.get("input")
            shown = "(missing)" if err["type"] == "missing" else repr(value)
            if _secret_field(field):  # never echo what may be a credential
                shown = f"<{len(str(value))} characters, not shown; use env:VAR or file:/path>"
                value = None
            if len(shown) > 80:
                shown = shown[:77] + "..."
            problems.append(f"  - {field}: {err['msg']} (got {shown})")
            if not first_field:
                first_field, first_value = field, value
        raise ParamsError(
            f"{origin}: {len(problems)} invalid field(s); nothing was run:\n" + "\n".join(problems),
            field=first_field,
            value=first_value,
        ) from None


def load_params(path: str | Path) -> Migration:
    """Read and validate a migration YAML file.

    Args:
        path: path of the YAML file.

    Returns:
        The frozen :class:`Migration`.

    Raises:
        ParamsError: the file is missing, unreadable, over :data:`MAX_PARAMS_BYTES`, not UTF-8, not
            YAML, or a field is invalid.
    """
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_PARAMS_BYTES + 1)
    except OSError as exc:
        raise ParamsError(f"cannot read params file {p}: {exc.strerror}. Pass an existing YAML file.") from exc
    if len(raw) > MAX_PARAMS_BYTES:
        raise ParamsError(f"{p}: larger than {MAX_PARAMS_BYTES // 1024} KiB; a params file is a few kilobytes of "
                          "sections: pass the migration's YAML file, not data")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParamsError(f"{p}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); params are YAML "
                          "in UTF-8: save the file as UTF-8 text") from None
    mig = validate(parse_yaml(text, origin=str(p)), origin=str(p))
    ck = mig.workload.checkpoint
    if ck and not ck.startswith("s3://"):  # a relative checkpoint path is the project's (remote pods get it relative to their working directory)
        local = Path(ck.removeprefix("file://"))
        if not local.is_absolute():
            local = project_root(p) / local
            mig = mig.model_copy(update={"workload": mig.workload.model_copy(update={"checkpoint": str(local)})})
    return mig
