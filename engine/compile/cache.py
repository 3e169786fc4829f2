"""Compiled SOP files kept on disk (`engine.diskcache`), so that a new process running
an unchanged file skips loading the YAML and every check.

An entry is keyed by everything the compiled result depends on: the file's bytes, the path as
given and the current folder (diagnostics name files that way), the `--include-path`
folders, and the engine's code and the versions of the libraries whose objects it holds.
The experience files the run plan read are read again on a hit: any difference is a miss.
What the file includes is only known once it is loaded, so the entry records each library's
sha256 and where each `include:` resolves to; a hit re-reads the libraries and re-resolves
the includes, and any difference (a library edited, added, removed or shadowed by a new file
in an earlier folder) is a miss. Only files that compiled are stored; a file with errors is
checked again each time, with every diagnostic.
"""

from __future__ import annotations

import hashlib
import pickle
import sys
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from engine import diskcache
from engine.compile.plan import experience_unchanged
from engine.load.source import MAX_FILE_BYTES, Source

__all__ = ["lookup", "store"]

_KIND = "sop"


def lookup(path: str | Path, include_dirs: tuple[str | Path, ...]) -> Any | None:
    """The CheckResult stored for this file as it is now, or None (a miss)."""
    raw = _plain_bytes(Path(path)) if diskcache.cache_dir() is not None else None
    key = _key(path, include_dirs, raw) if raw is not None else ""
    payload = diskcache.read(_KIND, key) if key else None
    if payload is None:
        return None
    try:
        state, result = pickle.loads(payload)
        compiled = result.compiled
        if compiled is None or compiled.source is None or state != _state(compiled.source, path, include_dirs):
            return None
        if not experience_unchanged(compiled.plan, compiled.file):   # read at compile time
            return None
    except Exception:  # noqa: BLE001 - an entry that does not load as ours is a miss
        return None
    compiled = replace(compiled, output_schemas=MappingProxyType(dict(compiled.output_schemas)))
    return replace(result, compiled=compiled)


def store(path: str | Path, include_dirs: tuple[str | Path, ...], result: Any) -> Any:
    """`result`, stored for the next process when the file compiled; returned unchanged."""
    compiled = result.compiled
    if compiled is None or not result.ok or compiled.source is None:
        return result
    if diskcache.cache_dir() is None:
        return result
    # Keyed by the bytes it was compiled from (not the file read again: it may have changed).
    key = _key(path, include_dirs, compiled.source.raw)
    state = _state(compiled.source, path, include_dirs, stored=True)
    if state is None:
        return result
    try:
        plain = replace(result, compiled=replace(compiled, output_schemas=dict(compiled.output_schemas)))
        diskcache.write(_KIND, key, pickle.dumps((state, plain), protocol=pickle.HIGHEST_PROTOCOL))
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        pass  # not cached: the next process compiles it again
    return result


def _key(path: str | Path, include_dirs: tuple[str | Path, ...], raw: bytes) -> str:
    """The entry's key for the file's bytes `raw`, and the libraries whose objects it holds."""
    roots = "\0".join(str(Path(d).resolve()) for d in include_dirs)
    return diskcache.entry_key(_KIND, str(path), str(Path.cwd()), roots,
                               diskcache.package_stamp("pydantic", "pydantic_core", "networkx", "jinja2"), raw)


def _plain_bytes(path: Path) -> bytes | None:
    try:
        if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            return None
        return path.read_bytes()
    except OSError:
        return None


def _state(source: Source, path: str | Path, include_dirs: tuple[str | Path, ...],
           stored: bool = False) -> tuple[Any, ...] | None:
    """What the compiled file depends on besides its own bytes: each library's sha256, and
    where each `include:` of each file resolves to (the first folder that has it). `stored`:
    the state to store, from the bytes compiled; None if an include resolves now to a file
    that was not compiled in (one appeared meanwhile: not stored). Else: as the disk is now."""
    roots = tuple(Path(d).resolve() for d in include_dirs)
    libraries = tuple((lib.file, hashlib.sha256(lib.raw).hexdigest() if stored else _sha256(lib.file))
                      for lib in source.included)
    folders = [Path(path).resolve().parent] + [Path(lib.file).resolve().parent for lib in source.included]
    resolved = tuple(_resolutions(s, folder, roots) for s, folder in zip((source, *source.included), folders, strict=False))
    used = {str(Path(lib.file).resolve()) for lib in source.included}
    if stored and any(hit not in used for hits in resolved for hit in hits):
        return None
    return (sys.version_info[:2], libraries, resolved)


def _resolutions(source: Source, folder: Path, roots: tuple[Path, ...]) -> tuple[str, ...]:
    entries = source.data.get("include")
    if not isinstance(entries, list):
        return ()
    found = []
    for entry in entries:
        hit = ""
        if isinstance(entry, str):
            for root in (folder, *roots):
                candidate = (root / entry).resolve()
                if candidate.exists():
                    hit = str(candidate)
                    break
        found.append(hit)
    return tuple(found)


def _sha256(file: str) -> str:
    raw = _plain_bytes(Path(file))
    return "" if raw is None else hashlib.sha256(raw).hexdigest()
