"""Hover, go to definition, find references and document symbols, from the index.

A hover on a name says what it is (an action: its kind, its prompt's first line and its
output keys; a role: its watch and actions; an input: its type and description; an output
key: its type and instruction); on a key, the key's description from the schema; on a
value of an enum, what that value means.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lsprotocol import types

from engine.lsp.completion import kind_reader
from engine.lsp.cursor import ITEM, place_at, to_client, word_at
from engine.lsp.index import Index, Span, Symbol
from engine.lsp.keys import enum_values, node_at, properties
from engine.lsp.publish import span_range, uri_of

__all__ = ["definition", "hover", "references", "symbols"]


def _lines(index: Index, file: str) -> list[str]:
    source = index.files.get(file)
    return source.lines if source is not None else []


def _location(index: Index, span: Span) -> types.Location:
    return types.Location(uri=uri_of(span.file), range=span_range(span, _lines(index, span.file)))


def definition(index: Index, file: str, line: int, col: int) -> list[types.Location]:
    symbol = index.symbol_at(file, line, col)
    if symbol is None:
        return []
    if symbol[0] == "include":
        start = types.Position(line=0, character=0)
        return [types.Location(uri=uri_of(symbol[1]), range=types.Range(start=start, end=start))]
    span = index.definitions.get(symbol)
    return [_location(index, span)] if span is not None else []


def references(index: Index, file: str, line: int, col: int, declaration: bool) -> list[types.Location]:
    symbol = index.symbol_at(file, line, col)
    if symbol is None:
        return []
    spans = list(index.references.get(symbol, []))
    if declaration and symbol in index.definitions:
        spans.insert(0, index.definitions[symbol])
    return [_location(index, s) for s in spans]


# ------------------------------------------------------------------------ hover


def hover(index: Index | None, lines: list[str], file: str, line: int, col: int) -> types.Hover | None:
    symbol = index.symbol_at(file, line, col) if index is not None else None
    if symbol is not None and index is not None:
        text = _describe(index, symbol)
        return types.Hover(contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=text)) if text else None
    text = _key_doc(lines, line, col, index.data if index is not None else {})
    return types.Hover(contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=text)) if text else None


def _describe(index: Index, symbol: Symbol) -> str:
    kind, name = symbol
    sections = {"action": "actions", "role": "roles", "input": "inputs"}
    if kind in sections:
        entry = (index.data.get(sections[kind]) or {}).get(name)
        if isinstance(entry, dict):
            return {"action": _action_doc, "role": _role_doc, "input": _input_doc}[kind](name, entry, index.data)
    if kind == "output":
        return _output_doc(index.data, name)
    if kind == "include":
        return f"**include** `{name}`"
    return ""


def _first_line(text: Any) -> str:
    lines = [ln.strip() for ln in str(text or "").splitlines() if ln.strip()]
    return lines[0] if lines else ""


def _action_doc(aid: str, action: dict[str, Any], data: dict[str, Any]) -> str:
    out = [f"**action `{aid}`** (kind {action.get('kind', 'llm')})"]
    if action.get("description"):
        out.append(str(action["description"]))
    first = _first_line(action.get("prompt") or " ".join(map(str, action.get("command") or [])))
    if first:
        out.append(f"prompt: {first}" if "prompt" in action else f"command: `{first}`")
    output = action.get("output", "text")
    if isinstance(output, dict) and "code" not in output:
        out.append("output keys: " + ", ".join(f"`{k}`" for k in output))
    elif output is not None:
        out.append(f"output: `{output}`")
    runners = [rid for rid, r in (data.get("roles") or {}).items()
               if isinstance(r, dict) and aid in (r.get("actions") or [])]
    watchers = [rid for rid, r in (data.get("roles") or {}).items()
                if isinstance(r, dict) and aid in (r.get("watch") or [])]
    out.append(f"run by: {', '.join(runners) or 'no role'}; watched by: {', '.join(watchers) or 'no role'}")
    return "\n\n".join(out)


def _role_doc(rid: str, role: dict[str, Any], data: dict[str, Any]) -> str:
    head = f"**role `{rid}`**" + (f" ({role['name']})" if role.get("name") else "")
    out = [head + (f": {role['profile']}" if role.get("profile") else "")]
    if role.get("goal"):
        out.append(f"goal: {role['goal']}")
    out.append("watch: " + (", ".join(f"`{a}`" for a in role.get("watch") or []) or "nothing"))
    out.append("actions: " + ", ".join(f"`{a}`" for a in role.get("actions") or [])
               + f" ({role.get('react_mode', 'react')})")
    return "\n\n".join(out)


def _input_doc(name: str, spec: dict[str, Any], data: dict[str, Any]) -> str:
    out = [f"**input `{name}`** ({spec.get('type', 'str')}" + (", required)" if spec.get("required") else ")")]
    if spec.get("description"):
        out.append(str(spec["description"]))
    if "default" in spec:
        out.append(f"default: `{spec['default']!r}`")
    return "\n\n".join(out)


def _output_doc(data: dict[str, Any], name: str) -> str:
    aid, *keys = name.split("/")
    node: Any = {"children": ((data.get("actions") or {}).get(aid) or {}).get("output")}
    for key in keys:
        children = node.get("children") if isinstance(node, dict) else None
        node = children.get(key) if isinstance(children, dict) else None
    if not isinstance(node, dict):
        return ""
    kind = node.get("type", "object" if node.get("children") else "str")
    out = [f"**output `{'/'.join(keys)}`** of `{aid}`: `{kind}`"]
    if node.get("instruction"):
        out.append(str(node["instruction"]))
    return "\n\n".join(out)


def _key_doc(lines: list[str], line: int, col: int, data: dict[str, Any]) -> str:
    """A key's description (block or flow style, in a list item too), or what the enum
    value under the cursor means."""
    text = lines[line] if line < len(lines) else ""
    begin, end = word_at(text, col)
    word = text[begin:end].strip("'\"")
    if not word:
        return ""
    kind_of = kind_reader(data)
    place = place_at(lines, line, end)
    if text[end:].lstrip().startswith(":"):
        path = place.path if place.in_key or place.key is None else (*place.path, place.key, ITEM)
        node = properties(path, kind_of).get(word)
        return f"**{word}**: {node['description']}" if node and node.get("description") else ""
    if place.key is None:
        return ""
    for option, doc in enum_values(node_at((*place.path, place.key), kind_of) or {}):
        if option == word and doc:
            return f"**{word}**: {doc}"
    return ""


# ------------------------------------------------------------------------ symbols


_KINDS = {"action": types.SymbolKind.Function, "role": types.SymbolKind.Class, "input": types.SymbolKind.Variable}


def symbols(index: Index, file: str) -> list[types.DocumentSymbol]:
    """The file's own inputs, actions (with their output keys) and roles, in file order."""
    lines = _lines(index, file)
    found = []
    for (kind, name), span in index.definitions.items():
        if span.file != file or kind not in _KINDS:
            continue
        children = [_symbol(f"{key}", types.SymbolKind.Field, s, lines)
                    for (k, key), s in index.definitions.items()
                    if k == "output" and key.startswith(name + "/") and key.count("/") == 1 and s.file == file]
        for child in children:
            child.name = child.name.split("/", 1)[1]
        found.append(_symbol(name, _KINDS[kind], span, lines, children, detail=kind))
    return sorted(found, key=lambda s: (s.range.start.line, s.range.start.character))


def _symbol(name: str, kind: types.SymbolKind, span: Span, lines: Sequence[str],
            children: list[types.DocumentSymbol] | None = None, detail: str = "") -> types.DocumentSymbol:
    last = _entry_end(lines, span)
    end_text = lines[last] if last < len(lines) else ""
    whole = types.Range(start=types.Position(line=span.line, character=0),
                        end=types.Position(line=last, character=to_client(end_text, len(end_text))))
    return types.DocumentSymbol(name=name, kind=kind, range=whole, selection_range=span_range(span, lines),
                                children=children or None, detail=detail or None)


def _entry_end(lines: Sequence[str], span: Span) -> int:
    """The last line of the entry whose key is at `span`: before the next line indented as
    little or less (comments and blank lines between entries belong to neither)."""
    last = span.line
    for index in range(span.line + 1, len(lines)):
        text = lines[index]
        stripped = text.lstrip(" ")
        if not stripped or stripped.startswith("#"):
            continue
        if len(text) - len(stripped) <= span.start:
            break
        last = index
    return last
