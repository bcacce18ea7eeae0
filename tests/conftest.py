"""Shared fixtures: the repository root, params written from the demo files with overrides."""

from __future__ import annotations

import copy
import os
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"  # Debian's chromium package (`make browser` installs it as root)


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


def reseal(run_dir: Path) -> None:
    """Recompute every hash that vouches for a sealed run's receipt and notebooks (phase 06's
    record, the manifest, the completion marker), as someone with write access could after
    editing them: ``runbook verify`` then finds nothing wrong."""
    import json

    from runbook_lib.manifest import sha256_file

    rec_path = run_dir / "06_accept_or_rollback.json"
    rec = json.loads(rec_path.read_text())
    rec["files"]["receipt.json"] = sha256_file(run_dir / "receipt.json")
    rec_path.write_text(json.dumps(rec, indent=2))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["outputs"]["records"][rec_path.name] = sha256_file(rec_path)
    manifest["outputs"]["notebooks"] = {n: sha256_file(run_dir / n) for n in manifest["outputs"]["notebooks"]}
    (run_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    marker = json.loads((run_dir / "_SUCCESS").read_text())
    marker["files"] = {k: sha256_file(run_dir / k) for k in marker["files"]}
    (run_dir / "_SUCCESS").write_text(json.dumps(marker, indent=2))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Debian Chromium through Playwright. Skipped (with the reason) only where Chromium
    is not installed, never in CI (``CI`` set), where `make test-e2e` installs it."""
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing in CI: `make browser` installs Debian's chromium package")
        pytest.skip(f"{CHROMIUM} is not installed (Debian package chromium; `make browser` installs it as root)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                              args=["--no-sandbox"] if os.geteuid() == 0 else [])
        yield b
        b.close()


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 (and STS) server on 127.0.0.1, for one test module."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def retag_devices(src: Path, dst: Path, tag: bytes) -> None:
    """Rewrite the device tags in a zip checkpoint's pickle (BINUNICODE 'cpu' -> ``tag``), as a
    file saved on that device carries them."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("data.pkl"):
                assert b"X\x03\x00\x00\x00cpu" in data
                data = data.replace(b"X\x03\x00\x00\x00cpu", b"X" + len(tag).to_bytes(4, "little") + tag)
            zout.writestr(info, data)
