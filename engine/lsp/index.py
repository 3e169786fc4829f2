"""The names of an SOP and where each is defined and used, across the file and its libraries.

Built from the loaded `Source` (the include-merged one when its libraries load), so every
place is located by the file's own source map: an action a library defines is found in
the library. A *symbol* is `(kind, name)`: `("action", "WritePRD")`, `("role", "Architect")`,
`("input", "idea")`, `("output", "WritePRD/Title")` and `("include", PATH)`. References
inside templates (`msgs.X`, `inputs.X`, `out['Key']`, `msgs.X[-1].out['Key']`) are found in
the template's own text, so a reference lands on the name itself.
"""

from __future__ import annotations

import bisect
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.load.source import Source, join_pointer
from engine.load.spec import USER_REQUIREMENT

__all__ = ["Index", "Span", "Symbol", "build_index"]


Symbol = tuple[str, str]


@dataclass(frozen=True)
class Span:
    """A place in one file (its absolute path): 0-based line, start and end columns (Python
    string indices)."""

    file: str
    line: int
    start: int
    end: int

    def holds(self, file: str, line: int, col: int) -> bool:
        return self.file == file and self.line == line and self.start <= col <= self.end


@dataclass
class Index:
    """Every symbol's definition and references, and the data they were read from."""

    file: str
    data: dict[str, Any]
    definitions: dict[Symbol, Span] = field(default_factory=dict)
    references: dict[Symbol, list[Span]] = field(default_factory=dict)
    files: dict[str, Source] = field(default_factory=dict)
    """Every loaded file by name: the main file and its libraries."""

    def symbol_at(self, file: str, line: int, col: int) -> Symbol | None:
        """The symbol whose definition or a reference is under (line, col) of `file`."""
        for symbol, span in self.definitions.items():
            if span.holds(file, line, col):
                return symbol
        for symbol, spans in self.references.items():
            if any(s.holds(file, line, col) for s in spans):
                return symbol
        return None


def build_index(source: Source, include_dirs: tuple[str, ...] = ()) -> Index:
    """The index of a loaded (ideally include-merged) file; `include_dirs` are the folders
    besides each file's own that its includes may name (--include-path)."""
    index = Index(file=os.path.abspath(source.file), data=source.data,
                  files={os.path.abspath(s.file): s for s in (source, *source.included)})
    locator = _Locator(source)
    _definitions(index, locator)
    for kind, name, pointer, written in _plain_references(source.data):
        span = locator.value(pointer, written)
        if span is not None:
            index.references.setdefault((kind, name), []).append(span)
    for pointer, text in _templates(source.data):
        for kind, name, start, length in _template_references(text, pointer):
            span = locator.inside(pointer, start, length, text)
            if span is not None:
                index.references.setdefault((kind, name), []).append(span)
    _include_entries(index, source, locator, include_dirs)
    return index


class _Locator:
    """Spans from JSON pointers, each in the file that defines the pointer."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self._starts: dict[str, list[int]] = {}
        self._positions: dict[str, list[tuple[int, int]]] = {}

    def key(self, pointer: str) -> Span | None:
        owner = self.source.owner_of(pointer)
        at = owner.map.keys.get(pointer)
        if at is None:
            return None
        name = pointer.rsplit("/", 1)[-1].replace("~1", "/").replace("~0", "~")
        return self._span(owner, at, name)

    def value(self, pointer: str, text: str) -> Span | None:
        owner = self.source.owner_of(pointer)
        at = owner.map.values.get(pointer)
        return self._span(owner, at, text) if at is not None else None

    def _span(self, owner: Source, at: tuple[int, int], name: str) -> Span:
        line, col = at[0] - 1, at[1] - 1
        lines = owner.lines
        text = lines[line] if line < len(lines) else ""
        if text[col:col + 1] in ("'", '"'):
            col += 1
        return Span(os.path.abspath(owner.file), line, col, col + len(name))

    def inside(self, pointer: str, start: int, length: int, value: str) -> Span | None:
        """The span of `value[start:start+length]` in the file's text of the scalar at `pointer`."""
        owner = self.source.owner_of(pointer)
        at = owner.map.values.get(pointer)
        if at is None:
            return None
        text = owner.text
        begin = self._offset(owner, at)
        end = self._next(owner, at)
        word = value[start:start + length]
        # the scalar as written (quotes, escapes, folding) is not the value: find the same
        # reference in the written text, the n-th of its kind as in the value
        nth = len(re.findall(re.escape(word), value[:start]))
        found = [m.start() for m in re.finditer(re.escape(word), text[begin:end])]
        if nth >= len(found):
            return None
        offset = begin + found[nth]
        line = text.count("\n", 0, offset)
        col = offset - (text.rfind("\n", 0, offset) + 1)
        return Span(os.path.abspath(owner.file), line, col, col + length)

    def _offset(self, owner: Source, at: tuple[int, int]) -> int:
        starts = self._starts.get(owner.file)
        if starts is None:
            starts = [0] + [m.end() for m in re.finditer("\n", owner.text)]
            self._starts[owner.file] = starts
        line = min(at[0] - 1, len(starts) - 1)
        return starts[line] + at[1] - 1

    def _next(self, owner: Source, at: tuple[int, int]) -> int:
        """Where the next node after `at` starts (the end of a scalar's text)."""
        positions = self._positions.get(owner.file)
        if positions is None:
            positions = sorted({*owner.map.values.values(), *owner.map.keys.values()})
            self._positions[owner.file] = positions
        after = bisect.bisect_right(positions, at)
        return self._offset(owner, positions[after]) if after < len(positions) else len(owner.text)


def _definitions(index: Index, locator: _Locator) -> None:
    data = index.data
    for section, kind in (("actions", "action"), ("roles", "role"), ("inputs", "input")):
        entries = data.get(section)
        if not isinstance(entries, dict):
            continue
        for name in entries:
            span = locator.key(join_pointer("", section, name))
            if span is not None:
                index.definitions[(kind, name)] = span
    for aid, action in _mappings(data.get("actions")):
        output = action.get("output")
        for key, pointer in _output_keys(output, join_pointer("", "actions", aid, "output")):
            span = locator.key(pointer)
            if span is not None:
                index.definitions[("output", f"{aid}/{key}")] = span


def _mappings(value: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(value, dict):
        for name, entry in value.items():
            if isinstance(entry, dict):
                yield name, entry


def _output_keys(tree: Any, pointer: str, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(`Key` or `Key/Child`, pointer) of every node of an output tree."""
    if not isinstance(tree, dict) or "code" in tree and not isinstance(tree.get("code"), dict):
        return
    for key, node in tree.items():
        here = join_pointer(pointer, key)
        yield prefix + key, here
        if isinstance(node, dict):
            yield from _output_keys(node.get("children"), here + "/children", f"{prefix}{key}/")


def _plain_references(data: dict[str, Any]) -> Iterator[tuple[str, str, str, str]]:
    """(kind, name, pointer, text written) of every name written as a plain value: watch, actions, context,
    send_to, planners, team.send_to."""
    roles = data.get("roles") if isinstance(data.get("roles"), dict) else {}
    names = {(r.get("name") if isinstance(r, dict) else None) or rid: rid for rid, r in (roles or {}).items()}
    for rid, role in _mappings(data.get("roles")):
        here = join_pointer("", "roles", rid)
        for key in ("actions", "watch"):
            yield from _listed("action", role.get(key), join_pointer(here, key))
        yield from _planner(role.get("planner"), join_pointer(here, "planner"))
    for aid, action in _mappings(data.get("actions")):
        here = join_pointer("", "actions", aid)
        if isinstance(action.get("context"), list):
            yield from _listed("action", action["context"], join_pointer(here, "context"))
        yield from _addresses(action.get("send_to"), join_pointer(here, "send_to"), names)
    team = data.get("team")
    if isinstance(team, dict):
        yield from _addresses(team.get("send_to"), "/team/send_to", names)


def _listed(kind: str, items: Any, pointer: str) -> Iterator[tuple[str, str, str, str]]:
    for i, item in enumerate(items if isinstance(items, list) else []):
        if isinstance(item, str) and item != USER_REQUIREMENT:
            yield kind, item, join_pointer(pointer, i), item


def _planner(planner: Any, pointer: str) -> Iterator[tuple[str, str, str, str]]:
    if not isinstance(planner, dict):
        return
    for key in ("action", "task_action"):
        if isinstance(planner.get(key), str):
            yield "action", planner[key], join_pointer(pointer, key), planner[key]
    for task_type, steps in (planner.get("task_actions") or {}).items():
        here = join_pointer(pointer, "task_actions", task_type)
        if isinstance(steps, str):
            yield "action", steps, here, steps
        else:
            yield from _listed("action", steps, here)


def _addresses(items: Any, pointer: str, names: dict[str, str]) -> Iterator[tuple[str, str, str, str]]:
    """A send_to item that names a role (by id or by name) refers to the role's id."""
    for i, item in enumerate(items if isinstance(items, list) else []):
        if isinstance(item, str) and item in names:
            yield "role", names[item], join_pointer(pointer, i), item


def _templates(data: Any, pointer: str = "") -> Iterator[tuple[str, str]]:
    """(pointer, text) of every string under `actions` that holds a template."""
    if not pointer:
        yield from _templates(data.get("actions"), "/actions")
        return
    if isinstance(data, str):
        if "{{" in data or "{%" in data:
            yield pointer, data
    elif isinstance(data, dict):
        for key, value in data.items():
            if key != "output":
                yield from _templates(value, join_pointer(pointer, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _templates(value, join_pointer(pointer, i))


_MSGS = re.compile(r"""(?<![\w.])msgs\s*(?:\.\s*(\w+)|\[\s*['"](\w+)['"]\s*\])""")
_MSGS_OUT = re.compile(r"""(?<![\w.])msgs\s*\.\s*(\w+)\s*\[[^\]]*\]\s*\.\s*out((?:\s*\[\s*['"][^'"]+['"]\s*\])+)""")
_OUT = re.compile(r"""(?<![\w.\]])out((?:\s*\[\s*['"][^'"]+['"]\s*\])+)""")
_INPUTS = re.compile(r"""(?<![\w.])inputs\s*(?:\.\s*(\w+)|\[\s*['"](\w+)['"]\s*\])""")
_SUBSCRIPT = re.compile(r"""\[\s*['"]([^'"]+)['"]\s*\]""")


def _template_references(text: str, pointer: str) -> Iterator[tuple[str, str, int, int]]:
    """(kind, name, start, length) of each reference in a template's text."""
    for match in _MSGS.finditer(text):
        group = 1 if match.group(1) else 2
        yield "action", match.group(group), match.start(group), len(match.group(group))
    for match in _INPUTS.finditer(text):
        group = 1 if match.group(1) else 2
        yield "input", match.group(group), match.start(group), len(match.group(group))
    for match in _MSGS_OUT.finditer(text):
        yield from _keys_of(match.group(1), match.group(2), match.start(2))
    own = pointer.split("/")[2] if pointer.count("/") >= 2 else ""
    for match in _OUT.finditer(text):
        yield from _keys_of(own, match.group(1), match.start(1))


def _keys_of(action: str, subscripts: str, offset: int) -> Iterator[tuple[str, str, int, int]]:
    """`['A']['B']` after `out`: references to output `action/A` and to its child `action/A/B`."""
    path = ""
    for match in _SUBSCRIPT.finditer(subscripts):
        path = f"{path}/{match.group(1)}" if path else match.group(1)
        yield "output", f"{action}/{path}", offset + match.start(1), len(match.group(1))


def _include_entries(index: Index, source: Source, locator: _Locator, include_dirs: tuple[str, ...]) -> None:
    """Each `include` entry of the file and of its libraries, with the file it names (found
    as the loader finds it: beside the including file, else under an include folder)."""
    for loaded in (source, *source.included):
        entries = loaded.data.get("include")
        folders = (Path(loaded.file).parent, *(Path(d) for d in include_dirs))
        for i, entry in enumerate(entries if isinstance(entries, list) else []):
            if not isinstance(entry, str):
                continue
            at = loaded.map.values.get(join_pointer("/include", i))
            if at is None:
                continue
            found = [(folder / entry).resolve() for folder in folders]
            target = next((path for path in found if path.is_file()), found[0])
            span = locator._span(loaded, at, entry)
            index.references.setdefault(("include", str(target)), []).append(span)
