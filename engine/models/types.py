"""What the gateway and the providers exchange: call specs, requests, answers, the `Provider`
protocol, the answer store's protocol and the model errors. Plain data, no behaviour, so
every other models module (and the journal) can import it without importing a provider."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Protocol

from engine.errors import LLMError

__all__ = ['CallSpec', 'is_secret_name', 'CallResult', 'StoredAnswer', 'AnswerStore', 'Usage', 'CallEvent', 'ModelRequest', 'ModelAnswer', 'Provider', 'TransientModelError', 'RealModelBlocked', 'request_hash']


_SECRET_NAME = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|ACCESS_KEY)", re.I)


def is_secret_name(name: str) -> bool:
    """An environment variable that holds a key: never journaled, never given to commands."""
    return bool(_SECRET_NAME.search(name))


CallKind = Literal["json", "text", "code", "choice"]


@dataclass(frozen=True)
class CallSpec:
    """What one action (or one for_each item, or one react choice) asks of the model."""

    action: str                      # action id, named in errors and the journal
    role: str                        # role id
    system: str                      # the role's prefix (system prompt)
    prompt: str                      # rendered prompt, declared context included
    kind: CallKind                   # json: fill `schema`; text; code: first fenced block; choice
    model: str                       # resolved model name: "fake", "local" or a litellm string
    schema: dict[str, Any] | None = None  # JSON Schema of the output (kind json)
    code_lang: str | None = None     # kind code
    format: Literal["json", "markdown"] = "json"
    retries: int = 2                 # re-asks after an invalid answer, error shown to the model
    n_choices: int = 0               # kind choice: valid answers are -1 .. n_choices-1
    previous_choice: int = -1        # kind choice: the state before (lets `fake` answer "next")
    temperature: float | None = None
    max_tokens: int | None = None
    timeout_s: float | None = None


@dataclass
class CallResult:
    """The accepted answer of one `Gateway.call`, with what it cost this invocation."""

    value: Any                       # validated dict (json) / str (text) / code str / int (choice)
    text: str                        # the raw accepted answer
    prompt_tokens: int = 0           # tokens of model calls made now (reused answers: 0)
    completion_tokens: int = 0
    cost_usd: float = 0.0            # paid now; reused answers are not paid again
    calls: int = 0                   # model calls made for this result (re-asks included)
    reused: int = 0                  # answers taken from the journal instead of the model
    attempts: int = 0                # answers read (model or journal); 1 = accepted first time


@dataclass(frozen=True)
class StoredAnswer:
    """One model answer as the journal keeps it (never the request's API key)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    model: str = ""
    seconds: float = 0.0


class AnswerStore(Protocol):
    """The journal's side of the gateway: answers keyed by a hash of the canonical request."""

    def lookup(self, request_hash: str) -> StoredAnswer | None: ...

    def record(self, request_hash: str, action: str, answer: StoredAnswer) -> None: ...


@dataclass
class Usage:
    """Totals of one gateway (one invocation of a run)."""

    llm_calls: int = 0               # model calls made
    reused_calls: int = 0            # answers taken from the journal
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0            # paid by this invocation
    reused_cost_usd: float = 0.0     # recorded cost of reused answers (counts toward the budget)
    retries: int = 0                 # transient-error retries
    reasks: int = 0                  # re-asks after an invalid answer

    @property
    def budget_spent_usd(self) -> float:
        """What the budget is checked against: paid now plus paid earlier for reused answers."""
        return self.cost_usd + self.reused_cost_usd


@dataclass(frozen=True)
class CallEvent:
    """A step of a call, for the live display and the run log (see module docstring)."""

    kind: Literal["start", "answer", "reused", "retry", "invalid"]
    spec: CallSpec
    attempt: int                     # 0 = first ask, 1.. = re-asks
    request_hash: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    detail: str = ""                 # retry: the transient error; invalid: the validation error


@dataclass(frozen=True)
class ModelRequest:
    """One request to a model: what providers receive and what the request hash covers."""

    spec: CallSpec
    messages: tuple[dict[str, str], ...]
    response_format: dict[str, Any] | None
    attempt: int = 0

    def canonical(self) -> dict[str, Any]:
        """Everything that determines the answer, and nothing secret."""
        spec = self.spec
        data: dict[str, Any] = {
            "v": 1, "model": spec.model, "kind": spec.kind, "messages": list(self.messages),
            "response_format": self.response_format, "temperature": spec.temperature,
            "max_tokens": spec.max_tokens,
        }
        if spec.kind == "json":
            data["schema"], data["format"] = spec.schema, spec.format
        if spec.kind == "code":
            data["code_lang"] = spec.code_lang
        if spec.kind == "choice":
            data["n_choices"], data["previous_choice"] = spec.n_choices, spec.previous_choice
        return data

    def hash(self) -> str:
        return request_hash(self.canonical())


@dataclass(frozen=True)
class ModelAnswer:
    """A provider's raw answer: text to be parsed by the gateway, plus tokens and cost."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0


class Provider(Protocol):
    """Anything that answers model requests: litellm, `fake`, `local`, a test's ScriptedModel."""

    def supports_schema(self, model: str) -> bool:
        """True: a `json` request carries the schema as `response_format`."""
        ...

    async def complete(self, request: ModelRequest) -> ModelAnswer: ...


class TransientModelError(LLMError):
    """Rate limit, timeout, connection or server error: the gateway retries with backoff."""


class RealModelBlocked(LLMError):
    """A real model was called while `engine.testing.block_real_models()` is active."""


def request_hash(canonical: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces, UTF-8) of a request."""
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
