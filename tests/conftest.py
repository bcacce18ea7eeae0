"""Shared fixtures: the repository root, params written from the demo files with overrides."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.fixture
def make_params(tmp_path: Path) -> Callable[..., Path]:
    """Write ``params/<name>.yaml`` under a temp project dir from a demo file plus overrides."""

    def _make(base: str = "demo.yaml", name: str = "m.yaml", **over: Any) -> Path:
        data = yaml.safe_load((ROOT / "params" / base).read_text())
        data = deep_merge(data, over)
        (tmp_path / "params").mkdir(exist_ok=True)
        p = tmp_path / "params" / name
        p.write_text(yaml.safe_dump(data, sort_keys=False))
        return p

    return _make
