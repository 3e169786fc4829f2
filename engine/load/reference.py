"""docs/language.md, the key reference, written from the generated schema (engine/load/schema_gen.py).

One section per model (file, role, action kinds, output node, MCP server...), a table of its
keys: what each is (type, default, range) and what it means, as an editor would show it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["key_examples", "reference_text"]

Examples = dict[str, dict[str, str]]
"""A real use of each key: by model (its schema definition's name) and key as written."""


_HEADER = """# The SOP language: every key

Generated from the pydantic models (engine/load/spec.py) by `python -m engine.load.schema_gen`,
with the JSON Schema of the same command (`sopctl schema`); do not edit by hand. [Writing and checking an SOP](writing.md)
tells how the keys work together; this page lists each one, with its first use in the shipped
files (sops/, then examples/) where one uses it.
"""


def reference_text(document: dict[str, Any], examples: Examples | None = None) -> str:
    """The reference page of a schema document (the root, then its definitions by title), each
    key with a real use of it from `examples` where a shipped file has one."""
    defs = document.get("$defs", {})
    found = examples or {}
    sections = [_section(document, defs, level=2, examples=found.get("Sop", {}))]
    actions = document["properties"]["actions"]["additionalProperties"]
    sections.append(_union_section(actions, defs))
    named = sorted(((d.get("title", name), name) for name, d in defs.items()), key=_order)
    sections += [_section(defs[name], defs, level=2, examples=found.get(name, {})) for _, name in named]
    return _HEADER + "\n" + "\n\n".join(sections) + "\n"


def key_examples(files: Iterable[Path]) -> Examples:
    """The first use of each key in `files` (the shipped SOPs, in the order given): a value
    that is known to validate, since each file does. A file the models refuse is skipped."""
    # not at the top: the generator alone reads SOP files here, and spec imports this module's callers
    from pydantic import BaseModel, ValidationError
    from engine.load.source import load_path  # the generator alone loads files here
    from engine.load.spec import Sop  # the generator alone needs the models here

    found: Examples = {}

    def visit(value: Any, where: str) -> None:
        if isinstance(value, BaseModel):
            uses = found.setdefault(type(value).__name__, {})
            for name, info in type(value).model_fields.items():
                if name in value.model_fields_set:
                    item = getattr(value, name)
                    uses.setdefault(info.alias or name, f"{_snippet(item)} ({where})")
                    visit(item, where)
        elif isinstance(value, dict):
            for item in value.values():
                visit(item, where)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item, where)

    for path in files:
        try:
            visit(Sop.model_validate(load_path(path).data), path.name.removesuffix(".sop.yaml"))
        except (ValidationError, ValueError, OSError):
            continue
    return found


_SNIPPET_CHARS = 60


def _snippet(value: Any) -> str:
    """A value as one short line of YAML flow (JSON is YAML), cut with an ellipsis."""
    # not at the top: see key_examples
    from pydantic import BaseModel

    def plain(item: Any) -> Any:
        if isinstance(item, BaseModel):
            return item.model_dump(mode="json", by_alias=True, exclude_unset=True)
        if isinstance(item, dict):
            return {k: plain(v) for k, v in item.items()}
        if isinstance(item, (list, tuple)):
            return [plain(v) for v in item]
        return item

    text = json.dumps(plain(value), ensure_ascii=False, default=str)
    text = text if len(text) <= _SNIPPET_CHARS else text[:_SNIPPET_CHARS - 1] + "…"
    return f"`{text}`"


_FIRST = ("Role", "Action (kind llm)", "Action (kind exec)", "Action (kind ask)", "Action (kind reply)",
          "Output node")


def _order(item: tuple[str, str]) -> tuple[int, str]:
    title = item[0]
    return (_FIRST.index(title), "") if title in _FIRST else (len(_FIRST), title.lower())


def _union_section(node: dict[str, Any], defs: dict[str, Any]) -> str:
    kinds = [defs[b["$ref"].rsplit("/", 1)[1]].get("title", "") for b in node.get("oneOf", [])]
    lines = [f"## {node.get('title', 'Action')}", "", _escape(node.get("description", "")), "",
             "Its `kind` picks one of: " + ", ".join(kinds) + ". A key of another kind is an error (SOP110)."]
    kind = node.get("properties", {}).get("kind", {})
    for value, text in zip(kind.get("enum", []), kind.get("enumDescriptions", []), strict=True):
        lines.append(f"- `{value}`: {_escape(text)}")
    return "\n".join(lines)


def _section(node: dict[str, Any], defs: dict[str, Any], level: int, examples: dict[str, str]) -> str:
    lines = [f"{'#' * level} {node.get('title', '')}", "", _escape(node.get("description", ""))]
    for branch in node.get("oneOf", []):
        if "required" in branch:
            lines.append(f"- {branch.get('title', '')}: {_escape(branch.get('description', ''))}")
    properties = node.get("properties", {})
    if properties:
        required = set(node.get("required", []))
        lines += ["", "| key | value | meaning | example (from a shipped file) |", "|---|---|---|---|"]
        for key, prop in properties.items():
            shown = f"`{key}`" + (" (required)" if key in required else "")
            lines.append(f"| {shown} | {_cell(_value(prop, defs))} | {_cell(_meaning(prop, defs))} | "
                         f"{_cell(examples.get(key, ''))} |")
    return "\n".join(lines)


def _meaning(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    text = prop.get("description") or _target(prop, defs).get("description", "")
    texts = prop.get("enumDescriptions", [])
    values = [v for v in prop.get("enum", []) if v is not None] if texts else []
    choices = [f"`{v}`: {t}" for v, t in zip(values, texts, strict=True)]
    return " ".join([text, *choices])


def _target(prop: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = prop.get("$ref", "")
    return defs.get(ref.rsplit("/", 1)[1], {}) if ref else {}


def _value(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    """What the key holds, in words: its type or model, its choices, default and range."""
    parts = [_kind(prop, defs)]
    if "default" in prop and prop["default"] not in ("", [], {}):
        parts.append(f"default `{_show(prop['default'])}`")
    bounds = [f"{word} {prop[key]}" for key, word in (("minimum", ">="), ("exclusiveMinimum", ">"),
                                                      ("maximum", "<="), ("minItems", "items >="))
              if key in prop]
    return "; ".join(parts + bounds)


def _kind(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in prop:
        return _target(prop, defs).get("title", "")
    if "const" in prop:
        return f"`{prop['const']}`"
    if "enum" in prop:
        return " | ".join(f"`{_show(v)}`" for v in prop["enum"] if v is not None)
    for union in ("anyOf", "oneOf"):
        if union in prop:
            return prop.get("title") or " or ".join(b.get("title") or _kind(b, defs) for b in prop[union])
    kind = prop.get("type", "any")
    kinds = [k for k in (kind if isinstance(kind, list) else [kind]) if k != "null"]
    if kinds == ["array"]:
        return f"list of {_kind(prop.get('items', {}), defs)}"
    if kinds == ["object"] and isinstance(prop.get("additionalProperties"), dict):
        return f"map of {_kind(prop['additionalProperties'], defs)}"
    return " or ".join(kinds) or "any"


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _cell(text: str) -> str:
    return _escape(text).replace("\n", " ")


GLANCE_BEGIN = "<!-- keys at a glance: generated by python -m engine.load.schema_gen -->"
GLANCE_END = "<!-- end of the generated keys -->"


def with_glance(page: str, document: dict[str, Any]) -> str:
    """The page (docs/writing.md) with its "keys at a glance" table (between the markers) made
    from the schema."""
    start, end = page.index(GLANCE_BEGIN) + len(GLANCE_BEGIN), page.index(GLANCE_END)
    return page[:start] + "\n" + glance_table(document) + page[end:]


def glance_table(document: dict[str, Any]) -> str:
    """One row per place (file, role, output node, the keys of every action, each kind's own)."""
    defs = document["$defs"]
    union = document["properties"]["actions"]["additionalProperties"]
    kinds = [defs[b["$ref"].rsplit("/", 1)[1]] for b in union["oneOf"]]
    shared = set.intersection(*(set(k["properties"]) for k in kinds)) - {"kind"}
    rows = [("file", document, set()), ("role", defs["RoleSpec"], set()), ("output node", defs["OutputNode"], set()),
            ("action (every kind)", kinds[0], set(kinds[0]["properties"]) - shared)]
    rows += [(f"`kind: {k['properties']['kind']['const']}`" + (" (the default)" if "default" in k["properties"]["kind"]
                                                              else ""), k, shared | {"kind"}) for k in kinds]
    lines = ["| where | keys |", "|---|---|"]
    for where, node, left_out in rows:
        keys = [_glance_key(key, prop, defs, node) for key, prop in node["properties"].items() if key not in left_out]
        lines.append(f"| {where} | {', '.join(keys) or '(only the keys of every kind)'} |")
    return "\n".join(lines) + "\n"


_OWN_ROWS = ("RoleSpec", "OutputNode")
"""Models with a row of their own: not repeated inside another row."""


def _glance_key(key: str, prop: dict[str, Any], defs: dict[str, Any], node: dict[str, Any]) -> str:
    """`key`, with its choices (`a` \\| `b`) or its own keys (`x`, `y`) in brackets."""
    own = [defs[name] for name in _OWN_ROWS]
    inner = _glance_inner(prop, {k: v for k, v in defs.items() if v is not node and not any(v is o for o in own)})
    return f"`{key}`" + (f" ({inner})" if inner else "")


def _glance_inner(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    if "enum" in prop and "const" not in prop:
        return " \\| ".join(f"`{v}`" for v in prop["enum"] if v is not None)
    for union in ("anyOf", "oneOf"):
        if union in prop:
            titles = [b["title"] for b in prop[union] if b.get("title")]
            return " \\| ".join(titles)   # untitled branches (a bool or a template) say nothing here
    target = prop.get("items") if prop.get("type") == "array" else prop.get("additionalProperties", prop)
    model = _target(target, defs) if isinstance(target, dict) else {}
    return ", ".join(f"`{k}`" for k in model.get("properties", {}))
