"""One document checked as `sopctl validate` checks it, and indexed for navigation.

The diagnostics are the compiler's own (`check_text`, the same phases and codes as
`validate`), grouped by the file each lands in: a problem in an included library is
published in the library. A library opened by itself would fail as a main file (no
`name`, no `roles`), so it is checked through a file that includes it (an open document,
or a `.sop.yaml` beside it or one folder up, as saved), keeping the problems that are its.
Every open document's text is read in place of its file (an overlay): an includer is
checked against its libraries' unsaved edits, and a library through its includer with
its own.

Nothing here runs anything: loading, the models and the checks only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from engine.compile.compiler import CheckResult, check_text
from engine.errors import Diagnostic, LoadError
from engine.load.includes import LIBRARY_KEYS, Overlay
from engine.load.migrations import migrate
from engine.load.source import MAX_FILE_BYTES, Source, load_text
from engine.lsp.index import Index, build_index

__all__ = ["Analysis", "analyse", "absolute", "is_sop"]


_MAX_NEIGHBOURS = 200
"""SOP files looked at when searching for a library's includer (a folder and its parent)."""


@dataclass(frozen=True)
class Analysis:
    """What one check of a document found."""

    file: str
    """The document's absolute path."""
    text: str
    diagnostics: dict[str, tuple[Diagnostic, ...]] = field(default_factory=dict)
    """By the absolute path of the file each diagnostic is in (the document's: always a key)."""
    lines: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """The lines of every file a diagnostic is in, by absolute path."""
    index: Index | None = None
    """None when the text does not load (then the last good index serves navigation)."""
    via: str = ""
    """For a library: the file that includes it, through which it was checked."""


_SOP_SUFFIXES = (".sop.yaml", ".sop.yml")


_API_VERSION = re.compile(r"^apiVersion\s*:\s*['\"]?sop/", re.MULTILINE)


def is_sop(file: str, text: str) -> bool:
    """Whether a document is an SOP file: named `*.sop.yaml`, or saying `apiVersion: sop/...`.
    An editor starts the server for every YAML file; a compose file or a CI workflow is left
    alone rather than told it lacks `apiVersion`."""
    return file.endswith(_SOP_SUFFIXES) or _API_VERSION.search(text) is not None


def absolute(file: str) -> str:
    """A diagnostic's file (relative to the current folder for a library) as an absolute path."""
    return os.path.abspath(file)


def analyse(file: str, text: str, include_dirs: tuple[str, ...] = (),
            open_texts: Mapping[str, str] | None = None) -> Analysis:
    """Check and index the document at `file` (absolute) whose current text is `text`;
    `open_texts` are the other open documents (absolute path -> text)."""
    if not is_sop(file, text):
        return Analysis(file=file, text=text, diagnostics={file: ()})
    overlay = _overlay({**(open_texts or {}), file: text})
    result = check_text(text, file, include_dirs, overlay)
    source = result.source or _loaded(text, file) or _repaired(text, file, result)
    if source is not None and _maybe_library(source.data):
        includer = _includer(file, open_texts or {})
        if includer is not None:
            return _as_library(file, text, includer, include_dirs, overlay)
    return _analysis(file, text, result, build_index(source, include_dirs) if source is not None else None)


def _overlay(texts: Mapping[str, str]) -> Overlay:
    """The open documents by real path, as the include resolver looks files up."""
    return {Path(name).resolve(): text for name, text in texts.items()}


def _loaded(text: str, file: str) -> Source | None:
    try:
        return migrate(load_text(text, file))
    except LoadError:
        return None


_REPAIRS = 3


def _repaired(text: str, file: str, result: CheckResult) -> Source | None:
    """The text loaded without the lines YAML refuses (a line being typed: `watch: [Wri`),
    for navigation and completion only; None when blanking a few lines does not help."""
    lines = text.split("\n")
    found = result.diagnostics
    for _ in range(_REPAIRS):
        broken = [n for d in found if d.code == "SOP005" for n in (d.line, *(r.line for r in d.related))
                  if 0 < n <= len(lines) and lines[n - 1]]
        if not broken:
            return None
        for number in broken:      # where the parser stopped, and where what it parsed began
            lines[number - 1] = ""
        try:
            return migrate(load_text("\n".join(lines), file))
        except LoadError as exc:
            found = tuple(exc.diagnostics)
    return None


def _analysis(file: str, text: str, result: CheckResult, index: Index | None, only: str = "",
              via: str = "") -> Analysis:
    grouped: dict[str, list[Diagnostic]] = {file: []}
    lines: dict[str, tuple[str, ...]] = {file: tuple(text.splitlines())}
    for diag in result.diagnostics:
        where = absolute(diag.file) if diag.file else result.file
        if only:        # a library checked through its includer: only what is in the library
            if os.path.realpath(where) != os.path.realpath(only):
                continue
            where = file
        grouped.setdefault(where, []).append(diag)
        if where != file:
            lines[where] = result.lines_of(diag.file)
    return Analysis(file=file, text=text, diagnostics={k: tuple(v) for k, v in grouped.items()},
                    lines=lines, index=index, via=via)


def _maybe_library(data: dict) -> bool:
    """A file that holds only what a library may, and lacks what a runnable file needs."""
    return set(data) <= set(LIBRARY_KEYS) and ("roles" not in data or "name" not in data)


def _includer(file: str, open_texts: Mapping[str, str]) -> tuple[str, str] | None:
    """(path, text) of a file that includes `file`: an open document first, then one on disk
    beside it or in the folder above."""
    for name, text in open_texts.items():
        if name != file and _includes(name, text, file):
            return name, text
    folder = Path(file).parent
    candidates = [*sorted(folder.glob("*.sop.yaml")), *sorted(folder.parent.glob("*.sop.yaml"))]
    for path in candidates[:_MAX_NEIGHBOURS]:
        name = str(path.absolute())
        if name == file or name in open_texts:
            continue
        found = _read(path)
        if found is not None and _includes(name, found, file):
            return name, found
    return None


def _read(path: Path) -> str | None:
    try:
        if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            return None
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _includes(path: str, text: str, library: str) -> bool:
    """Whether the file at `path` names `library` in its `include` (resolved from its folder)."""
    if "include" not in text:
        return False
    source = _loaded(text, path)
    entries = source.data.get("include") if source is not None else None
    folder = Path(path).parent
    target = Path(library).resolve()
    return isinstance(entries, list) and any(
        isinstance(e, str) and (folder / e).resolve() == target for e in entries)


def _as_library(file: str, text: str, includer: tuple[str, str], include_dirs: tuple[str, ...],
                overlay: Overlay) -> Analysis:
    """A library checked through its includer: the problems located in the library."""
    path, includer_text = includer
    result = check_text(includer_text, path, include_dirs, overlay)
    index = build_index(result.source, include_dirs) if result.source is not None else None
    return _analysis(file, text, result, index, only=file, via=path)
