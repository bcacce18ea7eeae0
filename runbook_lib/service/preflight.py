"""The service preflight: one sample sent to the source as soon as it answers, before any golden
answer is kept, checking what the params claim about the service.

Checks, each with the params field to change when it fails:

- **answers**: the first sample's answer completes (a named failure: its kind, stage and the
  server's words; a 404 on the protocol's path is a protocol mismatch);
- **streams**: ``stream: true`` gets server-sent events (a whole JSON answer instead means the
  service does not stream: ``stream: false``), and ``stream: false`` gets one JSON answer;
- **tokens**: where output tokens come from (``usage``, the named tokenizer, or nowhere: then
  TPOT, ITL and goodput are recorded as not measurable; a finding, not a stop);
- **comparator**: the answer passes the protocol's comparator against itself (an ``http-json``
  or ``runpod-handler`` check whose path the answer lacks can never match).

Readiness is checked before it, by the pod's launch (:func:`runbook_lib.phases.service_pods.wait_ready`,
whose error names ``readiness.path`` and its protocol default).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from runbook_lib.errors import RunbookError
from runbook_lib.params import Service
from runbook_lib.service import compare
from runbook_lib.service.protocols import ServiceClient

FIX_BY_KIND = {
    "TIMED_OUT": "raise measure.request_timeout_s (the whole answer) or workload.service.max_gap_s (between "
                 "streamed events) if the service is that slow on purpose",
    "OVERSIZE": "raise workload.service.max_answer_bytes if answers this large are expected",
    "ERROR_BODY": "the source itself answers with an error: fix the service or the sample inputs "
                  "(workload.service.samples); for http-json, workload.service.request.error_path names where it "
                  "reports errors",
    "EMPTY": "the source answers nothing: check workload.service.max_tokens and the sample inputs",
    "HTTP_STATUS": "check workload.service.protocol, request.path and request.method, and the sample inputs",
    "CLIENT_ERROR": "check workload.service.port and that the service listens on it",
    "STREAM_CUT": "the source ends its answers early: check the service (a stream must end with a finish_reason)",
    "BAD_BODY": "the answer is not the protocol's JSON: check workload.service.protocol",
}


class PreflightCheck(NamedTuple):
    """One check: its name (``answers``, ``streams``, ``tokens``, ``comparator``), whether it
    held, and what was seen (phase 01 keeps them as :class:`runbook_lib.evidence.records.PreflightCheck`)."""

    name: str
    ok: bool
    detail: str


class ServicePreflightFailed(RunbookError):
    """The source does not answer as the params say it does; the message names the check, what
    was seen and the params field to change."""


def preflight(client: ServiceClient, service: Service, sample: Any) -> tuple[tuple[PreflightCheck, ...], dict[str, Any]]:
    """Send ``sample`` (the first sample input) and check the answer against ``service``.

    Returns:
        The checks (each ``name``, ``ok``, ``detail``) and the answer as the client returned it.

    Raises:
        ServicePreflightFailed: a check that stops the run failed (every check is in the message).
        ProtocolMismatch: 404 on the protocol's path.
    """
    got = client.check_protocol(sample)
    checks: list[PreflightCheck] = []
    status = str(got.get("status"))
    where = client.where()
    if status == "COMPLETED":
        checks.append(PreflightCheck(name="answers", ok=True, detail=f"{where} answered the first sample input"))
    else:
        fix = FIX_BY_KIND.get(status, "check the service")
        if status == "WRONG_CONTENT_TYPE" and service.stream:
            fix = ("the service does not stream this request: set workload.service.stream: false (TTFT, TPOT and ITL "
                   "then are not measured)")
        checks.append(PreflightCheck(name="answers", ok=False,
                                     detail=f"{status} at {got.get('stage')}: {got.get('error')}; {fix}"))
    if status == "COMPLETED":
        m = got.get("metrics") or {}
        if service.protocol == "openai-chat":
            checks.append(PreflightCheck(
                name="streams", ok=True,
                detail=(f"a server-sent event stream, {len((got.get('output') or {}).get('chunks') or [])} content "
                        "chunks, ended by a finish_reason") if service.stream else "one JSON answer (stream: false)"))
            source = m.get("tokens_from")
            checks.append(PreflightCheck(
                name="tokens", ok=True,
                detail={"usage": "output tokens from the server's usage.completion_tokens",
                        "tokenizer": f"the server sends no usage: output tokens counted by {client.tokenizer_path}",
                        "none": "the server sends no usage and workload.service.tokenizer is not set: TPOT, ITL and "
                                "goodput are recorded as not measurable (name a local tokenizer directory to measure "
                                "them)"}.get(str(source), str(source))))
        same = compare.compare(service, got.get("output"), got.get("output"))
        checks.append(PreflightCheck(
            name="comparator", ok=same.match,
            detail="the answer matches itself under the protocol's comparator" if same.match else
            f"the answer cannot match even itself: {same.detail}; fix workload.service.checks"))
    bad = [c for c in checks if not c.ok]
    if bad:
        raise ServicePreflightFailed(
            f"service preflight against the source at {client.url} failed: "
            + "; ".join(f"{c.name}: {c.detail}" for c in bad)
            + ". Nothing was measured; change what it names and run the migration again")
    return tuple(checks), got
