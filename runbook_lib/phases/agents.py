"""Agent pods: the runbook's acceptance agent (:mod:`runbook_lib.workload.job`) in a pod, planned,
launched, waited on to its completion marker, destroyed whatever happened, and replaced on the
next ranked offer when the provider takes its machine back before it finishes."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace

from runbook_lib.errors import EvidenceError, NoCapacity, WorkloadError
from runbook_lib.evidence import approvals
from runbook_lib.evidence.records import Interruption
from runbook_lib.layout import KEPT_PARAMS, POD_CANDIDATE_ENV, POD_DEVICE_ENV, POD_FAULT_ENV, POD_PARAMS_ENV
from runbook_lib.params import LocalProfile, RemoteProfile
from runbook_lib.phases.access import POD_TIMEOUT_S, pod_secret_refs
from runbook_lib.phases.resources import Resources
from runbook_lib.providers import REMOTE
from runbook_lib.providers.base import Attempt, Plan, Pod, PodSpec
from runbook_lib.storage import MARKER_KEY
from runbook_lib.workload.job import PARAMS_FROM_ENV


@dataclass(frozen=True)
class AgentRun:
    """An agent pod run to its end by :meth:`Agents.run`.

    Attributes:
        pod: the pod whose agent finished (already destroyed). done: its state when the agent
            finished. destroyed: verified gone through the provider's own listing.
        seconds: wall seconds from the first launch request to the agent's end (replacements
            included). interruptions: one per machine the provider took back before the agent
            finished.
    """

    pod: Pod
    done: Pod
    destroyed: bool
    seconds: float
    interruptions: tuple[Interruption, ...]


@dataclass(frozen=True)
class Agents:
    """One phase's agent pods, planned and run through its :class:`Resources` (providers, plans,
    approvals)."""

    res: Resources

    def plan(self, side: str, role: str, mode: str, *, prefix: str, frozen_prefix: str = "",
             extra: tuple[str, ...] = (), offers: tuple[str, ...] | None = None,
             price_usd_per_hour: float | None = None, reads: tuple[str, ...] = ()) -> Plan:
        """The launch plan of a pod running the acceptance agent in ``mode`` on ``side`` (pure;
        shown in notebooks and approved by fingerprint). ``offers`` overrides the ranked offers
        (:meth:`OfferBook.ids`); the price is the first ranked offer's (with its disk) on a remote
        target, else ``price_usd_per_hour`` or the profile's, in USD per hour. ``reads``: committed
        sets the agent reads besides ``frozen_prefix`` (its store grant names them)."""
        res = self.res
        prof = res.profile(side)
        argv = [sys.executable, "-m", "runbook_lib.workload.job", "agent", mode, "--params", str(res.params_path),
                "--side", side, "--run-id", res.run_id, "--store-url", res.access.url(), "--prefix", prefix]
        if frozen_prefix:
            argv += ["--frozen-prefix", frozen_prefix]
        fault = prof.fault if isinstance(prof, LocalProfile) else "none"
        env: tuple[tuple[str, str], ...] = ((POD_FAULT_ENV, fault),) if fault != "none" else ()
        if side == "target":  # the candidate it runs as: its own profile, not the params' first target
            env += ((POD_CANDIDATE_ENV, prof.name),)
        remote = isinstance(prof, RemoteProfile)
        if remote:  # inside the image: its own python; the run's params travel in the pod's environment
            argv[0] = "python"
            argv[argv.index("--params") + 1] = PARAMS_FROM_ENV
            env += ((POD_PARAMS_ENV, (res.run_dir / KEPT_PARAMS).read_text()), (POD_DEVICE_ENV, prof.device))
        if remote and offers is None:
            offers = res.offers.ids(side)
        if price_usd_per_hour is None:
            price_usd_per_hour = res.offers.price(side) if remote else None
        price = prof.price_usd_per_hour if price_usd_per_hour is None else price_usd_per_hour
        scope = res.access.scope("urls", read_sets=((frozen_prefix,) if frozen_prefix else ()) + reads, write_prefix=prefix,
                                 ttl_s=res.access.agent_ttl_s(side))
        spec = PodSpec(name=f"{res.mig.migration}-{role}", command=tuple(argv + list(extra)), device=prof.device,
                       price_usd_per_hour=price, labels=res.labels(side, role), env=env,
                       secret_refs=pod_secret_refs(res.mig, side),
                       volume_gb=res.mig.workload.requirements.disk_gb,
                       offers=(offers or ()) if remote else (),  # an agent serves nothing: no ports to publish
                       store_grant=scope)
        if isinstance(prof, RemoteProfile):
            bid = res.offers.bid(side, spec.offers)
            spec = replace(spec, image=prof.image, disk_gb=prof.offer.disk_gb, interruptible_bid_usd_per_hour=bid,
                           price_usd_per_hour=res.offers.bid_price(bid, spec.price_usd_per_hour))
        return res.provider(side).plan_launch(spec, dry_run=res.dry_run(side))

    def run(self, side: str, plan: Plan, *, result_prefix: str = "") -> AgentRun:
        """Apply an agent pod's launch plan, wait for the agent to finish (:meth:`wait`), and
        destroy the pod, verified gone, whatever happened.

        A machine the provider interrupts before the agent's completion marker appears (an
        outbid interruptible instance) is destroyed (a stopped Vast instance still bills for its
        disk) and replaced on the plan's ranked offers not yet tried, under the plan's own approval
        (:func:`runbook_lib.evidence.approvals.replacement`); the agent starts again from its inputs in
        the store (the frozen artifact, or the newest checkpoint set a slice starts from). Each
        interruption is a row ``interrupted`` in the provider's capacity tries and in
        :attr:`AgentRun.interruptions`.

        Raises:
            EvidenceError: the plan is a dry-run plan. ApprovalRequired: it is not approved.
            WorkloadError: the agent failed (log tail). NoCapacity: a launch found no ready
                machine, or an interrupted machine left no untried offer.
        """
        res = self.res
        t0 = time.monotonic()
        prov = res.provider(side)
        pod: Pod = self.launched(res.apply_plan(side, plan, needs_store=True))
        interruptions: list[Interruption] = []
        while True:
            try:
                done = self.wait(side, pod, result_prefix=result_prefix)
                finished = bool(result_prefix) and res.store.head(f"{result_prefix}/{MARKER_KEY}") is not None
            finally:
                res.destroy(side, pod.id)
            seconds = time.monotonic() - t0
            if not done.interrupted or finished:
                return AgentRun(pod=pod, done=done, destroyed=prov.is_gone(pod.id), seconds=seconds,
                                interruptions=tuple(interruptions))
            offer = next((a.offer_id for a in reversed(prov.attempts) if a.resource_id == pod.id), "")
            interruptions.append(Interruption(offer_id=offer, resource_id=pod.id, detail=done.status_detail,
                                              at_s=seconds, destroyed=prov.is_gone(pod.id)))
            prov.attempts.append(Attempt(offer, "interrupted", f"{done.status_detail}; destroyed, agent restarted on "
                                                               "the next untried offer", pod.id, seconds))
            offers = tuple(plan.spec.offers) if isinstance(plan.spec, PodSpec) else ()
            left = offers[offers.index(offer) + 1:] if offer in offers else ()
            if not left:
                raise NoCapacity(f"{side} pod {pod.id} on offer {offer or '?'} was interrupted ({done.status_detail}) "
                                 f"before its agent finished, and no ranked offer is left untried ({len(offers)} in "
                                 "the plan). Rank more offers in phase 02 (target.offer.max_tries) or rent on demand "
                                 "(offer.interruptible: false), then run this phase again.", provider=prov.name)
            assert isinstance(plan.spec, PodSpec)
            replacement = replace(plan, spec=replace(plan.spec, offers=left))
            approval = approvals.replacement(replacement, of=plan, approval=res.approval_of(plan), run_dir=res.run_dir)
            pod = self.launched(res.apply_approved(side, replacement, approval, needs_store=True))

    def launched(self, pod: Pod | None) -> Pod:
        """The pod a launch returned; None means the launch was only planned (dry-run), which a
        phase that measures or moves work cannot proceed on.

        Raises:
            EvidenceError: the launch was a dry-run plan (phases 04-05 are skipped in dry-run).
        """
        if pod is None:
            raise EvidenceError(f"phase {self.res.phase} needs a running pod, but its launch was only planned "
                                "(dry-run); set dry_run: false and approve the plans to run it")
        return pod

    def wait(self, side: str, pod: Pod, *, result_prefix: str = "") -> Pod:
        """Wait for a pod's agent to finish: its process exits (local), or, on a remote provider,
        its result set's completion marker appears in the store or the pod stops running
        (:data:`POD_TIMEOUT_S` at most).

        Raises:
            WorkloadError: the agent exited non-zero, or a local pod was killed by a signal (log tail).
        """
        res = self.res
        prov = res.provider(side)
        remote = res.profile(side).provider in REMOTE
        if remote and result_prefix:
            done = prov.wait_exit(pod.id, timeout_s=POD_TIMEOUT_S,
                                  finished=lambda: res.store.head(f"{result_prefix}/{MARKER_KEY}") is not None)
        else:
            done = prov.wait_exit(pod.id, timeout_s=POD_TIMEOUT_S)
        # remote providers report no exit code (the store's marker decides); a local pod always
        # has one unless it was killed by a signal, which is a failure
        if done.exit_code not in (0, None) or (not remote and done.exit_code is None):
            raise WorkloadError(f"pod {pod.id} ({pod.name}) ended {done.status_detail or done.state}; log tail:\n"
                                f"{prov.log_tail(pod.id, 2500)}")
        return done
