"""The Python API: load an SOP, run it, or iterate over its events (for embedding and tests).

    sop = engine.api.load("sops/review.sop.yaml")
    result = engine.api.run(sop, {"idea": "a todo CLI"}, model="fake", workspace="out/")
    async for event in engine.api.iter_run(sop, {"idea": "..."}, model="fake"): ...

Inputs are checked here (unknown keys, missing required ones, types), so every front end
(CLI, API) refuses a bad run the same way, before anything starts.
"""

from __future__ import annotations

import asyncio
import difflib
from pathlib import Path
from typing import Any, AsyncIterator, Mapping

from .compiler import CompiledSop, compile_path
from .errors import UsageError
from .events import RunEnded, RunEvent
from .spec import InputSpec
from .team import RunOptions, RunResult, Team, new_run_id

__all__ = ["load", "resolve_inputs", "parse_input_flags", "prepare", "check_limits", "run", "run_async",
           "iter_run", "RunResult", "RunOptions", "new_run_id"]

_TRUE = {"true", "yes", "y", "1", "on"}
_FALSE = {"false", "no", "n", "0", "off"}


def load(path: str | Path) -> CompiledSop:
    """Compile an SOP file (raises CompileError with the diagnostics if it has errors)."""
    return compile_path(path)


def resolve_inputs(compiled: CompiledSop, given: Mapping[str, Any]) -> dict[str, Any]:
    """Declared inputs with defaults applied and values coerced; UsageError for bad ones."""
    declared = compiled.spec.inputs
    unknown = [k for k in given if k not in declared and k != "idea"]
    if unknown:
        raise UsageError(f"unknown input '{unknown[0]}'", hint=_did_you_mean(unknown[0], declared))
    values: dict[str, Any] = {}
    for key, spec in declared.items():
        if key in given and given[key] is not None:
            values[key] = _coerce(key, spec, given[key])
        elif spec.required:
            flag = "--idea TEXT" if key == "idea" else f"--input {key}=VALUE"
            raise UsageError(f"missing required input '{key}'" +
                             (f" ({spec.description})" if spec.description else ""),
                             hint=f"pass {flag}")
        else:
            values[key] = spec.default
    if "idea" in given and "idea" not in declared:
        values["idea"] = str(given["idea"])
    return values


def _did_you_mean(key: str, declared: Mapping[str, InputSpec]) -> str:
    names = sorted(set(declared) | {"idea"})
    close = difflib.get_close_matches(key, names, n=1)
    if close:
        return f"did you mean '{close[0]}'? declared inputs: {', '.join(names)}"
    return f"declared inputs: {', '.join(names)}"


def _coerce(key: str, spec: InputSpec, value: Any) -> Any:
    """Command-line values are strings; turn them into the declared type or say why not."""
    kind = spec.type
    try:
        if kind == "str":
            return str(value)
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE | _FALSE:
                return text in _TRUE
            raise ValueError
        if isinstance(value, bool):
            raise ValueError
        return int(value) if kind == "int" else float(value)
    except (TypeError, ValueError):
        raise UsageError(f"input '{key}' must be {kind}, got {value!r}") from None


def parse_input_flags(pairs: list[str], idea: str | None = None) -> dict[str, str]:
    """`--input k=v` flags (and `--idea`) as a mapping; a flag without `=` is a UsageError."""
    given: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--input expects KEY=VALUE, got {pair!r}")
        given[key.strip()] = value
    if idea is not None:
        given["idea"] = idea
    return given


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


def check_limits(max_rounds: int | None, budget_usd: float | None) -> None:
    """The run's overrides (`--rounds`, `--budget`), refused before anything starts."""
    if max_rounds is not None and max_rounds < 1:
        raise UsageError("--rounds (max_rounds) must be at least 1")
    if budget_usd is not None and budget_usd < 0:
        raise UsageError("--budget (budget_usd) must be 0 (no limit) or more")


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
