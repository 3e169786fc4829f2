"""The one gateway between actions and models: `fake`, `local`, and every litellm model.

`await Gateway(...).call(CallSpec(...))` turns one action's request into an accepted value:

1. The provider is resolved from `spec.model` (already resolved upstream): an active
   `override_model(...)`, the gateway's own `providers`, the registry (`register_model`;
   built-ins `fake` and `local`), else litellm.
2. Messages are built by `engine.models.answers` (our wording). A `json` action's schema travels as
   `response_format` when the provider supports structured output (or the file's
   `llm.response_format` / `--response-format` says the server takes it), else in the prompt.
3. Each model request (the first ask and every re-ask) gets a `request_hash`: sha256 of the
   canonical JSON of everything that determines the answer (model, messages, schema and
   response_format, temperature, max_tokens, kind) and never an API key. **Within one
   invocation every request is asked**, an identical one too (a task sent again, a retry
   after a failure, a re-ask of a stuck model get a fresh answer). Answers are journaled by
   position: under `answer_key(hash, place, n)`, the Nth request with that hash made at
   `spec.place` (where in the run it is asked: the action's idempotency key and the
   for_each item, set by engine.run.actions; calls at one place are made one after another,
   so N is their order, and concurrent calls are at different places). A resume or a replay
   makes the same requests at the same places in the same order, so the Nth takes the Nth
   journaled answer: no model call, counted in `usage.reused_calls`. A journal written before
   positions (one row per hash, under the bare hash) answers occurrence 1 of every place.
   `reuse_identical=True` (`sopctl run --reuse-identical`) keys answers by the bare hash
   instead: a request identical to one already answered in the run reuses that answer, and
   one identical to a request still being asked waits for it (a fan-out whose items render
   the same prompt pays once). Missing under `replay=True` it is a `ReplayDivergence`.
   Otherwise the model is called and the answer
   is recorded in `store` at once, before it is parsed, so a crash never loses a paid answer;
   with it what was sent (`StoredAnswer.exchange`: the rendered messages), which the journal
   keeps so that `sopctl show --prompts` can show it. Before each paid request the store's
   durability barrier (`types.durable`) waits until every answer recorded so far is on
   disk, so a power cut never loses one that anything depends on (the journal fsyncs in the
   background meanwhile, engine.journal.store).
4. An answer longer than `max_answer_chars` (`--max-answer-chars`, 2,000,000 by default) is
   cut there, with a mark, before it is journaled, and re-asked with the limit named, as an
   invalid one is. The answer is parsed and validated (`engine.models.answers.read`). An invalid answer is never
   accepted: it is shown back to the model with the error, up to `spec.retries` times, then
   `ActionFailed` names the action and the last error. `choice` answers are never invalid.
   A resume of a run whose attempts were all spent (the last answer journaled by an earlier
   invocation) asks again: the chain goes on with a fresh set of attempts (`_may_ask_again`).

Transport: our own retry with exponential backoff (and jitter) for rate limits, timeouts,
connection and 5xx errors (`TransientModelError`), or after the server's `Retry-After` when
it sent one (capped at `backoff_max_s`); litellm runs with `num_retries=0` and no
cache. Other provider errors become `LLMError` with a clear message; a missing key names the
environment variable to set. Key values are redacted from every message we raise.

Budget: checked before every model call. `usage.cost_usd` is what this invocation paid.
Answers reused from the journal were paid when they were recorded: they are not paid again
(not added to `cost_usd`), but their recorded cost counts toward the budget once, through
`usage.reused_cost_usd`, so a resumed run keeps the budget of the whole run. Every call
reserves its worst-case cost before it starts: its prompt tokens bounded from the request's
text (a token is at least one byte), its completion by `max_tokens` (else the model's most
output tokens, else DEFAULT_COMPLETION_CAP), at the model's price (`types.price_of`: the
provider's `price`, else the user's). A call starts only if spend + every in-flight
reservation + its own stays within the budget, and always when nothing is in flight (so a
run makes progress); when it ends its reservation is released and its real cost counted. A
call whose price is unknown (its cost is known only from the answer) cannot be reserved, so
under a budget it starts only when nothing else is in flight: such calls run one at a time
(`--price` makes them concurrent again). So a run overspends by at most one call, however
the calls' costs vary (a fan-out of dearer calls no longer starts at once).

Events: the gateway reports through the run's one event stream (`emit`, which the Team plugs
in; they are run events, see `engine.run.events`): `ModelAnswered` for every answer read (each
attempt; paid or reused; tokens, cost, seconds), `ModelRetried` before a transient-error retry
(with its cause), `AnswerRejected` when an answer is invalid (with the error, and whether it
is re-asked). So the journal records them, the live display shows them and `sopctl show`
counts them. `usage` is folded from those same events; each call's `CallResult.events` lists
its own (and `CallResult.usage` folds them).

Hosted models live in `engine.models.openai_http` (`openai/` chat models, sent by the openai
SDK without litellm) and `engine.models.hosted`, the only module that touches litellm; it imports
litellm on the first call that needs it, never at `import engine`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import time
from dataclasses import dataclass, field
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from engine.errors import (
    ActionFailed,
    BudgetExceeded,
    LLMError,
    ReplayDivergence,
    SopError,
)
from engine.models import answers
from engine.models.openai_http import HostedModels
from engine.models.registry import _resolve
from engine.models.types import (
    AnswerContent,
    AnswerRejected,
    AnswerStore,
    CallResult,
    CallSpec,
    GatewayEvent,
    ModelAnswer,
    ModelAnswered,
    ModelRequest,
    ModelRetried,
    Price,
    Provider,
    ResponseForm,
    StoredAnswer,
    TransientModelError,
    Usage,
    answer_key,
    durable,
    price_of,
)

__all__ = ["Gateway"]


_NO_WAIT: AbstractAsyncContextManager[Any] = contextlib.nullcontext()


DEFAULT_COMPLETION_CAP = 4096
"""Completion tokens reserved for a call without `max_tokens` whose model's limit is unknown."""


_TOKENS_PER_MESSAGE = 4     # chat-template tokens around each message (OpenAI: 3-4)
_TOKENS_PER_REQUEST = 3     # tokens that prime the answer


# --------------------------------------------------------------------------- the gateway


@dataclass
class Gateway:
    """Asks models for answers on behalf of actions: reuse, budget, retries, validation."""

    budget_usd: float = 0.0                 # 0 = no limit; checked before every call
    store: AnswerStore | None = None        # reuse journaled answers, record new ones
    replay: bool = False                    # True: a request missing from `store` is a divergence
    usage: Usage = Usage()
    """Totals of this gateway (one invocation of a run), folded from the events it reports."""
    emit: Callable[[GatewayEvent], None] | None = None
    """The run's event stream (the Team plugs its own in); None: events are only counted."""
    providers: Mapping[str, Provider] = field(default_factory=dict)
    """Models of this gateway only, consulted before the global registry."""
    transient_retries: int = 5              # retries of one request after transient errors
    backoff_s: float = 1.0                  # first backoff; doubles each retry, with jitter
    backoff_max_s: float = 30.0
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep
    """How backoff waits (tests pass a recorder instead of sleeping)."""
    api_base: str | None = None
    """Where hosted models are reached (`--api-base`); never from a SOP file (see hosted)."""
    max_answer_chars: int = answers.MAX_ANSWER_CHARS
    """`--max-answer-chars`: a longer answer is cut there before it is journaled, and re-asked."""
    response_format: ResponseForm | None = None
    """`--response-format`: how hosted servers take the output schema (over `llm.response_format`)."""
    reuse_identical: bool = False
    """`--reuse-identical`: answers keyed by the bare request hash, so an identical request
    is answered once per run (default: by place and occurrence, every request asked)."""
    _hosted: Provider | None = field(default=None, repr=False)
    _admission: tuple[Any, asyncio.Condition] | None = field(default=None, repr=False)
    _in_flight: int = field(default=0, repr=False)
    _reserved: float = field(default=0.0, repr=False)
    _recorded: set[str] = field(default_factory=set, repr=False)
    """Journal keys this gateway recorded (an answer under one was not journaled earlier)."""
    _occurrences: dict[tuple[str, str], int] = field(default_factory=dict, repr=False)
    """Requests made so far by (place, request hash): the next one's occurrence is one more."""
    _asking: dict[str, asyncio.Future[None]] = field(default_factory=dict, repr=False)
    """Requests being asked now, by hash: done when the ask ends, however it ends."""
    warn: Callable[[str, CallSpec], None] | None = field(default=None, repr=False)
    """Where the gateway's warnings go (the Team's run log); None: nowhere."""
    _warned_unpriced: set[str] = field(default_factory=set, repr=False)

    def provider(self, model: str) -> Provider:
        """The provider that answers `model` for this gateway."""
        return _resolve(model, self.providers, self._hosted_provider)

    def _hosted_provider(self) -> Provider:
        """Every model name that is not registered: `openai/` chat models by our own client,
        the others by litellm (engine.models.openai_http; made on first use)."""
        if self._hosted is None:
            self._hosted = HostedModels(api_base=self.api_base)
        return self._hosted

    def preflight(self, model: str) -> None:
        """Fail before a run starts if `model` cannot work (e.g. the local extra is missing)."""
        check = getattr(self.provider(model), "preflight", None)
        if check is not None:
            check(model)

    def first_request(self, spec: CallSpec) -> ModelRequest:
        """The request `call` sends first for `spec`."""
        spec = self._formed(spec)
        schema_mode = self._schema_mode(self.provider(spec.model), spec)
        rformat = answers.response_format(spec) if schema_mode else None
        return ModelRequest(spec, tuple(answers.first_messages(spec, schema_mode)), rformat, 0)

    def first_key(self, spec: CallSpec) -> str:
        """The journal key the next `call(spec)` looks its first answer up by (the experience
        pool writes a reused answer there, engine.run.experience)."""
        return self._position(self.first_request(spec), take=False)[0]

    async def call(self, spec: CallSpec) -> CallResult:
        """The accepted answer for `spec`, or ActionFailed / LLMError / BudgetExceeded / ReplayDivergence."""
        _check_spec(spec)
        spec = self._formed(spec)
        provider = self.provider(spec.model)
        schema_mode = self._schema_mode(provider, spec)
        rformat = answers.response_format(spec) if schema_mode else None
        messages = answers.first_messages(spec, schema_mode)
        result = CallResult(value=None, text="")
        chain = 1 if spec.kind == "choice" else spec.retries + 1
        attempts, attempt = chain, 0
        while True:
            request = ModelRequest(spec, tuple(messages), rformat, attempt)
            text, earlier = await self._answer(provider, request, result)
            result.attempts += 1
            error = None if spec.kind == "choice" else answers.over_limit(text, self.max_answer_chars)
            if error is None:
                try:
                    result.value, result.text = answers.read(spec, text), text
                    return result
                except answers.InvalidAnswer as exc:
                    error = str(exc)
            messages = answers.reask_messages(messages, text, error, spec, schema_mode)
            if attempt + 1 == attempts and earlier and self._may_ask_again(spec, messages, rformat):
                attempts += chain
            reask = attempt + 1 < attempts
            self._report(AnswerRejected(spec.round, spec.role, spec.action, attempt, error, reask), result)
            if not reask:
                raise ActionFailed(spec.action, f"no valid answer from model '{spec.model}' after "
                                   f"{result.attempts} attempt(s); last error: {error}",
                                   hint="raise the action's `max_retries`, simplify its output, or use "
                                        "a stronger model (`sopctl resume` asks the model again)")
            attempt += 1

    def _formed(self, spec: CallSpec) -> CallSpec:
        """`spec` with `--response-format` (the user's, for the server they chose) over the file's."""
        if self.response_format is None or spec.response_format == self.response_format:
            return spec
        return dataclasses.replace(spec, response_format=self.response_format)

    @staticmethod
    def _schema_mode(provider: Provider, spec: CallSpec) -> bool:
        """Whether the schema travels as `response_format`: as declared (`none`: in the prompt
        only), else where the provider says the model supports it."""
        if spec.kind != "json" or spec.response_format == "none":
            return False
        return spec.response_format is not None or provider.supports_schema(spec.model)

    def _may_ask_again(self, spec: CallSpec, messages: list[dict[str, str]],
                       rformat: dict[str, Any] | None) -> bool:
        """Whether a chain whose attempts were all spent, its last answer journaled by an
        earlier invocation, goes on with a fresh set of `retries + 1` attempts.

        A resume asks again (it is the user's decision to spend more): the chain continues
        where it stopped, the next ask showing the model its last invalid answer and the
        error, exactly as one more re-ask would. So every new request differs from the
        recorded ones (the conversation is longer): the recorded invalid answers stay in the
        journal under their own keys, and the new answers get theirs. A fresh set rather
        than a single attempt: `retries` is what one invocation may pay for one answer, and a
        resume is an invocation. A replay calls no model: it goes on only where the run it
        replays did (the journal holds the next ask), and otherwise fails as that run did.
        """
        if not self.replay:
            return True
        following = self._position(ModelRequest(spec, tuple(messages), rformat, 0), take=False)
        return self.store is not None and self.store.holds(self._held_under(*following))

    def _position(self, request: ModelRequest, *, take: bool) -> tuple[str, str | None]:
        """The journal key of `request` (`take`: counted as made), and the bare hash a
        journal from before positions may hold its answer under (None: no such fallback,
        or a bare-hash answer this gateway recorded itself, which is not an earlier run's)."""
        digest = request.hash()
        if self.reuse_identical:
            return digest, None
        where = (request.spec.place, digest)
        occurrence = self._occurrences.get(where, 0) + 1
        if take:
            self._occurrences[where] = occurrence
        key = answer_key(digest, request.spec.place, occurrence)
        old = occurrence == 1 and key != digest and digest not in self._recorded
        return key, digest if old else None

    def _held_under(self, key: str, legacy: str | None) -> str:
        """`key`, unless only the journal of an older sopctl holds the answer, by bare hash."""
        store = self.store
        if legacy is None or store is None or store.holds(key) or not store.holds(legacy):
            return key
        return legacy

    async def _answer(self, provider: Provider, request: ModelRequest,
                      result: CallResult) -> tuple[str, bool]:
        """The answer text, and whether an earlier invocation journaled it: from the journal,
        or from the model (then journaled at once)."""
        key = self._held_under(*self._position(request, take=True))
        stored = await self._stored(key)
        if stored is not None:
            self._report(_answered(request, key, stored.prompt_tokens, stored.completion_tokens,
                                  stored.cost_usd, stored.seconds, reused=True, text=stored.text), result)
            return stored.text, key not in self._recorded
        if self.replay:
            explain = getattr(self.store, "what_changed", None)
            changed = explain(request.spec.action, list(request.messages)) if explain else ""
            raise ReplayDivergence(
                f"replay diverged at action {request.spec.action} (role {request.spec.role}, "
                f"attempt {request.attempt}): request {key[:12]} is not in the journal"
                + (f"; {changed}" if changed else ""),
                hint="the SOP, its inputs or the engine changed since the run was recorded")
        if self.store is None:   # nothing is journaled, so nothing is shared
            return await self._ask(provider, request, result, key), False
        asking = self._asking[key] = asyncio.get_running_loop().create_future()
        try:
            return await self._ask(provider, request, result, key), False
        finally:
            del self._asking[key]
            asking.set_result(None)

    async def _stored(self, key: str) -> StoredAnswer | None:
        """The journaled answer under `key`, if any. A request under the same key already
        being asked (with `reuse_identical`: a fan-out whose items render the same prompt)
        is waited for first, so both get the one paid answer; if that ask failed, this one
        asks the model itself. Without a store nothing is reused, so nothing waits."""
        if self.store is None:
            return None
        while (asking := self._asking.get(key)) is not None:
            await asyncio.shield(asking)   # a cancelled waiter must not cancel the others' wait
        return self.store.lookup(key)

    async def _ask(self, provider: Provider, request: ModelRequest, result: CallResult, key: str) -> str:
        """Ask the model (its answer journaled at once, before it is reported or parsed)."""
        async with self._admit(provider, request):
            answer, seconds = await self._complete(provider, request, result)
            event = _answered(request, key, answer.prompt_tokens, answer.completion_tokens,
                              max(float(answer.cost_usd or 0.0), 0.0), round(seconds, 3),
                              unpriced=not answer.priced, finish_reason=answer.finish_reason,
                              text=answer.text, cached_tokens=answer.cached_tokens)
            self._count(event, result)  # before the admission slot frees: the budget sees it
        text = answers.cut_answer(answer.text, self.max_answer_chars)   # bounded from here on
        if self.store is not None:  # recorded before it is reported or parsed: never lost
            self.store.record(key, request.spec.action, StoredAnswer(
                text, answer.prompt_tokens, answer.completion_tokens, answer.cost_usd,
                model=request.spec.model, seconds=event.seconds, exchange=request.sent()))
            self._recorded.add(key)
        self._send(event)
        return text

    async def _complete(self, provider: Provider, request: ModelRequest,
                        result: CallResult) -> tuple[ModelAnswer, float]:
        """One model request, retried with exponential backoff on transient errors."""
        delay = self.backoff_s
        spec = request.spec
        for retry in range(self.transient_retries + 1):
            await durable(self.store)   # every answer recorded so far is on disk before we pay
            started = time.monotonic()
            try:
                return await provider.complete(request), time.monotonic() - started
            except TransientModelError as exc:
                if retry == self.transient_retries:
                    raise LLMError(f"{exc.message} (gave up after {retry + 1} attempts)") from None
                wait = self._retry_wait(exc, delay)
                self._report(ModelRetried(spec.round, spec.role, spec.action, request.attempt,
                                         retry + 1, exc.message, round(wait, 3)), result)
                await self.sleep(wait)
                delay *= 2
            except SopError:
                raise
            except Exception as exc:  # noqa: BLE001 - a provider's own bug: our error family
                raise LLMError(f"model '{spec.model}' failed for action {spec.action}: "
                               f"{type(exc).__name__}: {exc}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _retry_wait(self, exc: TransientModelError, delay: float) -> float:
        """The server's Retry-After when it gave one, else jittered backoff; capped either way."""
        if exc.retry_after_s is not None:
            return min(max(exc.retry_after_s, 0.0), self.backoff_max_s)
        return min(delay, self.backoff_max_s) * random.uniform(0.5, 1.0)

    def _report(self, event: GatewayEvent, result: CallResult) -> None:
        """Count an event in the totals (the gateway's, and its call's) and send it to the run."""
        self._count(event, result)
        self._send(event)

    def _count(self, event: GatewayEvent, result: CallResult) -> None:
        self.usage += event.usage
        result.events.append(event)

    def _send(self, event: GatewayEvent) -> None:
        if self.emit is not None:
            self.emit(event)

    def _admit(self, provider: Provider, request: ModelRequest) -> AbstractAsyncContextManager[Any]:
        """Budget admission (see module docstring); without a budget nothing waits, and the
        shared no-op costs a fraction of a generator-based context manager on every call."""
        return self._admitted(provider, request) if self.budget_usd > 0 else _NO_WAIT

    @contextlib.asynccontextmanager
    async def _admitted(self, provider: Provider, request: ModelRequest) -> Any:
        price = price_of(provider, request.spec)
        tokens = (_prompt_token_bound(request), _completion_token_bound(request.spec, price))
        cond = self._condition()
        async with cond:
            while True:
                reserve = self._reservation(price, tokens)
                if self._may_start(request.spec, reserve):
                    break
                if reserve is None:
                    self._say_unpriced(request.spec)
                await cond.wait()
            reserve = reserve or 0.0
            self._in_flight += 1
            self._reserved += reserve
        try:
            yield
        finally:
            async with cond:
                self._in_flight -= 1
                self._reserved -= reserve
                cond.notify_all()

    def _say_unpriced(self, spec: CallSpec) -> None:
        """Once per model: its calls wait for each other because its price is unknown (a run
        that is slower than its fan-out promises says why, and what to do)."""
        if self.warn is None or spec.model in self._warned_unpriced:
            return
        self._warned_unpriced.add(spec.model)
        self.warn(f"the price of model '{spec.model}' is unknown, so the budget (${self.budget_usd:.2f}) cannot "
                  "reserve a call's cost before it starts: its calls run one at a time, a fan-out too; "
                  "give its price with --price IN,OUT (dollars per million tokens) to run them "
                  "concurrently, or --budget 0 for no budget", spec)

    def _reservation(self, price: Price | None, tokens: tuple[int, int]) -> float | None:
        """A call's worst-case cost; None when its price is unknown, so it starts only when no
        other call is in flight. An unknown price is known only after the answer (a provider
        reports the cost it charged): reserving the dearest call seen let a cheap first call
        admit a whole fan-out of dear ones ($0.01, then ten $1 calls on a $1.50 budget)."""
        if price is None:
            return None
        return price.cost(*tokens)

    def _may_start(self, spec: CallSpec, reserve: float | None) -> bool:
        spent = self.usage.budget_spent_usd
        if spent >= self.budget_usd:
            raise BudgetExceeded(
                f"budget of ${self.budget_usd:.4f} spent (${spent:.4f}); stopped before calling "
                f"model '{spec.model}' for action {spec.action}",
                hint="raise it with --budget (sopctl resume --budget continues the run)")
        if self._in_flight == 0:
            return True
        if reserve is None:
            return False
        return spent + self._reserved + reserve <= self.budget_usd

    def _condition(self) -> asyncio.Condition:
        loop = asyncio.get_running_loop()
        if self._admission is None or self._admission[0] is not loop:
            self._admission = (loop, asyncio.Condition())
        return self._admission[1]



def _answered(request: ModelRequest, key: str, prompt_tokens: int, completion_tokens: int,
              cost: float, seconds: float, *, reused: bool = False,
              unpriced: bool = False, finish_reason: str = "", text: str = "",
              cached_tokens: int = 0) -> ModelAnswered:
    spec = request.spec
    return ModelAnswered(spec.round, spec.role, spec.action, request.attempt, key, prompt_tokens,
                         completion_tokens, cost, seconds, reused, unpriced, spec.model,
                         finish_reason, cached_tokens=cached_tokens,
                         content=AnswerContent(request.messages, text))


def _prompt_token_bound(request: ModelRequest) -> int:
    """At most as many prompt tokens as UTF-8 bytes (a byte-level BPE token covers at least
    one), plus the chat template's: an upper bound, without a tokenizer."""
    size = sum(len(m.get("content", "").encode("utf-8")) for m in request.messages)
    if request.response_format is not None:
        size += len(json.dumps(request.response_format, ensure_ascii=False).encode("utf-8"))
    return size + _TOKENS_PER_MESSAGE * len(request.messages) + _TOKENS_PER_REQUEST


def _completion_token_bound(spec: CallSpec, price: Price | None) -> int:
    """The most tokens the answer can have: the call's max_tokens, else the model's limit."""
    if spec.max_tokens is not None:
        return spec.max_tokens
    limit = price.max_output_tokens if price is not None else None
    return limit or DEFAULT_COMPLETION_CAP


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
