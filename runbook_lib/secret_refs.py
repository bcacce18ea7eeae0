"""Resolve credentials named by reference (``env:VAR`` or ``file:/path``) at run time, and
recognise a credential written where only a reference belongs.

Values are returned to the caller that injects them (a pod's environment at launch) and are
never logged, stored in params, records or exception text: errors name the reference only.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

from runbook_lib.errors import AuthError


def resolve(name: str, ref: str, *, required: bool = True) -> str | None:
    """Return the secret value that ``ref`` points to.

    Args:
        name: the secret's name as the workload sees it (``HF_TOKEN``).
        ref: ``env:VAR`` or ``file:/path`` (``~`` expanded).
        required: when False a missing secret returns None instead of raising.

    Raises:
        AuthError: the reference is malformed, or the secret is required and not set.
    """
    kind, _, where = ref.partition(":")
    value: str | None = None
    if kind == "env":
        value = os.environ.get(where) or None
    elif kind == "file":
        p = Path(where).expanduser()
        value = p.read_text().strip() if p.is_file() else None
    else:
        raise AuthError(f"secret {name}: reference {ref!r} must start with env: or file:")
    if value is None and required:
        raise AuthError(
            f"secret {name}: reference {ref} is not set on this machine. Export the variable or "
            "create the file, then run again (the value is never written to params)."
        )
    return value


def resolve_refs(refs: tuple[tuple[str, str], ...] | list[tuple[str, str]]) -> dict[str, str]:
    """``{NAME: value}`` for each ``(NAME, reference)`` that resolves here; unset optional ones are
    left out. For injecting into a pod at launch: the values are never stored or logged."""
    out: dict[str, str] = {}
    for name, ref in refs:
        value = resolve(name, ref, required=False)
        if value is not None:
            out[name] = value
    return out


CREDENTIAL_WORDS = frozenset({"KEY", "APIKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS"})


def names_present(env: dict[str, str] | None = None) -> list[str]:
    """Names (not values) of environment variables that look like credentials: one of the
    ``_``-separated words is a credential word (``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``), so
    ``TOKENIZERS_PARALLELISM`` is not one."""
    env = dict(os.environ if env is None else env)
    return sorted(k for k in env if CREDENTIAL_WORDS & set(k.upper().split("_")))


KEY_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("an AWS access key id", re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}")),
    ("a Runpod API key", re.compile(r"\brpa_[A-Za-z0-9]{20,}")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    ("a 64-hex-digit API key (Vast.ai style)", re.compile(r"\b[0-9a-f]{64}\b")),
)
"""Credential shapes refused anywhere in params (values must be references, never secrets)."""


def _entropy_bits_per_char(s: str) -> float:
    """Shannon entropy of ``s``'s characters, bits per character."""
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


def credential_findings(data: Any, path: str = "") -> list[tuple[str, str]]:
    """``(field, kind)`` for every string in ``data`` that looks like a credential: a known key
    shape, or a long (>= 32 characters) high-entropy token (> 4.5 bits per character) that is not
    a path or URL. Values are not returned."""
    out: list[tuple[str, str]] = []
    if isinstance(data, dict):
        for k, v in data.items():
            out += credential_findings(v, f"{path}.{k}" if path else str(k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += credential_findings(v, f"{path}.{i}")
    elif isinstance(data, str):
        for kind, rx in KEY_PATTERNS:
            if rx.search(data):
                out.append((path, kind))
                break
        else:
            for token in re.findall(r"[A-Za-z0-9+/=_\-]{32,}", data):
                if "/" not in token and _entropy_bits_per_char(token) > 4.5:
                    out.append((path, "a long high-entropy token"))
                    break
    return out
