"""The HTML report opened in a real browser: headless Chromium driven by Playwright.

Chromium is Debian's package (`apt-get install chromium`); Playwright's own browser download
is never used (`executable_path` points at the system's). Where either is missing (a CI
machine has only what the project's files install) these tests are skipped, and say why.
The screenshot is kept under tests/artifacts/ (ignored by git) and in pytest's tmp folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.compile.compiler import check_path
from engine.cli.commands import main
from engine.journal.history import read_run

from run_helpers import ROOT, TESTS

COMPANY = ROOT / "sops" / "software_company.sop.yaml"
ARTIFACTS = TESTS / "artifacts"
CHROMIUM = os.environ.get("SOPCTL_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright for Python is not installed "
                               "(pip install playwright; its browser download is not needed)")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine "
                                "(apt-get install chromium, or set SOPCTL_CHROMIUM): browser test skipped")


@pytest.fixture(scope="module")
def company_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The software company's run on `fake` (its idea is markup) and its report."""
    root = tmp_path_factory.mktemp("browser")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOPCTL_")}
    env["SOPCTL_FAKE_LATENCY_MS"] = "20"           # calls that take time: the in-flight strip shows
    done = subprocess.run([sys.executable, "-m", "engine.cli", "run", str(COMPANY), "--idea",
                           "<script>window.pwned=1</script> a 2048 game", "--model", "fake",
                           "--out", str(root / "company")], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    out = root / "company.html"
    assert main(["report", str(root / "company"), "-o", str(out)]) == 0
    return root / "company", out


def test_report_opens_in_chromium(company_report: tuple[Path, Path], tmp_path: Path) -> None:
    run_dir, html = company_report
    state = read_run(run_dir)
    graph = check_path(COMPANY).graph
    assert graph is not None
    errors: list[str] = []
    requests: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(html.as_uri(), wait_until="load")

            assert errors == []                    # CSP refusals and script errors land here
            assert requests == [html.as_uri()]     # nothing else is fetched
            assert page.evaluate("typeof window.pwned") == "undefined"
            _graph_is_drawn(page, set(graph.nodes))
            bars = page.locator("#timeline-svg rect.bar")
            assert bars.count() == len(state.timeline) == 7
            for i in range(bars.count()):
                box = bars.nth(i).bounding_box()
                assert box is not None and box["width"] >= 2 and box["height"] > 0
            assert page.locator("#timeline-svg path.flight").count() == 1
            _layout_uses_the_page(page)

            bars.nth(3).click()                    # a bar opens its action run's details
            assert page.locator("#run-3").evaluate("d => d.open") is True
            assert page.locator("#run-3").evaluate("d => d.classList.contains('focus')") is True

            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(shot, ARTIFACTS / "report_software_company.png")
    assert errors == []


def _graph_is_drawn(page: sync_api.Page, nodes: set[str]) -> None:
    """Every role and action is an SVG group with a visible box and its label."""
    drawn = page.locator("#graph-svg g.node")
    assert drawn.count() == len(nodes)
    assert {drawn.nth(i).get_attribute("data-node") for i in range(drawn.count())} == nodes
    for i in range(drawn.count()):
        box = drawn.nth(i).locator("rect").bounding_box()
        assert box is not None and box["width"] > 20 and box["height"] > 10
    assert page.locator("#graph-svg path.edge").count() > 0


def _layout_uses_the_page(page: sync_api.Page) -> None:
    """The graph (the company's chain, wrapped into columns) takes most of the page's width,
    not a narrow strip; each bar label is drawn inside its bar."""
    section, svg = page.locator("#graph").bounding_box(), page.locator("#graph-svg").bounding_box()
    assert section is not None and svg is not None
    assert svg["width"] >= 0.5 * section["width"] and svg["height"] < svg["width"]
    outside = page.evaluate("""() => Array.from(document.querySelectorAll('#timeline-svg text.bar-label'))
        .filter(t => { const b = t.previousElementSibling.getBoundingClientRect(),
                             r = t.getBoundingClientRect();
                       return r.left < b.left - 0.5 || r.right > b.right + 0.5; })
        .map(t => t.textContent)""")
    assert page.locator("#timeline-svg text.bar-label").count() > 0 and outside == []
