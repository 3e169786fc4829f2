"""The Python API: load an SOP, run it, or iterate over its events (for embedding and tests).

    sop = engine.api.load("sops/review.sop.yaml")
    result = engine.api.run(sop, {"idea": "a todo CLI"}, model="fake", workspace="out/")
    async for event in engine.api.iter_run(sop, {"idea": "..."}, model="fake"): ...

Inputs are checked here (unknown keys, missing required ones, types), so every front end
(CLI, API) refuses a bad run the same way, before anything starts.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, AsyncIterator, Mapping

from engine.check.compiler import CompiledSop, compile_path
from engine.errors import UsageError
from engine.run.events import RunEnded, RunEvent
from engine.run.inputs import check_limits, parse_input_flags, resolve_inputs
from engine.run.team import RunOptions, RunResult, Team, new_run_id

__all__ = ["load", "resolve_inputs", "parse_input_flags", "prepare", "check_limits", "run", "run_async",
           "iter_run", "RunResult", "RunOptions", "new_run_id"]


def load(path: str | Path) -> CompiledSop:
    """Compile an SOP file (raises CompileError with the diagnostics if it has errors)."""
    return compile_path(path)


def prepare(compiled: CompiledSop, inputs: Mapping[str, Any] | None = None,
            **options: Any) -> Team:
    """A Team ready to run (inputs checked); call `check()`, `attach(journal)`, `await run()`."""
    return Team(compiled, resolve_inputs(compiled, inputs or {}), _options(**options))


def _options(**kwargs: Any) -> RunOptions:
    check_limits(kwargs.get("max_rounds"), kwargs.get("budget_usd"))
    try:
        return RunOptions(**kwargs)
    except TypeError as exc:
        raise UsageError(f"bad run option: {exc}") from None


async def run_async(compiled: CompiledSop, inputs: Mapping[str, Any] | None = None,
                    **options: Any) -> RunResult:
    """Run to the end (options: model, max_rounds, budget_usd, workspace, allow_exec, run_id,
    observers, completed, store, replay, gateway)."""
    values = resolve_inputs(compiled, inputs or {})
    return await Team(compiled, values, _options(**options)).run()


def run(compiled: CompiledSop, inputs: Mapping[str, Any] | None = None,
        **options: Any) -> RunResult:
    """The synchronous `run_async` (not from inside a running event loop)."""
    return asyncio.run(run_async(compiled, inputs, **options))


class _Queue:
    """An observer that hands events to the iterator."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[RunEvent] = asyncio.Queue()

    def on_event(self, event: RunEvent) -> None:
        self.queue.put_nowait(event)


async def iter_run(compiled: CompiledSop, inputs: Mapping[str, Any] | None = None,
                   **options: Any) -> AsyncIterator[RunEvent]:
    """Every event of a run, in order, ending with RunEnded; leaving early cancels the run."""
    values = resolve_inputs(compiled, inputs or {})
    sink = _Queue()
    opts = _options(**options)
    opts.observers = [*opts.observers, sink]
    team = Team(compiled, values, opts)
    team.check()
    task = asyncio.ensure_future(team.run())
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
