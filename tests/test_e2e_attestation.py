"""A signed demo run's attestation checked as a stranger would, without this package's code: the
DSSE signature verified by a verifier written here from the DSSE specification (PAE bytes, then
ed25519 with the ``cryptography`` package; securesystemslib, which the signing code uses, is not
used), and each statement's fields checked against the in-toto specifications they name.

Specifications (in-toto/attestation and secure-systems-lab/dsse, as read on 2026-12-05):
- DSSE v1 protocol.md: ``PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body``,
  ``LEN`` the byte length as ASCII decimal; the signature is over PAE, base64 in ``sig``.
- in-toto attestation spec/v1/bundle.md: JSON Lines, one envelope per line, ``.intoto.jsonl``.
- spec/v1/statement.md (Statement v1): ``_type``, ``subject`` (name, digest), ``predicateType``,
  ``predicate``.
- spec/predicates/test-result.md (Test Result v0.1.0): ``result`` one of PASSED, WARNED, FAILED;
  ``configuration`` a list of ResourceDescriptors (required); ``passedTests``, ``warnedTests``,
  ``failedTests`` lists of strings.
- spec/predicates/svr.md (Simple Verification Result v0.1): ``verifier.id`` (required),
  ``timeCreated`` (required), ``properties`` a list of strings (required).
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from runbook_lib.run.runner import RunResult

pytestmark = pytest.mark.e2e

STATEMENT_V1 = "https://in-toto.io/Statement/v1"
TEST_RESULT = "https://in-toto.io/attestation/test-result/v0.1"
SVR = "https://in-toto.io/attestation/svr/v0.1"


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding (protocol.md)."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def verified_statements(bundle: Path, public_pem: bytes) -> list[dict[str, Any]]:
    """Each line's statement, after checking its ed25519 signature over PAE with the public key."""
    key = load_pem_public_key(public_pem)
    assert isinstance(key, Ed25519PublicKey)
    out = []
    for line in bundle.read_text().splitlines():
        env = json.loads(line)
        body = base64.b64decode(env["payload"])
        assert env["payloadType"] == "application/vnd.in-toto+json"
        assert env["signatures"], "an unsigned line in a signed run's bundle"
        for sig in env["signatures"]:
            key.verify(base64.b64decode(sig["sig"]), pae(env["payloadType"], body))  # raises InvalidSignature
        out.append(json.loads(body))
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_signed_runs_statements_verify_with_a_dsse_verifier_of_our_own_and_fit_their_specs(
        inference_go_run: RunResult) -> None:
    run = inference_go_run.run_dir  # signed with keys/seal.key (conftest.py)
    public = (run.parent.parent / "keys" / "seal.key.pub").read_bytes()
    statements = verified_statements(run / "attestation.intoto.jsonl", public)
    manifest = json.loads((run / "manifest.json").read_text())
    tests = [s for s in statements if s["predicateType"] == TEST_RESULT]
    [svr] = [s for s in statements if s["predicateType"] == SVR]
    assert len(statements) == len(tests) + 1 and all(s["_type"] == STATEMENT_V1 for s in statements)
    records = sorted(manifest["outputs"]["records"])
    assert len(tests) == len(records) == 6  # one Test Result per phase
    for stmt, record in zip(tests, records, strict=True):
        p = stmt["predicate"]
        assert p["result"] in ("PASSED", "WARNED", "FAILED") and isinstance(p["configuration"], list)
        assert all(isinstance(x, str) for k in ("passedTests", "warnedTests", "failedTests") for x in p[k])
        for desc in p["configuration"]:  # ResourceDescriptors: a name and a digest of a file in the run
            assert desc["digest"]["sha256"] == _sha256(run / desc["name"])
        subjects = {x["name"]: x["digest"]["sha256"] for x in stmt["subject"]}
        assert subjects[record] == manifest["outputs"]["records"][record]  # the record as sealed
        body = json.loads((run / record).read_text())
        for rel, digest in body["files"].items():
            assert subjects[rel] == digest == manifest["seal"]["files"][rel]
        notebook = record.replace(".json", ".ipynb")
        assert subjects[notebook] == manifest["outputs"]["notebooks"][notebook]
        gates = body["data"].get("gates", [])
        named = p["passedTests"] + p["warnedTests"] + p["failedTests"]
        assert len(named) == len(gates) and all(any(n.startswith(g["name"] + " ") for n in named) for g in gates)
    assert all(s["predicate"]["result"] != "FAILED" for s in tests)  # a GO run
    v = svr["predicate"]
    assert v["verifier"]["id"].startswith("https://") and v["timeCreated"] == manifest["finished"]
    assert "RUNBOOK_DECISION_GO" in v["properties"] and all(isinstance(x, str) for x in v["properties"])
    subjects = {x["name"]: x["digest"]["sha256"] for x in svr["subject"]}
    assert subjects == {**manifest["seal"]["files"], "manifest.json": _sha256(run / "manifest.json")}
