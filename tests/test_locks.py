"""Every environment the Makefile builds installs exact versions from its lock (locks/*.txt), the
main lock covers every dependency pyproject.toml declares, the main environment holds exactly
what its lock says and nothing more, and each run's seal records the lock's sha256."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from runbook_lib.evidence.manifest import write_json_atomic
from runbook_lib.evidence.seal import lock_sha256, seal_run
from runbook_lib.params import load_params

from .conftest import ROOT

LOCKS = {"main": ".venv", "runpod": ".venv-runpod", "vastai": ".venv-vastai", "serve": ".venv-serve",
         "docs": ".venv-docs", "airflow": ".venv-airflow"}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.!+_-]+)$")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503 normalisation


def _pins(env: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (ROOT / "locks" / f"{env}.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = PIN.match(line.strip())
        assert m, f"locks/{env}.txt: {line!r} is not an exact name==version pin"
        assert _norm(m.group(1)) not in out, f"locks/{env}.txt pins {m.group(1)} twice"
        out[_norm(m.group(1))] = m.group(2)
    return out


@pytest.mark.parametrize("env", sorted(LOCKS))
def test_each_environment_installs_exact_versions_from_its_lock(env: str) -> None:
    pins = _pins(env)
    assert pins, f"locks/{env}.txt pins nothing"
    makefile = (ROOT / "Makefile").read_text()
    assert f"{LOCKS[env]}/bin/python -m pip install $(PIP) -r locks/{env}.txt" in makefile or \
        (env == "main" and "$(PY) -m pip install $(PIP) -r locks/main.txt" in makefile)
    if "torch" in pins:  # pinned by version: the local CPU wheel's hash is not the registry's
        assert pins["torch"] == "2.13.0"


def test_the_main_lock_covers_every_declared_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    names = {_norm(re.split(r"[\[<>=!~; ]", d, maxsplit=1)[0]) for d in declared}
    assert sorted(names - set(_pins("main"))) == []


def test_the_main_environment_holds_exactly_what_its_lock_pins() -> None:
    differ = []
    for name, version in _pins("main").items():
        try:
            got = metadata.version(name)
        except metadata.PackageNotFoundError:
            got = None
        if got is None or got.split("+")[0] != version:
            differ.append(f"{name}: locked {version}, installed {got}")
    assert differ == [], "run `make` again (the stamp follows locks/main.txt)"


def test_the_main_environment_holds_nothing_its_lock_leaves_out() -> None:
    # An optional extra's package left behind (rfc3987-syntax, LOCK_OMIT in the Makefile) is
    # imported by whatever finds it: jsonschema compiles its grammars in every `runbook` process.
    installed = {_norm(d.metadata["Name"]) for d in metadata.distributions()}
    extra = installed - set(_pins("main")) - {"gpu-migration-runbook", "pip", "setuptools"}
    assert sorted(extra) == [], "run `make` again, or `pip uninstall` what the lock leaves out"


def test_a_run_records_the_locks_sha256(tmp_path: Path) -> None:
    run = tmp_path / "reports" / "20260301T110000Z-demo-embed-endpoint-hold"
    run.mkdir(parents=True)
    shutil.copyfile(ROOT / "params" / "demo.yaml", run / "params.yaml")
    write_json_atomic(run / "receipt.json", {"run_id": run.name, "decision": "HOLD"})
    manifest = seal_run(run, load_params(run / "params.yaml"), run / "params.yaml", decision="HOLD")
    want = hashlib.sha256((ROOT / "locks" / "main.txt").read_bytes()).hexdigest()
    assert lock_sha256() == want and manifest["runtime"]["lock_sha256"] == want
    assert json.loads((run / "manifest.json").read_text())["runtime"]["lock_sha256"] == want
