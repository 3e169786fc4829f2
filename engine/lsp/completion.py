"""Completion: keys, names and template variables, each from the definition `validate` uses.

- a key: the keys the schema allows there (an action's for its `kind`), less those written;
- a value: action ids in `watch`, `actions`, `context` and planners; role ids and names and
  the special addresses in `send_to`; toolsets, their commands and `mcp.<server>` in
  `tools`; `.sop.yaml` files in `include`; the allowed values of an enum (`react_mode`...);
- inside `{{ }}` or `{% %}`: the variables the place has (`inputs`, `msgs`, `role`, ...;
  `out` in artifacts, the `as` name under for_each, `outs` in join), `inputs.X`, `msgs.X`,
  `out['Key']` and `msgs.X[-1].out['Key']` from the action's output tree, `role.vars.X` of
  the roles running the action, the fields of `role`, `run`, `plan` and of a message, and
  the sandbox's filters after `|`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lsprotocol import types

from engine.check.template_rules import BASE_VARIABLES, JOIN_VARIABLES, MESSAGE_FIELDS, VARIABLE_FIELDS
from engine.load.catalog import BUILTIN, MCP_PREFIX
from engine.load.spec import SPECIAL_ADDRESSES, USER_REQUIREMENT
from engine.lsp.cursor import ITEM, Place, place_at, template_before, to_client
from engine.lsp.index import Index
from engine.lsp.keys import KindOf, enum_values, node_at, properties

__all__ = ["TRIGGERS", "complete", "kind_reader"]


TRIGGERS = [".", "[", "'", '"', "|", " ", "-", "{"]


Item = tuple[str, types.CompletionItemKind, str]
"""(label, kind, documentation)."""


def complete(text: str, line: int, col: int, index: Index | None, file: str) -> list[types.CompletionItem]:
    """The completions at (line, col) (0-based, Python columns) of a document."""
    lines = text.split("\n")
    if line >= len(lines):
        return []
    offset = sum(len(ln) + 1 for ln in lines[:line]) + col
    expression = template_before(text, offset)
    place = place_at(lines, line, col)
    data = index.data if index is not None else {}
    if expression is not None:
        word = re.search(r"\w*$", expression)
        found = list(_template(expression, (*place.path, place.key or ""), data))
        return _items(found, lines[line], line, col, len(word.group()) if word else 0)
    if place.in_block:
        return []
    place = _into_item(place, data)
    found = list(_keys(place, data) if place.in_key else _values(place, data, file))
    return _items(found, lines[line], line, col, len(place.word), as_key=place.in_key)


def _into_item(place: Place, data: dict[str, Any]) -> Place:
    """`- pa` in a list of mappings (`artifacts`) starts a key of the item, not a value."""
    if place.in_key or not place.in_list or place.key is None:
        return place
    item = (*place.path, place.key, ITEM)
    if not properties(item, kind_reader(data)):
        return place
    return Place(path=item, word=place.word)


def _items(found: list[Item], text: str, line: int, col: int, typed: int,
           as_key: bool = False) -> list[types.CompletionItem]:
    edit_range = types.Range(start=types.Position(line=line, character=to_client(text, col - typed)),
                             end=types.Position(line=line, character=to_client(text, col)))
    items: list[types.CompletionItem] = []
    seen: set[str] = set()
    for label, kind, doc in found:
        if label in seen:      # the first (the most specific) of a label's offers
            continue
        seen.add(label)
        order = len(items)
        insert = f"{label}: " if as_key else label
        items.append(types.CompletionItem(
            label=label, kind=kind, sort_text=f"{order:04d}", filter_text=label,
            documentation=types.MarkupContent(kind=types.MarkupKind.Markdown, value=doc) if doc else None,
            text_edit=types.TextEdit(range=edit_range, new_text=insert)))
    return items


def kind_reader(data: dict[str, Any], place: Place | None = None) -> KindOf:
    """The `kind` of the action a path is in: written beside the cursor, or in the parsed data."""
    def kind_of(path: tuple[str, ...]) -> str | None:
        if len(path) != 2 or path[0] != "actions":
            return None
        if place is not None and place.path == path and "kind" in place.siblings:
            return place.siblings["kind"] or None
        action = (data.get("actions") or {}).get(path[1])
        kind = action.get("kind") if isinstance(action, dict) else None
        return kind if isinstance(kind, str) else None
    return kind_of


def _keys(place: Place, data: dict[str, Any]) -> Iterator[Item]:
    for key, node in properties(place.path, kind_reader(data, place)).items():
        if key not in place.siblings:
            yield key, types.CompletionItemKind.Property, node.get("description", "")


def _section(data: dict[str, Any], name: str) -> dict[str, Any]:
    value = data.get(name)
    return value if isinstance(value, dict) else {}


def _describe_action(action: Any) -> str:
    if not isinstance(action, dict):
        return ""
    first = str(action.get("description") or action.get("prompt") or "").strip().split("\n")[0]
    return f"action (kind {action.get('kind', 'llm')}): {first}"


def _actions(data: dict[str, Any], idea: bool) -> Iterator[Item]:
    for aid, action in _section(data, "actions").items():
        yield aid, types.CompletionItemKind.Function, _describe_action(action)
    if idea:
        yield USER_REQUIREMENT, types.CompletionItemKind.Event, "the idea: the run's first message"


def _addresses(data: dict[str, Any], specials: tuple[str, ...]) -> Iterator[Item]:
    for rid, role in _section(data, "roles").items():
        profile = role.get("profile", "") if isinstance(role, dict) else ""
        yield rid, types.CompletionItemKind.Class, f"role {rid}" + (f": {profile}" if profile else "")
        name = role.get("name") if isinstance(role, dict) else None
        if isinstance(name, str) and name != rid:
            yield name, types.CompletionItemKind.Class, f"the name of role {rid}"
    for special in specials:
        yield special, types.CompletionItemKind.Constant, "a special address"


def _tools(data: dict[str, Any]) -> Iterator[Item]:
    for toolset, commands in BUILTIN.items():
        yield toolset, types.CompletionItemKind.Module, f"the `{toolset}` toolset: " + ", ".join(
            c.name for c in commands)
        for command in commands:
            yield command.name, types.CompletionItemKind.Method, command.description
    for server, spec in _section(data, "mcp").items():
        yield MCP_PREFIX + server, types.CompletionItemKind.Module, f"the MCP server `{server}`"
        declared = spec.get("tools") if isinstance(spec, dict) else None
        for tool in declared if isinstance(declared, list) else []:
            yield f"{MCP_PREFIX}{server}.{tool}", types.CompletionItemKind.Method, f"a tool of `{server}`"


_MAX_INCLUDE_CHOICES = 200


def _includes(file: str) -> Iterator[Item]:
    """SOP files under the file's folder (the first few found: a home folder is no project)."""
    folder = Path(file).parent
    for path in sorted(itertools.islice(folder.rglob("*.sop.yaml"), _MAX_INCLUDE_CHOICES)):
        if path != Path(file):
            yield path.relative_to(folder).as_posix(), types.CompletionItemKind.File, ""


def _values(place: Place, data: dict[str, Any], file: str) -> Iterator[Item]:
    key, path = place.key or "", place.path
    top = path[0] if path else ""
    if top == "roles" and len(path) == 2 and key in ("watch", "actions"):
        yield from _actions(data, idea=key == "watch")
    elif top == "roles" and "planner" in path and (key in ("action", "task_action") or "task_actions" in path):
        yield from _actions(data, idea=False)
    elif top == "actions" and len(path) == 2 and key == "context":
        yield from _actions(data, idea=True)
    elif (top == "actions" and len(path) == 2 or path == ("team",)) and key == "send_to":
        yield from _addresses(data, SPECIAL_ADDRESSES if top == "actions" else ("<all>",))
    elif top == "actions" and len(path) == 2 and key == "tools":
        yield from _tools(data)
    elif not path and key == "include":
        yield from _includes(file)
    if not place.in_list or key == "context":
        node = node_at((*path, key), kind_reader(data, place))
        for value, doc in enum_values(node or {}):
            yield value, types.CompletionItemKind.EnumMember, doc


# --------------------------------------------------------------------- templates

_KEY_PATH = r"""((?:\s*\[\s*['"][^'"]+['"]\s*\])*)\s*\[\s*['"]([^'"]*)$"""
_MSG_OUT = re.compile(r"""msgs\s*\.\s*(\w+)\s*\[[^\]]*\]\s*\.\s*out""" + _KEY_PATH)
_OWN_OUT = re.compile(r"""(?<![\w.\]])out""" + _KEY_PATH)
_SUBSCRIPT = re.compile(r"""\[\s*['"]([^'"]+)['"]\s*\]""")
_MESSAGE = re.compile(r"""(?:news\s*\[[^\]]*\]|msgs\s*\.\s*\w+\s*\[[^\]]*\])\s*\.\s*(\w*)$""")


def _template(expression: str, where: tuple[str, ...], data: dict[str, Any]) -> Iterator[Item]:
    """What may follow `expression`, the text of a `{{ }}` typed so far, at the place `where`."""
    aid = where[1] if len(where) > 1 and where[0] == "actions" else ""
    if (match := _MSG_OUT.search(expression)) is not None:
        yield from _output_keys(data, match.group(1), _SUBSCRIPT.findall(match.group(2)))
    elif (match := _OWN_OUT.search(expression)) is not None:
        yield from _output_keys(data, aid, _SUBSCRIPT.findall(match.group(1)))
    elif re.search(r"(?<![\w.])msgs\s*\.\s*\w*$", expression):
        yield from _actions(data, idea=True)
    elif (match := re.search(r"(?<![\w.])(inputs|state)\s*\.\s*\w*$", expression)) is not None:
        for name, spec in _section(data, match.group(1)).items():   # declared inputs, state variables
            doc = spec.get("description", "") if isinstance(spec, dict) else ""
            yield name, types.CompletionItemKind.Variable, doc
    elif re.search(r"(?<![\w.])role\s*\.\s*vars\s*\.\s*\w*$", expression):
        yield from _role_vars(data, aid)
    elif (match := re.search(r"(?<![\w.])(role|run|plan)\s*\.\s*\w*$", expression)) is not None:
        for name in sorted(VARIABLE_FIELDS[match.group(1)]):
            yield name, types.CompletionItemKind.Field, f"`{match.group(1)}.{name}`"
    elif _MESSAGE.search(expression):
        for name in sorted(MESSAGE_FIELDS):
            yield name, types.CompletionItemKind.Field, "a message's field"
    elif re.search(r"\|\s*\w*$", expression):
        yield from _filters()
    elif re.search(r"""(?<![\w.\]'"])\w*$""", expression):
        for name in _variables(where, data):
            yield name, types.CompletionItemKind.Variable, _VARIABLE_DOCS.get(name, "")


_VARIABLE_DOCS = {
    "inputs": "the declared inputs by name", "role": "the acting role: id, name, profile, vars",
    "msgs": "every message the role remembers, by action", "news": "the messages that woke the role",
    "run": "id, round", "plan": "the role's plan: status, tasks, current", "out": "the action's parsed output",
    "outs": "the items' outputs", "contents": "the items' texts", "task": "the task of a plan",
    "index": "the item's position under for_each",
    "state": "the file's shared state, by variable (`state:`)",
}


def _variables(where: tuple[str, ...], data: dict[str, Any]) -> list[str]:
    """The variables a template at `where` (`actions`, id, field, ...) may read."""
    if len(where) < 3 or where[0] != "actions":
        return sorted(BASE_VARIABLES)
    action = _section(data, "actions").get(where[1])
    action = action if isinstance(action, dict) else {}
    field = where[2]
    if field == "send_to":
        return ["role"]
    found = set(BASE_VARIABLES)
    if action.get("for_each") and field not in ("for_each", "when", "join"):
        found |= {str(action.get("as", "item")), "index"}
    if field in ("artifacts", "set") or (field == "content" and action.get("kind") != "compute"):
        found.add("out")   # a compute action's content makes its output
    if field == "join":
        found |= JOIN_VARIABLES
    if where[1] in _task_actions(data):
        found.add("task")
    return sorted(found)


def _task_actions(data: dict[str, Any]) -> set[str]:
    found: set[str] = set()
    for role in _section(data, "roles").values():
        planner = role.get("planner") if isinstance(role, dict) else None
        if not isinstance(planner, dict):
            continue
        found |= {planner["task_action"]} if isinstance(planner.get("task_action"), str) else set()
        for steps in (planner.get("task_actions") or {}).values():
            found |= {steps} if isinstance(steps, str) else {s for s in steps if isinstance(s, str)}
    return found


def _output_keys(data: dict[str, Any], aid: str, above: list[str]) -> Iterator[Item]:
    action = _section(data, "actions").get(aid)
    tree = action.get("output") if isinstance(action, dict) else None
    for step in above:
        node = tree.get(step) if isinstance(tree, dict) else None
        tree = node.get("children") if isinstance(node, dict) else None
    if not isinstance(tree, dict) or "code" in tree and not isinstance(tree["code"], dict):
        return
    for key, node in tree.items():
        kind = node.get("type", "object" if node.get("children") else "str") if isinstance(node, dict) else ""
        instruction = node.get("instruction", "") if isinstance(node, dict) else ""
        yield key, types.CompletionItemKind.Field, f"`{kind}`: {instruction}".rstrip(": ")


def _role_vars(data: dict[str, Any], aid: str) -> Iterator[Item]:
    for rid, role in _section(data, "roles").items():
        if not isinstance(role, dict):
            continue
        runs = aid in (role.get("actions") or []) or not aid
        for name, value in (role.get("vars") or {}).items() if runs else ():
            yield name, types.CompletionItemKind.Variable, f"{rid}: {value!r}"


def _filters() -> Iterator[Item]:
    from engine.templates.sandbox import environment   # jinja's environment: only when asked

    for name in sorted(environment().filters):
        yield name, types.CompletionItemKind.Function, "a filter"
