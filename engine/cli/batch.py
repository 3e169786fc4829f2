"""`sopctl batch`: many runs of one SOP over a dataset, or a folder of runs replayed.

Flags are declared here (`add_batch_parser`), the work is `engine.batch`'s; this module
renders the progress line (stderr), the summary (stdout: a table, JSON, or JUnit XML) and
picks the exit code. Heavy modules are imported inside the handler.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from collections.abc import Callable, Iterable

if TYPE_CHECKING:
    from engine.batch.runner import BatchTotals, RowContext

__all__ = ["add_batch_parser", "cmd_batch", "ProgressLine", "format_summary", "junit_xml"]

EXIT_OK, EXIT_FAILED, EXIT_WAITING, EXIT_INTERRUPTED = 0, 1, 75, 130


def add_batch_parser(sub: Any, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    """The `batch` subcommand; `add_common` adds the flags it shares with `run`."""
    p = sub.add_parser("batch", help="one run per row of a JSONL or CSV file (or --replay a folder of runs)")
    p.add_argument("file", nargs="?", metavar="FILE", help="the SOP file (not with --replay)")
    p.add_argument("--inputs", metavar="ROWS", help="rows.jsonl (one JSON object a line) or rows.csv "
                   "(a header row): each row gives one run's inputs")
    p.add_argument("--replay", metavar="RUNS_DIR", help="replay every journaled run under RUNS_DIR "
                   "(a batch folder, or a folder of runs) with its recorded answers; report divergences")
    p.add_argument("--out", metavar="DIR", help="the batch folder: results.jsonl and rows/NNNNNN/ "
                   "(default runs/batch-<ROWS name>, or runs/replay-<RUNS_DIR name>)")
    p.add_argument("--concurrency", type=int, default=4, metavar="N", help="rows in flight at once (default 4)")
    p.add_argument("--budget", type=float, default=0.0, metavar="USD",
                   help="budget of the whole batch (0 = none): no row starts once it is spent")
    p.add_argument("--model", help="the model of every row (as `sopctl run --model`)")
    p.add_argument("--rounds", type=int, metavar="N", help="override team.max_rounds")
    p.add_argument("--expect", action="append", default=[], metavar="EXPR",
                   help="a jinja expression every row must make true, over `run` and `msgs`, "
                        "e.g. \"{{ run.status == 'idle' }}\" (repeatable)")
    p.add_argument("--golden", metavar="RUN_DIR", help="score each row's (role, action) "
                   "trajectory against this run's")
    p.add_argument("--match", choices=["exact", "in_order", "any_order"], default="in_order",
                   help="how trajectories are compared with --golden (default in_order)")
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="run the rows as Ray tasks: on a local cluster, or the one at ADDRESS "
                        "(needs the extra: pip install 'sopctl[ray]')")
    p.add_argument("--allow-exec", action="store_true",
                   help="allow actions of kind exec to run commands in each row's workspace")
    p.add_argument("--format", choices=["text", "json", "junit"], default="text",
                   help="the summary on stdout: a table, one JSON object, or JUnit XML (a test case per row)")
    add_common(p)
    p.set_defaults(handler=cmd_batch)


def cmd_batch(args: argparse.Namespace) -> int:
    """Exit 0 when every row ended well (and met its expectations), 1 when one did not, 75
    when none failed but some wait for a person, 130 when interrupted (a rerun goes on)."""
    from engine.errors import UsageError

    if args.replay:
        if args.file or args.inputs:
            raise UsageError("--replay takes no FILE and no --inputs")
        return _replay(args)
    if not args.file or not args.inputs:
        raise UsageError("sopctl batch needs FILE and --inputs ROWS (or --replay RUNS_DIR)")
    return _batch(args)


def _batch(args: argparse.Namespace) -> int:
    import asyncio   # here, not at the top: `validate` imports this module for its flags

    from engine.batch.rows import count_rows
    from engine.batch.runner import run_batch

    ctx = _context(args)
    launch = _launcher(args, ctx)
    progress = ProgressLine(count_rows(args.inputs))
    started = time.monotonic()
    try:
        totals, interrupted = asyncio.run(run_batch(ctx, args.inputs, concurrency=args.concurrency,
                                                    budget_usd=args.budget, progress=progress,
                                                    launch=launch))
    finally:
        progress.close()
        if args.ray:
            from engine.batch.ray_backend import shutdown

            shutdown()
    _print_summary(totals, Path(ctx.out), args.format, time.monotonic() - started, _suite_name(args))
    return _exit_code(totals, interrupted)


def _context(args: argparse.Namespace) -> RowContext:
    from engine import api
    from engine.batch.evaluate import MATCH_MODES, Golden, parse_expectation, trajectory
    from engine.batch.runner import RowContext
    from engine.compile.compiler import check_path
    from engine.check.diagnostics import format_report
    from engine.errors import UsageError
    from engine.journal.history import read_run

    checked = check_path(args.file, args.include_path)
    if checked.compiled is None or not checked.ok:
        raise UsageError(f"{args.file} has errors:\n" + format_report([checked], "text", False)[0])
    api.check_limits(args.rounds, args.budget)
    for expectation in args.expect:
        parse_expectation(expectation)          # a typo is refused before any row runs
    golden = None
    if args.golden:
        steps = tuple(trajectory(read_run(args.golden)))
        golden = Golden(steps, args.match if args.match in MATCH_MODES else "in_order")
    out = args.out or str(Path("runs") / f"batch-{Path(args.inputs).stem}")
    return RowContext(sop_file=str(Path(args.file).resolve()), out=str(Path(out).resolve()),
                      include_dirs=tuple(str(Path(d).resolve()) for d in args.include_path),
                      model=args.model, rounds=args.rounds, allow_exec=args.allow_exec,
                      isolate=args.isolate, allow_network=args.allow_network,
                      api_base=args.api_base, price=args.price, expect=tuple(args.expect),
                      golden=golden)


def _launcher(args: argparse.Namespace, ctx: RowContext) -> Any:
    if not args.ray:
        return None
    from engine.batch.ray_backend import ray_launcher

    return ray_launcher(ctx, args.ray)


def _suite_name(args: argparse.Namespace) -> str:
    return Path(args.file).name if args.file else f"replay {args.replay}"


def _replay(args: argparse.Namespace) -> int:
    import asyncio

    from engine.batch.regression import replay_runs, run_folders

    out = Path(args.out or Path("runs") / f"replay-{Path(args.replay).resolve().name}")
    progress = ProgressLine(len(run_folders(args.replay)))
    started = time.monotonic()
    try:
        totals, interrupted = asyncio.run(
            replay_runs(args.replay, out, concurrency=args.concurrency, progress=progress))
    finally:
        progress.close()
    _print_summary(totals, out, args.format, time.monotonic() - started, _suite_name(args))
    return _exit_code(totals, interrupted)


def _exit_code(totals: BatchTotals, interrupted: bool) -> int:
    if interrupted:
        return EXIT_INTERRUPTED
    if not totals.ok:
        return EXIT_FAILED
    return EXIT_WAITING if totals.waiting else EXIT_OK


# --- progress ---------------------------------------------------------------------------


class ProgressLine:
    """done / failed / waiting / running / ETA / cost so far, on stderr: one line rewritten
    in place on a terminal, else a plain line per row ended (at most one a second, and the
    last one always)."""

    def __init__(self, total: int, stream: IO[str] | None = None) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.monotonic()
        self.ran = 0                 # rows this invocation ran (for the rate)
        self.last_print = 0.0
        self.text = ""

    def on_row(self, line: dict[str, Any], done: int, in_flight: int, totals: BatchTotals,
               spent_usd: float) -> None:
        self.ran += 1
        elapsed = time.monotonic() - self.started
        rate = self.ran / elapsed if elapsed > 0 else 0.0
        left = max(self.total - done, 0)
        eta = _duration(left / rate) if rate > 0 and left else "-"
        self.text = (f"batch: {done}/{self.total} rows · {totals.failed} failed · "
                     f"{totals.waiting} waiting · {in_flight} running · {rate:.1f} rows/s · "
                     f"ETA {eta} · ${spent_usd:.4f} spent")
        now = time.monotonic()
        if self.tty:
            print("\r" + self.text + "\x1b[K", end="", file=self.stream, flush=True)
        elif now - self.last_print >= 1.0 or done >= self.total:
            print(self.text, file=self.stream, flush=True)
            self.last_print = now
        if line.get("status") not in ("idle", "max_rounds") or line.get("diverged"):
            self._row_note(line)

    def _row_note(self, line: dict[str, Any]) -> None:
        reason = line.get("where") or line.get("error") or ""
        note = f"  row {line['row']}: {line.get('status')}" + (f": {reason.splitlines()[0]}" if reason else "")
        print(("\r\x1b[K" if self.tty else "") + note, file=self.stream, flush=True)

    def close(self) -> None:
        if self.tty and self.text:
            print(file=self.stream, flush=True)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


# --- the summary ------------------------------------------------------------------------


def _print_summary(totals: BatchTotals, out: Path, fmt: str, wall_s: float, suite: str) -> None:
    from engine.batch.results import ResultsFile

    results = ResultsFile(out)
    if fmt == "json":
        print(json.dumps(summary_object(totals, out, wall_s), indent=2))
    elif fmt == "junit":
        for chunk in junit_xml(results.lines, suite):
            sys.stdout.write(chunk)
    else:
        print(format_summary(totals, out, wall_s, results.lines()))


def summary_object(totals: BatchTotals, out: Path, wall_s: float) -> dict[str, Any]:
    return {"out": str(out), "results": str(out / "results.jsonl"), "rows": totals.rows,
            "statuses": dict(sorted(totals.statuses.items())), "failed": totals.failed,
            "waiting": totals.waiting, "calls": totals.calls, "tokens": totals.tokens,
            "cost_usd": round(totals.cost_usd, 6), "rows_with_expectations": totals.checked,
            "rows_failing_expectations": totals.checks_failed,
            "conformance": _round(totals.conformance_score), "nonconforming": totals.nonconforming,
            "diverged": totals.diverged,
            "wall_s": round(wall_s, 3), "ok": totals.ok}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


_SHOWN_PROBLEMS = 10


def format_summary(totals: BatchTotals, out: Path, wall_s: float,
                   lines: Iterable[dict[str, Any]]) -> str:
    """The table: rows by status, usage, evaluation, and the first rows that went wrong."""
    rate = f" · {totals.rows / wall_s:.1f} rows/s" if wall_s > 0 else ""
    text = [f"batch {out}: {totals.rows} rows", f"  {'status':<12} {'rows':>7}"]
    text += [f"  {status:<12} {count:>7}" for status, count in sorted(totals.statuses.items())]
    text.append(f"  {totals.calls} calls · {totals.tokens} tokens · ${totals.cost_usd:.4f} · "
                f"{wall_s:.1f} s{rate}")
    if totals.checked:
        text.append(f"  expectations: {totals.checked - totals.checks_failed}/{totals.checked} rows pass")
    if totals.diverged:
        text.append(f"  replays: {totals.diverged}/{totals.rows} diverge from their recorded run")
    if totals.conformance_score is not None:
        text.append(f"  conformance: {totals.conformance_score:.3f} "
                    f"({totals.conformance_rows - totals.nonconforming}/{totals.conformance_rows} rows conform)")
    problems = [_problem(line) for line in lines]
    shown = [p for p in problems if p][:_SHOWN_PROBLEMS]
    text += [f"  row {p}" for p in shown]
    text.append(f"  results: {out / 'results.jsonl'}")
    return "\n".join(text)


def _problem(line: dict[str, Any]) -> str:
    """What went wrong with a row, in one line ('' when nothing did)."""
    if line.get("diverged"):
        return f"{line['row']} ({line.get('source')}): diverged: {line.get('where')}"
    failed = [c for c in line.get("checks") or [] if not c["passed"]]
    conformance = line.get("conformance") or {}
    if line.get("status") in ("idle", "max_rounds", "waiting") and not failed and conformance.get("conforms", True):
        return ""
    reason = (line.get("error") or "").splitlines()[0] if line.get("error") else ""
    if failed:
        reason = f"expectation failed: {failed[0]['expect']}" + (f" ({failed[0]['error']})" if failed[0].get("error") else "")
    elif conformance and not conformance.get("conforms"):
        reason = f"conformance {conformance.get('score')}: {conformance.get('first_difference', '')}"
    return f"{line['row']}: {line.get('status')}" + (f": {reason}" if reason else "")


def junit_xml(lines: Callable[[], Iterable[dict[str, Any]]], suite: str) -> Iterable[str]:
    """JUnit XML, one test case per row; `lines` is read twice (counts first), one line at a time."""
    from xml.sax.saxutils import escape, quoteattr

    rows = failures = skipped = 0
    for line in lines():
        rows += 1
        failures += bool(_problem(line))
        skipped += not _problem(line) and line.get("status") == "waiting"
    yield '<?xml version="1.0" encoding="UTF-8"?>\n'
    yield (f"<testsuites><testsuite name={quoteattr(suite)} tests=\"{rows}\" "
           f"failures=\"{failures}\" skipped=\"{skipped}\">\n")
    for line in lines():
        yield f"  <testcase classname={quoteattr(suite)} name={_case_name(line)}>"
        problem = _problem(line)
        if problem:
            yield f"<failure message={quoteattr(problem)}>{escape(json.dumps(line, ensure_ascii=False))}</failure>"
        elif line.get("status") == "waiting":
            yield "<skipped message=\"waiting for a person\"/>"
        yield "</testcase>\n"
    yield "</testsuite></testsuites>\n"


def _case_name(line: dict[str, Any]) -> str:
    from xml.sax.saxutils import quoteattr

    return quoteattr(f"row {int(line['row']):06d}")
