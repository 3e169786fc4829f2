"""A run's inputs and limits, checked before anything starts.

Inputs are checked here (unknown keys, missing required ones, types), so every front end
(CLI, API, resume) refuses a bad run the same way."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from engine.compile.compiler import CompiledSop
from engine.errors import UsageError, did_you_mean, require_utf8
from engine.load.files import FileRefused, read_bounded
from engine.load.spec import InputSpec

__all__ = ["resolve_inputs", "parse_input_flags", "read_input_file", "check_limits", "INPUT_FILE_LIMIT"]


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
    close = did_you_mean(key, names)
    return f"{close} declared inputs: {', '.join(names)}" if close else f"declared inputs: {', '.join(names)}"


def _coerce(key: str, spec: InputSpec, value: Any) -> Any:
    """Command-line values are strings; turn them into the declared type or say why not."""
    kind = spec.type
    try:
        if kind in ("str", "file"):   # a file: its path, copied into the workspace when the run starts
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


INPUT_FILE_LIMIT = 1_000_000
"""Most bytes `--input KEY=@FILE` reads (the SOP file's own limit): it goes into prompts."""


def parse_input_flags(pairs: list[str], idea: str | None = None) -> dict[str, str]:
    """`--input k=v` flags (and `--idea`) as a mapping; a flag without `=` is a UsageError.

    `k=@path` is the text of the file at `path` (relative to the current directory);
    `k=@@text` is the literal `@text`."""
    given: dict[str, str] = {}
    for pair in pairs:
        require_utf8(pair, "--input")
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--input expects KEY=VALUE, got {pair!r}")
        if value.startswith("@@"):
            value = value[1:]
        elif value.startswith("@"):
            value = read_input_file(key.strip(), value[1:])
        given[key.strip()] = value
    if idea is not None:
        require_utf8(idea, "--idea")
        given["idea"] = idea
    return given


def read_input_file(key: str, path: str) -> str:
    """The text of `--input KEY=@path`: a regular file (never a FIFO, device or folder, which
    could block or never end), at most INPUT_FILE_LIMIT bytes, UTF-8."""
    what = f"--input {key}=@{path}"
    if not path:
        raise UsageError(f"{what}: no file named", hint="write KEY=@FILE, or KEY=@@text for a value starting with @")
    try:
        data = read_bounded(path, INPUT_FILE_LIMIT)
    except FileRefused as exc:
        raise UsageError(f"{what}: {exc.message}", exc.hint) from None
    try:
        return data.decode("utf-8-sig")  # a BOM is no part of the text
    except UnicodeDecodeError as exc:
        raise UsageError(f"{what}: the file is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
                         hint="convert it to UTF-8 (e.g. iconv -t UTF-8)") from None


def check_limits(max_rounds: int | None, budget_usd: float | None) -> None:
    """The run's overrides (`--rounds`, `--budget`), refused before anything starts."""
    if max_rounds is not None and max_rounds < 1:
        raise UsageError("--rounds (max_rounds) must be at least 1")
    if budget_usd is not None and not (math.isfinite(budget_usd) and budget_usd >= 0):
        raise UsageError(f"--budget (budget_usd) must be a number of dollars, 0 (no limit) or "
                         f"more; got {budget_usd}")
