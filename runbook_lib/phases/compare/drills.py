"""Phase 04's fault drills against the target, after the measurement: each a row with what is
expected, what was observed and a verdict, judged as a gate ``drill_<name>`` that blocks the
decision only when ``drills.blocking`` names it (otherwise it is scored).

The drills follow the serverless guidance (docs/reference/providers.md 2.3a:
"Redeliver jobs, remove the preferred GPU, and time out workers to verify fallback, spending
limits, and output durability"):

* ``redeliver``: a job's worker dies after its result is recorded and before it reports it; the
  endpoint delivers the job again and the handler's idempotency record
  (:mod:`runbook_lib.workload.records`) answers it, so the workload ran exactly once.
* ``hung_worker``: a job's handler never answers; the job's execution timeout
  (``drills.hang_timeout_s``) ends it TIMED_OUT and another worker serves the next request.
* ``output_durability``: a worker wipes its disk after answering; the result is still in the
  store, as returned.
* ``spend_limit``: the guard that starts each measurement round only when it fits under
  ``gates.spend_limit_usd`` (:class:`runbook_lib.measure.cost.SpendMeter`) refuses a request at a limit
  equal to what has been spent, and nothing reaches the target.
* ``preferred_offer_removed``: phase 02's first-ranked target offer is withdrawn from a fresh
  offer search; the plan takes the next qualifying offer under the unchanged requirements, or
  delays when none qualifies (planned, not rented: phase 03's capacity tries rent fallbacks).

A team's ``runpod-handler`` service cannot be made to fail from outside, so its ``redeliver`` and
``hung_worker`` drills send what its params say the handler honours
(:class:`runbook_lib.params.ServiceDrills`): one sample job twice under one fresh idempotency key
(:func:`redelivered`; the same job as a platform delivers it again), and a job the handler keeps
working on, with the drill's execution timeout as Runpod's per-job policy (:func:`hung_then_served`;
a Runpod Serverless target only: a pod's SDK API and a Vast.ai endpoint have no execution
timeout). Undeclared, each is NOT_APPLICABLE with what to declare.

A training job runs the drills that apply to a job (``drills.run`` unset:
:data:`runbook_lib.params.TRAINING_DRILLS`): ``preemption_grace``, ``corrupt_newest`` and
``hung_step`` run on the target's canary in phase 03 (:mod:`runbook_lib.workload.jobdrills`) and
are judged here from what it observed (:func:`judge_job_drill`); ``checkpoint_durability`` destroys
a pod of its own mid-run and resumes on a new one (:mod:`runbook_lib.phases.compare.durability`);
its ``spend_limit`` is the guard
the training rounds pass, refusing a round whose pod would cross the limit (:func:`_job_spend_limit`).

A drill whose property the target does not have (a ``load_balancing`` endpoint has no job API
to redeliver, time out or record jobs; a local target that declares no offers is this one
machine; a training job has no endpoint to send a request to; a team's service has no worker of
ours) is NOT_APPLICABLE with the reason, never PASS; no other gate judges those properties, so a
blocking one holds the decision (:func:`runbook_lib.gates.decide`). A drill that could not be
carried out (phase 02 ranked no offer, a provider error) is INCONCLUSIVE. A local target runs
``preferred_offer_removed`` when it declares the machines it may be placed on (``target.offers``):
the local provider withdraws the first-ranked one.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from runbook_lib import gates as g
from runbook_lib.errors import ProviderError, RunbookError
from runbook_lib.evidence.records import DrillRow, Offers
from runbook_lib.layout import GOLDEN_OUTPUTS
from runbook_lib.measure import cost
from runbook_lib.measure.timing import JobAnswer, JobClient, JobClocks, ServingClient, served_status
from runbook_lib.params import JOB_DRILL_NAMES, LiveProfile, Migration, RemoteProfile, RunpodServerless
from runbook_lib.phases import PhaseContext, Shown, md, table
from runbook_lib.phases import service_pods as pods
from runbook_lib.phases.compare import durability
from runbook_lib.phases.compare.judge import Measurement
from runbook_lib.phases.compare.raw import Measured
from runbook_lib.phases.serving import Served, ServiceServing, serving_for
from runbook_lib.providers.offers import filter_offers
from runbook_lib.service.compare import MISSING, at_path
from runbook_lib.service.compare import compare as compare_service
from runbook_lib.service.protocols import JobPolicy, ServiceClient
from runbook_lib.workload import make_workload
from runbook_lib.workload.jobdrills import WATCHDOG_EXIT
from runbook_lib.workload.records import DRILL_KEY, JobRecords

EXPECTATIONS: dict[str, str] = {
    "redeliver": "the worker dies after recording the result; the job is delivered again, COMPLETED with the "
                 "golden output, and the workload ran exactly once",
    "hung_worker": "the handler never answers; the job ends TIMED_OUT at its execution timeout and another "
                   "worker serves the next request",
    "output_durability": "the worker wipes its disk after answering; the store still holds the result as returned",
    "spend_limit": "a step that would cross the limit is refused before anything is sent",
    "preferred_offer_removed": "with the first-ranked offer withdrawn, the plan takes the next qualifying offer "
                               "under the same requirements, or delays",
    "preemption_grace": "SIGTERM mid-run: the job saves a checkpoint and exits within the grace period, and its "
                        "replacement resumes from it, losing at most drills.max_steps_lost steps",
    "corrupt_newest": "a truncated newest checkpoint is refused, named, and the resume takes the previous complete one",
    "hung_step": "a step that never finishes is stopped by the job's watchdog (workload.step_timeout_s), which names it",
    durability.NAME: durability.EXPECTATION,
}
"""What each drill expects (the row's ``expectation``)."""
JOB_EXPECTATIONS: dict[str, str] = {
    "spend_limit": "a training round that would cross the limit is refused before its pod is launched",
}
"""What a drill expects of a training job, in place of :data:`EXPECTATIONS`."""
WATCHDOG_SLACK_S = 2.0
"""Seconds past ``workload.step_timeout_s`` and the watchdog's tick (a tenth of it, at most 1 s) a
hung step may run before the job is stopped: the process's exit, and the drill's own polling."""
SERVICE_NOT_APPLICABLE: dict[str, str] = {
    "redeliver": "not applicable to this service: its protocol has no job API to deliver a request twice, and "
                 "the service declares no request id it honours for idempotency; nothing is resent, ever",
    "hung_worker": "not applicable to this service: the runbook cannot make a black-box service hang; a request "
                   "that outlives measure.request_timeout_s counts as a failed request in phases 03-05",
    "output_durability": "not applicable to this service: it writes nothing to the run's store; its answers go "
                         "back to the caller and are judged there",
}
"""Why each drill that needs the runbook's worker does not apply to a team's own service
(``kind: service``): recorded NOT_APPLICABLE with this reason, never a PASS. Kill-and-recover is
phase 03's ``recovery`` gate; ``spend_limit`` and ``preferred_offer_removed`` run as for any
workload."""
SERVICE_EXPECTATIONS: dict[str, str] = {
    "redeliver": "one job delivered twice under one idempotency key, as a platform delivers it again: both "
                 "COMPLETED with the golden answer, the second the first's, answered from the handler's record",
    "hung_worker": "a job the handler keeps working on ends TIMED_OUT at its execution timeout, and the next job is "
                   "served with the golden answer",
}
"""What a service's job drills expect, in place of :data:`EXPECTATIONS` (its job is the team's)."""
RUNPOD_MIN_EXECUTION_TIMEOUT_S = 5.0
"""The shortest per-job ``policy.executionTimeout`` Runpod takes, seconds (docs/reference/providers.md
2.4, Timeouts/TTL: "min 5 s")."""
HUNG_GRACE_S = 10.0
"""Seconds past ``drills.hang_timeout_s`` the hung job may take to be reported TIMED_OUT (the
endpoint's reaper interval and one status poll)."""


@dataclass(frozen=True)
class Drilled:
    """One drill's outcome: ``verdict`` PASS, FAIL, INCONCLUSIVE or NOT_APPLICABLE and the observation."""

    verdict: str
    observation: str


@dataclass(frozen=True)
class DrillsResult(Shown):
    """Phase 04's drill table (one row per drill run); its gates are in the phase's context and
    its rows go into phase 04's record through :func:`runbook_lib.phases.compare.evaluate`."""

    rows: tuple[DrillRow, ...]

    def parts(self) -> list[Any]:
        if not self.rows:
            return [md("**Fault drills**: none run (`drills.run` is empty)")]
        return [md("**Fault drills** against the target (expectation, observation, verdict; a blocking drill "
                   "decides, the others are scored)"), table(list(self.rows))]


def _golden_request(ctx: PhaseContext) -> tuple[int, Any, np.ndarray]:
    wl = make_workload(ctx.mig.workload, ctx.mig.source)
    idx, payload = wl.request_inputs(1, seed=4000)[0]
    return idx, payload, np.load(ctx.run_dir / GOLDEN_OUTPUTS).astype(np.float64)


def _accepted(ctx: PhaseContext, golden: np.ndarray, idx: int, job: JobAnswer, seconds: float) -> bool:
    return ctx.accepted(golden, {"status": served_status(job), "total_s": seconds, "output": job.get("output"),
                                 "input_index": idx})


class _Target:
    """The target endpoint's job API and its idempotency records, for the drills."""

    def __init__(self, ctx: PhaseContext, raw: Measured) -> None:
        m = ctx.mig.measure
        self.ctx = ctx
        self.id, self.url = raw.endpoints["target"], raw.endpoint_urls["target"]
        self.mode = raw.endpoint_modes["target"]
        self.provider = ctx.resources.provider("target")
        self.client_timeout_s = m.request_timeout_s * 4 + 120.0  # a replacement worker's cold start included
        self.records = JobRecords(ctx.store, ctx.store_prefix("jobs", "target"))

    def client(self, execution_timeout_s: float | None = None) -> JobClient:
        clocks: JobClocks = {"client_timeout_s": self.client_timeout_s}
        if execution_timeout_s is not None:
            clocks["execution_timeout_s"] = execution_timeout_s
        c = self.provider.job_client(self.id, self.url, timeout_s=self.ctx.mig.measure.request_timeout_s * 4,
                                     clocks=clocks)
        if not isinstance(c, JobClient):
            raise ProviderError(f"endpoint {self.id} answered with a {type(c).__name__}, not a job API")
        return c

    def service_client(self, *, timeout_s: float | None = None, policy: JobPolicy | None = None) -> ServiceClient:
        """A team's service's protocol client on the target (each request's deadline ``timeout_s``,
        default ``measure.request_timeout_s``; ``policy`` as
        :func:`runbook_lib.phases.service_pods.side_client` takes it)."""
        m = self.ctx.mig.measure
        return pods.side_client(self.ctx.resources, "target", self.url, timeout_s=timeout_s or m.request_timeout_s,
                                project=self.ctx.resources.run.project, endpoint_id=self.id, policy=policy)

    def serving_client(self) -> ServingClient:
        """The endpoint's client in its own mode (a job API, a load-balancing worker, or a service
        over its protocol)."""
        if self.mode == "service":
            return serving_for(self.ctx).client("target", Served(self.id, self.url, self.mode),
                                                timeout_s=self.ctx.mig.measure.request_timeout_s * 4)
        return self.provider.job_client(self.id, self.url, timeout_s=self.ctx.mig.measure.request_timeout_s * 4,
                                        mode=self.mode, clocks={"client_timeout_s": self.client_timeout_s})


def _redeliver(ctx: PhaseContext, t: _Target) -> Drilled:
    idx, payload, golden = _golden_request(ctx)
    with t.client() as c:
        t0 = time.perf_counter()
        job = c.runsync({DRILL_KEY: "crash_after_record", "input": payload})
        seconds = time.perf_counter() - t0
    runs = t.records.executions(job["id"])
    status = served_status(job)
    seen = (f"{status} after {job.get('deliveries', '?')} deliveries in {seconds:.1f} s; the workload ran {runs} "
            f"time(s); {'answered from the record' if job.get('replayed') else 'not answered from the record'}")
    if status != "COMPLETED":
        return Drilled("FAIL", f"{seen}: {job.get('error', '')}"[:400])
    if runs != 1:
        return Drilled("FAIL", f"{seen}: an idempotent handler runs a redelivered job once (broken idempotency)")
    if not _accepted(ctx, golden, idx, {**job, "status": status}, 0.0):
        return Drilled("FAIL", f"{seen}: the answer does not match the golden output of input {idx}")
    return Drilled("PASS", seen)


def _hung_worker(ctx: PhaseContext, t: _Target) -> Drilled:
    limit = ctx.mig.drills.hang_timeout_s
    _, payload, _ = _golden_request(ctx)
    with t.client(execution_timeout_s=limit) as c:
        t0 = time.perf_counter()
        hung = c.runsync({DRILL_KEY: "hang", "input": payload})
        hung_s = time.perf_counter() - t0
    with t.client() as c:
        nxt = c.runsync(payload)
    first, then = served_status(hung), served_status(nxt)
    w1, w2 = hung.get("worker") or hung.get("workerId"), nxt.get("worker") or nxt.get("workerId")
    seen = (f"hung job {first} after {hung_s:.1f} s (timeout {limit:g} s); next request {then} on worker "
            f"{w2 or '?'} (hung job's worker {w1 or '?'})")
    if first != "TIMED_OUT" or hung_s > limit + HUNG_GRACE_S:
        return Drilled("FAIL", f"{seen}: the execution timeout did not end the hung job in time")
    if then != "COMPLETED" or (w1 and w2 and w1 == w2):
        return Drilled("FAIL", f"{seen}: no other worker served after the timeout")
    return Drilled("PASS", seen)


def _output_durability(ctx: PhaseContext, t: _Target) -> Drilled:
    _, payload, _ = _golden_request(ctx)
    with t.client() as c:
        job = c.runsync({DRILL_KEY: "wipe_disk", "input": payload})
    if served_status(job) != "COMPLETED":
        return Drilled("FAIL", f"the drill job ended {served_status(job)}: {job.get('error', '')}"[:400])
    rec = t.records.recorded(job["id"])
    if rec is None:
        return Drilled("FAIL", f"job {job['id']} COMPLETED but the store holds no record of it: its output lived only "
                               "on the wiped disk")
    same = rec.get("output") == job.get("output")
    seen = f"job {job['id']} COMPLETED; after the wipe the store's record {'matches' if same else 'differs from'} " \
           "the returned output"
    return Drilled("PASS" if same else "FAIL", seen)


def _spend_limit(ctx: PhaseContext, t: _Target, meter: cost.SpendMeter) -> Drilled:
    _, payload = serving_for(ctx).request_inputs(1, seed=4000)[0]
    tight = cost.SpendMeter(meter.accrued_usd(), clock=meter.clock, rates=dict(meter.rates),
                            charged_usd=meter.charged_usd)
    sent: list[JobAnswer] = []
    c = t.serving_client()
    try:
        before = c.health()["jobs"]
        stop = guarded(tight, "drill request", 1.0, lambda: sent.append(c.runsync(payload)))
        after = c.health()["jobs"]
    finally:
        c.close()
    moved = {k: after.get(k, 0) - before.get(k, 0) for k in ("inQueue", "inProgress", "completed", "failed")
             if after.get(k, 0) != before.get(k, 0)}
    seen = (f"refused at {stop.accrued_usd:.5f} USD spent, {stop.projected_usd:.5f} USD projected" if stop
            else "not refused") + f"; requests sent {len(sent)}; target job counts changed: {moved or 'none'}"
    limit = ctx.mig.gates.spend_limit_usd
    seen += f" (the rounds used the same guard at {limit} USD)" if limit is not None else \
        " (gates.spend_limit_usd is not set: the rounds ran unguarded)"
    return Drilled("PASS" if stop is not None and not sent and not moved else "FAIL", seen)


def _without(value: Any, path: str) -> Any:
    """``value`` with the field at dotted ``path`` left out, list items by index as
    :func:`~runbook_lib.service.compare.at_path` reads them (a copy; ``value`` as it is when the
    path is absent)."""
    if not path:
        return value
    head, _, rest = path.partition(".")
    if isinstance(value, dict) and head in value:
        out: Any = dict(value)
    elif isinstance(value, list) and head.isdigit() and int(head) < len(value):
        out, head = list(value), int(head)  # type: ignore[assignment]
    else:
        return value
    if rest:
        out[head] = _without(out[head], rest)
    elif isinstance(out, dict):
        del out[head]
    else:
        out.pop(head)
    return out


def redelivered(c: ServingClient, job_input: Mapping[str, Any], *, key_field: str, key: str, replayed: str,
                matches: Callable[[Any], bool]) -> Drilled:
    """Send ``job_input`` with ``key_field`` = ``key`` twice through ``c`` and judge the second
    delivery: both COMPLETED, both answers equal (``replayed``'s field left out) and accepted by
    ``matches`` (the golden comparison), and, where ``replayed`` names the handler's own marker
    (a dotted output path), the first not answered from its record and the second answered from
    it. Returns the drill's verdict and observation."""
    job = {**job_input, key_field: key}
    first, second = c.runsync(job), c.runsync(job)
    s1, s2 = served_status(first), served_status(second)
    seen = f"{key_field}={key}: first delivery {s1} in {first.get('execution_s', math.nan):.2f} s, second {s2}"
    if s1 != "COMPLETED" or s2 != "COMPLETED":
        bad = first if s1 != "COMPLETED" else second
        return Drilled("FAIL", f"{seen}: {bad.get('error', '')}"[:400])
    o1, o2 = first.get("output"), second.get("output")
    if replayed:
        r1, r2 = at_path(o1, replayed), at_path(o2, replayed)
        seen += f"; {replayed}: first {r1 if r1 is not MISSING else 'absent'}, second {r2 if r2 is not MISSING else 'absent'}"
        if r2 is not True:
            return Drilled("FAIL", f"{seen}: the handler ran the second delivery again instead of answering from its "
                                   "record, so a job the platform delivers twice runs twice")
        if r1 is True:
            return Drilled("FAIL", f"{seen}: the first delivery of a fresh key was already answered from a record")
    if _without(o1, replayed) != _without(o2, replayed):
        return Drilled("FAIL", f"{seen}: the second answer differs from the first: {str(o2)[:160]} vs {str(o1)[:160]}")
    if not matches(_without(o1, replayed)):
        return Drilled("FAIL", f"{seen}: the answer does not match the golden: {str(o1)[:200]}")
    return Drilled("PASS", f"{seen}; the same answer, the golden's" +
                   ("" if replayed else " (the handler reports no replay marker: workload.service.drills.replayed)"))


def hung_then_served(hang: ServingClient, hang_input: Any, nxt: ServingClient, next_input: Any, *, limit_s: float,
                     matches: Callable[[Any], bool]) -> Drilled:
    """Send ``hang_input`` through ``hang`` (whose jobs carry an execution timeout of ``limit_s``
    seconds) and judge it: the endpoint ends it TIMED_OUT (the job's own status, not the client's
    deadline) within ``limit_s`` + :data:`HUNG_GRACE_S`; then ``next_input`` through ``nxt`` is
    COMPLETED and accepted by ``matches``. Returns the drill's verdict and observation."""
    t0 = time.perf_counter()
    hung = hang.runsync(hang_input)
    hung_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    then = nxt.runsync(next_input)
    then_s = time.perf_counter() - t1
    by_endpoint = served_status(hung) == "TIMED_OUT" and hung.get("stage") == "body"
    seen = (f"hung job {served_status(hung)}{' by the endpoint' if by_endpoint else ''} after {hung_s:.1f} s "
            f"(execution timeout {limit_s:g} s); next job {served_status(then)} in {then_s:.1f} s")
    if not by_endpoint or hung_s > limit_s + HUNG_GRACE_S:
        return Drilled("FAIL", f"{seen}: the execution timeout did not end the hung job in time "
                               f"({str(hung.get('error', ''))[:160]})")
    if served_status(then) != "COMPLETED" or not matches(then.get("output")):
        return Drilled("FAIL", f"{seen}: the endpoint did not serve the next job after the timeout "
                               f"({str(then.get('error') or then.get('output'))[:160]})")
    return Drilled("PASS", seen)


def _service_drill(ctx: PhaseContext, name: str, t: _Target) -> Drilled:
    """``redeliver`` or ``hung_worker`` against the target's ``runpod-handler`` service, from what
    ``workload.service.drills`` declares (the module docstring says how); else NOT_APPLICABLE."""
    svc = pods.service_of(ctx.mig)
    d = svc.drills
    serving = serving_for(ctx)
    assert isinstance(serving, ServiceServing)  # a service's drills
    idx, payload = serving.request_inputs(1, seed=4000)[0]
    golden = serving.golden()[idx]

    def matches(output: Any) -> bool:
        return compare_service(svc, golden, output).match

    if name == "redeliver":
        if not d.idempotency_key:
            return Drilled("NOT_APPLICABLE", f"{SERVICE_NOT_APPLICABLE['redeliver']} (declare "
                                             "workload.service.drills.idempotency_key, the input field the handler "
                                             "keys its record on, to run it)")
        if not isinstance(payload, dict):
            return Drilled("NOT_APPLICABLE", f"sample input {idx} is not a JSON object: no field can carry the "
                                             "idempotency key")
        with t.service_client() as c:
            return redelivered(c, payload, key_field=d.idempotency_key, key=f"runbook-drill-{uuid.uuid4().hex[:12]}",
                               replayed=d.replayed, matches=matches)
    sv = pods.serverless(ctx.mig, "target")
    if not isinstance(sv, RunpodServerless):
        where = ("a Vast.ai Serverless endpoint sets no execution timeout on a request" if sv is not None else
                 "the handler's SDK HTTP API on a pod sets no execution timeout on a job")
        return Drilled("NOT_APPLICABLE", f"not applicable to this target: {where}; a hung request holds its worker "
                                         "until the caller gives up (measure.request_timeout_s), a failed request in "
                                         "phases 03-05")
    if d.hang is None:
        return Drilled("NOT_APPLICABLE", "declare workload.service.drills.hang, a job input the handler keeps working "
                                         "on longer than drills.hang_timeout_s, to run it")
    limit = max(ctx.mig.drills.hang_timeout_s, RUNPOD_MIN_EXECUTION_TIMEOUT_S)
    with t.service_client(timeout_s=limit + HUNG_GRACE_S + ctx.mig.measure.request_timeout_s,
                          policy={"executionTimeout": int(limit * 1000)}) as hang, t.service_client() as nxt:
        out = hung_then_served(hang, d.hang, nxt, payload, limit_s=limit, matches=matches)
    if limit > ctx.mig.drills.hang_timeout_s:
        out = Drilled(out.verdict, f"{out.observation} (drills.hang_timeout_s {ctx.mig.drills.hang_timeout_s:g} s "
                                   f"raised to Runpod's minimum per-job timeout)")
    return out


def guarded(meter: cost.SpendMeter, step: str, est_s: float, fn: Callable[[], Any], *,
            launches_usd_per_hour: float = 0.0) -> cost.SpendStop | None:
    """Run ``fn`` only when ``step`` (``est_s`` seconds, launching something priced
    ``launches_usd_per_hour``) fits under the meter's limit; returns the stop record when it was
    refused (:meth:`runbook_lib.measure.cost.SpendMeter.check`), else None."""
    stop = meter.check(step, est_s, launches_usd_per_hour=launches_usd_per_hour)
    if stop is None:
        fn()
    return stop


def _preferred_offer_removed(ctx: PhaseContext) -> Drilled:
    prof = ctx.mig.target
    assert not isinstance(prof, LiveProfile)  # params refuse a live target
    mapping = ctx.records.mapping
    offers = (mapping.offers if mapping is not None else None) or Offers()
    remote = isinstance(prof, RemoteProfile)
    if not offers.ranked:
        declared = remote or bool(getattr(prof, "offers", ()))
        if declared:
            return Drilled("INCONCLUSIVE", "phase 02 ranked no target offer to withdraw")
        return Drilled("NOT_APPLICABLE", "a local target without target.offers is this one machine: there is no "
                                         "ranked offer to withdraw (declare target.offers to run this drill)")
    preferred = offers.ranked[0]
    seen_req = offers.requirements
    prov = ctx.resources.provider("target")
    ports = len(ctx.mig.workload.requirements.ports)
    if remote:  # a marketplace's offer is not ours to withdraw: it is left out of a fresh search
        fresh = [o for o in prov.search_offers(prof.offer, ports=ports) if str(o.offer_id) != str(preferred)]
    else:  # the local provider's own machine is withdrawn, and the search must no longer list it
        prov.withdraw_offer(str(preferred))
        fresh = prov.search_offers(prof.offer, ports=ports)
        if any(str(o.offer_id) == str(preferred) for o in fresh):
            return Drilled("FAIL", f"offer {preferred} was withdrawn but a fresh search still lists it")
    ranked, _ = filter_offers(fresh, prof.offer)
    same_req = seen_req is None or seen_req == json.loads(json.dumps(prof.offer.model_dump(mode="json")))
    still = [str(o) for o in offers.ranked[1:] if str(o) in {str(x.offer_id) for x in ranked}]
    choice = str(ranked[0].offer_id) if ranked else None
    seen = (f"withdrew offer {preferred}; the plan now takes {choice or 'nothing (it delays)'}; phase 02's next "
            f"still offered: {still[0] if still else 'none'}; requirements unchanged: {same_req}")
    if not same_req:
        return Drilled("FAIL", f"{seen}: the requirements differ from phase 02's")
    if choice is not None and still and choice != still[0] and choice not in offers.ranked:
        return Drilled("FAIL", f"{seen}: the fallback is not one phase 02 qualified")
    return Drilled("PASS", seen)


def judge_job_drill(mig: Migration, name: str, seen: Mapping[str, Any] | None) -> Drilled:
    """The verdict on one job drill from what the canary's agent observed
    (:func:`runbook_lib.workload.jobdrills.run`) and the params' limits (``drills.preemption_grace_s``,
    ``drills.max_steps_lost``, ``workload.step_timeout_s``). None or an ``error``: INCONCLUSIVE,
    the drill was not carried out; a fault the job did not handle: FAIL, named."""
    if seen is None:
        return Drilled("INCONCLUSIVE", "the canary recorded no observation of this drill (phase 03 ran before it was "
                                       "listed in drills.run, or its agent is older): run phase 03 again")
    if seen.get("error"):
        return Drilled("INCONCLUSIVE", f"the drill could not be carried out on the canary: {seen['error']}"[:400])
    if name == "preemption_grace":
        return _preemption_verdict(mig, seen)
    if name == "corrupt_newest":
        planted, of, got = seen.get("planted"), seen.get("of"), seen.get("resumed_from")
        refused = {str(r.get("file")): str(r.get("reason")) for r in seen.get("rejected") or []}
        what = f"planted {planted} ({seen.get('bytes')} bytes, half of {of}); "
        if seen.get("exit_code") != 0:
            return Drilled("FAIL", what + f"the replacement exited with code {seen.get('exit_code')} reading the "
                                          "checkpoints: it did not skip the truncated one")
        if got != of or planted not in refused:
            return Drilled("FAIL", what + f"the replacement resumed from {got}, refusing {sorted(refused) or 'nothing'}")
        return Drilled("PASS", what + f"refused it ({refused[str(planted)]}) and resumed from {got}")
    timeout = mig.workload.step_timeout_s  # hung_step
    if not timeout:
        return Drilled("FAIL", "no watchdog: workload.step_timeout_s is not declared, so a step that never finishes "
                               "holds the job (and its rented machine) until something outside stops it; declare it")
    named, after = seen.get("named") or {}, seen.get("stopped_after_s")
    if seen.get("exit_code") is None:
        return Drilled("FAIL", f"step {seen.get('hang_at')} never finished and nothing stopped the job in "
                               f"{seen.get('waited_s'):g} s (workload.step_timeout_s {timeout:g}): the drill killed it")
    ok = seen.get("exit_code") == WATCHDOG_EXIT and named.get("step") == seen.get("hang_at") \
        and after is not None and after <= timeout + min(1.0, timeout / 10) + WATCHDOG_SLACK_S
    return Drilled("PASS" if ok else "FAIL",
                   f"step {seen.get('hang_at')} hung; the job ended with code {seen.get('exit_code')} after "
                   f"{after if after is None else round(after, 2)} s (watchdog {timeout:g} s, exit "
                   f"{WATCHDOG_EXIT} expected), " + (f"its hung.json naming step {named.get('step')} after "
                                                       f"{float(named.get('seconds', 0)):.2f} s" if named
                                                       else "naming nothing"))


def _preemption_verdict(mig: Migration, seen: Mapping[str, Any]) -> Drilled:
    grace, most = mig.drills.preemption_grace_s, mig.drills.max_steps_lost
    exited, saved, lost = seen.get("exited_within_grace_s"), seen.get("saved"), seen.get("steps_lost")
    told = f"SIGTERM after {seen.get('steps_finished')} steps; "
    if exited is None:
        told += f"still running {grace:g} s later (drills.preemption_grace_s): SIGKILLed, having saved nothing on " \
                "the notice (the job does not handle SIGTERM); "
    else:
        told += f"exited with code {seen.get('exit_code')} {exited:.2f} s later, " + (
            f"saving {saved.get('checkpoint')}; " if saved else "saving nothing on the notice; ")
    if seen.get("resume_exit_code") != 0:
        return Drilled("FAIL", told + f"the replacement exited with code {seen.get('resume_exit_code')}")
    told += f"the replacement resumed from {seen.get('resumed_from')}, losing {lost} step(s) (at most {most})"
    ok = exited is not None and seen.get("exit_code") == 0 and saved is not None and lost is not None and lost <= most
    return Drilled("PASS" if ok else "FAIL", told)


def _job_spend_limit(ctx: PhaseContext, raw: Measured) -> Drilled:
    """A training round at a limit equal to what has been spent: the guard the rounds pass
    (:class:`runbook_lib.measure.cost.SpendMeter`, the next round's pod at the target's price, as
    long as the target's rounds took on average) must refuse it before its pod is launched."""
    meter = raw.meter
    if meter is None:
        return Drilled("INCONCLUSIVE", "phase 04 kept no spend meter to drill")
    tight = cost.SpendMeter(meter.accrued_usd(), clock=meter.clock, rates=dict(meter.rates),
                            charged_usd=meter.charged_usd)
    t = raw.throughput
    rounds = int((t["side"] == "target").sum()) if len(t) else 0
    est_s = raw.billed_s.get("target", 0.0) / rounds if rounds else ctx.mig.run.acceptance_budget_s
    price = ctx.resources.profile("target").price_usd_per_hour
    launched: list[str] = []
    stop = guarded(tight, "drill round target", est_s, lambda: launched.append("a round pod"),
                   launches_usd_per_hour=price)
    seen = (f"a {est_s:.1f} s round at {price:g} USD/h: " + (
        f"refused at {stop.accrued_usd:.5f} USD spent, {stop.projected_usd:.5f} USD projected" if stop else
        "not refused, so its pod would have been launched past the limit"))
    limit = ctx.mig.gates.spend_limit_usd
    seen += f" (the rounds used the same guard at {limit} USD)" if limit is not None else \
        " (gates.spend_limit_usd is not set: the rounds ran unguarded)"
    return Drilled("PASS" if stop is not None and not launched else "FAIL", seen)


def run_drills(ctx: PhaseContext, measured: Measurement) -> DrillsResult:
    """Run ``drills.run`` against the target after the measurement (the endpoint stays up for
    phase 05) and add one gate per drill (``drill_<name>``).

    Args:
        measured: phase 04's measurement (:func:`runbook_lib.phases.compare.measure_sides`).
    """
    raw = measured.raw
    names = ctx.mig.drills.run
    blocking = set(ctx.mig.drills.blocking)
    mode = raw.endpoint_modes.get("target")
    endpoint = _Target(ctx, raw) if mode else None
    target = endpoint if mode == "queue" else None
    no_jobs = (f"a {ctx.mig.workload.kind} workload runs on pods and has no endpoint to drill"
               if not ctx.mig.workload.serves else
               f"a {mode} endpoint has no job API: nothing is redelivered, timed out or recorded by the endpoint; "
               "the caller owns retries (docs.runpod.io/serverless/load-balancing/overview)")
    parity = ctx.records.parity
    canary = parity.result if parity is not None else None
    job_seen = {str(d.get("drill")): d for d in (canary.job_drills if canary is not None else ())}
    rows: list[DrillRow] = []
    results: list[g.GateResult] = []
    for name in names:
        t0 = time.perf_counter()
        on_canary = job_seen.get(name, {}).get("seconds") if name in JOB_DRILL_NAMES else None
        try:
            if name == "preferred_offer_removed":
                out = _preferred_offer_removed(ctx)
            elif name in JOB_DRILL_NAMES:
                out = judge_job_drill(ctx.mig, name, job_seen.get(name))
            elif name == durability.NAME:
                out = Drilled(*durability.run(ctx, raw.meter))
            elif name == "spend_limit" and not ctx.mig.workload.serves:
                out = _job_spend_limit(ctx, raw)
            elif name == "spend_limit":
                out = _spend_limit(ctx, endpoint, raw.meter) if endpoint is not None and raw.meter is not None \
                    else Drilled("NOT_APPLICABLE", no_jobs)
            elif mode == "service" and name in SERVICE_EXPECTATIONS and endpoint is not None \
                    and pods.service_of(ctx.mig).protocol == "runpod-handler":
                out = _service_drill(ctx, name, endpoint)
            elif mode == "service":
                out = Drilled("NOT_APPLICABLE", SERVICE_NOT_APPLICABLE[name])
            elif target is None:
                out = Drilled("NOT_APPLICABLE", no_jobs)
            else:
                out = {"redeliver": _redeliver, "hung_worker": _hung_worker,
                       "output_durability": _output_durability}[name](ctx, target)
        except (ProviderError, RunbookError) as exc:  # the drill could not be carried out: not a verdict on the target
            out = Drilled("INCONCLUSIVE", f"the drill could not run: {type(exc).__name__}: {exc}"[:400])
        expected = SERVICE_EXPECTATIONS.get(name, EXPECTATIONS[name]) if mode == "service" else \
            EXPECTATIONS[name] if ctx.mig.workload.serves else JOB_EXPECTATIONS.get(name, EXPECTATIONS[name])
        rows.append(DrillRow(drill=name, expectation=expected, observation=out.observation,
                             verdict=out.verdict, blocking=name in blocking,
                             seconds=round(on_canary if on_canary is not None else time.perf_counter() - t0, 3)))
        source = "params drills.blocking" if name in blocking else "scored: not in params drills.blocking"
        if out.verdict == "NOT_APPLICABLE":
            results.append(g.not_applicable(f"drill_{name}", name in blocking, out.observation,
                                            threshold=expected, unit="", method="fault drill against the target",
                                            phase="04", source=source))
            continue
        results.append(g.GateResult(f"drill_{name}", out.verdict, name in blocking, out.observation,  # type: ignore[arg-type]
                                    expected, "", "fault drill against the target",
                                    f"{out.observation}" if out.verdict == "PASS" else
                                    f"expected: {expected}; observed: {out.observation}",
                                    source=source, phase="04"))
    ctx.evidence.write_json("04/drills.json", rows)
    ctx.evidence.add_gates(*results)
    return DrillsResult(rows=tuple(rows))
