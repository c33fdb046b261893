"""The report and an executed analysis notebook's HTML export, opened in headless Chromium with the
network blocked: every figure renders as SVG, nothing is requested, no console error.

Needs Debian's ``chromium`` and Playwright for Python (``.ci/install-browser.sh``); skipped without them,
except under CI or KANLIB_REQUIRE_BROWSER=1, where their absence fails the test.
"""

import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_notebooks import executed_analysis, kernel_imports_this_checkout  # noqa: E402,F401

from kanlib import front, guidelines, report  # noqa: E402
from runners import notebook  # noqa: E402

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser():
    required = bool(os.environ.get("CI") or os.environ.get("KANLIB_REQUIRE_BROWSER"))
    exe = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if exe is None or sync_playwright is None:
        why = "no chromium on PATH" if exe is None else "playwright is not installed"
        (pytest.fail if required else pytest.skip)(f"{why} (run .ci/install-browser.sh)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


def open_offline(browser, path: str) -> dict:
    """Load ``path`` with every non-file request aborted; what was requested, logged and drawn."""
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    requested, errors = [], []

    def route(r):
        url = r.request.url
        if url.startswith(("file:", "data:", "blob:", "about:")):
            r.continue_()
        else:
            requested.append(url)
            r.abort()

    page.route("**/*", route)
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto("file://" + os.path.abspath(path), wait_until="load")
    page.wait_for_function("() => window.Plotly !== undefined", timeout=30_000)
    # each figure draws into a .js-plotly-plot; give every one time to get its SVG
    page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')]"
                           ".every(d => d.querySelector('svg.main-svg'))", timeout=60_000)
    n_plots = page.locator(".js-plotly-plot").count()
    n_svg = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')]"
                          ".filter(d => d.querySelector('svg.main-svg') && d.querySelector('.trace')).length")
    n_points = page.evaluate("() => document.querySelectorAll('.js-plotly-plot .scatterlayer .point').length")
    page.close()
    return {"requested": requested, "errors": errors, "plots": n_plots, "svg": n_svg, "points": n_points}


def offline_page(browser, path: str, width: int, height: int):
    """``path`` opened at ``width`` x ``height`` with every request but local files aborted."""
    page = browser.new_page(viewport={"width": width, "height": height})
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(("file:", "data:", "blob:", "about:"))
               else r.abort())
    page.goto("file://" + os.path.abspath(path), wait_until="load")
    return page


def test_report_renders_offline_in_chromium(browser, full_study_dir):
    path = report.build_report(str(full_study_dir), guidelines=guidelines.from_out_dir(str(full_study_dir)))
    seen = open_offline(browser, path)
    n_figures = sum(len(a.figures) for a in report.analyses(str(full_study_dir)).values())
    assert n_figures >= 14  # every study, the calibration, the options, FSDP, the published setup, extrapolation
    n_figures += 1  # the advisor's what-if on other links (kanlib.advise.report_section)
    assert seen["plots"] == n_figures and seen["svg"] == n_figures
    assert seen["points"] > 20
    assert seen["requested"] == [] and seen["errors"] == []


def test_executed_analysis_notebook_export_renders_offline_in_chromium(browser, tmp_path):
    done, _ = executed_analysis(tmp_path)
    page = notebook.export_html(str(done), str(tmp_path / "01_strong_scaling_analysis.html"))
    seen = open_offline(browser, page)
    assert seen["plots"] == 2 and seen["svg"] == 2  # the figure and the explorer's static copy
    assert seen["requested"] == [] and seen["errors"] == []


def test_front_page_has_one_verdict_row_per_published_claim_in_chromium(browser, full_study_dir, tmp_path):
    """The report's first screen in a real browser: the verdict table with one row per published claim, each with
    a verdict of the four, the project's own findings and the machine, all within the first 1300x1000 screen's
    reach of the top (a screenshot is kept for the closing note when KANLIB_SCREENSHOTS names a folder)."""
    path = report.build_report(str(full_study_dir), guidelines=guidelines.from_out_dir(str(full_study_dir)))
    page = offline_page(browser, path, 1300, 1000)
    rows = page.locator("#verdicts tr.verdict")
    assert rows.count() == len(front.published_claims())
    claims = [rows.nth(i).locator("td").nth(0).inner_text() for i in range(rows.count())]
    assert claims == [c.title for c in front.published_claims()]
    verdicts = [rows.nth(i).locator("td").nth(2).inner_text() for i in range(rows.count())]
    assert all(v in front.VERDICTS for v in verdicts)
    assert page.locator("#own-findings tr").count() >= 2 and page.locator("#machine").is_visible()
    assert page.locator("#verdicts").bounding_box()["y"] < 1000  # on the first screen
    shots = os.environ.get("KANLIB_SCREENSHOTS")
    if shots:
        os.makedirs(shots, exist_ok=True)
        page.screenshot(path=os.path.join(shots, "front_page_browser_test.png"))
    page.close()


def test_the_first_screen_holds_the_bottom_line_and_the_page_is_short_with_sections_folded(browser, full_study_dir):
    """Issue 36.1/5: at 1366x768 the first screen holds the bottom line (the machine, what it decides, the GPU
    path's status) and the verdicts begin on it; a table of contents links every section; with every section folded
    the page is at most 12 screens; opening a section from the contents shows its figures, each with a y-axis
    title."""
    path = report.build_report(str(full_study_dir), guidelines=guidelines.from_out_dir(str(full_study_dir)))
    page = offline_page(browser, path, 1366, 768)
    bottom = page.locator("#bottom-line")
    box = bottom.bounding_box()
    assert box and box["y"] + box["height"] <= 768, box
    text = bottom.inner_text()
    assert "CPU" in text and "has not run on a GPU" in text and "[min, max]" in text
    assert page.locator("#verdicts").bounding_box()["y"] < 768
    anchors = page.evaluate("() => [...document.querySelectorAll('section')].map(s => s.id)")
    links = page.evaluate("() => [...document.querySelectorAll('nav#toc a')].map(a => a.getAttribute('href'))")
    assert links == [f"#{a}" for a in anchors] and len(anchors) >= 10
    height = page.evaluate("() => document.documentElement.scrollHeight")
    assert height <= 12 * 768, height
    page.locator("nav#toc a[href='#strong_scaling']").click()
    page.wait_for_function("() => document.querySelector('#strong_scaling details').open")
    plots = page.locator("#strong_scaling .js-plotly-plot")
    assert plots.count() >= 1
    for i in range(plots.count()):
        titles = plots.nth(i).evaluate("p => (p.layout ? Object.keys(p.layout).filter(k => k.startsWith('yaxis'))"
                                       ".map(k => (p.layout[k].title || {}).text || '') : [])")
        assert titles and all(t.strip() for t in titles), titles
    page.close()
