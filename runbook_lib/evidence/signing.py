"""Keys and DSSE envelopes: ed25519 key pairs, in-toto Statements signed in DSSE envelopes, and
the signatures people put on their own records.

- the envelope is DSSE v1 (https://github.com/secure-systems-lab/dsse/blob/master/envelope.md),
  payload type ``application/vnd.in-toto+json``, built, signed and verified by securesystemslib's
  ``dsse.Envelope`` and ``CryptoSigner`` (pyca/cryptography's Ed25519 underneath): no signing code
  of ours;
- a run's seal is attested by :mod:`runbook_lib.evidence.attestation` (a bundle of Test Result and
  Simple Verification Result statements). Runs sealed before it hold ``attestation.dsse.json``:
  one in-toto Statement v1 (https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md)
  with one subject per file of the closed-world seal (:mod:`runbook_lib.evidence.closedworld`) and
  one for ``manifest.json``, and this package's own predicate (:data:`PREDICATE_TYPE`);
  :func:`statement` and :func:`signature_problems` still check those;
- a person's record (a resolution, an approval file) is signed into ``<stem>.dsse.json``
  (:func:`sign_record`).

``runbook keygen`` writes a key pair; params name the private key by reference
(``evidence.signing_key``); ``runbook verify --key PUBKEY`` checks the signature offline, and
with ``--key`` an unsigned run, or one signed by another key, fails (no downgrade).
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

from runbook_lib.errors import AuthError, EvidenceError, UsageError
from runbook_lib.evidence.closedworld import ATTESTATION, BUNDLE, seal_of
from runbook_lib.evidence.manifest import sha256_file, write_json_atomic
from runbook_lib.layout import MANIFEST, RECEIPT
from runbook_lib.secret_refs import resolve

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
"""DSSE payload type of an in-toto Statement (in-toto attestation spec, envelope.md)."""
PREDICATE_TYPE = "https://github.com/gpu-migration-runbook/predicates/migration-decision/v1"
"""What the predicate is: the migration's decision, its gates' verdicts and its phases' statuses."""


def _signer_module() -> Any:
    """``securesystemslib.signer``, typed as Any: it re-exports ``CryptoSigner`` and ``SSlibKey``
    without declaring them, which mypy's no-implicit-reexport refuses, and the defining modules
    are private."""
    from securesystemslib import signer

    return signer


def generate_key(path: Path) -> tuple[Path, Path]:
    """Write a new ed25519 key pair: the private key at ``path`` (PKCS#8 PEM, mode 0600, never
    over an existing file or through a symlink) and the public key at ``<path>.pub`` (PEM).

    Returns:
        ``(private, public)`` paths.

    Raises:
        UsageError: either file exists already (nothing is written).
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pub = path.with_name(path.name + ".pub")
    taken = [str(p) for p in (path, pub) if p.exists() or p.is_symlink()]
    if taken:
        raise UsageError(f"runbook keygen: {', '.join(taken)} already exists; nothing was written. Choose another "
                         "path (a key is never overwritten)")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # ~/.runbook/ on a fresh home
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    fd = os.open(pub, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(public)
    return path, pub


def load_signer(ref: str, *, what: str = "evidence.signing_key") -> Any:
    """The securesystemslib ``CryptoSigner`` for the ed25519 private key that ``ref`` names
    (``env:VAR`` holding the PEM text, or ``file:/path``); ``what`` names where the reference was
    given (a params field, or ``--key``), for messages.

    Raises:
        AuthError: the reference is not set here, or is not an ed25519 PKCS#8 PEM private key
            (the message names the reference, never the value).
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pem = resolve(what, ref)
    assert pem is not None  # required: resolve raises instead
    try:
        key = serialization.load_pem_private_key(pem.encode(), password=None)
    except (ValueError, TypeError):
        key = None
    if not isinstance(key, Ed25519PrivateKey):
        raise AuthError(f"{what} {ref} is not an unencrypted ed25519 private key in PKCS#8 PEM; "
                        "`runbook keygen PATH` writes one")
    return _signer_module().CryptoSigner(key)


def load_public_key(path: Path) -> Any:
    """The securesystemslib ``SSlibKey`` of the ed25519 public key in PEM at ``path``.

    Raises:
        UsageError: the file cannot be read or is not an ed25519 public key in PEM.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = serialization.load_pem_public_key(Path(path).read_bytes())
    except (OSError, ValueError, TypeError) as exc:
        raise UsageError(f"--key {path}: not a readable PEM public key ({type(exc).__name__}); pass the .pub file "
                         "`runbook keygen` wrote") from None
    if not isinstance(key, Ed25519PublicKey):
        raise UsageError(f"--key {path}: not an ed25519 public key; pass the .pub file `runbook keygen` wrote")
    return _signer_module().SSlibKey.from_crypto(key)


def statement(run_dir: Path) -> dict[str, Any]:
    """The in-toto Statement v1 of a closed-world sealed run: one subject per file the seal lists
    and one for ``manifest.json`` as it is now (``{"name", "digest": {"sha256"}}``, sorted by
    name). The links written after the seal (a resolution, a cleanup) are not subjects: each names
    the sha256 of the manifest or of the link before it, so they hang from what is signed, and the
    files' bytes now are the closed world's check (:func:`runbook_lib.evidence.closedworld.closed_world_rows`).
    The predicate: run id, migration, decision, each gate's phase, name, verdict
    and blocking flag (from ``receipt.json`` where there is one), and each phase's status.

    Raises:
        EvidenceError: the run has no closed-world seal (nothing to attest).
    """
    seal = seal_of(run_dir)
    if seal is None:
        raise EvidenceError(f"{run_dir} has no closed-world seal (manifest.json with a seal section): nothing to sign")
    manifest = json.loads((run_dir / MANIFEST).read_text())
    subjects = {**{str(k): str(v) for k, v in seal["files"].items()}, MANIFEST: sha256_file(run_dir / MANIFEST)}
    gates: list[dict[str, Any]] = []
    receipt_path = run_dir / RECEIPT
    if receipt_path.is_file():
        receipt = json.loads(receipt_path.read_text())
        gates = [{"phase": g.get("phase", ""), "name": g.get("name"), "verdict": g.get("verdict"),
                  "blocking": bool(g.get("blocking"))} for g in receipt.get("gates", [])]
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": digest}} for name, digest in sorted(subjects.items())],
        "predicateType": PREDICATE_TYPE,
        "predicate": {"runId": manifest.get("run_id"), "migration": manifest.get("migration"),
                      "decision": manifest.get("decision"), "gates": gates,
                      "phases": [{"phase": p.get("phase"), "status": p.get("status")}
                                 for p in manifest.get("phases") or []]},
    }


def unsigned_envelope(body: dict[str, Any]) -> dict[str, Any]:
    """An in-toto Statement ``body`` in a DSSE envelope with no signature yet, as a dict: the
    payload is the statement's canonical JSON (sorted keys, no spaces), base64."""
    payload = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return {"payload": base64.b64encode(payload).decode(), "payloadType": PAYLOAD_TYPE, "signatures": []}


def signed_envelope(body: dict[str, Any], signer: Any) -> dict[str, Any]:
    """:func:`unsigned_envelope`, signed by ``signer`` (securesystemslib's ``Envelope``: the
    signature is over DSSE's pre-authentication encoding), as a dict."""
    from securesystemslib.dsse import Envelope

    envelope = Envelope.from_dict(unsigned_envelope(body))
    envelope.sign(signer)
    return dict(envelope.to_dict())


def signed_by(run_dir: Path) -> list[str]:
    """The key ids the run's attestations name (unchecked): every envelope of its bundle
    (``attestation.intoto.jsonl``, one per line), or an older run's ``attestation.dsse.json`` (one
    envelope); empty when none is signed or none is readable."""
    ids: set[str] = set()
    for name in (BUNDLE, ATTESTATION):
        try:
            text = (run_dir / name).read_text()
        except (OSError, UnicodeDecodeError):
            continue
        for chunk in text.splitlines() if name == BUNDLE else [text]:
            try:
                ids.update(envelope_keyids(json.loads(chunk)))
            except (ValueError, AttributeError):
                continue
    return sorted(ids)


def signature_problems(run_dir: Path, key: Any) -> list[str]:
    """Why the run's seal is not signed by ``key`` (a securesystemslib ``Key``) over its files as
    they are now; empty when it is. Checked offline: the envelope's signature over DSSE's
    pre-authentication encoding (securesystemslib ``Envelope.verify``), its payload type, the
    statement's type, and that its subjects are exactly the seal's files and ``manifest.json``
    with its sha256 now (the manifest lists every sealed file's sha256)."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError

    path = run_dir / ATTESTATION
    if not path.is_file():
        return [f"not signed: {ATTESTATION} is missing, and --key asks for a signed run (an unsigned run never "
                "passes a key check)"]
    try:
        envelope = Envelope.from_dict(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return [f"{ATTESTATION} is not a DSSE envelope ({type(exc).__name__})"]
    try:
        envelope.verify([key], 1)
    except VerificationError:
        named = ", ".join(signed_by(run_dir)) or "none"
        return [f"{ATTESTATION}: no signature verifies with key {key.keyid} (signed by: {named}); the seal was made "
                "or remade without that key"]
    if envelope.payload_type != PAYLOAD_TYPE:
        return [f"{ATTESTATION}: payload type {envelope.payload_type!r}, not {PAYLOAD_TYPE!r}"]
    try:
        signed = json.loads(envelope.payload)
        now = statement(run_dir)
    except (ValueError, EvidenceError) as exc:
        return [f"{ATTESTATION}: its statement cannot be read or rebuilt ({exc})"]
    if signed.get("_type") != STATEMENT_TYPE:
        return [f"{ATTESTATION}: statement type {signed.get('_type')!r}, not {STATEMENT_TYPE}"]
    have = {s["name"]: s["digest"]["sha256"] for s in signed.get("subject", [])}
    want = {s["name"]: s["digest"]["sha256"] for s in now["subject"]}
    problems = [f"{name}: not what the signed statement names" for name in sorted(have.keys() & want.keys())
                if have[name] != want[name]]
    problems += [f"{name}: in the run, not in the signed statement" for name in sorted(want.keys() - have.keys())]
    problems += [f"{name}: in the signed statement, not in the run's seal" for name in sorted(have.keys() - want.keys())]
    return problems


RECORD_PREDICATES = {
    "resolution": "https://github.com/gpu-migration-runbook/predicates/hold-resolution/v1",
    "approval": "https://github.com/gpu-migration-runbook/predicates/plan-approval/v1",
}
"""What a person's signed record says: a HOLD resolved (``resolution.json``), or plans approved
(an approval file). The predicate is the record's own JSON body."""


def record_envelope(record: Path) -> Path:
    """Where a person's signature of ``record`` lies: beside it, ``<stem>.dsse.json``."""
    return record.with_name(f"{record.stem}.dsse.json")


def sign_record(record: Path, signer: Any, *, kind: str) -> Path:
    """Sign a person's record (``kind``: a key of :data:`RECORD_PREDICATES`) with their key: an
    in-toto Statement v1 whose one subject is the record (its file name and sha256) and whose
    predicate is its body, in a DSSE envelope written to :func:`record_envelope`. Returns that path."""
    body = {"_type": STATEMENT_TYPE,
            "subject": [{"name": record.name, "digest": {"sha256": sha256_file(record)}}],
            "predicateType": RECORD_PREDICATES[kind], "predicate": json.loads(record.read_text())}
    out = record_envelope(record)
    write_json_atomic(out, signed_envelope(body, signer))
    return out


def envelope_keyids(envelope: dict[str, Any]) -> list[str]:
    """The key ids a DSSE envelope (as a dict) names (unchecked)."""
    return sorted({str(s.get("keyid")) for s in envelope.get("signatures") or [] if isinstance(s, dict)})


def record_signature_problems(record_name: str, record_sha256: str, envelope: dict[str, Any] | None,
                              keys: list[Any]) -> list[str]:
    """Why a person's record (``record_name`` with ``record_sha256`` now) is not signed by one of
    ``keys`` (securesystemslib ``Key`` objects) through ``envelope`` (the DSSE envelope as a dict;
    None: unsigned); empty when it is. Checked offline: the signature over DSSE's
    pre-authentication encoding, the payload type, the statement type, and that its one subject
    has the record's sha256 now (a copy kept in the run may carry another name). An unsigned
    record never passes (no downgrade)."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError

    if envelope is None:
        return [f"{record_name}: not signed, and a person's key was given to check it (an unsigned record never "
                "passes a key check)"]
    try:
        env = Envelope.from_dict(envelope)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return [f"{record_name}: its signature is not a DSSE envelope ({type(exc).__name__})"]
    ok = False
    for key in keys:
        try:
            env.verify([key], 1)
            ok = True
            break
        except VerificationError:
            continue
    if not ok:
        return [f"{record_name}: signed by {', '.join(envelope_keyids(envelope)) or 'nobody'}, and no signature verifies "
                f"with the key(s) given ({', '.join(k.keyid for k in keys)})"]
    try:
        stmt = json.loads(env.payload)
        subjects = [(s["name"], s["digest"]["sha256"]) for s in stmt.get("subject", [])]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return [f"{record_name}: its signed statement cannot be read ({type(exc).__name__})"]
    if env.payload_type != PAYLOAD_TYPE or stmt.get("_type") != STATEMENT_TYPE:
        return [f"{record_name}: its signature is not over an in-toto Statement v1"]
    if [digest for _, digest in subjects] != [record_sha256]:
        return [f"{record_name}: the signature is over {subjects}, not over the record as it is now"]
    return []
