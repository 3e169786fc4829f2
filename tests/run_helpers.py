"""Test doubles for the interpreter's tests: a scripted Gateway and a SOP loader.

`ScriptedGateway` has the gateway's shape (`call(CallSpec) -> CallResult`) and answers from
a function of the request, so each test states exactly what the "model" says. It also
records every request and the most calls in flight at once (concurrency without timing).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Callable

from engine.check.compiler import CompiledSop, compile_path, compile_text
from engine.errors import LLMError
from engine.models.gateway import Gateway
from engine.models.types import CallResult, CallSpec

SOPS = Path(__file__).parent / "sops"

Answer = Callable[[CallSpec], Any]


def instance(schema: dict | None, key: str = "value") -> Any:
    """A small value that validates against `schema` (like the contract's `fake`)."""
    schema = schema or {"type": "string"}
    if "anyOf" in schema:
        return instance(schema["anyOf"][0], key)
    kind = schema.get("type")
    if "enum" in schema:
        return schema["enum"][0]
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: instance(v, k) for k, v in props.items()}
    if kind == "array":
        return [instance(schema.get("items"), key)]
    if kind == "boolean":
        return False
    if kind in ("integer", "number"):
        return 0
    return f"{key} text"


def default_answer(spec: CallSpec) -> Any:
    if spec.kind == "json":
        return instance(spec.schema)
    if spec.kind == "code":
        return "print('hello')"
    if spec.kind == "choice":
        nxt = spec.previous_choice + 1
        return nxt if nxt < spec.n_choices else -1
    return f"{spec.action} says hello"


class ScriptedGateway(Gateway):
    """Answers `answer(spec)`; an Exception instance as answer is raised (as LLMError etc.)."""

    def __init__(self, answer: Answer = default_answer, cost: float = 0.0,
                 gate: asyncio.Event | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.answer = answer
        self.cost = cost
        self.gate = gate
        self.requests: list[CallSpec] = []
        self.in_flight = 0
        self.max_in_flight = 0

    def preflight(self, model: str) -> None:
        """The scripted gateway answers every model name itself."""

    async def call(self, spec: CallSpec) -> CallResult:
        self.requests.append(spec)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0)
            if self.gate is not None:
                await self.gate.wait()
            value = self.answer(spec)
            if isinstance(value, BaseException):
                raise value
            if isinstance(value, tuple):  # (value, raw text) for choices given as text
                value, text = value
            else:
                text = str(value)
            for totals in (self.usage,):
                totals.llm_calls += 1
                totals.prompt_tokens += 10
                totals.completion_tokens += 5
                totals.cost_usd += self.cost
            return CallResult(value=value, text=text, prompt_tokens=10, completion_tokens=5,
                              cost_usd=self.cost, calls=1)
        finally:
            self.in_flight -= 1

    def actions(self, kind: str | None = None) -> list[str]:
        """The action ids asked for, in call order (optionally of one kind)."""
        return [r.action for r in self.requests if kind is None or r.kind == kind]


def sop(name: str) -> CompiledSop:
    return compile_path(SOPS / f"{name}.sop.yaml")


def sop_text(text: str) -> CompiledSop:
    return compile_text(text)


def llm_error(message: str) -> LLMError:
    return LLMError(message)



def run_sop(compiled: CompiledSop, gateway: Gateway, workspace: Path, idea: str = "an idea",
            **options: Any) -> Any:
    """Run to the end on `gateway`, collecting every event; returns (result, events)."""
    from engine import api

    class Collect:
        def __init__(self) -> None:
            self.events: list[Any] = []

        def on_event(self, event: Any) -> None:
            self.events.append(event)

    sink = Collect()
    observers = [*options.pop("observers", []), sink]
    result = api.run(compiled, {"idea": idea, **options.pop("inputs", {})}, gateway=gateway,
                     workspace=workspace, observers=observers, **options)
    result.events = sink.events
    return result


def logs(result: Any, level: str | None = None) -> list[str]:
    """The RunLog lines of a run (optionally of one level)."""
    from engine.run.events import RunLog

    return [e.message for e in result.events
            if isinstance(e, RunLog) and (level is None or e.level == level)]
