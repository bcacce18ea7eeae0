"""Scan a run directory for credentials: every resolved secret value and known key shapes.

The runner scans after every phase. A hit fails the phase, and each file that holds one is
redacted in place before it is kept (the value is replaced by ``[REDACTED:<name>]``); findings
name the file and the secret's *name*, never its value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runbook_lib import secret_refs
from runbook_lib.errors import AuthError
from runbook_lib.params import Migration
from runbook_lib.providers import REMOTE, provider_module
from runbook_lib.secret_refs import KEY_PATTERNS

MIN_SCANNABLE_CHARS = 8  # shorter values would match ordinary text; they are reported, not scanned


@dataclass(frozen=True)
class Finding:
    """A credential found in ``path`` (relative to the run directory): ``what`` is the secret's
    name or the key shape, ``count`` the number of occurrences."""

    path: str
    what: str
    count: int


def resolved_secrets(mig: Migration) -> tuple[dict[str, str], list[str]]:
    """Values of every credential reference in params that resolves here, by name, and the names
    of those too short to scan reliably."""
    refs: list[tuple[str, str]] = [(s.name, s.ref) for side in (mig.source, mig.target) for s in side.secrets]
    bucket = mig.workload.checkpoint_store  # an s3:// checkpoint's own bucket keys
    for name, ref in (("storage.access_key_id", mig.storage.access_key_id_ref),
                      ("storage.secret_access_key", mig.storage.secret_access_key_ref),
                      ("workload.checkpoint_store.access_key_id", bucket.access_key_id_ref if bucket else ""),
                      ("workload.checkpoint_store.secret_access_key", bucket.secret_access_key_ref if bucket else ""),
                      ("evidence.signing_key", mig.evidence.signing_key),
                      ("source.auth_ref", getattr(mig.source, "auth_ref", ""))):  # a live source's token
        if ref:
            refs.append((name, ref))
    values: dict[str, str] = {}
    short: list[str] = []
    for side in (mig.source, mig.target):  # provider API keys, from their reference or standard places
        key = provider_key(side)
        if key:
            values[f"{side.provider} API key"] = key
    for name, ref in refs:
        value = secret_refs.resolve(name, ref, required=False)
        if value is None:
            continue
        if len(value) < MIN_SCANNABLE_CHARS:
            short.append(name)
        else:
            values[name] = value
        body = "".join(line for line in value.splitlines() if line and not line.startswith("-----"))
        if value.lstrip().startswith("-----BEGIN") and len(body) >= MIN_SCANNABLE_CHARS:
            values[f"{name} (PEM body)"] = body  # a PEM key leaked without its armour lines is still found
    return values, sorted(set(short))


def provider_key(profile: Any) -> str | None:
    """The API key a remote profile would use, if one resolves here (None for local)."""
    if profile.provider not in REMOTE:
        return None
    try:
        return provider_module(profile.provider).default_key(profile.api_key_ref).resolve()
    except AuthError:
        return None


def scan_file(path: Path, values: dict[str, str], root: Path) -> list[Finding]:
    """Findings in one file (read as bytes; key shapes matched on its latin-1 text)."""
    data = path.read_bytes()
    rel = str(path.relative_to(root))
    out = [Finding(rel, name, data.count(v.encode())) for name, v in values.items() if v.encode() in data]
    text = data.decode("latin-1")
    for kind, rx in KEY_PATTERNS:
        if kind.startswith("a 64-hex"):  # sha256 digests are everywhere in evidence: not a key shape here
            continue
        n = len(rx.findall(text))
        if n:
            out.append(Finding(rel, kind, n))
    return out


def redact_file(path: Path, values: dict[str, str]) -> None:
    """Replace every secret value and key-shaped string in ``path`` in place."""
    data = path.read_bytes()
    for name, v in values.items():
        data = data.replace(v.encode(), f"[REDACTED:{name}]".encode())
    text = data.decode("latin-1")
    for kind, rx in KEY_PATTERNS:
        if not kind.startswith("a 64-hex"):
            text = rx.sub("[REDACTED]", text)
    path.write_bytes(text.encode("latin-1"))


def scan_run(run_dir: Path, mig: Migration, *, redact: bool = True) -> dict[str, Any]:
    """Scan every file under ``run_dir``; redact the files with findings when ``redact``.

    Returns:
        ``{"findings": [Finding...], "scanned_files": n, "secret_names": [...],
        "too_short_to_scan": [...]}`` (names only).
    """
    values, short = resolved_secrets(mig)
    findings: list[Finding] = []
    files = [p for p in sorted(run_dir.rglob("*")) if p.is_file()]
    for p in files:
        hits = scan_file(p, values, run_dir)
        if hits:
            findings += hits
            if redact:
                redact_file(p, values)
    return {"findings": findings, "scanned_files": len(files), "secret_names": sorted(values),
            "too_short_to_scan": short}
