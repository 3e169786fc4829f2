"""Where the cursor is in an SOP file's text, even while the file does not parse.

An editor asks for completions in a half-typed file (`watch: [Wri`), which no YAML parser
accepts. So the place is read from the text itself, by indentation, the way a person
reads block YAML: the keys above the cursor with less indentation are its path, a `- `
is a list item, `key: |` opens a block scalar, and an unclosed `[` or `{` on the line is a
flow collection. The result names the path from the top (`actions`, `WritePRD`, `output`),
whether a key or a value is being typed, the partial word, and the keys beside it.

Columns here are Python string indices; the server converts the client's UTF-16 columns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["ITEM", "Place", "from_client", "place_at", "template_before", "to_client", "use_encoding", "word_at"]


ITEM = "-"
"""A path step into a list item (`artifacts`, `-`, `path`)."""


_KEY = re.compile(r"""^(?P<key>"[^"]*"|'[^']*'|[^\s'"\[\]{}#,:][^#:]*?)\s*:(?:\s|$)""")
_BLOCK = re.compile(r":\s+[|>][-+0-9]*\s*(?:#.*)?$")
_WORD = re.compile(r"[A-Za-z0-9_.<>$-]*$")


@dataclass(frozen=True)
class Place:
    """The cursor's place in the file's structure."""

    path: tuple[str, ...]
    """Keys from the top to the mapping the cursor is in (`ITEM` steps into list items)."""
    key: str | None = None
    """When a value is typed: the key it belongs to (a list item's: the list's key)."""
    word: str = ""
    """The partial word before the cursor."""
    siblings: dict[str, str] = field(default_factory=dict)
    """The keys of the mapping the cursor is in, with their values as written (one line)."""
    in_list: bool = False
    """The value is an item of a list (`- X` or `[A, X`)."""
    in_block: bool = False
    """The cursor is inside a block scalar (`prompt: |`)."""

    @property
    def in_key(self) -> bool:
        return self.key is None


@dataclass(frozen=True)
class _Line:
    content: int     # column where the line's content starts, after any `- ` markers
    dash: int        # column of its innermost `- ` marker, or -1
    text: str

    @property
    def key(self) -> str | None:
        match = _KEY.match(self.text[self.content:])
        return _unquote(match.group("key")) if match else None

    @property
    def value(self) -> str:
        match = _KEY.match(self.text[self.content:])
        rest = self.text[self.content + match.end():] if match else ""
        return rest.split(" #")[0].strip()


def _line(text: str) -> _Line | None:
    """A line's structure; None for a blank or comment-only line."""
    stripped = text.lstrip(" ")
    if not stripped or stripped.startswith("#"):
        return None
    col, dash = len(text) - len(stripped), -1
    while text.startswith("- ", col) or text[col:] == "-":
        dash = col
        col += 1
        while col < len(text) and text[col] == " ":
            col += 1
    return _Line(content=col, dash=dash, text=text)


def _unquote(key: str) -> str:
    return key[1:-1] if len(key) >= 2 and key[0] == key[-1] and key[0] in "'\"" else key


def word_at(text: str, col: int) -> tuple[int, int]:
    """The (start, end) columns of the identifier-like word around `col` on a line."""
    start = col
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] in "_-.<>"):
        start -= 1
    end = col
    while end < len(text) and (text[end].isalnum() or text[end] in "_-<>"):
        end += 1
    return start, end


def place_at(lines: list[str], line: int, col: int) -> Place:
    """The place of the cursor at (line, col), both 0-based."""
    current = lines[line] if line < len(lines) else ""
    prefix = current[:col]
    parsed = _line(prefix) if prefix.strip() else None
    word = _WORD.search(prefix)
    partial = word.group() if word else ""
    ancestors, in_block = _ancestors(lines, line, parsed.content if parsed else col,
                                     parsed is not None and parsed.dash >= 0)
    if in_block:
        return Place(path=tuple(ancestors[:-1]), key=ancestors[-1] if ancestors else None, word=partial,
                     in_block=True)
    if parsed is None:
        limit = col if not current.strip() else len(current) - len(current.lstrip(" "))
        return Place(path=tuple(ancestors), word=partial, siblings=_siblings(lines, line, limit))
    return _on_line(lines, line, parsed, ancestors, partial)


def _on_line(lines: list[str], line: int, parsed: _Line, ancestors: list[str], partial: str) -> Place:
    """A place on a line with content before the cursor: a key, a value, a flow collection."""
    key = parsed.key
    path = [*ancestors, *([ITEM] if parsed.dash >= 0 else [])]
    siblings = _siblings(lines, line, parsed.content)
    if key is None:
        if parsed.dash >= 0 and ancestors:     # `- Wri`: an item of the list whose key is above
            return Place(path=tuple(ancestors[:-1]), key=ancestors[-1], word=partial, in_list=True)
        return Place(path=tuple(path), word=partial, siblings=siblings)
    rest = parsed.text[parsed.content:]
    value_at = _KEY.match(rest)
    after = rest[value_at.end():] if value_at else ""
    flow = _flow(after)
    if not flow:
        return Place(path=tuple(path), key=key, word=partial, siblings=siblings)
    return _in_flow(path, key, flow, partial)


_FLOW_KEY = re.compile(r"""(?:^|[{,])\s*("[^"]*"|'[^']*'|[^\s'"\[\]{},:#][^\[\]{},:#]*?)\s*:\s*$""")


def _flow(text: str) -> list[tuple[str, str]]:
    """The unclosed `[` and `{` of a value, outermost first, each with its own text (up to
    the next unclosed one, or to the cursor); nothing when none is open."""
    stack: list[tuple[str, int]] = []
    quote = ""
    for index, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            stack.append((char, index))
        elif char in "]}" and stack:
            stack.pop()
    if not stack:
        return []
    ends = [index for _, index in stack[1:]] + [len(text)]
    return [(bracket, text[index + 1:end]) for (bracket, index), end in zip(stack, ends, strict=True)]


def _in_flow(path: list[str], key: str, flow: list[tuple[str, str]], partial: str) -> Place:
    """The place inside nested flow collections: `{actions: [A], watch: [Us` is in `watch`."""
    steps = [*path, key]
    for bracket, inside in flow[:-1]:     # each open collection holds the next one
        if bracket == "[":
            steps.append(ITEM)
        else:
            found = _FLOW_KEY.search(_closed(inside))
            steps.append(_unquote(found.group(1)) if found else "")
    bracket, inside = flow[-1]
    if bracket == "[":
        return Place(path=tuple(steps[:-1]), key=steps[-1], word=partial, in_list=True)
    segment = re.split(r"[,{\[]", inside)[-1]
    inner = _KEY.match(segment.strip() + " ")
    present = {m.group(1): "" for m in re.finditer(r"([\w$-]+)\s*:", _closed(inside))}
    if inner is None:
        return Place(path=tuple(steps), word=partial, siblings=present)
    return Place(path=tuple(steps), key=_unquote(inner.group("key")), word=partial, siblings=present)


def _closed(text: str) -> str:
    """`text` without the flow collections it opens and closes (`actions: [A, B], watch:` ->
    `actions: , watch:`), so that only its own keys are read."""
    previous = None
    while previous != text:
        previous, text = text, re.sub(r"\[[^\[\]{}]*\]|\{[^\[\]{}]*\}", "", text)
    return text


def _ancestors(lines: list[str], line: int, limit: int, on_dash: bool) -> tuple[list[str], bool]:
    """The keys above `line` that hold a node at column `limit`, from the top; and whether
    the node is inside a block scalar (then the last key is the scalar's)."""
    found: list[str] = []
    in_block = False
    dash_limit = on_dash
    for index in range(line - 1, -1, -1):
        parsed = _line(lines[index])
        if parsed is None:
            continue
        if parsed.content < limit or (dash_limit and parsed.content == limit and parsed.key
                                       and not parsed.value):
            key = parsed.key
            if key is None:
                continue
            if not found and not dash_limit and _BLOCK.search(parsed.text):
                in_block = True
            found.append(key)
            limit, dash_limit = (parsed.dash, True) if parsed.dash >= 0 else (parsed.content, False)
            if parsed.dash >= 0:
                found.append(ITEM)
        elif parsed.dash >= 0 and parsed.content == limit and parsed.dash < limit:
            found.append(ITEM)
            limit, dash_limit = parsed.dash, True
        if limit == 0 and not dash_limit:
            break
    found.reverse()
    return _fix_items(found), in_block


def _fix_items(found: list[str]) -> list[str]:
    """`ITEM` comes after the key of the list it steps into (found upside down, it came before)."""
    out: list[str] = []
    for step in found:
        if step == ITEM and out and out[-1] == ITEM:
            continue
        out.append(step)
    return out


def _siblings(lines: list[str], line: int, col: int) -> dict[str, str]:
    """The keys (and one-line values) of the mapping whose keys start at column `col`."""
    found: dict[str, str] = {}
    for step in (-1, 1):
        index = line + step if step == 1 else line
        while 0 <= index < len(lines):
            parsed = _line(lines[index])
            index += step
            if parsed is None or parsed.content > col:
                continue
            if parsed.content < col or (parsed.dash >= 0 and step == 1 and index - 1 != line):
                break
            if parsed.key is not None:
                found.setdefault(parsed.key, parsed.value)
            if parsed.dash >= 0 and step == -1:
                break
    return found


def template_before(text: str, offset: int) -> str | None:
    """The expression typed so far when `offset` is inside `{{ ... }}` or `{% ... %}`, else None."""
    head = text[:offset]
    opened = max(head.rfind("{{"), head.rfind("{%"))
    if opened < 0:
        return None
    closed = max(head.rfind("}}"), head.rfind("%}"))
    if closed > opened:
        return None
    return head[opened + 2:]


_UNIT_BYTES = {"utf-8": 1, "utf-16": 2, "utf-32": 4}


_encoding = ["utf-16"]
"""How the client counts columns, as the session agreed at `initialize` (UTF-16 unless the
client offered another that pygls took). One client per server process (stdio), so it is
set once for the process."""


def use_encoding(kind: str) -> None:
    """Count client columns in `kind` (`utf-8`, `utf-16` or `utf-32`) from now on."""
    _encoding[0] = kind if kind in _UNIT_BYTES else "utf-16"


def _units(char: str) -> int:
    kind = _encoding[0]
    if kind == "utf-32":
        return 1
    if kind == "utf-8":
        return len(char.encode("utf-8", "surrogatepass"))
    return 2 if ord(char) > 0xFFFF else 1


def to_client(text: str, col: int) -> int:
    """A Python column of a line as the client counts it (UTF-16 code units by default)."""
    return sum(_units(char) for char in text[:col]) + max(col - len(text), 0)


def from_client(text: str, col: int) -> int:
    """A client's column of a line as a Python column."""
    units = 0
    for index, char in enumerate(text):
        if units >= col:
            return index
        units += _units(char)
    return len(text)
