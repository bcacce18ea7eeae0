"""The sample inputs of a service (``workload.service.samples``, JSON Lines) and the requests
phases 03-05 draw from them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from runbook_lib.errors import ParamsError
from runbook_lib.layout import project_root
from runbook_lib.params import Service

MAX_SAMPLES = 10_000
"""Most sample inputs a service may declare (each is answered by both sides in phases 01 and 03)."""


def samples_path(service: Service, params_path: Path) -> Path:
    """The samples file: absolute, or relative to the project root of ``params_path``."""
    p = Path(service.samples)
    return p if p.is_absolute() else project_root(params_path) / p


def load_samples(service: Service, params_path: Path) -> list[Any]:
    """Every sample input, in file order (blank lines skipped).

    ``openai-chat`` samples are ``{"messages": [{"role": ..., "content": ...}, ...]}`` or
    ``{"prompt": "..."}`` (sent as one user message); ``http-json`` samples are any JSON value.

    Raises:
        ParamsError: the file is missing, unreadable, not JSON Lines, empty, larger than
            :data:`MAX_SAMPLES` inputs, or a chat sample has neither ``messages`` nor ``prompt``
            (exit 2: nothing has run).
    """
    path = samples_path(service, params_path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ParamsError(f"workload.service.samples {service.samples!r}: cannot read {path} ({exc}); give a "
                          "JSON Lines file of sample inputs, relative to the project") from exc
    out: list[Any] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ParamsError(f"workload.service.samples {path}:{n} is not JSON ({exc.msg}); each line is one "
                              "sample input") from exc
        if service.protocol == "openai-chat":
            value = chat_messages(value, where=f"{path}:{n}")
        out.append(value)
        if len(out) > MAX_SAMPLES:
            raise ParamsError(f"workload.service.samples {path} has more than {MAX_SAMPLES} inputs; keep a "
                              "representative sample")
    if not out:
        raise ParamsError(f"workload.service.samples {path} holds no sample input; add one JSON value per line")
    return out


def chat_messages(value: Any, *, where: str) -> list[dict[str, str]]:
    """A chat sample as its message list.

    Raises:
        ParamsError: neither a ``messages`` list of ``{role, content}`` nor a ``prompt`` string.
    """
    if isinstance(value, dict) and isinstance(value.get("prompt"), str):
        return [{"role": "user", "content": value["prompt"]}]
    msgs = value.get("messages") if isinstance(value, dict) else None
    if isinstance(msgs, list) and msgs and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                               and isinstance(m.get("content"), str) for m in msgs):
        return [{"role": m["role"], "content": m["content"]} for m in msgs]
    raise ParamsError(f"{where}: an openai-chat sample is {{\"messages\": [{{\"role\": ..., \"content\": ...}}]}} "
                      f"or {{\"prompt\": \"...\"}}, not {str(value)[:80]!r}")


def draw(samples: list[Any], n: int, seed: int) -> list[tuple[int, Any]]:
    """``n`` requests drawn with replacement with ``numpy.random.default_rng(seed)``, as
    ``(sample index, input)`` so each answer is judged against its golden answer."""
    idx = np.random.default_rng(seed).integers(0, len(samples), size=n)
    return [(int(i), samples[int(i)]) for i in idx]
