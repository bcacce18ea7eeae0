"""A sealed run as in-toto attestations with vetted predicates, one bundle per run.

``attestation.intoto.jsonl`` in the run directory is an in-toto attestation bundle (in-toto
attestation spec v1, ``spec/v1/bundle.md``: JSON Lines, one DSSE envelope per line, the suffix
``.intoto.jsonl``). Each line's payload is an in-toto Statement v1 (``spec/v1/statement.md``):

- one per phase that has a record, with the **Test Result** predicate
  (``https://in-toto.io/attestation/test-result/v0.1``, ``spec/predicates/test-result.md``,
  version 0.1.0): ``result`` PASSED, WARNED or FAILED; each gate of the phase a passed, warned or
  failed test (:func:`test_name`, :func:`gate_outcome`); ``configuration`` the params file the
  gates were configured by (a ResourceDescriptor, ``spec/v1/resource_descriptor.md``, with its
  ``gates`` section as an annotation) and the notebook that ran the phase; the subjects are the
  phase's files (its record, every file the record lists, its executed notebook) with their
  sha256;
- one for the decision, with the **Simple Verification Result** predicate
  (``https://in-toto.io/attestation/svr/v0.1``, ``spec/predicates/svr.md``, version 0.1): the
  verifier is this package at its version, with the params file as its ``policy`` (the
  extension field the SVR spec's policy example uses), ``timeCreated`` the seal's time, and the
  properties verified: the decision, the closed-world seal, ``RUNBOOK_PROVENANCE_COMPLETE`` when
  every phase ran through the runner (:mod:`runbook_lib.evidence.completeness`: a policy should
  require it), each phase completed and each blocking gate passed; its subjects are every file of the closed-world seal and ``manifest.json``, so it
  binds the whole run.

With ``evidence.signing_key`` every envelope is signed (ed25519, by securesystemslib's DSSE
``Envelope``, :func:`runbook_lib.evidence.signing.signed_envelope`); without one, the statements are
written with an empty ``signatures`` list, and ``runbook verify`` says the run is not signed. A
verifier that knows these predicates (a Rego policy, witness, cosign) checks the bundle without
this package; :func:`bundle_problems` is this package's own check.

Runs sealed before the bundle carry ``attestation.dsse.json``, one statement with the package's
own predicate (:func:`runbook_lib.evidence.signing.statement`); they still verify as they were.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import yaml

from runbook_lib import __version__
from runbook_lib._fs import atomic_write
from runbook_lib.errors import EvidenceError
from runbook_lib.evidence.closedworld import ATTESTATION, BUNDLE, seal_of
from runbook_lib.evidence.completeness import missing_provenance
from runbook_lib.evidence.manifest import PHASES, sha256_file
from runbook_lib.evidence.signing import (
    PAYLOAD_TYPE,
    STATEMENT_TYPE,
    signature_problems,
    signed_envelope,
    unsigned_envelope,
)
from runbook_lib.layout import KEPT_PARAMS, MANIFEST

TEST_RESULT = "https://in-toto.io/attestation/test-result/v0.1"
"""Test Result predicate type (in-toto attestation spec/predicates/test-result.md, version 0.1.0)."""
SVR = "https://in-toto.io/attestation/svr/v0.1"
"""Simple Verification Result predicate type (in-toto attestation spec/predicates/svr.md, version 0.1)."""
VERIFIER_ID = f"https://github.com/gpu-migration-runbook/runbook_lib/v{__version__}"
"""The SVR's ``verifier.id``: this package, versioned as the SVR spec recommends."""


def gate_outcome(gate: dict[str, Any]) -> str:
    """How a recorded gate counts in a Test Result: ``failed`` for a blocking gate that did not
    pass (FAIL, ERROR, INCONCLUSIVE: each stops a GO), ``passed`` for PASS, ``warned`` for the rest
    (a scored gate that did not pass, a NOT_APPLICABLE one)."""
    verdict = str(gate.get("verdict"))
    if verdict == "PASS":
        return "passed"
    if gate.get("blocking") and verdict in ("FAIL", "ERROR", "INCONCLUSIVE"):
        return "failed"
    return "warned"


def test_name(gate: dict[str, Any]) -> str:
    """A gate as a Test Result test name: ``<name> <VERDICT>`` and ``(blocking)`` or ``(scored)``,
    so a policy reads the verdict without this package (``latency_p95_ratio PASS (blocking)``)."""
    return f"{gate.get('name')} {gate.get('verdict')} ({'blocking' if gate.get('blocking') else 'scored'})"


def _descriptor(run_dir: Path, rel: str, **extra: Any) -> dict[str, Any]:
    """A ResourceDescriptor (in-toto spec/v1/resource_descriptor.md) of a file in the run."""
    return {"name": rel, "digest": {"sha256": sha256_file(run_dir / rel)}, **extra}


def _params_descriptor(run_dir: Path) -> list[dict[str, Any]]:
    """The params file the run kept, with its ``gates`` section as an annotation; none if absent."""
    if not (run_dir / KEPT_PARAMS).is_file():
        return []
    try:
        gates = (yaml.safe_load((run_dir / KEPT_PARAMS).read_text()) or {}).get("gates") or {}
    except (yaml.YAMLError, AttributeError):
        gates = {}
    return [_descriptor(run_dir, KEPT_PARAMS, mediaType="application/yaml", annotations={"gates": gates})]


def phase_statement(run_dir: Path, pid: str, name: str) -> dict[str, Any] | None:
    """Phase ``pid``'s Test Result statement, or None when the phase has no record. A record that
    is not a JSON object (cut off by a full disk) is attested as it is: FAILED, its bytes the
    subject, so a seal never fails for it."""
    record = run_dir / f"{pid}_{name}.json"
    if not record.is_file():
        return None
    try:
        body = json.loads(record.read_text())
        if not isinstance(body, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError):
        body = {"status": "unreadable", "files": {}, "data": {}}
    gates = [g for g in (body.get("data") or {}).get("gates") or [] if isinstance(g, dict)]
    tests: dict[str, list[str]] = {"passed": [], "warned": [], "failed": []}
    for gate in gates:
        tests[gate_outcome(gate)].append(test_name(gate))
    completed = body.get("status") == "completed"
    result = "FAILED" if tests["failed"] or not completed else "WARNED" if tests["warned"] else "PASSED"
    if not completed:
        tests["failed"].append(f"phase {pid} {body.get('status')}")
    files = {record.name: sha256_file(record)}
    files.update({str(k): str(v) for k, v in (body.get("files") or {}).items()})
    notebook = f"{pid}_{name}.ipynb"
    config = _params_descriptor(run_dir)
    if (run_dir / notebook).is_file():
        files[notebook] = sha256_file(run_dir / notebook)
        config.append(_descriptor(run_dir, notebook, mediaType="application/x-ipynb+json"))
    return {"_type": STATEMENT_TYPE,
            "subject": [{"name": n, "digest": {"sha256": d}} for n, d in sorted(files.items())],
            "predicateType": TEST_RESULT,
            "predicate": {"result": result, "configuration": config, "passedTests": tests["passed"],
                          "warnedTests": tests["warned"], "failedTests": tests["failed"]}}


def decision_statement(run_dir: Path, phases: list[tuple[str, dict[str, Any]]] | None = None) -> dict[str, Any]:
    """The decision's Simple Verification Result statement over every file of the closed-world
    seal and ``manifest.json`` as they are now; ``phases`` are ``(phase id, Test Result
    statement)`` pairs (:func:`phase_statement`, built here when not given), whose passed blocking
    gates it names.

    Raises:
        EvidenceError: the run has no closed-world seal.
    """
    seal = seal_of(run_dir)
    if seal is None:
        raise EvidenceError(f"{run_dir} has no closed-world seal (manifest.json with a seal section): nothing to attest")
    manifest = json.loads((run_dir / MANIFEST).read_text())
    subjects = {**{str(k): str(v) for k, v in seal["files"].items()}, MANIFEST: sha256_file(run_dir / MANIFEST)}
    decision = str(manifest.get("decision") or "?")
    properties = [f"RUNBOOK_DECISION_{_token(decision)}", "RUNBOOK_SEAL_CLOSED_WORLD"]
    if not missing_provenance(run_dir):  # every phase ran through the runner: notebook, provenance, scan, lock
        properties.append("RUNBOOK_PROVENANCE_COMPLETE")
    properties += [f"RUNBOOK_PHASE_{p.get('phase')}_COMPLETED" for p in manifest.get("phases") or []
                   if isinstance(p, dict) and p.get("status") == "completed"]
    for pid, stmt in _phase_statements(run_dir) if phases is None else phases:
        properties += [f"RUNBOOK_GATE_{pid}_{_token(t.split(' ')[0])}_PASSED"
                       for t in stmt["predicate"]["passedTests"] if t.endswith("(blocking)")]
    verifier: dict[str, Any] = {"id": VERIFIER_ID}
    policy = _params_descriptor(run_dir)
    if policy:
        verifier["policy"] = {"uri": KEPT_PARAMS, "digest": policy[0]["digest"]}
    return {"_type": STATEMENT_TYPE,
            "subject": [{"name": n, "digest": {"sha256": d}} for n, d in sorted(subjects.items())],
            "predicateType": SVR,
            "predicate": {"verifier": verifier, "timeCreated": manifest.get("finished") or "",
                          "properties": properties}}


def _token(text: str) -> str:
    """``NO-GO`` -> ``NO_GO``; ``FAILED (decision GO)`` -> ``FAILED_DECISION_GO``: a property word."""
    return "_".join("".join(c if c.isalnum() else " " for c in text.upper()).split())


def statements(run_dir: Path) -> list[dict[str, Any]]:
    """Every statement of the run's bundle: each phase's Test Result, in phase order, then the
    decision's SVR.

    Raises:
        EvidenceError: the run has no closed-world seal.
    """
    phases = _phase_statements(run_dir)
    return [stmt for _, stmt in phases] + [decision_statement(run_dir, phases)]


def _phase_statements(run_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """``(phase id, Test Result statement)`` in phase order (a phase without a record has none)."""
    return [(pid, s) for pid, name in PHASES if (s := phase_statement(run_dir, pid, name)) is not None]


def write_bundle(run_dir: Path, signer: Any | None) -> Path:
    """Write ``attestation.intoto.jsonl``: :func:`statements`, one DSSE envelope a line, each signed
    by ``signer`` (a securesystemslib ``Signer``) or, with None, unsigned. Returns its path.

    Raises:
        EvidenceError: the run has no closed-world seal.
    """
    lines = [json.dumps(signed_envelope(s, signer) if signer is not None else unsigned_envelope(s), sort_keys=True)
             for s in statements(run_dir)]
    path = run_dir / BUNDLE
    atomic_write(path, [("\n".join(lines) + "\n").encode()])
    return path


def payload_of(envelope: dict[str, Any]) -> dict[str, Any] | None:
    """The statement an envelope carries, or None when its payload is not a JSON object."""
    try:
        body = json.loads(base64.b64decode(str(envelope.get("payload", ""))))
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def bundle_problems(run_dir: Path, key: Any | None) -> list[str]:
    """Why the run's bundle does not attest the run as it is now; empty when it does.

    The bundle must be exactly what the seal writes: one line per statement of :func:`statements`,
    in their order (each phase's Test Result in phase order, then the decision's SVR), each line a
    DSSE envelope (``payload``, ``payloadType``, ``signatures`` and nothing else) whose statement
    equals the one rebuilt from the run, field for field. A line that is not such an envelope, a
    second statement of a phase or of the decision (a statement replayed from another run), one
    out of order, or any field added or changed is named. The bundle spec lets a general consumer
    skip lines it does not recognise; this check is the producer's, so it skips nothing. Signed
    lines and unsigned lines never mix. With ``key`` (a securesystemslib ``Key``) every line must
    carry a signature by it over DSSE's pre-authentication encoding, so an unsigned bundle, or one
    signed by another key, fails (no downgrade)."""
    if not (run_dir / BUNDLE).is_file():
        return [f"{BUNDLE} is missing: the seal writes it (signed with evidence.signing_key, else unsigned)"]
    try:
        lines = (run_dir / BUNDLE).read_text().splitlines()
        want = statements(run_dir)
    except (OSError, UnicodeDecodeError, EvidenceError) as exc:
        return [f"{BUNDLE} cannot be read ({exc})"]
    problems: list[str] = []
    have: list[tuple[int, dict[str, Any]]] = []
    signed_lines = 0
    for i, line in enumerate(lines, 1):
        try:
            env = json.loads(line)
        except ValueError:
            env = None
        body = payload_of(env) if isinstance(env, dict) else None
        if (not isinstance(env, dict) or set(env) != {"payload", "payloadType", "signatures"}
                or env.get("payloadType") != PAYLOAD_TYPE or body is None or body.get("_type") != STATEMENT_TYPE
                or not isinstance(env.get("signatures"), list)):
            problems.append(f"{BUNDLE} line {i}: not a DSSE envelope of an in-toto Statement v1 as the seal writes it")
            continue
        have.append((i, body))
        signed_lines += bool(env["signatures"])
        if key is not None:
            problems += _key_problems(env, key, i)
    if 0 < signed_lines < len(have):
        problems.append(f"{BUNDLE}: {signed_lines} of {len(have)} statements are signed: a signed seal signs every one")
    problems += _order_problems(have, want)
    return problems


def _key_problems(env: dict[str, Any], key: Any, line: int) -> list[str]:
    """Why envelope ``env`` (bundle line ``line``) is not signed by ``key``; empty when it is."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError

    if not env.get("signatures"):
        return [f"{BUNDLE} line {line}: not signed, and --key asks for a signed run (an unsigned run never passes a "
                "key check)"]
    try:
        Envelope.from_dict(env).verify([key], 1)
    except (VerificationError, ValueError, KeyError, TypeError, AttributeError):
        return [f"{BUNDLE} line {line}: no signature verifies with key {key.keyid}; the seal was made or remade "
                "without that key"]
    return []


def _order_problems(have: list[tuple[int, dict[str, Any]]], want: list[dict[str, Any]]) -> list[str]:
    """How the bundle's statements (``(line, statement)``) differ from ``want`` in number, order
    and content: each wanted statement must be there once, at its place, equal field for field."""
    problems: list[str] = []
    seen: dict[str, int] = {}
    for line, stmt in have:
        k = _key(stmt)
        if k in seen:
            problems.append(f"{BUNDLE} line {line}: a second statement of {k} (the first is on line {seen[k]}): a "
                            "statement added or replayed from another run")
        else:
            seen[k] = line
    order = [_key(s) for s in want]
    first = {_key(stmt): stmt for _, stmt in reversed(have)}  # the first of each, for the comparison
    for stmt in want:
        got = first.get(_key(stmt))
        problems += ([f"{BUNDLE}: no statement of {_key(stmt)}"] if got is None else _differences(_key(stmt), got, stmt))
    problems += [f"{BUNDLE}: a statement of {k}, which the run does not hold" for k in seen if k not in order]
    placed = [k for k in dict.fromkeys(_key(stmt) for _, stmt in have) if k in order]
    if placed != [k for k in order if k in placed]:
        problems.append(f"{BUNDLE}: the statements are out of order ({', '.join(placed)}); the seal writes each phase's "
                        "in phase order, then the decision's")
    return problems


def _key(stmt: dict[str, Any]) -> str:
    """What a statement attests, for matching and messages: ``the decision`` (the SVR) or ``phase
    NN's test result`` (named by the record among its subjects)."""
    if stmt.get("predicateType") == SVR:
        return "the decision"
    records = [str(x.get("name")) for x in stmt.get("subject") or [] if isinstance(x, dict)
               and str(x.get("name", "")).endswith(".json") and str(x.get("name", ""))[:2].isdigit()]
    return f"phase {records[0][:2]}'s test result" if records else f"{stmt.get('predicateType')}"


def _differences(what: str, have: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """How a statement in the bundle differs from the one rebuilt from the run: each subject whose
    sha256 differs, is missing or is extra, then the predicate."""
    def subjects(s: dict[str, Any]) -> dict[str, str]:
        return {str(x.get("name")): str((x.get("digest") or {}).get("sha256")) for x in s.get("subject") or []
                if isinstance(x, dict)}

    h, w = subjects(have), subjects(want)
    out = [f"{name}: not what the signed statement names ({what})" for name in sorted(h.keys() & w.keys())
           if h[name] != w[name]]
    out += [f"{name}: in the run, not in the statement of {what}" for name in sorted(w.keys() - h.keys())]
    out += [f"{name}: in the statement of {what}, not in the run's seal" for name in sorted(h.keys() - w.keys())]
    if have.get("predicateType") != want.get("predicateType") or have.get("predicate") != want.get("predicate"):
        out.append(f"{BUNDLE}: the predicate of {what} is not what the run's records say now")
    elif not out and have != want:
        out.append(f"{BUNDLE}: the statement of {what} has fields the seal did not write")
    return out


def attestation_problems(run_dir: Path, key: Any | None) -> tuple[str, list[str]]:
    """The run's attestation file and why it does not attest the run as it is now (signed by
    ``key`` when one is given); an empty list when it does. A bundle is checked by
    :func:`bundle_problems`; an older run's ``attestation.dsse.json`` by
    :func:`runbook_lib.evidence.signing.signature_problems` (with a key) as it always was; a run with
    neither is named as unsigned."""
    if (run_dir / BUNDLE).is_file() or not (run_dir / ATTESTATION).is_file():
        return BUNDLE, bundle_problems(run_dir, key)
    if key is None:
        return ATTESTATION, []  # an older run's statement is checked with the key it was signed by
    return ATTESTATION, signature_problems(run_dir, key)
