"""What the gateway and the providers exchange: call specs, requests, answers, the `Provider`
protocol, the answer store's protocol and the model errors; the `Usage` value; and what the
gateway reports (`ModelAnswered`, `ModelRetried`, `AnswerRejected`: run events, defined here
because the models layer sits below the run). Plain data, so every other models module (and
the run and the journal) can import it without importing a provider."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol
from collections.abc import Awaitable, Mapping

from engine.errors import LLMError

__all__ = ["Event", "Price", "FREE", "CallSpec", "CallResult", "StoredAnswer", "AnswerStore", "Usage",
           "ModelAnswered", "ModelRetried", "AnswerRejected", "GatewayEvent", "ModelRequest",
           "ModelAnswer", "Provider", "price_of", "TransientModelError", "RealModelBlocked", "request_hash",
           "answer_key", "durable", "AnswerContent", "LIVE_ONLY"]


CallKind = Literal["json", "text", "code", "choice"]


@dataclass(frozen=True)
class Price:
    """A model's price in USD per token, and the most tokens it answers when known (what the
    gateway's budget admission reserves for a call without `max_tokens`)."""

    input_per_token: float
    output_per_token: float
    max_output_tokens: int | None = None

    cached_input_per_token: float | None = None
    """What a prompt token read from the provider's cache costs (litellm's cost map:
    `cache_read_input_token_cost`); None: cached tokens cost what the others do."""

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        """`cached_tokens` of the `prompt_tokens` were read from the provider's cache."""
        cached = min(cached_tokens, prompt_tokens) if self.cached_input_per_token is not None else 0
        return ((prompt_tokens - cached) * self.input_per_token + cached * (self.cached_input_per_token or 0.0)
                + completion_tokens * self.output_per_token)


FREE = Price(0.0, 0.0)
"""The price of `fake`, `local` and a test's scripted model."""


ResponseForm = Literal["json_schema", "json_object", "none"]
"""How a server takes a JSON action's output schema (`llm.response_format`)."""


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
    format: Literal["json", "markdown", "content", "xml"] = "json"
    retries: int = 2                 # re-asks after an invalid answer, error shown to the model
    n_choices: int = 0               # kind choice: valid answers are -1 .. n_choices-1
    previous_choice: int = -1        # kind choice: the state before (lets `fake` answer "next")
    temperature: float | None = None
    max_tokens: int | None = None
    timeout_s: float | None = None
    round: int = 0                   # the run's round, named in its events (not in the request)
    commands: tuple[tuple[str, dict[str, Any]], ...] = ()
    """A tool loop's step (kind json; engine/run/toolloop.py): the commands the model may give
    and the JSON Schema of each one's args (the prompt lists them too); `fake` answers from them."""
    tool_step: int = -1
    """A tool loop's step, 0 = the first (-1: not a tool step)."""
    fallback_price: Price | None = None
    """The price the user gave (`--price`, the file's `llm.price`) for a model whose price
    litellm does not know (a self-hosted model); never overrides a known price."""
    response_format: ResponseForm | None = None
    """How the server takes the output schema (`llm.response_format`, `--response-format`);
    None: what the provider says the model supports (engine.models.answers.wire_format).
    Not in the request hash: the same request, however the schema travels."""
    turns: tuple[dict[str, str], ...] = ()
    """Messages after the first user message: a tool loop's earlier steps, each answer (an
    `assistant` message) and what came back (a `user` message), the newest last. Consecutive
    requests then share their beginning exactly, which providers cache (a first `user` turn
    is joined to the first user message; engine.models.answers.first_messages)."""
    prompt_schema: dict[str, Any] | None = None
    """The schema the first message's answer instructions describe, when not `schema`: a tool
    loop's last step offers only `end`, and its first message stays that of every step."""
    place: str = ""
    """Where in the run the call is made (the action's idempotency key, its for_each item;
    engine.run.actions): its answers are journaled by place and occurrence (`answer_key`);
    not in the request. "": no place (a direct gateway user), occurrences count per gateway."""


@dataclass(frozen=True)
class Usage:
    """What model answers came to: a value. `a + b` adds two; `Usage()` is zero.

    The gateway, `sopctl show` and the live display all fold it from the same gateway run
    events (each event's `usage`), so their totals cannot disagree.
    """

    llm_calls: int = 0               # answers paid for: model calls made (re-asks included)
    reused_calls: int = 0            # answers taken from the journal instead of the model
    prompt_tokens: int = 0           # of paid answers (a reused answer is not paid again)
    completion_tokens: int = 0
    cost_usd: float = 0.0            # paid
    reused_cost_usd: float = 0.0     # recorded cost of reused answers (counts toward the budget)
    retries: int = 0                 # requests sent again after a transient error
    reasks: int = 0                  # re-asks after an invalid answer
    cached_tokens: int = 0           # of the paid prompt tokens, read from the provider's cache

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        return Usage(self.llm_calls + other.llm_calls, self.reused_calls + other.reused_calls,
                     self.prompt_tokens + other.prompt_tokens,
                     self.completion_tokens + other.completion_tokens,
                     self.cost_usd + other.cost_usd, self.reused_cost_usd + other.reused_cost_usd,
                     self.retries + other.retries, self.reasks + other.reasks,
                     self.cached_tokens + other.cached_tokens)

    @classmethod
    def of_answer(cls, prompt_tokens: int, completion_tokens: int, cost_usd: float, *,
                  reused: bool = False, cached_tokens: int = 0) -> Usage:
        """One answer: paid now (a model call), or reused from the journal (paid when recorded)."""
        if reused:
            return cls(0, 1, 0, 0, 0.0, cost_usd)
        return cls(1, 0, prompt_tokens, completion_tokens, cost_usd, cached_tokens=cached_tokens)

    @property
    def budget_spent_usd(self) -> float:
        """What the budget is checked against: paid now plus paid earlier for reused answers."""
        return self.cost_usd + self.reused_cost_usd


@dataclass
class CallResult:
    """The accepted answer of one `Gateway.call`, with what the call came to in this invocation."""

    value: Any                       # validated dict (json) / str (text) / code str / int (choice)
    text: str                        # the raw accepted answer
    attempts: int = 0                # answers read (model or journal); 1 = accepted first time
    events: list[GatewayEvent] = field(default_factory=list)
    """What the gateway reported for this call, in order (also sent to the run, if any)."""

    @property
    def usage(self) -> Usage:
        """What this call came to: paid and reused answers, retries and re-asks."""
        return sum((event.usage for event in self.events), Usage())


@dataclass(frozen=True)
class StoredAnswer:
    """One model answer as the journal keeps it (never the request's API key)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    model: str = ""
    seconds: float = 0.0
    exchange: dict[str, Any] | None = None
    """What was sent for it (`ModelRequest.sent()`: the messages as rendered, the attempt,
    the response_format), for the journal to keep; None where unknown (a person's answer)."""


class AnswerStore(Protocol):
    """The journal's side of the gateway: answers keyed by a hash of the canonical request."""

    def lookup(self, request_hash: str) -> StoredAnswer | None: ...

    def holds(self, request_hash: str) -> bool:
        """Whether an answer is stored (a replay's look ahead: not a use, nor a miss)."""
        ...

    def record(self, request_hash: str, action: str, answer: StoredAnswer) -> None: ...

    # Optional: `def durable(self) -> Awaitable[None] | None`, the durability barrier. A store
    # that records without fsyncing at once (the journal: group commit) returns something to
    # await until every answer recorded so far is on disk, or None when they already are
    # (the common, free case); it raises (or its awaitable does) when that cannot be done.
    # A store without it (a test's, a memory store) keeps nothing a power cut could take back.


async def durable(store: AnswerStore | None) -> None:
    """The durability barrier: returns once every answer `store` recorded before this call
    is on disk.

    Awaited right before something leaves the process that may have been built from those
    answers: a paid model request, a command, a tool that acts outside, a question or a
    message to a person. Answers recorded while it waits (the calls of a fan-out it shares
    the wait with) are not waited for: nothing this caller sends was built from them, and
    waiting for each of them would take one fsync per answer, not one per wave."""
    barrier = getattr(store, "durable", None)
    waiting: Awaitable[None] | None = barrier() if barrier is not None else None
    if waiting is not None:
        await waiting


# --- what the gateway reports: run events (see engine.run.events), defined here, below the run


@dataclass(frozen=True)
class Event:
    """The base of every run event: frozen, JSON-friendly fields, one journal row each."""

    def to_json(self) -> dict[str, Any]:
        return plain_fields(self)


_ATOMS = (str, int, float, bool, type(None))


def plain_fields(obj: Any) -> dict[str, Any]:
    """`dataclasses.asdict(obj)`, the same dict, without its cost on the run's path: every
    event is serialised once for the journal, and asdict deep-copies each field through
    `copy.deepcopy`, even a string. Containers are rebuilt (the caller may change the
    result); anything asdict would deep-copy still is. A field marked LIVE_ONLY is left out."""
    kind: Any = type(obj)          # a class is hashable (mypy cannot tell from type[Any])
    return {name: _plain(getattr(obj, name)) for name in _field_names(kind)}


def _plain(value: Any) -> Any:
    kind = type(value)
    if kind in _ATOMS:
        return value
    if kind is list or kind is tuple:
        return kind(_plain(v) for v in value)
    if kind is dict:
        return {_plain(k): _plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain_fields(value)
    return asdict_value(value)


def event_json(event: Any) -> str:
    """`json.dumps(event.to_json(), ensure_ascii=False, sort_keys=True)`, the same text, without
    building the copy first: the encoder walks the fields itself, each dataclass it meets
    turned into the dict of its fields (what the journal stores of every event)."""
    if type(event).to_json is not Event.to_json:    # an event that says how it is written
        return json.dumps(event.to_json(), ensure_ascii=False, sort_keys=True)
    return _EVENT_ENCODER.encode(event)


LIVE_ONLY = {"journal": False}
"""A field's metadata that keeps it out of the event's JSON (the journal, `to_json`): what
only live observers are told."""


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("journal", True))


def _fields_dict(value: Any) -> dict[str, Any]:
    """The encoder's fallback: a dataclass as its fields (asdict's result, encoded alike)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: getattr(value, name) for name in _field_names(type(value))}
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_EVENT_ENCODER = json.JSONEncoder(ensure_ascii=False, sort_keys=True, default=_fields_dict)


def asdict_value(value: Any) -> Any:
    """What `asdict` makes of a field value of another type (a namedtuple, a dict subclass...)."""
    return asdict(_Holder(value))["value"]


@dataclass(frozen=True)
class _Holder:
    value: Any


@dataclass(frozen=True)
class AnswerContent:
    """What a model was sent and what it answered, for live observers (OpenTelemetry's
    opt-in content capture). Never journaled with its event: the journal keeps both in its
    answers table, so a ModelAnswered read back from a journal has none."""

    messages: tuple[dict[str, str], ...]
    text: str


@dataclass(frozen=True)
class ModelAnswered(Event):
    """One answer read by the gateway: from the model (paid) or reused from the journal."""

    round: int
    role: str
    action: str
    attempt: int                   # 0 = the first ask, 1.. = re-asks after an invalid answer
    request_hash: str              # the answer's key in the journal's `answers` table
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    seconds: float                 # the model's time (a reused answer: as recorded)
    reused: bool = False           # taken from the journal: not paid again
    unpriced: bool = False         # the model's price is unknown: cost_usd 0 is not a real cost
    model: str = ""                # the model asked ("" in journals older than issue 14)
    finish_reason: str = ""        # why the model stopped (`stop`, `length`...), "" if not told
    cached_tokens: int = 0         # of prompt_tokens, read from the provider's prompt cache
    content: AnswerContent | None = field(default=None, compare=False, repr=False, metadata=LIVE_ONLY)
    """The request's messages and the answer's text, live only (see AnswerContent)."""

    @property
    def usage(self) -> Usage:
        return Usage.of_answer(self.prompt_tokens, self.completion_tokens, self.cost_usd,
                               reused=self.reused, cached_tokens=self.cached_tokens)


@dataclass(frozen=True)
class ModelRetried(Event):
    """A model request failed with a transient error (rate limit, timeout, 5xx) and is sent
    again after `delay_s`."""

    round: int
    role: str
    action: str
    attempt: int                   # the request's attempt (see ModelAnswered)
    retry: int                     # 1 = the first retry of this request
    cause: str                     # the transient error
    delay_s: float

    @property
    def usage(self) -> Usage:
        return Usage(retries=1)


@dataclass(frozen=True)
class AnswerRejected(Event):
    """An answer that failed validation: the model is asked again with the error (`reask`),
    or, its retries spent, the action fails."""

    round: int
    role: str
    action: str
    attempt: int
    error: str
    reask: bool

    @property
    def usage(self) -> Usage:
        return Usage(reasks=1) if self.reask else Usage()


GatewayEvent = ModelAnswered | ModelRetried | AnswerRejected
"""What the gateway reports about a call, each with its `usage`."""


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

    def sent(self) -> dict[str, Any]:
        """What the journal keeps of the request: the messages as sent, which attempt it is,
        and the response_format when the schema travelled as one."""
        data: dict[str, Any] = {"messages": list(self.messages), "attempt": self.attempt}
        if self.response_format is not None:
            data["response_format"] = self.response_format
        return data


@dataclass(frozen=True)
class ModelAnswer:
    """A provider's raw answer: text to be parsed by the gateway, plus tokens and cost."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    priced: bool = True
    """False: the model's price is unknown and `cost_usd` is 0 for want of one."""
    finish_reason: str = ""
    """Why the model stopped, as the provider says (`stop`, `length`, ...); "" if it does not."""
    cached_tokens: int = 0
    """Of `prompt_tokens`, those the provider read from its prompt cache (billed lower)."""


class Provider(Protocol):
    """Anything that answers model requests: litellm, `fake`, `local`, a test's ScriptedModel.

    Optional: `price(model) -> Price | None` (None: unknown), which lets budget admission
    reserve a call's worst-case cost before it starts; `preflight(model)`, checked before a
    run starts."""

    def supports_schema(self, model: str) -> bool:
        """True: a `json` request carries the schema as `response_format`."""
        ...

    async def complete(self, request: ModelRequest) -> ModelAnswer: ...


def price_of(provider: Provider, spec: CallSpec) -> Price | None:
    """The model's price per token: the provider's (its optional `price`), else the user's
    (`spec.fallback_price`) for a model whose price it does not know; None: unknown."""
    told = getattr(provider, "price", None)
    price = told(spec.model) if told is not None else None
    return price if price is not None else spec.fallback_price


class TransientModelError(LLMError):
    """Rate limit, timeout, connection or server error: the gateway retries with backoff, or
    after `retry_after_s` when the server said when (its `Retry-After`)."""

    def __init__(self, message: str, hint: str = "", *, retry_after_s: float | None = None) -> None:
        super().__init__(message, hint)
        self.retry_after_s = retry_after_s


class RealModelBlocked(LLMError):
    """A real model was called while `engine.testing.block_real_models()` is active."""


def request_hash(canonical: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces, UTF-8) of a request. A
    conversation's hash goes on from the hash of the one it extends (`_chained_hash`)."""
    parts = _conversation_parts(canonical)
    if parts is not None:
        return _chained_hash(*parts)
    return hashlib.sha256(canonical_json(canonical).encode("utf-8")).hexdigest()


def canonical_json(canonical: Mapping[str, Any]) -> str:
    """The canonical JSON of a request, the text one `json.dumps` with sorted keys and no
    spaces gives, with its messages and its schema spliced in from encodings kept across
    calls: each step of a tool loop sends the earlier steps' messages and the step schema
    again, and encoding them anew was most of the step's hashing (it grew with the loop).
    A request of two messages (a system prompt and a prompt: most actions' calls) is
    encoded as it is: nothing of it is likely to come again, and keeping a thousand files'
    prompts would only hold memory."""
    parts = _conversation_parts(canonical)
    if parts is None:
        return _spliced(canonical) or _canonical_dumps(canonical)
    head, messages, tail = parts
    return head + "[" + ",".join(_message_json(m) for m in messages) + "]" + tail


def _conversation_parts(canonical: Mapping[str, Any]) -> tuple[str, list[Any], str] | None:
    """A request of more than two messages as the text before its messages, the messages and
    the text after them (`canonical_json` joins them); None for any other request."""
    messages = canonical.get("messages")
    if not isinstance(messages, list) or len(messages) <= 2:
        return None
    text = _spliced(canonical, leave="messages")
    if text is None:
        return None
    marker = _canonical_dumps(_SLOT + "messages")
    start = text.index(marker)
    return text[:start], messages, text[start + len(marker):]


def _spliced(canonical: Mapping[str, Any], leave: str = "") -> str | None:
    """The canonical JSON with the schema spliced in from its kept encoding, and the value of
    the key `leave` left as its slot's marker (`_SLOT` + key, JSON-encoded, once in the text);
    None when a value looks like a marker (no splicing then)."""
    light = dict(canonical)
    schema = light.get("schema")
    encoded = _schema_json(schema) if isinstance(schema, dict) else None
    slots = [key for key in (leave, "schema" if encoded is not None else "") if key]
    for key in slots:
        light[key] = _SLOT + key
    text = _canonical_dumps(light)
    markers = {key: _canonical_dumps(_SLOT + key) for key in slots}
    if any(text.count(marker) != 1 for marker in markers.values()):
        return None                       # a value that looks like a slot: no splicing
    if encoded is not None:
        start = text.index(markers["schema"])
        text = text[:start] + encoded + text[start + len(markers["schema"]):]
    return text


_THREADS: dict[tuple[Any, ...], tuple[tuple[Any, ...], Any]] = {}
"""(text before the messages, the first two messages) -> the last such conversation hashed:
its messages (`_said`) and the sha256 object fed with it up to the end of its last message.
One entry per tool loop (each step replaces its loop's), at most _MAX_THREADS: an entry
holds its conversation's texts, and a batch in one process runs many loops."""

_MAX_THREADS = 256


def _said(messages: list[Any]) -> tuple[Any, ...]:
    """What each message's canonical JSON is made of: role and content of a plain one
    (compared at C speed, most often the very same strings as the step before), else that
    JSON."""
    said = tuple([(m.get("role"), m.get("content")) if type(m) is dict and len(m) == 2 else None
                  for m in messages])
    if any(p is None or type(p[0]) is not str or type(p[1]) is not str for p in said):
        return tuple(_canonical_dumps(m) for m in messages)   # not plain ones: their JSON
    return said


def _chained_hash(head: str, messages: list[Any], tail: str) -> str:
    """sha256 of `head[m1,...,mn]tail` (each m its canonical JSON), taken up from the hash of
    the last conversation that began alike when this one repeats all of it: a tool loop's
    step sends every step before it again (two messages more each step), and encoding and
    hashing them all again grew with the loop."""
    said = _said(messages)
    key = (head, said[0], said[1])
    last = _THREADS.get(key)
    if last is not None and len(last[0]) <= len(said) and said[:len(last[0])] == last[0]:
        state, done = last[1].copy(), len(last[0])
    else:
        state, done = hashlib.sha256((head + "[").encode("utf-8")), 0
    for index in range(done, len(messages)):
        state.update(("," * (index > 0) + _message_json(messages[index])).encode("utf-8"))
    if len(_THREADS) >= _MAX_THREADS:
        _THREADS.clear()
    _THREADS[key] = (said, state.copy())
    state.update(("]" + tail).encode("utf-8"))
    return state.hexdigest()


def _canonical_dumps(value: Any) -> str:
    return _CANONICAL.encode(value)


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
"""`json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`'s encoder,
made once (dumps makes one per call for these options: a few us of a step's hashing)."""


_SLOT = "\x00sopctl-slot\x00"
"""The placeholder of a part spliced into canonical JSON (NULs: no SOP's value has one)."""

_MESSAGE_JSON: dict[tuple[str, str], str] = {}
_SCHEMA_JSON: dict[int, tuple[dict[str, Any], str]] = {}
_MAX_KEPT = 4096


def _message_json(message: Any) -> str:
    """One message's canonical JSON; a plain one (role and content) kept for the next call."""
    if not (type(message) is dict and len(message) == 2 and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)):
        return _canonical_dumps(message)
    key = (message["role"], message["content"])
    found = _MESSAGE_JSON.get(key)
    if found is None:
        if len(_MESSAGE_JSON) >= _MAX_KEPT:
            _MESSAGE_JSON.clear()
        found = _MESSAGE_JSON[key] = _canonical_dumps(message)
    return found


def _schema_json(schema: dict[str, Any]) -> str:
    """A schema's canonical JSON, kept by identity (an action's schema is one dict for all
    its calls; the entry holds it, so its id is never another's). Schemas are never changed
    after they are built."""
    found = _SCHEMA_JSON.get(id(schema))
    if found is not None and found[0] is schema:
        return found[1]
    if len(_SCHEMA_JSON) >= _MAX_KEPT:
        _SCHEMA_JSON.clear()
    text = _canonical_dumps(schema)
    _SCHEMA_JSON[id(schema)] = (schema, text)
    return text


def answer_key(request_hash: str, place: str, occurrence: int) -> str:
    """The journal key of the `occurrence`-th (1, 2, ...) request with `request_hash` made at
    `place`: unique per position, so an identical request made again is asked again and a
    resume takes the Nth answer for the Nth request. The first request without a place is
    keyed by its bare hash, as every answer was before positions (those journals still
    resume: their one row per hash answers occurrence 1)."""
    if not place:
        return request_hash if occurrence == 1 else f"{request_hash}:-:{occurrence}"
    where = hashlib.sha256(place.encode("utf-8")).hexdigest()[:16]
    return f"{request_hash}:{where}:{occurrence}"
