"""The rows of a batch run through `engine.api`, N at a time in one event loop.

Every row is a run of its own, journaled in its own workspace `DIR/rows/NNNNNN/`, started with
`api.run_async` (or continued with `api.resume_async` when its journal is there from an
earlier, interrupted batch). Rows are read as they are needed and at most `concurrency` are
in flight, so memory does not grow with the file. Each row's line is appended to
`DIR/results.jsonl` (fsynced) when it ends; the file is compacted to one line per row, in
row order, when the batch ends.

Running the same batch again skips the rows already finished, resumes the interrupted ones
(journaled answers reused: nothing paid twice), and records from its journal a row that
ended after the last line was written.

The batch budget (`budget_usd`, 0 = none): a row starts only while some budget is free,
and gets the free budget split evenly over the free slots (free / (concurrency - rows in
flight)) as its own run budget (capped by the SOP's own `team.budget_usd`). When a row ends,
what it did not spend is free again. Since a run overspends its budget by at most one call,
the batch overspends by at most one call per row in flight. Once nothing is free and no row
is in flight, the remaining rows are recorded `skipped`; a rerun with a higher `--budget`
runs them. A resumed row's budget is what it already spent plus its share.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from engine import api
from engine.batch.folder import row_folder, rows_folder
from engine.batch.evaluate import Golden, check_expectations, conformance, trajectory
from engine.batch.results import (
    ResultsFile,
    msgs_of,
    problem_line,
    row_dir,
    run_line,
    skipped_line,
)
from engine.batch.rows import Row, read_rows
from engine.compile.compiler import CompiledSop
from engine.errors import SopError, UsageError
from engine.journal.database import never_started
from engine.journal.history import RunState, read_run
from engine.journal.run_folder import JOURNAL_DIR, journal_path
from engine.run.events import RunStatus
from engine.run.options import RunOptions

__all__ = ["RowContext", "BatchTotals", "BatchProgress", "BatchBudget", "Batch", "execute_row",
           "run_batch", "summarize", "Launcher"]

_MIN_SHARE_USD = 1e-9
"""Below this a share is no budget at all (and 0 would mean 'no limit' to a run)."""


@dataclass(frozen=True)
class RowContext:
    """What running one row needs, wherever it runs (plain data: it travels to Ray workers)."""

    sop_file: str
    out: str
    include_dirs: tuple[str, ...] = ()
    options: RunOptions = RunOptions()
    """Every row's run options; each row's own workspace and budget share replace theirs."""
    expect: tuple[str, ...] = ()
    golden: Golden | None = None


@functools.lru_cache(maxsize=8)
def _compiled(sop_file: str, include_dirs: tuple[str, ...]) -> CompiledSop:
    """The SOP compiled once per process (a Ray worker compiles it on its first row)."""
    return api.load(sop_file, include_dirs)


async def execute_row(ctx: RowContext, row: Row, share_usd: float | None,
                      compiled: CompiledSop | None = None) -> dict[str, Any] | None:
    """Run, resume or just record one row; its results line (None: the row was interrupted,
    the batch is being stopped, and a rerun resumes it)."""
    if row.problem:
        return _judged(ctx, row, problem_line(row.number, row.problem), None, ())
    compiled = compiled or _compiled(ctx.sop_file, ctx.include_dirs)
    actions = tuple(compiled.spec.actions)
    try:
        inputs = api.resolve_inputs(compiled, row.inputs)
        workspace = row_folder(Path(ctx.out), row_dir(Path(ctx.out), row.number).name)
        state = await _run_or_resume(ctx, compiled, row, inputs, workspace, share_usd)
    except SopError as exc:
        return _judged(ctx, row, problem_line(row.number, exc.message), None, actions)
    except Exception as exc:  # noqa: BLE001 - one row's bug must not stop the others
        return _judged(ctx, row, problem_line(row.number, f"internal error: {type(exc).__name__}: {exc}"), None,
                       actions)
    if state is None:
        return None
    return _judged(ctx, row, run_line(row.number, Path(ctx.out), state), state, actions)


async def _run_or_resume(ctx: RowContext, compiled: CompiledSop, row: Row, inputs: dict[str, Any],
                         workspace: Path, share_usd: float | None) -> RunState | None:
    """The row's run state once it ended (None: interrupted)."""
    own_budget = compiled.spec.team.budget_usd
    if journal_path(workspace).is_file() and never_started(workspace):
        shutil.rmtree(workspace / JOURNAL_DIR)   # killed while its journal was being created
    if journal_path(workspace).is_file():
        before = read_run(workspace)
        if before.inputs != inputs:
            raise UsageError(f"the row's inputs changed since its run started in {workspace}",
                             "a batch folder belongs to one inputs file; give another --out")
        if before.ended and before.status not in (RunStatus.INTERRUPTED, RunStatus.WAITING):
            return before                  # it ended after the batch's last line was written
        budget = None if share_usd is None else _capped(before.usage.cost_usd + share_usd, own_budget)
        result = await api.resume_async(workspace, replace(ctx.options, budget_usd=budget))
    else:
        budget = None if share_usd is None else _capped(share_usd, own_budget)
        result = await api.run_async(compiled, row.inputs,
                                     replace(ctx.options, workspace=str(workspace), budget_usd=budget))
    if result.status == RunStatus.INTERRUPTED:
        return None
    return read_run(workspace)


def _capped(share: float, own: float) -> float:
    return min(share, own) if own > 0 else share


def _judged(ctx: RowContext, row: Row, line: dict[str, Any], state: RunState | None,
            actions: tuple[str, ...]) -> dict[str, Any]:
    """The line with the row's expectations and conformance, when any are asked for."""
    expect = ctx.expect + row.expect
    if expect:
        msgs = msgs_of(state, actions) if state is not None else {a: [] for a in actions}
        line["checks"] = check_expectations(expect, line, row.inputs, msgs)
    if ctx.golden is not None:
        line["conformance"] = conformance(ctx.golden, trajectory(state) if state else [])
    return line


# --- the batch --------------------------------------------------------------------------


@dataclass
class BatchTotals:
    """What the rows came to: counts by status, usage, evaluation (for progress and summary)."""

    rows: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    checks_failed: int = 0           # rows with at least one failed expectation
    checked: int = 0                 # rows with expectations
    conformance_sum: float = 0.0
    conformance_rows: int = 0
    nonconforming: int = 0
    diverged: int = 0                # replays whose history differs from the recorded run's

    def add(self, line: dict[str, Any]) -> None:
        self.rows += 1
        status = str(line.get("status"))
        self.statuses[status] = self.statuses.get(status, 0) + 1
        self.calls += int(line.get("calls") or 0)
        self.tokens += int(line.get("tokens") or 0)
        self.cost_usd += float(line.get("cost_usd") or 0.0)
        if line.get("checks"):
            self.checked += 1
            self.checks_failed += not all(c["passed"] for c in line["checks"])
        if line.get("conformance"):
            self.conformance_rows += 1
            self.conformance_sum += float(line["conformance"]["score"])
            self.nonconforming += not line["conformance"]["conforms"]
        self.diverged += bool(line.get("diverged"))

    @property
    def failed(self) -> int:
        """Rows that did not end well: failed, stopped by their budget, or never started."""
        return sum(self.statuses.get(s, 0) for s in ("failed", "budget", "skipped"))

    @property
    def waiting(self) -> int:
        return self.statuses.get(RunStatus.WAITING.value, 0)

    @property
    def conformance_score(self) -> float | None:
        return self.conformance_sum / self.conformance_rows if self.conformance_rows else None

    @property
    def ok(self) -> bool:
        """No failed row, no failed expectation, every scored row conforms."""
        return not (self.failed or self.checks_failed or self.nonconforming or self.diverged)


class BatchProgress(Protocol):
    """Told as the batch goes (the CLI's progress line)."""

    def on_row(self, line: dict[str, Any], done: int, in_flight: int, totals: BatchTotals,
               spent_usd: float) -> None: ...


Launcher = Callable[[Row, "float | None"], Awaitable["dict[str, Any] | None"]]
"""Starts one row and gives its line: in this event loop, or as a Ray task."""


@dataclass
class BatchBudget:
    """The batch budget split over the rows in flight (see the module docstring)."""

    limit: float
    spent: float
    slots: int
    allotted: float = 0.0

    def share(self, in_flight: int) -> float | None:
        if self.limit <= 0:
            return None
        free = self.limit - self.spent - self.allotted
        return max(free, 0.0) / max(self.slots - in_flight, 1)


@dataclass
class Batch:
    """Rows (or replays) launched N at a time, each line recorded as it ends."""

    results: ResultsFile
    budget: BatchBudget
    launch: Launcher
    concurrency: int
    progress: BatchProgress | None
    totals: BatchTotals = field(default_factory=BatchTotals)    # this invocation's rows
    done: int = 0                   # rows finished, this invocation and earlier ones
    interrupted: bool = False
    pending: dict[asyncio.Future[Any], tuple[Row, float | None]] = field(default_factory=dict)

    async def run(self, rows: Iterable[Row]) -> None:
        try:
            for row in rows:
                if self.interrupted:
                    break
                if self.results.finished(row.number):
                    self.done += 1
                    continue
                await self._start(row)
            while self.pending:
                await self._wait_one()
        except asyncio.CancelledError:
            self.interrupted = True
            await self._stop()

    async def _start(self, row: Row) -> None:
        while len(self.pending) >= self.concurrency:
            await self._wait_one()
        share = self.budget.share(len(self.pending))
        while share is not None and share < _MIN_SHARE_USD and self.pending:
            await self._wait_one()          # rows in flight hold the budget: wait for one
            share = self.budget.share(len(self.pending))
        if share is not None and share < _MIN_SHARE_USD:
            self._record(skipped_line(row.number))
            return
        if share is not None:
            self.budget.allotted += share
        self.pending[asyncio.ensure_future(self.launch(row, share))] = (row, share)

    async def _wait_one(self) -> None:
        finished, _ = await asyncio.wait(list(self.pending), return_when=asyncio.FIRST_COMPLETED)
        for task in finished:
            self._finish(task)

    def _finish(self, task: asyncio.Future[Any]) -> None:
        row, share = self.pending.pop(task)
        if share is not None:
            self.budget.allotted -= share
        line = None if task.cancelled() else _line_of(row, task)
        if line is None:                    # interrupted: a rerun resumes it
            self.interrupted = True
            return
        self.budget.spent += float(line.get("cost_usd") or 0.0)
        self._record(line)

    def _record(self, line: dict[str, Any]) -> None:
        self.results.append(line)
        self.totals.add(line)
        self.done += 1
        if self.progress is not None:
            self.progress.on_row(line, self.done, len(self.pending), self.totals, self.budget.spent)

    async def _stop(self) -> None:
        """Ctrl-C: every run in flight ends `interrupted` (journaled); finished ones recorded."""
        for task in self.pending:
            task.cancel()
        await asyncio.gather(*self.pending, return_exceptions=True)
        for task in list(self.pending):
            self._finish(task)


def _line_of(row: Row, task: asyncio.Future[Any]) -> dict[str, Any] | None:
    """The row's line; a launcher that failed (a Ray worker lost, a bug) fails just the row."""
    error = task.exception()
    if error is None:
        return task.result()
    return problem_line(row.number, _launch_failure(error))


def _launch_failure(error: BaseException) -> str:
    """Why a launcher failed, in one line. A Ray task's failure is its own exception (Ray's
    wrapper keeps it as `cause`): the wrapper's text opens with the task's name, pid and
    address, and the error itself was only on the last line of a traceback after it."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, BaseException):
        error = cause
    text = " ".join(str(error).split()) or "no message"
    return f"internal error: {type(error).__name__}: {text}"


async def run_batch(ctx: RowContext, inputs: str | Path, *, concurrency: int = 4,
                    budget_usd: float = 0.0, progress: BatchProgress | None = None,
                    launch: Launcher | None = None) -> tuple[BatchTotals, bool]:
    """Run every unfinished row of `inputs`; the whole batch's totals (all rows, this run's and
    earlier ones'), and whether it was interrupted (Ctrl-C: rows in flight end `interrupted`
    and a rerun resumes them)."""
    if concurrency < 1:
        raise UsageError(f"--concurrency must be at least 1, got {concurrency}")
    out = Path(ctx.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_folder(out)              # a planted `rows` link stops the batch before any row
    results = ResultsFile(out)
    compiled = _compiled(ctx.sop_file, ctx.include_dirs)
    batch = Batch(results, BatchBudget(budget_usd, results.spent_usd(), concurrency),
                   launch or (lambda row, share: execute_row(ctx, row, share, compiled)),
                   concurrency, progress)
    await batch.run(read_rows(inputs))
    results.compact()
    return summarize(results), batch.interrupted


def summarize(results: ResultsFile) -> BatchTotals:
    """Totals over every row's line (read one at a time)."""
    totals = BatchTotals()
    for line in results.lines():
        totals.add(line)
    return totals

