"""Deprecated spellings: one table of renames, applied to a loaded file's plain data.

Where a key changed so that it means one thing (the three `timeout_s`, the count limits
that all read `max_<what>`, the person-in-the-loop modes), the old spelling keeps working:
`migrate` rewrites it in the plain data before the schema sees it, moves the source map's
positions with it (a bad value under the new name is still reported at the old key's line)
and returns a located warning (SOP015) for each use. Both spellings in one mapping are an
error (SOP016): which one was meant cannot be known.

`sopctl migrate FILE` (engine/cli/migrate.py) rewrites the file itself: `rewrite_text`
changes only the tokens of the old spellings, at the positions the loader's composer gives,
so comments, key order, quoting, flow style and every other byte stay as they were.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from engine.errors import Diagnostic, LoadError, Related
from engine.load.source import Source, SourceMap, join_pointer

__all__ = ["MIGRATIONS", "Change", "Migration", "apply_changes", "find_changes", "migrate", "rewrite_text"]


@dataclass(frozen=True)
class Migration:
    """One deprecated spelling: in a mapping of kind `where`, `old` is now written `new`.

    A key rename when `value` is empty; otherwise the value `old` of key `value` is now `new`."""

    where: str
    old: str
    new: str
    since: str
    meaning: str
    """What the new spelling means (the warning's hint)."""
    value: str = ""
    needs: tuple[str, str, str] = ("", "", "")
    """(key, value, what the old value means): a value rename applies only where that key
    has that value; elsewhere the old value contradicts its mapping (an error, SOP218)."""


MIGRATIONS: tuple[Migration, ...] = (
    Migration("action", "timeout_s", "command_timeout_s", "0.2.0",
              "the command's wall-clock limit, kind exec (one model request's is `llm.timeout_s`)"),
    Migration("mcp server", "timeout_s", "call_timeout_s", "0.2.0",
              "the longest one tool call may take"),
    Migration("action", "retries", "max_retries", "0.2.0",
              "the most re-asks after an invalid answer (count limits all read `max_<what>`)"),
    Migration("planner", "task_retries", "max_task_retries", "0.2.0",
              "the most runs of a failed task before it is re-planned (count limits all read `max_<what>`)"),
    Migration("revise", "human_review", "auto", "0.2.0",
              "with `review: human`, `revise: auto` is a person's comments revised by the model",
              value="revise", needs=("review", "human", "means a person writes the review")),
)
"""Every deprecated spelling (docs/writing.md's "Deprecated spellings" table is this one)."""


@dataclass(frozen=True)
class Change:
    """One use of a deprecated spelling in a file: the mapping it is in and what changes."""

    migration: Migration
    mapping: str
    """The JSON pointer of the mapping holding it (`/actions/Run`)."""
    line: int
    col: int
    """Where the token to rewrite is (the key, or the value of a value rename)."""
    conflict: tuple[int, int] | None = None
    """Where the new spelling already is in the same mapping (both spellings: an error)."""
    blocked: str = ""
    """Why this use cannot be rewritten (the old spelling is an error as it stands)."""

    @property
    def pointer(self) -> str:
        """The pointer of the old spelling as the file has it."""
        m = self.migration
        return join_pointer(self.mapping, m.value or m.old)

    @property
    def old_text(self) -> str:
        m = self.migration
        return f"{m.value}: {m.old}" if m.value else m.old

    @property
    def new_text(self) -> str:
        m = self.migration
        return f"{m.value}: {m.new}" if m.value else m.new


def _mappings(data: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(kind, pointer, mapping) of every mapping a migration may apply to, in file order."""
    for aid, action in _entries(data.get("actions")):
        yield "action", join_pointer("/actions", aid), action
        if isinstance(action.get("revise"), dict):
            yield "revise", join_pointer("/actions", aid, "revise"), action["revise"]
    for name, server in _entries(data.get("mcp")):
        yield "mcp server", join_pointer("/mcp", name), server
    for rid, role in _entries(data.get("roles")):
        if isinstance(role.get("planner"), dict):
            yield "planner", join_pointer("/roles", rid, "planner"), role["planner"]


def _entries(section: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(section, dict):
        yield from ((k, v) for k, v in section.items() if isinstance(v, dict))


_BY_KIND: dict[str, tuple[Migration, ...]] = {
    kind: tuple(m for m in MIGRATIONS if m.where == kind) for kind in {m.where for m in MIGRATIONS}}


def find_changes(data: dict[str, Any], smap: SourceMap) -> list[Change]:
    """Every use of a deprecated spelling in a file's plain data (as loaded: not yet migrated)."""
    found = []
    for kind, pointer, mapping in _mappings(data):
        for migration in _BY_KIND.get(kind, ()):
            change = _change(migration, pointer, mapping, smap)
            if change is not None:
                found.append(change)
    return found


def _change(m: Migration, pointer: str, mapping: dict[str, Any], smap: SourceMap) -> Change | None:
    if m.value:
        if mapping.get(m.value) != m.old:
            return None
        line, col = smap.locate(join_pointer(pointer, m.value))
        key, wanted, meaning = m.needs
        blocked = "" if not key or mapping.get(key) == wanted else (
            f"`{m.value}: {m.old}` {meaning}, but `{key}` is '{mapping.get(key, 'auto')}'")
        return Change(m, pointer, line, col, blocked=blocked)
    if m.old not in mapping:
        return None
    line, col = smap.keys.get(join_pointer(pointer, m.old), (1, 1))
    conflict = smap.keys.get(join_pointer(pointer, m.new), (1, 1)) if m.new in mapping else None
    return Change(m, pointer, line, col, conflict=conflict)


# ----------------------------------------------------------------------------- loading


def migrate(source: Source) -> Source:
    """`source` with every deprecated spelling rewritten to the new one, and a SOP015 warning
    for each in `source.warnings`. Raises LoadError (with the warnings) when one cannot be
    rewritten: both spellings in one mapping (SOP016), `revise: human_review` without a
    person's review (SOP218)."""
    changes = find_changes(source.data, source.map)
    if not changes:
        return source
    diagnostics = [_diagnose(source.file, change) for change in changes]
    if any(d.is_error for d in diagnostics):
        raise LoadError(diagnostics)
    smap = _copy(source.map)
    for change in changes:
        _apply(change, source.data, smap)
    return replace(source, map=smap, warnings=(*source.warnings, *diagnostics))


def _diagnose(file: str, change: Change) -> Diagnostic:
    """The diagnostic of one use, located at the old spelling (the key, or the value)."""
    return replace(_finding(change), file=file, line=change.line, col=change.col, pointer=change.pointer)


def _finding(change: Change) -> Diagnostic:
    m = change.migration
    if change.conflict is not None:
        line, col = change.conflict
        note = Related(message=f"`{m.new}` is here", pointer=join_pointer(change.mapping, m.new), line=line, col=col)
        return Diagnostic(code="SOP016", severity="error",
                          message=f"both `{m.old}` (deprecated) and `{m.new}` in one {m.where}",
                          hint=f"keep only `{m.new}`, {m.meaning}", related=(note,))
    if change.blocked:
        return Diagnostic(code="SOP218", severity="error", message=change.blocked,
                          hint="set `review: human`, or use `revise: auto` for a model's review and revision")
    return Diagnostic(code="SOP015", severity="warning",
                      message=f"`{change.old_text}` is deprecated here: write `{change.new_text}` "
                              "(sopctl migrate FILE rewrites it)",
                      hint=f"`{m.new}` is {m.meaning}" if not m.value else m.meaning)


def apply_changes(data: dict[str, Any], changes: list[Change]) -> dict[str, Any]:
    """A copy of plain `data` with `changes` made (what the rewritten file must load as)."""
    copied: dict[str, Any] = copy.deepcopy(data)
    for change in changes:
        _apply(change, copied, SourceMap())
    return copied


def _apply(change: Change, data: dict[str, Any], smap: SourceMap) -> None:
    m = change.migration
    mapping = _at(data, change.mapping)
    if m.value:
        mapping[m.value] = m.new
        return
    items = [(m.new if key == m.old else key, value) for key, value in mapping.items()]
    mapping.clear()
    mapping.update(items)   # the key keeps its place among its siblings
    _move(smap, join_pointer(change.mapping, m.old), join_pointer(change.mapping, m.new))


def _at(data: dict[str, Any], pointer: str) -> dict[str, Any]:
    node: Any = data
    for token in pointer.split("/")[1:]:
        node = node[token.replace("~1", "/").replace("~0", "~")]
    return node  # type: ignore[no-any-return]


def _copy(smap: SourceMap) -> SourceMap:
    return SourceMap(values=dict(smap.values), keys=dict(smap.keys), containers=set(smap.containers),
                     literals=set(smap.literals))


def _move(smap: SourceMap, old: str, new: str) -> None:
    """The positions of `old` and everything under it, now under `new`."""
    def moved(pointer: str) -> str | None:
        if pointer == old or pointer.startswith(old + "/"):
            return new + pointer[len(old):]
        return None

    for table in (smap.values, smap.keys):
        for pointer in [p for p in table if moved(p) is not None]:
            table[moved(pointer) or pointer] = table.pop(pointer)
    for marks in (smap.containers, smap.literals):
        for pointer in [p for p in marks if moved(p) is not None]:
            marks.discard(pointer)
            marks.add(moved(pointer) or pointer)


# ----------------------------------------------------------------------------- rewriting a file


_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def rewrite_text(text: str, changes: list[Change]) -> tuple[str, list[Change], list[Change]]:
    """`text` with each rewritable change's token replaced, and (done, skipped) changes.

    Only the token changes: a plain `timeout_s` becomes `command_timeout_s`, a quoted
    `"timeout_s"` becomes `"command_timeout_s"` with its quotes. A change that is an error
    (both spellings, a blocked value), or whose token is not found written plainly at its
    position (an escape inside quotes), is skipped and left to the user."""
    starts = [0] + [match.end() for match in _LINE_BREAK.finditer(text)]
    edits: dict[int, tuple[int, str]] = {}
    done, skipped = [], []
    for change in changes:
        offset = starts[change.line - 1] + change.col - 1 if change.line <= len(starts) else -1
        span = _token(text, offset, change.migration.old) if not (change.conflict or change.blocked) else None
        if span is None:
            skipped.append(change)
            continue
        if span[0] not in edits:            # an alias's copies share one token
            edits[span[0]] = (span[1], change.migration.new)
        done.append(change)
    for start in sorted(edits, reverse=True):
        end, new = edits[start]
        text = text[:start] + new + text[end:]
    return text, done, skipped


def _token(text: str, offset: int, word: str) -> tuple[int, int] | None:
    """The span of `word` written at `offset`, plain or inside quotes; None if it is not."""
    if offset < 0:
        return None
    quote = text[offset:offset + 1]
    start = offset + 1 if quote in ("'", '"') else offset
    end = start + len(word)
    if text[start:end] != word:
        return None
    after = text[end:end + 1]
    if quote in ("'", '"'):
        return (start, end) if after == quote else None
    return (start, end) if after in ("", ":", " ", "\t", ",", "}", "]", "\r", "\n", "#") else None
