"""A run's inputs and limits, checked before anything starts.

Inputs are checked here (unknown keys, missing required ones, types), so every front end
(CLI, API, resume) refuses a bad run the same way."""

from __future__ import annotations

import difflib
import math
from typing import Any, Mapping

from engine.check.compiler import CompiledSop
from engine.errors import UsageError, require_utf8
from engine.load.spec import InputSpec

__all__ = ["resolve_inputs", "parse_input_flags", "check_limits"]


_TRUE = {"true", "yes", "y", "1", "on"}


_FALSE = {"false", "no", "n", "0", "off"}


def resolve_inputs(compiled: CompiledSop, given: Mapping[str, Any]) -> dict[str, Any]:
    """Declared inputs with defaults applied and values coerced; UsageError for bad ones."""
    declared = compiled.spec.inputs
    unknown = [k for k in given if k not in declared and k != "idea"]
    if unknown:
        raise UsageError(f"unknown input '{unknown[0]}'", hint=_did_you_mean(unknown[0], declared))
    for key, value in given.items():
        require_utf8(str(key), "an input name")
        if isinstance(value, str):
            require_utf8(value, f"input '{key}'")
    values: dict[str, Any] = {}
    for key, spec in declared.items():
        if key in given and given[key] is not None:
            values[key] = _coerce(key, spec, given[key])
        elif spec.required:
            flag = "--idea TEXT" if key == "idea" else f"--input {key}=VALUE"
            raise UsageError(f"missing required input '{key}'" +
                             (f" ({spec.description})" if spec.description else ""),
                             hint=f"pass {flag}")
        else:
            values[key] = spec.default
    if "idea" in given and "idea" not in declared:
        values["idea"] = str(given["idea"])
    return values


def _did_you_mean(key: str, declared: Mapping[str, InputSpec]) -> str:
    names = sorted(set(declared) | {"idea"})
    close = difflib.get_close_matches(key, names, n=1)
    if close:
        return f"did you mean '{close[0]}'? declared inputs: {', '.join(names)}"
    return f"declared inputs: {', '.join(names)}"


def _coerce(key: str, spec: InputSpec, value: Any) -> Any:
    """Command-line values are strings; turn them into the declared type or say why not."""
    kind = spec.type
    try:
        if kind == "str":
            return str(value)
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE | _FALSE:
                return text in _TRUE
            raise ValueError
        if isinstance(value, bool):
            raise ValueError
        return int(value) if kind == "int" else float(value)
    except (TypeError, ValueError):
        raise UsageError(f"input '{key}' must be {kind}, got {value!r}") from None


def parse_input_flags(pairs: list[str], idea: str | None = None) -> dict[str, str]:
    """`--input k=v` flags (and `--idea`) as a mapping; a flag without `=` is a UsageError."""
    given: dict[str, str] = {}
    for pair in pairs:
        require_utf8(pair, "--input")
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--input expects KEY=VALUE, got {pair!r}")
        given[key.strip()] = value
    if idea is not None:
        require_utf8(idea, "--idea")
        given["idea"] = idea
    return given


def check_limits(max_rounds: int | None, budget_usd: float | None) -> None:
    """The run's overrides (`--rounds`, `--budget`), refused before anything starts."""
    if max_rounds is not None and max_rounds < 1:
        raise UsageError("--rounds (max_rounds) must be at least 1")
    if budget_usd is not None and not (math.isfinite(budget_usd) and budget_usd >= 0):
        raise UsageError(f"--budget (budget_usd) must be a number of dollars, 0 (no limit) or "
                         f"more; got {budget_usd}")
