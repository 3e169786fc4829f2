"""Hosted models through litellm: one lazy import, our error mapping, key redaction.

Why a module of its own: this is the only place that touches litellm's API, so the gateway
(`engine.models.gateway`) stays readable and `import engine` never pays for litellm (it is imported
on the first call that needs it, with `LITELLM_LOCAL_MODEL_COST_MAP=True` so that the
import never fetches a price list from the network).

Errors are mapped here: rate limits, timeouts, connection and 5xx errors become
`TransientModelError` (the gateway retries them with backoff; litellm's own retries are off),
a missing or rejected key becomes an `LLMError` whose hint names the environment variable,
anything else an `LLMError` with litellm's message. Every message goes through `redact`
first, so no key value ever reaches an error, a log or a journal.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from engine.errors import LLMError, RunError, UsageError
from engine.load.secrets import secret_values
from engine.models.registry import check_real_model_allowed
from engine.models.types import CallSpec, ModelAnswer, ModelRequest, TransientModelError

__all__ = ["LiteLLMProvider", "litellm_module", "redact"]


_LITELLM: list[Any] = []


_LITELLM_LOCK = threading.Lock()


def litellm_module() -> Any:
    """Import litellm once, quietly, with its offline cost map (no fetch at import)."""
    with _LITELLM_LOCK:
        if not _LITELLM:
            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            import logging

            import litellm

            litellm.suppress_debug_info = True
            litellm.telemetry = False
            for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "litellm"):
                logging.getLogger(name).setLevel(logging.ERROR)
            _LITELLM.append(litellm)
        return _LITELLM[0]


_KEY_SHAPES = re.compile(r"\b(?:(?:sk|pk|rk|gsk|xai|hf|ghp|github_pat)[-_][-_A-Za-z0-9]{12,}|AIza[-_A-Za-z0-9]{20,})")


def redact(text: str) -> str:
    """Remove every secret value of the environment (engine/load/secrets.py: the rule the
    journal and exec share) and every key-shaped token from `text`."""
    for value in secret_values():
        text = text.replace(value, "***")
    return _KEY_SHAPES.sub("***", text)


@dataclass
class LiteLLMProvider:
    """Every hosted model, through `litellm.acompletion` (no litellm retries, no cache)."""

    completion_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra arguments for litellm (e.g. `api_base`, or `mock_response` in tests)."""
    transient: bool = True
    """False: every error is final (an in-process model is not helped by waiting)."""

    def supports_schema(self, model: str) -> bool:
        try:
            return bool(litellm_module().supports_response_schema(model=model))
        except Exception:  # noqa: BLE001 - unknown model: ask in the prompt instead
            return False

    def preflight(self, model: str) -> None:
        """An unknown model string is a usage error; a missing key is named before any call."""
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
        return await self.acompletion(request.spec.model, request)

    async def acompletion(self, model: str, request: ModelRequest) -> ModelAnswer:
        """Call litellm for `model` (may differ from spec.model, e.g. `local`'s provider)."""
        litellm = litellm_module()
        try:
            response = await litellm.acompletion(**self._kwargs(model, request))
        except Exception as exc:  # noqa: BLE001 - converted to our error family here
            raise self._convert(exc, request.spec) from None
        return _answer_of(litellm, response)

    def _kwargs(self, model: str, request: ModelRequest) -> dict[str, Any]:
        spec = request.spec
        kwargs: dict[str, Any] = {"model": model, "messages": list(request.messages),
                                  "num_retries": 0, "drop_params": True}
        for name, value in (("temperature", spec.temperature), ("max_tokens", spec.max_tokens),
                            ("timeout", spec.timeout_s), ("response_format", request.response_format)):
            if value is not None:
                kwargs[name] = value
        return {**kwargs, **self.completion_kwargs}

    def _convert(self, exc: Exception, spec: CallSpec) -> LLMError:
        if isinstance(exc, LLMError):
            return exc
        message = redact(f"{type(exc).__name__}: {exc}").strip()
        message = message if len(message) <= 400 else message[:400] + "..."
        if type(exc).__name__ == "AuthenticationError" or _MISSING_KEY.search(str(exc)):
            return LLMError(f"model '{spec.model}' has no valid API key (action {spec.action})",
                            hint=_key_hint(spec.model))
        if self.transient and _is_transient(exc):
            return TransientModelError(f"model '{spec.model}' for action {spec.action}: {message}")
        return LLMError(f"model '{spec.model}' failed for action {spec.action}: {message}")


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


def _answer_of(litellm: Any, response: Any) -> ModelAnswer:
    text = response.choices[0].message.content or ""
    usage = getattr(response, "usage", None)
    try:
        cost = float(litellm.completion_cost(completion_response=response) or 0.0)
    except Exception:  # noqa: BLE001 - unknown price: 0, as MetaGPT does
        cost = 0.0
    return ModelAnswer(text=text, prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
                       completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
                       cost_usd=cost)
