"""ActionNode output trees: the type grammar, and compilation to a JSON Schema.

A node's `type` is one of `str`, `int`, `float`, `bool`, `list[T]`, `dict[str, T]`,
`enum[a|b|c]`, `optional[T]`; a node with `children` is an object, and `type: list` with
`children` is a list of such objects. The JSON Schema built here is what the gateway asks
the model for and what every answer is validated against.
"""

from __future__ import annotations

import re
from typing import Any

from engine.load.spec import CodeOutput, Output, OutputNode

__all__ = ["TypeSyntaxError", "parse_type", "node_schema", "with_pattern", "output_schema",
           "output_kind", "with_absent_as_null"]


_SCALARS = {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}


_GENERIC = re.compile(r"^(list|dict|enum|optional)\[(.*)\]$", re.S)


class TypeSyntaxError(ValueError):
    """A node `type` that the grammar does not accept; the message says what was expected."""


def parse_type(text: str) -> dict[str, Any]:
    """Turn a type expression into a JSON Schema fragment, or raise TypeSyntaxError."""
    text = text.strip()
    if text in _SCALARS:
        return {"type": _SCALARS[text]}
    match = _GENERIC.match(text)
    if not match:
        raise TypeSyntaxError(
            f"unknown type '{text}': expected str, int, float, bool, list[T], "
            "dict[str, T], enum[a|b|c] or optional[T]"
        )
    kind, inner = match.group(1), match.group(2).strip()
    if kind == "list":
        return {"type": "array", "items": parse_type(inner)}
    if kind == "optional":
        return {"anyOf": [parse_type(inner), {"type": "null"}]}
    if kind == "enum":
        values = [v.strip() for v in inner.split("|")]
        if not all(values):
            raise TypeSyntaxError(f"enum values must be non-empty, separated by '|': '{text}'")
        return {"type": "string", "enum": values}
    key, _, value = inner.partition(",")
    if key.strip() != "str" or not value.strip():
        raise TypeSyntaxError(f"dict keys must be str, as in dict[str, T]: '{text}'")
    return {"type": "object", "additionalProperties": parse_type(value)}


def _object_schema(children: dict[str, OutputNode]) -> dict[str, Any]:
    properties = {key: node_schema(node) for key, node in children.items()}
    required = [key for key, node in children.items() if not _is_optional(node)]
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _is_optional(node: OutputNode) -> bool:
    return node.type is not None and node.type.strip().startswith("optional[")


def node_schema(node: OutputNode) -> dict[str, Any]:
    """The JSON Schema of one node, with its instruction as `description`."""
    if node.children is not None:
        schema = _object_schema(node.children)
        if node.type and node.type.strip() == "list":
            schema = {"type": "array", "items": schema}
    else:
        schema = parse_type(node.type or "str")
        if node.pattern:
            schema = with_pattern(schema, node.pattern)
    if node.instruction:
        schema = {**schema, "description": node.instruction}
    if node.example is not None:   # JSON Schema's annotation; the prompt shows it to hosted models only
        schema = {**schema, "examples": [node.example]}
    return schema


def with_pattern(schema: dict[str, Any], pattern: str) -> dict[str, Any]:
    """Put `pattern` on every free string the schema holds (list items, dict values, optionals)."""
    if schema.get("type") == "string" and "enum" not in schema:
        return {**schema, "pattern": pattern}
    nested: dict[str, Any] = {key: with_pattern(schema[key], pattern)
                              for key in ("items", "additionalProperties") if isinstance(schema.get(key), dict)}
    if "anyOf" in schema:
        nested["anyOf"] = [with_pattern(option, pattern) for option in schema["anyOf"]]
    return {**schema, **nested}


def output_schema(output: Output) -> dict[str, Any] | None:
    """The JSON Schema of an action's structured output, None for `text` and `{code: ...}`."""
    if isinstance(output, dict):
        return _object_schema(output)
    return None


def output_kind(output: Output) -> str:
    """`json` for a tree, `text` for free text, `code` for a fenced code block."""
    if isinstance(output, CodeOutput):
        return "code"
    return "text" if output == "text" else "json"


def with_absent_as_null(value: Any, schema: dict[str, Any] | None) -> Any:
    """`value` with every `optional[...]` key it leaves out set to null, at every level.
    A model may skip an optional key altogether (the `local` grammar lets it); MetaGPT's
    optional fields then read None, and so `out['Key'] or 'none'` in a template works here."""
    if not isinstance(schema, dict):
        return value
    for option in schema.get("anyOf", ()):           # optional[T]: the branch the value took
        if isinstance(option, dict) and option.get("type") == _json_type(value):
            return with_absent_as_null(value, option)
    if isinstance(value, dict) and isinstance(schema.get("properties"), dict):
        properties = schema["properties"]
        filled = {key: with_absent_as_null(value[key], sub) if key in value else None
                  for key, sub in properties.items()}            # in the tree's order
        filled.update({key: item for key, item in value.items() if key not in properties})
        return filled
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [with_absent_as_null(item, schema["items"]) for item in value]
    return value


def _json_type(value: Any) -> str:
    return "object" if isinstance(value, dict) else "array" if isinstance(value, list) else ""
