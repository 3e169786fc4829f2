"""The journal's overhead: a run's wall time with the journal / the same run without it.

Runs `sops/software_company.sop.yaml` on `fake` in-process (compiling once), alternating
runs without and with the journal so that both see the same machine state, at 0 ms and at
200 ms model latency (`SOPCTL_FAKE_LATENCY_MS`). Three variants are timed:

- `none`: no journal at all (the baseline);
- `journal`: the default, group commit: one fsync per action step (each answer with the
  events before it, fsynced before it is used; a step's start and end committed without
  an fsync; the run's end fsynced);
- `full`: `SOPCTL_JOURNAL_SYNC=full`, every event committed and fsynced on its own (the
  default before group commit).

At 0 ms the model costs nothing, so the ratio is the worst case: nearly all of it is the
disk's fsync latency. At 200 ms (still faster than any hosted model) it shows what a user
pays. Figures are medians over the repetitions; ratios are to `none` in the same run.

    python -m bench.journal_bench
    python -c "from bench.journal_bench import main; main(size_factor=0.05)"   # smoke
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

__all__ = ["main"]

SOP = Path(__file__).resolve().parent.parent / "sops" / "software_company.sop.yaml"
VARIANTS = ("none", "journal", "full")
LATENCIES_MS = (0, 200)


class _Clock:
    """Counts the run's events and notes when it starts (after its journal is created)."""

    def __init__(self) -> None:
        self.started = 0.0
        self.events = 0

    def on_event(self, event: Any) -> None:
        self.events += 1
        if type(event).__name__ == "RunStarted":
            self.started = time.perf_counter()


def _one_run(compiled: Any, variant: str, root: Path) -> tuple[float, int]:
    """Wall seconds of one whole run from its start (journal creation excluded: a one-time
    cost per run, reported by `bench.compare`), and the events it journaled."""
    from engine import api
    from engine.journal.store import SYNC_ENV

    ws = Path(tempfile.mkdtemp(dir=root))
    os.environ[SYNC_ENV] = "full" if variant == "full" else ""
    clock = _Clock()
    result = api.run(compiled, {"idea": "a command-line 2048 game"}, model="fake",
                     workspace=str(ws), allow_exec=True, observers=[clock],
                     journal=variant != "none")
    seconds = time.perf_counter() - clock.started
    shutil.rmtree(ws, ignore_errors=True)
    if result.status != "idle":
        raise RuntimeError(f"bench run ended {result.status}: {result.error}")
    return seconds, clock.events if variant != "none" else 0


def _measure(compiled: Any, latency_ms: int, reps: int, root: Path) -> dict[str, Any]:
    """Median wall time per variant at one latency, variants interleaved per repetition."""
    os.environ["SOPCTL_FAKE_LATENCY_MS"] = str(latency_ms)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    events = 0
    _one_run(compiled, "none", root)                  # warm-up: imports, caches
    for _ in range(reps):
        for variant in VARIANTS:
            seconds, count = _one_run(compiled, variant, root)
            times[variant].append(seconds)
            events = max(events, count)
    medians = {v: statistics.median(t) for v, t in times.items()}
    return {"latency_ms": latency_ms, "reps": reps, "events": events,
            "seconds": medians, "ratio": {v: medians[v] / medians["none"] for v in VARIANTS}}


def _markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| latency | runs | events | no journal (s) | journal (s) | ratio | "
             "every event fsynced (s) | ratio |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s, q = r["seconds"], r["ratio"]
        lines.append(f"| {r['latency_ms']} ms | {r['reps']} | {r['events']} | {s['none']:.3f} | "
                     f"{s['journal']:.3f} | **{q['journal']:.2f}** | "
                     f"{s['full']:.3f} | {q['full']:.2f} |")
    lines += ["", "Ratio = median wall time of the run with the journal / without it, same "
              "process, interleaved. At 0 ms nearly all of the difference is fsync latency "
              "of this machine's disk; it is paid once per action step (with its answer), not per event."]
    return "\n".join(lines)


def main(size_factor: float = 1.0, latencies_ms: tuple[int, int] = LATENCIES_MS) -> dict[str, Any]:
    """Measure, print a table, return the figures (`ratio`: the default journal at 200 ms)."""
    from engine.api import load

    saved = {k: os.environ.get(k) for k in ("SOPCTL_FAKE_LATENCY_MS", "SOPCTL_JOURNAL_SYNC")}
    compiled = load(SOP)
    root = Path(tempfile.mkdtemp(prefix="journal-bench-"))
    try:
        fast, slow = latencies_ms
        rows = [_measure(compiled, fast, max(2, round(15 * size_factor)), root),
                _measure(compiled, slow, max(1, round(3 * size_factor)), root)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    table = _markdown(rows)
    print(table)
    return {"ratio": rows[1]["ratio"]["journal"], "ratio_at_0ms": rows[0]["ratio"]["journal"], "rows": rows, "markdown": table}


if __name__ == "__main__":
    main()
