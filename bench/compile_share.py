"""What compiling the SOP costs of a run: the figure behind keeping no compiled SOPs on disk.

Issue 23: a pickled-SOP cache stays only if it saves at least 5% of a run. The software
company's team run on the widened fake (bench.compare's child), each in a fresh process: the
seconds its compile takes (load, schema, checks, graph, plan, templates' code) against the
whole run's, at 200 ms per call (a run as the bench runs it; a hosted model is slower, which
only shrinks the share) and at 0 ms (the engine alone). A cache could save at most that share.

    python -m bench.compile_share [--reps N]
"""
from __future__ import annotations

import argparse
from typing import Any

from bench.compare import SOP, run_sopctl, stats

BAR = 0.05


def measure(reps: int, files: int = 10, latencies: tuple[float, ...] = (200.0, 0.0)) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for latency in latencies:
        runs = [run_sopctl(files, latency, SOP) for _ in range(reps)]
        out[f"{latency:g}"] = {"compile_s": stats([r["compile_s"] for r in runs]),
                               "run_s": stats([r["run_s"] for r in runs]),
                               "share": stats([r["compile_s"] / r["run_s"] for r in runs])}
    return out


def markdown(res: dict[str, Any], reps: int) -> str:
    rows = ["| latency | compiling the SOP | the whole run | share of the run | bar for a cache |",
            "|---|---|---|---|---|"]
    for latency, r in res.items():
        seconds = "{median:.3f} s ({min:.3f}-{max:.3f})"
        s = r["share"]
        bar = f">= {BAR:.0%}" if latency == "200" else ""
        rows.append(f"| {latency} ms | {seconds.format(**r['compile_s'])} | {seconds.format(**r['run_s'])} | "
                    f"**{s['median']:.1%}** ({s['min']:.1%} to {s['max']:.1%}) | {bar} |")
    return (f"Software company, 10 files, a fresh process per run, {reps} repetitions; medians (min-max). "
            "Compiled SOPs are not kept on disk: at a run's latency, compiling is below the bar.\n\n"
            + "\n".join(rows) + "\n")


def main(size_factor: float = 1.0, reps: int | None = None) -> dict[str, Any]:
    reps = reps or max(1, round(5 * size_factor))
    res = measure(reps)
    text = markdown(res, reps)
    print(text)
    return {"figures": res, "ratio": res["200"]["share"]["median"], "markdown": text,
            "ratio_label": "compiling the SOP / the whole team run, at 200 ms"}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    main(reps=ap.parse_args().reps)
