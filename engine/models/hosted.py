"""Hosted models through litellm: one lazy import, our error mapping, key redaction.
(`openai/` chat models are sent without litellm, by engine.models.openai_http, which reuses
this module's helpers and maps errors into the same family.)

Why a module of its own: this is the only place that touches litellm's API, so the gateway
(`engine.models.gateway`) stays readable and `import engine` never pays for litellm (it is imported
on the first call that needs it, with `LITELLM_LOCAL_MODEL_COST_MAP=True` so that the

import never fetches a price list from the network).

Errors are mapped here: rate limits, timeouts, connection and 5xx errors become
`TransientModelError` (the gateway retries them with backoff; litellm's own retries are off),
carrying the server's `Retry-After` (seconds or an HTTP date) on a 429 or 503; a missing or
rejected key becomes an `LLMError` whose hint names the environment variable, anything else
an `LLMError` with litellm's message. Every message goes through `redact` first, so no key
value ever reaches an error, a log or a journal.

Manners: every call has a timeout (the action's, role's or file's `llm.timeout_s`, else
DEFAULT_TIMEOUT_S; litellm's own default is 6,000 s). An answer without choices is a transient
error (retried, then a clear LLMError), not an IndexError. An answer without `usage` has its
tokens counted here (`litellm.token_counter`), not recorded as zeros. A model whose price
litellm does not know (a self-hosted one) is priced by the user's `--price` or the file's
`llm.price`, else at 0 and marked unpriced, so `sopctl show` can say its cost is unknown.

Tool loops: a step of a tool-using action (`CallSpec.tool_step`) is sent with the provider's
own tool calling (`tools`, `tool_choice: required`) when litellm says the model calls
functions; its tool calls come back as our JSON command list (`commands_text`), which the
gateway reads and journals like any answer. Other models get the command list in the prompt.

Where the model lives: litellm reads `OPENAI_API_BASE` (and each provider's own variables)
from the environment, and `sopctl run --api-base URL` passes one; never from a SOP file,
which could send the user's key to its author's host.
"""

from __future__ import annotations

import email.utils
import functools
import json
import logging
import os
import re
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from engine.errors import LLMError, RunError, UsageError
from engine.load.secrets import scrub
from engine.models.answers import wire_format
from engine.models.registry import check_real_model_allowed
from engine.models.types import (
    CallSpec,
    ModelAnswer,
    ModelRequest,
    Price,
    TransientModelError,
    price_of,
)

__all__ = ["LiteLLMProvider", "REQUEST_SENT", "litellm_module", "import_litellm_in_background", "redact",
           "DEFAULT_TIMEOUT_S", "commands_text", "native_tools", "tool_list", "cached_tokens",
           "cache_points"]


DEFAULT_TIMEOUT_S = 120.0
"""Seconds a hosted call may take when no `llm.timeout_s` is set (then it is retried)."""


REQUEST_SENT = threading.Event()
"""Set once this process has sent a hosted model request: a hosted run's warm-up waits for it
(engine.run.actions.warm_up), so that its one-time work fills the wait for the first answer
instead of slowing the way to the first request."""


_LITELLM: list[Any] = []


_LITELLM_LOCK = threading.Lock()


def litellm_module() -> Any:
    """Import litellm once, quietly, with its offline cost map (no fetch at import)."""
    with _LITELLM_LOCK:
        if not _LITELLM:
            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            import litellm  # seconds to import: only a hosted model's first call pays it

            litellm.suppress_debug_info = True
            litellm.telemetry = False
            for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "litellm"):
                logging.getLogger(name).setLevel(logging.ERROR)
            _LITELLM.append(litellm)
        return _LITELLM[0]


def import_litellm_in_background() -> None:
    """Start importing litellm in a daemon thread (seconds of work), so that it overlaps
    loading and compiling the SOP instead of following them; `litellm_module` waits for it."""
    if not _LITELLM:
        threading.Thread(target=_import_quietly, name="sopctl-litellm-import", daemon=True).start()


def _import_quietly() -> None:
    try:
        litellm_module()
    except Exception:  # noqa: BLE001 - the run's own import reports it, where it is needed
        pass


_UNSENT_CALL = r"coroutine '\w+\.acompletion' was never awaited"
"""litellm's provider coroutine (`OpenAIChatCompletion.acompletion`...); ours is `complete`."""


def _ignore_unsent_calls() -> None:
    """Silence the one 'never awaited' warning that is litellm's, not a leak.

    `litellm.acompletion` builds the provider's request coroutine in an executor thread and
    awaits it once the thread returns. When a fan-out item fails, its siblings are cancelled
    (so they stop spending); a sibling cancelled while in that thread never gets the
    coroutine the thread made, and Python warns when it is collected. It never started, so
    no request was sent and nothing was paid: the warning only alarms the user. Every other
    'never awaited' warning (ours included) still shows."""
    warnings.filterwarnings("ignore", message=_UNSENT_CALL, category=RuntimeWarning)


# Broader than the shared token shapes (engine/load/secrets.py): in an error message a word
# taken for a key costs nothing, in a journaled answer it would change the answer.
_KEY_SHAPES = re.compile(r"\b(?:(?:sk|pk|rk|gsk|xai|hf|ghp|github_pat)[-_][-_A-Za-z0-9]{12,}|AIza[-_A-Za-z0-9]{20,})")


def redact(text: str) -> str:
    """Remove every secret value of the environment (engine/load/secrets.py: the rule the
    journal and exec share) and every key-shaped token from `text`."""
    return _KEY_SHAPES.sub("***", scrub(text, mark="***"))


@dataclass
class LiteLLMProvider:
    """Every hosted model, through `litellm.acompletion` (no litellm retries, no cache)."""

    completion_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra arguments for litellm (e.g. `api_base`, or `mock_response` in tests)."""
    _prices: dict[str, Price | None] = field(default_factory=dict, repr=False)

    def price(self, model: str) -> Price | None:
        """The model's price per token from litellm's cost map; None: unknown (self-hosted)."""
        if model not in self._prices:
            self._prices[model] = _litellm_price(model)
        return self._prices[model]

    def supports_schema(self, model: str) -> bool:
        """As litellm says; an `openai/` model its cost map does not know (a self-hosted
        server's) gets the schema too, as through the direct client (engine.models.openai_http)."""
        if model.startswith("openai/") and _unknown_openai(model):
            return True
        return _litellm_says("supports_response_schema", model)

    def preflight(self, model: str) -> None:
        """An unknown model string is a usage error; a missing key is named before any call."""
        if model.startswith(_EMBEDDINGS_ONLY):
            raise UsageError(f"model '{model}': litellm's `openai_like/` provider sends embeddings only, "
                             "no chat completions (its answer would be 'Unmapped LLM provider')",
                             hint=f"write openai/{model.split('/', 1)[1]} with --api-base URL: sopctl's own "
                                  "client for any OpenAI-compatible server")
        litellm = litellm_module()
        try:
            litellm.get_llm_provider(model=model)
        except Exception:  # noqa: BLE001 - litellm's message lists every provider
            raise UsageError(f"unknown model '{model}': litellm cannot tell its provider",
                             hint="write provider/model (e.g. openai/gpt-4o-mini), or use "
                                  "--model local / --model fake") from None
        if "mock_response" in self.completion_kwargs:
            return
        missing = _missing_keys(model)
        if missing:
            raise RunError(f"model '{model}' needs {', '.join(missing)} in the environment",
                           hint="API keys are read only from the environment, never from files")

    async def complete(self, request: ModelRequest) -> ModelAnswer:
        if "mock_response" not in self.completion_kwargs:
            check_real_model_allowed(request.spec)
        model = request.spec.model
        litellm = litellm_module()
        _ignore_unsent_calls()   # each call: a test harness or host may have reset the filters
        REQUEST_SENT.set()       # litellm is imported: what is left before sending is short
        try:
            response = await litellm.acompletion(**self._kwargs(model, request))
        except Exception as exc:  # noqa: BLE001 - converted to our error family here
            raise self._convert(exc, request.spec) from None
        return self._answer_of(litellm, model, request, response)

    def _kwargs(self, model: str, request: ModelRequest) -> dict[str, Any]:
        spec = request.spec
        kwargs: dict[str, Any] = {"model": model, "messages": list(request.messages),
                                  "num_retries": 0, "drop_params": True,
                                  "timeout": spec.timeout_s or DEFAULT_TIMEOUT_S}
        rformat = wire_format(request.response_format, spec.response_format)   # a declared form
        for name, value in (("temperature", spec.temperature), ("max_tokens", spec.max_tokens),
                            ("response_format", rformat)):
            if value is not None:
                kwargs[name] = value
        tools = native_tools(model, spec)
        if tools:   # a tool loop's step: the provider's own tool calling, not the JSON list
            kwargs.pop("response_format", None)
            kwargs.update(tools=tools, tool_choice="required")
        points = cache_points(model)
        if points:
            kwargs["cache_control_injection_points"] = points
        return {**kwargs, **self.completion_kwargs}

    def _convert(self, exc: Exception, spec: CallSpec) -> LLMError:
        if isinstance(exc, LLMError):
            return exc
        message = redact(f"{type(exc).__name__}: {exc}").strip()
        message = message if len(message) <= 400 else message[:400] + "..."
        if type(exc).__name__ == "AuthenticationError" or _MISSING_KEY.search(str(exc)):
            return LLMError(f"model '{spec.model}' has no valid API key (action {spec.action})",
                            hint=_key_hint(spec.model))
        if _is_transient(exc):
            return TransientModelError(f"model '{spec.model}' for action {spec.action}: {message}",
                                       retry_after_s=_retry_after_s(exc))
        return LLMError(f"model '{spec.model}' failed for action {spec.action}: {message}")

    def _answer_of(self, litellm: Any, model: str, request: ModelRequest, response: Any) -> ModelAnswer:
        """Text, tokens and cost of a response; tokens counted here when the body has no usage."""
        spec = request.spec
        choices = getattr(response, "choices", None)
        if not choices:
            raise TransientModelError(f"model '{spec.model}' for action {spec.action}: the answer "
                                      "has no choices (an empty `choices` list)")
        text = choices[0].message.content or ""
        calls = getattr(choices[0].message, "tool_calls", None)
        if calls and spec.tool_step >= 0:
            text = commands_text(spec, text, calls)
        prompt_tokens, completion_tokens = _usage_of(response)
        cached = cached_tokens(getattr(response, "usage", None))
        counted = prompt_tokens == 0 and completion_tokens == 0   # no usage: litellm says 0, 0
        if counted:
            prompt_tokens, completion_tokens = _count_tokens(litellm, model, request, text)
        finish = str(getattr(choices[0], "finish_reason", None) or "")
        price = price_of(self, spec)
        if price is None:  # unknown to litellm and no price given: 0, and said so
            return ModelAnswer(text, prompt_tokens, completion_tokens, 0.0, priced=False,
                               finish_reason=finish, cached_tokens=cached)
        cost = price.cost(prompt_tokens, completion_tokens, cached)
        if not counted and price is not spec.fallback_price:  # litellm's own price
            cost = _litellm_cost(litellm, response, cost)
        return ModelAnswer(text, prompt_tokens, completion_tokens, cost, finish_reason=finish,
                           cached_tokens=cached)


_EMBEDDINGS_ONLY = ("openai_like/",)
"""Providers litellm knows only for embeddings (litellm.main: `openai_like` in `embedding` only)."""


def _unknown_openai(model: str) -> bool:
    """An `openai/` model litellm's cost map does not list as OpenAI's (a self-hosted one)."""
    try:
        cost = litellm_module().model_cost
    except Exception:  # noqa: BLE001 - no cost map: nothing is known
        return True
    entries = [cost.get(name) for name in (model[len("openai/"):], model)]
    return not any(isinstance(e, dict) and (e.get("litellm_provider") == "openai" or "alias_of" in e)
                   for e in entries)


def _function_names(spec: CallSpec) -> dict[str, str]:
    """Provider function name -> our command (`editor.write` -> `editor__write`: a provider
    allows only letters, digits, `_` and `-`)."""
    names = {re.sub(r"[^A-Za-z0-9_-]", "_", name.replace(".", "__"))[:64]: name for name, _ in spec.commands}
    return names if len(names) == len(spec.commands) else {}


_MARKED_CACHE_PROVIDERS = ("anthropic", "bedrock", "vertex_ai", "gemini", "azure_ai", "openrouter",
                           "databricks", "dashscope", "minimax", "zai")
"""Providers that cache a prompt only up to a marked point (litellm's `cache_control`);
OpenAI, DeepSeek and xAI cache every long prefix by themselves."""


def cache_points(model: str) -> list[dict[str, Any]]:
    """Where litellm marks a request for the provider's prompt cache: the system prompt (the
    role, its commands: the same in every request of the role) and the last message (the
    whole request: the next step of a tool loop begins with it). None for the others."""
    provider = model.split("/", 1)[0] if "/" in model else ("anthropic" if model.startswith("claude") else "")
    if provider not in _MARKED_CACHE_PROVIDERS:
        return []
    return [{"location": "message", "role": "system"}, {"location": "message", "index": -1}]


def native_tools(model: str, spec: CallSpec) -> list[dict[str, Any]] | None:
    """A tool loop's commands as the provider's tools, when litellm says the model calls
    functions (else None: the JSON command list in the prompt, as for every other model)."""
    if spec.tool_step < 0 or not spec.commands:
        return None
    if not _litellm_says("supports_function_calling", model):
        return None
    return tool_list(spec)


@functools.cache
def _litellm_says(question: str, model: str) -> bool:
    """litellm's `supports_response_schema` or `supports_function_calling` for a model, asked
    once per process: for `ollama_chat/` and `ollama/` models each question is an HTTP request
    to the server's /api/show (blocking, on the event loop), which was made for every request."""
    try:
        return bool(getattr(litellm_module(), question)(model=model))
    except Exception:  # noqa: BLE001 - unknown model: the schema (or the command list) in the prompt
        return False


def tool_list(spec: CallSpec) -> list[dict[str, Any]] | None:
    """A tool loop's commands as OpenAI-style tools (None: a name clash after renaming)."""
    names = {ours: theirs for theirs, ours in _function_names(spec).items()}
    if not spec.commands or not names:
        return None
    return [{"type": "function", "function": {"name": names[name], "parameters": args}}
            for name, args in spec.commands]


def commands_text(spec: CallSpec, content: str, calls: Any) -> str:
    """Native tool calls as our command list (what the gateway reads, and journals)."""
    names = _function_names(spec)
    commands = []
    for call in calls:
        function = _field(call, "function")
        name = str(_field(function, "name") or "")
        raw = _field(function, "arguments") or "{}"
        try:
            args = json.loads(raw) if isinstance(raw, str) else dict(raw)
        except (ValueError, TypeError, RecursionError):   # nested past the decoder: re-asked too
            args = {"arguments": str(raw)}   # not JSON: the schema check tells the model
        commands.append({"command_name": names.get(name, name), "args": args})
    return json.dumps({"thought": content, "commands": commands}, ensure_ascii=False)


def _field(value: Any, name: str) -> Any:
    """A field of litellm's response objects, or of the plain JSON the direct client reads."""
    return value.get(name) if isinstance(value, dict) else getattr(value, name, None)


# litellm reports a missing key for some providers as a 500 ("Missing credentials..."):
# that must not be retried as a server error.
_MISSING_KEY = re.compile(r"missing credentials|(no|missing|invalid|incorrect) api[ _-]?key|"
                          r"api[ _-]?key[^.]{0,60}(must be set|not set|not found|is required)", re.I)


_TRANSIENT_NAMES = {"RateLimitError", "Timeout", "APIConnectionError", "InternalServerError",
                    "ServiceUnavailableError", "BadGatewayError", "APITimeoutError"}


def _is_transient(exc: Exception) -> bool:
    if any(cls.__name__ in _TRANSIENT_NAMES for cls in type(exc).__mro__):
        return True
    status = getattr(exc, "status_code", None)
    return isinstance(status, int) and (status in (408, 429) or status >= 500)


def _missing_keys(model: str) -> list[str]:
    """Key variables litellm says `model` needs and the environment lacks (not URLs etc.)."""
    try:
        missing = litellm_module().validate_environment(model=model).get("missing_keys") or []
    except Exception:  # noqa: BLE001 - best effort; the call itself will tell
        return []
    return [name for name in missing if re.search(r"(KEY|TOKEN)$", str(name))]


def _key_hint(model: str) -> str:
    """Which environment variable the model needs (from litellm), never its value."""
    missing = _missing_keys(model)
    if missing:
        return f"set {', '.join(missing)} in the environment (API keys are read only from there)"
    return "check the provider's API key variable in the environment (see litellm's docs)"


def _usage_of(response: Any) -> tuple[int, int]:
    usage = getattr(response, "usage", None)
    return (token_count(getattr(usage, "prompt_tokens", 0)),
            token_count(getattr(usage, "completion_tokens", 0)))


_MOST_TOKENS = 10**9
"""More tokens than any one call has: a larger count from a server is not believed."""


def token_count(value: Any) -> int:
    """A server's token count as a count: a whole number from 0 to _MOST_TOKENS, else 0 (then,
    both counts 0, the answer's tokens are counted here, as for an answer without `usage`).
    A server's `"many"`, `-5` or `1e400` never fails the call nor lowers what it cost."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    if not (0 <= value <= _MOST_TOKENS):    # NaN, negatives, infinities, absurd counts
        return 0
    return int(value)


def cached_tokens(usage: Any) -> int:
    """The prompt tokens a provider read from its prompt cache, from an answer's `usage` (an
    object, as litellm gives it, or the JSON dict of an OpenAI-compatible body): OpenAI's
    `prompt_tokens_details.cached_tokens`, else Anthropic's `cache_read_input_tokens` (litellm
    reports both; DeepSeek's `prompt_cache_hit_tokens` too). The one place they are read."""
    def get(value: Any, name: str) -> Any:
        return value.get(name) if isinstance(value, dict) else getattr(value, name, None)
    for found in (get(get(usage, "prompt_tokens_details"), "cached_tokens"),
                  get(usage, "cache_read_input_tokens"), get(usage, "prompt_cache_hit_tokens")):
        if isinstance(found, (int, float)) and found > 0:
            return int(found)
    return 0


def _count_tokens(litellm: Any, model: str, request: ModelRequest, text: str) -> tuple[int, int]:
    """Tokens of a request and its answer, counted locally (litellm's tokenizer for the model,
    else its default one; at worst a quarter of the characters)."""
    try:
        return (int(litellm.token_counter(model=model, messages=list(request.messages))),
                int(litellm.token_counter(model=model, text=text, count_response_tokens=True)))
    except Exception:  # noqa: BLE001 - an estimate is better than zeros
        chars = sum(len(m.get("content", "")) for m in request.messages)
        return chars // 4 + 1, len(text) // 4 + 1


def _litellm_cost(litellm: Any, response: Any, estimate: float) -> float:
    """litellm's cost of a response (cached and reasoning tokens priced right), else ours."""
    try:
        return float(litellm.completion_cost(completion_response=response))
    except Exception:  # noqa: BLE001 - our price times the tokens
        return estimate


_RETRY_AFTER_STATUSES = (429, 503)


def _retry_after_s(exc: Exception) -> float | None:
    """The server's `Retry-After` on a 429 or 503: seconds, or an HTTP date (None: not given)."""
    if getattr(exc, "status_code", None) not in _RETRY_AFTER_STATUSES:
        return None
    headers = getattr(exc, "litellm_response_headers", None)
    if headers is None:
        headers = getattr(getattr(exc, "response", None), "headers", None)
    if headers is None:
        return None
    millis = _parse_retry_after(str(headers.get("retry-after-ms") or ""))  # OpenAI's finer one
    if millis is not None:
        return millis / 1000
    value = headers.get("retry-after")
    return _parse_retry_after(str(value)) if value else None


def _parse_retry_after(value: str) -> float | None:
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def _litellm_price(model: str) -> Price | None:
    try:
        info = litellm_module().get_model_info(model=model)
    except Exception:  # noqa: BLE001 - "This model isn't mapped yet": unknown price
        return None
    given, taken = info.get("input_cost_per_token"), info.get("output_cost_per_token")
    if given is None or taken is None:
        return None
    limit = info.get("max_output_tokens") or info.get("max_tokens")
    cached = info.get("cache_read_input_token_cost")
    return Price(float(given), float(taken), int(limit) if limit else None,
                 float(cached) if cached is not None else None)
