"""What a phase rents and releases: the providers of both sides, the plans that create, wait on
and destroy pods and endpoints, and the approvals each plan needs."""

from __future__ import annotations

import importlib
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from runbook_lib import approvals
from runbook_lib.errors import EvidenceError, NoCapacity, NotFound, ParamsError, WorkloadError
from runbook_lib.params import LocalProfile, Profile, RemoteProfile
from runbook_lib.phases.evidence import Evidence
from runbook_lib.providers import PROVIDERS, REMOTE, create_provider
from runbook_lib.providers.base import Endpoint, EndpointSpec, Plan, Pod, PodSpec, Provider, Teardown
from runbook_lib.providers.remote import Attempt
from runbook_lib.records import Chain, Offers
from runbook_lib.rundir import OnRun, RunDir
from runbook_lib.storage import GRANT_ENV, MARKER_KEY, GrantScope, Store, build_grant
from runbook_lib.workload.job import PARAMS_FROM_ENV
from runbook_lib.workload.records import DRILLS_ENV, RECORDS_ENV, STORE_ENV

POD_TIMEOUT_S = 900.0  # a pod's acceptance job must finish within this, seconds
GRANT_MARGIN_S = 300.0
"""Added to every store grant's lifetime, seconds: the clock skew S3 tolerates between signer and
store (15 minutes on AWS) is not spent by the job, but a pod's last upload after its timeout
check and the host's wait are."""
ENDPOINT_GRANT_TTL_S = 12 * 3600.0
"""Store grant lifetime of a queue endpoint's workers beyond the run's rollback window, seconds:
an endpoint serves phase 04's measurement, phase 05's slices and phase 06's decision, and, for
the source, the rollback window after it. STS caps it at 36 h; an endpoint used longer must be
created again (its workers' record writes then fail naming the expiry)."""


@dataclass(frozen=True)
class AgentRun:
    """An agent pod run to its end by :meth:`Resources.run_agent`.

    Attributes:
        pod: the pod whose agent finished (already destroyed). done: its state when the agent
            finished. destroyed: verified gone through the provider's own listing.
        seconds: wall seconds from the first launch request to the agent's end (replacements
            included). interruptions: ``{"offer_id", "resource_id", "detail", "at_s",
            "destroyed"}`` per machine the provider took back before the agent finished.
    """

    pod: Pod
    done: Pod
    destroyed: bool
    seconds: float
    interruptions: list[dict[str, Any]]


@dataclass
class Resources(OnRun):
    """The providers of both sides of one phase and every plan that uses them.

    Attributes:
        phase: the phase id (a label of everything it creates).
        run: the run directory.
        records: verified records of earlier phases (offers ranked in phase 02, the source's GPU).
        evidence: where the phase's plans and approval records go.
        store_factory: opens the run's store (resolving its keys) when a plan needs it.
        approval_ref: an approval file for headless runs (else ``approvals.approval_file``).
        providers: one provider instance per side, made on first use.
    """

    phase: str
    run: RunDir
    records: Chain
    evidence: Evidence
    store_factory: Callable[[], Store]
    approval_ref: str = ""
    providers: dict[str, Provider] = field(default_factory=dict)
    _approved: dict[str, approvals.Approval] = field(default_factory=dict, repr=False)

    @property
    def store(self) -> Store:
        return self.store_factory()

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
        earlier = any(d.dry_run for d in self.records.all_data())
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
            self.evidence.plans.append({"plan": plan.to_dict(), "applied": False, "approved_by": None,
                               "method": "dry-run: shown, not applied"})
            return None
        approval = self._teardown_approval(side, plan, owner_labels) if plan.action == "destroy" else None
        if approval is None:
            sim = self.provider(side).simulator(ask=True) if self.mig.approvals.preapproved_simulator else ""
            approval = approvals.require(plan, run_dir=self.run_dir,
                                         preapproved_local=self.mig.approvals.preapproved_local,
                                         approval_file=self.approval_ref or self.mig.approvals.approval_file,
                                         simulator=sim)
        self._approved[plan.fingerprint] = approval
        return self._apply_approved(side, plan, approval, needs_store=needs_store)

    def approve_change(self, side: str, plan: Plan) -> approvals.Approval:
        """Find the approval of ``plan``, a change the runbook itself carries out (a cutover slice
        moving traffic through the run's router), and keep it in the phase's record; the caller
        makes the change only after this returns.

        Raises:
            ApprovalRequired: no approval record names the plan's fingerprint (HOLD).
        """
        sim = self.provider(side).simulator(ask=True) if self.mig.approvals.preapproved_simulator else ""
        approval = approvals.require(plan, run_dir=self.run_dir, preapproved_local=self.mig.approvals.preapproved_local,
                                     approval_file=self.approval_ref or self.mig.approvals.approval_file, simulator=sim)
        self.evidence.plans.append({"plan": plan.to_dict(), "applied": True, "approved_by": approval.approved_by,
                                    "method": approval.method})
        self.evidence.path(f"approvals/{plan.fingerprint[:16]}.json")
        return approval

    def _apply_approved(self, side: str, plan: Plan, approval: approvals.Approval, *, needs_store: bool) -> Any:
        row: dict[str, Any] = {"plan": plan.to_dict(), "applied": True, "approved_by": approval.approved_by,
                               "method": approval.method}
        self.evidence.plans.append(row)
        self.evidence.path(f"approvals/{plan.fingerprint[:16]}.json")  # the approval record is evidence of this phase
        if needs_store:
            self.store.url()
        applied = plan
        spec = plan.spec
        if spec is not None:
            row["credentials"] = [{"name": name, "kind": "secret", "ref": ref, "expires_at": None}
                                  for name, ref in spec.secret_refs]
            if spec.store_grant is not None:
                applied, grant = self.with_grant(plan)
                row["credentials"].append(grant)
        return self.provider(side).apply(applied, approval)

    def with_grant(self, plan: Plan) -> tuple[Plan, dict[str, Any]]:
        """``plan`` with the store grant its spec's ``store_grant`` names built now (the keys stay
        on this host) and added to the environment as :data:`~runbook_lib.storage.GRANT_ENV`,
        and the grant's evidence (names, objects, prefix and expiry; never a URL or credential).
        The fingerprint is unchanged (it leaves the grant out), so the approval still matches.

        Raises:
            StorageError: a set the pod reads does not verify (nothing is rented on it).
            AuthError: the store refused to issue the grant.
        """
        spec = plan.spec
        assert spec is not None and spec.store_grant is not None
        grant = build_grant(self.store, spec.store_grant)
        env = tuple(kv for kv in spec.env if kv[0] != GRANT_ENV) + ((GRANT_ENV, grant.to_env()),)
        return replace(plan, spec=replace(spec, env=env)), grant.evidence()

    def run_agent(self, side: str, plan: Plan, *, result_prefix: str = "") -> AgentRun:
        """Apply an agent pod's launch plan, wait for the agent to finish (:meth:`wait_pod`), and
        destroy the pod, verified gone, whatever happened.

        A machine the provider interrupts before the agent's completion marker appears (an
        outbid interruptible instance) is destroyed (a stopped Vast instance still bills for its
        disk) and replaced on the plan's ranked offers not yet tried, under the plan's own approval
        (:func:`runbook_lib.approvals.replacement`); the agent starts again from its inputs in
        the store (the frozen artifact, or the newest checkpoint set a slice starts from). Each
        interruption is a row ``interrupted`` in the provider's capacity tries and in
        :attr:`AgentRun.interruptions`.

        Raises:
            EvidenceError: the plan is a dry-run plan. ApprovalRequired: it is not approved.
            WorkloadError: the agent failed (log tail). NoCapacity: a launch found no ready
                machine, or an interrupted machine left no untried offer.
        """
        t0 = time.monotonic()
        prov = self.provider(side)
        pod: Pod = self.launched(self.apply_plan(side, plan, needs_store=True))
        interruptions: list[dict[str, Any]] = []
        while True:
            try:
                done = self.wait_pod(side, pod, result_prefix=result_prefix)
                finished = bool(result_prefix) and self.store.head(f"{result_prefix}/{MARKER_KEY}") is not None
            finally:
                self.destroy(side, pod.id)
            seconds = time.monotonic() - t0
            if not done.interrupted or finished:
                return AgentRun(pod=pod, done=done, destroyed=prov.is_gone(pod.id), seconds=seconds,
                                interruptions=interruptions)
            tries: list[Any] = getattr(prov, "attempts", [])
            offer = next((a.offer_id for a in reversed(tries) if a.resource_id == pod.id), "")
            row = {"offer_id": offer, "resource_id": pod.id, "detail": done.status_detail, "at_s": seconds,
                   "destroyed": prov.is_gone(pod.id)}
            interruptions.append(row)
            tries.append(Attempt(offer, "interrupted", f"{done.status_detail}; destroyed, agent restarted on the next "
                                                       "untried offer", pod.id, seconds))
            offers = tuple(plan.spec.offers) if isinstance(plan.spec, PodSpec) else ()
            left = offers[offers.index(offer) + 1:] if offer in offers else ()
            if not left:
                raise NoCapacity(f"{side} pod {pod.id} on offer {offer or '?'} was interrupted ({done.status_detail}) "
                                 f"before its agent finished, and no ranked offer is left untried ({len(offers)} in "
                                 "the plan). Rank more offers in phase 02 (target.offer.max_tries) or rent on demand "
                                 "(offer.interruptible: false), then run this phase again.", provider=prov.name)
            assert isinstance(plan.spec, PodSpec)
            replacement = replace(plan, spec=replace(plan.spec, offers=left))
            approval = approvals.replacement(replacement, of=plan, approval=self._approved[plan.fingerprint],
                                             run_dir=self.run_dir)
            pod = self.launched(self._apply_approved(side, replacement, approval, needs_store=True))

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
        scope = self.grant_scope("urls", read_sets=(frozen_prefix,) if frozen_prefix else (), write_prefix=prefix,
                                 ttl_s=self.agent_grant_ttl_s(side))
        spec = PodSpec(name=f"{self.mig.migration}-{role}", command=tuple(argv + list(extra)), device=prof.device,
                       price_usd_per_hour=price, labels=self.labels(side, role), env=env,
                       secret_refs=self.pod_secret_refs(side),
                       volume_gb=self.mig.workload.requirements.disk_gb,
                       offers=(offers or ()) if remote else (),  # an agent serves nothing: no ports to publish
                       store_grant=scope)
        if isinstance(prof, RemoteProfile):
            bid = self.bid(side, spec.offers)
            spec = replace(spec, image=prof.image, disk_gb=prof.offer.disk_gb, interruptible_bid_usd_per_hour=bid,
                           price_usd_per_hour=self.bid_price(side, bid, spec.price_usd_per_hour))
        return self.provider(side).plan_launch(spec, dry_run=self.dry_run(side))

    def pod_secret_refs(self, side: str) -> tuple[tuple[str, str], ...]:
        """``(NAME, ref)`` of the secrets ``side``'s pods receive: its profile's own, nothing else.
        The run's storage keys never reach a pod (it gets a store grant, :meth:`grant_scope`), and
        no provider's API key does either (the adapters use them; a pod never needs one), so the
        source's credentials cannot reach the target.

        Raises:
            ParamsError: a profile secret refers to a storage key or a provider API key.
        """
        storage = self.mig.storage
        reserved = {storage.access_key_id_ref: "storage.access_key_id_ref",
                    storage.secret_access_key_ref: "storage.secret_access_key_ref"}
        for other in ("source", "target"):
            prof = self.profile(other)
            default_key = getattr(importlib.import_module(PROVIDERS[prof.provider]), "default_key", None)
            refs = default_key(prof.api_key_ref).refs if default_key and isinstance(prof, RemoteProfile) else ()
            for ref in refs:
                reserved[ref] = f"the {other} provider's API key ({prof.provider})"
        reserved.pop("", None)
        refs = tuple((s.name, s.ref) for s in self.profile(side).secrets)
        for name, ref in refs:
            if ref in reserved:
                raise ParamsError(f"{side}.secrets: {name} refers to {ref}, the same reference as {reserved[ref]}; "
                                  "pods never receive the run's storage keys or a provider's API key. Remove the "
                                  "secret (pods reach the store through a short-lived grant), or name a scoped "
                                  "credential of its own.")
        return refs

    def grant_scope(self, kind: str, *, read_sets: tuple[str, ...] = (), write_prefix: str = "",
                    ttl_s: float) -> GrantScope | None:
        """The store grant a pod's spec names (:mod:`runbook_lib.storage.grants`): ``urls`` for an
        agent, ``session`` for queue endpoint workers; None for a ``file://`` store, which a local
        pod shares and which needs no keys. Pure: built at plan time, so the approval covers it;
        the grant itself is built at launch (:meth:`apply_plan`)."""
        if not self.mig.storage.url.startswith("s3://"):
            return None
        return GrantScope("session" if kind == "session" else "urls", tuple(read_sets), write_prefix, ttl_s)

    def agent_grant_ttl_s(self, side: str) -> float:
        """Lifetime of an agent pod's store grant, seconds: the launch budget (a remote profile's
        ``offer.capacity_budget_s``, its tries at ready capacity; 0 locally) plus the agent's
        :data:`POD_TIMEOUT_S` plus :data:`GRANT_MARGIN_S`. A replacement after an interruption
        is a new launch with a new grant."""
        prof = self.profile(side)
        launch = prof.offer.capacity_budget_s if isinstance(prof, RemoteProfile) else 0.0
        return launch + POD_TIMEOUT_S + GRANT_MARGIN_S

    def endpoint_grant_ttl_s(self) -> float:
        """Lifetime of queue endpoint workers' store grant, seconds: :data:`ENDPOINT_GRANT_TTL_S`
        plus the run's rollback window, at most STS's 36 h."""
        return min(ENDPOINT_GRANT_TTL_S + self.mig.cutover.rollback_window_s, 129_600.0)

    def bid(self, side: str, offers: tuple[str, ...]) -> float | None:
        """The bid of an interruptible rental on ``offers`` (``offer.interruptible``), USD per
        hour: the highest minimum bid among them in phase 02's offer table, so the one bid is
        valid on every offer a launch may try (a bid below an offer's minimum fails). None for
        on-demand rentals, or when phase 02 listed no interruptible price for them."""
        prof = self.profile(side)
        if not isinstance(prof, RemoteProfile) or not prof.offer.interruptible or side != "target":
            return None
        bids = [r.interruptible_usd_per_hour for r in self._offers().table
                if r.offer_id in offers and r.interruptible_usd_per_hour is not None]
        return max(bids) if bids else None

    def _offers(self) -> Offers:
        """Phase 02's offers (an empty table when it searched none or has not run)."""
        mapping = self.records.mapping
        return (mapping.offers if mapping is not None else None) or Offers()

    def bid_price(self, side: str, bid: float | None, price: float) -> float:
        """What a rental at ``bid`` costs, USD per hour: the bid plus the planned disk (the first
        ranked offer's price with disk, less its minimum bid, from phase 02's table); ``price``
        itself when there is no bid."""
        first = self._offers().first
        if bid is None or first is None or first.interruptible_usd_per_hour is None:
            return price
        return round(bid + first.hourly_usd_with_disk - first.interruptible_usd_per_hour, 6)

    def store_url(self) -> str:
        """The store's URL as a pod sees it (a local directory made absolute; an S3 URL as given,
        without opening the store or resolving its keys)."""
        url = self.mig.storage.url
        return self.store.url() if url.startswith("file://") else url

    def offer_price(self, side: str) -> float | None:
        """USD per hour of the first ranked target offer including the planned disk (phase 02's
        record), or None when there is none (the profile's price is used)."""
        first = self._offers().first if side == "target" else None
        return first.hourly_usd_with_disk if first is not None else None

    def offer_ids(self, side: str) -> tuple[str, ...]:
        """Ranked offer ids a launch on ``side`` may try: the target's from phase 02's record; the
        source's is the GPU type its running pod uses (phase 01)."""
        if side == "target":
            ranked = self._offers().ranked
            tgt = self.mig.target
            return ranked[: tgt.offer.max_tries] if isinstance(tgt, RemoteProfile) else ranked
        freeze = self.records.freeze
        pod = freeze.freeze.source_pod if freeze is not None else None
        return (pod.gpu_name,) if pod is not None and pod.gpu_name else ()

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

    def create_endpoint(self, side: str, role: str, *, workers: int | None = None, active_workers: int | None = None,
                        idle_timeout_s: float = 5.0) -> Endpoint:
        """Apply :meth:`plan_endpoint`'s plan once approved (:meth:`apply_plan`); returns the endpoint
        (None in dry-run).

        Raises:
            ApprovalRequired: no approval record names the plan's fingerprint (HOLD).
        """
        return self.apply_plan(side, self.plan_endpoint(side, role, workers=workers, active_workers=active_workers,
                                                        idle_timeout_s=idle_timeout_s))

    def plan_endpoint(self, side: str, role: str, *, workers: int | None = None, active_workers: int | None = None,
                      idle_timeout_s: float = 5.0) -> Plan:
        """The creation plan of ``side``'s endpoint in its profile's ``endpoint_mode`` (pure: shown in
        notebooks and approved by fingerprint before :meth:`create_endpoint` applies it). Its workers
        keep idempotency records under ``runs/<run_id>/jobs/<side>`` in the run's store; the target
        obeys drill requests when ``drills.run`` is not empty. A remote
        worker gets the run's params in ``RUNBOOK_PARAMS_YAML`` (params hold no secrets), its side
        in ``RUNBOOK_SIDE`` and its device in ``RUNBOOK_DEVICE``; a ``load_balancing`` worker on a
        remote target is rented on phase 02's ranked offers at the first one's price.

        ``workers`` (default: the profile's) are all kept running unless ``active_workers`` says
        fewer (0: the endpoint scales to zero after ``idle_timeout_s`` seconds idle, so each job
        after an idle spell pays a cold start)."""
        prof = self.profile(side)
        # The handler's idempotency records (runbook_lib.workload.records) live in the run's store;
        # the target obeys phase 04's drill requests only when drills run.
        records = "/".join(("runs", self.run_id, "jobs", side))
        env: tuple[tuple[str, str], ...] = ((RECORDS_ENV, records), (STORE_ENV, self.store_url()))
        if side == "target" and self.mig.drills.run:
            env += ((DRILLS_ENV, "1"),)
        extra: dict[str, Any] = {}
        price = prof.price_usd_per_hour
        if isinstance(prof, RemoteProfile):
            env += (("RUNBOOK_PARAMS_YAML", (self.run_dir / "params.yaml").read_text()), ("RUNBOOK_SIDE", side),
                    ("RUNBOOK_DEVICE", prof.device))
            extra = {"image": prof.image, "disk_gb": prof.offer.disk_gb, "gpu_types": prof.gpu_priority}
            if prof.endpoint_mode == "load_balancing":
                extra["offers"] = self.offer_ids(side)
                extra["interruptible_bid_usd_per_hour"] = self.bid(side, extra["offers"])
                price = self.bid_price(side, extra["interruptible_bid_usd_per_hour"], self.offer_price(side) or price)
        # queue workers keep idempotency records (read by any worker): a session grant on that prefix;
        # a load-balancing worker keeps none, so it reaches nothing in the store
        scope = (self.grant_scope("session", write_prefix=records, ttl_s=self.endpoint_grant_ttl_s())
                 if prof.endpoint_mode == "queue" else None)
        spec = EndpointSpec(name=f"{self.mig.migration}-{role}", params_path=str(self.params_path), side=side,
                            workers=workers or prof.workers, price_usd_per_hour=price,
                            labels=self.labels(side, role), execution_timeout_s=self.mig.measure.request_timeout_s,
                            secret_refs=self.pod_secret_refs(side), store_grant=scope,
                            env=env, mode=prof.endpoint_mode,
                            active_workers=workers or prof.workers if active_workers is None else active_workers,
                            idle_timeout_s=idle_timeout_s, **extra)
        return self.provider(side).plan_endpoint(spec, dry_run=self.dry_run(side))

    def require_all(self, plans: Sequence[tuple[str, Plan]]) -> None:
        """Check, before anything is created, that every plan a step will apply is approved, so a
        step stops at its start, not halfway with some machines rented. ``plans``: ``(side, plan)``
        pairs. Nothing is recorded here (each plan's record is written when it is applied); every
        plan still waiting gets its pending file, so one ``runbook approve`` covers them all.

        Raises:
            ApprovalRequired: one or more plans have no approval; the message lists them.
        """
        sims = {side: self.provider(side).simulator(ask=True) if self.mig.approvals.preapproved_simulator else ""
                for side in {s for s, _ in plans}}
        approvals.require_all([p for _, p in plans], run_dir=self.run_dir,
                              preapproved_local=self.mig.approvals.preapproved_local,
                              approval_file=self.approval_ref or self.mig.approvals.approval_file,
                              simulators={p.fingerprint: sims[s] for s, p in plans})

    def destroy(self, side: str, resource_id: str, *, labels: dict[str, str] | None = None) -> Teardown | None:
        """Plan and apply the destruction of ``resource_id`` (a run's own resource is covered by its
        launch approval; ``labels`` as it was listed). Returns what the teardown found and did
        (None in dry-run)."""
        return self.apply_plan(side, self.provider(side).plan_destroy(resource_id, dry_run=self.dry_run(side)),
                               owner_labels=labels)
