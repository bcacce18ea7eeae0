"""Phases 01 and 03 of a service (``workload.kind: service``), from outside.

Phase 01 launches the source image (or its stand-in) as it runs today, records what the provider
reports it runs, and asks it every sample input twice: the first answers are the golden, the
second show whether the service is deterministic at temperature 0. Phase 03 launches the same
image with the same command on a disposable canary, compares its answers with the golden under
the protocol's comparator, then kills it and times how long a replacement takes to answer the
same again (the recovery time, ``gates.recovery_s_max``). Phases 02, 04, 05 and 06 are the shared
ones (:mod:`runbook_lib.phases.serving` is how 04 and 05 reach a service).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from runbook_lib import gates as g
from runbook_lib.errors import EvidenceError, ProviderError
from runbook_lib.evidence.records import (
    FreezeSource,
    Golden,
    LiveFact,
    LiveSource,
    ParityData,
    PreflightCheck,
    ServiceAnswerRow,
    ServiceCanary,
    ServiceFreeze,
    ServiceLaunch,
)
from runbook_lib.layout import SERVICE_GOLDEN
from runbook_lib.params import LiveProfile, Migration, Service
from runbook_lib.phases import PhaseContext, PhaseResult, PlanShown, md, table
from runbook_lib.phases import service_pods as pods
from runbook_lib.phases.evidence import scoped_path
from runbook_lib.providers.base import Plan
from runbook_lib.service import compare, samples
from runbook_lib.service.preflight import preflight
from runbook_lib.service.protocols import Answer, ServiceClient, listed_models, peek

CANARY_ANSWERS = "03/canary_answers.json"
"""The canary's answer to each sample input, as its client returned them (status, output, metrics)."""
FREEZE_ROLE = "service-freeze"
CANARY_ROLE = "service-canary"
RECOVERED_ROLE = "service-canary-recovered"


def plan_freeze(ctx: PhaseContext) -> Plan:
    """The source service pod's launch plan (phase 01)."""
    return pods.plan_service(ctx.resources, "source", FREEZE_ROLE)


def plan_canary(ctx: PhaseContext) -> Plan:
    """The canary's launch plan (phase 03)."""
    return pods.plan_service(ctx.resources, "target", CANARY_ROLE)


def plans_03(ctx: PhaseContext) -> PlanShown:
    """Phase 03's plans: the canary and, after it is killed, its replacement."""
    return PlanShown((plan_canary(ctx), pods.plan_service(ctx.resources, "target", RECOVERED_ROLE)),
                     ("target", "target"), ("always", "after the canary is killed (kill-and-recover)"),
                     note="Phase 03 launches the same image and command on a disposable canary, then kills it and "
                          "launches its replacement; both are destroyed before the phase ends.")


NOT_SENT = "NOT_SENT"
"""Status of a sample input left unsent because the service had stopped answering in time."""


def answer_all(client: ServiceClient, inputs: list[Any], *, first: int = 0) -> list[Answer]:
    """Each sample input's answer, sent one at a time in file order (job-shaped, as
    :meth:`ServiceClient.runsync` answers). After an answer that TIMED_OUT or could not be sent
    the rest are not sent (:data:`NOT_SENT`, naming the input that stalled): a service that stalls
    costs one ``measure.request_timeout_s``, not one per sample input. ``first`` numbers the
    inputs in messages."""
    out: list[Answer] = []
    for i, x in enumerate(inputs):
        got = client.runsync(x)
        out.append(got)
        if stalled(got):
            out += [not_sent(first + i, got) for _ in inputs[i + 1:]]
            break
    return out


def stalled(answer: Answer) -> bool:
    """The service did not answer in time, or could not be reached: asking more would wait again."""
    return answer.get("status") in ("TIMED_OUT", "CLIENT_ERROR")


def not_sent(i: int, stalled_answer: Answer) -> Answer:
    """The answer recorded for an input left unsent after input ``i`` stalled."""
    a = stalled_answer
    return {"status": NOT_SENT, "output": None, "stage": a.get("stage"),
            "error": f"not sent: input {i} ended {a.get('status')} at {a.get('stage')} ({a.get('error')})"}


def image_findings(ctx: PhaseContext, launch: ServiceLaunch) -> tuple[tuple[str, ...], str | None]:
    """Risk findings about the image and the digest to pin: a tag that is not a digest can move
    under the same name (seed 001: "prove immutable image"), so the digest the provider reports is
    pinned for the canary; a stand-in has no digest, and says so."""
    svc = pods.service_of(ctx.mig)
    if svc.tag_is_digest:
        return (), svc.image.rsplit("@", 1)[1]
    out = [f"risk: image {svc.image!r} is a tag, not a digest: the registry can move it; pin "
           f"{svc.image.split(':')[0]}@sha256:<digest>"]
    if pods.live(ctx.mig) is not None:
        out.append(f"declared, not observed: the live source is said to run digest {launch.digest}; the canary must "
                   "run that digest" if launch.digest else
                   "not pinned: the live source's image is declared, not observed, and source.declared.digest is empty")
    elif launch.digest:
        out.append(f"pinned: the provider reports digest {launch.digest}; the canary must run that digest")
    elif launch.stand_in:
        out.append("not pinned: a local stand-in ran for the image, so no registry digest exists to pin")
    else:
        out.append("not pinned: the provider reported no digest for the running image")
    return tuple(out), launch.digest


def ask_each(c: ServiceClient, svc: Service, inputs: list[Any], *, twice: bool,
             check: bool) -> tuple[list[Answer], list[Answer], tuple[PreflightCheck, ...]]:
    """Every sample input's answer from ``c`` (:func:`answer_all`), the first one through the
    service preflight when ``check`` (else the protocol check), and all of them again when
    ``twice``: ``(answers, again, preflight checks)``.

    Raises:
        ProtocolMismatch: the service answers 404 on the protocol's path.
        ServicePreflightFailed: with ``check``, it does not answer as params say.
    """
    checks: tuple[PreflightCheck, ...] = ()
    if check:
        found, first = preflight(c, svc, inputs[0])
        checks = tuple(PreflightCheck(name=x.name, ok=x.ok, detail=x.detail) for x in found)
    else:
        first = c.check_protocol(inputs[0])
    rest = [not_sent(0, first) for _ in inputs[1:]] if stalled(first) else answer_all(c, inputs[1:], first=1)
    return [first, *rest], answer_all(c, inputs) if twice else [], checks


@dataclass(frozen=True)
class Asked:
    """A service pod asked every sample input: its launch as reported, and its answers."""

    launch: ServiceLaunch
    answers: list[Answer]
    again: list[Answer]
    preflight: tuple[PreflightCheck, ...] = ()


def ask(ctx: PhaseContext, side: str, role: str, inputs: list[Any], *, twice: bool = False,
        destroy: bool = True, check: bool = False) -> tuple[Asked, pods.Ready]:
    """Launch ``side``'s service pod, record its launch, ask every input (twice when ``twice``),
    and destroy it (unless ``destroy`` is False). With ``check`` the first input is the service
    preflight (:func:`runbook_lib.service.preflight.preflight`).

    Raises:
        ApprovalRequired: the plan is not approved. NotReady: it never got ready (destroyed).
        ProtocolMismatch: it answers 404 on the protocol's path (destroyed).
        ServicePreflightFailed: with ``check``, the source does not answer as params say (destroyed).
    """
    ready = pods.launch_ready(ctx.resources, side, role)
    try:
        launch = pods.launched(ctx.resources, side, ready)
        with pods.client(ctx.resources, ready) as c:
            answers, again, checks = ask_each(c, pods.service_of(ctx.mig), inputs, twice=twice, check=check)
    except BaseException:
        ctx.resources.destroy(side, ready.pod.id, labels=ready.pod.labels)
        raise
    if destroy:
        ctx.resources.destroy(side, ready.pod.id, labels=ready.pod.labels)
    return Asked(launch, answers, again, checks), ready


def _rows(svc: Any, golden: list[Any], answers: list[Answer]) -> list[ServiceAnswerRow]:
    rows = []
    for i, (gold, ans) in enumerate(zip(golden, answers, strict=True)):
        c = compare.compare(svc, gold, ans.get("output") if ans.get("status") == "COMPLETED" else None)
        detail = c.detail if ans.get("status") == "COMPLETED" else \
            f"{ans.get('status')} at {ans.get('stage')}: {ans.get('error', '')}"[:400]
        rows.append(ServiceAnswerRow(sample=i, status=str(ans.get("status")), match=c.match,
                                     first_diff_token=c.first_diff_token, first_diff_char=c.first_diff_char,
                                     detail=detail))
    return rows


SERVER_HEADERS = ("server", "x-powered-by", "via")
"""Response headers phase 01 records from a live source: what it says serves it."""


def observe_live(ctx: PhaseContext, prof: LiveProfile, c: ServiceClient, ready_s: float) -> LiveSource:
    """What phase 01 can read of a live source over its API, each fact marked ``observed`` with
    how, beside what params declare about it (``source.declared``, ``price_usd_per_hour``),
    marked ``declared``: the readiness answer and its server headers, and for ``openai-chat`` the
    models ``GET /v1/models`` lists (the OpenAI API's model list). Every request is paced."""
    svc = pods.service_of(ctx.mig)
    facts: list[LiveFact] = []
    paths = [svc.readiness.path] + (["/v1/models"] if svc.protocol == "openai-chat" else [])
    for path in paths:
        try:
            status, headers, body = peek(c, path)
        except ProviderError as exc:
            facts.append(LiveFact(name=f"GET {path}", value=f"unreachable: {exc}"[:300], basis="observed",
                                  how="one GET over its API"))
            continue
        facts.append(LiveFact(name=f"GET {path}", value=f"HTTP {status}", basis="observed", how="one GET over its API"))
        seen = {f.name for f in facts}
        facts += [LiveFact(name=f"{h} header", value=headers[h][:200], basis="observed", how=f"GET {path}")
                  for h in SERVER_HEADERS if h in headers and f"{h} header" not in seen]
        if path == "/v1/models" and status == 200:
            ids = listed_models(body)
            facts.append(LiveFact(name="models served", value=", ".join(ids) or "none listed", basis="observed",
                                  how="GET /v1/models (OpenAI API: list models)"))
    d = prof.declared
    for name, value in (("image", d.image or svc.image), ("digest", d.digest), ("provider", d.provider),
                        ("GPU", d.gpu), ("price (USD/hour)", f"{prof.price_usd_per_hour:g}"),
                        ("throughput (requests/s)", "" if d.throughput_units_per_s is None else f"{d.throughput_units_per_s:g}"),
                        ("cold start (s)", "" if d.cold_start_s is None else f"{d.cold_start_s:g}")):
        facts.append(LiveFact(name=name, value=value or "not declared", basis="declared",
                              how="source.declared" if name not in ("image", "price (USD/hour)") else
                              ("source.declared.image, else workload.service.image" if name == "image"
                               else "source.price_usd_per_hour")))
    return LiveSource(url=prof.url, max_rate_per_s=prof.max_rate_per_s, ready_s=round(ready_s, 3), facts=tuple(facts))


def ask_live(ctx: PhaseContext, prof: LiveProfile, inputs: list[Any]) -> tuple[Asked, LiveSource]:
    """Phase 01 on a live source: nothing is launched. Wait until it answers ready, read what it
    says about itself (:func:`observe_live`), then ask every sample input twice with the service
    preflight first, every request paced at ``source.max_rate_per_s``.

    Raises:
        NotReady: it never answered ready. ProtocolMismatch, ServicePreflightFailed: as :func:`ask`.
    """
    ready_s = pods.live_ready(ctx.resources, prof)
    svc = pods.service_of(ctx.mig)
    with pods.live_client(ctx.mig, prof, timeout_s=ctx.mig.measure.request_timeout_s, project=ctx.run.project) as c:
        seen = observe_live(ctx, prof, c, ready_s)
        answers, again, checks = ask_each(c, svc, inputs, twice=True, check=True)
    launch = ServiceLaunch(pod=f"{pods.LIVE_ID} {prof.url}", image=prof.declared.image or svc.image,
                           digest=prof.declared.digest or None, ready_s=round(ready_s, 3))
    return Asked(launch, answers, again, checks), seen


def live_gates(prof: LiveProfile, phase: str) -> tuple[g.GateResult, g.GateResult]:
    """``launched_as_declared`` and ``no_runbook_inside`` for a live source: NOT_APPLICABLE and
    not blocking, with the reason: the runbook launched nothing there, so no launch can be
    compared with params and no process of its own can be inside."""
    why = (f"the source is a live service at {prof.url} (source.provider live): the runbook did not launch it, so its "
           "image and command are declared, not observed")
    return (g.not_applicable("launched_as_declared", False, why, threshold="True", unit="bool", method="check",
                             phase=phase, source="params source.provider: live"),
            g.not_applicable("no_runbook_inside", False, why + "; the runbook runs nothing inside it", threshold="True",
                             unit="bool", method="check", phase=phase, source="params source.provider: live"))


def freeze_service(ctx: PhaseContext) -> FreezeSource:
    """Phase 01 for a service: the source pod launched as it runs today, its launch as the
    provider reports it, the golden answers (``01/service_golden.json``) and the source against
    itself. Nothing is rented in a dry-run: the plan is recorded. A live source
    (``source.provider: live``) is not launched: it is asked as it runs (:func:`ask_live`)."""
    svc = pods.service_of(ctx.mig)
    inputs = samples.load_samples(svc, ctx.params_path)
    lp = pods.live(ctx.mig)
    seen: LiveSource | None = None
    if lp is not None:
        asked, seen = ask_live(ctx, lp, inputs)
    else:
        plan = plan_freeze(ctx)
        if plan.dry_run:
            ctx.resources.apply_plan("source", plan)
            return FreezeSource(plan=plan.to_dict(), dry_run=True)
        asked, _ = ask(ctx, "source", FREEZE_ROLE, inputs, twice=True, check=True)
    golden = [a.get("output") if a.get("status") == "COMPLETED" else None for a in asked.answers]
    divergent = [r for r in _rows(svc, golden, asked.again) if not r.match]
    path = ctx.evidence.write_json(SERVICE_GOLDEN, {"protocol": svc.protocol, "answers": golden,
                                                    "source_statuses": [a.get("status") for a in asked.answers]})
    findings, digest = image_findings(ctx, asked.launch)
    sample_file = samples.samples_path(svc, ctx.params_path)
    sf = ServiceFreeze(protocol=svc.protocol, image=svc.image, image_findings=findings, pinned_digest=digest,
                       launch=asked.launch, samples=len(inputs),
                       samples_sha256=hashlib.sha256(sample_file.read_bytes()).hexdigest(),
                       golden_sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
                       failed_samples=tuple(i for i, a in enumerate(golden) if a is None),
                       self_divergent=tuple(divergent), preflight=asked.preflight, live=seen)
    first_failed = next((a for a in asked.answers if a.get("status") != "COMPLETED"), None)
    ctx.evidence.add_gates(
        g.boolean_gate("source_answers", not sf.failed_samples, phase="01",
                       detail=f"the source answered {len(inputs) - len(sf.failed_samples)} of {len(inputs)} sample "
                              "inputs" + (f"; failed: {list(sf.failed_samples)[:10]}, the first "
                                          f"{first_failed.get('status')} at {first_failed.get('stage')}: "
                                          f"{first_failed.get('error')}" if sf.failed_samples and first_failed
                                          else "")),
        *(live_gates(lp, "01") if lp is not None else
          (launch_gate(asked.launch, "01"), runbook_free_gate(asked.launch, "01"))))
    golden_rec = Golden(prefix=SERVICE_GOLDEN, shape=[len(golden)], dtype="json", outputs_sha256=sf.golden_sha256)
    return FreezeSource(golden=golden_rec, identity={"image": svc.image, "pinned_digest": digest,
                                                     "samples_sha256": sf.samples_sha256},
                        service=sf, source_pod=None)


def launch_gate(launch: ServiceLaunch, phase: str) -> g.GateResult:
    """PASS when the provider's report of the pod equals the params (image, command, environment
    names, port)."""
    return g.boolean_gate("launched_as_declared", launch.as_declared, phase=phase,
                          detail=f"pod {launch.pod}: image, command, environment names and port as params declare"
                          if launch.as_declared else f"pod {launch.pod}: " + "; ".join(launch.mismatches))


def runbook_free_gate(launch: ServiceLaunch, phase: str) -> g.GateResult:
    """PASS when no runbook code ran inside the service: no ``RUNBOOK_*`` variable and no
    ``runbook_lib`` process where the provider reports processes (the local provider); where it
    reports none (Runpod, Vast.ai), PASS rests on its report of the launch: the declared image and
    command with the declared environment names, none of them ``RUNBOOK_*`` (the runbook never
    runs anything else in a service pod), and the detail says so. FAIL on any runbook variable or
    process seen; INCONCLUSIVE when neither processes nor a launch as declared can be shown."""
    if launch.runbook_inside:
        return g.boolean_gate("no_runbook_inside", False, phase=phase,
                              detail="runbook code inside the service: " + "; ".join(launch.runbook_inside))
    if launch.processes_reported:
        ok: bool | None = True
        detail = (f"{len(launch.processes)} process(es) in pod {launch.pod}: no RUNBOOK_* variable, no runbook_lib "
                  "command line")
    elif launch.as_declared:
        ok = True
        detail = (f"pod {launch.pod}: the provider reports the declared image and command and environment names "
                  f"{list(launch.env_names)}, none RUNBOOK_*; it reports no processes, and the runbook starts "
                  "nothing else in a service pod")
    else:
        ok = None
        detail = ("the provider reports no processes and the launch differs from the params, so nothing shows "
                  "what runs inside")
    return g.boolean_gate("no_runbook_inside", ok, phase=phase, detail=detail)


def parity_gate(svc: Service, rows: list[ServiceAnswerRow], divergent: Sequence[ServiceAnswerRow]) -> g.GateResult:
    """``service_parity``: the exact-match rate over the sample inputs against
    ``workload.service.parity.min_exact_match``. When the source itself gave two different
    answers to one input in phase 01, a shortfall is INCONCLUSIVE, not FAIL: the service is not
    deterministic at temperature 0, so a difference does not show the target differs."""
    need = svc.parity.min_exact_match
    n = len(rows)
    rate = sum(r.match for r in rows) / n if n else 0.0
    first = next((r for r in rows if not r.match), None)
    if first is None:
        where = ""
    elif first.status != "COMPLETED":
        kinds = sorted({r.status for r in rows if r.status != "COMPLETED"})
        where = f"; failed answers ({', '.join(kinds)}), the first on input {first.sample}: {first.detail}"
    else:
        where = (f"; first differing input {first.sample} at chunk {first.first_diff_token} (character "
                 f"{first.first_diff_char}): {first.detail}")
    verdict = "PASS" if rate >= need else ("INCONCLUSIVE" if divergent else "FAIL")
    detail = (f"{sum(r.match for r in rows)} of {n} answers equal the golden (rate {rate:.3f}, minimum {need:g})"
              + where)
    if verdict == "INCONCLUSIVE":
        detail += (f"; the source answered {len(divergent)} input(s) differently when asked twice in phase 01 "
                   f"(first: input {divergent[0].sample}, {divergent[0].detail}): not deterministic at temperature "
                   "0, so the difference is not evidence against the target")
    return g.GateResult("service_parity", verdict, True, round(rate, 4), need, "exact-match rate",  # type: ignore[arg-type]
                        "canary answers vs phase 01 golden, protocol comparator", detail,
                        source="params workload.service.parity.min_exact_match", phase="03")


def parity_from_files(mig: Migration, run_dir: Path, divergent: Sequence[ServiceAnswerRow], *,
                      scope: str = "") -> g.GateResult:
    """:func:`parity_gate` derived again from the run's files: phase 01's golden answers
    (``01/service_golden.json``) and the canary's (``03/canary_answers.json``; a raced
    candidate's under its ``scope``, ``03/candidates/<name>``), compared again under the
    protocol's comparator (``runbook verify --recompute``).

    Raises:
        EvidenceError: either file is missing.
    """
    svc = pods.service_of(mig)
    try:
        golden = json.loads((run_dir / SERVICE_GOLDEN).read_text())["answers"]
        answers = json.loads((run_dir / scoped_path(scope, CANARY_ANSWERS)).read_text())["answers"]
    except (OSError, KeyError, ValueError) as exc:
        raise EvidenceError(f"{run_dir}: the golden or canary answers cannot be read ({exc}); re-run phases 01 and 03") from exc
    return parity_gate(svc, _rows(svc, golden, answers), divergent)


def recovery_gate(ctx: PhaseContext, recovery_s: float | None, rate: float | None) -> g.GateResult:
    """``recovery``: seconds from killing the canary to its replacement answering as the golden,
    against ``gates.recovery_s_max`` (seed 001: "acceptance thresholds for ... recovery"); blocking
    when set, else scored. FAIL when the replacement never answered as the golden."""
    limit = ctx.mig.gates.recovery_s_max
    need = pods.service_of(ctx.mig).parity.min_exact_match
    if recovery_s is None or rate is None:
        verdict, detail = "FAIL", "the replacement did not come back answering"
    elif rate < need:
        verdict = "FAIL"
        detail = (f"the replacement answered again {recovery_s:.2f} s after the kill, but not as the golden "
                  f"(exact-match rate {rate:.3f} < {need:g})")
    else:
        verdict = "PASS" if limit is None or recovery_s <= limit else "FAIL"
        detail = f"killed to answering again in {recovery_s:.2f} s" + (f" (limit {limit:g} s)" if limit else
                                                                       " (no gates.recovery_s_max: scored)")
    return g.GateResult("recovery", verdict, limit is not None or verdict == "FAIL",  # type: ignore[arg-type]
                        recovery_s, limit, "s", "kill the canary, time its replacement to a golden answer", detail,
                        source="params gates.recovery_s_max" if limit is not None else
                        "scored: gates.recovery_s_max is not set", phase="03")


def kill_and_recover(ctx: PhaseContext, ready: pods.Ready, inputs: list[Any]) -> tuple[float, Asked, str]:
    """Kill the canary's processes and time its replacement from the kill to answering again.
    A provider that restarts a stopped pod (``capabilities().restart``) would restart it; the
    local provider cannot, so the kill destroys the pod and a replacement of the same image and
    command is launched, as an orchestrator replaces a dead container.

    Returns:
        Seconds from the kill to the replacement's first answer, the replacement's answers, and
        how it recovered.
    """
    res = ctx.resources
    t_kill = time.perf_counter()
    res.destroy("target", ready.pod.id, labels=ready.pod.labels)
    asked, _ = ask(ctx, "target", RECOVERED_ROLE, inputs[:1])
    first_answer_s = time.perf_counter() - t_kill
    how = ("the canary endpoint was destroyed (its workers with it); a replacement endpoint of the same image and "
           "settings was created and answered the first sample input" if pods.serverless(ctx.mig, "target") else
           "the canary's processes were killed (destroyed); a replacement pod of the same image and command was "
           "launched and answered the first sample input")
    return first_answer_s, asked, how


def run_canary(ctx: PhaseContext) -> ServiceCanary | Plan:
    """Phase 03 for a service: the canary, its answers against the golden, the kill and its
    recovery; the gates ``service_parity``, ``launched_as_declared``, ``no_runbook_inside`` and
    ``recovery``. A dry-run only records the plan."""
    svc = pods.service_of(ctx.mig)
    inputs = samples.load_samples(svc, ctx.params_path)
    plan = plan_canary(ctx)
    if plan.dry_run:
        ctx.resources.apply_plan("target", plan)
        return plan
    ctx.resources.require_all([("target", p) for p in plans_03(ctx).plans])
    rec = ctx.records.need_freeze().freeze
    sf = rec.service or ServiceFreeze()
    golden = json.loads((ctx.run_dir / SERVICE_GOLDEN).read_text())["answers"]
    asked, ready = ask(ctx, "target", CANARY_ROLE, inputs, destroy=False)
    rows = _rows(svc, golden, asked.answers)
    try:
        recovery_s, again, how = kill_and_recover(ctx, ready, inputs)
    except ProviderError as exc:
        recovery_s, again, how = None, None, f"the replacement did not come back: {type(exc).__name__}: {exc}"[:400]
    again_rows = _rows(svc, golden[:1], again.answers) if again else []
    again_rate = (sum(r.match for r in again_rows) / len(again_rows)) if again_rows else None
    rate = sum(r.match for r in rows) / len(rows)
    out = ServiceCanary(launch=asked.launch, answers=tuple(rows), exact_match_rate=round(rate, 4),
                        min_exact_match=svc.parity.min_exact_match,
                        recovery_s=round(recovery_s, 3) if recovery_s is not None else None,
                        recovered_launch=again.launch if again else None,
                        recovered_exact_match_rate=again_rate, recovery_how=how)
    ctx.evidence.write_json("03/service_answers.json", out)
    ctx.evidence.write_json(CANARY_ANSWERS, {"answers": asked.answers})
    ctx.evidence.add_gates(parity_gate(svc, rows, sf.self_divergent), launch_gate(asked.launch, "03"),
                           runbook_free_gate(asked.launch, "03"), recovery_gate(ctx, out.recovery_s, again_rate))
    return out


@dataclass(frozen=True)
class ServiceParityResult(PhaseResult):
    """Phase 03's evidence for a service (:func:`run_canary`)."""

    canary: ServiceCanary | Plan

    def record(self) -> ParityData:
        c = self.canary
        if isinstance(c, Plan):
            return ParityData(dry_run=True, plan=c.to_dict())
        return ParityData(canary_pod=c.launch.pod, canary_destroyed=True, service=c)

    def parts(self) -> list[Any]:
        c = self.canary
        if isinstance(c, Plan):
            return [md("**Dry-run**: the canary launch is planned above and recorded; nothing was launched.")]
        return [md(f"**Canary** `{c.launch.pod}` ready in {c.launch.ready_s} s, running "
                   f"{'a stand-in for ' if c.launch.stand_in else ''}`{c.launch.image}`: "
                   f"`{' '.join(c.launch.command)}`"),
                md(f"**Answers against the golden**: exact-match rate {c.exact_match_rate} (minimum "
                   f"{c.min_exact_match})"),
                table([r.model_dump() for r in c.answers if not r.match] or [{"sample": "all", "match": True}]),
                md(f"**Kill and recover**: {c.recovery_how}; {c.recovery_s} s from the kill to a golden answer")]


def service_freeze_parts(sf: ServiceFreeze) -> list[Any]:
    """Phase 01's display of a service: its launch as reported, the image findings, the golden."""
    ln = sf.launch
    if sf.live is not None:
        lv = sf.live
        head = [md(f"**Source service**: the live service at `{lv.url}` ({sf.protocol}), not launched by the runbook "
                   f"and not changed by it; ready in {lv.ready_s} s; every request paced at no more than "
                   f"{lv.max_rate_per_s:g}/s (source.max_rate_per_s)"),
                md("**What it is**: observed over its API, or declared in params (unverified)"),
                table([f.model_dump() for f in lv.facts])]
        return head + _golden_parts(sf)
    return [md(f"**Source service** `{ln.pod}`: {'a stand-in for ' if ln.stand_in else ''}`{sf.image}` "
               f"({sf.protocol}), ready in {ln.ready_s} s; command `{' '.join(ln.command)}`; environment names "
               f"{list(ln.env_names)}; ports {ln.ports}"),
            *_golden_parts(sf),
            md("**Processes in the service** (as the provider reports them)"),
            table([{"pid": p.get("pid"), "command": " ".join(p.get("cmdline") or [])[:120],
                    "RUNBOOK_* variables": ", ".join(p.get("runbook_env") or []) or "none"}
                   for p in ln.processes] or [{"pid": "-", "command": "not reported by the provider"}])]


def _golden_parts(sf: ServiceFreeze) -> list[Any]:
    """The image findings, the preflight and the golden answers (phase 01's display)."""
    return [md("**Image findings**"), table([{"finding": f} for f in sf.image_findings] or [{"finding": "none"}]),
            md("**Service preflight** (the first sample input, checked against what params claim)"),
            table([c.model_dump() for c in sf.preflight] or [{"name": "-", "ok": None, "detail": "not recorded"}]),
            md(f"**Golden answers** for {sf.samples} sample inputs (samples sha256 `{sf.samples_sha256[:16]}`, "
               f"golden sha256 `{sf.golden_sha256[:16]}`); asked twice, the source differed from itself on "
               f"{len(sf.self_divergent)}")]
