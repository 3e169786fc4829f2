"""The Python API, and the one way a run starts: `run`, `iter_run`, `resume`, `replay`.

    sop = engine.api.load("sops/review.sop.yaml")
    result = engine.api.run(sop, {"idea": "a todo CLI"}, model="fake", workspace="out/")
    async for event in engine.api.iter_run(sop, {"idea": "..."}, model="fake"): ...
    result = engine.api.resume("out/", budget=2.0)
    replayed = engine.api.replay("out/", "replayed/")

Every run is journaled by default (`<workspace>/.sopctl/journal.sqlite`), so whatever starts
it — the CLI, a benchmark, a user's script — can resume it after a crash without paying
twice; pass `journal=False` for a throwaway run. Inputs and limits are checked before
anything starts, so every front end refuses a bad run the same way. The CLI and the
benchmarks call these functions and hold no copy of them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import AsyncIterator, Mapping

from engine.compile.compiler import CompiledSop, compile_path
from engine.errors import UsageError
from engine.journal.resume import (
    RunFolder,
    open_for_replay,
    open_for_resume,
    remove_orphan_temp_files,
    replay_options,
    resume_options,
)
from engine.journal.inbox import answer_question
from engine.journal.store import Journal, ReplayStore
from engine.models.types import Price
from engine.run.events import RunEnded, RunEvent
from engine.run.experience import ExperiencePool
from engine.run.inputs import check_limits, parse_input_flags, resolve_inputs
from engine.run.people import Person, PersonAnswer, Question
from engine.run.team import RunOptions, RunResult, Team, new_run_id

__all__ = ["load", "resolve_inputs", "parse_input_flags", "prepare", "check_limits", "run",
           "run_async", "iter_run", "resume", "resume_async", "replay", "replay_async", "Replayed", "open_for_resume",
           "open_for_replay", "RunFolder", "RunResult", "RunOptions", "new_run_id", "answer",
           "PersonAnswer", "Question"]


def load(path: str | Path, include_dirs: tuple[str | Path, ...] = ()) -> CompiledSop:
    """Compile an SOP file (raises CompileError with the diagnostics if it has errors);
    `include_dirs`: folders besides the file's own that its `include:` may name."""
    return compile_path(path, include_dirs)


def prepare(compiled: CompiledSop, inputs: Mapping[str, Any] | None = None,
            **options: Any) -> Team:
    """A Team ready to run (inputs and limits checked), without a journal: for tools that
    drive the interpreter themselves. `run`, `iter_run`, `resume` and `replay` use it."""
    return Team(compiled, resolve_inputs(compiled, inputs or {}), _options(**options))


def _options(**kwargs: Any) -> RunOptions:
    check_limits(kwargs.get("max_rounds"), kwargs.get("budget_usd"))
    try:
        return RunOptions(**kwargs)
    except TypeError as exc:
        raise UsageError(f"bad run option: {exc}") from None


# --- a new run --------------------------------------------------------------------------


def run(compiled: CompiledSop, inputs: Mapping[str, Any] | None = None, *,
        journal: bool = True, **options: Any) -> RunResult:
    """The synchronous `run_async` (not from inside a running event loop)."""
    return asyncio.run(run_async(compiled, inputs, journal=journal, **options))


async def run_async(compiled: CompiledSop, inputs: Mapping[str, Any] | None = None, *,
                    journal: bool = True, **options: Any) -> RunResult:
    """Run to the end, journaled in the workspace unless `journal=False`.

    Options: model, max_rounds, budget_usd, workspace (default runs/<run-id>), allow_exec,
    isolate and allow_network (exec commands under bubblewrap), run_id, observers,
    store, gateway, api_base (where hosted models are reached), price (a `Price` for models
    litellm cannot price), pool (an experience pool, `engine.journal.pool.Pool.open(path)`). A run cannot start (UsageError, RunError)
    before any model call or file write: bad inputs, exec not allowed, an unusable model.
    """
    team = prepare(compiled, inputs, **options)
    return await _drive(team, _journal_of(team, journal))


async def iter_run(compiled: CompiledSop, inputs: Mapping[str, Any] | None = None, *,
                   journal: bool = True, **options: Any) -> AsyncIterator[RunEvent]:
    """Every event of a run, in order, ending with RunEnded; leaving early cancels the run."""
    sink = _Queue()
    options["observers"] = [*options.get("observers", ()), sink]
    team = prepare(compiled, inputs, **options)
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
    team.check()
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


def resume(run: str | Path | RunFolder, *, budget: float | None = None, rounds: int | None = None,
           model: str | None = None, allow_exec: bool = False, force: bool = False,
           observers: tuple[Any, ...] = (), api_base: str | None = None,
           price: Price | None = None, isolate: bool = False,
           allow_network: bool = False, person: Person | None = None,
           pool: ExperiencePool | None = None,
           allow_hosts: tuple[str, ...] | list[str] = ()) -> RunResult:
    """The synchronous `resume_async` (not from inside a running event loop)."""
    return asyncio.run(resume_async(run, budget=budget, rounds=rounds, model=model,
                                    allow_exec=allow_exec, force=force, observers=observers,
                                    api_base=api_base, price=price, isolate=isolate,
                                    allow_network=allow_network, person=person, pool=pool,
                                    allow_hosts=allow_hosts))


async def resume_async(run: str | Path | RunFolder, *, budget: float | None = None,
                       rounds: int | None = None, model: str | None = None,
                       allow_exec: bool = False, force: bool = False,
                       observers: tuple[Any, ...] = (), api_base: str | None = None,
                       price: Price | None = None, isolate: bool = False,
                       allow_network: bool = False, person: Person | None = None,
                       pool: ExperiencePool | None = None,
                       allow_hosts: tuple[str, ...] | list[str] = ()) -> RunResult:
    """Continue an interrupted (or ended) run in its own workspace: same run id, completed
    actions and journaled answers reused, so nothing is paid twice.

    `run` is a run folder, or one opened by `open_for_resume` (the CLI opens it first to say
    what it resumes). Refuses (JournalError) when the SOP file changed since the run (last)
    started, unless `force`. Returns this invocation's RunResult, with the artifacts that
    earlier invocations wrote. `api_base` and `price`: as for `run` (never recorded).
    `person` answers questions the journal has no answer to (None: the run waits again).
    `pool`: the experience pool (`engine.journal.pool.Pool`), as for `run`.
    """
    check_limits(rounds, budget)
    folder = run if isinstance(run, RunFolder) else open_for_resume(run, force=force)
    with folder:
        options = resume_options(folder, budget=budget, rounds=rounds, model=model,
                                 allow_exec=allow_exec)
        team = prepare(folder.compiled, folder.origin.first.inputs, observers=observers,
                       api_base=api_base, price=price, isolate=isolate,
                       allow_network=allow_network, person=person, pool=pool,
                       allow_hosts=allow_hosts, **options)
        team.check()
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


def replay(run: str | Path | RunFolder, out: str | Path, *, allow_exec: bool = False,
           observers: tuple[Any, ...] = (), isolate: bool = False, allow_network: bool = False,
           allow_hosts: tuple[str, ...] | list[str] = ()) -> Replayed:
    """The synchronous `replay_async` (not from inside a running event loop)."""
    return asyncio.run(replay_async(run, out, allow_exec=allow_exec, observers=observers,
                                    isolate=isolate, allow_network=allow_network,
                                    allow_hosts=allow_hosts))


async def replay_async(run: str | Path | RunFolder, out: str | Path, *, allow_exec: bool = False,
                       observers: tuple[Any, ...] = (), isolate: bool = False,
                       allow_network: bool = False,
                       allow_hosts: tuple[str, ...] | list[str] = ()) -> Replayed:
    """Run the SOP again in `out` with every answer from the run's journal; no model is called.

    A divergence (the SOP, its inputs or the engine changed) ends the replay `failed` with
    the divergence as its error, and `diverged` is True.
    """
    folder = run if isinstance(run, RunFolder) else open_for_replay(run)
    with folder:
        options = replay_options(folder, out, allow_exec=allow_exec)
        team = prepare(folder.compiled, folder.origin.first.inputs, observers=observers,
                       isolate=isolate, allow_network=allow_network, allow_hosts=allow_hosts,
                       **options)
        target = _journal_of(team, True)
        assert target is not None
        store = ReplayStore(folder.journal, target)
        result = await _drive(team, target, store)
    return Replayed(result, bool(store.misses))
