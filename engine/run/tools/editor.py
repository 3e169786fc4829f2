"""The `editor` toolset: files confined to the run's workspace (MetaGPT's Editor)."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from engine.load.spec import ENGINE_DIR
from engine.run.tools.base import Outcome, ToolError
from engine.run.workspace import Workspace, WorkspaceError, WrittenFile

__all__ = ["Editor", "MAX_LIST_ENTRIES", "MAX_SEARCH_HITS", "MAX_READ_BYTES"]


MAX_LIST_ENTRIES = 500


MAX_SEARCH_HITS = 200


MAX_READ_BYTES = 2_000_000
"""A file larger than this is not read, listed for search, or replaced into."""


class Editor:
    """`editor.*`: each `do_` method is one command (`editor.read` -> `do_read`)."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace

    def _path(self, rel: str, *, folder: bool = False) -> Path:
        if folder and rel.strip() in (".", "./", ""):
            return self.workspace.root
        try:
            return self.workspace.confine(rel.rstrip("/") if folder else rel)
        except WorkspaceError as exc:
            raise ToolError(exc.message) from None

    def _write(self, rel: str, content: str) -> WrittenFile:
        try:
            return self.workspace.write(rel, content)
        except WorkspaceError as exc:
            raise ToolError(exc.message) from None

    def _text(self, rel: str) -> str:
        path = self._path(rel)
        if not path.is_file():
            raise ToolError(f"no file {rel} in the workspace")
        if path.stat().st_size > MAX_READ_BYTES:
            raise ToolError(f"{rel} is larger than {MAX_READ_BYTES} bytes")
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ToolError(f"cannot read {rel}: {exc}") from None

    async def do_write(self, path: str, content: str) -> Outcome:
        written = self._write(path, content)
        return Outcome(f"wrote {written.path} ({len(content.splitlines())} lines)",
                       files={written.path: content})

    async def do_read(self, path: str) -> str:
        text = self._text(path)
        return "\n".join(f"{n}|{line}" for n, line in enumerate(text.splitlines(), 1)) or "(empty file)"

    async def do_replace(self, path: str, old: str, new: str) -> Outcome:
        text = self._text(path)
        count = text.count(old) if old else 0
        if count != 1:
            raise ToolError(f"`old` occurs {count} times in {path}; it must occur exactly once "
                            "(give more of the surrounding text)")
        content = text.replace(old, new, 1)
        written = self._write(path, content)
        return Outcome(f"replaced 1 occurrence in {written.path}", files={written.path: content})

    async def do_list(self, path: str = ".") -> str:
        files = self._files(path)
        shown = files[:MAX_LIST_ENTRIES]
        more = f"\n[{len(files) - len(shown)} more not shown]" if len(files) > len(shown) else ""
        return ("\n".join(shown) or "(no files)") + more

    async def do_search(self, term: str, path: str = ".") -> str:
        if not term:
            raise ToolError("`term` is empty")
        hits: list[str] = []
        for rel in self._files(path):
            try:
                text = (self.workspace.root / rel).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            hits += [f"{rel}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1) if term in line]
            if len(hits) > MAX_SEARCH_HITS:
                return "\n".join(hits[:MAX_SEARCH_HITS]) + f"\n[more than {MAX_SEARCH_HITS} matches; narrow the search]"
        return "\n".join(hits) or f"no line contains {term!r}"

    def _files(self, rel: str) -> list[str]:
        """Files under a workspace folder (never sopctl's own, never through a symlink)."""
        root = self.workspace.root
        base = self._path(rel, folder=True)
        if not base.is_dir():
            raise ToolError(f"no folder {rel} in the workspace")
        found: list[str] = []
        for folder, dirs, names in os.walk(base, followlinks=False):
            dirs[:] = sorted(d for d in dirs if not (Path(folder) == root and d == ENGINE_DIR))
            for name in sorted(names):
                path = Path(folder) / name
                if path.is_file() and not path.is_symlink() and path.stat().st_size <= MAX_READ_BYTES:
                    found.append(PurePosixPath(path.relative_to(root).as_posix()).as_posix())
            if len(found) > MAX_LIST_ENTRIES * 4:
                break
        return found
