"""The keys a place in an SOP file may have, and what each means: read from the JSON Schema
generated from the models (engine/load/spec.py), so an editor offers exactly what
`validate` accepts, with the models' own descriptions.

An action's keys depend on its `kind` (a union of one model per kind): the branch is the
one its `kind` names (`llm` when it names none), as the checker picks it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.load.schema import DISCRIMINATOR, schema
from engine.lsp.cursor import ITEM

__all__ = ["KindOf", "enum_values", "node_at", "properties"]


KindOf = Callable[[tuple[str, ...]], "str | None"]
"""The `kind` written at a path (an action's), or None."""


def _resolve(node: Any) -> dict[str, Any]:
    """A node with its `#/$defs/X` reference followed (the schema's own definitions only)."""
    while isinstance(node, dict) and str(node.get("$ref", "")).startswith("#/$defs/"):
        target = schema()["$defs"][node["$ref"].rsplit("/", 1)[1]]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node if isinstance(node, dict) else {}


def _branches(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [_resolve(b) for b in node.get("oneOf", node.get("anyOf", []))]


def _by_kind(node: dict[str, Any], kind: str | None) -> dict[str, Any] | None:
    """The branch of an action union that `kind` names (None: the one `kind` defaults to)."""
    for branch in _branches(node):
        own = branch.get("properties", {}).get(DISCRIMINATOR, {})
        if "const" not in own:
            return None
        if own["const"] == kind or (kind is None and own.get("default") == own["const"]):
            return branch
    return {}


def _choose(node: dict[str, Any], step: str | None, path: tuple[str, ...], kind_of: KindOf) -> dict[str, Any]:
    """The branch of a union that a step (a key, an item, or None: the mapping itself) enters."""
    if not _branches(node):
        return node
    picked = _by_kind(node, kind_of(path))
    if picked is not None:
        return picked or node
    for branch in _branches(node):
        if step == ITEM and "items" in branch:
            return branch
        if step != ITEM and (step in branch.get("properties", {}) or step is None and "properties" in branch):
            return branch
    for branch in _branches(node):
        if step != ITEM and isinstance(branch.get("additionalProperties"), dict):
            return branch
    return node


def node_at(path: tuple[str, ...], kind_of: KindOf) -> dict[str, Any] | None:
    """The schema node of the value at `path` (keys and `ITEM` steps from the top), or None."""
    node = _resolve(schema())
    for depth, step in enumerate(path):
        if step not in node.get("properties", {}):   # a union's own keys (an action's `kind`) come first
            node = _choose(node, step, path[:depth], kind_of)
        if step == ITEM:
            following = node.get("items")
        else:
            following = node.get("properties", {}).get(step)
            if following is None and isinstance(node.get("additionalProperties"), dict):
                following = node["additionalProperties"]
        if following is None:
            return None
        node = _resolve(following)
    return node


def properties(path: tuple[str, ...], kind_of: KindOf) -> dict[str, dict[str, Any]]:
    """The keys the mapping at `path` may have, each with its schema node."""
    node = node_at(path, kind_of)
    if node is None:
        return {}
    branch = _choose(node, None, path, kind_of)
    shared = {k: _resolve(v) for k, v in node.get("properties", {}).items()}
    return {**shared, **{k: _resolve(v) for k, v in branch.get("properties", {}).items()}}


def enum_values(node: dict[str, Any]) -> list[tuple[str, str]]:
    """(value, what it means) of a node's allowed constants (enums, consts, booleans), and
    its examples (an output node's `type`: `str`, `list[str]`...)."""
    found: list[tuple[str, str]] = []
    for option in [node, *_branches(node)]:
        texts = option.get("enumDescriptions", [])
        for i, value in enumerate(option.get("enum", [])):
            found.append((str(value), texts[i] if i < len(texts) else ""))
        if "const" in option:
            found.append((str(option["const"]), option.get("description", "")))
        if option.get("type") == "boolean":
            found += [("true", ""), ("false", "")]
        found += [(value, "an example") for value in option.get("examples", []) if isinstance(value, str)]
    return list(dict.fromkeys(found))
