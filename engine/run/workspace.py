"""The run's workspace: the one folder a run may write to, with paths confined to it.

SOP files are shared and untrusted, so every artifact path is checked: no absolute paths,
no `..`, no way out through a symlink (the resolved target must stay under the root), and
no writing through a symlink at all, and nothing into `.sopctl/` (the run's own journal and
lock: an artifact there could replace them; the checker refuses literal paths, this refuses
rendered ones). A write walks down from the root one folder descriptor at a time, opening
each folder with O_NOFOLLOW, so a symlink is refused where it is met, even one swapped in
after a check. Writes are atomic (temp file + rename) and skipped when the file already
holds the same bytes, so a resumed run leaves finished files alone. New files get the
ordinary mode (0o666 less the umask), as from any program that writes source files.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import os
import stat
from collections.abc import Callable
from contextlib import suppress
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
        self._root_id: tuple[int, int] | None = None   # (st_dev, st_ino) of the root last checked

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
            raise _symlink_refusal(rel, root, real)
        return Path(target)

    def write(self, rel: str, content: str | bytes) -> WrittenFile:
        """Write atomically; unchanged content is not rewritten (same mtime, same inode).
        Text is written as UTF-8; bytes as they are (a notebook's image)."""
        path = _check_syntax(rel)
        data = content if isinstance(content, bytes) else content.encode("utf-8")
        if not path.parts:   # `.`: the root itself
            raise WorkspaceError(f"artifact path '{rel}' is a folder")
        try:   # every OSError here (a name too long, a permission) is the workspace's refusal
            if _DIR_FDS:
                changed = self._write_at(rel, path.parts, data)
            else:
                changed = self._write_by_path(rel, data)
        except OSError as exc:
            raise WorkspaceError(f"cannot write artifact '{rel}': {exc.strerror or exc}") from None
        return WrittenFile(path.as_posix(), hashlib.sha256(data).hexdigest(), changed)

    def _write_at(self, rel: str, parts: tuple[str, ...], data: bytes) -> bool:
        """Walk down from the root by folder descriptors, never following a symlink.

        Each folder is opened relative to the one above it with O_NOFOLLOW, so there is no
        window between checking a path and using it (a symlink swapped in mid-path is refused
        at the open), and no per-component `lstat` as `realpath` does.
        """
        def refusal() -> WorkspaceError:
            return self._symlink_error(rel, parts)

        fd = self._open_root(refusal)
        try:
            for name in parts[:-1]:
                child = _open_folder(fd, name, refusal)
                os.close(fd)
                fd = child
            return _put(fd, parts[-1], data, rel, refusal)
        finally:
            os.close(fd)

    def _open_root(self, refusal: Callable[[], WorkspaceError]) -> int:
        """A descriptor of the root; it is checked again only when it is not the folder
        seen last time (a root swapped for a symlink, or one of its parents)."""
        root = str(self.root)
        try:
            fd = os.open(root, _FOLDER_FLAGS)
        except FileNotFoundError:   # written before `create`: make it, as `create` would
            os.makedirs(root, exist_ok=True)
            fd = os.open(root, _FOLDER_FLAGS)
        except OSError:
            if os.path.islink(root):
                raise refusal() from None
            raise
        try:
            seen = os.fstat(fd)
            if (seen.st_dev, seen.st_ino) != self._root_id:
                if os.path.realpath(root) != root or not os.path.samestat(seen, os.stat(root)):
                    raise refusal()
                self._root_id = (seen.st_dev, seen.st_ino)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _symlink_error(self, rel: str, parts: tuple[str, ...]) -> WorkspaceError:
        """The refusal `confine` gives; whether the link leads outside is worked out only here."""
        root = str(self.root)
        return _symlink_refusal(rel, root, os.path.realpath(os.path.join(root, *parts)))

    def _write_by_path(self, rel: str, data: bytes) -> bool:
        """Where the OS has no `dir_fd` calls (Windows): `confine`, then plain paths."""
        target = self.confine(rel)
        if target.is_dir():
            raise WorkspaceError(f"artifact path '{rel}' is a folder")
        if target.is_file() and _read_or_none(target) == data:
            return False
        if not target.parent.is_dir():
            target.parent.mkdir(parents=True, exist_ok=True)
            self.confine(rel)  # a folder created meanwhile must not be a symlink either
        _replace(None, str(target), data)
        return True


def _symlink_refusal(rel: str, root: str, real: str) -> WorkspaceError:
    outside = real != root and not real.startswith(root.rstrip(os.sep) + os.sep)
    where = " and leads outside the workspace" if outside else ""
    return WorkspaceError(f"artifact path '{rel}' goes through a symlink{where}; refused")


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


_DIR_FDS = (all(call in os.supports_dir_fd for call in (os.open, os.stat, os.mkdir, os.rename, os.unlink))
            and os.stat in os.supports_follow_symlinks
            and hasattr(os, "O_NOFOLLOW") and hasattr(os, "O_DIRECTORY"))
"""Whether the descriptor-relative write path works here (POSIX: yes; Windows: no)."""

# Every open: never through a symlink, not inherited by exec'd commands, no newline translation.
_ALWAYS = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
_FOLDER_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _ALWAYS
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | _ALWAYS   # a FIFO must not block
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _ALWAYS
_NEW_MODE = 0o666
"""Less the umask, as any program that creates a file: generated code is ordinary files."""

_TEMP_NUMBERS = itertools.count()


def _open_folder(parent: int, name: str, refusal: Callable[[], WorkspaceError]) -> int:
    """The folder `name` under `parent`, made if missing; a symlink is refused, never followed."""
    try:
        return os.open(name, _FOLDER_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        with suppress(FileExistsError):   # made meanwhile: the open below checks what it is
            os.mkdir(name, dir_fd=parent)
    except OSError:
        _refuse_a_link(parent, name, refusal)
        raise
    try:
        return os.open(name, _FOLDER_FLAGS, dir_fd=parent)
    except OSError:
        _refuse_a_link(parent, name, refusal)
        raise


def _refuse_a_link(parent: int, name: str, refusal: Callable[[], WorkspaceError]) -> None:
    """After a failed open: a symlink there is the workspace's refusal (Linux says ENOTDIR,
    others ELOOP or EMLINK); anything else (a file in the way, a permission) stays an OSError."""
    with suppress(OSError):
        if stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
            raise refusal() from None


def _put(folder: int, name: str, data: bytes, rel: str,
         refusal: Callable[[], WorkspaceError]) -> bool:
    """Write `data` as `name` in `folder` unless it holds it already; whether it wrote."""
    try:
        seen = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        seen = None
    if seen is not None:
        if stat.S_ISLNK(seen.st_mode):
            raise refusal()
        if stat.S_ISDIR(seen.st_mode):
            raise WorkspaceError(f"artifact path '{rel}' is a folder")
        # Only a regular file is read: a FIFO or a device could block or never end. Anything
        # else in the way is replaced by the rename (which opens nothing).
        if stat.S_ISREG(seen.st_mode) and seen.st_size == len(data) and _holds(folder, name, data):
            return False
    _replace(folder, name, data)
    return True


def _holds(folder: int, name: str, data: bytes) -> bool:
    """Whether the regular file `name` holds exactly `data` (any doubt: no, so it is rewritten)."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=folder)
    except OSError:
        return False
    try:   # checked again on the open file: it may have been swapped since the stat
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, len(data) + 1) == data
    except OSError:
        return False
    finally:
        os.close(fd)


def _replace(folder: int | None, name: str, data: bytes) -> None:
    """Atomic: a new temp file beside `name`, then a rename over it. `name` is relative to
    the descriptor `folder`, or a whole path when `folder` is None (the portable path)."""
    temp, fd = _temp_file(folder, os.path.dirname(name))
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(temp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with suppress(OSError):
            os.unlink(temp, dir_fd=folder)
        raise


def _temp_file(folder: int | None, parent: str) -> tuple[str, int]:
    """A new file with a name no other writer uses (pid + counter); O_EXCL never reuses one,
    so a name left by a killed process with the same pid is just skipped."""
    for _ in range(100):
        temp = os.path.join(parent, f".sopctl-{os.getpid()}-{next(_TEMP_NUMBERS)}.tmp")
        try:
            return temp, os.open(temp, _NEW_FLAGS, _NEW_MODE, dir_fd=folder)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free name for a temporary file")


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None
