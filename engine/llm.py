"""The one gateway between actions and models (litellm, `local`, `fake`).

INTERFACE SKETCH — owned by the gateway work (issue 3); the interpreter codes against
`CallSpec`, `CallResult`, `AnswerStore` and `Gateway.call` exactly as declared here.
litellm is imported lazily, never at `import engine`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

__all__ = ["CallSpec", "CallResult", "StoredAnswer", "AnswerStore", "Usage", "Gateway"]

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
    schema: dict | None = None       # JSON Schema of the output (kind json)
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
    value: Any                       # validated dict (json) / str (text) / code str / int (choice)
    text: str                        # the raw accepted answer
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    calls: int = 0                   # model calls made for this result (re-asks included)
    reused: int = 0                  # answers taken from the journal instead of the model


@dataclass(frozen=True)
class StoredAnswer:
    text: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float


class AnswerStore(Protocol):
    """The journal's side of the gateway: answers keyed by a hash of the canonical request."""

    def lookup(self, request_hash: str) -> StoredAnswer | None: ...

    def record(self, request_hash: str, action: str, answer: StoredAnswer) -> None: ...


@dataclass
class Usage:
    llm_calls: int = 0
    reused_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0


@dataclass
class Gateway:
    budget_usd: float = 0.0                 # 0 = no limit; checked before every call
    store: AnswerStore | None = None        # reuse journaled answers, record new ones
    replay: bool = False                    # True: a request missing from `store` is a divergence
    usage: Usage = field(default_factory=Usage)

    async def call(self, spec: CallSpec) -> CallResult:
        raise NotImplementedError
