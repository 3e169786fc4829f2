"""`include:` SOP library files, resolved safely and merged into the including file's data.

An SOP file may name library files (`include: [lib/common.sop.yaml]`) whose `inputs`,
`actions` and `roles` join its own. Shared files are untrusted, so an include is a relative
path with `/` separators, no `..`, no URL, and it must resolve (symlinks followed) inside the
including file's folder or inside a folder the user named on the command line
(`--include-path DIR`); each library is loaded by `source.load_path`, with every limit the
main file has, and its deprecated spellings are rewritten as the main file's are (each a
warning, located in the library). Cycles are refused with the chain; a library reached
twice (a diamond) is merged once. A name defined in two files is an error at the second definition.

An editor passes an *overlay*: the text of each open document by its real path, read in
place of the file on disk, so that a library's unsaved edits are what its includers are
checked against (`sopctl lsp`).

The result is one `Source` whose data is the merged document and whose `owners` map each
merged entry (`/actions/Speak`) to the library it came from, so that every later phase keeps
reporting by JSON pointer and the compiler locates each diagnostic in the right file.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from engine.errors import Diagnostic, LoadError, Related, did_you_mean
from engine.load.migrations import migrate
from engine.load.source import Source, join_pointer, load_path, load_text

__all__ = ["MAX_INCLUDED_FILES", "MERGED_SECTIONS", "LIBRARY_KEYS", "Overlay", "resolve_includes",
           "sources_digest"]


MAX_INCLUDED_FILES = 32
"""Library files one SOP may pull in, all levels together (a real SOP needs one or two)."""


MERGED_SECTIONS = ("inputs", "actions", "roles")
"""The sections a library contributes, entry by entry."""


LIBRARY_KEYS = ("$schema", "apiVersion", "name", "description", "include", *MERGED_SECTIONS)
"""What a library file may hold: `llm` and `team` belong to the file that runs."""


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


@dataclass
class _Merge:
    """The state of one resolution: files met so far, the merged data, who defined what."""

    main: Source
    roots: tuple[Path, ...]
    data: dict[str, Any]
    owners: dict[str, Source] = field(default_factory=dict)
    loaded: dict[Path, Source] = field(default_factory=dict)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    overlay: Mapping[Path, str] = field(default_factory=dict)
    """Texts read instead of the files on disk, by real path (an editor's open documents)."""


Overlay = Mapping[Path, str]


def resolve_includes(main: Source, base: Path, include_dirs: tuple[Path, ...] = (),
                     overlay: Overlay | None = None) -> Source:
    """`main` with its libraries merged in; `base` is the folder its includes are relative to;
    `overlay`: texts to read instead of the files at those real paths.

    Raises LoadError with every problem (a refused path, a cycle, a name defined twice, and
    whatever a library's own loading found, located in the library)."""
    if "include" not in main.data:
        return main
    roots = tuple(p.resolve() for p in include_dirs)
    data = {k: (dict(v) if k in MERGED_SECTIONS and isinstance(v, dict) else v) for k, v in main.data.items()}
    merge = _Merge(main=main, roots=roots, data=data, overlay=overlay or {})
    _include_all(merge, main, base.resolve(), [_identity(main, base)])
    if merge.diagnostics:
        raise LoadError(merge.diagnostics)
    included = tuple(merge.loaded.values())
    return replace(main, data=merge.data, owners=merge.owners, included=included)


def sources_digest(main_raw: bytes, included: tuple[Source, ...]) -> str:
    """The sha256 a run records: of the file alone, or of it and every library it includes
    (a changed library is a changed SOP to resume)."""
    digest = hashlib.sha256(main_raw)
    if not included:
        return digest.hexdigest()
    for source in included:
        digest.update(b"\0" + source.file.encode("utf-8", "surrogatepass") + b"\0")
        digest.update(hashlib.sha256(source.raw).digest())
    return digest.hexdigest()


def _identity(source: Source, base: Path) -> Path:
    return (base / Path(source.file).name).resolve() if source.file.startswith("<") else Path(source.file).resolve()


def _include_all(merge: _Merge, source: Source, folder: Path, chain: list[Path]) -> None:
    entries = source.data.get("include")
    if entries is None:
        return
    if not isinstance(entries, list):
        _report(merge, source, "/include", "SOP103", "`include` must be a list of relative paths",
                "write `include: [lib.sop.yaml]`")
        return
    for index, entry in enumerate(entries):
        pointer = join_pointer("/include", index)
        path = _resolve(merge, source, pointer, entry, folder)
        if path is not None:
            _include_one(merge, source, pointer, path, chain)


def _include_one(merge: _Merge, source: Source, pointer: str, path: Path, chain: list[Path]) -> None:
    if path in chain:
        names = " -> ".join(p.name for p in [*chain[chain.index(path):], path])
        _report(merge, source, pointer, "SOP013", f"include cycle: {names}",
                "a library must not include, directly or not, a file that includes it")
        return
    if path in merge.loaded:
        return  # a diamond: the library is merged once
    if len(merge.loaded) >= MAX_INCLUDED_FILES:
        _report(merge, source, pointer, "SOP012", f"more than {MAX_INCLUDED_FILES} included files")
        return
    try:
        library = migrate(_load(merge, path))
    except LoadError as exc:
        note = _note(source, pointer, "included from here")
        merge.diagnostics += [replace(d, related=(*d.related, note)) for d in exc.diagnostics]
        return
    merge.loaded[path] = library
    if _library_shape(merge, library):
        _merge_sections(merge, library)
        _include_all(merge, library, path.parent, [*chain, path])


def _load(merge: _Merge, path: Path) -> Source:
    """The library at `path`: its text in the overlay (an open document), else the file."""
    text = merge.overlay.get(path)
    return load_path(_shown(path)) if text is None else load_text(text, str(_shown(path)))


def _shown(path: Path) -> Path:
    """A library as diagnostics name it: relative to the current folder when inside it, as the
    main file usually is given, else absolute."""
    here = Path.cwd().resolve()
    return path.relative_to(here) if path.is_relative_to(here) else path


def _resolve(merge: _Merge, source: Source, pointer: str, entry: Any, folder: Path) -> Path | None:
    """The real path an include names, or None (reported) when it is refused."""
    problem = _refusal(entry)
    if problem:
        _report(merge, source, pointer, "SOP012", problem,
                "name a file beside the SOP (`lib.sop.yaml`, `lib/common.sop.yaml`), or a "
                "file under a folder given with --include-path")
        return None
    roots = (folder, *merge.roots)
    for root in roots:
        candidate = (root / entry).resolve()
        if candidate.exists() or candidate in merge.overlay:
            if candidate.exists() and _linked_elsewhere(candidate):
                _report(merge, source, pointer, "SOP012",
                        f"include '{entry}' has another hard link (a name elsewhere, maybe outside "
                        "its folder); refused",
                        "copy the library into the SOP's folder as a file of its own")
                return None
            if any(candidate.is_relative_to(r) for r in (root, *merge.roots)):
                return candidate
            _report(merge, source, pointer, "SOP012",
                    f"include '{entry}' leaves its folder through a symlink (to {candidate})",
                    "copy the library into the SOP's folder, or name its folder with --include-path")
            return None
    searched = ", ".join(str(r) for r in roots)
    _report(merge, source, pointer, "SOP001", f"included file '{entry}' not found (searched {searched})",
            "give the library's path relative to this file, or its folder with --include-path")
    return None


def _linked_elsewhere(path: Path) -> bool:
    """A regular file with more than one name: a hard link planted in a shared folder would
    let an include read (and its diagnostics quote) a file outside it."""
    try:
        info = path.stat()
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_nlink > 1


def _refusal(entry: Any) -> str:
    if not isinstance(entry, str) or not entry.strip():
        return f"an include must be a non-empty path, got {entry!r}"
    if _URL.match(entry) or entry.startswith("//"):
        return f"include '{entry}' is a URL; only local files can be included"
    if entry.startswith("/") or "\\" in entry:
        return f"include '{entry}' must be a relative path with / separators"
    if ".." in PurePosixPath(entry).parts:
        return f"include '{entry}' leaves the including file's folder (..)"
    return ""


def _library_shape(merge: _Merge, library: Source) -> bool:
    """A library holds apiVersion sop/v1 and only the keys a library may have."""
    ok = True
    if library.data.get("apiVersion") != "sop/v1":
        _report(merge, library, "/apiVersion", "SOP102",
                f"an included file needs `apiVersion: sop/v1`, got {library.data.get('apiVersion')!r}")
        ok = False
    for key in library.data:
        if key not in LIBRARY_KEYS:
            hint = did_you_mean(key, LIBRARY_KEYS) or ("`llm` and `team` belong to the file that includes "
                                                       "this one" if key in ("llm", "team") else "")
            _report(merge, library, join_pointer("", key), "SOP101",
                    f"unknown key '{key}' in an included file (a library has {', '.join(LIBRARY_KEYS[1:])})",
                    hint, at_key=True)
            ok = False
    for section in MERGED_SECTIONS:
        if not isinstance(library.data.get(section, {}), dict):
            _report(merge, library, join_pointer("", section), "SOP103", f"`{section}` must be a mapping")
            ok = False
    return ok


def _merge_sections(merge: _Merge, library: Source) -> None:
    for section in MERGED_SECTIONS:
        entries = library.data.get(section) or {}
        target = merge.data.setdefault(section, {})
        if not isinstance(target, dict):
            continue  # the main file's own type error is the schema's to report
        for name, value in entries.items():
            pointer = join_pointer("", section, name)
            if name in target:
                _twice(merge, library, pointer, section, name)
                continue
            target[name] = value
            merge.owners[pointer] = library


def _twice(merge: _Merge, library: Source, pointer: str, section: str, name: str) -> None:
    note = _note(merge.owners.get(pointer, merge.main), pointer, "first defined here", at_key=True)
    _report(merge, library, pointer, "SOP014",
            f"{section[:-1]} '{name}' is defined in two files", "rename one of them; an included "
            "name cannot be redefined", at_key=True, related=(note,))


def _note(source: Source, pointer: str, message: str, at_key: bool = False) -> Related:
    line, col = source.map.locate(pointer, prefer_key=at_key)
    return Related(message=message, pointer=pointer, line=line, col=col, file=source.file)


def _report(merge: _Merge, source: Source, pointer: str, code: str, message: str, hint: str = "",
            *, at_key: bool = False, related: tuple[Related, ...] = ()) -> None:
    line, col = source.map.locate(pointer, prefer_key=at_key)
    merge.diagnostics.append(Diagnostic(code=code, severity="error", message=message, hint=hint,
                                        pointer=pointer, file=source.file, line=line, col=col,
                                        related=related))

