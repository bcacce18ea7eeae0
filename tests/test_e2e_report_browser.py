"""The HTML report is safe to open: it refuses a run that does not verify (or stamps every section
with what failed, when asked), sanitizes every output, and its Content-Security-Policy forbids all
script. Opened in a real headless Chromium (Debian's ``chromium`` package, driven by Playwright;
as root it needs ``--no-sandbox``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest

from runbook_lib.audit.verify import verify_run
from runbook_lib.cli import main as cli_main
from runbook_lib.evidence import report
from runbook_lib.run.runner import RunResult

from .conftest import CHROMIUM
from .conftest import reseal as reseal_run

pytestmark = pytest.mark.e2e

HOSTILE = ("<img src='x' onerror=\"document.title='pwned';window.__pwned=1\">"
           "<svg onload=\"window.__pwned=2\"></svg>"
           "<script>window.__pwned=3</script>"
           "<a href=\"javascript:window.__pwned=4\">link</a><p>hostile output</p>")
"""An HTML output a workload could display: three ways to run script without a click, one with."""
HOSTILE_CSS = ("<style>h1,h2,h3{color:red!important;font-size:40px!important} #runbook-head{display:none}"
               "#runbook-first-page{visibility:hidden} body{background:black}</style>"
               "<div style='position:fixed;top:0;left:0;width:100%;height:100%;background:white;z-index:9'>cover</div>"
               "<h1 id='runbook-head' class='decision' style='color:green'>Decision: GO</h1>")
"""An output that tries to restyle, hide or cover the report's own page."""
STYLED = ("#runbook-head h1", "#runbook-first-page .decision", "#runbook-first-page h3", "section.phase h2", "body")
PROPERTIES = ("color", "background-color", "font-size", "display", "visibility", "position")


@pytest.fixture
def sealed_run(inference_go_run: RunResult) -> Path:
    """The session's sealed demo migration (conftest.py's ``inference_go_run``); cases copy it."""
    assert inference_go_run.run_dir is not None and (inference_go_run.run_dir / "_SUCCESS").exists()
    return inference_go_run.run_dir


def _with_hostile_output(run: Path, dest: Path, *, reseal: bool, markup: str = HOSTILE) -> Path:
    """A copy of ``run`` whose phase 04 notebook shows ``markup``; with ``reseal`` the manifest
    vouches for the changed notebook (as if the output had been there when it was sealed)."""
    shutil.copytree(run, dest)
    nb_path = dest / "04_compare_production.ipynb"
    nb = nbformat.read(nb_path, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and c.get("outputs"))
    cell.outputs.append(nbformat.v4.new_output("display_data", data={"text/html": markup, "text/plain": "x"}))
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


def _styles(browser: Any, page_path: Path) -> dict[str, Any]:
    """The computed style of the report's own heading, first page and section titles
    (:data:`STYLED`, :data:`PROPERTIES`), and where its header box lies, as Chromium renders them."""
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.goto(page_path.as_uri())
    page.wait_for_load_state("load")
    out = page.evaluate("""([selectors, props]) => Object.fromEntries(selectors.map(sel => {
        const el = document.querySelector(sel);
        if (!el) return [sel, null];
        const cs = getComputedStyle(el);
        return [sel, Object.fromEntries(props.map(p => [p, cs.getPropertyValue(p)]))];
    }))""", [list(STYLED), list(PROPERTIES)])
    box = page.locator("#runbook-head").bounding_box()
    top = page.evaluate("() => { const e = document.elementFromPoint(100, 40); return e && e.closest('#runbook-head') !== null; }")
    page.close()
    return {"styles": out, "head_box": box, "head_on_top": top}


@pytest.mark.measure  # reads the shared GO run, a judged migration
@pytest.mark.usefixtures("beside_untimed_phases")
def test_hostile_css_in_an_output_leaves_the_reports_own_page_styled_as_a_clean_runs(
        sealed_run: Path, browser: Any, tmp_path: Path) -> None:
    clean, hostile = tmp_path / "clean.html", tmp_path / "hostile.html"
    resealed = tmp_path / "clean-run"  # resealed as the hostile copy is (unsigned after it), nothing added
    shutil.copytree(sealed_run, resealed)
    reseal_run(resealed)
    assert cli_main(["report", str(resealed), "-o", str(clean)]) == 0
    run = _with_hostile_output(sealed_run, tmp_path / "run", reseal=True, markup=HOSTILE_CSS)
    assert cli_main(["report", str(run), "-o", str(hostile)]) == 0
    assert "cover" in hostile.read_text()  # the output is there, as text
    seen, want = _styles(browser, hostile), _styles(browser, clean)
    assert all(want["styles"][sel] for sel in STYLED), want  # every styled part exists on the clean page
    assert seen == want
    assert want["head_on_top"] and want["styles"]["#runbook-first-page .decision"]["visibility"] == "visible"


@pytest.mark.measure  # reads the shared GO run, a judged migration
@pytest.mark.usefixtures("beside_untimed_phases")
def test_the_report_prints_to_a_pdf_that_opens_with_its_decision_on_the_first_page(
        sealed_run: Path, tmp_path: Path) -> None:
    pdftotext = shutil.which("pdftotext")
    for need, what in ((pdftotext, "pdftotext (Debian poppler-utils)"), (Path(CHROMIUM).exists(), CHROMIUM)):
        if not need:
            (pytest.fail if os.environ.get("CI") else pytest.skip)(f"{what} is missing; `make browser` installs it "
                                                                  "as root")
    out = tmp_path / "report.html"
    env = {k: v for k, v in os.environ.items() if k != "RUNBOOK_CHROMIUM"}
    done = subprocess.run([str(Path(sys.executable).parent / "runbook"), "report", str(sealed_run), "-o", str(out),
                           "--pdf", "--chromium", CHROMIUM], capture_output=True, text=True, env=env, timeout=300)
    pdf = tmp_path / "report.pdf"
    assert done.returncode == 0 and f"pdf: {pdf}" in done.stdout, done.stderr[-2000:]
    assert pdf.read_bytes()[:5] == b"%PDF-"
    first = subprocess.run([str(pdftotext), "-f", "1", "-l", "1", "-layout", str(pdf), "-"], capture_output=True,
                           text=True, check=True).stdout
    assert "Decision: GO" in first and "Acceptance deltas" in first and "latency_p95_ratio" in first
    pages = int(re.search(r"page 1 of (\d+)", first).group(1))  # type: ignore[union-attr]
    assert pages > 2 and "Phase 01" not in first  # the decision page stands alone; the phases follow it
    everything = subprocess.run([str(pdftotext), str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    assert "Phase 06" in everything and f"page {pages} of {pages}" in everything


@pytest.mark.measure  # reads the shared GO run, a judged migration
@pytest.mark.usefixtures("beside_untimed_phases")
def test_the_demo_report_reads_as_an_audit_in_chromium(sealed_run: Path, browser: Any, tmp_path: Path) -> None:
    # What an auditor sees in the first screen and in every table: the decision; no Styler CSS as
    # text; no table cut off (one wider than its box scrolls inside it); no number in exponent form; no
    # table numbered by row instead of labelled.
    out = tmp_path / "report.html"
    assert cli_main(["report", str(sealed_run), "-o", str(out)]) == 0
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.goto(out.as_uri())
    page.wait_for_load_state("load")
    seen = page.evaluate("""() => {
        const text = document.body.innerText;
        const decision = document.querySelector('#runbook-first-page .decision');
        const box = decision ? decision.getBoundingClientRect() : null;
        const clipped = [];
        for (const t of document.querySelectorAll('table')) {
            let el = t.parentElement, scrolls = false;
            for (; el && el !== document.body; el = el.parentElement) {
                const ox = getComputedStyle(el).overflowX;
                if (t.scrollWidth > el.clientWidth + 1) {
                    if (ox === 'auto' || ox === 'scroll') { scrolls = true; break; }
                    if (ox === 'hidden' || ox === 'clip') break;
                }
            }
            if (!scrolls && t.getBoundingClientRect().right > document.documentElement.clientWidth + 1)
                clipped.push(t.innerText.slice(0, 80));
        }
        const numbered = [];  // a table whose first column is row numbers 0..n-1 (no labels)
        for (const t of document.querySelectorAll('table')) {
            const first = [...t.querySelectorAll('tbody tr')].map(r => (r.cells[0] || {}).innerText);
            if (first.length > 1 && first.every((x, i) => (x || '').trim() === String(i)))
                numbered.push(t.innerText.slice(0, 80));
        }
        const cells = [...document.querySelectorAll('td')].map(td => td.innerText.trim());
        return {styler: (text.match(/#T_[0-9a-f]+_row\\d+_col\\d+/g) || []).length,
                decision: decision ? decision.innerText : null, top: box ? box.top : null,
                bottom: box ? box.bottom : null, clipped, numbered,
                exponents: cells.filter(c => /^-?\\d+(\\.\\d+)?e[+-]\\d+$/i.test(c)).slice(0, 5)};
    }""")
    page.screenshot(path=str(tmp_path / "first-screen.png"))
    page.close()
    assert seen["styler"] == 0, seen
    assert seen["decision"] and seen["decision"].startswith("Decision: GO") and 0 <= seen["top"] < seen["bottom"] <= 900
    assert seen["clipped"] == [], seen["clipped"]
    assert seen["exponents"] == [], seen["exponents"]
    assert seen["numbered"] == [], seen["numbered"]  # row labels, never bare row numbers
