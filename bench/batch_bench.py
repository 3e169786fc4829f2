"""`sopctl batch` at scale: rows per second, peak memory, Ray's overhead, latency hiding.

1,000 rows of `sops/software_company.sop.yaml` on `fake` (one run per row, each journaled
in its own folder), measured as real `sopctl batch` processes:

- at 0 ms model latency, `--concurrency 4`: rows per second in one event loop, and the
  batch process's peak resident memory at a tenth of the rows and at all of them (the rows
  are streamed: memory should not grow with the file);
- the same on a local Ray cluster (`--ray`, when the `ray` extra is installed): rows per
  second once the cluster is up, the cluster's start, and Ray's overhead per row (a tenth
  of the rows run one at a time on both sides: Ray's wall time minus the local one);
- at 200 ms latency, `--concurrency 8`: the batch's wall time against its critical path,
  ceil(rows / 8) rows one after another, each row SEQUENTIAL_CALLS calls of 200 ms.

    python -m bench.batch_bench
    python -c "from bench.batch_bench import main; main(size_factor=0.01, with_ray=False)"   # smoke
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

__all__ = ["main"]

SOP = ROOT / "sops" / "software_company.sop.yaml"
ROWS = 1_000
SEQUENTIAL_CALLS = 7
"""Calls of one fake software-company run, one after another (one source file: no fan-out)."""
LATENCY_ROWS = 48

_RUNNER = """
import resource, sys, time
from engine.cli.commands import main
started = time.perf_counter()
code = main(sys.argv[1:])
wall = time.perf_counter() - started
print(f"BENCH {wall} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}", file=sys.stderr)
sys.exit(code)
"""


def _rows(folder: Path, count: int) -> Path:
    path = folder / f"rows-{count}.jsonl"
    with path.open("w", encoding="utf-8") as handle:
        for i in range(count):
            handle.write(json.dumps({"idea": f"a command-line tool number {i}"}) + "\n")
    return path


def _batch(folder: Path, rows: Path, name: str, *flags: str, latency_ms: int = 0) -> dict[str, float]:
    """One `sopctl batch` process: its wall time (inside the process) and peak RSS (MB)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SOPCTL_FAKE_LATENCY_MS": str(latency_ms)}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _RUNNER, "batch", str(SOP), "--inputs", str(rows),
                           "--model", "fake", "--out", str(folder / name), "--format", "json", *flags],
                          env=env, capture_output=True, text=True, timeout=3600)
    outside = time.perf_counter() - started
    figures = next(line for line in done.stderr.splitlines() if line.startswith("BENCH ")).split()
    summary = json.loads(done.stdout)
    if done.returncode != 0 or summary["statuses"] != {"idle": summary["rows"]}:
        raise RuntimeError(f"batch {name} did not run every row: {done.stderr[-2000:]}")
    wall = float(summary["wall_s"])        # the batch itself: no interpreter start, no compile
    return {"wall_s": wall, "process_s": outside, "main_s": float(figures[1]), "rows_per_s": summary["rows"] / wall,
            "peak_rss_mb": int(figures[2]) / 1024}


def _ray_installed() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def main(size_factor: float = 1.0, with_ray: bool = True) -> dict[str, Any]:
    rows = max(4, int(ROWS * size_factor))
    latency_rows = max(8, int(LATENCY_ROWS * min(size_factor * 10, 1.0)))
    res: dict[str, Any] = {"rows": rows}
    with tempfile.TemporaryDirectory(prefix="sopctl-batch-bench-") as tmp:
        folder = Path(tmp)
        tenth = _batch(folder, _rows(folder, max(1, rows // 10)), "tenth", "--concurrency", "4")
        local = _batch(folder, _rows(folder, rows), "local", "--concurrency", "4")
        res["local"] = local
        res["peak_rss_mb_tenth"] = tenth["peak_rss_mb"]
        if with_ray and _ray_installed():
            ray = _batch(folder, folder / f"rows-{rows}.jsonl", "ray", "--concurrency", "4", "--ray")
            res["ray"] = ray
            # the batch's own wall time starts once the cluster is up; what comes before it
            # (interpreter, compile, and for Ray `ray.init`) is the rest of main's time
            res["ray_start_s"] = (ray["main_s"] - ray["wall_s"]) - (local["main_s"] - local["wall_s"])
            # overhead: the same rows one at a time on both sides, so that Ray's use of more
            # cores cannot hide what it adds to each row (dispatch, pickling, a worker process)
            sample = max(1, rows // 10)
            one_local = _batch(folder, folder / f"rows-{sample}.jsonl", "local-1", "--concurrency", "1")
            one_ray = _batch(folder, folder / f"rows-{sample}.jsonl", "ray-1", "--concurrency", "1", "--ray")
            res["ray_overhead_rows"] = sample
            res["ray_overhead_per_row_ms"] = 1000 * (one_ray["wall_s"] - one_local["wall_s"]) / sample
        slow = _batch(folder, _rows(folder, latency_rows), "latency", "--concurrency", "8", latency_ms=200)
        critical = math.ceil(latency_rows / 8) * SEQUENTIAL_CALLS * 0.2
        res["latency"] = {"rows": latency_rows, "wall_s": slow["wall_s"], "critical_path_s": critical,
                          "wall_over_critical_path": slow["wall_s"] / critical}
    res["ratio"] = res["latency"]["wall_over_critical_path"]
    res["markdown"] = _markdown(res)
    print(res["markdown"])
    return res


def _markdown(res: dict[str, Any]) -> str:
    local = res["local"]
    lines = [
        f"{res['rows']} rows of the software company on `fake` at 0 ms, `--concurrency 4`, "
        "one journaled run per row:", "",
        "| figure | value |", "|---|---|",
        f"| rows/s, local (one event loop) | {local['rows_per_s']:.1f} |",
        f"| peak RSS of the batch, {res['rows']} rows | {local['peak_rss_mb']:.0f} MB |",
        f"| peak RSS of the batch, {max(1, res['rows'] // 10)} rows | {res['peak_rss_mb_tenth']:.0f} MB |",
    ]
    if "ray" in res:
        lines += [
            f"| rows/s, local Ray cluster (once started) | {res['ray']['rows_per_s']:.1f} |",
            f"| Ray cluster start (`ray.init`) | {res['ray_start_s']:.1f} s |",
            f"| Ray's overhead per row: {res['ray_overhead_rows']} rows one at a time, Ray minus local | "
            f"{res['ray_overhead_per_row_ms']:.1f} ms |",
        ]
    else:
        lines.append("| Ray | not installed (`pip install 'sopctl[ray]'`) |")
    lat = res["latency"]
    lines.append(f"| {lat['rows']} rows at 200 ms, `--concurrency 8`: wall / critical path "
                 f"({lat['critical_path_s']:.1f} s) | {lat['wall_over_critical_path']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
