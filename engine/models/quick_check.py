"""A JSON Schema compiled to one Python predicate: the quick check every answer gets first.

jsonschema checks a value by walking its schema and making a validator object for every
subschema it descends into: about 30 us for a tool loop step's answer here, twice a step
(the answer, then each command's arguments), and most answers are valid. `compile_check`
turns a schema of the common keywords into nested closures that say only whether a value is
valid, as Draft 2020-12 (jsonschema's checker, engine.models.answers) decides it: True is
"valid"; False is "ask jsonschema", which then decides, and whose errors the model is shown.
So a quick check may say False of a valid value (a `Decimal` against a `minimum`), never
True of an invalid one; `oneOf` and `not`, which a False could turn into a wrong True, are
left to jsonschema, as is any keyword not below (the schema gets no quick check: None).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

from engine.load import patterns

__all__ = ["Check", "compile_check"]

Check = Callable[[Any], bool]

_ANNOTATIONS = frozenset({"title", "description", "examples", "default", "$comment", "$schema",
                          "deprecated", "readOnly", "writeOnly", "format"})
"""Keywords that never fail a value (our validator asserts no `format`)."""

_MAX_DEPTH = 64


class _Unsupported(Exception):
    """A keyword (or a value of one) the quick check leaves to jsonschema."""


def compile_check(schema: Any) -> Check | None:
    """The quick check of a valid schema (jsonschema has checked it), or None when it uses a
    keyword the quick check does not cover."""
    try:
        return _compile(schema, 0)
    except _Unsupported:
        return None


def _compile(schema: Any, depth: int) -> Check:
    if schema is True:
        return _always
    if schema is False:
        return _never
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        raise _Unsupported
    checks = []
    for key, value in schema.items():
        if key in _ANNOTATIONS:
            continue
        build = _KEYWORDS.get(key)
        if build is None:
            raise _Unsupported
        checks.append(build(value, schema, depth + 1))
    return _all_of(checks)


def _all_of(checks: list[Check]) -> Check:
    if not checks:
        return _always
    if len(checks) == 1:
        return checks[0]
    def check(value: Any) -> bool:
        for one in checks:
            if not one(value):
                return False
        return True
    return check


def _always(value: Any) -> bool:
    return True


def _never(value: Any) -> bool:
    return False


# types, as jsonschema's Draft 2020-12 type checker has them ---------------------------------

def _is_integer(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Number) and not isinstance(value, bool)


_TYPES: dict[str, Check] = {
    "string": lambda v: isinstance(v, str),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": _is_integer,
    "number": _is_number,
}


def _type(types: Any, schema: dict[str, Any], depth: int) -> Check:
    names = [types] if isinstance(types, str) else list(types)
    if not names or any(name not in _TYPES for name in names):
        raise _Unsupported
    if len(names) == 1:
        return _TYPES[names[0]]
    options = [_TYPES[name] for name in names]
    return lambda v: any(option(v) for option in options)


# values ---------------------------------------------------------------------------------

def _plain_members(values: list[Any]) -> tuple[frozenset[str], tuple[Any, ...]]:
    """An enum's strings and its other members (None, True, False); others are jsonschema's
    (its `equal` makes 1 equal 1.0 but not True)."""
    texts = frozenset(v for v in values if isinstance(v, str))
    others = tuple(v for v in values if not isinstance(v, str))
    if any(v is not None and not isinstance(v, bool) for v in others):
        raise _Unsupported
    return texts, others


def _enum(values: Any, schema: dict[str, Any], depth: int) -> Check:
    texts, others = _plain_members(list(values))
    return lambda v: (v in texts) if isinstance(v, str) else any(v is other for other in others)


def _const(value: Any, schema: dict[str, Any], depth: int) -> Check:
    return _enum([value], schema, depth)


# objects ----------------------------------------------------------------------------------

def _properties(properties: Any, schema: dict[str, Any], depth: int) -> Check:
    checks = [(name, _compile(sub, depth)) for name, sub in properties.items()]

    def check(value: Any) -> bool:
        if not isinstance(value, dict):
            return True
        for name, one in checks:
            if name in value and not one(value[name]):
                return False
        return True
    return check


def _required(names: Any, schema: dict[str, Any], depth: int) -> Check:
    wanted = tuple(names)
    return lambda v: not isinstance(v, dict) or all(name in v for name in wanted)


def _additional(extra: Any, schema: dict[str, Any], depth: int) -> Check:
    if "patternProperties" in schema:
        raise _Unsupported
    known = schema.get("properties", {})
    if extra is True:
        return _always
    if extra is False:
        return lambda v: not isinstance(v, dict) or all(key in known for key in v)
    one = _compile(extra, depth)
    return lambda v: not isinstance(v, dict) or all(one(v[key]) for key in v if key not in known)


def _min_properties(least: Any, schema: dict[str, Any], depth: int) -> Check:
    return lambda v: not isinstance(v, dict) or len(v) >= least


def _max_properties(most: Any, schema: dict[str, Any], depth: int) -> Check:
    return lambda v: not isinstance(v, dict) or len(v) <= most


# arrays -----------------------------------------------------------------------------------

def _items(items: Any, schema: dict[str, Any], depth: int) -> Check:
    if "prefixItems" in schema:
        raise _Unsupported
    one = _compile(items, depth)
    return lambda v: not isinstance(v, list) or all(one(item) for item in v)


def _min_items(least: Any, schema: dict[str, Any], depth: int) -> Check:
    return lambda v: not isinstance(v, list) or len(v) >= least


def _max_items(most: Any, schema: dict[str, Any], depth: int) -> Check:
    return lambda v: not isinstance(v, list) or len(v) <= most


# strings ----------------------------------------------------------------------------------

def _min_length(least: Any, schema: dict[str, Any], depth: int) -> Check:
    return lambda v: not isinstance(v, str) or len(v) >= least


def _max_length(most: Any, schema: dict[str, Any], depth: int) -> Check:
    return lambda v: not isinstance(v, str) or len(v) <= most


def _pattern(pattern: Any, schema: dict[str, Any], depth: int) -> Check:
    """RE2, as the validator's own `pattern` (engine.models.answers `_linear_time_validator`)."""
    return lambda v: not isinstance(v, str) or patterns.search(pattern, v)


# numbers: jsonschema's own comparisons, for int and float; another kind of number is its ---

def _bound(fails: Callable[[Any, Any], bool]) -> Callable[[Any, dict[str, Any], int], Check]:
    def build(limit: Any, schema: dict[str, Any], depth: int) -> Check:
        if isinstance(limit, bool) or not isinstance(limit, (int, float)):
            raise _Unsupported

        def check(value: Any) -> bool:
            kind = type(value)
            if kind is int or kind is float:
                return not fails(value, limit)
            return not _is_number(value)     # not a number: the keyword does not apply
        return check
    return build


# combinations whose result a False cannot turn into a wrong True --------------------------

def _any_of(schemas: Any, schema: dict[str, Any], depth: int) -> Check:
    options = [_compile(sub, depth) for sub in schemas]
    return lambda v: any(option(v) for option in options)


def _every_of(schemas: Any, schema: dict[str, Any], depth: int) -> Check:
    return _all_of([_compile(sub, depth) for sub in schemas])


_KEYWORDS: dict[str, Callable[[Any, dict[str, Any], int], Check]] = {
    "type": _type, "enum": _enum, "const": _const,
    "properties": _properties, "required": _required, "additionalProperties": _additional,
    "minProperties": _min_properties, "maxProperties": _max_properties,
    "items": _items, "minItems": _min_items, "maxItems": _max_items,
    "minLength": _min_length, "maxLength": _max_length, "pattern": _pattern,
    "minimum": _bound(lambda v, m: v < m), "maximum": _bound(lambda v, m: v > m),
    "exclusiveMinimum": _bound(lambda v, m: v <= m), "exclusiveMaximum": _bound(lambda v, m: v >= m),
    "anyOf": _any_of, "allOf": _every_of,
}
