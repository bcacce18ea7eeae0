"""Resolve credentials named by reference (``env:VAR`` or ``file:/path``) at run time.

Values are returned to the caller that injects them (a pod's environment at launch) and are
never logged, stored in params, records or exception text: errors name the reference only.
"""

from __future__ import annotations

import os
from pathlib import Path

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
