"""Filters and functions for logic without a model: JSON, regular expressions, pairs, a
seeded random order, and a file beside the SOP.

A shared SOP file is untrusted, and so is the text these filters read (model answers, exec
output). So the regular expressions are RE2's (engine.load.patterns: linear time, no
backtracking, bounded memory), every input is bounded in size before any C code runs, and
`file()` reads only regular files inside the SOP's own folder, at most MAX_FILE_BYTES.

`shuffle` and `choice` are seeded by the run's id (and an optional salt): a resume and a
replay keep the run's id, so they give the order the run gave, with nothing else to journal.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from jinja2 import pass_context
from jinja2.runtime import Context

from engine.load.files import beside_refusal, read_beside
from engine.load.patterns import PatternError, compiled

__all__ = ["FILTERS", "GLOBALS", "MAX_FILTER_INPUT", "MAX_FILE_BYTES", "MAX_JSON_DEPTH", "file_problem",
           "reading_beside", "refusal"]


MAX_FILTER_INPUT = 1_000_000
"""Characters of text a regular expression or `from_json` reads (a prompt's limit)."""

MAX_FILE_BYTES = 100_000
"""The largest file `file()` reads (as experience files)."""

MAX_JSON_DEPTH = 64
"""The deepest nesting `from_json` accepts (a deeper value is refused, not parsed)."""


def _text(name: str, value: Any) -> str:
    text = value if isinstance(value, str) else str(value)
    if len(text) > MAX_FILTER_INPUT:
        raise ValueError(f"{name}: the text is longer than {MAX_FILTER_INPUT:,} characters")
    return text


def _regex(name: str, pattern: Any) -> Any:
    if not isinstance(pattern, str):
        raise ValueError(f"{name}: the pattern must be a string")
    try:
        return compiled(pattern)
    except PatternError as exc:
        raise ValueError(f"{name}: {exc} ({exc.hint})") from None


def _decode(found: Any) -> Any:
    if isinstance(found, bytes):
        return found.decode("utf-8", "replace")
    if isinstance(found, tuple):
        return [_decode(part) for part in found]
    return "" if found is None else found


def _re_search(value: Any, pattern: str, group: int = 0) -> str:
    """`{{ text | re_search('Score: (\\d+)', 1) }}`: the first match (or its group), '' when none."""
    match = _regex("re_search", pattern).search(_text("re_search", value).encode("utf-8", "surrogatepass"))
    if match is None:
        return ""
    return str(_decode(match.group(group)))


def _re_findall(value: Any, pattern: str) -> list[Any]:
    """`{{ text | re_findall('\\w+\\.py') }}`: every match, as Python's findall (a group's text,
    or a list of the groups' texts when the pattern has several)."""
    found = _regex("re_findall", pattern).findall(_text("re_findall", value).encode("utf-8", "surrogatepass"))
    return [_decode(item) for item in found]


def _re_sub(value: Any, pattern: str, replacement: str, count: int = 0) -> str:
    """`{{ text | re_sub('\\s+', ' ') }}`: every match (or the first `count`) replaced; `\\1` in
    the replacement is the first group. Its growth is bounded before it is built."""
    regex = _regex("re_sub", pattern)
    data = _text("re_sub", value).encode("utf-8", "surrogatepass")
    repl = _text("re_sub", replacement).encode("utf-8", "surrogatepass")
    if len(repl) > 1 and (len(data) + 1) * len(repl) > MAX_FILTER_INPUT:
        matches = len(regex.findall(data))
        if len(data) + (min(matches, count) if count else matches) * len(repl) > MAX_FILTER_INPUT:
            raise ValueError(f"re_sub: the result would be longer than {MAX_FILTER_INPUT:,} characters")
    return str(_decode(regex.sub(repl, data, count=count)))


def _from_json(value: Any) -> Any:
    """`{{ msgs.Run[-1].out.stdout | from_json }}`: the JSON value a text holds (a fenced
    ```json block is unwrapped first); a text that is not JSON fails the template."""
    text = _text("from_json", value).strip()
    if text.startswith("```"):
        text = text.split("\n", 1)[1] if "\n" in text else ""
        text = text.rsplit("```", 1)[0].strip()
    if text.count("[") + text.count("{") > 0 and _depth(text) > MAX_JSON_DEPTH:
        raise ValueError(f"from_json: the value nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"from_json: not JSON: {exc.msg} at character {exc.pos}") from None


def _depth(text: str) -> int:
    """The deepest bracket nesting of a JSON text, brackets inside strings aside (so that the
    C decoder never recurses past MAX_JSON_DEPTH)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _items(name: str, value: Any) -> list[Any]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(f"{name}: expected a list, got {type(value).__name__}")
    return list(value)


def _zip(value: Any, *others: Any) -> list[list[Any]]:
    """`{{ names | zip(roles) }}`: the lists side by side, as pairs (as long as the shortest)."""
    return [list(row) for row in zip(_items("zip", value), *(_items("zip", o) for o in others), strict=False)]


def _enumerate(value: Any, start: int = 0) -> list[list[Any]]:
    """`{{ tasks | enumerate(1) }}`: [[1, first], [2, second], ...]."""
    return [[i, item] for i, item in enumerate(_items("enumerate", value), start)]


def _rng(context: Context, salt: Any) -> random.Random:
    run = context.get("run")
    run_id = run.get("id", "") if isinstance(run, dict) else ""
    return random.Random(f"{run_id}\x00{salt}")   # a str seed: the same in every process


@pass_context
def _shuffle(context: Context, value: Any, salt: Any = "") -> list[Any]:
    """`{{ players | shuffle }}`: the list in an order fixed by the run (and `salt`)."""
    items = _items("shuffle", value)
    _rng(context, salt).shuffle(items)
    return items


@pass_context
def _choice(context: Context, value: Any, salt: Any = "") -> Any:
    """`{{ topics | choice }}`: one item, picked as `shuffle` orders."""
    items = _items("choice", value)
    if not items:
        raise ValueError("choice: the list is empty")
    return _rng(context, salt).choice(items)


_SOP_FOLDER: ContextVar[Path | None] = ContextVar("sopctl_sop_folder", default=None)


@contextlib.contextmanager
def reading_beside(sop_file: str) -> Iterator[None]:
    """Let `file()` read from the folder of `sop_file` inside (a run sets it; "<string>", an
    SOP given as text, has no folder)."""
    folder = None if sop_file.startswith("<") else Path(sop_file).resolve().parent
    token = _SOP_FOLDER.set(folder)
    try:
        yield
    finally:
        _SOP_FOLDER.reset(token)


def refusal(rel: str) -> str:
    """Why a path for `file()` is refused before any file is read ('' when it is not)."""
    return beside_refusal(rel, f"file('{rel}')")


def file_problem(folder: Path, rel: str) -> str:
    """Why `validate` expects `file(rel)` to fail in `folder` ('' when it does not): missing,
    not a regular file, leaving the folder through a symlink, or over MAX_FILE_BYTES."""
    path = (folder / rel).resolve()
    if not path.is_relative_to(folder.resolve()):
        return f"file('{rel}'): the path leaves the SOP's folder through a symlink"
    if not path.exists():
        return f"file('{rel}'): no such file in the SOP's folder"
    if not path.is_file():
        return f"file('{rel}'): not a regular file"
    if path.stat().st_size > MAX_FILE_BYTES:
        return f"file('{rel}'): the file is larger than {MAX_FILE_BYTES:,} bytes"
    return ""


def _file(rel: Any) -> str:
    """`{{ file('prompts/write.md') }}`: the text of a file in the SOP's own folder."""
    folder = _SOP_FOLDER.get()
    if folder is None:
        raise ValueError("file(): this SOP has no folder (it was given as text)")
    return read_beside(folder, str(rel), f"file('{rel}')", MAX_FILE_BYTES)


FILTERS = {"from_json": _from_json, "re_search": _re_search, "re_findall": _re_findall, "re_sub": _re_sub,
           "zip": _zip, "enumerate": _enumerate, "shuffle": _shuffle, "choice": _choice}
"""Added to the sandbox's filters (each bounded there like jinja's own)."""

GLOBALS = {"file": _file}
