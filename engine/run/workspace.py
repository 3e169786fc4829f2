"""The run's workspace: the one folder a run may write to, with paths confined to it.

SOP files are shared and untrusted, so every artifact path is checked: no absolute paths,
no `..`, no way out through a symlink (the resolved target must stay under the root), and
no writing through a symlink at all, and nothing into `.sopctl/` (the run's own journal and
lock: an artifact there could replace them; the checker refuses literal paths, this refuses
rendered ones). Writes are atomic (temp file + rename) and skipped
when the file already holds the same bytes, so a resumed run leaves finished files alone.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath

from engine.errors import RunError
from engine.load.spec import ENGINE_DIR, in_engine_dir

__all__ = ["WorkspaceError", "Workspace", "WrittenFile", "sha256_text"]


MAX_PATH_CHARS = 512


MAX_NAME_BYTES = 255
"""The longest file or folder name common file systems take (NAME_MAX on Linux and macOS)."""


class WorkspaceError(RunError):
    """A path that would leave the workspace, or a file that cannot be written there."""


@dataclass(frozen=True)
class WrittenFile:
    path: str          # relative to the workspace, with forward slashes
    sha256: str
    changed: bool      # False when the file already had this content


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Workspace:
    """A confined folder; `write` is the only way an SOP puts a file on disk."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()

    def create(self) -> None:
        """Make the folder (and parents); a file in the way is a clear error."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WorkspaceError(f"cannot create workspace {self.root}: {exc.strerror or exc}") from None
        if not self.root.is_dir():
            raise WorkspaceError(f"workspace {self.root} is not a folder")

    def confine(self, rel: str) -> Path:
        """The absolute path of `rel` inside the workspace, or WorkspaceError naming it.

        One `realpath` does the symlink check: with no symlink on the way it equals the
        lexical path (the root is already resolved), so any difference is a symlink, and
        any symlink is refused, whether it leads outside or not.
        """
        # Plain strings, not Path objects: this runs for every artifact written. Both sides are
        # normalised (the root is resolved, `parts` has no `.`, `..` or empty names).
        root = str(self.root)
        target = os.path.join(root, *_check_syntax(rel).parts)
        real = os.path.realpath(target)
        if real != target:
            outside = real != root and not real.startswith(root.rstrip(os.sep) + os.sep)
            where = " and leads outside the workspace" if outside else ""
            raise WorkspaceError(f"artifact path '{rel}' goes through a symlink{where}; refused")
        return Path(target)

    def write(self, rel: str, content: str) -> WrittenFile:
        """Write atomically; unchanged content is not rewritten (same mtime, same inode)."""
        target = self.confine(rel)
        digest = sha256_text(content)
        norm = PurePosixPath(rel).as_posix()
        try:   # every OSError here (a name too long, a permission) is the workspace's refusal
            if target.is_dir():
                raise WorkspaceError(f"artifact path '{rel}' is a folder")
            if target.is_file() and _file_sha256(target) == digest:
                return WrittenFile(norm, digest, changed=False)
            if not target.parent.is_dir():
                target.parent.mkdir(parents=True, exist_ok=True)
                self.confine(rel)  # a folder created meanwhile must not be a symlink either
            _atomic_write(target, content)
        except OSError as exc:
            raise WorkspaceError(f"cannot write artifact '{rel}': {exc.strerror or exc}") from None
        return WrittenFile(norm, digest, changed=True)


def _check_syntax(rel: str) -> PurePosixPath:
    """`rel` as a path, once it is known to be a plain relative path inside the workspace."""
    if not rel or not rel.strip():
        raise WorkspaceError("artifact path is empty")
    if len(rel) > MAX_PATH_CHARS:
        raise WorkspaceError(f"artifact path is longer than {MAX_PATH_CHARS} characters")
    if "\x00" in rel or "\\" in rel:
        raise WorkspaceError(f"artifact path '{rel}' contains a NUL or a backslash; use '/'")
    path = PurePosixPath(rel)  # built once: this runs for every artifact write
    if path.is_absolute() or _windows_drive(rel) or rel.startswith("~"):
        raise WorkspaceError(f"artifact path '{rel}' is absolute; paths are relative to the workspace")
    if ".." in path.parts:
        raise WorkspaceError(f"artifact path '{rel}' contains '..'; paths must stay in the workspace")
    if rel.endswith("/"):
        raise WorkspaceError(f"artifact path '{rel}' names a folder, not a file")
    longest = max((len(part.encode("utf-8", "surrogatepass")) for part in path.parts),
                  default=0)
    if longest > MAX_NAME_BYTES:
        raise WorkspaceError(f"artifact path '{rel}' has a name of {longest} bytes; file systems "
                             f"take at most {MAX_NAME_BYTES}")
    if in_engine_dir(rel):
        raise WorkspaceError(f"artifact path '{rel}' writes into {ENGINE_DIR}/, the folder of "
                             "sopctl's own journal and lock; refused")
    return path


def _windows_drive(rel: str) -> bool:
    """`C:x` names a drive on Windows (a UNC `//server` path is absolute already); the
    colon test first spares building a PureWindowsPath for every ordinary path."""
    return rel[1:2] == ":" and bool(PureWindowsPath(rel).drive)


def _file_sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


def _atomic_write(target: Path, content: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".sopctl-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(content)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
