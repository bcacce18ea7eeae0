"""Typed phase records: what each phase writes into ``NN_<phase>.json`` ``data``, and the one way
any other module reads it.

A record on disk stays JSON (:func:`runbook_lib.evidence.manifest.write_record`); its ``data`` is checked
against the phase's model here before it is written (:func:`checked`), and read back through
:class:`Chain`, whose properties return the models (``chain.freeze.source.frozen.prefix``, never
``record["data"]["freeze"]["frozen"]["prefix"]``). A renamed or retyped field then fails where it
is written, in the phase that wrote it, not when some later phase reaches the line that reads it.

Every model allows fields it does not name (``extra="allow"``): a record keeps everything its
phase wrote, and the models name what another phase, phase 06, ``verify --recompute``,
``report``, ``list`` or ``resolve`` reads. The JSON Schema of each model is generated into
docs/reference/records.schema.json (``python -m runbook_lib.evidence.records``; a test keeps it current).

Versions: a record written since schema versions were recorded carries ``schema_version``; one
without it was written before (96aee4a and earlier) and reads as version 1, which is the same
shape. A version this code does not know is named in an :class:`EvidenceError`, never misread.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError

from runbook_lib.errors import EvidenceError
from runbook_lib.evidence.manifest import PHASES, RECORD_SCHEMA_VERSION, Record, phase_name, sha256_file
from runbook_lib.gates import GateResult
from runbook_lib.layout import MANIFEST, RECEIPT
from runbook_lib.measure.cost import SpendStop
from runbook_lib.measure.timing import CollectorPauses
from runbook_lib.portability.checkpoint import FileReport, Finding

SCHEMA_VERSION = RECORD_SCHEMA_VERSION
"""The version of the record models below; written into every record as ``schema_version``."""

READABLE_VERSIONS = (1,)
"""Versions this code reads (1: every record written so far, with or without the field)."""

SCHEMA_FILE = Path("docs") / "reference" / "records.schema.json"
"""Where the generated JSON Schema of every record model lives, relative to the project root."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


# -- what every phase record carries (runbook_lib.phases.evidence.Evidence.body) ---------------

class Credential(_Model):
    """A credential a planned resource gets: a secret by name and reference, or a store grant
    (:meth:`runbook_lib.storage.grants.Grant.evidence`: its kind, scope and expiry, never a value)."""

    name: str = ""
    kind: str = ""
    ref: str | None = None
    expires_at: str | None = None


class PlanRow(_Model):
    """A plan as a phase recorded it: the plan (:meth:`runbook_lib.providers.base.Plan.to_dict`),
    whether it was applied, who approved it and how, and the credentials it was given."""

    plan: dict[str, Any] = Field(default_factory=dict)
    applied: bool = True
    approved_by: str | None = None
    method: str = ""
    credentials: tuple[Credential, ...] | None = None


class PhaseData(_Model):
    """The fields every phase record's ``data`` has: its gates, its plans and what they mean for
    the run; a failed, held or interrupted record has ``error`` and the notebook cell instead.

    Attributes:
        gates: the phase's gates (:class:`runbook_lib.gates.GateResult`).
        plans: every plan the phase showed, applied or not.
        stop_migration: a blocking gate FAILed. hold_migration: one was INCONCLUSIVE or ERROR.
        dry_run: the phase only planned (a remote side in dry-run).
        simulators: ``{side: simulator name}`` for each provider API that said it is a simulator.
        error: why a phase that did not complete stopped (None for a completed one).
    """

    gates: tuple[GateResult, ...] = ()
    plans: tuple[PlanRow, ...] = ()
    stop_migration: bool = False
    hold_migration: bool = False
    dry_run: bool = False
    simulators: dict[str, str] = Field(default_factory=dict)
    error: str | None = None

    @property
    def stops(self) -> bool:
        """A blocking gate failed or was inconclusive: the phases after it (but 06) do not run."""
        return self.stop_migration or self.hold_migration


# -- phase 01 ------------------------------------------------------------------------------------

class StoredObject(_Model):
    size_bytes: int
    sha256: str


class Frozen(_Model):
    """The frozen artifact: its store prefix, the sha256 of its manifest (bytes of the store's
    manifest object) and each object's size in bytes and sha256."""

    prefix: str
    manifest_sha256: str
    objects: dict[str, StoredObject] = Field(default_factory=dict)


class Golden(_Model):
    """The golden outputs phase 01 saved (``01/golden_outputs.npy``): prefix, shape, dtype, sha256."""

    prefix: str | None = None
    shape: list[int] = Field(default_factory=list)
    dtype: str = ""
    outputs_sha256: str | None = None
    inference_shape: list[int] | None = None


class TensorRow(_Model):
    """One loaded tensor (:meth:`runbook_lib.workload.checkpoint_set.CheckpointWorkload.tensor_table`):
    its name, dtype, shape and the sha256 of its bytes as loaded."""

    name: str
    dtype: str = ""
    shape: list[int] = Field(default_factory=list)
    sha256: str = ""


class GoldenRun(_Model):
    """The source's acceptance run: per-step losses (training), the A/A run's losses, step times
    (seconds), the load time (seconds) and tensor digests (checkpoint workloads)."""

    losses: list[float] = Field(default_factory=list)
    aa_losses: list[float] | None = None
    step_times_s: list[float] = Field(default_factory=list)
    load_s: float | None = None
    tensors: tuple[TensorRow, ...] | None = None


class SourcePod(_Model):
    """The source pod as its provider reports it (:meth:`runbook_lib.providers.base.Provider.describe`):
    its id, state and price (USD per hour), its GPU, the highest CUDA its host driver supports,
    its image and the *names* of its environment variables."""

    provider: str = ""
    id: str = ""
    state: str = ""
    price_usd_per_hour: float | None = None
    gpu_name: str | None = None
    cuda_max: str | None = None
    image: str | None = None
    env_names: tuple[str, ...] = ()


class GpuDevice(_Model):
    """One visible GPU: its index, name, total memory in bytes and compute capability (``"8.9"``)."""

    index: int = 0
    name: str = ""
    memory_bytes: int = 0
    compute_capability: str = ""


class Cuda(_Model):
    """CUDA as a host inventory reports it (:func:`runbook_lib.portability.inventory.probe`): whether it is
    available, the runtime torch was built with, the driver, the GPUs and the architectures the
    torch build carries (``sm_80``)."""

    available: bool = False
    runtime: str | None = None
    driver_version: str | None = None
    devices: tuple[GpuDevice, ...] = ()
    arch_list: tuple[str, ...] = ()


class Cpu(_Model):
    model: str = ""
    logical: int = 0


class Topology(_Model):
    """How a host's GPUs are connected (:func:`runbook_lib.portability.topology.probe`): how it was
    read (or why not), the GPU count, ``NVLink`` / ``PCIe`` / ``mixed`` / ``one GPU``, the slowest
    link class any pair uses (``NV18``, ``PHB``), every GPU-to-GPU link, NCCL's version, the
    ``NCCL_*`` environment and the torchrun process layout (``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ...)."""

    probe: str = ""
    gpus: int = 0
    interconnect: str = ""
    weakest_link: str = ""
    links: dict[str, dict[str, str]] = Field(default_factory=dict)
    nccl_version: str | None = None
    nccl_env: dict[str, str] = Field(default_factory=dict)
    process_layout: dict[str, int] = Field(default_factory=dict)


class Inventory(_Model):
    """A host's inventory (:func:`runbook_lib.portability.inventory.probe`): interpreter and framework
    versions, torch's thread count, the device, CUDA, the CPU, memory, shared memory and free
    disk in bytes, the OS, host features, the *names* of credential-looking variables, and the
    GPU interconnect."""

    python: str = ""
    torch: str = ""
    torch_threads: int = 0
    device: str = ""
    cuda: Cuda = Field(default_factory=Cuda)
    cpu: Cpu = Field(default_factory=Cpu)
    shm_bytes: int = 0
    memory_bytes: int = 0
    disk_free_bytes: int = 0
    os: str = ""
    features: dict[str, bool] = Field(default_factory=dict)
    credential_env_names: tuple[str, ...] = ()
    topology: Topology = Field(default_factory=Topology)


class PortRow(_Model):
    port: int
    protocol: str


class DeclaredRequirements(_Model):
    """The workload's declared host needs and SLO as phase 01 recorded them
    (:func:`runbook_lib.phases.freeze.requirements`): GB are 10**9 bytes, ``max_request_s`` seconds."""

    ports: tuple[PortRow, ...] = ()
    shm_gb: float = 0.0
    disk_gb: float = 1.0
    memory_gb: float = 1.0
    gpu_memory_gb: float = 0.0
    max_request_s: float = 30.0
    docker_compose: bool = False
    privileged: bool = False
    persistent_volume: bool = True
    device: str = ""
    dtype: str = ""


class CopiedObject(_Model):
    """One object of an ``s3://`` checkpoint copied in (:func:`runbook_lib.phases.freeze.copy_in_checkpoint`):
    its file, key, bytes, S3's ETag, version and last-modified time, its sha256, and what S3
    record its copy was checked against (``size only`` when S3 keeps no whole-object digest)."""

    file: str
    key: str = ""
    bytes: int = 0
    etag: str | None = None
    version_id: str | None = None
    last_modified: str | None = None
    sha256: str = ""
    verified_by: str = ""


class CheckpointInput(_Model):
    """An ``s3://`` checkpoint as phase 01 copied it into the run's store: the URL, the store
    prefix, its manifest's sha256, each object, folder placeholders skipped, bytes and seconds."""

    url: str
    prefix: str
    manifest_sha256: str | None = None
    objects: tuple[CopiedObject, ...] = ()
    placeholders: tuple[str, ...] = ()
    total_bytes: int = 0
    seconds: float = 0.0


class Inspection(_Model):
    """An inspection of a checkpoint (:func:`runbook_lib.portability.checkpoint.inspect`; nothing in it run):
    each file and each finding, bytes in all, seconds to fetch it, where the source kept it; a
    preflight (before anything is rented) counts its ``blockers`` and keeps the copied-in ``input``."""

    root: str = ""
    total_bytes: int | None = None
    files: tuple[FileReport, ...] = ()
    findings: tuple[Finding, ...] = ()
    blockers: int = 0
    download_s: float = 0.0
    location: dict[str, str] | None = None
    input: CheckpointInput | None = None


class Interruption(_Model):
    """A machine the provider took back before its agent finished
    (:attr:`runbook_lib.phases.agents.AgentRun.interruptions`): the offer, the resource, the
    provider's detail, seconds since the first launch, whether it was verified gone."""

    offer_id: str = ""
    resource_id: str = ""
    detail: str = ""
    at_s: float = 0.0
    destroyed: bool = False


class FreezePod(_Model):
    """The freeze pod: its id, its state after the teardown, the machines taken back from it."""

    id: str
    state_after_destroy: str
    interruptions: tuple[Interruption, ...] = ()


class ServiceLaunch(_Model):
    """What the provider reports a service pod runs, against what params declare
    (:func:`runbook_lib.phases.service_pods.launched`): its image (a stand-in's is the image it stands
    in for), the digest where the provider reports one, the command, environment variable names
    and published ports, the processes it runs (the local provider reports them) and what was
    found of the runbook in them (``RUNBOOK_*`` variables, a ``runbook_lib`` command line).

    A service on a serverless endpoint (``serverless`` in the side's profile) has ``pod`` the
    endpoint's id, ``endpoint`` its settings as the provider reports them (type, template and
    version, image, workers min and max, idle timeout, GPU pools, network volumes, execution
    timeout, flashboot: :func:`runbook_lib.providers.runpod.endpoint_settings`), ``entry_point``
    what it runs in place of a command, and ``url`` its job API; None and empty for a pod."""

    pod: str = ""
    image: str = ""
    digest: str | None = None
    stand_in: bool = False
    command: tuple[str, ...] = ()
    env_names: tuple[str, ...] = ()
    ports: dict[str, str] = Field(default_factory=dict)
    processes: tuple[dict[str, Any], ...] = ()
    processes_reported: bool = False
    as_declared: bool = False
    mismatches: tuple[str, ...] = ()
    runbook_inside: tuple[str, ...] = ()
    ready_s: float | None = None
    endpoint: dict[str, Any] | None = None
    entry_point: str = ""
    url: str = ""


class ServiceAnswerRow(_Model):
    """One sample input's answers compared (phase 01: the source against itself; phase 03: the
    canary against the golden): whether they match, and where they first differ."""

    sample: int
    status: str = ""
    match: bool = False
    first_diff_token: int | None = None
    first_diff_char: int | None = None
    detail: str = ""


class PreflightCheck(_Model):
    """One check of the service preflight (:mod:`runbook_lib.service.preflight`): its name
    (``answers``, ``streams``, ``tokens``, ``comparator``), whether it held, and what was seen."""

    name: str
    ok: bool
    detail: str = ""


class LiveFact(_Model):
    """One fact about a live source (``source.provider: live``), marked as ``observed`` (read over
    its API by the runbook, with how) or ``declared`` (written in params by the team, unverified)."""

    name: str
    value: str
    basis: Literal["observed", "declared"]
    how: str = ""


class LiveSource(_Model):
    """A live source as phase 01 found it: its URL, the rate the runbook held itself to, the
    seconds until it answered ready, and each fact observed or declared."""

    url: str
    max_rate_per_s: float
    ready_s: float | None = None
    facts: tuple[LiveFact, ...] = ()


class ServiceFreeze(_Model):
    """Phase 01 of a service: the protocol, the image and its risk findings, the source pod as
    launched, the sample inputs (count, sha256 of the file), the golden answers (sha256 of
    ``01/service_golden.json``) and the source answering each sample twice (its divergences:
    a service that is not deterministic at temperature 0)."""

    protocol: str = ""
    image: str = ""
    image_findings: tuple[str, ...] = ()
    pinned_digest: str | None = None
    launch: ServiceLaunch = Field(default_factory=ServiceLaunch)
    samples: int = 0
    samples_sha256: str = ""
    golden_sha256: str = ""
    failed_samples: tuple[int, ...] = ()
    self_divergent: tuple[ServiceAnswerRow, ...] = ()
    preflight: tuple[PreflightCheck, ...] = ()
    live: LiveSource | None = None


class ServiceCanary(_Model):
    """Phase 03 of a service: the canary as launched, each sample's answer against the golden,
    the exact-match rate and its minimum, and the kill-and-recover drill (seconds from the kill to
    answering again, whether the recovered canary answers as the golden)."""

    launch: ServiceLaunch = Field(default_factory=ServiceLaunch)
    answers: tuple[ServiceAnswerRow, ...] = ()
    exact_match_rate: float | None = None
    min_exact_match: float | None = None
    recovery_s: float | None = None
    recovered_launch: ServiceLaunch | None = None
    recovered_exact_match_rate: float | None = None
    recovery_how: str = ""


class FreezeSource(_Model):
    """What the freeze pod saw and saved (:func:`runbook_lib.phases.freeze.freeze_source`); a
    dry-run freeze has only ``source_pod`` and ``plan``, a blocked one ``preflight``. ``identity``
    is the workload's own (weights or dataset sha256, by workload kind); ``store`` the store's
    settings (:meth:`runbook_lib.storage.Store.settings`)."""

    pod: FreezePod | None = None
    source_pod: SourcePod | None = None
    environment: Inventory | None = None
    identity: dict[str, Any] | None = None
    store: dict[str, Any] | None = None
    frozen: Frozen | None = None
    golden: Golden | None = None
    golden_run: GoldenRun | None = None
    inspection: Inspection | None = None
    input: CheckpointInput | None = None
    preflight: Inspection | None = None
    plan: dict[str, Any] | None = None
    payloads: dict[str, int] | None = None
    blocked: bool = False
    dry_run: bool = False
    service: ServiceFreeze | None = None

    def require_frozen(self) -> tuple[Frozen, Golden]:
        """The frozen artifact and the golden outputs of a freeze that ran.

        Raises:
            EvidenceError: the freeze was a dry-run or blocked, and froze nothing.
        """
        if self.frozen is None or self.golden is None:
            raise EvidenceError("phase 01 froze nothing (its freeze was a dry-run or blocked); run phase 01 again "
                                "with the source applied")
        return self.frozen, self.golden


class SecretRow(_Model):
    """A secret by name and reference, and whether it resolves on this host (never its value);
    ``side`` ``environment`` for a credential-looking variable set here."""

    side: str
    name: str
    ref: str
    required: bool
    resolves_here: bool


class CredentialFinding(_Model):
    """A credential-looking variable in the source (its name only) and whether params declare it."""

    variable: str
    where: str
    declared: bool
    finding: str


class ScheduleRow(_Model):
    """A schedule as read (:class:`runbook_lib.traffic.schedules.ScheduleState`): the side it
    starts (``source``, ``target``, ``both``, ``neither``, or ``unreadable`` with the error in
    ``detail``), when it runs (``cadence``) and what was read."""

    name: str
    kind: str
    side: str
    cadence: str = ""
    detail: str = ""


class ScheduleShift(_Model):
    """A schedule pointed at ``to`` (:class:`runbook_lib.traffic.schedules.Shifted`): the side it
    started before and after, read back; ``error`` when the change failed."""

    name: str
    kind: str
    to: str
    before: str = ""
    after: str = ""
    detail: str = ""
    error: str = ""


class FreezeData(PhaseData):
    """Phase 01's record data."""

    host: Inventory = Field(default_factory=Inventory)
    freeze: FreezeSource = Field(default_factory=FreezeSource)
    requirements: DeclaredRequirements = Field(default_factory=DeclaredRequirements)
    secrets: tuple[SecretRow, ...] = ()
    credential_findings: tuple[CredentialFinding, ...] = ()
    schedules: tuple[ScheduleRow, ...] = ()

    def frozen(self) -> Frozen:
        """The frozen artifact.

        Raises:
            EvidenceError: phase 01 froze nothing (a dry-run or blocked freeze).
        """
        if self.freeze.frozen is None:
            raise EvidenceError("phase 01's record has no frozen artifact (its freeze was a dry-run or blocked); "
                                "run phase 01 again with the source applied")
        return self.freeze.frozen

    def golden_run(self) -> GoldenRun:
        """The source's acceptance run.

        Raises:
            EvidenceError: phase 01 ran no golden run (a dry-run or blocked freeze).
        """
        if self.freeze.golden_run is None:
            raise EvidenceError("phase 01's record has no golden run (its freeze was a dry-run or blocked); "
                                "run phase 01 again with the source applied")
        return self.freeze.golden_run


# -- phase 02 ------------------------------------------------------------------------------------

EQUIVALENT, ADAPTER, NONE = "equivalent", "adapter needed", "no equivalent"
"""The statuses of a :class:`DependencyRow` (seed 001's "Source dependency has no target
equivalent: design and test an adapter before cutover")."""


class DependencyRow(_Model):
    """One row of phase 02's dependency map (:func:`runbook_lib.phases.mapping.dependency_map`):
    what the source has, what the target has, and whether that is ``equivalent``, ``adapter
    needed`` or ``no equivalent``, with why."""

    dependency: str
    source: str
    target: str
    status: str
    reason: str


class OfferDetail(_Model):
    """An offer as :class:`runbook_lib.providers.offers.Offer` normalizes it (its ``to_dict``):
    GPU model and count, VRAM per GPU in MiB, vCPUs and RAM (GiB) that are ours, disk (GB), the
    highest CUDA the host driver supports, prices in USD per hour, region."""

    offer_id: str
    provider: str = ""
    gpu_name: str = ""
    gpu_count: int = 0
    vram_mib: int = 0
    vcpu: float | None = None
    ram_gib: float | None = None
    disk_gb: float | None = None
    cuda_max: str = ""
    usd_per_hour: float = 0.0
    interruptible_usd_per_hour: float | None = None
    region: str = ""


class OfferRow(OfferDetail):
    """One offer phase 02 saw (:func:`runbook_lib.providers.offers.filter_offers`): prices in USD
    per hour (``hourly_usd_with_disk`` includes the planned disk), and why it was dropped."""

    hourly_usd_with_disk: float
    accepted: bool = True
    reasons: str = ""
    unverified: str = ""


class Offers(_Model):
    """The target's offers: ``ranked`` ids (cheapest first), the best one, one row per offer seen,
    and the requirements they were judged against (``target.offer``)."""

    ranked: tuple[str, ...] = ()
    best: OfferDetail | None = None
    table: tuple[OfferRow, ...] = ()
    requirements: dict[str, Any] | None = None

    def row(self, offer_id: str) -> OfferRow | None:
        return next((r for r in self.table if r.offer_id == offer_id), None)

    @property
    def first(self) -> OfferRow | None:
        """The first ranked offer's row, or None when nothing qualified."""
        return self.row(self.ranked[0]) if self.ranked else None

    def reasons(self) -> list[str]:
        """Why offers were dropped: each distinct reason, sorted."""
        return sorted({r.reasons for r in self.table if r.reasons})


class AlternateMap(_Model):
    """One documented alternate of the target as phase 02 mapped it: its offers (searched,
    re-checked, ranked, as the target's), its dependency rows, whether any has no equivalent,
    and what it changes against the target (:func:`runbook_lib.params.profile_differences`)."""

    name: str
    provider: str = ""
    offers: Offers | None = None
    dependency_map: tuple[DependencyRow, ...] = ()
    blocked: bool = False
    differences: tuple[str, ...] = ()


class MappingData(PhaseData):
    """Phase 02's record data; ``target_capabilities`` is the target's declared
    :class:`runbook_lib.providers.base.Capabilities` as JSON; ``alternates`` the target's
    documented alternates, mapped the same way (empty without ``alternates``); ``raced`` the
    candidates of ``targets`` after the first (the target), mapped the same way (empty without a
    race)."""

    dependency_map: tuple[DependencyRow, ...] = ()
    target_capabilities: dict[str, Any] = Field(default_factory=dict)
    offers: Offers | None = None
    alternates: tuple[AlternateMap, ...] = ()
    raced: tuple[AlternateMap, ...] = ()

    def offers_of(self, name: str) -> Offers | None:
        """The ranked offers of candidate ``name``: an alternate's from ``alternates``, a raced
        candidate's from ``raced``, anything else the target's."""
        alt = next((a for a in (*self.alternates, *self.raced) if a.name == name), None)
        return alt.offers if alt is not None else self.offers

    def blocked(self, name: str) -> tuple[str, ...]:
        """The dependencies phase 02 found no equivalent for on candidate ``name`` (an alternate or
        a raced candidate), with why; empty for one that meets them all, or the target."""
        alt = next((a for a in (*self.alternates, *self.raced) if a.name == name), None)
        return () if alt is None else tuple(f"{r.dependency}: {r.reason}" for r in alt.dependency_map
                                            if r.status == "no equivalent")


# -- phase 03 ------------------------------------------------------------------------------------

class Fetch(_Model):
    """A pod's verified download from the store: bytes, seconds, objects, bytes per second."""

    bytes: int | None = None
    seconds: float | None = None
    objects: int | None = None
    bytes_per_s: float | None = None


class Rejected(_Model):
    """A checkpoint the resume refused, and why (:func:`runbook_lib.workload.job.newest_verified_checkpoint`)."""

    file: str
    reason: str


class FailureDrill(_Model):
    """The canary's failure drill: the step after which it was killed, the signal and exit code,
    the checkpoint it resumed from and those it refused."""

    killed_after_step: int | None = None
    signal: str = ""
    exit_code: int | None = None
    resumed_from: str | None = None
    rejected_checkpoints: tuple[Rejected, ...] = ()


class Reload(_Model):
    """Whether the reloaded artifact reproduced the outputs exactly, and the largest absolute difference."""

    exact: bool
    max_abs_diff: float


class AgentAttempt(_Model):
    """One run of the acceptance steps in a pod: per-step metrics (``loss``, ...), step times
    (seconds), the load time (seconds) and, for a checkpoint, the tensors it loaded."""

    metrics: list[dict[str, float]] = Field(default_factory=list)
    step_times_s: list[float] = Field(default_factory=list)
    load_s: float | None = None
    tensors: tuple[TensorRow, ...] | None = None


class CanaryResult(_Model):
    """What the canary's acceptance job returned (``result.json``; its attempts are left out of
    the record): its environment, the checksum rows it re-verified
    (:func:`runbook_lib.gates.checksum_exact` rows), its download, the failure drill, the reload,
    and a training job's drill observations, one dict each with its ``drill`` name
    (:func:`runbook_lib.workload.jobdrills.run`; phase 04 judges them)."""

    environment: Inventory | None = None
    fetch: Fetch | None = None
    artifact_checksums: list[dict[str, Any]] = Field(default_factory=list)
    failure_drill: FailureDrill | None = None
    reload: Reload | None = None
    job_drills: tuple[dict[str, Any], ...] = ()
    attempts: tuple[AgentAttempt, ...] = Field(default=(), exclude=True)

    @property
    def last_attempt(self) -> AgentAttempt:
        """The attempt that finished (an empty one when the job recorded none)."""
        return self.attempts[-1] if self.attempts else AgentAttempt()


class EnvironmentDiffRow(_Model):
    """One difference between the source's and the canary's inventory
    (:func:`runbook_lib.portability.inventory.diff`), classified (``class``: :data:`runbook_lib.portability.inventory.CLASSES`)."""

    item: str
    source: Any = None
    target: Any = None
    klass: str = Field(alias="class")
    reason: str = ""


class CapacityTry(_Model):
    """One launch try on a ranked offer (:class:`runbook_lib.providers.base.Attempt`)."""

    offer_id: str = ""
    outcome: str = ""
    detail: str = ""
    resource_id: str = ""
    at_s: float = 0.0


class CandidateFate(_Model):
    """What became of one candidate (the target or a documented alternate) in phase 03.

    Attributes:
        name, provider: the candidate's profile.
        role: ``target``, ``alternate``, or ``candidate`` (one of a race's ``targets``).
        outcome: ``proved`` (its canary ran; the gates judge it), ``failed`` (a raced candidate
            whose canary did not pass every blocking gate: out of the race), ``planned`` (dry-run: its
            canary planned, nothing launched), ``no_capacity`` (no ranked
            offer became ready within its ``offer.capacity_budget_s``), ``awaiting_approval``
            (proposed; no approval with a reason yet), ``blocked`` (phase 02 found a dependency
            with no equivalent, so it is not proposed) or ``not_tried``.
        detail: the error or the reason, as text.
        differences: what it changes against the target (``field: before -> after``).
        plan: the fingerprint of its ``use_alternate`` plan (alternates only).
        approved_by, reason: who approved the alternate, and why (from the approval).
    """

    name: str
    provider: str = ""
    role: str = "target"
    outcome: str = ""
    detail: str = ""
    differences: tuple[str, ...] = ()
    plan: str = ""
    approved_by: str = ""
    reason: str = ""


class ParityData(PhaseData):
    """Phase 03's record data; a dry-run has only ``plan``. ``target`` names the candidate whose
    canary ran (the params' target, or an approved alternate: the phases after 03 run on it;
    empty in evidence older than alternates), ``candidates`` what became of each one tried, and
    ``retry_at`` (UTC ISO 8601) when a run that found no capacity may try again."""

    target: str = ""
    candidates: tuple[CandidateFate, ...] = ()
    retry_at: str | None = None

    def tried(self) -> tuple[str, ...]:
        """The candidates whose canary was launched or tried (something may have been rented on
        their provider), by name."""
        return tuple(f.name for f in self.candidates if f.outcome in ("proved", "no_capacity", "failed"))

    canary_pod: str | None = None
    canary_destroyed: bool | None = None
    capacity_tries: tuple[CapacityTry, ...] = ()
    interruptions: tuple[Interruption, ...] = ()
    acceptance_job_s: float | None = None
    acceptance_budget_s: float | None = None
    environment_diff: tuple[EnvironmentDiffRow, ...] = ()
    result: CanaryResult | None = None
    plan: dict[str, Any] | None = None
    service: ServiceCanary | None = None


# -- phase 04 ------------------------------------------------------------------------------------

class SideSummary(_Model):
    """One side's latency and throughput (seconds from intended arrival; units per second)."""

    p50_s: float | None = Field(default=None, alias="total p50 (s)")
    p95_s: float | None = Field(default=None, alias="total p95 (s)")
    p99_s: float | None = Field(default=None, alias="total p99 (s)")
    throughput: float | None = Field(default=None, alias="throughput mean (units/s)")

    def metric(self, name: str) -> float | None:
        """A metric by the column name the summary table shows (``total p95 (s)``, ...)."""
        return {"total p50 (s)": self.p50_s, "total p95 (s)": self.p95_s, "total p99 (s)": self.p99_s,
                "throughput mean (units/s)": self.throughput}[name]


class DrillRow(_Model):
    """One fault drill's expectation, observation and verdict, whether it blocks the decision,
    and how long it took (seconds; a job drill's, its processes' wall time on the canary in phase 03)."""

    drill: str
    verdict: str
    expectation: str = ""
    observation: str = ""
    blocking: bool = False
    seconds: float | None = None


class SpendRecord(_Model):
    """The spend limit as phase 04 enforced it (:class:`runbook_lib.measure.cost.SpendMeter`): the limit
    (USD; None when unset), what was spent when measuring ended (USD), and each step refused."""

    limit_usd: float | None = None
    accrued_usd: float = 0.0
    stops: tuple[SpendStop, ...] = ()


class ClockRow(_Model):
    """One of the three clocks that end a request (execution timeout, job TTL, client timeout):
    its setting (seconds; None where the endpoint's own applies), who sets it, the status it ends
    a request with, and how many requests it ended per side."""

    clock: str
    setting_s: float | None = None
    set_by: str = ""
    ends_as: str = ""
    ended: dict[str, int] = Field(default_factory=dict)


class StoreFetch(Fetch):
    """One pod's verified download of the set it started from: its side, round (None outside
    the rounds) and which pod it was, with :class:`Fetch`'s bytes and seconds."""

    side: str
    round: int | None = None
    source: str = ""


class StoreToPod(_Model):
    """Store-to-pod bandwidth of one side: downloads timed, bytes in all, median and lowest MB/s
    (MB: 10**6 bytes; None without a download) and where the figures come from."""

    fetches: int = 0
    bytes: int = 0
    p50_MB_per_s: float | None = None
    min_MB_per_s: float | None = None
    source: str = ""


Number = float | int | str | bool | None
"""A cell of a summary table phase 04 records (its columns depend on what the endpoint reports)."""


class LoadGeneratorRound(_Model):
    """How phase 04's load generator kept one open-loop round's schedule: requests, offered and
    achieved arrival rate (per second), send lateness (actual minus intended send: p50, p99 and
    max, seconds), how many requests left later than ``measure.max_send_lateness_s``, and whether
    none did (a late round is not a latency result)."""

    side: str
    round: int
    requests: int
    offered_per_s: float | None = None
    achieved_per_s: float | None = None
    lateness_p50_s: float = 0.0
    lateness_p99_s: float = 0.0
    lateness_max_s: float = 0.0
    late: int = 0
    on_time: bool = True


class SequentialLook(_Model):
    """One look at a sequential gate after ``pairs`` pairs of rounds: the geometric mean of the
    per-pair ratios, the confidence sequence as ratios (``upper`` None while unbounded) and the
    verdict the sequence gave there."""

    pairs: int
    estimate: float
    lower: float
    upper: float | None
    verdict: str


class SequentialGate(_Model):
    """A sequential gate's threshold, direction, whether it blocks (its threshold was set in the
    params), the pair at which it was decided (None: undecided) and every look."""

    threshold: float
    higher_is_better: bool
    blocking: bool
    decided_at_pair: int | None
    looks: tuple[SequentialLook, ...] = ()


class SequentialRecord(_Model):
    """Phase 04 under ``gates.method: sequential`` (:mod:`runbook_lib.phases.compare.sequential`):
    the sequences' level and mixture precision, the minimum and budget in rounds a side, the pairs
    measured and the pair at which every blocking gate was decided (None: the budget ended it)."""

    alpha: float
    mixture_c: float
    min_rounds: int
    max_rounds: int
    pairs_measured: int
    stopped_at_pair: int | None
    gates: dict[str, SequentialGate] = Field(default_factory=dict)


class SavingsForecast(_Model):
    """What moving saves at the declared traffic (:mod:`runbook_lib.phases.compare.forecast`):
    each side's cost per month (USD, 730 hours, warm workers billed busy or idle), the saving per
    month (source minus target, USD) and as a share of the source's cost per accepted unit with
    its 90 % bootstrap interval over rounds (None with fewer than 2 rounds a side), which side is
    cheaper there, and the traffic at which the costs per accepted unit cross (requests per
    second; None: one side is cheaper at every traffic both can serve)."""

    traffic_per_s: float
    source_usd_per_month: float
    target_usd_per_month: float
    saving_usd_per_month: float
    saving_fraction: float | None
    saving_interval: tuple[float, float] | None = None
    cheaper_at_traffic: str = ""
    break_even_per_s: float | None = None


class RaceEntry(_Model):
    """One candidate of a race (:func:`runbook_lib.phases.compare.race.judge_race`), as the pick's
    table and plot show it.

    Attributes:
        name, provider: the candidate's profile.
        pairs: the pairs of rounds it was measured for.
        fate: ``picked``, ``eliminated``, ``undecided`` (a survivor when the budget ended with no
            pick) or ``racing`` (still in the race at an intermediate look).
        exit_pair, exit_by, exit_reason: when and why it was eliminated (the gate's name or the
            candidate that beat it on the objective); empty while it races.
        objective_ratio, objective_lower, objective_upper: the objective against the source (a
            ratio; geometric mean, and the race's sequence: 0 and inf while unbounded).
        p95_s, p95_lower_s, p95_upper_s: its p95 latency (seconds): the source's pooled p95 times
            its latency ratio's geometric mean and sequence.
        usd_per_accepted_unit, usd_lower, usd_upper: its USD per accepted unit, the same way from
            the source's and its cost ratio.
        quoted_usd_per_hour, billed_usd_per_hour: the price its profile quotes and, where the
            provider reports it, what it billed (None: not reported).
        on_front: it is on the Pareto front of cost per accepted unit against p95 latency.
    """

    name: str
    provider: str = ""
    pairs: int = 0
    fate: str = "racing"
    exit_pair: int | None = None
    exit_by: str = ""
    exit_reason: str = ""
    objective_ratio: float | None = None
    objective_lower: float | None = None
    objective_upper: float | None = None
    p95_s: float | None = None
    p95_lower_s: float | None = None
    p95_upper_s: float | None = None
    usd_per_accepted_unit: float | None = None
    usd_lower: float | None = None
    usd_upper: float | None = None
    quoted_usd_per_hour: float | None = None
    billed_usd_per_hour: float | None = None
    on_front: bool = False


class RaceRecord(_Model):
    """A race of candidates against one source (issue 50; :mod:`runbook_lib.gates.race`).

    Attributes:
        objective: what the pick minimises or maximises (``cost_per_accepted_unit``,
            ``latency_p95`` or ``throughput``).
        gates: the blocking gates every candidate was judged on against the source.
        comparisons, alpha_each: m, the sequences the error level is split over (Bonferroni),
            and each one's level.
        correction: the correction, in words, with its source.
        pick: the winner, or None; undecided: the survivors none beat when the budget ended.
        final: the budget was spent (the pick or the undecided set is the race's answer).
        source_p95_s, source_usd_per_accepted_unit: the source's pooled p95 latency (seconds)
            and the geometric mean of its rounds' USD per accepted unit, which the entries'
            figures scale.
        entries: every candidate, in the order given.
    """

    objective: str
    gates: tuple[str, ...] = ()
    comparisons: int = 0
    alpha_each: float = 0.0
    correction: str = ""
    pick: str | None = None
    undecided: tuple[str, ...] = ()
    final: bool = False
    source_p95_s: float | None = None
    source_usd_per_accepted_unit: float | None = None
    entries: tuple[RaceEntry, ...] = ()

    def goes_on(self) -> str:
        """The candidate the rest of the run goes on with: the pick; without one, the undecided
        candidate with the best objective estimate (the race's gate holds the migration); empty
        for a race with no entries."""
        if self.pick:
            return self.pick
        left = [e for e in self.entries if e.name in self.undecided] or list(self.entries)
        if not left:
            return ""
        sign = -1.0 if self.objective == "throughput" else 1.0
        return min(left, key=lambda e: (e.objective_ratio is None, sign * (e.objective_ratio or 0.0))).name


class CompareData(PhaseData):
    """Phase 04's record data (:func:`runbook_lib.phases.compare.judge.record_data`); the raw
    samples stay in the files the record hashes. Costs are :meth:`runbook_lib.measure.cost.CostBreakdown.to_dict`
    and :meth:`runbook_lib.measure.cost.TrafficCost.to_dict` per side (USD; None where not finite);
    ``billed_s`` seconds and ``egress_bytes`` bytes per side."""

    endpoints: dict[str, str] = Field(default_factory=dict)
    endpoint_urls: dict[str, str] = Field(default_factory=dict)
    endpoint_modes: dict[str, str] = Field(default_factory=dict)
    clocks: tuple[ClockRow, ...] = ()
    spend: SpendRecord | None = None
    summary: dict[str, SideSummary] = Field(default_factory=dict)
    cold_start_median_s: dict[str, float | None] = Field(default_factory=dict)
    cold_start_kind: str = ""
    cold_starts_from_zero: tuple[dict[str, Number], ...] = ()
    usd_per_accepted_unit: dict[str, float | None] = Field(default_factory=dict)
    usd_per_accepted_unit_basis: str = ""
    cost_at_traffic: dict[str, dict[str, Number]] = Field(default_factory=dict)
    cost: dict[str, dict[str, Number]] = Field(default_factory=dict)
    billed_s: dict[str, float] | None = None
    egress_bytes: dict[str, float] | None = None
    store_to_pod: dict[str, StoreToPod] = Field(default_factory=dict)
    target_workers_ready: int | None = None
    extra_rounds: int = 0
    pair_seconds: tuple[float, ...] = ()  # sequential: each pair of rounds' wall seconds, in order
    measurement_attempts: int = 0
    measurements_lost: tuple[dict[str, Number], ...] = ()
    host_load_avg_1_5_15min: tuple[float, ...] = ()
    load_generator_gc: CollectorPauses | None = None
    load_generator: tuple[LoadGeneratorRound, ...] = ()
    token_metrics: dict[str, dict[str, Number]] = Field(default_factory=dict)
    drills: tuple[DrillRow, ...] = ()
    method: str = "fixed"
    sequential: SequentialRecord | None = None
    forecast: SavingsForecast | None = None
    race: RaceRecord | None = None


# -- phase 05 ------------------------------------------------------------------------------------

class RollbackPoint(_Model):
    """What restoring the source needs (``05/rollback_point.json``): the route and release to go
    back to, the frozen artifact (prefix and manifest sha256), the rollback window (seconds, and
    when it closes as Unix epoch seconds), the source's provider and endpoint, who owns a rollback."""

    recorded_at: str = ""
    route: str = ""
    source_release: str = ""
    frozen_manifest_sha256: str = ""
    frozen_prefix: str = ""
    window_s: float = 0.0
    window_closes_epoch: float = 0.0
    source_provider: str = ""
    rollback_owner: str = ""
    source_endpoint: str | None = None


class Drain(_Model):
    """What each endpoint reported before a drained step moved the route: jobs queued or in
    progress, the endpoints that could not be reached (why), seconds waited."""

    in_flight: dict[str, int] = Field(default_factory=dict)
    unreachable: dict[str, str] = Field(default_factory=dict)
    waited_s: float = 0.0


class SliceStep(_Model):
    """One cutover step: its number, the share moved (percent), whether it passed and, for work
    that writes checkpoints, the prefix of the checkpoint it left. The kind's own step
    (:class:`InferenceStep`, :class:`TrainingStep`, :class:`CheckpointStep`) says more."""

    step: int = 0
    target_percent: int = 0
    passed: bool = False
    checkpoint_prefix: str | None = None


class InferenceStep(SliceStep):
    """An inference slice: requests sent, how many reached and were served by the target (the
    rest were shadows in a dual run), what the endpoints held before a drained step, the
    target's failures and rejected answers, its p95 (seconds) against the bound from phase 04.
    Through a real router (``cutover.router``) the step's window, with the shares, the requests
    lost and the p99s, is in :class:`Cutover`'s ``router.windows``."""

    mode: str = ""
    requests: int = 0
    to_target: int = 0
    served_by_target: int = 0
    shadow_to_target: int = 0
    drained_before: Drain | None = None
    target_failures: int = 0
    target_not_accepted: int = 0
    target_p95_s: float | None = None
    p95_bound_s: float | None = None
    target_failed_as: str = ""
    """The target's failed requests by status, then the first one's stage and error (the server's
    own words), as phase 04's ``error_rate`` names them; empty when none failed."""


class TrainingStep(SliceStep):
    """A training slice: the training steps it ran, the checkpoint set it wrote (manifest and
    each object's sha256) and its losses' relative difference from the source's."""

    steps: str = ""
    checkpoint_manifest_sha256: str | None = None
    checkpoint_sha256: dict[str, str | None] = Field(default_factory=dict)
    loss_rel_diff: float | str | None = None


class CheckpointStep(SliceStep):
    """A checkpoint cutover's one step: the target's copy, its file count, whether its bytes are
    the frozen ones, the restores the pod verified."""

    authoritative_prefix: str = ""
    files: int = 0
    bytes_identical_to_frozen: bool = False
    restores_verified: int = 0
    checkpoint_manifest_sha256: str | None = None


class RoutedWindow(_Model):
    """One window of a routed cutover's replay, as judged (:func:`runbook_lib.phases.routed.judge_window`):
    the steady state before the first step, a step, or the rollback. ``start_s`` and ``end_s``:
    seconds into the replay, from before its weights changed to the next window's start, so the
    windows cover the replay end to end. ``requests`` and the shares, failures and latencies are
    of the judged part (``start_s`` plus the window length); ``sent``, ``answered``, ``failed``
    and ``lost`` of the whole span. The router's counters (``router_requests``), its servers'
    worst states and its weights as read back at the end."""

    window: str
    target_percent: int
    passed: bool
    problems: tuple[str, ...] = ()
    start_s: float | None = None
    end_s: float | None = None
    requests: int = 0
    sent: int = 0
    answered: int = 0
    failed: int = 0
    lost: int = 0
    to_target: int = 0
    served_by_target: int = 0
    target_failures: int = 0
    target_not_accepted: int = 0
    target_p95_s: float | None = None
    p95_bound_s: float | None = None
    target_failed_as: str = ""
    """The target's failed requests by status, then the first one's stage and error (the server's
    own words), as phase 04's ``error_rate`` names them; empty when none failed."""
    router_share_replay: float | None = None
    router_share_counters: float | None = None
    p99_s: float | None = None
    p99_before_s: float | None = None
    router_requests: dict[str, int] = Field(default_factory=dict)
    states: dict[str, str] = Field(default_factory=dict)
    weights_read: dict[str, int] = Field(default_factory=dict)
    source_serves_all_after_s: float | None = None
    rollback_within_s: float | None = None
    replay_behind: str = ""
    """When the replay sent requests later than ``measure.max_send_lateness_s`` after their
    intended times in the window: how many and how late. Such a window's shares and counts do not
    show what the router did, so it is judged only on lost and failed requests (never PASS)."""


class RoutedCutover(_Model):
    """What a real router carried through phase 05: its kind and front URL, the window length
    (seconds), requests replayed, answered and lost (never answered) in all, when the first lost
    one was sent (seconds into the replay), and every window judged."""

    kind: str
    url: str
    window_s: float
    requests: int
    answered: int
    lost: int
    first_lost_at_s: float | None = None
    first_lost_window: str | None = None
    windows: tuple[RoutedWindow, ...] = ()


class Cutover(_Model):
    """Phase 05's cutover (``05/cutover.json``): its mode, each step, the route's state and
    history (:class:`runbook_lib.traffic.route.Route`), the share on the target at the end (percent),
    the checkpoint the work continues from, the rollback point, and for a real router what it
    carried (:func:`runbook_lib.phases.routed.routed_cutover`: its kind and URL, requests
    replayed, answered and lost, and every window judged)."""

    mode: str = ""
    rollback_point: RollbackPoint | None = None
    steps: tuple[SerializeAsAny[SliceStep], ...] = ()  # each kind's own step, dumped whole
    checkpoint_moved: str | None = None
    final_target_percent: int = 0
    route: dict[str, Any] = Field(default_factory=dict)
    routing: str = ""  # what moved the traffic: the client split, a real router, or none (pods move)
    router: RoutedCutover | None = None
    schedules: tuple[ScheduleShift, ...] = ()  # pointed at the target after the last step (and back, if that failed)


class CutoverData(PhaseData):
    """Phase 05's record data."""

    cutover: Cutover = Field(default_factory=Cutover)


# -- phase 06 ------------------------------------------------------------------------------------

class DecideData(PhaseData):
    """Phase 06's record data: the decision and why."""

    decision: str | None = None
    reasons: list[str] = Field(default_factory=list)


# -- what a run ends with: the receipt (phase 06) and the manifest (the seal) ---------------------

class Side(_Model):
    """A side as the receipt names it: its release, provider and profile (secrets left out)."""

    release: str = ""
    provider: str = ""
    profile: dict[str, Any] = Field(default_factory=dict)


class ResourceRow(_Model):
    """A resource the run created, as phase 06 found it after its teardown: id, name, side,
    kind (pod, endpoint), role, phase and (in a race) candidate from its labels, when it was
    created and ended (Unix epoch seconds), its state, whether it had to go, and what its
    teardown found and did (:class:`runbook_lib.providers.base.Teardown`)."""

    id: str
    name: str = ""
    side: str = ""
    kind: str = ""
    role: str | None = None
    phase: str | None = None
    candidate: str | None = None
    created_at: float | None = None
    ended_at: float | None = None
    state: str = ""
    should_be_gone: bool = False
    teardown: dict[str, Any] | None = None


class ReceiptResources(_Model):
    """What the run created, the ids destroyed, what is still there after phase 06's teardown, and
    what the run used and must not touch (``not_ours``: a live source, by URL and why)."""

    created: tuple[ResourceRow, ...] = ()
    not_ours: tuple[str, ...] = ()
    destroyed: tuple[str, ...] = ()
    remaining: tuple[ResourceRow, ...] = ()


class ReconciledWrite(_Model):
    """A checkpoint set the target wrote during the cutover, as phase 06 listed it: verified
    against its manifest or not (why), each object's sha256, bytes in all."""

    prefix: str
    verified: bool
    objects: dict[str, str | None] = Field(default_factory=dict)
    bytes: int | None = None
    error: str | None = None


class Reconciliation(_Model):
    """Phase 06's account of what the target wrote (``06/reconciliation.json``,
    :func:`runbook_lib.phases.decide.reconcile`): when, the rule (``cutover.on_rollback``), every
    set found, what was done and where a copy went."""

    at: str
    rule: str
    writes: tuple[ReconciledWrite, ...] = ()
    action: str = ""
    copied_to: str | None = None


class TimelineEvent(_Model):
    """One event of the cutover or rollback: when (UTC ISO 8601), what, the share on the target
    after it (percent), who."""

    at: str
    event: str
    target_percent: int = 0
    actor: str = ""


class Delta(_Model):
    """One acceptance delta: a metric on each side (seconds, units per second or USD), the
    target-to-source ratio, and the gate that judges it (name; None: reported, not judged) with
    its verdict."""

    metric: str
    source: float | None = None
    target: float | None = None
    ratio: float | None = None
    verdict: str | None = None
    gate: str | None = None


class AcceptanceJob(_Model):
    """The canary's acceptance job as phase 03 timed it: wall seconds, budget seconds, the gate."""

    wall_s: float | None = None
    budget_s: float | None = None
    verdict: str | None = None
    blocking: bool | None = None


class CheckpointMoved(_Model):
    frozen: Frozen | None = None
    final_checkpoint_prefix: str | None = None


class TeardownNote(_Model):
    teardown_source: bool = False
    note: str = ""


class ServingSide(_Model):
    """Where one side's service ran, as the receipt names it: ``where`` in words (a pod, a Runpod
    Serverless endpoint with its settings, a live service), the id of what served phase 01's
    golden (source) or phase 03's canary (target), and an endpoint's settings as the provider
    reported them (:attr:`ServiceLaunch.endpoint`)."""

    where: str = ""
    id: str = ""
    endpoint: dict[str, Any] | None = None


class ServiceReceipt(_Model):
    """What a service migration moved (``kind: service``): the image (or the stand-in that ran
    for it), the digest where the provider reported one, the protocol, whether every launch ran as
    declared, and whether any runbook code was found inside the service (never, on a PASS)."""

    image: str = ""
    digest: str | None = None
    stand_in: bool = False
    stand_in_command: tuple[str, ...] = ()
    protocol: str = ""
    launches_as_declared: bool = False
    runbook_code_inside: tuple[str, ...] = ()
    recovery_s: float | None = None
    exact_match_rate: float | None = None
    latency: dict[str, dict[str, Number]] = Field(default_factory=dict)
    """Phase 04's per-side service latency (TTFT, TPOT, ITL and E2E p50/p95/p99, output tokens per
    second, goodput; ``CompareData.token_metrics``)."""
    live_source: LiveSource | None = None
    """The live source (``source.provider: live``): its URL, the rate held to, what was observed of
    it over its API and what params declare."""
    serving: dict[str, ServingSide] = Field(default_factory=dict)
    """Where each side's service ran (``source``, ``target``): a pod, a serverless endpoint with its
    reported settings, or a live service."""
    adapter: str = ""
    """Phase 02's adapter between where the source serves and where the target does (its
    ``serving`` row, when that is ``adapter needed``); empty when both serve the same way."""


class ReceiptSchedule(_Model):
    """One of ``source.schedules`` in the receipt: the side it started when phase 01 froze it,
    after phase 05's cutover (empty when 05 did not move it) and at the end of phase 06, with
    when it runs and what was read last."""

    name: str
    kind: str
    cadence: str = ""
    frozen: str = ""
    after_cutover: str = ""
    final: str = ""
    detail: str = ""


class Receipt(_Model):
    """``receipt.json`` (:func:`runbook_lib.phases.decide.write_receipt`): the decision and why,
    with every gate; a HOLD carries its deadline (UTC ISO 8601) and ``hold_deadline_s`` (seconds).
    ``identities`` holds the params' and the workload's own digests; ``rehearsal`` the simulators
    and rehearsal params (:func:`runbook_lib.evidence.seal.rehearsal_of`); ``route`` the route's final state."""

    run_id: str = ""
    migration: str = ""
    decided_at: str = ""
    decision: str = "?"
    hold_deadline: str | None = None
    hold_deadline_s: float | None = None
    run_status: str = ""
    exit_code: int | None = None
    reasons: list[str] = Field(default_factory=list)
    source: Side = Field(default_factory=Side)
    target: Side = Field(default_factory=Side)
    identities: dict[str, Any] = Field(default_factory=dict)
    data_checkpoint_moved: CheckpointMoved = Field(default_factory=CheckpointMoved)
    acceptance_deltas: tuple[Delta, ...] = ()
    acceptance_job: AcceptanceJob = Field(default_factory=AcceptanceJob)
    drills: tuple[DrillRow, ...] = ()
    rehearsal: dict[str, Any] | None = None
    rollback_point: RollbackPoint | None = None
    route: dict[str, Any] | None = None
    reconciliation: Reconciliation | None = None
    schedules: tuple[ReceiptSchedule, ...] = ()
    candidates: tuple[CandidateFate, ...] = ()
    timeline: tuple[TimelineEvent, ...] = ()
    service: ServiceReceipt | None = None
    forecast: SavingsForecast | None = None
    teardown: TeardownNote = Field(default_factory=TeardownNote)
    resources: ReceiptResources = Field(default_factory=ReceiptResources)
    gates: tuple[GateResult, ...] = ()


class SealingCode(_Model):
    """``manifest.json``'s ``code``: what sealed the run (``runbook verify --recompute`` reads the
    version to explain rule changes made since, :data:`runbook_lib.audit.recompute.RULE_CHANGES`)."""

    runbook_lib: str = ""
    git_commit: str | None = None


class Manifest(_Model):
    """``manifest.json`` (:func:`runbook_lib.evidence.seal.seal_run`): the run's decision, what ran, its
    rehearsal marks, what code sealed it, and for an interrupted run the signal and teardown."""

    run_id: str = ""
    migration: str = ""
    decision: str = "?"
    code: SealingCode | None = None
    params_sha256: str | None = None
    phases: list[dict[str, Any]] = Field(default_factory=list)
    rehearsal: dict[str, Any] | None = None
    interrupted: dict[str, Any] | None = None




def load_receipt(run_dir: str | Path) -> Receipt | None:
    """The run's receipt, or None when phase 06 wrote none.

    Raises:
        EvidenceError: the file is not JSON or does not fit :class:`Receipt` (the field is named).
    """
    return _load_file(Path(run_dir) / RECEIPT, Receipt)


def load_manifest(run_dir: str | Path) -> Manifest | None:
    """The run's manifest, or None when the run was never sealed.

    Raises:
        EvidenceError: the file is not JSON or does not fit :class:`Manifest`.
    """
    return _load_file(Path(run_dir) / MANIFEST, Manifest)


def _load_file(path: Path, model: type[_F]) -> _F | None:
    if not path.exists():
        return None
    try:
        body = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EvidenceError(f"{path.name} in {path.parent} cannot be read as JSON ({exc}); it was altered or "
                            "truncated: run `runbook verify` on the run") from None
    return _validate(model, body, path.name)


MODELS: dict[str, type[PhaseData]] = {"01": FreezeData, "02": MappingData, "03": ParityData, "04": CompareData,
                                      "05": CutoverData, "06": DecideData}
"""The model of each phase's completed record; a record that did not complete is :class:`PhaseData`."""

_D = TypeVar("_D", bound=PhaseData)
_F = TypeVar("_F", bound=_Model)


def version_of(body: dict[str, Any], *, where: str) -> int:
    """A record's schema version (1 when it names none: written before versions were recorded).

    Raises:
        EvidenceError: a version this code cannot read; the message names it and the versions it reads.
    """
    v = body.get("schema_version", 1)
    if v not in READABLE_VERSIONS:
        raise EvidenceError(f"{where} has record schema version {v!r}; this runbook_lib reads versions "
                            f"{list(READABLE_VERSIONS)}. Read it with the runbook_lib that wrote it (its manifest "
                            "names the version) or upgrade this one.")
    return int(v)


def parse(record: Record) -> PhaseData:
    """A record's ``data`` as its phase's model (:data:`MODELS`; :class:`PhaseData` when it did not
    complete).

    Raises:
        EvidenceError: an unreadable schema version, or data that does not fit the model (the
            field, the value seen and the record are named).
    """
    version_of(record.body, where=record.path.name)
    model = MODELS.get(record.phase, PhaseData) if record.status == "completed" else PhaseData
    return _validate(model, record.body.get("data", {}), record.path.name)


def _validate(model: type[_F], data: Any, where: str) -> _F:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        field = loc if model in (Receipt, Manifest) else f"data.{loc}"
        raise EvidenceError(f"{where}: {field} does not fit {model.__name__} ({first['msg']}; value seen "
                            f"{str(first.get('input'))[:80]!r}); the record was not written by this version's "
                            "phase, or was edited. Re-run the phase.") from None


def checked(phase: str, data: PhaseData | dict[str, Any]) -> dict[str, Any]:
    """``data`` (the phase's model, or its JSON form) as phase ``phase``'s completed record data,
    checked against its model (:data:`MODELS`) and returned as JSON (field aliases kept);
    ``schema_version`` is added by the record's envelope (:func:`runbook_lib.evidence.manifest.write_record`).

    Raises:
        EvidenceError: ``data`` is another phase's model, or a field the model names is missing or
            of the wrong type.
    """
    model = MODELS[phase]
    if isinstance(data, PhaseData):
        if not isinstance(data, model):
            raise EvidenceError(f"phase {phase}'s record must be {model.__name__}, not {type(data).__name__}")
        # the phase builds its model without re-validating what it copies in (gates, plans), so an
        # int in a float field is dumped as it is, without pydantic's warning, and the JSON is
        # validated against the model just below
        data = data.model_dump(mode="json", by_alias=True, warnings=False)
    _validate(model, data, f"phase {phase}'s record")
    return data


class Chain(dict[str, Record]):
    """A run's verified phase records by phase id, with each completed one's typed data.

    The mapping is the records themselves (status, path, sha256); the properties are the typed
    data of the phases others read, None when that phase has no completed record."""

    def __init__(self, records: dict[str, Record]) -> None:
        super().__init__(records)
        self._parsed: dict[str, PhaseData] = {}

    def data(self, phase: str) -> PhaseData | None:
        """Phase ``phase``'s typed data (any status), or None without a record."""
        rec = self.get(phase)
        if rec is None:
            return None
        if phase not in self._parsed:
            self._parsed[phase] = parse(rec)
        return self._parsed[phase]

    def _completed(self, phase: str, model: type[_D]) -> _D | None:
        rec = self.get(phase)
        if rec is None or rec.status != "completed":
            return None
        d = self.data(phase)
        assert isinstance(d, model)  # parse() picks MODELS[phase] for a completed record
        return d

    def all_data(self) -> list[PhaseData]:
        """Every record's typed data, in phase order."""
        return [d for pid, _ in PHASES if (d := self.data(pid)) is not None]

    @property
    def freeze(self) -> FreezeData | None:
        return self._completed("01", FreezeData)

    @property
    def mapping(self) -> MappingData | None:
        return self._completed("02", MappingData)

    @property
    def parity(self) -> ParityData | None:
        return self._completed("03", ParityData)

    @property
    def compare(self) -> CompareData | None:
        return self._completed("04", CompareData)

    @property
    def cutover(self) -> CutoverData | None:
        return self._completed("05", CutoverData)

    def need_freeze(self) -> FreezeData:
        """Phase 01's data, for a phase that requires it (:data:`runbook_lib.evidence.rundir.NEEDS`).

        Raises:
            EvidenceError: phase 01 has no completed record.
        """
        return _need(self.freeze, "01")

    def need_compare(self) -> CompareData:
        """Phase 04's data, for a phase that requires it.

        Raises:
            EvidenceError: phase 04 has no completed record.
        """
        return _need(self.compare, "04")

    def gates(self) -> list[GateResult]:
        """Every gate of every record, in phase order."""
        return [x for d in self.all_data() for x in d.gates]


def read_unchecked(run_dir: str | Path) -> Chain:
    """Every phase record of ``run_dir`` as it is on disk, hashes unchecked (``runbook verify``
    checks them): for readers that must work on an altered run (``verify --recompute``, the
    approvals a run is waiting on)."""
    run_dir = Path(run_dir)
    out = {}
    for pid, _ in PHASES:
        path = run_dir / f"{phase_name(pid)}.json"
        if path.exists():
            out[pid] = Record(pid, path, sha256_file(path), json.loads(path.read_text()))
    return Chain(out)


def _need(d: _D | None, phase: str) -> _D:
    if d is None:
        raise EvidenceError(f"phase {phase}'s completed record is needed here and the run has none; run phase {phase}")
    return d


def schema() -> dict[str, Any]:
    """The JSON Schema of every phase's record data, by phase id (pydantic's ``model_json_schema``)."""
    return {"schema_version": SCHEMA_VERSION,
            "phases": {pid: MODELS[pid].model_json_schema(by_alias=True) for pid, _ in PHASES}}


def schema_text() -> str:
    """:func:`schema` as the file docs/reference/records.schema.json holds it."""
    return json.dumps(schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":  # regenerate docs/reference/records.schema.json in this checkout
    (Path(__file__).resolve().parents[2] / SCHEMA_FILE).write_text(schema_text())
