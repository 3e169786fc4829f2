"""The journal's overhead: a run's wall time with the journal / the same run without it.

Runs `sops/software_company.sop.yaml` on `fake` in-process (compiling once), alternating
runs without and with the journal so that both see the same machine state, at 0 ms and at
200 ms model latency (`SOPCTL_FAKE_LATENCY_MS`). Five variants are timed:

- `none`: no journal at all (the baseline);
- `journal`: the default, group commit with a background fsync: each answer committed
  without an fsync (with the events before it), a syncer thread fsyncs the WAL, and the
  durability barrier waits for it only before the next paid request, command, tool that
  acts outside or person (a step's start and end ride along; the run's end fsynced);
- `nofsync`: the same with the syncer's fsync a no-op and no barrier: what the journal
  costs without any disk wait (the lower bound `journal` approaches);
- `answer`: `SOPCTL_JOURNAL_SYNC=answer`, each answer fsynced before `record` returns, on
  the event loop (the default before the background syncer);
- `full`: `SOPCTL_JOURNAL_SYNC=full`, every event committed and fsynced on its own.

At 0 ms the model costs nothing, so the ratio is the worst case: nearly all of it is the
disk's fsync latency (for `journal`: whatever of it the engine's own work between an answer
and the next request does not hide). At 200 ms (still faster than any hosted model) it shows
what a user pays. Figures are medians over the repetitions; ratios are to `none` in the same
run. `fsyncs/answer` is the syncer's fsyncs per paid answer in the `journal` runs (below 1:
answers of a fan-out shared an fsync).

A virtual disk's flush latency can swing from 0.1 ms to 4 ms within minutes, so the table
says what an fdatasync cost while it ran, and `--fsync-ms N` makes every fsync of the
syncer's code path (`journal`, and `answer`'s inline one) take at least N ms (a sleep
before the real one, which like the real one releases the GIL), to compare the modes on a
disk as slow as N whatever this one does meanwhile; `full`'s fsyncs are SQLite's own and
stay real.

    python -m bench.journal_bench
    python -m bench.journal_bench --fsync-ms 3.2     # as on a disk whose fsync takes 3.2 ms
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
VARIANTS = ("none", "journal", "nofsync", "answer", "full")
LATENCIES_MS = (0, 200)


class _Clock:
    """Counts the run's events and paid answers, and notes when it starts (after its
    journal is created)."""

    def __init__(self) -> None:
        self.started = 0.0
        self.events = 0
        self.answers = 0

    def on_event(self, event: Any) -> None:
        self.events += 1
        kind = type(event).__name__
        if kind == "RunStarted":
            self.started = time.perf_counter()
        elif kind == "ModelAnswered" and not getattr(event, "reused", False):
            self.answers += 1


class _Disk:
    """The syncer's fsync, counted, or made a no-op (the `nofsync` variant)."""

    def __init__(self, delay_ms: float = 0.0) -> None:
        from engine.journal import store, syncer

        self.store, self.syncer, self.real_sync = store, syncer, syncer.datasync
        self.real_durable = store.Journal.durable
        self.fsyncs = 0
        self.delay_s = delay_ms / 1000

    def set(self, variant: str) -> None:
        self.syncer.datasync = self._no_sync if variant == "nofsync" else self._counted
        self.store.Journal.durable = ((lambda journal: None) if variant == "nofsync"  # type: ignore[method-assign]
                                     else self.real_durable)

    def _counted(self, fd: int) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)
        self.real_sync(fd)
        self.fsyncs += 1

    def _no_sync(self, fd: int) -> None:
        pass

    def restore(self) -> None:
        self.syncer.datasync, self.store.Journal.durable = self.real_sync, self.real_durable  # type: ignore[method-assign]


def _one_run(compiled: Any, variant: str, root: Path, disk: _Disk) -> tuple[float, int, float]:
    """Wall seconds of one whole run from its start (journal creation excluded: a one-time
    cost per run, reported by `bench.compare`), the events it journaled, and the syncer's
    fsyncs per paid answer."""
    from engine import api
    from engine.journal.store import SYNC_ENV

    ws = Path(tempfile.mkdtemp(dir=root))
    os.environ[SYNC_ENV] = variant if variant in ("full", "answer") else ""
    disk.set(variant)
    fsyncs = disk.fsyncs
    clock = _Clock()
    result = api.run(compiled, {"idea": "a command-line 2048 game"}, api.RunOptions(model="fake",
                     workspace=str(ws), allow_exec=True, observers=[clock]), journal=variant != "none")
    seconds = time.perf_counter() - clock.started
    shutil.rmtree(ws, ignore_errors=True)
    if result.status != "idle":
        raise RuntimeError(f"bench run ended {result.status}: {result.error}")
    per_answer = (disk.fsyncs - fsyncs) / max(clock.answers, 1)
    return seconds, clock.events if variant != "none" else 0, per_answer


def _measure(compiled: Any, latency_ms: int, reps: int, root: Path, disk: _Disk) -> dict[str, Any]:
    """Median wall time per variant at one latency, variants interleaved per repetition."""
    os.environ["SOPCTL_FAKE_LATENCY_MS"] = str(latency_ms)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    events, shared = 0, []
    _one_run(compiled, "none", root, disk)            # warm-up: imports, caches
    for _ in range(reps):
        for variant in VARIANTS:
            seconds, count, per_answer = _one_run(compiled, variant, root, disk)
            times[variant].append(seconds)
            events = max(events, count)
            if variant == "journal":
                shared.append(per_answer)
    medians = {v: statistics.median(t) for v, t in times.items()}
    return {"latency_ms": latency_ms, "reps": reps, "events": events,
            "fsyncs_per_answer": statistics.median(shared),
            "seconds": medians, "ratio": {v: medians[v] / medians["none"] for v in VARIANTS}}


def fdatasync_ms(folder: Path, n: int = 30) -> float:
    """Median wall time of a 4 KiB append and its fdatasync in `folder`, now."""
    sync = getattr(os, "fdatasync", None) or os.fsync
    path = folder / "fsync-probe"
    handle = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    times = []
    try:
        for _ in range(n):
            os.write(handle, b"x" * 4096)
            started = time.perf_counter()
            sync(handle)
            times.append(time.perf_counter() - started)
    finally:
        os.close(handle)
        path.unlink()
    return 1000 * statistics.median(times)


_COLUMNS = (("journal", "journal, background fsync"), ("nofsync", "no fsync at all"),
            ("answer", "each answer fsynced inline"), ("full", "every event fsynced"))


def _markdown(rows: list[dict[str, Any]], disk_ms: tuple[float, float], delay_ms: float) -> str:
    head = "".join(f" {title} (s) | ratio |" for _, title in _COLUMNS)
    lines = [f"| latency | runs | events | fsyncs/answer | no journal (s) |{head}",
             "|---|---|---|---|---|" + "---|---|" * len(_COLUMNS)]
    for r in rows:
        s, q = r["seconds"], r["ratio"]
        cells = "".join(f" {s[v]:.3f} | {'**' if v == 'journal' else ''}{q[v]:.3f}"
                        f"{'**' if v == 'journal' else ''} |" for v, _ in _COLUMNS)
        lines.append(f"| {r['latency_ms']} ms | {r['reps']} | {r['events']} | "
                     f"{r['fsyncs_per_answer']:.2f} | {s['none']:.3f} |{cells}")
    made = f"; every fsync of `journal` and `answer` made to take {delay_ms:g} ms more" if delay_ms else ""
    lines += ["", f"This disk's fdatasync took {disk_ms[0]:.2f} ms before the runs and "
              f"{disk_ms[1]:.2f} ms after (median){made}.",
              "", "Ratio = median wall time of the run with the journal / without it, same "
              "process, interleaved. At 0 ms, `answer` pays one fsync of this machine's disk "
              "per paid answer on the event loop; `journal` pays only what of the background "
              "fsync the engine's work before the next request does not hide."]
    return "\n".join(lines)


def main(size_factor: float = 1.0, latencies_ms: tuple[int, int] = LATENCIES_MS,
         fsync_ms: float = 0.0) -> dict[str, Any]:
    """Measure, print a table, return the figures (`ratio`: the default journal at 200 ms).
    `fsync_ms`: make each of the syncer's fsyncs take that much longer (see above)."""
    from engine.api import load

    saved = {k: os.environ.get(k) for k in ("SOPCTL_FAKE_LATENCY_MS", "SOPCTL_JOURNAL_SYNC")}
    compiled = load(SOP)
    root = Path(tempfile.mkdtemp(prefix="journal-bench-"))
    disk = _Disk(fsync_ms)
    disk_ms = [fdatasync_ms(root)]
    try:
        fast, slow = latencies_ms
        rows = [_measure(compiled, fast, max(2, round(15 * size_factor)), root, disk),
                _measure(compiled, slow, max(1, round(3 * size_factor)), root, disk)]
        disk_ms.append(fdatasync_ms(root))
    finally:
        disk.restore()
        shutil.rmtree(root, ignore_errors=True)
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    table = _markdown(rows, (disk_ms[0], disk_ms[-1]), fsync_ms)
    print(table)
    return {"ratio": rows[1]["ratio"]["journal"], "ratio_at_0ms": rows[0]["ratio"]["journal"],
            "fdatasync_ms": disk_ms, "rows": rows, "markdown": table}


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="the journal's overhead, by durability mode")
    ap.add_argument("--fsync-ms", type=float, default=0.0,
                    help="make each fsync of the syncer's code path take this much longer")
    main(fsync_ms=ap.parse_args().fsync_ms)
