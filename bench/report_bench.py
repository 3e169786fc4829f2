"""The HTML report of a long run: its size and how long Chromium takes to open it.

A two-role loop on `fake` (each role answers the other, bounded by `max_runs`) runs 100
rounds, one action per round; `sopctl report` renders it. Measured: the time to render the
report (journal read included), the file's size (the target is under 2 MB), and the time
headless Chromium takes from navigation to the page's `load` event (the target is under
2 s), next to the same browser opening a blank page, in the same run. The browser part
needs Debian's Chromium and Playwright for Python; without them it is reported as not
measured. Nothing here is asserted: tests/test_bench_smoke.py only checks the figures exist.

    python -m bench.report_bench
    python -c "from bench.report_bench import main; main(size_factor=0.1)"   # smoke
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

__all__ = ["main", "loop_sop"]

SIZE_LIMIT_MB = 2.0
OPEN_LIMIT_S = 2.0


def loop_sop(rounds: int) -> str:
    """An SOP whose run takes `rounds` rounds: Ping and Pong answer each other, each bounded."""
    half = max(1, rounds // 2)
    return f"""apiVersion: sop/v1
name: ping_pong
inputs:
  idea: {{type: str, required: true}}
team:
  max_rounds: {rounds + 5}
actions:
  Ping:
    prompt: "Answer the latest point about {{{{ inputs.idea }}}} and add one."
    output: text
    max_runs: {half}
  Pong:
    prompt: "Rebut the latest point about {{{{ inputs.idea }}}}."
    output: text
    max_runs: {half}
roles:
  Alice:
    actions: [Ping]
    watch: [UserRequirement, Pong]
  Bob:
    actions: [Pong]
    watch: [Ping]
"""


def _run(folder: Path, rounds: int) -> Path:
    from engine.api import RunOptions, load, run

    sop = folder / "ping_pong.sop.yaml"
    sop.write_text(loop_sop(rounds), encoding="utf-8")
    workspace = folder / "run"
    result = run(load(sop), {"idea": "tabs against spaces"}, RunOptions(model="fake", workspace=str(workspace)))
    if result.status not in ("idle", "max_rounds"):
        raise RuntimeError(f"bench run ended {result.status}: {result.error}")
    return workspace


def _render(workspace: Path, out: Path) -> tuple[float, int, int]:
    """Seconds to read the journal and write the report; its bytes; the run's rounds."""
    from engine.cli.html_report import write_report
    from engine.journal.history import read_run

    t0 = time.perf_counter()
    state = read_run(workspace)
    write_report(state, out)
    return time.perf_counter() - t0, out.stat().st_size, state.rounds


def _open_times(pages: list[Path], reps: int) -> dict[str, list[float]] | None:
    """Seconds from navigation to `load` for each page, per repetition (None: no browser)."""
    chromium = os.environ.get("SOPCTL_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if chromium is None:
        return None
    times: dict[str, list[float]] = {p.name: [] for p in pages}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            for _ in range(reps + 1):              # the first round warms the browser up
                for page_path in pages:
                    page = browser.new_page()
                    t0 = time.perf_counter()
                    page.goto(page_path.as_uri(), wait_until="load")
                    times[page_path.name].append(time.perf_counter() - t0)
                    page.close()
        finally:
            browser.close()
    return {name: found[1:] for name, found in times.items()}


def main(size_factor: float = 1.0) -> dict[str, Any]:
    rounds = max(4, round(100 * size_factor))
    reps = max(1, round(5 * size_factor))
    folder = Path(tempfile.mkdtemp(prefix="report-bench-"))
    saved = os.environ.pop("SOPCTL_FAKE_LATENCY_MS", None)
    try:
        workspace = _run(folder, rounds)
        report = folder / "report.html"
        render_s, size, run_rounds = _render(workspace, report)
        blank = folder / "blank.html"
        blank.write_text("<!DOCTYPE html><title>blank</title>", encoding="utf-8")
        opened = _open_times([report, blank], reps)
    finally:
        if saved is not None:
            os.environ["SOPCTL_FAKE_LATENCY_MS"] = saved
        shutil.rmtree(folder, ignore_errors=True)
    figures: dict[str, Any] = {"rounds": run_rounds, "render_s": render_s, "size_mb": size / 1e6,
                               "size_ok": size / 1e6 < SIZE_LIMIT_MB}
    if opened is not None:
        figures["open_s"] = statistics.median(opened["report.html"])
        figures["blank_open_s"] = statistics.median(opened["blank.html"])
        figures["open_ok"] = figures["open_s"] < OPEN_LIMIT_S
    figures["markdown"] = _markdown(figures, reps)
    print(figures["markdown"])
    return figures


def _markdown(f: dict[str, Any], reps: int) -> str:
    opened = (f"| open in headless Chromium (navigation to `load`, median of {reps}) | "
              f"{f['open_s'] * 1000:.0f} ms (a blank page: {f['blank_open_s'] * 1000:.0f} ms) | "
              f"< {OPEN_LIMIT_S:g} s | {'yes' if f['open_ok'] else '**no**'} |"
              if "open_s" in f else
              "| open in headless Chromium | not measured: no Chromium or Playwright here | < 2 s | |")
    return "\n".join([
        f"`sopctl report` of a {f['rounds']}-round run (two roles answering each other on `fake`):",
        "",
        "| figure | value | target | met |",
        "|---|---|---|---|",
        f"| report size | {f['size_mb']:.3f} MB | < {SIZE_LIMIT_MB:g} MB | {'yes' if f['size_ok'] else '**no**'} |",
        f"| render (read the journal, write the file) | {f['render_s'] * 1000:.0f} ms | | |",
        opened,
    ])


if __name__ == "__main__":
    main()
