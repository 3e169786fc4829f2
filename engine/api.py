"""The Python API, and the one way a run starts: `run`, `iter_run`, `resume`, `replay`.

    from engine.api import ResumeOptions, RunOptions, iter_run, load, replay, resume, run

    sop = load("sops/review.sop.yaml")
    result = run(sop, {"idea": "a todo CLI"}, RunOptions(model="fake", workspace="out/"))
    async for event in iter_run(sop, {"idea": "..."}, RunOptions(model="fake")): ...
    result = resume("out/", ResumeOptions(budget_usd=2.0))
    replayed = replay("out/", "replayed/")

A run's options are one frozen object (`RunOptions`; `ResumeOptions` and `ReplayOptions`
hold what a resume or a replay may change), made once by whatever starts the run: a wrong
type or an unknown name is a UsageError when it is made.

Every run is journaled by default (`<workspace>/.sopctl/journal.sqlite`), so whatever starts
it — the CLI, a benchmark, a user's script — can resume it after a crash without paying
twice; pass `journal=False` for a throwaway run. Inputs and limits are checked before
anything starts, so every front end refuses a bad run the same way. The CLI and the
benchmarks call these functions and hold no copy of them.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections.abc import AsyncIterator, Coroutine, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from engine.compile.compiler import CompiledSop, compile_path
from engine.errors import UsageError
from engine.journal.inbox import answer_question
from engine.journal.replay import ReplayStore
from engine.journal.resume import (
    RunFolder,
    open_for_replay,
    open_for_resume,
    remove_orphan_temp_files,
    replay_options,
    resume_options,
)
from engine.journal.store import Journal
from engine.run.events import RunEnded, RunEvent
from engine.run.inputs import check_limits, parse_input_flags, resolve_inputs
from engine.run.options import ReplayOptions, ResumeOptions, RunOptions
from engine.run.people import PersonAnswer, Question
from engine.run.team import RunResult, Team, new_run_id

__all__ = ["load", "resolve_inputs", "parse_input_flags", "prepare", "check_limits", "run",
           "run_async", "iter_run", "resume", "resume_async", "replay", "replay_async", "Replayed", "open_for_resume",
           "open_for_replay", "RunFolder", "RunResult", "RunOptions", "ResumeOptions", "ReplayOptions",
           "new_run_id", "answer", "run_coroutine",
           "PersonAnswer", "Question"]


def load(path: str | Path, include_dirs: tuple[str | Path, ...] = ()) -> CompiledSop:
    """Compile an SOP file (raises CompileError with the diagnostics if it has errors);
    `include_dirs`: folders besides the file's own that its `include:` may name."""
    return compile_path(path, include_dirs)


def prepare(compiled: CompiledSop, inputs: Mapping[str, Any] | None = None,
            options: RunOptions | None = None, **unknown: NoReturn) -> Team:
    """A Team ready to run (inputs, limits and `Team.check` passed), without a journal: for
    tools that drive the interpreter themselves. `run`, `iter_run`, `resume` and `replay` use it."""
    checked = _given("prepare", options, RunOptions, unknown)
    team = Team(compiled, resolve_inputs(compiled, inputs or {}), checked)
    team.check()
    return team


_Kind = TypeVar("_Kind", bound=ReplayOptions)


def _given(function: str, options: object, kind: type[_Kind], unknown: Mapping[str, object]) -> _Kind:
    """The options a caller gave (None: the defaults), refused unless they are a `kind`; a
    keyword option of earlier versions (`run(sop, inputs, model="fake")`) says how to pass it now."""
    if unknown:
        name = next(iter(unknown))
        raise UsageError(f"api.{function}() has no keyword {name!r}: its options are one {kind.__name__}",
                         hint=f"api.{function}(..., {kind.__name__}({name}=...)), {kind.__name__} from engine.api")
    if options is None:
        return kind()
    if not isinstance(options, kind):
        raise UsageError(f"api.{function}(): the options must be a {kind.__name__}, not {type(options).__name__}",
                         hint=f"e.g. {kind.__name__}(allow_exec=True), {kind.__name__} from engine.api")
    return options


# --- a new run --------------------------------------------------------------------------


def run(compiled: CompiledSop, inputs: Mapping[str, Any] | None = None,
        options: RunOptions | None = None, *, journal: bool = True, **unknown: NoReturn) -> RunResult:
    """The synchronous `run_async` (not from inside a running event loop)."""
    checked = _given("run", options, RunOptions, unknown)
    return run_coroutine(run_async(compiled, inputs, checked, journal=journal))


async def run_async(compiled: CompiledSop, inputs: Mapping[str, Any] | None = None,
                    options: RunOptions | None = None, *, journal: bool = True,
                    **unknown: NoReturn) -> RunResult:
    """Run to the end, journaled in the workspace unless `journal=False`.

    `options`: a `RunOptions` (the model, limits, workspace, what the run may do, observers,
    ...; see its fields). A run cannot start (UsageError, RunError) before any model call or
    file write: bad inputs or options, exec not allowed, an unusable model.
    """
    team = prepare(compiled, inputs, _given("run_async", options, RunOptions, unknown))
    return await _drive(team, _journal_of(team, journal))


async def iter_run(compiled: CompiledSop, inputs: Mapping[str, Any] | None = None,
                   options: RunOptions | None = None, *, journal: bool = True,
                   **unknown: NoReturn) -> AsyncIterator[RunEvent]:
    """Every event of a run, in order, ending with RunEnded; leaving early cancels the run."""
    sink = _Queue()
    checked = _given("iter_run", options, RunOptions, unknown)
    team = prepare(compiled, inputs, replace(checked, observers=(*checked.observers, sink)))
    task = asyncio.ensure_future(_drive(team, _journal_of(team, journal)))
    try:
        while True:
            event = await sink.queue.get()
            yield event
            if isinstance(event, RunEnded):
                break
        await task
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class _Queue:
    """An observer that hands events to the iterator."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[RunEvent] = asyncio.Queue()

    def on_event(self, event: RunEvent) -> None:
        self.queue.put_nowait(event)


def _journal_of(team: Team, wanted: bool) -> Journal | None:
    """The run's journal in its workspace, opened after the run's own checks passed."""
    return Journal.for_run(team.workspace.root, team.compiled) if wanted else None


async def _drive(team: Team, journal: Journal | None, store: ReplayStore | None = None) -> RunResult:
    """Run a checked team to its end with its journal attached; the journal is closed after
    (fsynced: an fsync that failed after the run's last barrier is a JournalError here, not
    a run that looks durable)."""
    try:
        if journal is not None:
            team.attach(journal)
        if store is not None:
            team.ctx.gateway.store = store
        result = await team.run()
    finally:
        if journal is not None:
            journal.close()
    if journal is not None and result.status != "failed":   # a failed run says why already
        journal.require_durable()
    return result


# --- resume and replay ------------------------------------------------------------------


def resume(run: str | Path | RunFolder, options: ResumeOptions | None = None, *,
           force: bool = False, **unknown: NoReturn) -> RunResult:
    """The synchronous `resume_async` (not from inside a running event loop)."""
    checked = _given("resume", options, ResumeOptions, unknown)
    return run_coroutine(resume_async(run, checked, force=force))


async def resume_async(run: str | Path | RunFolder, options: ResumeOptions | None = None, *,
                       force: bool = False, **unknown: NoReturn) -> RunResult:
    """Continue an interrupted (or ended) run in its own workspace: same run id, completed
    actions and journaled answers reused, so nothing is paid twice.

    `run` is a run folder, or one opened by `open_for_resume` (the CLI opens it first to say
    what it resumes). Refuses (JournalError) when the SOP file changed since the run (last)
    started, unless `force`. Returns this invocation's RunResult, with the artifacts that
    earlier invocations wrote. `options`: a `ResumeOptions` (a `RunOptions` that sets none of
    a new run's own fields will do): its model and limits override the run's own (None keeps
    them); `api_base` and `price` are as for `run` (never recorded); `person` answers the
    questions the journal has no answer to (None: the run waits again).
    """
    checked = _given("resume_async", options, ResumeOptions, unknown)
    folder = run if isinstance(run, RunFolder) else open_for_resume(run, force=force)
    with folder:
        team = prepare(folder.compiled, folder.origin.first.inputs, resume_options(folder, checked))
        folder.journal.begin(folder.compiled, force=force)
        remove_orphan_temp_files(folder.path)      # safe now: we hold the writer lock
        result = await _drive(team, folder.journal)
    # Actions reused from the journal do not write their files again: list those still there.
    still_there = {p for p in folder.origin.artifacts if (folder.path / p).is_file()}
    result.artifacts = sorted(set(result.artifacts) | still_there)
    return result


def answer(run: str | Path, reply: PersonAnswer, *, question_id: str | None = None) -> Question:
    """Record a person's answer to the question a `waiting` run waits for (what `sopctl
    answer` does); `resume` then continues the run. Returns the question answered.
    UsageError when the run is not waiting, `question_id` names another question, or the
    answer does not fit the output tree; the run then still waits."""
    return answer_question(run, reply, question_id=question_id)


@dataclass
class Replayed:
    """A replay's result, and whether it asked for a request the recorded journal lacks."""

    result: RunResult
    diverged: bool


def replay(run: str | Path | RunFolder, out: str | Path, options: ReplayOptions | None = None,
           **unknown: NoReturn) -> Replayed:
    """The synchronous `replay_async` (not from inside a running event loop)."""
    return run_coroutine(replay_async(run, out, _given("replay", options, ReplayOptions, unknown)))


async def replay_async(run: str | Path | RunFolder, out: str | Path,
                       options: ReplayOptions | None = None, **unknown: NoReturn) -> Replayed:
    """Run the SOP again in `out` with every answer from the run's journal; no model is called.
    `options`: a `ReplayOptions` (what the replay may do, who watches; the rest is the run's).

    A divergence (the SOP, its inputs or the engine changed) ends the replay `failed` with
    the divergence as its error, and `diverged` is True.
    """
    checked = _given("replay_async", options, ReplayOptions, unknown)
    folder = run if isinstance(run, RunFolder) else open_for_replay(run)
    with folder:
        team = prepare(folder.compiled, folder.origin.first.inputs, replay_options(folder, out, checked))
        target = _journal_of(team, True)
        assert target is not None
        store = ReplayStore(folder.journal, target)
        result = await _drive(team, target, store)
    return Replayed(result, bool(store.misses))


_T = TypeVar("_T")


def run_coroutine(coro: Coroutine[Any, Any, _T]) -> _T:
    """`asyncio.run`, with Ctrl-C (and SIGTERM, which the CLI hands to Ctrl-C's handler)
    cancelling the run's task on every Python we support: 3.11's `asyncio.run` does that
    itself, so that a run ends `interrupted` with its end journaled; on 3.10 Ctrl-C would be
    a KeyboardInterrupt wherever the run was. A second Ctrl-C stops at once, as on 3.11."""
    if sys.version_info >= (3, 11) or threading.current_thread() is not threading.main_thread():
        return asyncio.run(coro)
    return asyncio.run(_cancelled_by_ctrl_c(coro))


async def _cancelled_by_ctrl_c(coro: Coroutine[Any, Any, _T]) -> _T:
    task, loop = asyncio.current_task(), asyncio.get_running_loop()
    previous = signal.getsignal(signal.SIGINT)
    if task is None or previous is not signal.default_int_handler:   # Ctrl-C is someone else's
        return await coro
    asked: list[int] = []

    def cancel(signum: int, frame: Any) -> None:
        if asked:
            signal.default_int_handler(signum, frame)
        asked.append(signum)
        loop.call_soon_threadsafe(task.cancel)

    signal.signal(signal.SIGINT, cancel)
    try:
        return await coro
    finally:
        signal.signal(signal.SIGINT, previous)
