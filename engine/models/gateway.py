"""The one gateway between actions and models: `fake`, `local`, and every litellm model.

`await Gateway(...).call(CallSpec(...))` turns one action's request into an accepted value:

1. The provider is resolved from `spec.model` (already resolved upstream): an active
   `override_model(...)`, the gateway's own `providers`, the registry (`register_model`;
   built-ins `fake` and `local`), else litellm.
2. Messages are built by `engine.models.answers` (our wording). A `json` action's schema travels as
   `response_format` when the provider supports structured output, else in the prompt.
3. Each model request (the first ask and every re-ask) gets a `request_hash`: sha256 of the
   canonical JSON of everything that determines the answer (model, messages, schema and
   response_format, temperature, max_tokens, kind) and never an API key. A hash found in
   `store` is **reused**: no model call, counted in `usage.reused_calls`. Missing under
   `replay=True` it is a `ReplayDivergence`. Otherwise the model is called and the answer
   is recorded in `store` at once, before it is parsed, so a crash never loses a paid answer.
4. The answer is parsed and validated (`engine.models.answers.read`). An invalid answer is never
   accepted: it is shown back to the model with the error, up to `spec.retries` times, then
   `ActionFailed` names the action and the last error. `choice` answers are never invalid.

Transport: our own retry with exponential backoff (and jitter) for rate limits, timeouts,
connection and 5xx errors (`TransientModelError`); litellm runs with `num_retries=0` and no
cache. Other provider errors become `LLMError` with a clear message; a missing key names the
environment variable to set. Key values are redacted from every message we raise.

Budget: checked before every model call. `usage.cost_usd` is what this invocation paid.
Answers reused from the journal were paid when they were recorded: they are not paid again
(not added to `cost_usd`), but their recorded cost counts toward the budget once, through
`usage.reused_cost_usd`, so a resumed run keeps the budget of the whole run. Concurrent
calls (for_each fan-out) are admitted while the spend plus every in-flight call, each
estimated at the dearest call seen so far, stays under the budget; before any cost is known
calls go one at a time. So a run overspends by at most about one call.

Events: `on_call(CallEvent)` is called (in the event loop) when a model call starts
(`start`), when its answer arrives (`answer`, with tokens, cost and seconds), when a journal
answer is reused (`reused`), before a transient-error retry (`retry`), and when an answer is
rejected (`invalid`, with the error). The live display and the run log subscribe to it.

Hosted models live in `engine.models.hosted` (the only module that touches litellm), imported by
the first call that needs it, never at `import engine`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping

from engine.errors import (
    ActionFailed,
    BudgetExceeded,
    LLMError,
    ReplayDivergence,
    SopError,
)
from engine.models import answers
from engine.models.registry import _resolve
from engine.models.types import (
    AnswerStore,
    CallEvent,
    CallResult,
    CallSpec,
    ModelAnswer,
    ModelRequest,
    Provider,
    StoredAnswer,
    TransientModelError,
    Usage,
)

__all__ = ['Gateway']


# --------------------------------------------------------------------------- the gateway


@dataclass
class Gateway:
    """Asks models for answers on behalf of actions: reuse, budget, retries, validation."""

    budget_usd: float = 0.0                 # 0 = no limit; checked before every call
    store: AnswerStore | None = None        # reuse journaled answers, record new ones
    replay: bool = False                    # True: a request missing from `store` is a divergence
    usage: Usage = field(default_factory=Usage)
    on_call: Callable[[CallEvent], None] | None = None
    """Observer of call steps (start / answer / reused / retry / invalid)."""
    providers: Mapping[str, Provider] = field(default_factory=dict)
    """Models of this gateway only, consulted before the global registry."""
    transient_retries: int = 5              # retries of one request after transient errors
    backoff_s: float = 1.0                  # first backoff; doubles each retry, with jitter
    backoff_max_s: float = 30.0
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep
    """How backoff waits (tests pass a recorder instead of sleeping)."""
    _hosted: Provider | None = field(default=None, repr=False)
    _admission: tuple[Any, asyncio.Condition] | None = field(default=None, repr=False)
    _in_flight: int = field(default=0, repr=False)
    _max_call_cost: float | None = field(default=None, repr=False)

    def provider(self, model: str) -> Provider:
        """The provider that answers `model` for this gateway."""
        return _resolve(model, self.providers, self._hosted_provider)

    def _hosted_provider(self) -> Provider:
        """litellm, for every model name that is not registered (imported on first use)."""
        if self._hosted is None:
            from engine.models.hosted import LiteLLMProvider

            self._hosted = LiteLLMProvider()
        return self._hosted

    def preflight(self, model: str) -> None:
        """Fail before a run starts if `model` cannot work (e.g. the local extra is missing)."""
        check = getattr(self.provider(model), "preflight", None)
        if check is not None:
            check(model)

    async def call(self, spec: CallSpec) -> CallResult:
        """The accepted answer for `spec`, or ActionFailed / LLMError / BudgetExceeded / ReplayDivergence."""
        _check_spec(spec)
        provider = self.provider(spec.model)
        schema_mode = spec.kind == "json" and provider.supports_schema(spec.model)
        rformat = answers.response_format(spec) if schema_mode else None
        messages = answers.first_messages(spec, schema_mode)
        result = CallResult(value=None, text="")
        error = ""
        for attempt in range(1 if spec.kind == "choice" else spec.retries + 1):
            request = ModelRequest(spec, tuple(messages), rformat, attempt)
            self.usage.reasks += 1 if attempt else 0
            text = await self._answer(provider, request, result)
            result.attempts += 1
            try:
                result.value, result.text = answers.read(spec, text), text
                return result
            except answers.InvalidAnswer as exc:
                error = str(exc)
                self._emit("invalid", request, request.hash(), detail=error)
                messages = answers.reask_messages(messages, text, error, spec, schema_mode)
        raise ActionFailed(spec.action, f"no valid answer from model '{spec.model}' after "
                           f"{result.attempts} attempt(s); last error: {error}",
                           hint="raise the action's `retries`, simplify its output, or use a stronger model")

    async def _answer(self, provider: Provider, request: ModelRequest, result: CallResult) -> str:
        """The answer text: from the journal, or from the model (then journaled at once)."""
        key = request.hash()
        stored = self.store.lookup(key) if self.store is not None else None
        if stored is not None:
            self.usage.reused_calls += 1
            self.usage.reused_cost_usd += stored.cost_usd
            result.reused += 1
            self._emit("reused", request, key, stored.prompt_tokens, stored.completion_tokens, stored.cost_usd)
            return stored.text
        if self.replay:
            raise ReplayDivergence(
                f"replay diverged at action {request.spec.action} (role {request.spec.role}, "
                f"attempt {request.attempt}): request {key[:12]} is not in the journal",
                hint="the SOP, its inputs or the engine changed since the run was recorded")
        async with self._admitted(request.spec):
            answer, seconds = await self._complete(provider, request, key)
            self._account(answer, result)
        if self.store is not None:
            self.store.record(key, request.spec.action, StoredAnswer(
                answer.text, answer.prompt_tokens, answer.completion_tokens, answer.cost_usd,
                model=request.spec.model, seconds=round(seconds, 3)))
        self._emit("answer", request, key, answer.prompt_tokens, answer.completion_tokens,
                   answer.cost_usd, seconds)
        return answer.text

    async def _complete(self, provider: Provider, request: ModelRequest, key: str) -> tuple[ModelAnswer, float]:
        """One model request, retried with exponential backoff on transient errors."""
        delay = self.backoff_s
        for retry in range(self.transient_retries + 1):
            self._emit("start", request, key)
            started = time.monotonic()
            try:
                return await provider.complete(request), time.monotonic() - started
            except TransientModelError as exc:
                if retry == self.transient_retries:
                    raise LLMError(f"{exc.message} (gave up after {retry + 1} attempts)") from None
                self.usage.retries += 1
                self._emit("retry", request, key, detail=exc.message)
                await self.sleep(min(delay, self.backoff_max_s) * random.uniform(0.5, 1.0))
                delay *= 2
            except SopError:
                raise
            except Exception as exc:  # noqa: BLE001 - a provider's own bug: our error family
                spec = request.spec
                raise LLMError(f"model '{spec.model}' failed for action {spec.action}: "
                               f"{type(exc).__name__}: {exc}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _account(self, answer: ModelAnswer, result: CallResult) -> None:
        cost = max(float(answer.cost_usd or 0.0), 0.0)
        for totals in (self.usage, result):
            totals.prompt_tokens += answer.prompt_tokens
            totals.completion_tokens += answer.completion_tokens
            totals.cost_usd += cost
        self.usage.llm_calls += 1
        result.calls += 1
        self._max_call_cost = max(self._max_call_cost or 0.0, cost)

    @contextlib.asynccontextmanager
    async def _admitted(self, spec: CallSpec) -> Any:
        """Budget admission (see module docstring); a no-op without a budget."""
        if self.budget_usd <= 0:
            yield
            return
        cond = self._condition()
        async with cond:
            while not self._may_start(spec):
                await cond.wait()
            self._in_flight += 1
        try:
            yield
        finally:
            async with cond:
                self._in_flight -= 1
                cond.notify_all()

    def _may_start(self, spec: CallSpec) -> bool:
        spent = self.usage.budget_spent_usd
        if spent >= self.budget_usd:
            raise BudgetExceeded(
                f"budget of ${self.budget_usd:.4f} spent (${spent:.4f}); stopped before calling "
                f"model '{spec.model}' for action {spec.action}",
                hint="raise it with --budget (sopctl resume --budget continues the run)")
        if self._in_flight == 0:
            return True
        if self._max_call_cost is None:
            return False
        return spent + (self._in_flight + 1) * self._max_call_cost < self.budget_usd

    def _condition(self) -> asyncio.Condition:
        loop = asyncio.get_running_loop()
        if self._admission is None or self._admission[0] is not loop:
            self._admission = (loop, asyncio.Condition())
        return self._admission[1]

    def _emit(self, kind: Any, request: ModelRequest, key: str, prompt_tokens: int = 0,
              completion_tokens: int = 0, cost: float = 0.0, seconds: float = 0.0, detail: str = "") -> None:
        if self.on_call is not None:
            self.on_call(CallEvent(kind, request.spec, request.attempt, key, prompt_tokens,
                                   completion_tokens, cost, seconds, detail))


def _check_spec(spec: CallSpec) -> None:
    """Catch an interpreter bug with a clear message instead of a confusing model error."""
    if spec.kind not in ("json", "text", "code", "choice"):
        raise LLMError(f"action {spec.action}: unknown call kind '{spec.kind}'")
    if spec.kind == "json" and not isinstance(spec.schema, dict):
        raise LLMError(f"action {spec.action}: a json call needs its output schema")
    if spec.retries < 0:
        raise LLMError(f"action {spec.action}: retries must be >= 0, got {spec.retries}")
    if not spec.model:
        raise LLMError(f"action {spec.action}: no model given")
