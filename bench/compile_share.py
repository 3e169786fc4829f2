"""What compiling the SOP costs of a run, and what the compiled-SOP cache saves of it.

The software company's team run on the widened fake (bench.compare's child), each in a fresh
process, alternating with the compiled-SOP entries of the on-disk cache off (the file loaded
and checked in full: an edited file's first run) and on (read back from the disk, as every
later run of an unchanged file): the seconds compiling takes against the whole run's, at
200 ms per call (a run as the bench runs it; a hosted model is slower, which only shrinks the
share) and at 0 ms (the engine alone: issue 28 counts CPU per call there, where compiling
was about a tenth of a fresh process's run; issue 23 had dropped the cache for being under
5% of a run at 200 ms).

    python -m bench.compile_share [--reps N]
"""
from __future__ import annotations

import argparse
from typing import Any

from bench.compare import SOP, run_sopctl, stats


def measure(reps: int, files: int = 10, latencies: tuple[float, ...] = (200.0, 0.0)) -> dict[str, Any]:
    out: dict[str, Any] = {}
    run_sopctl(files, latencies[0], SOP)          # the entry every later run of the file reads
    for latency in latencies:
        sides: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
        for _ in range(reps):
            for side in sides:
                sides[side].append(run_sopctl(files, latency, SOP, sop_cache=side == "on"))
        out[f"{latency:g}"] = {side: {"compile_s": stats([r["compile_s"] for r in runs]),
                                      "run_s": stats([r["run_s"] for r in runs]),
                                      "share": stats([r["compile_s"] / r["run_s"] for r in runs])}
                               for side, runs in sides.items()}
        out[f"{latency:g}"]["ratio"] = (out[f"{latency:g}"]["on"]["compile_s"]["median"]
                                        / out[f"{latency:g}"]["off"]["compile_s"]["median"])
    return out


def markdown(res: dict[str, Any], reps: int) -> str:
    rows = ["| latency | compiling the SOP | read from the cache | the whole run (cache on) | share of the run: "
            "compiling / read back |", "|---|---|---|---|---|"]
    seconds = "{median:.4f} s ({min:.4f}-{max:.4f})"
    for latency, r in res.items():
        off, on = r["off"], r["on"]
        rows.append(f"| {latency} ms | {seconds.format(**off['compile_s'])} | {seconds.format(**on['compile_s'])} | "
                    f"{seconds.format(**on['run_s'])} | **{off['share']['median']:.1%}** / "
                    f"**{on['share']['median']:.1%}** |")
    return (f"Software company, 10 files, a fresh process per run, {reps} repetitions each way, "
            "alternating; medians (min-max).\n\n" + "\n".join(rows) + "\n")


def main(size_factor: float = 1.0, reps: int | None = None) -> dict[str, Any]:
    reps = reps or max(1, round(5 * size_factor))
    res = measure(reps)
    text = markdown(res, reps)
    print(text)
    return {"figures": res, "ratio": res["0"]["ratio"], "markdown": text,
            "ratio_label": "the SOP read from the compiled-SOP cache / compiled, at 0 ms"}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    main(reps=ap.parse_args().reps)
