"""Which provider answers a model name, and which model an action uses.

The model-choice rule lives here and only here: `--model` > $SOPCTL_MODEL > the action's
`llm.model` > the role's > the file's > `local`. Providers are found in this order: an
active `override_model(...)` (tests), the gateway's own `providers`, the registry
(`register_model`; the built-ins `fake` and `local` are imported on first use), else
litellm (`engine.models.hosted`)."""

from __future__ import annotations

import contextlib
import importlib
import os
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Iterator, Mapping

from engine.models.types import CallSpec, Price, Provider, RealModelBlocked

if TYPE_CHECKING:
    from engine.compile.compiler import CompiledSop

__all__ = ["DEFAULT_MODEL", "MODEL_ENV", "TEST_MODEL", "choose_model", "pinned_model", "resolve_llm", "default_model", "register_model",
           "unregister_model", "override_model", "real_models_blocked", "check_real_model_allowed"]


DEFAULT_MODEL = "local"
MODEL_ENV = "SOPCTL_MODEL"


TEST_MODEL = "fake"
"""The model that replaces every other, even an action's own: a test run never calls a real one."""


def choose_model(override: str | None, declared: str | None, pinned: str | None = None) -> str:
    """The rule: an action's own `llm.model` (`pinned`: MetaGPT's per-action llm) > `--model`
    > $SOPCTL_MODEL > what the file or the role declares > local; `--model fake` (or
    SOPCTL_MODEL=fake) replaces every model, the action's too."""
    given = override or os.environ.get(MODEL_ENV)
    if pinned and given != TEST_MODEL:
        return pinned
    return given or declared or DEFAULT_MODEL


def pinned_model(compiled: CompiledSop, action_id: str) -> str | None:
    """The model an action names in its own `llm` (None: it leaves the choice to the run)."""
    action = compiled.spec.actions.get(action_id)
    llm = getattr(action, "llm", None)
    return llm.model if llm is not None else None


def resolve_llm(compiled: CompiledSop, role_id: str, action_id: str, override: str | None,
                price: Price | None = None) -> dict[str, Any]:
    """Model and sampling settings of one action as the role runs it: what the compiler
    found declared (action, else role, else file: `CompiledSop.plan.llm`), the model by
    `choose_model`; `price` (per token) for a model litellm cannot price: the one given
    (`--price`), else the declared `llm.price`."""
    declared = compiled.plan.llm[(role_id, action_id)]
    given = declared.price
    return {"model": choose_model(override, declared.model, pinned_model(compiled, action_id)), "temperature": declared.temperature,
            "max_tokens": declared.max_tokens, "timeout_s": declared.timeout_s,
            "response_format": declared.response_format,
            "price": price or (Price(given.input_per_million / 1e6, given.output_per_million / 1e6)
                               if given is not None else None)}


def default_model(compiled: CompiledSop, override: str | None = None) -> str:
    """The run's model where no role or action names one (what RunStarted records)."""
    return choose_model(override, compiled.spec.llm.model)


# --------------------------------------------------------------------------- model registry

_REGISTRY: dict[str, Provider] = {}


_BUILTINS = {"fake": ("engine.models.fake", "FakeModel"), "local": ("engine.models.local", "LocalModel")}


_OVERRIDES: list[Provider] = []


_BLOCKED = [0]


def register_model(name: str, provider: Provider) -> Provider | None:
    """Make `--model NAME` use `provider`; returns the provider it replaces, if any."""
    previous = _REGISTRY.get(name)
    _REGISTRY[name] = provider
    return previous


def unregister_model(name: str) -> None:
    """Forget a registered model (a built-in comes back on its next use)."""
    _REGISTRY.pop(name, None)


@contextlib.contextmanager
def override_model(provider: Provider) -> Iterator[Provider]:
    """Inside the block every call goes to `provider`, whatever model the SOP names."""
    _OVERRIDES.append(provider)
    try:
        yield provider
    finally:
        _OVERRIDES.remove(provider)


def real_models_blocked() -> bool:
    """True while `engine.testing.block_real_models()` is active."""
    return _BLOCKED[0] > 0


def check_real_model_allowed(spec: CallSpec) -> None:
    """Raise RealModelBlocked inside a guarded test suite (called by real providers)."""
    if real_models_blocked():
        raise RealModelBlocked(
            f"real model call blocked in tests: action {spec.action} asked model '{spec.model}'",
            hint="use --model fake or engine.testing.ScriptedModel, or wrap the test in "
                 "engine.testing.allow_real_models()",
        )


def is_hosted(model: str) -> bool:
    """Whether `model` goes to litellm (no registered, built-in or overriding provider)."""
    return not _OVERRIDES and model not in _REGISTRY and model not in _BUILTINS


def _resolve(model: str, own: Mapping[str, Provider], fallback: Callable[[], Provider]) -> Provider:
    if _OVERRIDES:
        return _OVERRIDES[-1]
    if model in own:
        return own[model]
    if model not in _REGISTRY and model in _BUILTINS:
        module, cls = _BUILTINS[model]
        _REGISTRY[model] = getattr(importlib.import_module(module), cls)()
    return _REGISTRY[model] if model in _REGISTRY else fallback()
