"""The `editor` toolset: files confined to the run's workspace (MetaGPT's Editor).

Code is read by line: `read` takes a range, `open` shows a window of a file and `scroll_down`
/ `scroll_up` move it. Every output that shows lines names them (`lines 291-300 of 400`) and
gives the command that shows the rest; an output that would pass MAX_OUTPUT_CHARS is shortened
here, to whole lines, saying so, so the loop's blind cut never has to touch an editor output.

State: one window per file (its first line, its size, the last line it showed), and the file
opened last, which a scroll without `path` moves. It lives in this object, one per tool loop,
so it lasts the loop; an `open` or a scroll taken from the journal on resume sets it again
from the outcome's `state` (`restore`).

Edits (`write`, `replace`, `insert`, `replace_lines`, `append`) write the whole file back
through the workspace (atomic, confined, never through a symlink, nothing in `.sopctl/`) and
return it in the outcome's `files`, which resume reconciles; a file is at most
MAX_WRITE_BYTES, and the model is told so when it asks for more.
"""

from __future__ import annotations

import fnmatch
import json
import os
from pathlib import Path, PurePosixPath
from typing import Any

from engine.load.catalog import MAX_WRITE_BYTES
from engine.load.files import FileRefused, read_bounded
from engine.load.spec import ENGINE_DIR
from engine.run.tools.base import MAX_OUTPUT_CHARS, Outcome, ToolError
from engine.run.workspace import Workspace, WorkspaceError, WrittenFile

__all__ = ["Editor", "MAX_LIST_ENTRIES", "MAX_SEARCH_HITS", "MAX_FIND_HITS", "MAX_READ_BYTES",
           "MAX_WRITE_BYTES", "MAX_WALK_FILES", "WINDOW"]


MAX_LIST_ENTRIES = 500


MAX_SEARCH_HITS = 200


MAX_FIND_HITS = 100


MAX_WALK_FILES = MAX_LIST_ENTRIES * 4
"""A list, search or find looks at this many files at most, and says so when there were more."""


MAX_READ_BYTES = 2_000_000
"""A file larger than this is not read, searched, or edited."""


WINDOW = 100
"""Lines an `open` window shows unless it asks for another size."""


_BUDGET = MAX_OUTPUT_CHARS - 600
"""Characters of numbered lines in one output: the rest is room for its header and footer."""


_HIT_CHARS = 200
"""A search hit shows at most this much of its line."""


_SKIPPED_FOLDERS = frozenset({".git", ".hg", ".svn"})
"""Version-control folders: a search or a find by name never looks inside them."""


class Editor:
    """`editor.*`: each `do_` method is one command (`editor.read` -> `do_read`)."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace
        self.windows: dict[str, tuple[int, int, int]] = {}
        """path -> (first line, size, last line shown) of the file's window."""
        self.current: str | None = None
        """The file opened or scrolled last: a scroll without `path` moves its window."""

    # -- reading ----------------------------------------------------------------------------
    async def do_read(self, path: str, start: int = 1, end: int | None = None) -> str:
        lines = _split(self._text(path))
        if not lines:
            return f"[{path}: empty file]"
        last = _check_range(path, lines, start, end)
        return _show(path, lines, start, last, _ReadNav(path, end))

    async def do_open(self, path: str, line: int = 1, window: int = WINDOW) -> Outcome:
        lines = _split(self._text(path))
        line = min(line, max(len(lines), 1))
        top = max(1, min(line - window // 2, len(lines) - window + 1))
        return self._window(path, lines, top, window)

    async def do_scroll_down(self, path: str | None = None) -> Outcome | str:
        rel, (top, size, last) = self._opened(path)
        lines = _split(self._text(rel))
        if last >= len(lines):
            return f"[{rel}: already at the end; lines {top}-{last} of {len(lines)} were shown]"
        return self._window(rel, lines, last + 1, size)

    async def do_scroll_up(self, path: str | None = None) -> Outcome | str:
        rel, (top, size, _) = self._opened(path)
        if top <= 1:
            return f"[{rel}: already at the top; line 1 was shown]"
        return self._window(rel, _split(self._text(rel)), max(1, top - size), size)

    def restore(self, state: dict[str, Any]) -> None:
        """A window set by an outcome taken from the journal (a resumed loop)."""
        window = state.get("window")
        if isinstance(window, dict) and isinstance(window.get("path"), str):
            path = window["path"]
            self.windows[path] = (int(window["top"]), int(window["size"]), int(window["last"]))
            self.current = path

    def _window(self, path: str, lines: list[str], top: int, size: int) -> Outcome:
        if not lines:
            self.windows[path], self.current = (1, size, 0), path
            return Outcome(f"[{path}: empty file]", state=self._state(path))
        top = min(top, len(lines))   # the file may have shrunk since the window was set
        end = min(len(lines), top + size - 1)
        text, last = _render(path, lines, top, end, _ViewNav(path, size))
        self.windows[path], self.current = (top, size, last), path
        return Outcome(text, state=self._state(path))

    def _state(self, path: str) -> dict[str, Any]:
        top, size, last = self.windows[path]
        return {"window": {"path": path, "top": top, "size": size, "last": last}}

    def _opened(self, path: str | None) -> tuple[str, tuple[int, int, int]]:
        rel = path or self.current
        if rel is None:
            raise ToolError("no file is open; give editor.open first")
        if rel not in self.windows:
            raise ToolError(f"{rel} is not open; give editor.open {_args(path=rel)} first")
        return rel, self.windows[rel]

    # -- editing ----------------------------------------------------------------------------
    async def do_write(self, path: str, content: str) -> Outcome:
        written = self._write(path, content)
        return Outcome(f"wrote {written.path} ({len(_split(content))} lines)",
                       files={written.path: content})

    async def do_replace(self, path: str, old: str, new: str) -> Outcome:
        text = self._text(path)
        count = text.count(old) if old else 0
        if count != 1:
            raise ToolError(f"`old` occurs {count} times in {path}; it must occur exactly once "
                            "(give more of the surrounding text)")
        content = text.replace(old, new, 1)
        written = self._write(path, content)
        return Outcome(f"replaced 1 occurrence in {written.path}", files={written.path: content})

    async def do_insert(self, path: str, line: int, content: str) -> Outcome:
        text = self._text(path)
        lines, added = _split(text), _split(content)
        if line > len(lines) + 1:
            raise ToolError(f"{path} has {len(lines)} lines: insert at a line from 1 to "
                            f"{len(lines) + 1} (the end)")
        new = lines[:line - 1] + added + lines[line - 1:]
        return self._edited(path, new, _ends_open(text), line, len(added),
                            f"inserted {len(added)} lines before line {line} of {path}")

    async def do_replace_lines(self, path: str, start: int, end: int, content: str) -> Outcome:
        text = self._text(path)
        lines, added = _split(text), _split(content)
        _check_range(path, lines, start, end, strict=True)
        new = lines[:start - 1] + added + lines[end:]
        return self._edited(path, new, _ends_open(text), start, len(added),
                            f"replaced lines {start}-{end} of {path} with {len(added)} lines")

    async def do_append(self, path: str, content: str) -> Outcome:
        text = self._text(path) if self._path(path).exists() else ""
        lines = _split(text)
        joined = text + ("\n" if text and not text.endswith("\n") else "") + content
        added = len(_split(joined)) - len(lines)
        new = _split(joined)
        return self._edited(path, new, joined.endswith("\n") or not joined, len(lines) + 1, added,
                            f"appended {added} lines to {path}")

    def _edited(self, path: str, lines: list[str], final_newline: bool, first: int, count: int,
                done: str) -> Outcome:
        """Write the edited lines back; the output shows the changed lines with 3 around them."""
        content = "".join(f"{line}\n" for line in lines)
        if not final_newline and content:
            content = content[:-1]
        written = self._write(path, content)
        summary = f"{done} (now {len(lines)} lines)"
        if not lines:
            return Outcome(summary, files={written.path: content})
        low, high = max(1, first - 3), min(len(lines), first + count + 2)
        return Outcome(summary + "\n" + _show(path, lines, low, high, _ReadNav(path, None)),
                       files={written.path: content})

    # -- finding ----------------------------------------------------------------------------
    async def do_list(self, path: str = ".") -> str:
        files, complete = self._files(path)
        shown = _fitting(files[:MAX_LIST_ENTRIES])
        if len(shown) < len(files) or not complete:
            more = "more" if complete else "more (the walk stopped there)"
            return "\n".join(shown) + (f"\n[{len(shown)} files shown, {more}; "
                                       "list a folder further down to see the rest]")
        return "\n".join(shown) or "(no files)"

    async def do_search(self, term: str, path: str = ".") -> str:
        if not term:
            raise ToolError("`term` is empty")
        files, complete = self._search_set(path)
        hits: list[str] = []
        for rel in files:
            hits += _hits(self.workspace.root / rel, rel, term)
            if len(hits) > MAX_SEARCH_HITS:
                break
        shown = _fitting(hits[:MAX_SEARCH_HITS])
        if len(shown) < len(hits):
            return "\n".join(shown) + (f"\n[{len(shown)} matching lines shown; there are more: narrow the "
                                       "search (a longer term, or a file or folder as `path`)]")
        note = "" if complete else f"\n[only the first {MAX_WALK_FILES} files were searched: give a folder as `path`]"
        return ("\n".join(shown) or f"no line contains {term!r}") + note

    async def do_find(self, pattern: str, path: str = ".") -> str:
        files, complete = self._files(path, skip=_SKIPPED_FOLDERS)
        base = self._path(path, folder=True).relative_to(self.workspace.root).as_posix()
        skip = 0 if base == "." else len(base) + 1
        found = [rel for rel in files if _matches(pattern, rel[skip:])]
        shown = _fitting(found[:MAX_FIND_HITS])
        if len(shown) < len(found):
            return "\n".join(shown) + (f"\n[{len(shown)} of {len(found)} files shown: narrow the pattern "
                                       "or give a folder as `path`]")
        note = "" if complete else f"\n[only the first {MAX_WALK_FILES} files were looked at: give a folder as `path`]"
        return ("\n".join(shown) or f"no file under {path} matches {pattern!r}") + note

    def _search_set(self, rel: str) -> tuple[list[str], bool]:
        """The files a search reads: `rel` itself when it is a file, else those under it."""
        target = self._path(rel, folder=True)
        if target.is_file():
            self._size_checked(rel, target)
            return [target.relative_to(self.workspace.root).as_posix()], True
        if not target.is_dir():
            raise ToolError(f"no file or folder {rel} in the workspace")
        files, complete = self._files(rel, skip=_SKIPPED_FOLDERS)
        root = self.workspace.root
        return [f for f in files if (root / f).stat().st_size <= MAX_READ_BYTES], complete

    def _files(self, rel: str, *, skip: frozenset[str] = frozenset()) -> tuple[list[str], bool]:
        """Files under a workspace folder (never sopctl's own, never through a symlink), and
        whether that is all of them (the walk stops after MAX_WALK_FILES)."""
        root = self.workspace.root
        base = self._path(rel, folder=True)
        if not base.is_dir():
            raise ToolError(f"no folder {rel} in the workspace")
        found: list[str] = []
        for folder, dirs, names in os.walk(base, followlinks=False):
            dirs[:] = sorted(d for d in dirs if d not in skip and not (Path(folder) == root and d == ENGINE_DIR))
            for name in sorted(names):
                path = Path(folder) / name
                if path.is_file() and not path.is_symlink():
                    found.append(path.relative_to(root).as_posix())
                if len(found) >= MAX_WALK_FILES:
                    return found, False
        return found, True

    # -- the workspace ------------------------------------------------------------------------
    def _path(self, rel: str, *, folder: bool = False) -> Path:
        if folder and rel.strip() in (".", "./", ""):
            return self.workspace.root
        try:
            return self.workspace.confine(rel.rstrip("/") if folder else rel)
        except WorkspaceError as exc:
            raise ToolError(exc.message) from None

    def _write(self, rel: str, content: str) -> WrittenFile:
        size = len(content.encode("utf-8"))
        if size > MAX_WRITE_BYTES:
            raise ToolError(f"{rel} would be {size:,} bytes; a file the editor writes is at most "
                            f"{MAX_WRITE_BYTES:,} bytes: split the content into several files")
        try:
            return self.workspace.write(rel, content)
        except WorkspaceError as exc:
            raise ToolError(exc.message) from None

    def _text(self, rel: str) -> str:
        path = self._path(rel)
        if not path.is_file():
            raise ToolError(f"no file {rel} in the workspace")
        self._size_checked(rel, path)
        try:       # no link at the last name, and no hard link to a file outside the workspace
            return read_bounded(path, MAX_READ_BYTES, follow_links=False, single_link=True).decode("utf-8")
        except FileRefused as exc:
            raise ToolError(f"cannot read {rel}: {exc.message}") from None
        except UnicodeDecodeError as exc:
            raise ToolError(f"cannot read {rel}: {exc}") from None

    @staticmethod
    def _size_checked(rel: str, path: Path) -> None:
        if path.stat().st_size > MAX_READ_BYTES:
            raise ToolError(f"{rel} is larger than {MAX_READ_BYTES:,} bytes; the editor does not read it")


# -- lines --------------------------------------------------------------------------------------
def _split(text: str) -> list[str]:
    """A file's lines as editors and `grep -n` number them: split at "\\n" only (a final
    newline ends the last line; it does not start another)."""
    if not text:
        return []
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def _ends_open(text: str) -> bool:
    """Whether an edit keeps a final newline: as the file had it (a new file gets one)."""
    return text.endswith("\n") or not text


def _check_range(path: str, lines: list[str], start: int, end: int | None, *, strict: bool = False) -> int:
    """The last line of `start`..`end` (None: the file's end), or the error saying what fits;
    `strict` (an edit): `end` must be a line of the file too."""
    total = len(lines)
    if start > total:
        raise ToolError(f"{path} has {total} lines; line {start} is past its end")
    if end is not None and end < start:
        raise ToolError(f"`end` ({end}) is before `start` ({start})")
    if strict and end is not None and end > total:
        raise ToolError(f"{path} has {total} lines; `end` ({end}) is past its end")
    return total if end is None else min(end, total)


def _args(**args: Any) -> str:
    """A command's args as the model gives them."""
    return json.dumps(args, ensure_ascii=False)


class _ReadNav:
    """How to see the lines around a range: `editor.read` with the range."""

    def __init__(self, path: str, end: int | None) -> None:
        self.path, self.end = path, end

    def above(self, first: int) -> str:
        return f"editor.read {_args(path=self.path, start=max(1, first - WINDOW), end=first - 1)}"

    def below(self, last: int, asked: int) -> str:
        if self.end is not None and last < asked:   # shortened: the rest of the range asked for
            return f"editor.read {_args(path=self.path, start=last + 1, end=asked)}"
        return f"editor.read {_args(path=self.path, start=last + 1)}"


class _ViewNav:
    """How to see the lines around a window: scroll it."""

    def __init__(self, path: str, size: int) -> None:
        self.path, self.size = path, size

    def above(self, first: int) -> str:
        return f"editor.scroll_up {_args(path=self.path)}"

    def below(self, last: int, asked: int) -> str:
        return f"editor.scroll_down {_args(path=self.path)}"


def _show(path: str, lines: list[str], first: int, asked: int, nav: _ReadNav | _ViewNav) -> str:
    return _render(path, lines, first, asked, nav)[0]


def _render(path: str, lines: list[str], first: int, asked: int, nav: _ReadNav | _ViewNav) -> tuple[str, int]:
    """Lines `first`..`asked` numbered `N|` under a header that says which lines of how many
    they are and what shows the rest; as many whole lines as fit. The last line shown too."""
    rows, last = _numbered(lines, first, asked)
    total = len(lines)
    where = [f"lines {first}-{last} of {total}"]
    if isinstance(nav, _ViewNav):
        where[0] += f" (a window of {nav.size})"
    if last < asked:
        where.append(f"shortened to fit {MAX_OUTPUT_CHARS:,} characters")
    if first > 1:
        where.append(f"{first - 1} above: {nav.above(first)}")
    if last < total:
        where.append(f"{total - last} below: {nav.below(last, asked)}")
    text = f"[{path}: " + "; ".join(where) + "]\n" + "\n".join(rows)
    if last < asked:
        text += f"\n[shortened at line {last}; next: {nav.below(last, asked)}]"
    return text, last


def _numbered(lines: list[str], first: int, asked: int) -> tuple[list[str], int]:
    """As many whole lines from `first` as fit in _BUDGET characters. A first line that does
    not fit alone is cut, saying so (no range can show it whole)."""
    rows: list[str] = []
    used = 0
    for number in range(first, asked + 1):
        row = f"{number}|{lines[number - 1].rstrip(chr(13))}"
        if used + len(row) + 1 > _BUDGET:
            if rows:
                return rows, number - 1
            shown = _BUDGET - len(str(number)) - 1
            return [row[:_BUDGET] + f" [line {number} is {len(lines[number - 1]):,} characters; the "
                    f"first {shown:,} are shown]"], number
        rows.append(row)
        used += len(row) + 1
    return rows, asked


def _fitting(rows: list[str]) -> list[str]:
    """The first rows that fit in _BUDGET characters together."""
    used = 0
    for index, row in enumerate(rows):
        used += len(row) + 1
        if used > _BUDGET:
            return rows[:index]
    return rows


def _hits(path: Path, rel: str, term: str) -> list[str]:
    """`rel:N: line` for each line of the file that contains `term` (a file that is not
    UTF-8 text, or cannot be read, has none)."""
    try:       # as `_text` reads: a hard-linked or planted file is not searched
        text = read_bounded(path, MAX_READ_BYTES, follow_links=False, single_link=True).decode("utf-8")
    except (FileRefused, UnicodeDecodeError):
        return []
    hits = []
    for number, line in enumerate(_split(text), 1):
        if term in line:
            shown = line.strip()
            if len(shown) > _HIT_CHARS:
                shown = shown[:_HIT_CHARS] + " [...]"
            hits.append(f"{rel}:{number}: {shown}")
    return hits


def _matches(pattern: str, rel: str) -> bool:
    """A glob on the file's name, or on its path under the folder searched when the pattern
    holds a `/` (`*` then crosses folders too)."""
    if "/" in pattern:
        return fnmatch.fnmatchcase(rel, pattern)
    return fnmatch.fnmatchcase(PurePosixPath(rel).name, pattern)
