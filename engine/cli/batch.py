"""`sopctl batch`: many runs of one SOP over a dataset, or a folder of runs replayed.

Its flags are `engine.cli.parser`'s, the work is `engine.batch`'s; this module renders the
progress line (stderr), the summary (stdout: a table, JSON, or JUnit XML) and picks the exit
code. `engine.cli.commands` imports it only when `batch` runs (it imports the run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import IO, Any
from collections.abc import Callable, Iterable
from xml.sax.saxutils import escape, quoteattr

from engine import api
from engine.batch.evaluate import MATCH_MODES, Golden, parse_expectation, trajectory
from engine.batch.ray_backend import ray_launcher, shutdown
from engine.batch.regression import replay_runs, run_folders
from engine.batch.results import ResultsFile
from engine.batch.rows import count_rows
from engine.batch.runner import BatchTotals, RowContext, run_batch
from engine.cli.options import run_options
from engine.cli.report import printable
from engine.compile.compiler import check_path
from engine.check.diagnostics import format_report
from engine.errors import UsageError
from engine.journal.history import read_run

__all__ = ["cmd_batch", "ProgressLine", "format_summary", "junit_xml"]

EXIT_OK, EXIT_FAILED, EXIT_WAITING, EXIT_INTERRUPTED = 0, 1, 75, 130


def cmd_batch(args: argparse.Namespace) -> int:
    """Exit 0 when every row ended well (and met its expectations), 1 when one did not, 75
    when none failed but some wait for a person, 130 when interrupted (a rerun goes on)."""
    if args.replay:
        if args.file or args.inputs:
            raise UsageError("--replay takes no FILE and no --inputs")
        return _replay(args)
    if not args.file or not args.inputs:
        raise UsageError("sopctl batch needs FILE and --inputs ROWS (or --replay RUNS_DIR)")
    return _batch(args)


def _batch(args: argparse.Namespace) -> int:
    ctx = _context(args)
    launch = _launcher(args, ctx)
    progress = ProgressLine(count_rows(args.inputs))
    started = time.monotonic()
    try:
        totals, interrupted = api.run_coroutine(run_batch(ctx, args.inputs, concurrency=args.concurrency,
                                                    budget_usd=args.batch_budget, progress=progress,
                                                    launch=launch))
    finally:
        progress.close()
        if args.ray:
            shutdown()
    _print_summary(totals, Path(ctx.out), args.format, time.monotonic() - started, _suite_name(args))
    return _exit_code(totals, interrupted)


def _context(args: argparse.Namespace) -> RowContext:
    checked = check_path(args.file, args.include_path)
    if checked.compiled is None or not checked.ok:
        raise UsageError(f"{args.file} has errors:\n" + format_report([checked], "text", False)[0])
    api.check_limits(args.rounds, args.batch_budget)
    for expectation in args.expect:
        parse_expectation(expectation)          # a typo is refused before any row runs
    golden = None
    if args.golden:
        steps = tuple(trajectory(read_run(args.golden)))
        golden = Golden(steps, args.match if args.match in MATCH_MODES else "in_order")
    out = args.out or str(Path("runs") / f"batch-{Path(args.inputs).stem}")
    return RowContext(sop_file=str(Path(args.file).resolve()), out=str(Path(out).resolve()),
                      include_dirs=tuple(str(Path(d).resolve()) for d in args.include_path),
                      options=run_options(args), expect=tuple(args.expect), golden=golden)


def _launcher(args: argparse.Namespace, ctx: RowContext) -> Any:
    if not args.ray:
        return None
    return ray_launcher(ctx, args.ray)


def _suite_name(args: argparse.Namespace) -> str:
    return Path(args.file).name if args.file else f"replay {args.replay}"


def _replay(args: argparse.Namespace) -> int:
    out = Path(args.out or Path("runs") / f"replay-{Path(args.replay).resolve().name}")
    progress = ProgressLine(len(run_folders(args.replay)))
    started = time.monotonic()
    try:
        totals, interrupted = api.run_coroutine(
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
        reason = (line.get("where") or line.get("error") or "").strip()
        note = printable(f"  row {line['row']}: {line.get('status')}" + (f": {reason.splitlines()[0]}" if reason else ""))
        print(("\r\x1b[K" if self.tty else "") + note, file=self.stream, flush=True)

    def close(self) -> None:
        if self.tty and self.text:
            print(file=self.stream, flush=True)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


# --- the summary ------------------------------------------------------------------------


def _print_summary(totals: BatchTotals, out: Path, fmt: str, wall_s: float, suite: str) -> None:
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
    text += _problem_lines(lines)
    text.append(f"  results: {out / 'results.jsonl'}")
    return "\n".join(text)


_SHOWN_ROWS = 5
"""Row numbers listed beside one problem; the others are counted."""


def _problem_lines(lines: Iterable[dict[str, Any]]) -> list[str]:
    """Every row that went wrong, under its own error: rows with the same error share a line
    (a hundred rows failing alike are one line), the first `_SHOWN_PROBLEMS` errors shown."""
    rows_by_problem: dict[str, list[str]] = {}
    for line in lines:
        problem = _what_went_wrong(line)
        if problem:
            rows_by_problem.setdefault(problem, []).append(_row_name(line))
    shown = []
    for problem, rows in list(rows_by_problem.items())[:_SHOWN_PROBLEMS]:
        named = ", ".join(rows[:_SHOWN_ROWS]) + (f" and {len(rows) - _SHOWN_ROWS} more" if len(rows) > _SHOWN_ROWS
                                                 else "")
        shown.append(f"  {'rows' if len(rows) > 1 else 'row'} {named}: {problem}")
    hidden = sum(len(rows) for rows in list(rows_by_problem.values())[_SHOWN_PROBLEMS:])
    if hidden:
        shown.append(f"  {hidden} more rows went wrong in other ways: see results.jsonl")
    return shown


def _row_name(line: dict[str, Any]) -> str:
    return f"{line['row']} ({line.get('source')})" if line.get("diverged") else str(line["row"])


def _problem(line: dict[str, Any]) -> str:
    """What went wrong with a row, in one line, its number first ('' when nothing did)."""
    problem = _what_went_wrong(line)
    return f"{_row_name(line)}: {problem}" if problem else ""


def _what_went_wrong(line: dict[str, Any]) -> str:
    """The row's status and its error's first line, which says what failed and where (the
    hint follows on the next), printable ('' when nothing went wrong)."""
    if line.get("diverged"):
        return printable(f"diverged: {line.get('where')}")
    failed = [c for c in line.get("checks") or [] if not c["passed"]]
    conformance = line.get("conformance") or {}
    if line.get("status") in ("idle", "max_rounds", "waiting") and not failed and conformance.get("conforms", True):
        return ""
    reason = (line.get("error") or "").strip().splitlines()[0] if (line.get("error") or "").strip() else ""
    if failed:
        reason = f"expectation failed: {failed[0]['expect']}" + (f" ({failed[0]['error']})" if failed[0].get("error") else "")
    elif conformance and not conformance.get("conforms"):
        reason = f"conformance {conformance.get('score')}: {conformance.get('first_difference', '')}"
    return printable(f"{line.get('status')}" + (f": {reason}" if reason else ""))


def junit_xml(lines: Callable[[], Iterable[dict[str, Any]]], suite: str) -> Iterable[str]:
    """JUnit XML, one test case per row; `lines` is read twice (counts first), one line at a time."""
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
    return quoteattr(f"row {int(line['row']):06d}")
