"""The JupyterLab runbook as an engineer steps through it: `make lab` serves a project made by
`runbook init` on loopback with a token; headless Debian Chromium (Playwright) opens phase 03 in
interactive mode, runs it cell by cell to the approval cell, clicks Approve, sees the approval
record written and the cell turn into static text naming who approved, and runs the next cells,
which find the record, run the canary and write the phase record. A screenshot is kept in the
test's directory."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from runbook_lib.cli import main as cli_main
from runbook_lib.evidence.approvals import write_approval_file
from runbook_lib.evidence.rundir import RunDir
from runbook_lib.run.runner import run_phase

from .conftest import ROOT
from .runs import FAST_INFERENCE, NOT_PREAPPROVED, merged

pytestmark = pytest.mark.e2e

# Nothing is pre-approved: phase 03's canary launch waits for a person.
FAST = merged(FAST_INFERENCE, NOT_PREAPPROVED)
UNQUEUED_S = 20.0  # a Run click whose cell still reads [ ] this long after was not taken: click again
MAX_CLICKS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _project(make_params, tmp_path: Path) -> RunDir:
    """``runbook init`` a project, then phases 01 and 02 headlessly (phase 01 holds for its
    approval, `runbook approve` writes the file, phase 01 runs again with it)."""
    assert cli_main(["init", str(tmp_path)]) == 0
    params = make_params("demo.yaml", name="demo.yaml", **FAST)  # the notebooks' default params_path
    run = RunDir.create(params, reports_dir=tmp_path / "reports")
    held = run_phase(run, "01")
    assert held.status == "held", held.reason
    write_approval_file(run.path, tmp_path / "approval.json", approved_by="release-manager")
    for phase, ref in (("01", str(tmp_path / "approval.json")), ("02", "")):
        out = run_phase(run, phase, approval_ref=ref)
        assert out.status == "completed", out.reason
    return run


def _records(run: RunDir) -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in (run.path / "approvals").glob("*.json")
            if not p.name.startswith("pending-")}


def _lab_failure(page: Any, tmp_path: Path, what: str) -> AssertionError:
    """An AssertionError naming ``what``, with a screenshot kept beside the lab log's tail."""
    shot = tmp_path / "lab-failure.png"
    page.screenshot(path=str(shot), full_page=True)
    return AssertionError(f"{what}; screenshot {shot}; lab log:\n{(tmp_path / 'lab.log').read_text()[-3000:]}")


def _no_dialog(page: Any, tmp_path: Path, *, kernel_fresh: bool) -> None:
    """Fail naming a modal dialog that would take the next click, with two exceptions a person
    answers the same way every time: JupyterLab's kernel choice (the notebook's own python3
    kernel, preselected: Select) and, while no cell has run yet, its notice that a kernel which
    ran nothing restarted (Ok); a restart after a cell ran lost that cell's state and fails."""
    dialog = page.locator(".jp-Dialog")
    for _ in range(3):
        if not dialog.count():
            return
        title = dialog.first.locator(".jp-Dialog-header").inner_text().strip()
        if title == "Select Kernel":
            dialog.first.locator(".jp-mod-accept").click()
        elif title == "Kernel Restarting" and kernel_fresh:
            dialog.first.locator(".jp-mod-accept").click()
        else:
            raise _lab_failure(page, tmp_path, f"a JupyterLab dialog is open: {dialog.first.inner_text()!r}")
        dialog.first.wait_for(state="detached", timeout=10_000)
    raise _lab_failure(page, tmp_path, "JupyterLab kept opening dialogs")


def _kernel_idle(page: Any, base: str, token: str, path: str, tmp_path: Path, *, timeout_s: float) -> None:
    """Wait until the server reports the notebook's kernel started and idle (``/api/sessions``),
    answering the start-up dialogs :func:`_no_dialog` allows."""
    deadline, state = time.monotonic() + timeout_s, "no session"
    while time.monotonic() < deadline:
        _no_dialog(page, tmp_path, kernel_fresh=True)
        sessions = httpx.get(f"{base}/api/sessions", params={"token": token}, timeout=10).json()
        kernels = [s["kernel"] for s in sessions if s.get("path") == path and s.get("kernel")]
        state = kernels[0].get("execution_state", "unknown") if kernels else "no session"
        if state == "idle":
            return
        time.sleep(0.5)
    raise _lab_failure(page, tmp_path, f"the kernel of {path} was not idle within {timeout_s:g} s (last: {state})")


# Alone on the host (the host lock held exclusively): its per-cell waits are a person's, not a
# load's. Its kernel runs the phases without the runner, so it takes no lock itself. A Run click was
# seen not taken (the first cell still read [ ] 240 s later, alone on the host): run_cell clicks again.
@pytest.mark.measure
def test_make_lab_steps_through_phase_03_with_an_approve_click(make_params, tmp_path: Path, browser: Any,
                                                               alone_on_this_host: Callable[[], None]) -> None:
    run = _project(make_params, tmp_path)  # headless phases, through the runner: they hold the lock themselves
    alone_on_this_host()
    before = _records(run)
    port, token = _free_port(), secrets.token_hex(16)
    jupyter_home = tmp_path / "jupyter-home"  # no user settings, workspaces or news prompts leak in
    env = {**os.environ, "JUPYTER_TOKEN": token, "JUPYTER_CONFIG_DIR": str(jupyter_home / "config"),
           "JUPYTERLAB_SETTINGS_DIR": str(jupyter_home / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(jupyter_home / "workspaces"),
           "JUPYTER_RUNTIME_DIR": str(jupyter_home / "runtime")}
    # Every cell rendered (no windowing: the test reads cells below the fold), and no news prompt.
    for plugin, value in (("notebook-extension/tracker", {"windowingMode": "none"}),
                          ("apputils-extension/notification", {"fetchNews": "false"})):
        f = jupyter_home / "settings" / f"@jupyterlab/{plugin}.jupyterlab-settings"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(value))
    log = (tmp_path / "lab.log").open("w")
    lab = subprocess.Popen(["make", "-s", "-C", str(ROOT), "lab", f"LAB_DIR={tmp_path}", f"LAB_PORT={port}",
                            "LAB_ARGS=--ServerApp.open_browser=False"], env=env, stdout=log,
                           stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base}/api/status", params={"token": token}, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert lab.poll() is None and time.monotonic() < deadline, (tmp_path / "lab.log").read_text()
            time.sleep(0.5)
        assert httpx.get(f"{base}/api/status", timeout=5).status_code == 403  # the token is required

        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        page.goto(f"{base}/lab/tree/notebooks/03_prove_parity.ipynb?token={token}")
        # The toolbar's indicator reads idle before any kernel exists: wait for the server's session.
        _kernel_idle(page, base, token, "notebooks/03_prove_parity.ipynb", tmp_path, timeout_s=180)
        cells = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell")
        cells.nth(6).wait_for(timeout=60_000)
        assert cells.count() == 7  # title, parameters, open, plan, approval, run, finish

        run_button = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) "
                                  "[data-command='notebook:run-cell-and-select-next']").first

        def run_cell(i: int, timeout_s: float = 240) -> None:
            """Select code cell ``i`` by its prompt, run it with the toolbar's Run button (as a person
            clicks it) and wait for its execution count. A click that left the prompt blank (``[ ]``,
            not queued ``[*]``) for ``UNQUEUED_S`` is clicked again, as a person would: once queued,
            a cell is never sent twice."""
            prompt = cells.nth(i).locator(".jp-InputPrompt")
            deadline, clicks, clicked = time.monotonic() + timeout_s, 0, 0.0
            while True:
                text = prompt.inner_text()
                if re.search(r"\[\d+\]", text):
                    return
                if clicks < MAX_CLICKS and "*" not in text and (not clicks or time.monotonic() > clicked + UNQUEUED_S):
                    for target in (prompt, run_button):
                        _no_dialog(page, tmp_path, kernel_fresh=False)
                        try:
                            target.click()
                        except PlaywrightTimeout:  # something took the click: name it
                            _no_dialog(page, tmp_path, kernel_fresh=False)
                            raise
                    clicks, clicked = clicks + 1, time.monotonic()
                if time.monotonic() >= deadline:
                    dialog = page.locator(".jp-Dialog")
                    dialogs = [dialog.nth(k).inner_text() for k in range(dialog.count())]
                    raise _lab_failure(page, tmp_path, f"cell {i} did not finish in {timeout_s} s after {clicks} "
                                       f"click(s); dialogs {dialogs}; the cell shows:\n{cells.nth(i).inner_text()[-2000:]}")
                time.sleep(0.5)

        for i in range(1, 5):  # through the approval cell: the kernel is then idle, waiting for nobody
            run_cell(i)
        button = page.get_by_role("button", name=re.compile(r"^Approve "))
        try:
            button.wait_for(timeout=240_000)
        except Exception:
            page.screenshot(path=str(tmp_path / "no-approve-button.png"), full_page=True)
            raise AssertionError("no Approve button; the cells show:\n" + "\n---\n".join(
                cells.nth(i).inner_text()[-1500:] for i in range(cells.count()))) from None
        assert "Awaiting approval" in cells.nth(4).inner_text()
        assert _records(run) == before  # nothing approved yet
        button.click()
        approved = cells.nth(4).get_by_text(re.compile(r"Approved: .*\(widget click"))
        approved.wait_for(timeout=60_000)
        new = {k: v for k, v in _records(run).items() if k not in before}
        assert len(new) == 1
        (rec,) = new.values()
        assert rec["approval"]["method"] == "widget" and rec["plan"]["provider"] == "local"
        assert rec["approval"]["fingerprint"][:16] in cells.nth(4).inner_text()
        assert not list((run.path / "approvals").glob("pending-*"))  # phase 01's held plan was approved since

        run_cell(5, timeout_s=420)  # the next cell finds the record and runs the canary
        assert "Error" not in cells.nth(5).inner_text(), cells.nth(5).inner_text()[-2000:]
        run_cell(6)
        record = run.path / "03_prove_parity.json"
        assert record.exists() and "03_prove_parity.json" in cells.nth(6).inner_text(), cells.nth(6).inner_text()
        page.screenshot(path=str(tmp_path / "jupyterlab-phase03.png"), full_page=True)
        body = json.loads(record.read_text())
        assert body["status"] == "completed"
        applied = [p for p in body["data"]["plans"] if p["applied"] and p["plan"]["action"] != "destroy"]
        assert applied and all(p["method"] == "widget" for p in applied)
        assert {g["verdict"] for g in body["data"]["gates"]} == {"PASS"}
        assert "Traceback" not in cells.nth(5).inner_text()
        assert (tmp_path / "jupyterlab-phase03.png").read_bytes()[:4] == b"\x89PNG"
        page.close()
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        try:
            lab.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(lab.pid, signal.SIGKILL)
            lab.wait()
        log.close()
