"""What a phase rents and releases: the providers of both sides, the plans that create and
destroy pods and endpoints, and the approvals each plan needs.

:class:`Resources` owns the providers, the plans and their approvals; what a plan is built from
is owned by its collaborators: :class:`~runbook_lib.phases.offerbook.OfferBook` (the offers and
prices of earlier phases), :class:`~runbook_lib.phases.access.StoreAccess` (store grants and
their lifetimes) and :func:`~runbook_lib.phases.access.pod_secret_refs` (what secrets a pod
gets). Agent pods, their waits and their replacement after an interruption are
:class:`~runbook_lib.phases.agents.Agents`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from runbook_lib.errors import NotFound, ParamsError
from runbook_lib.evidence import approvals
from runbook_lib.evidence.records import Chain, Credential, PlanRow
from runbook_lib.evidence.rundir import OnRun, RunDir
from runbook_lib.params import Profile, RemoteProfile
from runbook_lib.phases.access import StoreAccess
from runbook_lib.phases.evidence import Evidence
from runbook_lib.phases.offerbook import OfferBook
from runbook_lib.providers import create_provider
from runbook_lib.providers.base import Plan, Provider, Teardown
from runbook_lib.storage import Store


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
        scope: a raced candidate's place in the run's store (``candidates/<name>``, as its
            phase context's :attr:`~runbook_lib.phases.context.PhaseContext.scope`); empty otherwise.
        providers: one provider instance per side, made on first use.
        offers: the offers and prices launches take (:class:`OfferBook`).
        access: the store grants pods get (:class:`StoreAccess`).
    """

    phase: str
    run: RunDir
    records: Chain
    evidence: Evidence
    store_factory: Callable[[], Store]
    approval_ref: str = ""
    scope: str = ""
    providers: dict[str, Provider] = field(default_factory=dict)
    offers: OfferBook = field(init=False)
    access: StoreAccess = field(init=False)
    _approved: dict[str, approvals.Approval] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.offers = OfferBook(self.mig, self.records)
        self.access = StoreAccess(self.mig, self.store_factory)

    @property
    def store(self) -> Store:
        return self.store_factory()

    def profile(self, side: str) -> Profile:
        if side not in ("source", "target"):
            raise ParamsError(f"side must be 'source' or 'target', got {side!r}")
        return self.mig.source if side == "source" else self.mig.target

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
        """The labels a resource of ``side`` in ``role`` is created with and looked up by before a
        create is retried; in a race (``targets``) a target's also name its candidate, so two
        candidates on one provider never find each other's machines."""
        own = (("run_id", self.run_id), ("side", side), ("role", role), ("phase", self.phase))
        return own + ((("candidate", self.mig.target.name),) if side == "target" and self.mig.racing else ())

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
            self.evidence.plans.append(PlanRow(plan=plan.to_dict(), applied=False, method="dry-run: shown, not applied"))
            return None
        approval = self._teardown_approval(side, plan, owner_labels) if plan.action == "destroy" else None
        if approval is None:
            approval = approvals.require(plan, **self.approval_terms(), simulator=self.simulator(side))
        self._approved[plan.fingerprint] = approval
        return self.apply_approved(side, plan, approval, needs_store=needs_store)

    def approval_terms(self) -> approvals.ApprovalTerms:
        """What decides whether a plan is approved, as :func:`runbook_lib.evidence.approvals.require`,
        :func:`~runbook_lib.evidence.approvals.require_all` and the approval widget take it: the run
        directory (its approval records), whether local plans are preapproved, and the approval
        file (``--approval-file``, else ``approvals.approval_file``)."""
        a = self.mig.approvals
        return approvals.ApprovalTerms(run_dir=self.run_dir, preapproved_local=a.preapproved_local,
                                       approval_file=self.approval_ref or a.approval_file)

    def simulator(self, side: str) -> str:
        """The simulator ``side``'s provider API says it is, when simulator plans are preapproved."""
        return self.provider(side).simulator(ask=True) if self.mig.approvals.preapproved_simulator else ""

    def approval_of(self, plan: Plan) -> approvals.Approval:
        """The approval this phase applied ``plan`` under (a replacement launch reuses it).

        Raises:
            KeyError: the plan was not applied in this phase.
        """
        return self._approved[plan.fingerprint]

    def approve_change(self, side: str, plan: Plan) -> approvals.Approval:
        """Find the approval of ``plan``, a change the runbook itself carries out (a cutover slice
        moving traffic through the run's router), and keep it in the phase's record; the caller
        makes the change only after this returns.

        Raises:
            ApprovalRequired: no approval record names the plan's fingerprint (HOLD).
        """
        approval = approvals.require(plan, **self.approval_terms(), simulator=self.simulator(side))
        self.evidence.plans.append(PlanRow(plan=plan.to_dict(), approved_by=approval.approved_by,
                                           method=approval.method))
        self.evidence.path(f"approvals/{plan.fingerprint[:16]}.json")
        return approval

    def apply_approved(self, side: str, plan: Plan, approval: approvals.Approval, *, needs_store: bool) -> Any:
        """Apply ``plan`` under ``approval`` (found by :meth:`apply_plan`, or a replacement's, from
        :func:`runbook_lib.evidence.approvals.replacement`), keeping it in the phase's record with the
        credentials the resource gets (names and references; a store grant's evidence)."""
        self.evidence.path(f"approvals/{plan.fingerprint[:16]}.json")  # the approval record is evidence of this phase
        if needs_store:
            self.store.url()
        applied, credentials = plan, None
        spec = plan.spec
        if spec is not None:
            credentials = [Credential(name=name, kind="secret", ref=ref) for name, ref in spec.secret_refs]
            if spec.store_grant is not None:
                applied, grant = self.access.attach(plan)
                credentials.append(grant)
        self.evidence.plans.append(PlanRow(plan=plan.to_dict(), approved_by=approval.approved_by, method=approval.method,
                                           credentials=None if credentials is None else tuple(credentials)))
        return self.provider(side).apply(applied, approval)

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

    def require_all(self, plans: Sequence[tuple[str, Plan]]) -> None:
        """Check, before anything is created, that every plan a step will apply is approved, so a
        step stops at its start, not halfway with some machines rented. ``plans``: ``(side, plan)``
        pairs. Nothing is recorded here (each plan's record is written when it is applied); every
        plan still waiting gets its pending file, so one ``runbook approve`` covers them all.

        Raises:
            ApprovalRequired: one or more plans have no approval; the message lists them.
        """
        sims = {side: self.simulator(side) for side in {s for s, _ in plans}}
        approvals.require_all([p for _, p in plans], **self.approval_terms(),
                              simulators={p.fingerprint: sims[s] for s, p in plans})

    def destroy(self, side: str, resource_id: str, *, labels: dict[str, str] | None = None) -> Teardown | None:
        """Plan and apply the destruction of ``resource_id`` (a run's own resource is covered by its
        launch approval; ``labels`` as it was listed). Returns what the teardown found and did
        (None in dry-run)."""
        done: Teardown | None = self.apply_plan(side, self.provider(side).plan_destroy(resource_id,
                                                                                       dry_run=self.dry_run(side)),
                                                owner_labels=labels)
        return done
