"""JSON Schema validation of plain SOP data (`sop.schema.json`), turned into diagnostics.

The schema is the language's single structural definition (editors use it through the YAML
language server). Every error is collected, `anyOf`/`oneOf` noise is collapsed to the branch
the user evidently meant, and each error becomes a `Diagnostic` with a stable code, a message
that says what was expected and a did-you-mean hint where a close spelling exists. Remote
`$ref`s are impossible: the validator gets an empty `referencing.Registry()`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from functools import lru_cache
from typing import Any

from engine.errors import Diagnostic
from engine.load.source import join_pointer

__all__ = ["did_you_mean", "pointer_of", "schema", "schema_text", "validate"]


_PATTERNS = {
    r"^[A-Z][A-Za-z0-9_]*$": "an id: a capital letter, then letters, digits or _",
    r"^[a-z][a-z0-9_-]*$": "a name: a lower-case letter, then lower-case letters, digits, _ or -",
    r"^[a-z_][a-z0-9_]*$": "a lower-case identifier",
    r"^[a-z][a-z0-9_+-]*$": "a lower-case language name such as python",
    r"^[A-Za-z_][A-Za-z0-9_]*$": "an environment variable name: letters, digits or _, not starting with a digit",
}


_JSON_TYPES = {"object": "a mapping", "array": "a list", "string": "a string", "integer": "an integer",
               "number": "a number", "boolean": "true or false", "null": "null"}


def schema_text() -> str:
    """The schema file as shipped in the package (what `sopctl schema` prints)."""
    from importlib import resources

    return resources.files("engine.load").joinpath("sop.schema.json").read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    return json.loads(schema_text())


@lru_cache(maxsize=1)
def _validator() -> Any:
    from jsonschema import Draft202012Validator, validators
    from referencing import Registry

    # 2.0 is an "integer" to JSON Schema but not to the (strict) pydantic models; the checker
    # sides with the models so that the two never disagree about a file.
    checker = Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool))
    strict_validator = validators.extend(Draft202012Validator, type_checker=checker)
    return strict_validator(schema(), registry=Registry())


def did_you_mean(word: Any, choices: Iterable[str]) -> str:
    """A `did you mean 'x'?` hint when a choice is a close spelling of `word`, else ''."""
    import difflib

    if not isinstance(word, str):
        return ""
    options = [c for c in choices if isinstance(c, str)]
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if not close:
        lowered = {c.lower(): c for c in options}
        close = [lowered[word.lower()]] if word.lower() in lowered else []
    return f"did you mean '{close[0]}'?" if close else ""


def pointer_of(path: Iterable[Any]) -> str:
    return join_pointer("", *path)


def validate(data: Any) -> list[Diagnostic]:
    """Every schema problem of `data`, as unlocated diagnostics (pointer set, no line yet)."""
    found: list[Diagnostic] = []
    for error in _validator().iter_errors(data):
        for leaf in _collapse(error):
            found.extend(_diagnose(leaf))
    return _unique(found)


def _unique(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    seen: set[tuple[str, str, str]] = set()
    result = []
    for diag in diagnostics:
        key = (diag.code, diag.pointer, diag.message)
        if key not in seen:
            seen.add(key)
            result.append(diag)
    return result


def _collapse(error: Any) -> list[Any]:
    """For anyOf/oneOf, the errors of the one branch the instance was evidently meant for."""
    if error.validator not in ("anyOf", "oneOf") or not error.context:
        return [error]
    branches: dict[Any, list[Any]] = {}
    for sub in error.context:
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)
    viable = [errs for errs in branches.values() if not any(_misfit(e) for e in errs)]
    if len(viable) > 1:
        viable = _closest(viable, error.instance)
    if len(viable) > 1:
        viable = _fitting_at_top(viable)
    if len(viable) == 1:
        return [leaf for sub in viable[0] for leaf in _collapse(sub)]
    return [error]


def _closest(branches: list[list[Any]], instance: Any) -> list[list[Any]]:
    """Among object branches, the one naming the most of the instance's keys (`{code: 3}`)."""
    if not isinstance(instance, dict):
        return branches
    scores = [len(set(errs[0].parent.schema["anyOf" if "anyOf" in errs[0].parent.schema else "oneOf"]
                      [errs[0].relative_schema_path[0]].get("properties", {})) & set(instance))
              for errs in branches]
    best = max(scores)
    chosen = [b for b, score in zip(branches, scores, strict=False) if score == best]
    return chosen if best > 0 else branches


def _fitting_at_top(branches: list[list[Any]]) -> list[list[Any]]:
    """The branches the instance itself fits, whose errors all lie inside it.

    An output tree `{Title: {instructions: x}}` fails `{code: LANG}` at its top (no `code`)
    but the tree branch only at `Title/instructions`: the misspelt key is what was meant."""
    inside = [errs for errs in branches if all(e.relative_path for e in errs)]
    return inside or branches


def _misfit(error: Any) -> bool:
    """A branch failing on the instance's own type or constant is not the one meant."""
    return not error.relative_path and error.validator in ("type", "const")


def _diagnose(error: Any) -> Iterator[Diagnostic]:
    rule = _RULES.get(error.validator, _generic)
    yield from rule(error, pointer_of(error.absolute_path))


def _diag(code: str, pointer: str, message: str, hint: str = "") -> Diagnostic:
    return Diagnostic(code=code, severity="error", message=message, pointer=pointer, hint=hint)


def _unknown_keys(error: Any, pointer: str) -> Iterator[Diagnostic]:
    known = list(error.schema.get("properties", {}))
    where = _where(pointer)
    for key in error.instance:
        if key in known:
            continue
        hint = did_you_mean(key, known) or (f"allowed keys: {', '.join(known)}" if known else "")
        yield _diag("SOP101", join_pointer(pointer, key), f"unknown key '{key}'{where}", hint)


def _where(pointer: str) -> str:
    return f" in {pointer}" if pointer else " at the top level"


def _required(error: Any, pointer: str) -> Iterator[Diagnostic]:
    missing = error.validator_value
    for key in missing:
        if isinstance(error.instance, dict) and key not in error.instance:
            yield _diag("SOP104", pointer, f"missing required key '{key}'{_where(pointer)}{_needed_by(error)}",
                        _required_hint(key, error.instance))


def _needed_by(error: Any) -> str:
    """` (`join` needs it)` when a key is required only because another key is there."""
    path = list(error.schema_path)
    if "dependentSchemas" in path[:-1]:
        return f" (`{path[path.index('dependentSchemas') + 1]}` needs it)"
    return ""


def _required_hint(key: str, instance: dict) -> str:
    close = did_you_mean(key, list(instance))
    if close:
        return close.replace("did you mean", "is this it:")
    description = _PROPERTY_DESCRIPTIONS().get(key, "")
    return f"`{key}`: {description}" if description else ""


@lru_cache(maxsize=1)
def _PROPERTY_DESCRIPTIONS() -> dict[str, str]:
    table: dict[str, str] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for name, sub in node.get("properties", {}).items():
                if isinstance(sub, dict) and "description" in sub:
                    table.setdefault(name, sub["description"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema())
    return table


def _enum(error: Any, pointer: str) -> Iterator[Diagnostic]:
    options = error.validator_value
    listed = ", ".join(repr(o) for o in options)
    yield _diag("SOP102", pointer, f"{_show(error.instance)} is not one of {listed}",
                did_you_mean(error.instance, options))


def _const(error: Any, pointer: str) -> Iterator[Diagnostic]:
    yield _diag("SOP102", pointer, f"expected {error.validator_value!r}, got {_show(error.instance)}",
                did_you_mean(error.instance, [error.validator_value]))


def _type(error: Any, pointer: str) -> Iterator[Diagnostic]:
    expected = error.validator_value
    kinds = [expected] if isinstance(expected, str) else list(expected)
    wanted = " or ".join(_JSON_TYPES.get(k, k) for k in kinds if k != "null") or "null"
    yield _diag("SOP103", pointer, f"expected {wanted}, got {_describe(error.instance)}",
                _type_hint(kinds, error.instance))


def _type_hint(kinds: list[str], instance: Any) -> str:
    if "string" in kinds and isinstance(instance, (int, float, bool)):
        return "quote the value to make it a string"
    if "array" in kinds and isinstance(instance, str):
        return f"write a list: [{instance}]"
    return ""


def _pattern(error: Any, pointer: str) -> Iterator[Diagnostic]:
    if "propertyNames" in error.schema_path:
        yield from _property_names(error, pointer)
        return
    meaning = _PATTERNS.get(error.validator_value, f"a string matching {error.validator_value}")
    yield _diag("SOP105", pointer, f"{_show(error.instance)} is not {meaning}")


def _property_names(error: Any, pointer: str) -> Iterator[Diagnostic]:
    """A badly formed key (an action or role id): reported at the key itself."""
    if error.validator == "propertyNames":
        for sub in error.context or []:
            yield from _property_names(sub, pointer)
        return
    name = error.instance
    meaning = _PATTERNS.get(error.validator_value, f"a string matching {error.validator_value}")
    yield _diag("SOP106", join_pointer(pointer, name), f"key {_show(name)} is not {meaning}", _id_hint(name))


def _id_hint(name: Any) -> str:
    if isinstance(name, str) and name[:1].islower() and name[:1].isalpha():
        return f"did you mean '{name[0].upper() + name[1:]}'?"
    return "ids start with a capital letter: WritePRD, Architect"


def _any_of(error: Any, pointer: str) -> Iterator[Diagnostic]:
    titles = [branch.get("title", "") for branch in error.validator_value if isinstance(branch, dict)]
    choices = ", ".join(t for t in titles if t) or "one of the allowed forms"
    consts = [str(b["const"]) for b in error.validator_value if isinstance(b, dict) and "const" in b]
    hint = did_you_mean(error.instance, consts)
    yield _diag("SOP103", pointer, f"expected {choices}; got {_describe(error.instance)}", hint)


def _generic(error: Any, pointer: str) -> Iterator[Diagnostic]:
    yield _diag("SOP105", pointer, _clip(error.message))


def _show(value: Any) -> str:
    return _clip(repr(value))


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if value is None:
        return "null"
    kind = {dict: "a mapping", list: "a list", str: "a string", int: "an integer", float: "a number"}
    shown = "" if isinstance(value, (dict, list)) else f" ({_show(value)})"
    return f"{kind.get(type(value), type(value).__name__)}{shown}"


_RULES = {
    "additionalProperties": _unknown_keys,
    "required": _required,
    "enum": _enum,
    "const": _const,
    "type": _type,
    "pattern": _pattern,
    "propertyNames": _property_names,
    "anyOf": _any_of,
    "oneOf": _any_of,
}
