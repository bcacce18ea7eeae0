"""The acceptance image for remote providers (Containerfile, .dockerignore), checked without a
container builder: the build context a builder would be sent (computed by the Docker SDK's own
.dockerignore matcher) holds the package and nothing of a home directory, a run or a credential;
the runner's secret scan finds nothing in it and does find a key planted in it; and the
Containerfile copies only what the context holds and installs at the main lock's versions."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from docker.utils.build import exclude_paths

from runbook_lib.phases.scan import scan_file

from .conftest import ROOT


def _context(root: Path) -> list[str]:
    """Files (relative paths) a builder is sent from ``root`` under its .dockerignore."""
    patterns = [line.strip() for line in (root / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    return sorted(p for p in exclude_paths(str(root), patterns)
                  if (root / p).is_file() and not (root / p).is_symlink())


def test_the_build_context_holds_the_package_and_nothing_else() -> None:
    files = _context(ROOT)
    tops = {f.split("/", 1)[0] for f in files}
    assert tops == {".dockerignore", "Containerfile", "README.md", "examples", "locks", "notebooks", "params",
                    "pyproject.toml", "runbook_lib"}
    assert "runbook_lib/__init__.py" in files and "runbook_lib/workload/job.py" in files
    assert [f for f in files if f.startswith("locks/")] == ["locks/main.txt"]
    assert len([f for f in files if f.startswith("notebooks/")]) == 6
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]


def test_the_build_context_holds_no_credential() -> None:
    findings = [f for rel in _context(ROOT) for f in scan_file(ROOT / rel, {}, ROOT)]
    assert findings == []


def test_a_home_directory_or_credential_stays_out_and_a_key_in_the_package_is_found(tmp_path: Path) -> None:
    shutil.copy(ROOT / ".dockerignore", tmp_path / ".dockerignore")
    planted = {
        ".env": "AWS_ACCESS_KEY_ID=AKIAABCDEFGHIJKLMNOP\n",
        "home/user/.aws/credentials": "[default]\naws_access_key_id = AKIAABCDEFGHIJKLMNOP\n",
        "seal.key": "-----BEGIN PRIVATE KEY-----\n",
        ".runbook/store/runs/x/output.json": "{}",
        "reports/run/receipt.json": "{}",
        "runbook_lib/certs/server.pem": "-----BEGIN PRIVATE KEY-----\n",
        "runbook_lib/settings.py": 'TOKEN = "hf_' + "a1B2c3D4e5" * 4 + '"\n',
        "runbook_lib/__init__.py": "",
    }
    for rel, text in planted.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    files = _context(tmp_path)
    assert files == [".dockerignore", "runbook_lib/__init__.py", "runbook_lib/settings.py"]
    findings = [f for rel in files for f in scan_file(tmp_path / rel, {}, tmp_path)]
    assert [(f.path, f.what) for f in findings] == [("runbook_lib/settings.py", "a Hugging Face token")]


def test_the_containerfile_copies_only_the_context_and_installs_at_the_locks_versions() -> None:
    text = (ROOT / "Containerfile").read_text()
    files = _context(ROOT)
    copied = [line.split()[1] for line in text.splitlines() if line.startswith("COPY ")]
    for src in copied:
        for one in src.split() if " " in src else [src]:
            assert one in files or any(f.startswith(one.rstrip("/") + "/") for f in files), \
                f"COPY {one}: not in the build context"
    sources = {line.split()[1] for line in text.splitlines() if line.startswith("COPY ")} | {"pyproject.toml"}
    assert {"locks/main.txt", "runbook_lib", "notebooks", "params", "examples"} <= sources
    assert re.search(r"^RUN pip install -c locks/main\.txt \. \\$", text, re.M), "install at the lock's versions"
    assert "pip check" in text
    assert re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:\S+-runtime-\S+$", text, re.M), "a CUDA runtime base"
    # torch comes from the lock (its registry wheel is the CUDA build of the same version)
    assert "torch==2.13.0" in (ROOT / "locks" / "main.txt").read_text().splitlines()
    assert "python3.11" in text and "ENV PATH=/opt/runbook/bin:$PATH" in text  # pods run `python -m ...`
