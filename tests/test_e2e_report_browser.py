"""The HTML report is safe to open: it refuses a run that does not verify (or stamps every section
with what failed, when asked), sanitizes every output, and its Content-Security-Policy forbids all
script. Opened in a real headless Chromium (Debian's ``chromium`` package, driven by Playwright;
as root it needs ``--no-sandbox``)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import nbformat
import pytest

from runbook_lib import report
from runbook_lib.cli import main as cli_main
from runbook_lib.runner import RunResult
from runbook_lib.verify import verify_run

from .conftest import reseal as reseal_run

pytestmark = pytest.mark.e2e

HOSTILE = ("<img src='x' onerror=\"document.title='pwned';window.__pwned=1\">"
           "<svg onload=\"window.__pwned=2\"></svg>"
           "<script>window.__pwned=3</script>"
           "<a href=\"javascript:window.__pwned=4\">link</a><p>hostile output</p>")
"""An HTML output a workload could display: three ways to run script without a click, one with."""


@pytest.fixture
def sealed_run(inference_go_run: RunResult) -> Path:
    """The session's sealed demo migration (conftest.py's ``inference_go_run``); cases copy it."""
    assert inference_go_run.run_dir is not None and (inference_go_run.run_dir / "_SUCCESS").exists()
    return inference_go_run.run_dir


def _with_hostile_output(run: Path, dest: Path, *, reseal: bool) -> Path:
    """A copy of ``run`` whose phase 04 notebook shows :data:`HOSTILE`; with ``reseal`` the
    manifest vouches for the changed notebook (as if the output had been there when it was sealed)."""
    shutil.copytree(run, dest)
    nb_path = dest / "04_compare_production.ipynb"
    nb = nbformat.read(nb_path, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and c.get("outputs"))
    cell.outputs.append(nbformat.v4.new_output("display_data", data={"text/html": HOSTILE, "text/plain": "x"}))
    nbformat.write(nb, nb_path)
    if reseal:
        reseal_run(dest)
    return dest


def _open(browser: Any, page_path: Path, shot: Path) -> dict[str, Any]:
    """Load ``page_path``, try the one handler that needs a click, and report what ran."""
    page = browser.new_page()
    violations: list[str] = []
    page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
    page.goto(page_path.as_uri())
    page.wait_for_load_state("load")
    page.wait_for_timeout(300)
    for link in page.locator("a[href^='javascript:']").all():
        link.click()
    page.screenshot(path=str(shot), full_page=False)
    out = {"title": page.title(), "pwned": page.evaluate("() => window.__pwned === undefined ? null : window.__pwned"),
           "images": page.locator("img[src^='data:image/png']").count(), "violations": violations}
    page.close()
    return out


@pytest.mark.measure  # reads the shared GO run, a judged migration
@pytest.mark.usefixtures("beside_untimed_phases")  # Chromium renders while no phase is timed
def test_a_verified_report_sanitizes_every_output_and_runs_no_script(sealed_run: Path, browser: Any,
                                                                     tmp_path: Path) -> None:
    run = _with_hostile_output(sealed_run, tmp_path / "run", reseal=True)
    assert all(r["status"] == "intact" for r in verify_run(run))
    out = tmp_path / "report.html"
    assert cli_main(["report", str(run), "-o", str(out)]) == 0
    html = out.read_text()
    assert "hostile output" in html  # the output is shown, as text and safe tags
    assert "onerror" not in html and "onload" not in html and "javascript:" not in html and "<script" not in html
    assert f'content="{report.CSP}"' in html and "UNVERIFIED" not in html
    seen = _open(browser, out, tmp_path / "report.png")
    assert seen["pwned"] is None and seen["title"] != "pwned"
    assert seen["images"] >= 3  # the plots still render under the policy
    assert (tmp_path / "report.png").stat().st_size > 0


@pytest.mark.usefixtures("beside_untimed_phases")
def test_the_policy_alone_stops_markup_the_sanitizer_might_miss(browser: Any, tmp_path: Path) -> None:
    page = tmp_path / "csp.html"  # the report's own policy around raw hostile markup, unsanitized
    page.write_text(f"<!DOCTYPE html><html><head><meta http-equiv='Content-Security-Policy' content=\"{report.CSP}\">"
                    f"</head><body>{HOSTILE}</body></html>")
    seen = _open(browser, page, tmp_path / "csp.png")
    assert seen["pwned"] is None and seen["title"] != "pwned"
    assert seen["violations"], "Chromium reported no blocked script: the policy was not applied"
    control = tmp_path / "control.html"  # and the same markup without the policy does run: the check can fail
    control.write_text(f"<!DOCTYPE html><html><body>{HOSTILE}</body></html>")
    assert _open(browser, control, tmp_path / "control.png")["pwned"] is not None


@pytest.mark.measure  # reads the shared GO run, a judged migration
@pytest.mark.usefixtures("beside_untimed_phases")
def test_a_run_that_does_not_verify_gets_no_report_unless_stamped(sealed_run: Path, browser: Any, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    run = _with_hostile_output(sealed_run, tmp_path / "run", reseal=False)
    out = tmp_path / "report.html"
    assert cli_main(["report", str(run), "-o", str(out)]) == 1  # as `runbook verify` exits (README)
    assert not out.exists()
    assert "04_compare_production.ipynb: altered" in capsys.readouterr().err
    assert cli_main(["report", str(run), "-o", str(out), "--allow-unverified"]) == 0
    html = out.read_text()
    sections = html.count("<section ")
    assert sections == 6 and html.count("UNVERIFIED EVIDENCE") == sections + 1  # the top and every section
    assert "04_compare_production.ipynb: altered" in html
    seen = _open(browser, out, tmp_path / "stamped.png")
    assert seen["pwned"] is None
