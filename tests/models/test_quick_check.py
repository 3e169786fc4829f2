"""The quick check (engine/models/quick_check.py) against jsonschema's Draft 2020-12: it never
calls an invalid value valid, it agrees with jsonschema on JSON values for every schema it
covers, and it covers the schemas a run checks most (every shipped SOP's outputs, every
built-in command's args, a tool loop's step)."""

from __future__ import annotations

import json
import random
from decimal import Decimal
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from engine.compile.compiler import compile_path
from engine.load.catalog import BUILTIN
from engine.models import answers
from engine.models.quick_check import compile_check
from engine.run.toolloop import QUICK_SCHEMA, last_step_schema, step_schema

from run_helpers import ROOT

SHIPPED = sorted([*(ROOT / "sops").glob("*.sop.yaml"), *(ROOT / "examples").glob("*.sop.yaml")])

KEYWORDS: list[dict[str, Any]] = [
    {"type": "integer", "minimum": 1, "maximum": 3},
    {"type": ["number", "null"], "exclusiveMinimum": 0, "exclusiveMaximum": 2.5},
    {"type": "string", "minLength": 2, "maxLength": 3},
    {"type": "string", "pattern": "^[a-z]+\\.py$"},
    {"enum": ["a", None, True]},
    {"const": "x"},
    {"const": False},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2},
    {"type": "array", "items": False},
    {"type": "object", "required": ["a"], "additionalProperties": False,
     "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}},
    {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1, "maxProperties": 2},
    {"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 5}]},
    {"allOf": [{"required": ["a"]}, {"properties": {"a": {"enum": ["x", "y"]}}}]},
    {"description": "anything", "examples": [1], "format": "email"},
    True,
    False,
]

LEFT_TO_JSONSCHEMA: list[dict[str, Any]] = [
    {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    {"not": {"type": "string"}},
    {"$defs": {"a": {"type": "string"}}, "$ref": "#/$defs/a"},
    {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
    {"type": "array", "prefixItems": [{"type": "string"}]},
    {"type": "array", "uniqueItems": True},
    {"type": "number", "multipleOf": 0.5},
    {"enum": [1, 2]},
    {"type": "object", "x-custom": 1},
]


def _schemas() -> list[dict[str, Any]]:
    """What a run checks: shipped outputs, built-in args, a tool loop's answers."""
    found = [step_schema(["editor.write", "plan.finish_current_task"]), QUICK_SCHEMA]
    for path in SHIPPED:
        found += [s for s in compile_path(path).output_schemas.values() if s is not None]
    for commands in BUILTIN.values():
        found += [command.args for command in commands]
    found.append(last_step_schema(found[-1]))
    return found


SCHEMAS = _schemas()


def _values(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    """A value near `schema`: mostly of its shape, often just off it (a missing or extra key,
    a wrong type, a bound crossed), sometimes any JSON at all."""
    if depth > 4 or not isinstance(schema, dict) or rng.random() < 0.08:
        return rng.choice([None, True, False, 0, 1, -1, 2.5, 3.0, "", "a", "ab.py", "xyz",
                           [], [1], {}, {"a": "x"}])
    if "enum" in schema and rng.random() < 0.8:
        return rng.choice([*schema["enum"], "other"])
    if "const" in schema and rng.random() < 0.8:
        return schema["const"]
    kind = schema.get("type", rng.choice(["string", "object", "array", "integer"]))
    kind = rng.choice(kind) if isinstance(kind, list) else kind
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        value = {k: _values(sub, rng, depth + 1) for k, sub in props.items() if rng.random() < 0.85}
        if rng.random() < 0.2:
            value["extra"] = _values({}, rng, depth + 1)
        return value
    if kind == "array":
        return [_values(schema.get("items", {}), rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind in ("integer", "number"):
        edges = [schema.get(k) for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")]
        near = [e + d for e in edges if isinstance(e, (int, float)) for d in (-1, -0.5, 0, 0.5, 1)]
        return rng.choice([*near, 0, 1, 7, 1.0, 2.5, True])
    if kind == "boolean":
        return rng.choice([True, False, 0])
    if kind == "null":
        return rng.choice([None, 0])
    width = rng.choice([0, 1, 2, 3, 4, 40])
    return rng.choice(["", "x" * width, "a.py", "ab c.py", "src/main.py", "é" * width])


def _agree(schema: Any, count: int, seed: int) -> None:
    quick = compile_check(schema)
    assert quick is not None, schema
    validator = Draft202012Validator(schema)
    rng = random.Random(seed)
    for _ in range(count):
        value = _values(schema, rng)
        assert quick(value) == validator.is_valid(value), (json.dumps(schema), value)


@pytest.mark.parametrize("schema", KEYWORDS, ids=[json.dumps(s)[:60] for s in KEYWORDS])
def test_each_keyword_decides_as_jsonschema_does(schema: dict[str, Any]) -> None:
    _agree(schema, 400, seed=7)


def test_the_schemas_a_run_checks_are_all_quick_and_decide_as_jsonschema_does() -> None:
    assert len(SCHEMAS) > 30
    for index, schema in enumerate(SCHEMAS):
        _agree(schema, 150, seed=index)


@pytest.mark.parametrize("schema", LEFT_TO_JSONSCHEMA, ids=[json.dumps(s)[:50] for s in LEFT_TO_JSONSCHEMA])
def test_keywords_a_false_could_make_wrong_are_left_to_jsonschema(schema: dict[str, Any]) -> None:
    assert compile_check(schema) is None
    value = {"a": 1} if schema.get("type") == "object" else 3
    assert (answers.schema_errors(value, schema) == []) == Draft202012Validator(schema).is_valid(value)


@pytest.mark.parametrize("value", [Decimal("0.5"), Decimal("9"), (1, 2), 1 + 2j])
def test_a_value_json_never_gives_is_left_to_jsonschema(value: Any) -> None:
    """Not a JSON value (a number of another kind, a tuple): the quick check never says valid
    where jsonschema would not."""
    for schema in ({"minimum": 1}, {"type": "array"}, {"type": "number", "maximum": 3}):
        quick = compile_check(schema)
        assert quick is not None
        try:
            valid = Draft202012Validator(schema).is_valid(value)
        except TypeError:
            valid = False
        assert not quick(value) or valid


def test_an_answer_that_fails_gets_jsonschema_s_errors() -> None:
    schema = {"type": "object", "required": ["Title"], "additionalProperties": False,
              "properties": {"Title": {"type": "string", "minLength": 3}}}
    assert answers.schema_errors({"Title": "Leaf"}, schema) == []
    assert sorted(answers.schema_errors({"Title": "Le", "x": 1}, schema)) == [
        "at /Title: 'Le' is too short",
        "at the top level: Additional properties are not allowed ('x' was unexpected)"]
