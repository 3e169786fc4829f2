"""JSON Schema validation of plain SOP data (`sop.schema.json`), turned into diagnostics.

The schema is generated from the pydantic models (engine/load/schema_gen.py) and shipped in
the package; editors use a copy through the YAML language server. `validate` explains why the
models refused a file: every error is collected, `anyOf`/`oneOf` noise is collapsed to the
branch the user evidently meant (an action's branch is the one its `kind` names), and each
error becomes a `Diagnostic` with a stable code, a message that says what was expected and a
did-you-mean hint where a close spelling exists. Remote `$ref`s are impossible: the validator
gets an empty `referencing.Registry()`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from functools import lru_cache
from importlib import resources
from typing import Any

from engine.errors import Diagnostic, closest, did_you_mean
from engine.load.source import join_pointer

__all__ = ["pointer_of", "schema", "schema_text", "validate"]


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
    return resources.files("engine.load").joinpath("sop.schema.json").read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    return json.loads(schema_text())


@lru_cache(maxsize=1)
def _validator() -> Any:
    # jsonschema takes ~0.3 s to import: `sopctl --help` loads this module, only a check pays it
    from jsonschema import Draft202012Validator, validators
    from referencing import Registry

    # 2.0 is an "integer" to JSON Schema but not to the (strict) pydantic models; the checker
    # sides with the models so that the two never disagree about a file.
    checker = Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool))
    strict_validator = validators.extend(Draft202012Validator, type_checker=checker)
    return strict_validator(schema(), registry=Registry())


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
    if error.validator not in ("anyOf", "oneOf"):
        return [error]
    options = [_resolve(b) for b in error.validator_value]
    if _discriminator(options) is not None:
        return _by_kind(error, options)
    if not error.context or _exclusive(options):
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


def _resolve(node: Any) -> Any:
    """A `#/$defs/X` reference's target (the schema's own definitions only)."""
    while isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#/$defs/"):
        node = {**schema()["$defs"][node["$ref"].rsplit("/", 1)[1]],
                **{k: v for k, v in node.items() if k != "$ref"}}
    return node


DISCRIMINATOR = "kind"
"""The key that picks an action's branch (absent: the branch whose `kind` has a default, llm)."""


def _discriminator(options: list[Any]) -> dict[Any, int] | None:
    """kind value -> branch index, when every branch fixes `kind` to a constant (the action
    union); the branch that defaults it also answers for an absent `kind` (key None)."""
    table: dict[Any, int] = {}
    for index, option in enumerate(options):
        kind = option.get("properties", {}).get(DISCRIMINATOR, {}) if isinstance(option, dict) else {}
        if "const" not in kind:
            return None
        table[kind["const"]] = index
        if kind.get("default") == kind["const"]:
            table[None] = index
    return table


def _by_kind(error: Any, options: list[Any]) -> list[Any]:
    """The errors of the branch the action's `kind` names. Nothing when the instance is no
    mapping or names no kind there is: the enclosing schema's `type` and `kind` enum say so."""
    table = _discriminator(options) or {}
    instance = error.instance
    if not isinstance(instance, dict):
        return []
    chosen = table.get(instance.get(DISCRIMINATOR)) if isinstance(instance.get(DISCRIMINATOR, ""), str) else None
    if chosen is None:
        return []
    subs = [sub for sub in error.context or [] if sub.relative_schema_path[0] == chosen]
    return [leaf for sub in subs for leaf in _collapse(sub)]


def _exclusive(options: list[Any]) -> bool:
    """A oneOf of bare `required` branches (each forbidding the others' key, with the message
    an editor shows): exactly one of these keys (an MCP server's `command` or `url`),
    explained as such rather than branch by branch."""
    return all(isinstance(o, dict) and set(o) <= {"title", "description", "required", "errorMessage", "allOf"}
               and "required" in o
               for o in options)


def _closest(branches: list[list[Any]], instance: Any) -> list[list[Any]]:
    """Among object branches, the one naming the most of the instance's keys (`{code: 3}`)."""
    if not isinstance(instance, dict):
        return branches
    scores = [len(set(_resolve(errs[0].parent.validator_value[errs[0].relative_schema_path[0]])
                      .get("properties", {})) & set(instance))
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
    kind = error.schema.get("properties", {}).get(DISCRIMINATOR, {}).get("const")
    for key in error.instance:
        if key in known:
            continue
        owners = _KIND_KEYS().get(key, []) if kind is not None else []
        if owners:
            yield _other_kind(join_pointer(pointer, key), key, kind, owners, DISCRIMINATOR in error.instance)
            continue
        hint = did_you_mean(key, known) or _other_kind_spelling(key, kind) \
            or (f"allowed keys: {', '.join(known)}" if known else "")
        yield _diag("SOP101", join_pointer(pointer, key), f"unknown key '{key}'{where}", hint)


def _other_kind_spelling(key: str, kind: str | None) -> str:
    """`comand` on an llm action: close to `command`, a key of another kind (say which)."""
    name = closest(key, list(_KIND_KEYS())) if kind is not None else ""
    return f"did you mean '{name}'? (a key of kind {' or '.join(_KIND_KEYS()[name])} actions)" if name else ""


def _other_kind(pointer: str, key: str, kind: str, owners: list[str], kind_given: bool) -> Diagnostic:
    """A key of another kind of action (`command` on an llm action): which kind has it."""
    kinds = " or ".join(owners)
    change = f"change `kind` to {kinds}" if kind_given else f"add `kind: {kinds}`"
    return _diag("SOP110", pointer, f"`{key}` belongs to actions of kind {kinds}; this action is of kind {kind}"
                 + ("" if kind_given else " (it has no `kind`)"), f"{change}, or drop `{key}`")


@lru_cache(maxsize=1)
def _KIND_KEYS() -> dict[str, list[str]]:
    """key -> the kinds of action that have it (from the action union's branches)."""
    table: dict[str, list[str]] = {}
    for node in _all_nodes(schema()):
        options = [_resolve(b) for b in node.get("oneOf", [])]
        kinds = _discriminator(options) if options else None
        if not kinds:
            continue
        for kind, index in kinds.items():
            if kind is not None:
                for key in options[index].get("properties", {}):
                    table.setdefault(key, []).append(kind)
    return table


def _all_nodes(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _all_nodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _all_nodes(value)


def _where(pointer: str) -> str:
    return f" in {pointer}" if pointer else " at the top level"


def _required(error: Any, pointer: str) -> Iterator[Diagnostic]:
    missing = error.validator_value
    for key in missing:
        if isinstance(error.instance, dict) and key not in error.instance:
            own = error.schema.get("properties", {}).get(key, {}).get("description", "")
            yield _diag("SOP104", pointer, f"missing required key '{key}'{_where(pointer)}{_needed_by(error)}",
                        _required_hint(key, error.instance, own))


def _needed_by(error: Any) -> str:
    """` (`join` needs it)` when a key is required only because another key is there."""
    path = list(error.schema_path)
    if "dependentSchemas" in path[:-1]:
        return f" (`{path[path.index('dependentSchemas') + 1]}` needs it)"
    return ""


def _required_hint(key: str, instance: dict, description: str = "") -> str:
    close = did_you_mean(key, list(instance))
    if close:
        return close.replace("did you mean", "is this it:")
    description = description or _PROPERTY_DESCRIPTIONS().get(key, "")
    return f"`{key}`: {description}" if description else ""


@lru_cache(maxsize=1)
def _PROPERTY_DESCRIPTIONS() -> dict[str, str]:
    table: dict[str, str] = {}
    for node in _all_nodes(schema()):
        for name, sub in node.get("properties", {}).items():
            if isinstance(sub, dict) and "description" in sub:
                table.setdefault(name, sub["description"])
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
    options = [_resolve(b) for b in error.validator_value if isinstance(b, dict)]
    if _exclusive(options):
        yield _one_of_keys(error, pointer, options)
        return
    titles = [branch.get("title", "") for branch in options]
    choices = ", ".join(t for t in titles if t) or "one of the allowed forms"
    consts = [str(b["const"]) for b in error.validator_value if isinstance(b, dict) and "const" in b]
    hint = did_you_mean(error.instance, consts)
    yield _diag("SOP103", pointer, f"expected {choices}; got {_describe(error.instance)}", hint)


def _one_of_keys(error: Any, pointer: str, options: list[dict[str, Any]]) -> Diagnostic:
    """An MCP server with both `command` and `url`, or neither: pick one."""
    keys = [key for option in options for key in option["required"]]
    given = [key for key in keys if isinstance(error.instance, dict) and key in error.instance]
    named = [f"`{k}`" for k in keys]
    hint = (f"it has {' and '.join(f'`{k}`' for k in given)}: keep one" if given
            else f"it has neither {' nor '.join(named)}" if len(named) == 2 else f"it has none of {', '.join(named)}")
    return _diag("SOP104", pointer, f"pick one of {' or '.join(o.get('title', '') for o in options)}", hint)


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
