"""Write the docs site's generated reference pages from the code they describe, or check them.

- ``docs/reference/params.md``: every section and field of a migration's params, from the
  pydantic models in ``runbook_lib/params.py`` (type, default, constraints, and the description
  the class docstring's ``Attributes:`` section gives the field);
- ``docs/reference/cli.md``: every ``runbook`` command and option, from the argparse parser in
  ``runbook_lib/cli.py`` (its help, at a fixed width).

Usage: ``.venv/bin/python scripts/docs_reference.py`` writes both; ``--check`` exits 1 naming a
page that is stale (``make docs`` runs it, so the site never documents an old field or option).
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parent.parent
PARAMS_PAGE = ROOT / "docs" / "reference" / "params.md"
CLI_PAGE = ROOT / "docs" / "reference" / "cli.md"
HELP_WIDTH = "100"  # argparse wraps help at $COLUMNS; fixed so the page is the same on every terminal


def _type_name(t: Any) -> str:
    """A field's annotation as a reader writes it: ``float | None``, ``tuple[str, ...]``."""
    origin = typing.get_origin(t)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(t)[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(t))
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(t))
    if origin is not None:
        args = ", ".join("..." if a is Ellipsis else _type_name(a) for a in typing.get_args(t))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if t is type(None):
        return "None"
    return getattr(t, "__name__", str(t).replace("typing.", ""))


def _constraints(info: FieldInfo) -> str:
    """The field's bounds and pattern (``>= 0``, ``<= 1``, ``pattern ^...$``), from pydantic's metadata."""
    out = []
    for m in info.metadata:
        for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"), ("min_length", "len >="),
                          ("max_length", "len <=")):
            v = getattr(m, attr, None)
            if v is not None:
                out.append(f"{sym} {v}")
        pattern = getattr(m, "pattern", None)
        if pattern:
            out.append(f"`{pattern}`")
    return ", ".join(out)


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        try:
            value = info.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return "(computed)"
        return f"`{_short(value)}`" if not isinstance(value, BaseModel) else "(its defaults)"
    if info.default is PydanticUndefined:
        return "**required**"
    if isinstance(info.default, BaseModel):
        return "(its defaults)"
    return f"`{_short(info.default)}`"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _attributes(doc: str) -> dict[str, str]:
    """``name -> description`` from a Google-style ``Attributes:`` section of a class docstring."""
    out: dict[str, str] = {}
    lines = doc.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:")
    except StopIteration:
        return out
    name = None
    base = None
    for line in lines[start + 1:]:
        if not line.strip():
            name = None
            continue
        indent = len(line) - len(line.lstrip())
        if base is None:
            base = indent
        if indent < base:
            break
        m = re.match(r"\s*([A-Za-z_]\w*(?:, [A-Za-z_]\w*)*)(?: \([^)]*\))?:\s*(.*)", line)
        if indent == base and m:
            names = m.group(1).split(", ")
            name = names[0]
            for n in names:
                out[n] = m.group(2)
        elif name is not None:
            for n in [k for k, v in out.items() if v == out[name]]:
                out[n] += " " + line.strip()
    return out


def _markdown(text: str) -> str:
    """reStructuredText inline markup as Markdown: ``x`` and :role:`x` become `x`."""
    text = re.sub(r":(?:class|func|data|mod|meth|attr|exc):`~?([^`]+)`", r"`\1`", text)
    return re.sub(r"``([^`]+)``", r"`\1`", text)


def _comments(model: type[BaseModel]) -> dict[str, str]:
    """``field -> description`` from the comments written beside a model's fields in its source:
    the comment lines just above a field, or the one ending its line."""
    try:
        lines, _ = inspect.getsourcelines(model)
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    above: list[str] = []
    for line in lines[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("#").strip())
            continue
        m = re.match(r"\s{4}([A-Za-z_]\w*)\s*:[^#]*?(?:#\s*(.*))?$", line.rstrip())
        if m and not line.startswith("     "):
            text = " ".join(above) or (m.group(2) or "")
            if text and not text.startswith("noqa"):
                out[m.group(1)] = text
        above = []
    return out


def _summary(doc: str) -> str:
    """The docstring without its ``Attributes:`` section, its paragraphs kept."""
    return _markdown(doc.split("\nAttributes:", 1)[0]).strip()


def _cell(text: str) -> str:
    """``text`` for a table cell: on one line, a pipe escaped outside code spans (inside them the
    tables extension already reads it as text)."""
    parts = re.split(r"(`[^`]*`)", _markdown(text).replace("\n", " "))
    return "".join(x if x.startswith("`") else x.replace("|", "\\|") for x in parts)


def _models(root: type[BaseModel]) -> list[tuple[str, type[BaseModel]]]:
    """``(path, model)`` for the params root and every model reachable from its fields, depth first,
    each model once (at the first path that reaches it)."""
    seen: set[type[BaseModel]] = set()
    out: list[tuple[str, type[BaseModel]]] = []

    def nested(t: Any) -> list[type[BaseModel]]:
        if inspect.isclass(t) and issubclass(t, BaseModel):
            return [t]
        return [m for a in typing.get_args(t) for m in nested(a)]

    def visit(path: str, model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        out.append((path, model))
        for name, info in model.model_fields.items():
            for sub in nested(info.annotation):
                visit(f"{path}.{name}" if path else name, sub)

    visit("", root)
    return out


def params_page() -> str:
    """The params reference, Markdown."""
    from runbook_lib.params import Migration

    parts = ["# Params reference", "",
             "Generated from the pydantic models in `runbook_lib/params.py` by `scripts/docs_reference.py`",
             "(`make docs` fails when this page is stale). A params file is YAML 1.2; unknown keys are",
             "refused with the field's path, the value seen and what is allowed (exit 2). Credentials are",
             "named by reference (`env:VAR` or `file:/path`), never written here.", ""]
    models = _models(Migration)
    paths = [path for path, _ in models]
    for path, model in models:
        title = f"`{path}`" if path else "The migration (top level)"
        if paths.count(path) > 1:  # a section that takes one of several models (source: local, runpod, vast)
            title += f" as `{model.__name__}`"
        parts += [f"## {title}", "", f"Model: `{model.__name__}`.", ""]
        doc = inspect.getdoc(model) or ""
        if doc:
            parts += [_summary(doc), ""]
        described = {**_comments(model), **_attributes(doc)}
        for base in model.__mro__[1:]:
            if base is not BaseModel and issubclass(base, BaseModel):
                described = {**_comments(base), **_attributes(inspect.getdoc(base) or ""), **described}
        parts += ["| field | type | default | constraints | description |", "|---|---|---|---|---|"]
        for name, info in model.model_fields.items():
            parts.append(f"| `{name}` | {_cell('`' + _type_name(info.annotation) + '`')} | {_default(info)} | "
                         f"{_cell(_constraints(info))} | {_cell(described.get(name, ''))} |")
        parts.append("")
    return "\n".join(parts)


def cli_page() -> str:
    """The command-line reference, Markdown: ``runbook --help`` and each command's help."""
    from runbook_lib.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    parts = ["# Command-line reference", "",
             "Generated from the argparse parser in `runbook_lib/cli.py` by `scripts/docs_reference.py`",
             "(`make docs` fails when this page is stale). Exit codes: see [Exit codes](exit-codes.md).", "",
             "## `runbook`", "", "```text", parser.format_help().rstrip(), "```", ""]
    for name, cmd in sub.choices.items():
        parts += [f"## `runbook {name}`", "", "```text", cmd.format_help().rstrip(), "```", ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if a page differs from what the code gives")
    args = ap.parse_args(argv)
    os.environ["COLUMNS"] = HELP_WIDTH
    stale = []
    for page, text in ((PARAMS_PAGE, params_page()), (CLI_PAGE, cli_page())):
        if args.check:
            if not page.is_file() or page.read_text() != text:
                stale.append(str(page.relative_to(ROOT)))
        else:
            page.write_text(text)
    if stale:
        print(f"stale generated docs: {', '.join(stale)}; run `.venv/bin/python scripts/docs_reference.py` "
              "and commit the pages", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
