"""sopctl side by side with MetaGPT 0.8.2: the same team, the same fake latency, one run.

Both systems run their software company on a fake model that answers instantly or after a
fixed delay (`SOPCTL_FAKE_LATENCY_MS` for sopctl, the same number for MetaGPT's patched
`acompletion_text`), with a task list of `files` source files. Every repetition is a fresh
process for each system, alternating, so both see the same machine. Each figure is a ratio
sopctl / MetaGPT of medians taken in this run; the spread (min-max) goes with it.

The sopctl side is `sopctl run --model <fake> --format json` called in-process through
`engine.cli.main`, with the built-in `fake` wrapped so that the design's file list and the
task list have `files` entries (the plain fake answers one-element lists). By default it
runs `sops/software_company.sop.yaml` without its QA engineer and the engineer's summary
(only the QA engineer reads it), which is the team that MetaGPT's `generate_repo` hires by
default (no `--run-tests`) and the calls it makes: PRD, design, tasks, code and a review per
file (MetaGPT 0.8.2's summary stops before its model call). The shipped file (with tests
and summary) is measured too, for calls and tokens.

    python -m bench.compare                 # full size (installs MetaGPT on first use)
    python -m bench.compare --quick         # tiny, sopctl only
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.scratch import scratch, work_root

__all__ = ["busy_time", "count_tokens", "main", "no_qa_variant", "peak_rss_mb", "run_sopctl"]

ROOT = Path(__file__).resolve().parent.parent
SOP = ROOT / "sops" / "software_company.sop.yaml"
NO_SOP_CACHE_ENV = "SOPCTL_BENCH_NO_SOP_CACHE"
"""Set to 1 in a bench child: the compiled-SOP entries of the on-disk cache are not read."""
REALISTIC_ENV = "SOPCTL_BENCH_REALISTIC"
"""Set to 1 in a bench child: the fake answers at a hosted model's size (`_BenchModel._sized`)."""
IDEA = "a command-line 2048 game"
TARGET_OVERHEAD = 0.1


# --------------------------------------------------------------------------- shared helpers

def task_files(n: int) -> list[str]:
    """The task list both systems get: n-1 modules in dependency order, then main.py."""
    return [f"module_{i}.py" for i in range(1, n)] + ["main.py"]


def peak_rss_mb() -> float:
    """This process's peak RSS. `VmHWM`, not `ru_maxrss`: Linux keeps ru_maxrss across exec,
    so a child would report its parent's peak (the bench process's) when that is larger."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def busy_time(intervals: list[list[float]]) -> float:
    """Seconds with at least one model call in flight (the union of the call intervals)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def _tokenizer() -> Any:
    """tiktoken's cl100k_base, offline: its cache, or the copy litellm ships with."""
    import importlib.util

    if not os.environ.get("TIKTOKEN_CACHE_DIR"):
        spec = importlib.util.find_spec("litellm")
        for location in (spec.submodule_search_locations or []) if spec else []:
            folder = Path(location) / "litellm_core_utils" / "tokenizers"
            if folder.is_dir():
                os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)
    try:
        import tiktoken

        return tiktoken.get_encoding("cl100k_base")
    except Exception:  # noqa: BLE001 - no tokenizer: fall back to chars / 4, and say so
        return None


def count_tokens(prompts: list[str]) -> tuple[int, str]:
    """Prompt tokens of a run, counted the same way for both systems; (tokens, method)."""
    enc = _tokenizer()
    if enc is None:
        return sum(len(p) for p in prompts) // 4, "chars/4"
    return sum(len(enc.encode(p, disallowed_special=())) for p in prompts), "cl100k_base"


def no_qa_variant(source: Path, target: Path, fan_out: int | None = None) -> Path:
    """The shipped SOP minus its QA engineer and the engineer's summary, which only the QA
    engineer reads: MetaGPT 0.8.2's default team (no --run-tests; its SummarizeCode stops
    before its model call with the default max_auto_summarize_code=0), so both engines make
    the same calls. With `fan_out`, every `for_each` runs at most that many items at once (1:
    one file after another, as MetaGPT's engineer does)."""
    from ruamel.yaml import YAML

    data = YAML(typ="safe").load(source.read_text())
    data["roles"].pop("QaEngineer", None)
    data["actions"].pop("WriteTest", None)
    data["actions"].pop("SummarizeCode", None)
    engineer = data["roles"]["Engineer"]
    engineer["actions"] = [name for name in engineer["actions"] if name != "SummarizeCode"]
    for action in data["actions"].values():
        if "Edward" in action.get("send_to", []):
            action["send_to"] = ["<all>"]
        if fan_out is not None and "for_each" in action:
            action["max_concurrency"] = fan_out
    target.write_text(json.dumps(data, indent=1))  # JSON is YAML
    return target


# --------------------------------------------------------------------------- sopctl child process

def json_object(text: str) -> dict[str, Any] | None:
    """A fake answer's JSON object, or None for any other text (code, prose, a list)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class _BenchModel:
    """`fake` with an N-file design and task list, timing every answer and keeping prompts."""

    def __init__(self, files: list[str]) -> None:
        from engine.models.fake import FakeModel

        self.inner, self.files = FakeModel(), files
        self.realistic = os.environ.get(REALISTIC_ENV) == "1"
        self.intervals: list[list[float]] = []
        self.prompts: list[str] = []
        self.answers: list[str] = []
        self.cpu_s = 0.0  # CPU time of the whole run, set by the caller

    def supports_schema(self, model: str) -> bool:
        return self.inner.supports_schema(model)

    def price(self, model: str) -> Any:
        """fake's (free): a model of unknown price runs its calls one at a time under the SOP's
        budget, which would hide the fan-out this bench compares (engine.models.gateway)."""
        return self.inner.price(model)

    async def complete(self, request: Any) -> Any:
        from engine.models.fake import latency_s

        t0 = time.perf_counter()
        answer = await self.inner.complete(request)
        prompt = "\n".join(str(m.get("content", "")) for m in request.messages)
        text = self._widen(answer.text)
        answer = dataclasses.replace(answer, text=self._sized(text, prompt) if self.realistic else text)
        self.prompts.append(prompt)
        self.answers.append(answer.text)
        # The model's own time is its latency: an await that resumes late (the event loop
        # busy elsewhere, e.g. blocked on a flush) is engine time, not time in flight.
        self.intervals.append([t0, min(time.perf_counter(), t0 + latency_s())])
        return answer

    def _sized(self, text: str, prompt: str) -> str:
        """The answer at a hosted model's size (bench/realistic_answers.py, the texts MetaGPT's
        side gets): JSON fields replaced where the realistic answer has them, code by the
        module of the file the prompt names."""
        from bench import realistic_answers as sized

        if text.lstrip().startswith("```"):
            named = re.search(r"`([A-Za-z0-9_./-]+\.py)`", prompt)
            return f"```python\n{sized.code(named.group(1) if named else 'main.py')}```"
        value = json_object(text)
        if value is None:
            return text
        for key, fields in (("Product Goals", lambda: sized.prd(IDEA, value.get("Project Name", "bench_app"))),
                            ("Implementation approach", lambda: sized.design(self.files)),
                            ("Task list", lambda: sized.tasks(self.files)),
                            ("Code Review All", lambda: sized.summary(self.files))):
            if key in value:
                value.update({k: v for k, v in fields().items() if k in value})
        value.pop("Interfaces per file", None)   # optional, and skipped: leans against sopctl
        return json.dumps(value, indent=2)

    def _widen(self, text: str) -> str:
        if "Task list" not in text and "File list" not in text:
            return text
        try:
            value = json.loads(text)
        except ValueError:
            return text
        if "File list" in value:
            value["File list"] = self.files
        if "Task list" in value:
            value["Task list"] = self.files
            value["Logic Analysis"] = [[f, f"part {i} of the program"] for i, f in enumerate(self.files, 1)]
        return json.dumps(value, indent=2)


def _run_cli(sop: str, files: int, idea: str,
             model_type: type[_BenchModel] | None = None) -> tuple[dict[str, Any], _BenchModel, float]:
    """One `sopctl run --format json` on the widened fake (`model_type`, default `_BenchModel`):
    (its JSON result, the model, seconds)."""
    from engine.cli import commands as cli
    from engine.testing import use_model

    model, out, err = (model_type or _BenchModel)(task_files(files)), io.StringIO(), io.StringIO()
    with scratch("sopctl-bench-") as tmp, use_model(model, name="benchfake"):
        argv = ["run", sop, "--model", "benchfake", "--idea", idea, "--out", str(Path(tmp) / "ws"),
                "--format", "json"]
        t0, c0 = time.perf_counter(), time.process_time()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(argv)
        seconds, model.cpu_s = time.perf_counter() - t0, time.process_time() - c0
    if code != 0:
        raise SystemExit(f"sopctl run exited {code}:\n{err.getvalue()[-2000:]}\n{out.getvalue()[-2000:]}")
    return json.loads(out.getvalue()), model, seconds


def _copy(sop: str, folder: str, name: str) -> str:
    target = Path(folder) / f"{name}.sop.yaml"
    target.write_bytes(Path(sop).read_bytes())
    return str(target)


def _child(sop: str, files: int, latency_ms: float, idea: str, warm: bool = False) -> dict[str, Any]:
    """Runs in a fresh process: import, then one `sopctl run --format json`, measured
    (and with `warm` a second one in the same process, one-time costs already paid)."""
    os.environ["SOPCTL_FAKE_LATENCY_MS"] = str(latency_ms)
    if os.environ.get(NO_SOP_CACHE_ENV) == "1":  # the compiled-SOP entries alone off
        from engine.compile import cache

        cache.lookup = lambda path, include_dirs: None
    t0 = time.perf_counter()
    import engine.cli.commands  # noqa: F401 - what a run loads, counted here, not in the run
    import engine.cli.live  # noqa: F401
    import engine.cli.report  # noqa: F401
    import engine.cli.batch  # noqa: F401 - imported lazily by the CLI's parser, the run's
    import engine.journal.pool  # noqa: F401 - experience pool and tracing options: what every
    import engine.run.tracing  # noqa: F401 - `sopctl run` loads, whatever its flags
    import engine.models.fake  # noqa: F401
    import engine.testing  # noqa: F401
    import jsonschema  # noqa: F401 - what a run loads to check answers, as MetaGPT's pydantic
    from engine import api
    # The checker's libraries load lazily: import them here, as MetaGPT's are, by compiling
    # a copy (a compiled file is remembered per process: the run must compile its own).
    with scratch("sopctl-bench-copy-") as copies:
        api.load(_copy(sop, copies, "import"))
    import_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    api.load(sop)  # what compiling costs inside the run (reported apart): from the on-disk
    compile_s = time.perf_counter() - t0  # cache when it holds the file, else in full
    from engine.compile import compiler
    compiler._CHECKED.clear()  # the run compiles (or reads the disk cache) itself, as the CLI does

    names = task_files(files)
    result, model, run_s = _run_cli(sop, files, idea)
    written = {Path(a).name for a in result["artifacts"] if not a.startswith(("docs/", "tests/"))}
    out = {
        "system": "sopctl", "import_s": import_s, "run_s": run_s, "compile_s": compile_s,
        "run_cpu_s": model.cpu_s,
        "llm_s": sum(b - a for a, b in model.intervals), "llm_busy_s": busy_time(model.intervals),
        "llm_calls": result["llm_calls"], "rounds": result["rounds"], "status": result["status"],
        "prompt_chars": sum(len(p) for p in model.prompts), "prompts": model.prompts,
        "answers": model.answers,
        "peak_rss_mb": peak_rss_mb(),
        "files_expected": names, "files_written": [f for f in names if f in written],
    }
    if warm:
        again, model, seconds = _run_cli(sop, files, idea)
        out.update(warm_run_s=seconds, warm_llm_s=busy_time(model.intervals),
                   warm_llm_calls=again["llm_calls"], warm_run_cpu_s=model.cpu_s)
    return out


_AREAS = (("sqlite3", "journal: SQLite statements (commit + fsync)"), ("ruamel", "YAML loading (ruamel)"),
          ("jinja2", "templates (jinja2)"), ("jsonschema", "JSON Schema"), ("referencing", "JSON Schema"),
          ("pydantic", "pydantic"), ("networkx", "watch graph (networkx)"), ("asyncio", "asyncio"),
          ("builtins.compile", "templates (jinja2)"),  # jinja compiles each template to Python
          ("urllib/parse", "JSON Schema"),  # $ref resolution
          ("marshal.loads", "imports during the run"), ("importlib", "imports during the run"))


def _area(filename: str, func: str) -> str:
    """Which part of the stack a profiled function belongs to."""
    where = f"{filename} {func}"
    for needle, area in _AREAS:
        if needle in where:
            return area
    if f"{os.sep}engine{os.sep}" in filename:
        return "engine." + Path(filename).stem
    return "other (stdlib, builtins)"


def _profile_child(sop: str, files: int, idea: str) -> dict[str, Any]:
    """One run at 0 ms under cProfile; own time summed by area (why the overhead is what it is)."""
    import cProfile
    import pstats

    from engine import api
    from engine.cli import commands as cli
    from engine.testing import use_model

    api.load(sop)
    model, out = _BenchModel(task_files(files)), io.StringIO()
    prof = cProfile.Profile()
    with tempfile.TemporaryDirectory(prefix="sopctl-prof-") as tmp, use_model(model, name="benchfake"):
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            prof.runcall(cli.main, ["run", sop, "--model", "benchfake", "--idea", idea, "--out",
                                    str(Path(tmp) / "ws"), "--format", "json"])
    areas: dict[str, float] = {}
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]  # documented, not in the stubs
    for (filename, _line, func), (_cc, _nc, own, _cum, _callers) in stats.items():
        areas[_area(filename, func)] = areas.get(_area(filename, func), 0.0) + own
    return {"areas": areas, "calls": len(model.prompts)}


def run_sopctl(files: int, latency_ms: float, sop: Path = SOP, idea: str = IDEA,
               warm: bool = False, cache: bool = True, realistic: bool = False,
               sop_cache: bool = True) -> dict[str, Any]:
    """One fresh process running the SOP on the widened fake (twice with `warm`); its JSON
    result. `cache=False`: with the on-disk cache off (a file's very first run);
    `sop_cache=False`: only the compiled-SOP entries off (templates' code and schema checks
    still cached); `realistic`: answers of a hosted model's size (bench/realistic_answers.py)."""
    cmd = [sys.executable, "-m", "bench.compare", "--child", str(sop), "--files", str(files),
           "--latency-ms", str(latency_ms), "--idea", idea] + (["--warm"] if warm else [])
    env = {**os.environ, **({} if cache else {"SOPCTL_NO_CACHE": "1"}), REALISTIC_ENV: "1" if realistic else "0",
           NO_SOP_CACHE_ENV: "0" if sop_cache else "1"}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"sopctl bench run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    missing = set(result["files_expected"]) - set(result["files_written"])
    if missing:
        raise RuntimeError(f"sopctl run did not write {sorted(missing)}")
    return result


def profile_sopctl(files: int, sop: Path) -> dict[str, Any]:
    """The profiled run, in a fresh process."""
    cmd = [sys.executable, "-m", "bench.compare", "--profile", str(sop), "--files", str(files)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"profiled sopctl run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- cold start

def _timed(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | str = ROOT) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - t0


def sopctl_cold_start() -> dict[str, float]:
    """Seconds for `sopctl run --help` and `sopctl validate` of the shipped SOP, fresh processes."""
    sopctl = str(Path(sys.executable).parent / "sopctl")
    return {"help_s": _timed([sopctl, "run", "--help"]),
            "validate_s": _timed([sopctl, "validate", str(SOP)])}


# --------------------------------------------------------------------------- the comparison

def stats(values: list[float]) -> dict[str, float]:
    """Median, min, max and count of a figure's repetitions (the form every table reports)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def _per_call_overhead(r: dict[str, Any]) -> float:
    """Engine time on the run's path per call: wall time with no model call in flight."""
    return (r["run_s"] - r.get("llm_busy_s", r["llm_s"])) / r["llm_calls"]


def _summarise(runs: list[dict[str, Any]], tokens: int) -> dict[str, Any]:
    first = runs[0]
    extra = {}
    if "run_cpu_s" in first:
        extra["cpu_per_call_ms"] = stats([1000 * r["run_cpu_s"] / r["llm_calls"] for r in runs])
    if "warm_run_cpu_s" in first:
        extra["warm_cpu_per_call_ms"] = stats(
            [1000 * r["warm_run_cpu_s"] / r["warm_llm_calls"] for r in runs])
    if "warm_run_s" in first:
        extra["warm_overhead_per_call_ms"] = stats(
            [1000 * (r["warm_run_s"] - r["warm_llm_s"]) / r["warm_llm_calls"] for r in runs])
    if "compile_s" in first:
        extra["overhead_ex_compile_ms"] = stats(
            [1000 * (_per_call_overhead(r) - r["compile_s"] / r["llm_calls"]) for r in runs])
    return {**extra,
        "run_s": stats([r["run_s"] for r in runs]),
        "llm_busy_s": stats([r.get("llm_busy_s", r["llm_s"]) for r in runs]),
        "overhead_per_call_ms": stats([1000 * _per_call_overhead(r) for r in runs]),
        "import_s": stats([r["import_s"] for r in runs]),
        "peak_rss_mb": stats([r["peak_rss_mb"] for r in runs]),
        "llm_calls": first["llm_calls"], "prompt_chars": first["prompt_chars"],
        "prompt_tokens": tokens, "files_written": len(first["files_written"]),
    }


def _measure(system: str, reps: int, files: int, latency_ms: float, sop: Path) -> list[dict[str, Any]]:
    if system == "metagpt":
        from bench.metagpt_baseline import run_team

        return [run_team(files, latency_ms, IDEA, warm=latency_ms == 0) for _ in range(reps)]
    return [run_sopctl(files, latency_ms, sop, warm=latency_ms == 0) for _ in range(reps)]


def compare(reps: int = 6, files: int = 10, latencies: tuple[float, float] = (0.0, 200.0),
            with_metagpt: bool = True, log=print) -> dict[str, Any]:
    """All runs, alternating systems per repetition; summaries per system and latency."""
    out: dict[str, Any] = {"files": files, "reps": reps, "latencies_ms": list(latencies)}
    if with_metagpt:
        from bench.metagpt_baseline import ensure_installed

        try:
            ensure_installed(log)
        except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
            log(f"  MetaGPT could not be installed; sopctl figures only: {exc}")
            out["metagpt_error"] = str(exc)[:500]
            with_metagpt = False
    systems = ["sopctl", "metagpt"] if with_metagpt else ["sopctl"]
    with tempfile.TemporaryDirectory(prefix="sopctl-compare-") as tmp, _own_cache(Path(tmp) / "cache"), \
            work_root():
        sop = no_qa_variant(SOP, Path(tmp) / "software_company_no_qa.sop.yaml")
        log("  sopctl: one run to fill the on-disk cache, as any earlier run of the file does")
        run_sopctl(files, latencies[0], sop)
        no_cache: list[dict[str, Any]] = []
        no_sop_cache: list[dict[str, Any]] = []
        for latency in latencies:
            runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
            for i in range(reps):
                for system in systems:
                    log(f"  {system}: {files} files, {latency:g} ms latency, repetition {i + 1}/{reps}")
                    runs[system] += _measure(system, 1, files, latency, sop)
                if latency == latencies[0]:
                    log(f"  sopctl, on-disk cache off: repetition {i + 1}/{reps}")
                    no_cache.append(run_sopctl(files, latency, sop, cache=False))
                    log(f"  sopctl, compiled-SOP entries off: repetition {i + 1}/{reps}")
                    no_sop_cache.append(run_sopctl(files, latency, sop, sop_cache=False))
            for system in systems:
                tokens, method = count_tokens(runs[system][0]["prompts"])
                out[f"{system}@{latency:g}"] = _summarise(runs[system], tokens)
                out["token_method"] = method
        out[f"sopctl_no_cache@{latencies[0]:g}"] = _summarise(no_cache, 0)
        out[f"sopctl_no_sop_cache@{latencies[0]:g}"] = _summarise(no_sop_cache, 0)
        sequential = no_qa_variant(SOP, Path(tmp) / "software_company_fan_out_1.sop.yaml", fan_out=1)
        high = latencies[-1]
        log(f"  sopctl, fan-out 1: {files} files, {high:g} ms latency, {reps} repetition(s)")
        runs_1 = [run_sopctl(files, high, sequential) for _ in range(reps)]
        out[f"sopctl_fan_out_1@{high:g}"] = _summarise(runs_1, count_tokens(runs_1[0]["prompts"])[0])
        out["profile"] = profile_sopctl(files, sop)
        shipped = run_sopctl(files, 0.0, SOP)
        out["sopctl_shipped"] = {"llm_calls": shipped["llm_calls"],
                                 "prompt_tokens": count_tokens(shipped["prompts"])[0]}
    out["cold"] = _cold(reps, with_metagpt, log)
    out["ratios"] = _ratios(out, with_metagpt)
    return out


@contextlib.contextmanager
def _own_cache(folder: Path) -> Any:
    """sopctl's on-disk cache in `folder` for the comparison's children: it starts empty and
    holds only what this comparison's runs put there (not the user's ~/.cache/sopctl)."""
    before = os.environ.get("SOPCTL_CACHE_DIR")
    os.environ["SOPCTL_CACHE_DIR"] = str(folder)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SOPCTL_CACHE_DIR", None)
        else:
            os.environ["SOPCTL_CACHE_DIR"] = before


def _cold(reps: int, with_metagpt: bool, log) -> dict[str, Any]:
    log(f"  cold start, {reps} repetition(s)")
    samples: dict[str, list[float]] = {}
    for _ in range(reps):
        pairs = {f"sopctl_{k}": v for k, v in sopctl_cold_start().items()}
        if with_metagpt:
            from bench.metagpt_baseline import cold_start

            pairs.update({f"metagpt_{k}": v for k, v in cold_start().items()})
        for key, value in pairs.items():
            samples.setdefault(key, []).append(value)
    return {key: stats(values) for key, values in samples.items()}


def _ratios(out: dict[str, Any], with_metagpt: bool) -> dict[str, float]:
    if not with_metagpt:
        return {}
    lo, hi = (f"{{}}@{lat:g}" for lat in out["latencies_ms"])
    s0, m0 = out[lo.format("sopctl")], out[lo.format("metagpt")]
    s1, m1 = out[hi.format("sopctl")], out[hi.format("metagpt")]
    cold = out["cold"]
    return {
        "overhead_per_call": s0["overhead_per_call_ms"]["median"] / m0["overhead_per_call_ms"]["median"],
        "cpu_per_call": s0["cpu_per_call_ms"]["median"] / m0["cpu_per_call_ms"]["median"],
        "cpu_per_call_warm": s0["warm_cpu_per_call_ms"]["median"] / m0["warm_cpu_per_call_ms"]["median"],
        **{f"cpu_per_call_{key}": out[f"sopctl_{key}@{out['latencies_ms'][0]:g}"]["cpu_per_call_ms"]["median"]
           / m0["cpu_per_call_ms"]["median"]
           for key in ("no_sop_cache", "no_cache") if f"sopctl_{key}@{out['latencies_ms'][0]:g}" in out},
        "overhead_per_call_warm": (s0["warm_overhead_per_call_ms"]["median"]
                                   / m0["warm_overhead_per_call_ms"]["median"]),
        "wall_at_latency": s1["run_s"]["median"] / m1["run_s"]["median"],
        "wall_at_latency_fan_out_1": (out[hi.format("sopctl_fan_out_1")]["run_s"]["median"]
                                      / m1["run_s"]["median"]),
        "llm_calls": s0["llm_calls"] / m0["llm_calls"],
        "prompt_tokens": s0["prompt_tokens"] / m0["prompt_tokens"],
        "peak_rss": s0["peak_rss_mb"]["median"] / m0["peak_rss_mb"]["median"],
        "import": s0["import_s"]["median"] / m0["import_s"]["median"],
        "cold_help": cold["sopctl_help_s"]["median"] / cold["metagpt_help_s"]["median"],
        "cold_validate_vs_import": cold["sopctl_validate_s"]["median"] / cold["metagpt_import_s"]["median"],
    }


# --------------------------------------------------------------------------- report

def _fmt(s: dict[str, float], unit: str = "", digits: int = 3) -> str:
    return f"{s['median']:.{digits}f}{unit} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def markdown(res: dict[str, Any]) -> str:
    """The side-by-side table for docs/benchmarks.md (medians, min-max in brackets)."""
    lats = res["latencies_ms"]
    has_mg = f"metagpt@{lats[0]:g}" in res
    cols = ["sopctl", "MetaGPT 0.8.2", "sopctl / MetaGPT", "target"] if has_mg else ["sopctl"]
    rows = [f"| figure | {' | '.join(cols)} |", "|---" * (len(cols) + 1) + "|"]
    r = res.get("ratios", {})

    def row(name: str, lat: float, field: str, unit: str, ratio: str, target: str = "",
            digits: int = 3) -> None:
        s = res[f"sopctl@{lat:g}"][field]
        cells = [_fmt(s, unit, digits) if isinstance(s, dict) else f"{s:,}"]
        if has_mg:
            m = res[f"metagpt@{lat:g}"][field]
            cells += [_fmt(m, unit, digits) if isinstance(m, dict) else f"{m:,}",
                      f"**{r[ratio]:.3f}**" if ratio else "", target]
        rows.append(f"| {name} | {' | '.join(cells)} |")

    row(f"engine overhead per LLM call, {lats[0]:g} ms latency", lats[0], "overhead_per_call_ms",
        " ms", "overhead_per_call", f"<= {TARGET_OVERHEAD}", 2)
    if has_mg:
        s = res[f"sopctl@{lats[0]:g}"]["overhead_ex_compile_ms"]
        rows.append(f"| the same, less compiling the SOP (sopctl only) | {_fmt(s, ' ms', 2)} | | "
                    f"{s['median'] / res[f'metagpt@{lats[0]:g}']['overhead_per_call_ms']['median']:.3f} | |")
    row("the same, second run in the same process (warm)", lats[0], "warm_overhead_per_call_ms",
        " ms", "overhead_per_call_warm", f"<= {TARGET_OVERHEAD}", 2)
    row("CPU time of the first run per LLM call, 0 ms (less sensitive to other load)", lats[0], "cpu_per_call_ms",
        " ms", "cpu_per_call", f"<= {TARGET_OVERHEAD}", 2)
    row("CPU time of the second run (warm) per LLM call, 0 ms", lats[0], "warm_cpu_per_call_ms",
        " ms", "cpu_per_call_warm", f"<= {TARGET_OVERHEAD}", 2)
    for key, which in (("sopctl_no_sop_cache", "the compiled-SOP cache off (its templates' code and schema "
                                                "verdicts still cached: an edited file's first run)"),
                       ("sopctl_no_cache", "sopctl's on-disk cache off (a file's first run on a machine)")):
        off = res.get(f"{key}@{lats[0]:g}")
        if not off or not has_mg:
            continue
        m0 = res[f"metagpt@{lats[0]:g}"]
        for name, field in (("CPU time", "cpu_per_call_ms"), ("engine overhead", "overhead_per_call_ms")):
            rows.append(f"| {name} of the first run with {which} | {_fmt(off[field], ' ms', 2)} | | "
                        f"{off[field]['median'] / m0[field]['median']:.3f} | |")
    row(f"team run wall time, {lats[1]:g} ms latency", lats[1], "run_s", " s", "wall_at_latency")
    row(f"time with a call in flight, {lats[1]:g} ms latency", lats[1], "llm_busy_s", " s", "")
    fan1 = res.get(f"sopctl_fan_out_1@{lats[1]:g}")
    if fan1:
        cells = [_fmt(fan1["run_s"], " s")]
        if has_mg:
            cells += ["(same as above)", f"**{r['wall_at_latency_fan_out_1']:.3f}**", ""]
        rows.append(f"| the same with fan-out 1 (`max_concurrency: 1`, files one after another) | "
                    f"{' | '.join(cells)} |")
    row("LLM calls per run", lats[0], "llm_calls", "", "llm_calls")
    row(f"prompt tokens per run ({res.get('token_method', '')})", lats[0], "prompt_tokens", "",
        "prompt_tokens")
    row("peak RSS of the run's process", lats[0], "peak_rss_mb", " MB", "peak_rss", "", 0)
    row("import of what a run needs", lats[0], "import_s", " s", "import", "", 2)
    cold = res["cold"]
    for name, s_key, m_key, ratio in (("cold start: `sopctl run --help` / `metagpt --help`",
                                       "sopctl_help_s", "metagpt_help_s", "cold_help"),
                                      ("cold start: `sopctl validate` / import MetaGPT's team",
                                       "sopctl_validate_s", "metagpt_import_s", "cold_validate_vs_import")):
        cells = [_fmt(cold[s_key], " s", 2)]
        if has_mg:
            cells += [_fmt(cold[m_key], " s", 2), f"**{r[ratio]:.3f}**", ""]
        rows.append(f"| {name} | {' | '.join(cells)} |")
    note = f"\n\nMetaGPT was not measured: `{res['metagpt_error']}`" if res.get("metagpt_error") else ""
    if res.get("sopctl_shipped"):
        shipped = res["sopctl_shipped"]
        note += (f"\n\nThe shipped `sops/software_company.sop.yaml`, with its summary and its QA engineer "
                 f"writing one test file per source file, makes {shipped['llm_calls']} calls and sends "
                 f"{shipped['prompt_tokens']:,} prompt tokens for the same {res['files']}-file task list.")
    return "\n".join(rows) + note + "\n\n" + _profile_table(res.get("profile"))


def _profile_table(profile: dict[str, Any] | None) -> str:
    """Where sopctl's own time goes at 0 ms latency (cProfile's own time, summed by area)."""
    if not profile:
        return ""
    total = sum(profile["areas"].values())
    rows = [f"Where sopctl's time goes in one run at 0 ms ({profile['calls']} calls, under cProfile, "
            "which inflates Python-heavy parts; own time summed by area, top 8):", "",
            "| area | seconds (profiled) | share |", "|---|---|---|"]
    for area, secs in sorted(profile["areas"].items(), key=lambda kv: -kv[1])[:8]:
        rows.append(f"| {area} | {secs:.3f} | {secs / total:.0%} |")
    return "\n".join(rows)


def main(size_factor: float = 1.0, reps: int | None = None, with_metagpt: bool | None = None) -> dict[str, Any]:
    """Run the comparison (MetaGPT only at full size unless asked), print the table, return figures."""
    files = max(2, round(10 * size_factor))
    reps = reps or (6 if size_factor >= 1 else 1)   # targets are read at the median of six runs
    with_metagpt = size_factor >= 1 if with_metagpt is None else with_metagpt
    res = compare(reps=reps, files=files, with_metagpt=with_metagpt,
                  log=lambda msg: print(msg, file=sys.stderr))
    res["markdown"] = markdown(res)
    print(res["markdown"])
    return res


def _cli() -> None:
    ap = argparse.ArgumentParser(description="sopctl vs MetaGPT 0.8.2 on a fake model")
    ap.add_argument("--child", metavar="SOP", help=argparse.SUPPRESS)
    ap.add_argument("--profile", metavar="SOP", help=argparse.SUPPRESS)
    ap.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("--idea", default=IDEA)
    ap.add_argument("--quick", action="store_true", help="tiny size, one repetition, no MetaGPT")
    ap.add_argument("--skip-metagpt", action="store_true")
    ap.add_argument("--reps", type=int)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.files, args.latency_ms, args.idea, args.warm)))
        return
    if args.profile:
        print(json.dumps(_profile_child(args.profile, args.files, args.idea)))
        return
    main(0.2 if args.quick else 1.0, reps=1 if args.quick else args.reps,
         with_metagpt=not (args.quick or args.skip_metagpt))


if __name__ == "__main__":
    _cli()
