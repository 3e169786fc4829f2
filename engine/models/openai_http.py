"""OpenAI-compatible chat servers, asked directly over HTTP (httpx), without litellm.

Why: importing litellm takes seconds (its provider SDKs and types), and a run whose model is
`openai/NAME` (OpenAI itself, or any OpenAI-compatible server: vLLM, llama.cpp's server,
Ollama's /v1) needs none of it to send a chat completion. So its first request leaves as
soon as the run is ready; litellm is imported only if an answer needs it (its cost function
for a model it prices, its token counter for an answer without `usage`), in a background
thread started once the first request is on the wire.

Which models (`routes_directly`): `openai/NAME` where litellm itself sends a plain chat
completion: NAME unknown to litellm's cost map (a self-hosted model), or listed there as an
OpenAI `chat` model. The models litellm rewrites requests for stay with litellm: the
reasoning models (o1, o3, o4-mini..., gpt-5..., gpt-6..., and whatever the cost map says
reasons: `max_completion_tokens`, no temperature), `gpt-4` and `gpt-3.5-turbo-16k` (no
`response_format`), names with a `/` (`openai/responses/...`) and models whose mode is not
`chat`. `SOPCTL_OPENAI_VIA_LITELLM=1` sends every `openai/` model through litellm.

What is sent is what litellm sends for the same call (tests/models/test_openai_http.py compares the
two against one server): the model name without its prefix, the messages, `temperature` and
`max_tokens` when set, the schema as `response_format` when the model supports it, else a
tool loop's commands as `tools` with `tool_choice: required` when it calls functions; the
same server (`--api-base`, else OPENAI_BASE_URL, else OPENAI_API_BASE, else OpenAI's), key
(OPENAI_API_KEY), organization (OPENAI_ORGANIZATION) and project (OPENAI_PROJECT_ID), the
same timeout; proxies and CA files from the environment (httpx's `trust_env`). What a model
supports, and its price, come from litellm's own cost map file, read without importing
litellm.

Errors fall in the same family as litellm's (engine.models.hosted): 408, 429, 5xx, timeouts,
connection errors, an answer that is not JSON or has no choices are `TransientModelError`
(the gateway retries them, after `Retry-After` when given); 401 is a missing or refused key
(naming the variable, never its value), any other status an `LLMError` with the server's
message, redacted.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
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
    tool_list,
)
from engine.models.registry import check_real_model_allowed
from engine.models.types import ModelAnswer, ModelRequest, Price, TransientModelError, price_of

if TYPE_CHECKING:
    import httpx

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
    by `sopctl run`): httpx imported, the cost map read."""
    def work() -> None:
        try:
            _httpx()
            _catalog()
        except Exception:  # noqa: BLE001 - the request itself reports it
            pass

    if not _PREPARING:   # `sopctl run` asks before and after compiling: one thread is enough
        _PREPARING.append(threading.Thread(target=work, name="sopctl-openai-prepare", daemon=True))
        _PREPARING[0].start()


_HTTPX_LOCK = threading.Lock()


def _httpx() -> Any:
    """httpx, imported without its command-line client. Its package imports `httpx._main`
    (click, rich and pygments: about 55 ms of CPU, a tenth of what a run does before its first
    request) only to offer `httpx.main`, the `httpx` command, and falls back to a stub of it
    when that import fails; so the import is made to fail while the package loads, and the
    module is importable again right after (`import httpx._main` still works)."""
    with _HTTPX_LOCK:
        if "httpx" not in sys.modules:
            blocked = "httpx._main" not in sys.modules
            if blocked:
                sys.modules["httpx._main"] = None  # type: ignore[assignment]
            try:
                import httpx  # noqa: F401 - cached in sys.modules, returned below
            finally:
                if blocked and sys.modules.get("httpx._main", 0) is None:
                    del sys.modules["httpx._main"]
    return sys.modules["httpx"]


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
    """Answers `openai/` models with one POST to `{api_base}/chat/completions` per request."""

    api_base: str | None = None
    """`--api-base`; None: OPENAI_BASE_URL, else OPENAI_API_BASE, else OpenAI's own."""
    api_key: str | None = None
    """None: OPENAI_API_KEY (a test passes its own)."""
    _clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = field(
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
        return bool((catalog_entry(model) or {}).get("supports_response_schema"))

    def calls_functions(self, model: str) -> bool:
        return bool((catalog_entry(model) or {}).get("supports_function_calling"))

    def preflight(self, model: str) -> None:
        """A missing key is named before any call (as litellm's validation does)."""
        if not self._key():
            raise RunError(f"model '{model}' needs OPENAI_API_KEY in the environment",
                           hint="API keys are read only from the environment, never from files")

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body of a request: what litellm sends for it (see the module docstring)."""
        spec = request.spec
        body: dict[str, Any] = {"model": spec.model[len(PREFIX):], "messages": list(request.messages)}
        for name, value in (("temperature", spec.temperature), ("max_tokens", spec.max_tokens),
                            ("response_format", request.response_format)):
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
                           f"{request.spec.action})", hint=_KEY_HINT)
        data = await self._post(request)
        return await self._answer_of(request, data)

    async def _post(self, request: ModelRequest) -> dict[str, Any]:
        """The answer's JSON, or our error family (see the module docstring)."""
        httpx = _httpx()
        spec = request.spec
        where = f"model '{spec.model}' for action {spec.action}"
        timeout = spec.timeout_s or DEFAULT_TIMEOUT_S
        content = json.dumps(self.body(request), ensure_ascii=False).encode("utf-8")
        try:
            response = await self._client().post(
                self._url(), content=content, headers=self._headers(), timeout=timeout,
                extensions={"trace": self._on_sent(spec.model)})
        except httpx.TimeoutException as exc:
            raise TransientModelError(f"{where}: Timeout: no answer within {timeout:g} s "
                                      f"({type(exc).__name__})") from None
        except httpx.HTTPError as exc:   # connection refused or reset, DNS, a proxy's failure
            raise TransientModelError(redact(f"{where}: APIConnectionError: "
                                             f"{type(exc).__name__}: {exc}")) from None
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
        usage = _object(data.get("usage"))
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        completion_tokens = int(usage.get("completion_tokens") or 0)
        cached = cached_tokens(usage)
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

    def _client(self) -> httpx.AsyncClient:
        """One connection pool per event loop (a pool cannot outlive the loop it was made on)."""
        httpx = _httpx()
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = httpx.AsyncClient(trust_env=True, follow_redirects=True,
                                       limits=httpx.Limits(max_connections=1000,
                                                           max_keepalive_connections=100))
            self._clients[loop] = client
        return client

    def _url(self) -> str:
        base = (self.api_base or os.environ.get("OPENAI_BASE_URL")
                or os.environ.get("OPENAI_API_BASE") or OPENAI_API_BASE)
        return base.rstrip("/") + "/chat/completions"

    def _key(self) -> str:
        return self.api_key or os.environ.get("OPENAI_API_KEY") or ""

    def _headers(self) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self._key()}", "Content-Type": "application/json",
                   "Accept": "application/json", "User-Agent": "sopctl"}
        organization = os.environ.get("OPENAI_ORGANIZATION") or os.environ.get("OPENAI_ORG_ID")
        if organization:
            headers["OpenAI-Organization"] = organization
        if os.environ.get("OPENAI_PROJECT_ID"):
            headers["OpenAI-Project"] = os.environ["OPENAI_PROJECT_ID"]
        return headers


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

_KEY_HINT = "set OPENAI_API_KEY in the environment (API keys are read only from there)"

_STATUS_NAMES = {408: "Timeout", 429: "RateLimitError", 500: "InternalServerError",
                 502: "BadGatewayError", 503: "ServiceUnavailableError"}


def _checked(request: ModelRequest, response: httpx.Response) -> dict[str, Any]:
    """The answer's JSON object with at least one choice; anything else our error family."""
    spec = request.spec
    status = response.status_code
    if status == 401:
        raise LLMError(f"model '{spec.model}' has no valid API key (action {spec.action}): the "
                       f"server refused it ({_server_message(response)})",
                       hint="check the value of OPENAI_API_KEY in the environment (API keys are "
                            "read only from there)")
    if status == 403:   # a valid key without access: not retried, as through litellm
        raise LLMError(f"model '{spec.model}' failed for action {spec.action}: HTTP 403 "
                       f"(permission denied): {_server_message(response)}",
                       hint="the key in OPENAI_API_KEY has no access to this model (or from "
                            "here): check the key's project and the model's name")
    if status in (408, 429) or status >= 500:
        name = _STATUS_NAMES.get(status, "InternalServerError")
        raise TransientModelError(f"model '{spec.model}' for action {spec.action}: {name}: "
                                  f"HTTP {status}: {_server_message(response)}",
                                  retry_after_s=_retry_after_s(status, response.headers))
    if status >= 400:
        raise LLMError(f"model '{spec.model}' failed for action {spec.action}: "
                       f"HTTP {status}: {_server_message(response)}")
    try:
        data = response.json()
    except ValueError as exc:   # a cut or garbled body: asked again, as litellm does
        raise TransientModelError(f"model '{spec.model}' for action {spec.action}: the answer is "
                                  f"not JSON ({exc}): {_excerpt(response.text)}") from None
    if isinstance(data, dict) and isinstance(data.get("error"), (dict, str)):
        raise LLMError(f"model '{spec.model}' failed for action {spec.action}: "
                       f"{_server_message(response)}")
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
        raise TransientModelError(f"model '{spec.model}' for action {spec.action}: the answer "
                                  "has no choices (an empty or missing `choices` list)")
    return data


def _server_message(response: httpx.Response) -> str:
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
