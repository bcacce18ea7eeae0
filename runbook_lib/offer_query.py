"""The vast CLI's offer query language (``gpu_name=RTX_4090 num_gpus>=1 cuda_vers>=12.4``), parsed
into the filter body of Vast.ai's ``POST /api/v0/bundles/`` search.

A pure parser with no provider code in it, so the params schema can check a query when a file
is loaded, and the Vast adapter can send it. Source of the grammar, aliases and units: vast-cli
``vastai/api/query.py`` (github.com/vast-ai/vast-cli).
"""

from __future__ import annotations

import re
from typing import Any

from runbook_lib.errors import ParamsError

_OPS = {"=": "eq", "==": "eq", "!=": "neq", "<": "lt", "<=": "lte", ">": "gt", ">=": "gte", "in": "in",
        "notin": "notin", "nin": "notin", "eq": "eq", "neq": "neq", "gt": "gt", "gte": "gte", "lt": "lt", "lte": "lte"}
_ALIASES = {"cuda_vers": "cuda_max_good", "dph": "dph_total", "reliability": "reliability2"}
_GB_TO_MB = {"cpu_ram", "gpu_ram", "gpu_total_ram"}  # typed in GB on the CLI, the API wants MB (x 1000)
_TOKEN = re.compile(r"\s*([a-zA-Z_]+)\s*(>=|<=|!=|==|=|<|>|\bnotin\b|\bnin\b|\bin\b|\beq\b|\bneq\b|\bgte\b|\bgt\b|"
                    r"\blte\b|\blt\b)\s*(\[[^\]]*\]|\S+)")


def _value(field: str, raw: str) -> Any:
    if raw.startswith("["):
        return [_value(field, v.strip()) for v in raw[1:-1].split(",") if v.strip()]
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    try:
        num = float(raw)
    except ValueError:
        return raw.replace("_", " ")
    if field in _GB_TO_MB:
        num *= 1000
    elif field == "duration":
        num *= 86_400  # typed in days, the API wants seconds
    return int(num) if num.is_integer() and field not in ("cuda_max_good", "dph_total") else num


def parse_query(text: str) -> dict[str, dict[str, Any]]:
    """Parse the vast CLI's offer query language into the ``/bundles/`` filter body.

    ``"gpu_name=RTX_4090 num_gpus>=1 cuda_vers>=12.4 cpu_ram>=32"`` ->
    ``{"gpu_name": {"eq": "RTX 4090"}, "num_gpus": {"gte": 1}, "cuda_max_good": {"gte": 12.4},
    "cpu_ram": {"gte": 32000}}``: underscores in values become spaces, ``cpu_ram``/``gpu_ram``/
    ``gpu_total_ram`` are GB x 1000, ``duration`` days x 86 400, aliases ``cuda_vers``/``dph``
    resolved, and ``any``/``*``/``?`` deletes a filter (vast-cli ``vastai/api/query.py``).

    Raises:
        ParamsError: a token is not ``field op value``; the message quotes it.
    """
    out: dict[str, dict[str, Any]] = {}
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ParamsError(f"offer.query: cannot parse {text[pos:].split()[0]!r} at character {pos}; write "
                              "tokens as field op value, e.g. gpu_name=RTX_4090 num_gpus>=1 cuda_vers>=12.4",
                              field="offer.query")
        field, op, raw = m.group(1), _OPS[m.group(2)], m.group(3)
        field = _ALIASES.get(field, field)
        if raw in ("any", "*", "?"):
            out.pop(field, None)
        else:
            out.setdefault(field, {})[op] = _value(field, raw)
        pos = m.end()
    return out
