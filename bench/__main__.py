"""`python -m bench` (and `make bench`): run every benchmark, rewrite docs/benchmarks.md.

Each bench module exposes `main(size_factor=1.0)`, prints its table and returns its figures
(a dict; `markdown`, when present, is its section of the report). Modules are imported one
at a time, when their turn comes, so that a missing or broken one is skipped with a note
instead of stopping the rest. The report names the machine, the versions and the date,
because ratios are only comparable between runs on the same kind of machine.

    python -m bench                    # everything, full size (installs MetaGPT on first use)
    python -m bench --skip-metagpt     # no MetaGPT: sopctl figures only, no ratios
    python -m bench --quick --out /tmp/b.md   # tiny sizes, 1 repetition, no MetaGPT (smoke test)
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import importlib.metadata
import io
import os
import platform
import re
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "docs" / "benchmarks.md"

BENCHES: list[tuple[str, str, str]] = [
    ("compare", "bench.compare", "sopctl side by side with MetaGPT 0.8.2"),
    ("routing", "bench.routing_bench", "Routing scale: 1,000 roles, up to 100,000 messages"),
    ("validate", "bench.validate_bench", "Validation speed"),
    ("lsp", "bench.lsp_bench", "`sopctl lsp`: diagnostics on open and per change, over stdio"),
    ("compile_share", "bench.compile_share", "What compiling the SOP costs of a run, and the compiled-SOP cache"),
    ("gateway", "bench.gateway_bench", "LLM gateway"),
    ("run", "bench.run_bench", "Runs on the fake model"),
    ("journal", "bench.journal_bench", "Journal"),
    ("context", "bench.context_bench", "Declared context against `context: all`"),
    ("report", "bench.report_bench", "The HTML report of a 100-round run"),
    ("batch", "bench.batch_bench", "Batches: rows per second, memory, Ray"),
    ("review", "bench.review_bench", "Code review: the merged review against MetaGPT's LGTM/LBTM loop"),
    ("node", "bench.node_bench", "ActionNode keys: fill simple against complex, and revise"),
    ("memory", "bench.memory_bench", "Prompt size as a run grows: whole memory against a memory window"),
    ("scale", "bench.scale_bench", "Scale: 10 to 1,000 files on fake"),
    ("toolloop", "bench.toolloop_bench", "Tool loops: engine time and CPU per step, beside MetaGPT main's RoleZero"),
    ("prefix", "bench.prefix_bench", "Provider prompt caching: prefix reuse, and the input tokens a user pays"),
    ("exit", "bench.exit_bench", "A prompt exit: from the last line printed to the end of the process"),
    ("hosted", "bench.hosted_bench", "A hosted model's first request: direct client and litellm, against a local OpenAI-compatible server"),
]


RATIO_LABELS = {  # what the `ratio` a bench returns is a ratio of (when it does not say)
    "run": "run wall time / critical path at 200 ms (fake)",
    "journal": "run wall time with the journal / without, at 200 ms",
    "context": "prompt tokens, declared context / `context: all`",
    "batch": "batch wall time / critical path at 200 ms (fake)",
}


class _Tee(io.TextIOBase):
    """Writes to the terminal and keeps a copy for the report."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.stream.write(text)
        return self.copy.write(text)

    def flush(self) -> None:
        self.stream.flush()


def run_one(name: str, module: str, size_factor: float, skip_metagpt: bool) -> dict[str, Any]:
    """Import and run one bench; never raises (a failure is recorded for the report)."""
    entry: dict[str, Any] = {"name": name, "module": module}
    t0 = time.perf_counter()
    tee = _Tee(sys.stdout)
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            entry["error"] = f"import failed: {exc}"
        else:
            entry["missing"] = True
        return entry
    main: Callable[..., Any] = mod.main
    kwargs: dict[str, Any] = {"size_factor": size_factor}
    if name == "prefix":
        kwargs["with_metagpt"] = not skip_metagpt
    if name in ("compare", "toolloop"):
        kwargs["with_metagpt"] = not skip_metagpt
        if size_factor < 1:
            kwargs["reps" if name == "compare" else "repeats"] = 1
    try:
        with contextlib.redirect_stdout(tee):
            entry["result"] = main(**kwargs)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - one bench must not stop the others
        entry["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc(file=sys.stderr)
    entry["output"] = tee.copy.getvalue()
    entry["seconds"] = time.perf_counter() - t0
    return entry


# --------------------------------------------------------------------------- the report

def machine() -> dict[str, str]:
    """CPU count and model, OS, and the versions the figures depend on."""
    model = platform.processor() or "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"cpus": str(os.cpu_count()), "cpu": model, "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "sopctl": _version("sopctl"),
            "litellm": _version("litellm"), "metagpt": _metagpt_version()}


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _metagpt_version() -> str:
    from bench.metagpt_baseline import installed_version

    return installed_version() or "not installed (run without --skip-metagpt)"


def _verdict(value: float, target: str) -> str:
    """'yes' / '**no**' for targets written `<= x`, `< x`, `>= x` or `~1` (within 15%); else blank."""
    m = re.match(r"\s*(<=|<|>=|~)\s*([0-9.]+)", target)
    if not m:
        return ""
    op, bound = m.group(1), float(m.group(2))
    ok = {"<=": value <= bound, "<": value < bound, ">=": value >= bound,
          "~": abs(value - bound) <= 0.15 * bound}[op]
    return "yes" if ok else "**no**"


def summary_rows(entries: list[dict[str, Any]]) -> list[str]:
    """The headline table: every ratio with its target, from whichever benches produced one."""
    found: list[tuple[str, float, str]] = []
    res: dict[str, dict[str, Any]] = {e["name"]: e["result"] for e in entries
                                      if isinstance(e.get("result"), dict)}
    ratios = (res.get("compare") or {}).get("ratios") or {}
    labels = {
        "overhead_per_call": ("engine overhead per LLM call (wall), first run in a fresh process "
                              "(cold), 0 ms (sopctl / MetaGPT)", "<= 0.1"),
        "overhead_per_call_warm": ("engine overhead per LLM call (wall), second run in the same "
                                   "process (warm), 0 ms (sopctl / MetaGPT)",
                                   "<= 0.1"),
        "cpu_per_call": ("CPU time per LLM call, first run in a fresh process (cold), 0 ms "
                         "(sopctl / MetaGPT)", "<= 0.1"),
        "cpu_per_call_warm": ("CPU time per LLM call, second run in the same process (warm), 0 ms "
                              "(sopctl / MetaGPT)", "<= 0.1"),
        "cpu_per_call_no_sop_cache": ("the same cold, with the compiled-SOP cache off (an edited file's "
                                      "first run; sopctl / MetaGPT)", "<= 0.1"),
        "cpu_per_call_no_cache": ("the same cold, with sopctl's whole on-disk cache off (a file's first "
                                  "run on a machine; sopctl / MetaGPT)", ""),
        "wall_at_latency": ("wall time at 200 ms latency, 10-file task list (sopctl / MetaGPT)", "< 1"),
        "wall_at_latency_fan_out_1": ("the same with fan-out 1: engine only, no parallel files "
                                      "(sopctl / MetaGPT)", "< 1"),
        "llm_calls": ("LLM calls per run (sopctl / MetaGPT)", ""),
        "prompt_tokens": ("prompt tokens per run (sopctl / MetaGPT)", "< 1"),
        "peak_rss": ("peak memory of the run's process (sopctl / MetaGPT)", "< 1"),
        "cold_help": ("cold start `sopctl run --help` / `metagpt --help`", "< 1"),
        "cold_validate_vs_import": ("cold `sopctl validate` / importing MetaGPT's team", "< 1"),
    }
    found += [(label, ratios[key], target) for key, (label, target) in labels.items() if key in ratios]
    found += _hosted_rows(res)
    scale = res.get("scale") or {}
    labels_scale = {"chars_100_over_10": "prompt characters, 100 files / 10 files (shipped SOP)",
                    "chars_300_over_100": "prompt characters, 300 files / 100 files (shipped SOP)",
                    "per_call_1000_over_100": "wall time per call on fake, 1,000 files / 100 files (median of pairs)",
                    "rss_1000_over_100": "peak RSS on fake, 1,000 files / 100 files",
                    "chars_100_over_10_none": "prompt characters, 100 / 10 files, design without "
                                              "`Interfaces per file`",
                    "chars_300_over_100_none": "prompt characters, 300 / 100 files, design without "
                                               "`Interfaces per file`",
                    "chars_100_over_10_half": "prompt characters, 100 / 10 files, `Interfaces per file` "
                                              "half filled",
                    "chars_300_over_100_half": "prompt characters, 300 / 100 files, `Interfaces per file` "
                                               "half filled"}
    for key, label in labels_scale.items():
        value = (scale.get("ratios") or {}).get(key)
        if isinstance(value, (int, float)):
            found.append((label, value, f"<= {scale['targets'][key]:g}"))
    if res.get("routing"):
        r = res["routing"]
        found.append((f"routing: exponent of time vs messages ({r['roles']:,} roles, "
                      f"{r['curve'][0]['messages']:,}-{r['curve'][-1]['messages']:,} messages)",
                      r["exponent"], "~1 (linear)"))
    prefix = res.get("prefix") or {}
    for key, label in (("loop", "10-step tool loop"), ("mgx", "the MGX team's tool loops on fake")):
        side = prefix.get(key) or {}
        for stat in ("min", "median"):
            if isinstance(side.get(stat), (int, float)):
                found.append((f"exact-prefix share of consecutive requests, {label} ({stat} of "
                              f"{side['n']} pairs)", side[stat], ">= 0.9"))
    if isinstance(prefix.get("loop_ratio"), (int, float)):
        found.append((prefix["loop_ratio_label"], prefix["loop_ratio"], "<= 0.25"))
    if isinstance(prefix.get("team_ratio"), (int, float)):
        found.append((prefix["team_ratio_label"], prefix["team_ratio"], "<= 0.25"))
    cpu = (((res.get("validate") or {}).get("cold") or {}).get("cpu") or {}).get("ratio")
    if isinstance(cpu, (int, float)):
        found.append(("cold `sopctl validate` / bare imports of pydantic, jinja2, networkx (CPU)", cpu, "<= 2"))
    titles = {name: title for name, _module, title in BENCHES}
    res = {k: v for k, v in res.items() if k not in ("scale", "hosted")}  # reported above
    titles.update(RATIO_LABELS)
    for name, result in res.items():
        if name not in ("compare", "routing") and result and isinstance(result.get("ratio"), (int, float)):
            target = result.get("target", "")
            target = f"<= {target}" if isinstance(target, (int, float)) else str(target)
            found.append((result.get("ratio_label") or titles[name], result["ratio"], target))
            found += [tuple(row) for row in result.get("more_ratios") or ()]
    if not found:
        return []
    return ["| figure | value | target | met |", "|---|---|---|---|"] + [
        f"| {label} | **{value:.3f}** | {target} | {_verdict(value, target)} |" for label, value, target in found]


def _hosted_rows(res: dict[str, Any]) -> list[tuple[str, float, str]]:
    """The hosted stack's figures, and beside MetaGPT's (same report) when both ran."""
    hosted = res.get("hosted") or {}
    if not hosted:
        return []
    rows = [("seconds from `sopctl run` to the first request, openai/ model (direct client)",
             hosted["first_request_s"], f"<= {hosted['target']:g}"),
            ("first request through litellm / by the direct client",
             hosted["first_request_via_litellm_s"] / hosted["first_request_s"], "> 1")]
    compare = res.get("compare") or {}
    metagpt = compare.get(f"metagpt@{(compare.get('latencies_ms') or [0])[0]:g}")
    if metagpt:
        rows += [("peak RSS with litellm loaded (at the first request) / MetaGPT's run",
                  hosted["peak_rss_via_litellm_mb"] / metagpt["peak_rss_mb"]["median"], "< 1"),
                 ("import with litellm / MetaGPT's import",
                  hosted["import_via_litellm_s"] / metagpt["import_s"]["median"], "< 1")]
    return rows


def render(entries: list[dict[str, Any]], info: dict[str, str], argv: list[str],
           started: dt.datetime) -> str:
    now = started.strftime("%Y-%m-%d %H:%M UTC")
    took = sum(e.get("seconds", 0.0) for e in entries)
    lines = ["# Benchmarks", "",
             "Generated by `python -m bench` (`make bench`); do not edit by hand. Every ratio is "
             "sopctl / MetaGPT (or declared / baseline) measured in the same run, on the same "
             "machine; medians with (min-max) over the repetitions.", "",
             f"- date: {now} (started; {took / 60:.0f} min in all); command: "
             f"`python -m bench{''.join(' ' + a for a in argv)}`",
             f"- machine: {info['cpus']} CPU(s), {info['cpu']}, {info['os']}"
             + (f"; 1-minute load average {info['load']} (other jobs on the machine too: "
                "prefer the ratios, measured in the same run)" if info.get("load") else ""),
             f"- versions: Python {info['python']}, sopctl {info['sopctl']}, "
             f"MetaGPT {info['metagpt']}, litellm {info['litellm']}", ""]
    summary = summary_rows(entries)
    if summary:
        lines += ["## Summary", "", *summary, ""]
    for (name, _module, title), entry in zip(BENCHES, entries, strict=False):
        lines += [f"## {title}", "", f"`{entry['module']}`" + (f", {entry['seconds']:.0f} s" if "seconds" in entry else ""), ""]
        if entry.get("skipped"):
            lines += ["Not run in this invocation (`--only`).", ""]
            continue
        if entry.get("missing"):
            lines += ["Not run: the module is not in this checkout yet.", ""]
            continue
        if entry.get("error"):
            lines += [f"Not run to the end: `{entry['error']}`", ""]
        result = entry.get("result")
        if isinstance(result, dict) and result.get("markdown"):
            lines += [result["markdown"], ""]
            if name == "compare":
                lines += [COMPARE_NOTES, ""]
        elif entry.get("output", "").strip():
            lines += ["```", entry["output"].rstrip(), "```", ""]
    return "\n".join(lines)


COMPARE_NOTES = """\
How it is measured: each repetition runs each system in a fresh process, alternating. MetaGPT
0.8.2 (its own venv, `bench/.cache/metagpt-venv`) runs `generate_repo` (ProductManager,
Architect, ProjectManager, Engineer with code review; no QA, its default) with only
`acompletion_text` replaced by a fake that returns well-formed answers; sopctl runs
`sopctl run --format json` (in-process `engine.cli.main`) on `sops/software_company.sop.yaml`
without its QA engineer (the same team), on `fake` widened to the same task list. Both
fakes sleep the same latency. Engine overhead per call = (team run wall time - time with a
model call in flight) / calls, where a call is in flight for its latency only (an await
that resumes late because the event loop was busy, e.g. on a flush, counts as engine
time); "warm" is a second run in the same process, after one-time costs (template and
schema compilation, first imports, compiling the SOP) are paid. The team run excludes
imports on both sides (shown separately; sopctl's include jsonschema, which a run loads to
check answers); sopctl's first run includes loading the SOP (the import phase compiles a
copy of the file; the run reads the file's compiled form back from the on-disk cache). sopctl keeps compiled
SOP files, compiled templates and checked output schemas in an on-disk cache (docs/performance.md,
"The on-disk cache"): the comparison gives it a folder of its own, filled by one untimed run
before the repetitions, as any earlier run of the file on the machine does; so the
first-run figures are a fresh process with that cache; the rows "with the compiled-SOP cache
off" compile the file in full (its templates' code and schema verdicts still cached: an
edited file's first run), and the rows "with sopctl's on-disk cache off" are a file's very
first run (`SOPCTL_NO_CACHE=1`). CPU time is the process's
(every thread's) during the run. Both engines' runs make their files in folders under one
work folder in bench/.cache that is removed only when the comparison ends (bench/scratch.py):
ext4 skips the inodes freed in the last minute or more when it makes a file, so deleting each
run's workspace as it ended, in a /tmp where tests had just deleted thousands, made the next
runs' files cost 0.1-0.7 ms of CPU each instead of about 15 us. "Fan-out 1" runs
every `for_each` one item at a time, as MetaGPT's engineer does: the engine-only
comparison, without sopctl's parallel files. Prompt tokens: every prompt sent,
counted with the same tokenizer for both. Every task file is checked to be written. Both
make 3 + 2 × files calls: MetaGPT's SummarizeCode stops before its model call in 0.8.2 (its
default max_auto_summarize_code=0), so sopctl's team is run without its summary, which only
its QA engineer reads."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes, 1 repetition, no MetaGPT")
    ap.add_argument("--skip-metagpt", action="store_true", help="do not install or run MetaGPT")
    ap.add_argument("--only", action="append", choices=[b[0] for b in BENCHES],
                    help="run only this bench (repeatable)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="report file (default docs/benchmarks.md)")
    args = ap.parse_args(argv)
    size = 0.05 if args.quick else 1.0
    skip = args.skip_metagpt or args.quick
    entries = []
    started, load = dt.datetime.now(dt.timezone.utc), os.getloadavg()[0]
    for name, module, title in BENCHES:
        if args.only and name not in args.only:
            entries.append({"name": name, "module": module, "skipped": True})
            continue
        print(f"== {title} ({module})", file=sys.stderr)
        entries.append(run_one(name, module, size, skip))
    info = {**machine(), "load": f"{load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"}
    report = render(entries, info, list(argv if argv is not None else sys.argv[1:]), started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 1 if any(e.get("error") for e in entries) else 0


if __name__ == "__main__":
    sys.exit(main())
