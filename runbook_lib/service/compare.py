"""How a service's answer is compared with its golden answer, by protocol.

``openai-chat``: the text must be equal (temperature 0, fixed seed); a differing answer is
located by its first differing streamed chunk (the service's own token boundaries as it streams
them) and character. ``http-json``: each declared check (``workload.service.checks``) compares
one JSON path, exactly or within a tolerance; with no checks the whole answer must be equal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from runbook_lib.params import JsonCheck, Service

MISSING = object()
"""What :func:`at_path` returns for a path the value does not have."""


@dataclass(frozen=True)
class Comparison:
    """One answer against its golden answer: ``match``, and where it first differs (chat: the
    chunk and character index; http-json: the first failing check's path) with a short reason."""

    match: bool
    detail: str = ""
    first_diff_token: int | None = None
    first_diff_char: int | None = None


def first_difference(a: list[str], b: list[str]) -> int | None:
    """Index of the first position where chunk lists ``a`` and ``b`` differ (the shorter one's
    length when one is a prefix of the other); None when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_chat(golden: dict[str, Any], seen: dict[str, Any]) -> Comparison:
    """Chat answers ``{"text", "chunks"}``: equal texts match; otherwise the first differing
    chunk and character are named."""
    gt, st = str(golden.get("text", "")), str(seen.get("text", ""))
    if gt == st:
        return Comparison(True)
    char = first_difference(list(gt), list(st))
    tok = first_difference(list(golden.get("chunks") or [gt]), list(seen.get("chunks") or [st]))
    return Comparison(False, f"golden {gt[:40]!r}, seen {st[:40]!r}", tok, char)


def at_path(value: Any, path: str) -> Any:
    """The value at dotted ``path`` (list items by index); a private sentinel when absent."""
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return MISSING
    return value


def _numbers(v: Any) -> list[float] | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return [float(v)]
    if isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return [float(x) for x in v]
    return None


def check(c: JsonCheck, golden: Any, seen: Any) -> str | None:
    """One check of an http-json answer; None when it holds, else why not."""
    g, s = at_path(golden, c.path), at_path(seen, c.path)
    if s is MISSING:
        return f"{c.path}: missing from the answer"
    if g is MISSING:
        return f"{c.path}: missing from the golden answer"
    if c.compare == "exact":
        return None if g == s else f"{c.path}: {str(s)[:40]} != golden {str(g)[:40]}"
    gn, sn = _numbers(g), _numbers(s)
    if gn is None or sn is None or len(gn) != len(sn):
        return f"{c.path}: not numbers of the golden's shape ({str(s)[:40]})"
    if c.compare == "cosine":
        dot = sum(x * y for x, y in zip(gn, sn, strict=False))
        norm = math.sqrt(sum(x * x for x in gn)) * math.sqrt(sum(y * y for y in sn))
        sim = dot / norm if norm else (1.0 if gn == sn else 0.0)
        return None if sim >= 1 - c.tolerance else f"{c.path}: cosine similarity {sim:.6f} < {1 - c.tolerance:.6f}"
    worst = max(abs(x - y) - (c.tolerance * abs(x) if c.compare == "relative" else c.tolerance)
                for x, y in zip(gn, sn, strict=False))
    return None if worst <= 0 else f"{c.path}: exceeds the {c.compare} tolerance {c.tolerance:g} by {worst:.3g}"


def compare_json(checks: tuple[JsonCheck, ...], golden: Any, seen: Any) -> Comparison:
    """An http-json answer by its checks (none: the whole answer exactly)."""
    if not checks:
        return Comparison(True) if golden == seen else Comparison(False, "the answer differs from the golden answer")
    for c in checks:
        why = check(c, golden, seen)
        if why is not None:
            return Comparison(False, why)
    return Comparison(True)


def compare(service: Service, golden: Any, seen: Any) -> Comparison:
    """``seen`` against ``golden`` under ``service.protocol``'s comparator; a missing answer
    (``None``) never matches."""
    if seen is None:
        return Comparison(False, "no answer")
    if golden is None:
        return Comparison(False, "no golden answer")
    if service.protocol == "openai-chat":
        return compare_chat(golden, seen)
    return compare_json(service.checks, golden, seen)
