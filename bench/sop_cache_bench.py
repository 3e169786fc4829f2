"""Does the compiled-SOP disk cache (engine/compile/cache.py) earn its keep?

Issue 23: it stays only if it saves at least 5% of a run. The software company's team run on
the widened fake (bench.compare's child), each in a fresh process, alternating with the
compiled-SOP entries on and off (the rest of the on-disk cache, templates' code and schema
checks, stays on in both): at 200 ms per call (a run as the bench runs it; a hosted model is
slower, which only shrinks the share) and at 0 ms (the engine alone).

    python -m bench.sop_cache_bench [--reps N]
"""
from __future__ import annotations

import argparse
import statistics
from typing import Any

from bench.compare import SOP, run_sopctl

TARGET_SAVING = 0.05


def _stats(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def measure(reps: int, files: int = 10, latencies: tuple[float, ...] = (200.0, 0.0)) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for latency in latencies:
        on: list[float] = []
        off: list[float] = []
        for _ in range(reps):
            on.append(run_sopctl(files, latency, SOP)["run_s"])
            off.append(run_sopctl(files, latency, SOP, sop_cache=False)["run_s"])
        saving = [1 - a / b for a, b in zip(on, off, strict=True)]
        out[f"{latency:g}"] = {"on": _stats(on), "off": _stats(off), "saving": _stats(saving)}
    return out


def markdown(res: dict[str, Any], reps: int) -> str:
    rows = ["| latency | run with the cache | without | share of the run saved | target |", "|---|---|---|---|---|"]
    for latency, r in res.items():
        fmt = "{median:.3f} s ({min:.3f}-{max:.3f})"
        s = r["saving"]
        target = f">= {TARGET_SAVING:.0%} to keep it" if latency == "200" else ""
        rows.append(f"| {latency} ms | {fmt.format(**r['on'])} | {fmt.format(**r['off'])} | "
                    f"**{s['median']:.1%}** ({s['min']:.1%} to {s['max']:.1%}) | {target} |")
    return (f"Software company, 10 files, fresh process per run, {reps} repetitions alternating; "
            "medians (min-max).\n\n" + "\n".join(rows) + "\n")


def main(size_factor: float = 1.0, reps: int | None = None) -> dict[str, Any]:
    reps = reps or max(1, round(5 * size_factor))
    res = measure(reps)
    text = markdown(res, reps)
    print(text)
    saved = res["200"]["saving"]["median"]
    return {"figures": res, "ratio": 1 - saved, "markdown": text,
            "ratio_label": "team run at 200 ms with the compiled-SOP cache / without"}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    main(reps=ap.parse_args().reps)
