"""Helpers for testing SOPs (and sopctl itself) without a real model.

- `ScriptedModel`: answers from a list, in order, or from a function `(spec, attempt) -> answer`;
  it records every request so a test can assert on what the model was shown (`prompts()`,
  `asked()`), and the most requests it answered at once (`max_in_flight`). An answer that is
  an exception is raised instead of answered (e.g. `TransientModelError` to test backoff).
  Its answers are TEXT: the gateway parses and validates them like any other; an answer
  that is not text (a dict for a json action, a number for a state choice) is sent as its
  JSON. With `gate` set, every answer waits for that event (a call kept in flight).
- `use_model(model)`: inside the block every call goes to `model`, whatever model the SOP
  or the command line names; `use_model(model, name="scripted")` instead registers it under
  a name for `--model scripted`.
- `block_real_models()`: inside the block any call to a real model (litellm, `local`)
  raises `RealModelBlocked`; `allow_real_models()` lifts it for one test. As a pytest
  plugin (`pytest_plugins = ["engine.testing"]` in a conftest.py) it is on for the session.
- `MemoryAnswerStore`: a dict-backed `AnswerStore`, for journal reuse and replay tests.
- `ScriptedPerson`: a person whose answers the test writes (`RunOptions(person=...)`): a list,
  in order, or a function of the `Question`; once the list is spent the run waits, as it
  does with nobody at a terminal. It records every question asked and every reply told.

This module imports neither pytest nor litellm.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Iterator, Sequence

from engine.errors import LLMError
from engine.models import registry
from engine.run.people import PersonAnswer, Question, WaitingForPerson
from engine.models.types import (
    CallSpec,
    ModelAnswer,
    ModelRequest,
    Price,
    Provider,
    StoredAnswer,
)

__all__ = ["ScriptedModel", "ScriptedPerson", "MemoryAnswerStore", "use_model", "block_real_models",
           "allow_real_models", "pytest_configure", "pytest_unconfigure"]


Answer = Any
"""Text; an exception (raised); anything else is sent as its JSON."""

Script = Sequence[Answer] | Callable[[CallSpec, int], Answer]


@dataclass
class ScriptedModel:
    """A model whose answers the test writes: a list (in order) or a function of the request."""

    answers: Script
    schema_support: bool = False
    """True: requests carry the schema as `response_format` (like a structured-output model)."""
    tokens_per_char: float = 0.25
    cost_per_call: float = 0.0
    """Pretend price of each answer (for budget tests)."""
    token_price: Price | None = None
    """Pretend price per token, told to the gateway (`price`) and added to each answer's cost."""
    gate: asyncio.Event | None = None
    """Set: every answer waits until the event is set (to test a call in flight, cancellation)."""
    instant: bool = False
    """True: answers without yielding to the event loop, as `fake` does at 0 ms (each call of a
    fan-out then gets its answer before the next one starts)."""
    requests: list[ModelRequest] = field(default_factory=list)
    """Every request received, in order (re-asks included)."""
    in_flight: int = 0
    max_in_flight: int = 0
    """The most requests answered at once (a fan-out's concurrency, observed without timing)."""

    def supports_schema(self, model: str) -> bool:
        return self.schema_support

    def price(self, model: str) -> Price | None:
        """`token_price`; None (unknown) by default: under a budget its calls run one at a time."""
        return self.token_price

    async def complete(self, request: ModelRequest) -> ModelAnswer:
        index = len(self.requests)        # taken now: concurrent requests append while we wait
        self.requests.append(request)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if not self.instant:
                await asyncio.sleep(0)    # yield like a real model: concurrent requests overlap
            if self.gate is not None:
                await self.gate.wait()
            text = self._text(self._next(request, index))
        finally:
            self.in_flight -= 1
        prompt_chars = sum(len(m.get("content", "")) for m in request.messages)
        prompt_tokens = int(prompt_chars * self.tokens_per_char)
        completion_tokens = int(len(text) * self.tokens_per_char)
        cost = self.cost_per_call
        if self.token_price is not None:
            cost += self.token_price.cost(prompt_tokens, completion_tokens)
        return ModelAnswer(text=text, prompt_tokens=prompt_tokens,
                           completion_tokens=completion_tokens, cost_usd=cost)

    def _next(self, request: ModelRequest, index: int) -> Answer:
        if callable(self.answers):
            return self.answers(request.spec, request.attempt)
        if index >= len(self.answers):
            raise LLMError(f"ScriptedModel ran out of answers: request {index + 1} (action "
                           f"{request.spec.action}) but only {len(self.answers)} scripted")
        return self.answers[index]

    @staticmethod
    def _text(answer: Answer) -> str:
        if isinstance(answer, BaseException):
            raise answer
        return answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)

    @property
    def calls(self) -> int:
        """How many requests reached this model."""
        return len(self.requests)

    def prompts(self) -> list[str]:
        """What the model was asked each time: every message of the request but the system
        prompt, in order (a tool loop's earlier steps are earlier messages of its request)."""
        return ["\n\n".join(m["content"] for m in r.messages if m["role"] != "system")
                for r in self.requests]

    def asked(self, kind: str | None = None) -> list[str]:
        """The action of every request, in order; with `kind` ("json", "text", "code",
        "choice"), only the requests of that kind of call."""
        return [r.spec.action for r in self.requests if kind is None or r.spec.kind == kind]


PersonReply = PersonAnswer | str | dict
"""A `PersonAnswer`, or a bare value (text, or an object for an output tree) to answer with."""


@dataclass
class ScriptedPerson:
    """A person whose answers the test writes: a list (in order) or a function of the question.

    A bare value is the answer's value; `PersonAnswer("approve")`, `PersonAnswer("edit", v)`
    and `PersonAnswer("reject", comment=...)` review. Once a list is spent, the run waits."""

    answers: Sequence[PersonReply] | Callable[[Question], PersonReply]
    questions: list[Question] = field(default_factory=list)
    """Every question asked, in order."""
    told: list[tuple[str, str]] = field(default_factory=list)
    """Every (role, text) a `kind: reply` action sent."""

    def ask(self, question: Question) -> PersonAnswer:
        index = len(self.questions)
        self.questions.append(question)
        if callable(self.answers):
            reply = self.answers(question)
        elif index < len(self.answers):
            reply = self.answers[index]
        else:
            raise WaitingForPerson(question)
        return reply if isinstance(reply, PersonAnswer) else PersonAnswer("answer", reply)

    def tell(self, role: str, text: str) -> None:
        self.told.append((role, text))


@dataclass
class MemoryAnswerStore:
    """An in-memory journal of answers: `lookup`/`record` as the gateway expects."""

    answers: dict[str, StoredAnswer] = field(default_factory=dict)
    actions: dict[str, str] = field(default_factory=dict)

    def lookup(self, request_hash: str) -> StoredAnswer | None:
        return self.answers.get(request_hash)

    def holds(self, request_hash: str) -> bool:
        return request_hash in self.answers

    def record(self, request_hash: str, action: str, answer: StoredAnswer) -> None:
        self.answers[request_hash] = answer
        self.actions[request_hash] = action


@contextlib.contextmanager
def use_model(model: Provider, name: str | None = None) -> Iterator[Provider]:
    """Route every call to `model` (or, with `name`, register it as that model name)."""
    if name is None:
        with registry.override_model(model):
            yield model
        return
    previous = registry.register_model(name, model)
    try:
        yield model
    finally:
        if previous is None:
            registry.unregister_model(name)
        else:
            registry.register_model(name, previous)


class _Switch(contextlib.ContextDecorator):
    """A context manager (and decorator) that moves the real-model guard by `step`."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.saved = 0

    def __enter__(self) -> _Switch:
        self.saved = registry._BLOCKED[0]
        registry._BLOCKED[0] = max(self.saved + self.step, 0) if self.step > 0 else 0
        return self

    def __exit__(self, *exc: Any) -> None:
        registry._BLOCKED[0] = self.saved


def block_real_models() -> _Switch:
    """Any real model call (litellm, `local`) inside raises RealModelBlocked."""
    return _Switch(+1)


def allow_real_models() -> _Switch:
    """Lift the guard inside (for a test that means to run the real `local` model)."""
    return _Switch(-1)


_SESSION: list[_Switch] = []


def pytest_configure(config: Any) -> None:
    """pytest plugin hook: block real models for the whole session."""
    switch = block_real_models()
    switch.__enter__()
    _SESSION.append(switch)


def pytest_unconfigure(config: Any) -> None:
    while _SESSION:
        _SESSION.pop().__exit__(None, None, None)
