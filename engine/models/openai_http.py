"""OpenAI-compatible chat servers, asked with the official `openai` SDK's async client,
without litellm.

Why: importing litellm takes seconds (its provider SDKs and types), and a run whose model is
`openai/NAME` (OpenAI itself, or any OpenAI-compatible server: vLLM, llama.cpp's server,
Ollama's /v1, Azure OpenAI) needs none of it to send a chat completion. So its first request
leaves as soon as the run is ready (the SDK, under a second to import, is imported in
`prepare`'s thread while the SOP compiles); litellm is imported only if an answer needs it
(its cost function for a model it prices, its token counter for an answer without `usage`),
in a background thread started once the first request is on the wire. The SDK's own retries
are off (`max_retries=0`): the gateway retries, and journals.

Which models (`routes_directly`): `openai/NAME` where litellm itself sends a plain chat
completion: NAME unknown to litellm's cost map (a self-hosted model), or listed there as an
OpenAI `chat` model. The models litellm rewrites requests for stay with litellm: the
reasoning models (o1, o3, o4-mini..., gpt-5..., gpt-6..., and whatever the cost map says
reasons: `max_completion_tokens`, no temperature), `gpt-4` and `gpt-3.5-turbo-16k` (no
`response_format`), names with a `/` (`openai/responses/...`) and models whose mode is not
`chat`. `SOPCTL_OPENAI_VIA_LITELLM=1` sends every `openai/` model through litellm.

What is sent is what litellm sends for the same call (tests/models/test_openai_http.py compares the
two against one server): the model name without its prefix, the messages, `temperature` and
`max_tokens` when set, the schema as `response_format` when the model supports it (a
self-hosted one always, in the form its server takes: `_negotiated`), else a tool loop's
commands as `tools` with `tool_choice: required` when it calls functions; the same server
(`--api-base`, else OPENAI_BASE_URL, else OPENAI_API_BASE, else OpenAI's; its query string on
every request, an Azure endpoint's key as `api-key`), key (OPENAI_API_KEY), organization
(OPENAI_ORGANIZATION) and project (OPENAI_PROJECT_ID), the same timeout; proxies and CA files
from the environment (`trust_env`). What a model supports, and its price, come from
litellm's own cost map file, read without importing litellm.

Errors fall in the same family as litellm's (engine.models.hosted), read as the SDK reads
them: 408, 409, 429, 5xx (or as the server's `x-should-retry` says), timeouts, connection
errors, an answer that is not JSON or has no choices are `TransientModelError` (the gateway
retries them, after `Retry-After` when given); an `error` inside a 200 is an error of its
`code`, as litellm reads it; 401 is a missing or refused key (naming the variable, never its
value), any other status an `LLMError` with the server's message, redacted.
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib.util
import json
import os
import re
import threading
import time
import urllib.parse
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Mapping

from engine.errors import LLMError, RunError
from engine.models.hosted import (
    DEFAULT_TIMEOUT_S,
    REQUEST_SENT,
    LiteLLMProvider,
    _count_tokens,
    _litellm_cost,
    cached_tokens,
    commands_text,
    import_litellm_in_background,
    litellm_module,
    _parse_retry_after,
    redact,
    token_count,
    tool_list,
)
from engine.models.answers import FORMS, wire_format
from engine.models.registry import check_real_model_allowed
from engine.models.types import ModelAnswer, ModelRequest, Price, TransientModelError, price_of

__all__ = ["VIA_LITELLM_ENV", "HostedModels", "OpenAIHTTP", "routes_directly", "may_route_directly",
           "catalog_entry", "prepare"]


VIA_LITELLM_ENV = "SOPCTL_OPENAI_VIA_LITELLM"
"""Set (to anything but 0 or empty): `openai/` models go through litellm, as other providers do."""

PREFIX = "openai/"
OPENAI_API_BASE = "https://api.openai.com/v1"
_COST_MAP = "model_prices_and_context_window_backup.json"
_REWRITTEN = ("gpt-4", "gpt-3.5-turbo-16k")   # litellm drops their response_format
_REASONING_MARKERS = ("gpt-5", "gpt-6")        # litellm: max_completion_tokens, no temperature


def routes_directly(model: str) -> bool:
    """Whether `model` is sent by this client (see the module's docstring), not by litellm."""
    if not may_route_directly(model):
        return False
    entry = catalog_entry(model)
    if entry is None:
        return True
    target = str(entry.get("alias_of") or "")      # `gpt-astra-latest` -> `gpt-6-astra`
    return entry.get("mode") == "chat" and not entry.get("supports_reasoning") and not _reasoning(target)


def may_route_directly(model: str) -> bool:
    """`routes_directly` by the name alone (without reading the cost map: `sopctl run`
    decides with it what to prepare while the SOP compiles)."""
    if not model.startswith(PREFIX) or os.environ.get(VIA_LITELLM_ENV, "").strip() not in ("", "0"):
        return False
    name = model[len(PREFIX):]
    return bool(name) and "/" not in name and name not in _REWRITTEN and not _reasoning(name)


def _reasoning(name: str) -> bool:
    """litellm's o-series and gpt-5 rules, by name (o1, o3-mini, o4-mini..., gpt-5*, gpt-6*)."""
    o_series = len(name) > 1 and name[0] == "o" and name[1].isdigit()
    return o_series or (any(m in name for m in _REASONING_MARKERS) and "gpt-5-chat" not in name)


_CATALOG: list[dict[str, Any]] = []
_CATALOG_LOCK = threading.Lock()


def catalog_entry(model: str) -> dict[str, Any] | None:
    """litellm's cost-map entry of an OpenAI model (`openai/NAME` or NAME); None: unknown."""
    name = model[len(PREFIX):] if model.startswith(PREFIX) else model
    catalog = _catalog()
    for key in (name, PREFIX + name):
        entry = catalog.get(key)
        alias = entry.get("alias_of") if isinstance(entry, dict) else None
        if isinstance(alias, str) and isinstance(catalog.get(alias), dict):
            entry = {**catalog[alias], "alias_of": alias}   # an alias has its target's entry
        if isinstance(entry, dict) and entry.get("litellm_provider") == "openai":
            return entry
    return None


def _catalog() -> dict[str, Any]:
    """litellm's bundled cost map (the one it uses offline), read once without importing
    litellm (finding a package's folder does not import it); {} when litellm is absent."""
    with _CATALOG_LOCK:
        if not _CATALOG:
            _CATALOG.append(_read_catalog())
        return _CATALOG[0]


def _read_catalog() -> dict[str, Any]:
    spec = importlib.util.find_spec("litellm")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / _COST_MAP
        if path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return {}
            return data if isinstance(data, dict) else {}
    return {}


_PREPARING: list[threading.Thread] = []


def prepare() -> None:
    """What the first direct request needs, paid off the run's path (a daemon thread started
    by `sopctl run`): the openai SDK imported, the cost map read."""
    def work() -> None:
        try:
            _sdk()
            _catalog()
        except Exception:  # noqa: BLE001 - the request itself reports it
            pass

    if not _PREPARING:   # `sopctl run` asks before and after compiling: one thread is enough
        _PREPARING.append(threading.Thread(target=work, name="sopctl-openai-prepare", daemon=True))
        _PREPARING[0].start()


_SDK_LOCK = threading.Lock()


def _sdk() -> Any:
    """The official openai SDK (a dependency of litellm's too), imported once: about 0.6 to
    1 s, paid in `prepare`'s thread while the SOP compiles, never at `import engine`."""
    with _SDK_LOCK:
        import openai  # not at the top: `import engine` and `sopctl validate` never pay for it

        if not _MARKS:
            _MARKS.append(time.monotonic())
        return openai


_MARKS: list[float] = []
"""When the SDK was imported, then when the first request began to be made (monotonic)."""


def warm_up_wait_left(wait_s: float) -> float:
    """How much longer a run's warm-up should wait for the first request to be sent: while
    the SDK imports, a little (ask again); then `wait_s` counted from the import's end, and
    from the first request's start (its first call builds the SDK's lazy parts). On a busy
    machine the import alone outlasts a wait counted from the run's start, and the warm-up's
    CPU would then slow the very request it waits for. 0: nothing to wait for."""
    if _SDK_LOCK.locked() and not _MARKS:
        return 0.05
    return max((mark + wait_s - time.monotonic() for mark in _MARKS), default=0.0)


# --------------------------------------------------------------------------- the providers


@dataclass
class HostedModels:
    """Every hosted model (what the gateway uses for a model no one registered): `openai/`
    chat models by `OpenAIHTTP`, every other one by litellm (`LiteLLMProvider`)."""

    api_base: str | None = None
    """`--api-base`: where both send (never from a SOP file, see engine.models.hosted)."""
    api_key: str | None = None
    """None: the provider's variable in the environment (a test passes its own)."""
    _direct: OpenAIHTTP | None = field(default=None, repr=False)
    _litellm: LiteLLMProvider | None = field(default=None, repr=False)

    def provider(self, model: str) -> OpenAIHTTP | LiteLLMProvider:
        """Which client answers `model` (decided per call: the switch may be set at any time)."""
        if routes_directly(model):
            if self._direct is None:
                self._direct = OpenAIHTTP(self.api_base, self.api_key)
            return self._direct
        if self._litellm is None:
            given = {"api_base": self.api_base, "api_key": self.api_key}
            self._litellm = LiteLLMProvider({k: v for k, v in given.items() if v})
        return self._litellm

    def price(self, model: str) -> Price | None:
        return self.provider(model).price(model)

    def supports_schema(self, model: str) -> bool:
        return self.provider(model).supports_schema(model)

    def preflight(self, model: str) -> None:
        self.provider(model).preflight(model)

    async def complete(self, request: ModelRequest) -> ModelAnswer:
        return await self.provider(request.spec.model).complete(request)


@dataclass
class OpenAIHTTP:
    """Answers `openai/` models with the openai SDK's async client, one POST to
    `{api_base}/chat/completions` per request (the SDK's own retries off: the gateway's)."""

    api_base: str | None = None
    """`--api-base`; None: OPENAI_BASE_URL, else OPENAI_API_BASE, else OpenAI's own."""
    api_key: str | None = None
    """None: OPENAI_API_KEY (an Azure server: else AZURE_OPENAI_API_KEY; a test passes its own)."""
    _clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = field(
        default_factory=weakref.WeakKeyDictionary, repr=False)
    _litellm_started: bool = field(default=False, repr=False)

    def price(self, model: str) -> Price | None:
        entry = catalog_entry(model) or {}
        given, taken = entry.get("input_cost_per_token"), entry.get("output_cost_per_token")
        if given is None or taken is None:
            return None
        limit = entry.get("max_output_tokens") or entry.get("max_tokens")
        cached = entry.get("cache_read_input_token_cost")
        return Price(float(given), float(taken), int(limit) if limit else None,
                     float(cached) if cached is not None else None)

    def supports_schema(self, model: str) -> bool:
        """As litellm's cost map says; a model it does not know (a self-hosted one) is sent the
        schema too, in the form its server takes (`complete` finds it out)."""
        entry = catalog_entry(model)
        return entry is None or bool(entry.get("supports_response_schema"))

    def calls_functions(self, model: str) -> bool:
        return bool((catalog_entry(model) or {}).get("supports_function_calling"))

    def preflight(self, model: str) -> None:
        """A missing key is named before any call (as litellm's validation does)."""
        if not self._key():
            raise RunError(f"model '{model}' needs {self._key_names()} in the environment",
                           hint="API keys are read only from the environment, never from files")

    def body(self, request: ModelRequest, form: str | None = None) -> dict[str, Any]:
        """The JSON body of a request: what litellm sends for it (see the module docstring),
        its schema in the form `form` (engine.models.answers.wire_format)."""
        spec = request.spec
        body: dict[str, Any] = {"model": spec.model[len(PREFIX):], "messages": list(request.messages)}
        for name, value in (("temperature", spec.temperature), ("max_tokens", spec.max_tokens),
                            ("response_format", wire_format(request.response_format, form))):
            if value is not None:
                body[name] = value
        tools = tool_list(spec) if spec.tool_step >= 0 and self.calls_functions(spec.model) else None
        if tools:   # a tool loop's step: the server's own tool calling, not the JSON list
            body.pop("response_format", None)
            body.update(tools=tools, tool_choice="required")
        return body

    async def complete(self, request: ModelRequest) -> ModelAnswer:
        check_real_model_allowed(request.spec)
        if not self._key():   # as litellm's client: refused before sending, never retried
            raise LLMError(f"model '{request.spec.model}' has no valid API key (action "
                           f"{request.spec.action})", hint=self._key_hint())
        data = await self._negotiated(request)
        return await self._answer_of(request, data)

    async def _negotiated(self, request: ModelRequest) -> dict[str, Any]:
        """The answer, its schema sent in a form the server takes. A self-hosted model whose
        file says nothing is tried as `json_schema`, then `json_object`, then `none`, each
        time the server says it does not take the form (llama.cpp's Python server: HTTP 500
        naming `response_format`); what it took is remembered for this server for the rest of
        the run (`_SERVER_FORMS`). A declared form is sent as declared, and a refusal says so."""
        declared = request.spec.response_format
        learning = (declared is None and request.response_format is not None
                    and catalog_entry(request.spec.model) is None)
        server = self._url()
        form = _SERVER_FORMS.get(server, FORMS[0]) if learning else declared
        while True:
            try:   # a refusal of the form matters only where a form is tried or declared
                data = await self._post(request, form, forms=learning or declared is not None)
            except _FormRefused as exc:
                if learning and form != FORMS[-1]:
                    form = FORMS[FORMS.index(form or FORMS[0]) + 1]
                    continue
                raise LLMError(exc.message, hint="set the file's `llm.response_format` (or "
                               "--response-format) to what the server takes: json_schema, json_object "
                               "or none") from None
            if learning:
                _SERVER_FORMS[server] = form or FORMS[0]
            return data

    async def _post(self, request: ModelRequest, form: str | None, *, forms: bool = False) -> dict[str, Any]:
        """The answer's JSON, or our error family (see the module docstring)."""
        openai = _sdk()
        if len(_MARKS) == 1:
            _MARKS.append(time.monotonic())
        spec = request.spec
        where = f"model '{spec.model}' for action {spec.action}"
        timeout = spec.timeout_s or DEFAULT_TIMEOUT_S
        body = self.body(request, form)
        token = _SENDING.set(self._on_sent(spec.model))
        try:
            async with self._client().chat.completions.with_streaming_response.create(
                    **body, timeout=timeout) as streamed:
                response = await _bounded(streamed.http_response, where)
        except openai.APITimeoutError as exc:
            raise TransientModelError(f"{where}: Timeout: no answer within {timeout:g} s "
                                      f"({type(exc.__cause__ or exc).__name__})") from None
        except openai.APIConnectionError as exc:   # refused or reset, DNS, a proxy's failure
            cause = exc.__cause__ or exc
            raise TransientModelError(redact(f"{where}: APIConnectionError: "
                                             f"{type(cause).__name__}: {cause}")) from None
        except openai.APIStatusError as exc:
            _refused(request, exc.response, forms and "response_format" in body)
            raise AssertionError("unreachable") from None   # pragma: no cover
        finally:
            _SENDING.reset(token)
        return _checked(request, response)

    def _on_sent(self, model: str) -> Any:
        """httpcore's trace hook: once a request's body is sent, the run's warm-up may start
        (REQUEST_SENT), and litellm is imported in the background if the answer will need its
        cost function (the first time only)."""
        async def trace(event: str, info: Mapping[str, Any]) -> None:
            if not event.endswith("send_request_body.complete"):
                return
            REQUEST_SENT.set()
            if not self._litellm_started and self.price(model) is not None:
                self._litellm_started = True
                import_litellm_in_background()
        return trace

    async def _answer_of(self, request: ModelRequest, data: dict[str, Any]) -> ModelAnswer:
        """Text, tokens and cost of an answer, as engine.models.hosted reads litellm's."""
        spec = request.spec
        choice = _object(data["choices"][0])
        message = _object(choice.get("message"))
        text = message.get("content") or ""
        text = text if isinstance(text, str) else json.dumps(text)
        calls = message.get("tool_calls")
        if calls and spec.tool_step >= 0:
            text = commands_text(spec, text, calls)
        prompt_tokens, completion_tokens = usage_of(data)
        cached = cached_tokens(_object(data.get("usage")))
        counted = prompt_tokens == 0 and completion_tokens == 0
        if counted:   # litellm's tokenizer: imported off the event loop
            litellm = await asyncio.to_thread(litellm_module)
            prompt_tokens, completion_tokens = _count_tokens(litellm, spec.model, request, text)
        finish = str(choice.get("finish_reason") or "")
        price = price_of(self, spec)
        if price is None:
            return ModelAnswer(text, prompt_tokens, completion_tokens, 0.0, priced=False,
                               finish_reason=finish, cached_tokens=cached)
        cost = price.cost(prompt_tokens, completion_tokens, cached)
        if not counted and price is not spec.fallback_price:   # litellm's price of the answer
            cost = await asyncio.to_thread(_cost_by_litellm, spec.model, data, cost)
        return ModelAnswer(text, prompt_tokens, completion_tokens, cost, finish_reason=finish,
                           cached_tokens=cached)

    def _client(self) -> Any:
        """One SDK client (and connection pool) per event loop (a pool cannot outlive the loop
        it was made on). Its HTTP client is httpx2's, as the SDK's default, with proxies and CA
        files from the environment and a hook that gives each request the trace above."""
        openai = _sdk()
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            http = openai.DefaultAsyncHttpxClient(trust_env=True, event_hooks={"request": [_traced]})
            base, query = _split(self._base())
            if _is_azure(base, query):   # its key goes in `api-key`, never as a Bearer token
                client = openai.AsyncAzureOpenAI(
                    api_key=self._key(), base_url=base, api_version=query.pop("api-version", None),
                    default_query=query or None, max_retries=0, http_client=http,
                    default_headers={"User-Agent": "sopctl"})
            else:
                client = openai.AsyncOpenAI(
                    api_key=self._key(), base_url=base, default_query=query or None, max_retries=0,
                    organization=os.environ.get("OPENAI_ORGANIZATION") or os.environ.get("OPENAI_ORG_ID"),
                    project=os.environ.get("OPENAI_PROJECT_ID"), http_client=http,
                    default_headers={"User-Agent": "sopctl"})
            self._clients[loop] = client
        return client

    def _base(self) -> str:
        return (self.api_base or os.environ.get("OPENAI_BASE_URL")
                or os.environ.get("OPENAI_API_BASE") or OPENAI_API_BASE)

    def _url(self) -> str:
        """The server (what `_SERVER_FORMS` remembers a form for)."""
        return _split(self._base())[0]

    def _azure(self) -> bool:
        return _is_azure(*_split(self._base()))

    def _key(self) -> str:
        key = self.api_key or os.environ.get("OPENAI_API_KEY") or ""
        return key or (os.environ.get("AZURE_OPENAI_API_KEY", "") if self._azure() else "")

    def _key_names(self) -> str:
        return "OPENAI_API_KEY (or AZURE_OPENAI_API_KEY)" if self._azure() else "OPENAI_API_KEY"

    def _key_hint(self) -> str:
        return f"set {self._key_names()} in the environment (API keys are read only from there)"


_SERVER_FORMS: dict[str, str] = {}
"""Server URL -> the form of `response_format` it took this run (one failed try per form and
server, not per request). Not journaled: request hashes never depend on it, so a resume or a
replay finds its answers whatever a server took; a resume pays one refused try to learn again."""


_SENDING: contextvars.ContextVar[Any] = contextvars.ContextVar("sopctl_openai_trace", default=None)
"""The trace hook of the request being sent (set around the SDK's call, read by `_traced`)."""


async def _traced(request: Any) -> None:
    """httpx2's request hook: the request carries httpcore's trace extension (the SDK has no
    way to pass one), which says when its body is on the wire."""
    trace = _SENDING.get()
    if trace is not None:
        request.extensions["trace"] = trace


def _split(url: str) -> tuple[str, dict[str, str]]:
    """A base URL without its query string, and the query's parameters (an Azure
    deployment's `?api-version=...` goes on every request, not inside the path)."""
    parts = urllib.parse.urlsplit(url)
    base = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
    return base, dict(urllib.parse.parse_qsl(parts.query))


_AZURE_HOSTS = (".openai.azure.com", ".cognitiveservices.azure.com", ".services.ai.azure.com")


def _is_azure(base: str, query: Mapping[str, str]) -> bool:
    """An Azure OpenAI endpoint: by its host, or by the `api-version` only Azure asks for."""
    host = urllib.parse.urlsplit(base).hostname or ""
    return host.endswith(_AZURE_HOSTS) or "api-version" in query


def usage_of(data: Mapping[str, Any]) -> tuple[int, int]:
    """Prompt and completion tokens of an answer's `usage` (0, 0: none given)."""
    usage = _object(data.get("usage"))
    return token_count(usage.get("prompt_tokens")), token_count(usage.get("completion_tokens"))


def _object(value: Any) -> dict[str, Any]:
    """A JSON object of the answer, or {} where the server sent something else."""
    return value if isinstance(value, dict) else {}


def _cost_by_litellm(model: str, data: dict[str, Any], estimate: float) -> float:
    """litellm's cost of an answer (cached and reasoning tokens priced right), else ours."""
    try:
        litellm = litellm_module()
        response = litellm.ModelResponse(**data)
        response._hidden_params = {"custom_llm_provider": "openai", "model": model[len(PREFIX):]}
        return _litellm_cost(litellm, response, estimate)
    except Exception:  # noqa: BLE001 - our price times the tokens
        return estimate


# --------------------------------------------------------------------------- errors

MAX_BODY_BYTES = 64 * 1024 * 1024
"""The most of an answer's HTTP body read. Far above any answer `--max-answer-chars` accepts
(a character is at most 12 bytes of JSON), so it only stops a server that sends without end
(`/dev/zero` over HTTP) from filling memory; the gateway then cuts the text itself."""


async def _bounded(streamed: Any, where: str) -> Any:
    """The streamed response, read whole up to MAX_BODY_BYTES (LLMError past it, never a
    MemoryError); its decoded body in a response `_checked` reads as before."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in streamed.aiter_bytes():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise LLMError(f"{where}: the server's answer is over {MAX_BODY_BYTES:,} bytes, more "
                           "than any answer sopctl accepts; it was not read further",
                           hint="check the server (--api-base): a chat answer is far smaller")
        chunks.append(chunk)
    headers = [(k, v) for k, v in streamed.headers.multi_items()
               if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
    return type(streamed)(streamed.status_code, headers=headers, content=b"".join(chunks),
                          request=streamed.request)


_KEY_HINT = "set OPENAI_API_KEY in the environment (API keys are read only from there)"

_STATUS_NAMES = {408: "Timeout", 409: "ConflictError", 429: "RateLimitError", 500: "InternalServerError",
                 502: "BadGatewayError", 503: "ServiceUnavailableError"}


class _FormRefused(LLMError):
    """The server does not take the form of `response_format` it was sent."""


_FORM_WORDS = re.compile(r"response_format|json_schema|json_object", re.I)


def _refused(request: ModelRequest, response: Any, had_format: bool) -> None:
    """Raise what an HTTP error status means (our error family, as through litellm): 401 a
    refused key, 403 no access, 408, 409, 429 and 5xx transient (or as the server's
    `x-should-retry` says), a refusal naming `response_format` `_FormRefused`, else an LLMError."""
    spec = request.spec
    status = int(response.status_code)
    message = _server_message(response)
    if status == 401:
        raise LLMError(f"model '{spec.model}' has no valid API key (action {spec.action}): the "
                       f"server refused it ({message})",
                       hint="check the value of OPENAI_API_KEY in the environment (API keys are "
                            "read only from there)")
    if status == 403:   # a valid key without access: not retried, as through litellm
        raise LLMError(f"model '{spec.model}' failed for action {spec.action}: HTTP 403 "
                       f"(permission denied): {message}",
                       hint="the key in OPENAI_API_KEY has no access to this model (or from "
                            "here): check the key's project and the model's name")
    if had_format and status in (400, 422, 500, 501) and _FORM_WORDS.search(message):
        raise _FormRefused(f"model '{spec.model}' for action {spec.action}: the server refused its "
                           f"response_format: HTTP {status}: {message}")
    _raise_status(request, status, message, response.headers)


def _raise_status(request: ModelRequest, status: int, message: str, headers: Mapping[str, str]) -> None:
    spec = request.spec
    retry = headers.get("x-should-retry")   # the SDK's rule: the server's word first
    if retry == "true" or (retry != "false" and (status in (408, 409, 429) or status >= 500)):
        name = _STATUS_NAMES.get(status, "InternalServerError" if status >= 500 else "APIError")
        raise TransientModelError(f"model '{spec.model}' for action {spec.action}: {name}: "
                                  f"HTTP {status}: {message}",
                                  retry_after_s=_retry_after_s(status, headers))
    raise LLMError(f"model '{spec.model}' failed for action {spec.action}: HTTP {status}: {message}")


def _checked(request: ModelRequest, response: Any) -> dict[str, Any]:
    """The JSON object of a 200 answer with at least one choice; anything else our error family.
    An `error` inside it (OpenRouter's way) is an error with its `code` as status, as
    litellm reads it; an empty one (`null`, `{}`: some servers add it to every answer) is not."""
    spec = request.spec
    try:
        data = response.json()
    except ValueError as exc:   # a cut or garbled body: asked again, as litellm does
        raise TransientModelError(f"model '{spec.model}' for action {spec.action}: the answer is "
                                  f"not JSON ({exc}): {_excerpt(response.text)}") from None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and (error.get("message") or error.get("code") is not None) or \
            isinstance(error, str) and error:
        code = error.get("code") if isinstance(error, dict) else None
        status = int(code) if isinstance(code, (int, str)) and str(code).isdigit() else 422
        _raise_status(request, status, _server_message(response), response.headers)
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
        raise TransientModelError(f"model '{spec.model}' for action {spec.action}: the answer "
                                  "has no choices (an empty or missing `choices` list)")
    return data


def _server_message(response: Any) -> str:
    """The server's own words: `error.message` of an OpenAI-style error body, else the body."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        error = None
    message = error.get("message") if isinstance(error, dict) else error
    return _excerpt(str(message) if message else response.text or response.reason_phrase)


def _excerpt(text: str) -> str:
    text = redact(" ".join(text.split()))
    return text if len(text) <= 400 else text[:400] + "..."


def _retry_after_s(status: int, headers: Mapping[str, str]) -> float | None:
    """The server's `Retry-After` on a 429 or 503 (OpenAI's `retry-after-ms` first)."""
    if status not in (429, 503):
        return None
    millis = _parse_retry_after(headers.get("retry-after-ms") or "")
    if millis is not None:
        return millis / 1000
    return _parse_retry_after(headers.get("retry-after") or "")
