"""What each phase notebook does, as library calls the notebooks stay thin around.

A notebook opens its phase with :func:`open_phase` (opens the run, verifies the records of the
phases before it), calls its phase module's steps (``freeze``, ``mapping``, ``parity``,
``compare``, ``cutover``, ``decide``), each of which returns a typed result that displays
itself, and closes with :func:`finish`, which writes the chained record from the result's
:meth:`PhaseResult.record`. Every code cell is one call and one display.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from runbook_lib import approvals, report
from runbook_lib._time import utc_now
from runbook_lib.errors import EvidenceError, NotFound, ParamsError, WorkloadError
from runbook_lib.gates import GateResult, from_dict, tolerance_for
from runbook_lib.manifest import PHASES, Record
from runbook_lib.params import LocalProfile, Migration, Profile, RemoteProfile
from runbook_lib.providers import REMOTE, create_provider
from runbook_lib.providers.base import Endpoint, EndpointSpec, Plan, Pod, PodSpec, Provider, Teardown
from runbook_lib.rundir import RunDir
from runbook_lib.scan import scan_run
from runbook_lib.storage import MARKER_KEY, Store, credential_env, store_from_params
from runbook_lib.workload.job import PARAMS_FROM_ENV

POD_TIMEOUT_S = 900.0  # a pod's acceptance job must finish within this, seconds


@dataclass
class PhaseContext:
    """Everything a phase needs: validated params, run directory, verified earlier records,
    the store, the providers, and the plans and gates this phase produced so far.

    Attributes:
        phase: phase id ``"01"`` .. ``"06"``.
        run: the run directory (params, project root, records).
        run_mode: ``interactive`` (a person steps through the notebook; :meth:`finish` scans the
            run for credentials) or ``headless`` (the runner scans after the phase).
        records: verified records of earlier phases, by phase id.
    """

    phase: str
    run: RunDir
    run_mode: str
    approval_ref: str
    records: dict[str, Record]
    started: str
    store_factory: Callable[[], Store]
    plans: list[dict[str, Any]] = field(default_factory=list)
    gates: list[GateResult] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    cache: dict[str, Any] = field(default_factory=dict, repr=False)  # provider reads reused within a phase
    providers: dict[str, Provider] = field(default_factory=dict, repr=False)  # one instance per side

    @property
    def mig(self) -> Migration:
        return self.run.mig

    @property
    def params_path(self) -> Path:
        return self.run.params_path

    @property
    def run_dir(self) -> Path:
        return self.run.path

    @property
    def run_id(self) -> str:
        return self.run.run_id

    def _repr_markdown_(self) -> str:
        m = self.mig
        return (f"**Phase {self.phase}** · run `{self.run_id}` · migration `{m.migration}` ({m.workload.kind}, "
                f"{self.run_mode})  \n**Source** {m.source.release}  \n**Target** {m.target.release}")

    @property
    def store(self) -> Store:
        """The run's store, opened (and its credentials resolved) on first use: a phase that only
        plans never needs the bucket's keys."""
        if "store" not in self.cache:
            self.cache["store"] = self.store_factory()
        return self.cache["store"]

    # -- sides, providers, resources ----------------------------------------------------------

    def profile(self, side: str) -> Profile:
        if side not in ("source", "target"):
            raise ParamsError(f"side must be 'source' or 'target', got {side!r}")
        return getattr(self.mig, side)

    def provider(self, side: str) -> Provider:
        """The provider of ``side`` (one instance per phase, so its evidence of tries accumulates)."""
        if side not in self.providers:
            prof = self.profile(side)
            self.providers[side] = create_provider(prof.provider, root=self.run.state_dir(prof.provider), profile=prof)
        return self.providers[side]

    def dry_run(self, side: str) -> bool:
        """True when ``side`` is a remote provider left in dry-run (real providers default to it;
        the local provider never is), or an earlier phase of this run only planned: plans are then
        shown and recorded, nothing is applied."""
        prof = self.profile(side)
        earlier = any(r.data.get("dry_run") for r in self.records.values())
        return isinstance(prof, RemoteProfile) and (prof.dry_run or earlier)

    def labels(self, side: str, role: str) -> tuple[tuple[str, str], ...]:
        return (("run_id", self.run_id), ("side", side), ("role", role), ("phase", self.phase))

    def apply_plan(self, side: str, plan: Plan, *, needs_store: bool = False,
                   owner_labels: dict[str, str] | None = None) -> Any:
        """Apply ``plan`` on ``side`` once its approval record is found (a dry-run plan is only
        recorded). Every plan is kept in this phase's record. ``needs_store``: the resource will
        read or write the store, so the store is opened (its keys resolved) before anything is
        created: never pay for a pod that cannot upload. ``owner_labels``: for a destroy, the
        labels the resource was listed with (its owner is judged on them, not on a second read
        that may find it already gone).

        Raises:
            ApprovalRequired: no approval record names the plan's fingerprint (HOLD).
            AuthError: ``needs_store`` and the store's keys are not set (nothing created).
        """
        if plan.dry_run:  # shown and recorded; nothing is created, so nothing needs approving yet
            self.plans.append({"plan": plan.to_dict(), "applied": False, "approved_by": None,
                               "method": "dry-run: shown, not applied"})
            return None
        approval = self._teardown_approval(side, plan, owner_labels) if plan.action == "destroy" else None
        if approval is None:
            sim = self.provider(side).simulator() if self.mig.approvals.preapproved_simulator else ""
            approval = approvals.require(plan, run_dir=self.run_dir,
                                         preapproved_local=self.mig.approvals.preapproved_local,
                                         approval_file=self.approval_ref or self.mig.approvals.approval_file,
                                         simulator=sim)
        self.plans.append({"plan": plan.to_dict(), "applied": True, "approved_by": approval.approved_by,
                           "method": approval.method})
        self.path(f"approvals/{plan.fingerprint[:16]}.json")  # the approval record is evidence of this phase
        if needs_store:
            self.store.url()
        return self.provider(side).apply(plan, approval)

    def _teardown_approval(self, side: str, plan: Plan,
                           labels: dict[str, str] | None = None) -> approvals.Approval | None:
        """Destroying a resource this run created (its ``run_id`` label) is covered by the approval
        of the launch that created it: the fingerprint of a destroy plan names a resource id no one
        can know in advance, and teardown only stops spending. A resource the provider no longer
        knows costs nothing to "destroy" (the provider's teardown records it as already gone).
        Anything else needs its own record."""
        method = approvals.RUN_TEARDOWN
        if labels is None:
            try:
                labels = self.provider(side).get(plan.target).labels
            except NotFound:
                labels, method = {"run_id": self.run_id}, "nothing to destroy: the provider no longer knows it"
        if labels.get("run_id") != self.run_id:
            return None
        return approvals.run_teardown(plan, self.run_dir, method=method)

    def plan_agent(self, side: str, role: str, mode: str, *, prefix: str, frozen_prefix: str = "",
                   extra: tuple[str, ...] = (), offers: tuple[str, ...] | None = None,
                   price_usd_per_hour: float | None = None) -> Plan:
        """The launch plan of a pod running the acceptance agent on ``side`` (pure; shown in
        notebooks and approved by fingerprint). ``offers`` overrides :meth:`offer_ids`; the price
        is the first ranked offer's (with its disk) on a remote target, else ``price_usd_per_hour``
        or the profile's."""
        prof = self.profile(side)
        argv = [sys.executable, "-m", "runbook_lib.workload.job", "agent", mode, "--params", str(self.params_path),
                "--side", side, "--run-id", self.run_id, "--store-url", self.store_url(), "--prefix", prefix]
        if frozen_prefix:
            argv += ["--frozen-prefix", frozen_prefix]
        fault = prof.fault if isinstance(prof, LocalProfile) else "none"
        env: tuple[tuple[str, str], ...] = (("RUNBOOK_FAULT", fault),) if fault != "none" else ()
        remote = isinstance(prof, RemoteProfile)
        if remote:  # inside the image: its own python; the run's params travel in the pod's environment

            argv[0] = "python"
            argv[argv.index("--params") + 1] = PARAMS_FROM_ENV
            env += (("RUNBOOK_PARAMS_YAML", (self.run_dir / "params.yaml").read_text()), ("RUNBOOK_DEVICE", prof.device))
        if remote and offers is None:
            offers = self.offer_ids(side)
        if price_usd_per_hour is None:
            price_usd_per_hour = self.offer_price(side) if remote else None
        price = prof.price_usd_per_hour if price_usd_per_hour is None else price_usd_per_hour
        spec = PodSpec(name=f"{self.mig.migration}-{role}", command=tuple(argv + list(extra)), device=prof.device,
                       price_usd_per_hour=price, labels=self.labels(side, role), env=env,
                       secret_refs=tuple((s.name, s.ref) for s in prof.secrets) + credential_env(self.mig.storage),
                       volume_gb=self.mig.workload.requirements.disk_gb,
                       offers=(offers or ()) if remote else (),  # an agent serves nothing: no ports to publish
                       )
        if isinstance(prof, RemoteProfile):
            spec = replace(spec, image=prof.image, disk_gb=prof.offer.disk_gb)
        return self.provider(side).plan_launch(spec, dry_run=self.dry_run(side))

    def store_prefix(self, *parts: str) -> str:
        """Store prefix of this run: ``runs/<run_id>/<parts...>``."""
        return "/".join(("runs", self.run_id, *parts))

    def accepted(self, golden: Any, row: dict[str, Any]) -> bool:
        """An accepted unit (README, cost per accepted unit): COMPLETED, within the SLO
        (``workload.requirements.max_request_s``, seconds from intended arrival), and its output
        within the dtype's tolerance of golden row ``row["input_index"]`` (``golden``: float64
        array, shape ``(inputs, dims)``)."""
        import numpy as np

        if row["status"] != "COMPLETED" or row["total_s"] > self.mig.workload.requirements.max_request_s:
            return False
        out = row.get("output")
        if out is None:
            return False
        ref = golden[int(row["input_index"])]
        rt, at, _ = tolerance_for(self.mig.source.dtype, self.mig.gates.parity_rtol, self.mig.gates.parity_atol)
        obs = np.asarray(out, dtype=np.float64)
        return obs.shape == ref.shape and bool(np.all(np.abs(obs - ref) <= at + rt * np.abs(ref)))

    def store_url(self) -> str:
        """The store's URL as a pod sees it (a local directory made absolute; an S3 URL as given,
        without opening the store or resolving its keys)."""
        url = self.mig.storage.url
        return self.store.url() if url.startswith("file://") else url

    def offer_price(self, side: str) -> float | None:
        """USD per hour of the first ranked target offer including the planned disk (phase 02's
        record), or None when there is none (the profile's price is used)."""
        rec = self.records.get("02") if side == "target" else None
        offers = rec.data.get("offers") if rec else None
        if not offers or not offers.get("ranked"):
            return None
        first = offers["ranked"][0]
        return next((r["hourly_usd_with_disk"] for r in offers["table"] if r["offer_id"] == first), None)

    def offer_ids(self, side: str) -> tuple[str, ...]:
        """Ranked offer ids a launch on ``side`` may try: the target's from phase 02's record; the
        source's is the GPU type its running pod uses (phase 01)."""
        if side == "target":
            rec = self.records.get("02")
            ranked = rec.data.get("offers", {}).get("ranked", []) if rec else []
            tgt = self.mig.target
            return tuple(ranked)[: tgt.offer.max_tries] if isinstance(tgt, RemoteProfile) else tuple(ranked)
        rec = self.records.get("01")
        gpu = ((rec.data["freeze"].get("source_pod") or {}) if rec else {}).get("gpu_name")
        return (str(gpu),) if gpu else ()

    def launch_agent(self, side: str, role: str, mode: str, *, prefix: str, frozen_prefix: str = "",
                     extra: tuple[str, ...] = (), offers: tuple[str, ...] | None = None) -> Pod | None:
        """Plan, approve and launch a pod running the acceptance agent on ``side`` (None in dry-run:
        the plan is recorded, nothing is launched)."""
        return self.apply_plan(side, self.plan_agent(side, role, mode, prefix=prefix, frozen_prefix=frozen_prefix,
                                                 extra=extra, offers=offers))

    def launched(self, pod: Pod | None) -> Pod:
        """The pod a launch returned; None means the launch was only planned (dry-run), which a
        phase that measures or moves work cannot proceed on.

        Raises:
            EvidenceError: the launch was a dry-run plan (phases 04-05 are skipped in dry-run).
        """
        if pod is None:
            raise EvidenceError(f"phase {self.phase} needs a running pod, but its launch was only planned (dry-run); "
                                "set dry_run: false and approve the plans to run it")
        return pod

    def wait_pod(self, side: str, pod: Pod, *, result_prefix: str = "") -> Pod:
        """Wait for a pod's agent to finish: its process exits (local), or, on a remote provider,
        its result set's completion marker appears in the store or the pod stops running. A
        non-zero exit is a WorkloadError with the log tail."""
        prov = self.provider(side)
        if self.profile(side).provider in REMOTE and result_prefix:
            done = prov.wait_exit(pod.id, timeout_s=POD_TIMEOUT_S,
                                  finished=lambda: self.store.head(f"{result_prefix}/{MARKER_KEY}") is not None)
        else:
            done = prov.wait_exit(pod.id, timeout_s=POD_TIMEOUT_S)
        # remote providers report no exit code (the store's marker decides); a local pod always
        # has one unless it was killed by a signal, which is a failure
        local = self.profile(side).provider not in REMOTE
        if done.exit_code not in (0, None) or (local and done.exit_code is None):
            raise WorkloadError(f"pod {pod.id} ({pod.name}) ended {done.status_detail or done.state}; log tail:\n"
                                f"{prov.log_tail(pod.id, 2500)}")
        return done

    def create_endpoint(self, side: str, role: str) -> Endpoint:
        prof = self.profile(side)
        spec = EndpointSpec(name=f"{self.mig.migration}-{role}", params_path=str(self.params_path), side=side,
                            workers=prof.workers, price_usd_per_hour=prof.price_usd_per_hour,
                            labels=self.labels(side, role), execution_timeout_s=self.mig.measure.request_timeout_s,
                            secret_refs=tuple((s.name, s.ref) for s in prof.secrets) + credential_env(self.mig.storage),
                            image=prof.image if isinstance(prof, RemoteProfile) else "")
        return self.apply_plan(side, self.provider(side).plan_endpoint(spec, dry_run=self.dry_run(side)))

    def destroy(self, side: str, resource_id: str, *, labels: dict[str, str] | None = None) -> Teardown | None:
        """Plan and apply the destruction of ``resource_id`` (a run's own resource is covered by its
        launch approval; ``labels`` as it was listed). Returns what the teardown found and did
        (None in dry-run)."""
        return self.apply_plan(side, self.provider(side).plan_destroy(resource_id, dry_run=self.dry_run(side)),
                               owner_labels=labels)

    # -- evidence -----------------------------------------------------------------------------

    def path(self, rel: str) -> Path:
        """Absolute path of a file this phase produces; registered for hashing into the record."""
        p = self.run.file(rel)
        if rel not in self.files:
            self.files.append(rel)
        return p

    def fetch(self, prefix: str, rel_dir: str) -> dict[str, Path]:
        """Download a verified set from the store into ``run_dir/rel_dir`` (re-hashing every byte);
        the files become evidence of this phase."""
        paths = self.store.fetch_set(prefix, self.run_dir / rel_dir)
        for p in paths.values():
            self.path(str(p.relative_to(self.run_dir)))
        return paths

    def write_json(self, rel: str, data: Any) -> Path:
        """Write evidence ``rel`` as indented JSON, atomically (temporary name, fsync, rename), and
        register it for this phase's record."""
        self.path(rel)
        return self.run.write_json(rel, data)

    def add_gates(self, *results: GateResult) -> list[GateResult]:
        self.gates.extend(results)
        return list(results)

    def earlier_gates(self) -> list[GateResult]:
        return [from_dict(g) for r in self.records.values() for g in r.body.get("data", {}).get("gates", [])]

    def finish(self, data: dict[str, Any]) -> Record:
        """Write this phase's record (chained to the previous one) with its gates, plans and files.

        In interactive mode (no runner around the kernel) the run directory is then scanned for
        the values of every declared credential, as the runner does after each headless phase.

        Raises:
            EvidenceError: a credential's value was found in the run's files (they are redacted;
                the message names the files and the credentials, never a value).
        """
        body = dict(data)
        body["gates"] = [g.to_dict() for g in self.gates]
        body["plans"] = self.plans
        body["stop_migration"] = any(g.blocking and g.verdict == "FAIL" for g in self.gates)
        # Never cut over on inconclusive evidence: an INCONCLUSIVE or ERROR blocking gate holds
        # the migration before the next phase (docs/reference/gates.md section 5.2).
        body["hold_migration"] = any(g.blocking and g.verdict in ("INCONCLUSIVE", "ERROR") for g in self.gates)
        # a provider API that said it is a simulator makes this phase's evidence a rehearsal's
        sims = {side: p.simulator() for side, p in self.providers.items()}
        body["simulators"] = {side: name for side, name in sims.items() if name}
        record = self.run.write_record(self.phase, status="completed", data=body, files=self.files,
                                       started=self.started)
        if self.run_mode == "interactive":
            check_credentials(self.run, self.phase)
        return record


class PhaseResult:
    """What a phase's main step returns: a frozen dataclass whose fields are typed, which a
    notebook displays as is (IPython calls ``_ipython_display_``) and whose :meth:`record` is the
    data written into the phase record (JSON-serialisable)."""

    def record(self) -> dict[str, Any]:
        raise NotImplementedError

    def parts(self) -> list[Any]:
        """What a notebook shows, in order: Markdown, DataFrames, Stylers, figures."""
        raise NotImplementedError

    def _ipython_display_(self) -> None:
        from IPython.display import display

        for part in self.parts():
            display(part)


def md(text: str) -> Any:
    """IPython Markdown for a result's display (IPython imported only when displaying)."""
    from IPython.display import Markdown

    return Markdown(text)


def table(rows: Any, **kwargs: Any) -> Any:
    """A pandas DataFrame of ``rows`` (records, a dict of columns, or a mapping shown as one column)."""
    import pandas as pd

    return pd.DataFrame(rows, **kwargs)


@dataclass(frozen=True)
class PlanShown:
    """A launch plan as a notebook shows it before its approval cell: the plan, its fingerprint,
    and the ranked offers a remote launch tries in order."""

    plan: Plan

    def _repr_html_(self) -> str:
        d = self.plan.to_dict()
        d.pop("spec")
        offers = list(getattr(self.plan.spec, "offers", ()) or ())
        head = table([d]).to_html(index=False)
        return head + (f"<p>ranked offers tried in order: {', '.join(offers)}</p>" if offers else "")


@dataclass(frozen=True)
class Finished:
    """A phase's written record, with the gates it judged (shown as a verdict table)."""

    record: Record
    gates: tuple[GateResult, ...]

    def _ipython_display_(self) -> None:
        from IPython.display import display

        if self.gates:
            display(report.gates_table(self.gates))
        prev = self.record.body["prev_sha256"][:16]
        display(md(f"Record `{self.record.path.name}` · sha256 `{self.record.sha256}` · previous `{prev}…`"))


def approval_widget(ctx: PhaseContext, plan: PlanShown | Plan) -> Any:
    """The Approve button for ``plan`` (interactive use; its cell is tagged ``skip-execution``
    so a headless run never waits on a click)."""
    return approvals.approval_widget(plan.plan if isinstance(plan, PlanShown) else plan, run_dir=ctx.run_dir)


def finish(ctx: PhaseContext, result: PhaseResult) -> Finished:
    """Write the phase's record from ``result.record()`` (see :meth:`PhaseContext.finish`)."""
    return Finished(ctx.finish(result.record()), tuple(ctx.gates))


def scan_phase(run: RunDir, phase: str) -> dict[str, Any]:
    """Scan ``run`` for the values of every credential its params declare and redact what is
    found. The runner calls this after each headless phase; :meth:`PhaseContext.finish` calls it
    in interactive mode.

    Returns:
        The scan summary: ``phase``, ``files`` scanned, ``findings`` (names and paths only, never
        a value; empty when clean).
    """
    res = scan_run(run.path, run.mig, redact=True)
    res["phase"] = phase
    res["findings"] = [f.__dict__ for f in res["findings"]]
    return res


def leak_message(scan: dict[str, Any]) -> str:
    """What a scan with findings says: the credentials' names and the files, never a value."""
    where = sorted({f["path"] for f in scan["findings"]})
    return (f"phase {scan['phase']}: credentials ({sorted({f['what'] for f in scan['findings']})}) found in {where}; "
            "those files were redacted. Find what printed them and run the phase again.")


def check_credentials(run: RunDir, phase: str) -> dict[str, Any]:
    """:func:`scan_phase`, raising when anything was found.

    Raises:
        EvidenceError: a credential's value was in the run's files (now redacted).
    """
    res = scan_phase(run, phase)
    if res["findings"]:
        raise EvidenceError(leak_message(res))
    return res


def open_phase(phase: str, params_path: str, run_dir: str = "", *, run_mode: str = "interactive",
               approval_ref: str = "") -> PhaseContext:
    """Start a phase: validate params, open (or, for phase 01, create) the run, verify earlier records.

    Args:
        phase: ``"01"`` .. ``"06"``.
        params_path: the migration YAML.
        run_dir: the run directory (relative to the project root, or absolute); empty means a new
            run for phase 01 and the newest run of this migration for later phases (interactive use).
        run_mode: ``interactive`` or ``headless`` (the runner passes ``headless``).
        approval_ref: path of an approval file for headless runs.

    Raises:
        ParamsError: bad params. UsageError: the run is sealed, not a run, or has other params.
        EvidenceError: unknown phase, an earlier record is missing or altered.
    """
    if phase not in dict(PHASES):
        raise EvidenceError(f"unknown phase {phase!r}; known phases are {[p for p, _ in PHASES]}")
    if run_dir:
        run = RunDir.open(run_dir, params_path)
    elif phase == "01":
        run = RunDir.create(params_path)
    else:
        run = RunDir.latest(params_path)
    records = run.require(phase)
    return PhaseContext(phase=phase, run=run, run_mode=run_mode, approval_ref=approval_ref, records=records,
                        started=utc_now(), store_factory=lambda: store_from_params(run.mig.storage, base=str(run.project)))
