"""Which notebook runs a phase (project copy, given directory, packaged), ``runbook init``, the
packaged files inside a built wheel, the output-clearing before a run, and the plot check."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from runbook_lib.cli import main
from runbook_lib.errors import UsageError
from runbook_lib.evidence.manifest import PHASE_PLOTS, PHASES, PLOT_METADATA_KEY, phase_name
from runbook_lib.layout import project_root
from runbook_lib.run.phase_notebooks import (
    PACKAGED_NOTEBOOKS,
    cells_digest,
    init_project,
    phase_notebook,
    phase_notebooks,
)
from runbook_lib.run.runner import cleared, missing_plots, notebooks_line, plots_shown

from .conftest import ROOT

NAMES = [f"{phase_name(p)}.ipynb" for p, _ in PHASES]


def test_the_packaged_notebooks_are_the_repository_notebooks() -> None:
    assert sorted(p.name for p in PACKAGED_NOTEBOOKS.glob("*.ipynb")) == NAMES
    for name in NAMES:
        assert (PACKAGED_NOTEBOOKS / name).read_bytes() == (ROOT / "notebooks" / name).read_bytes()


def test_a_project_without_notebooks_runs_the_packaged_ones(tmp_path: Path) -> None:
    sources = phase_notebooks(project=tmp_path)
    assert [s.origin for s in sources] == ["packaged"] * 6 and all(s.same_as_packaged for s in sources)
    s = sources[3]
    assert s.sha256 == hashlib.sha256((ROOT / "notebooks" / NAMES[3]).read_bytes()).hexdigest()
    assert s.to_dict(tmp_path)["path"] == f"<package>/notebooks/{NAMES[3]}"
    assert notebooks_line(sources) == "packaged (all six)"


def test_a_project_copy_runs_its_phase_and_an_edit_is_told_from_saved_outputs(tmp_path: Path) -> None:
    (tmp_path / "notebooks").mkdir()
    # A copy that JupyterLab saved after running: outputs, counts, new metadata; same cells.
    nb = nbformat.read(PACKAGED_NOTEBOOKS / NAMES[2], as_version=4)
    nb.metadata["widgets"] = {"state": {}}
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="ran\n")]
    nb.cells[1].execution_count = 3
    nbformat.write(nb, tmp_path / "notebooks" / NAMES[2])
    # A real edit: one cell's code changed.
    edited = nbformat.read(PACKAGED_NOTEBOOKS / NAMES[3], as_version=4)
    edited.cells[-1].source = "record = finish(ctx, result)\ndisplay(record.record)"
    nbformat.write(edited, tmp_path / "notebooks" / NAMES[3])
    sources = phase_notebooks(project=tmp_path)
    assert [s.origin for s in sources] == ["packaged", "packaged", "project", "project", "packaged", "packaged"]
    assert [s.same_as_packaged for s in sources] == [True, True, True, False, True, True]
    assert sources[3].to_dict(tmp_path)["path"] == f"notebooks/{NAMES[3]}"
    assert sources[3].sha256 == hashlib.sha256((tmp_path / "notebooks" / NAMES[3]).read_bytes()).hexdigest()
    assert notebooks_line(sources) == "project notebooks/: 03 (same cells as packaged), 04 (edited); packaged: 01 02 05 06"


def test_cleared_drops_outputs_and_widget_state_but_keeps_the_code(tmp_path: Path) -> None:
    nb = nbformat.read(PACKAGED_NOTEBOOKS / NAMES[2], as_version=4)
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs = [nbformat.v4.new_output("stream", name="stdout", text="stale approval\n")]
            c.execution_count = 1
    nbformat.write(nb, tmp_path / "x.ipynb")
    out = cleared(tmp_path / "x.ipynb")
    assert "widgets" not in out.metadata
    assert all(c.outputs == [] and c.execution_count is None for c in out.cells if c.cell_type == "code")
    assert cells_digest(out) == cells_digest(json.loads((PACKAGED_NOTEBOOKS / NAMES[2]).read_text()))


def test_a_given_directory_must_hold_the_notebook_and_a_broken_one_is_named(tmp_path: Path) -> None:
    (tmp_path / "nb").mkdir()
    with pytest.raises(UsageError, match="01_freeze_source.ipynb is not there"):
        phase_notebook("01", project=tmp_path, given=tmp_path / "nb")
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / NAMES[0]).write_text("{not json")
    with pytest.raises(UsageError, match="cannot be read as a notebook") as ei:
        phase_notebooks(project=tmp_path)
    assert "remove it to run the packaged one" in str(ei.value)


def test_init_copies_notebooks_and_params_and_overwrites_nothing(tmp_path: Path, capsys) -> None:
    target = tmp_path / "proj"
    assert main(["init", str(target)]) == 0
    assert sorted(p.name for p in (target / "notebooks").iterdir()) == NAMES
    assert (target / "params" / "demo.yaml").read_bytes() == (ROOT / "params" / "demo.yaml").read_bytes()
    assert "runbook run" in capsys.readouterr().out
    assert [s.origin for s in phase_notebooks(project=project_root(target / "params" / "demo.yaml"))] == ["project"] * 6
    (target / "notebooks" / NAMES[4]).write_text('{"cells": [], "my": "edit"}')
    (target / "params" / "demo.yaml").unlink()
    assert main(["init", str(target)]) == 2  # usage error: the edit is kept, nothing written
    assert (target / "notebooks" / NAMES[4]).read_text() == '{"cells": [], "my": "edit"}'
    assert not (target / "params" / "demo.yaml").exists()
    with pytest.raises(UsageError, match="already exist"):
        init_project(target)
    (tmp_path / "a-file").write_text("keep me")
    with pytest.raises(UsageError, match="it is a file"):
        init_project(tmp_path / "a-file")
    assert (tmp_path / "a-file").read_text() == "keep me"


def test_the_project_is_the_parent_of_params_even_inside_another_project(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "work" / "proj" / "params").mkdir(parents=True)
    assert project_root(tmp_path / "work" / "proj" / "params" / "m.yaml") == tmp_path / "work" / "proj"
    (tmp_path / "work" / "loose").mkdir()
    assert project_root(tmp_path / "work" / "loose" / "m.yaml") == tmp_path


def test_a_built_wheel_carries_the_notebooks_and_example_params(tmp_path: Path) -> None:
    # The links runbook_lib/notebooks and runbook_lib/params become files in the wheel. Built from
    # a copy of the sources, so the build writes nothing into the checkout the other tests use.
    src = tmp_path / "src"
    for name in ("pyproject.toml", "README.md"):
        (src / name).parent.mkdir(exist_ok=True)
        shutil.copyfile(ROOT / name, src / name)
    for name in ("runbook_lib", "notebooks", "params"):
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    assert (src / "runbook_lib" / "notebooks").is_symlink()
    # The environment's own setuptools when it has one (Python 3.11 venvs do); else pip fetches
    # the build backend from the package registry into an isolated build environment.
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", *isolation,
                    "--disable-pip-version-check", "-w", str(tmp_path), str(src)], check=True, cwd=tmp_path)
    (wheel,) = tmp_path.glob("gpu_migration_runbook-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"runbook_lib/notebooks/{n}" for n in NAMES} <= names
    assert "runbook_lib/params/demo.yaml" in names


def _executed(tmp_path: Path, plots: list[str | None]) -> Path:
    nb = nbformat.v4.new_notebook()
    outputs = [nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo="},
                                      metadata={"image/png": {PLOT_METADATA_KEY: p}} if p else {}) for p in plots]
    nb.cells = [nbformat.v4.new_code_cell("display(result)", outputs=outputs)]
    path = tmp_path / "04_compare_production.ipynb"
    nbformat.write(nb, path)
    return path


def test_missing_plots_names_each_plot_the_notebook_does_not_show(tmp_path: Path) -> None:
    latency, throughput, cost = PHASE_PLOTS["04"]
    assert missing_plots("04", _executed(tmp_path, [latency, throughput, cost])) == []
    assert missing_plots("04", _executed(tmp_path, [latency, None, cost])) == [throughput]
    assert plots_shown(_executed(tmp_path, [latency, None])) == [latency, "<unnamed>"]
    assert missing_plots("04", _executed(tmp_path, [])) == [latency, throughput, cost]
    assert missing_plots("03", _executed(tmp_path, [])) == []  # phase 03 shows no plot


def test_a_notebook_default_params_path_outside_notebooks_says_where_papermill_runs_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Papermill without ``-p params_path`` starts the kernel in its caller's directory, where the
    notebook's default ``../params/demo.yaml`` (relative to notebooks/) is not: the error says so."""
    from runbook_lib.errors import ParamsError
    from runbook_lib.phases import open_phase

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ParamsError, match=r"relative to this kernel's working directory .*relative to notebooks/.*"
                                          r"-p params_path"):
        open_phase("01", "../params/demo.yaml", run_mode="headless")
    assert not (tmp_path.parent / "reports").exists() and list(tmp_path.iterdir()) == []  # nothing was created


def test_a_phase_kernel_listens_on_unix_sockets_of_its_own_so_no_port_can_be_taken_from_it() -> None:
    # Over TCP the manager picks ports, closes them and the kernel binds them later: a CI run lost
    # a phase when another process took one meanwhile (ZMQError: Address already in use).
    import asyncio

    import psutil

    from runbook_lib.run.runner import PhaseKernelManager

    async def started() -> tuple[dict, set, list[str], list[str]]:
        km = PhaseKernelManager(kernel_name="python3")
        await km.start_kernel(extra_arguments=["--IPKernelApp.log_level=ERROR"])
        kc = km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=60)
            info = km.get_connection_info()
            sockets = sorted(str(p) for p in Path(info["ip"]).parent.glob(Path(info["ip"]).name + "-*"))
            unix = {c.laddr for c in psutil.Process(km.provisioner.pid).net_connections(kind="unix")}  # type: ignore[union-attr]
        finally:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)
        left = sorted(str(p) for p in Path(info["ip"]).parent.glob(Path(info["ip"]).name + "-*"))
        return info, unix, sockets, left

    info, unix, sockets, left = asyncio.run(started())
    assert info["transport"] == "ipc" and Path(info["ip"]).name.startswith("runbook-kernel-"), info
    # shell, iopub, stdin, control and heartbeat, each a Unix socket the kernel listens on (its
    # iopub pipe for subprocess output stays on a TCP port zmq binds at once: nothing to race for)
    assert len(sockets) == 5 and set(sockets) <= unix, (sockets, unix)
    assert all(len(s.encode()) < 108 for s in sockets)  # Linux's sun_path
    assert left == []  # removed at shutdown
    assert PhaseKernelManager().ip != PhaseKernelManager().ip  # each kernel its own prefix
