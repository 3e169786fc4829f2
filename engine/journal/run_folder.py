"""A run folder's own files: where the journal lives, planted-file refusal, the writer lock.

The run folder's own files (`.sopctl/`, the journal and its `-wal`/`-shm`, `writer.lock`)
are never followed through a symlink: a workspace can come from someone else (a shared or
unpacked folder), and a planted link would make a run write where it points. A `.sopctl`
that is a link or not a folder, or an own file that is a link, not a plain file, or has
another hard link, is a JournalError naming it. The writer lock is an flock on the
`.sopctl` folder itself, so replacing `writer.lock` (which only tells the holder's pid)
cannot let a second writer in.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

from engine.errors import JournalError
from engine.journal.sqlite_errors import explain, guard
from engine.load.spec import ENGINE_DIR

__all__ = ["JOURNAL_DIR", "JOURNAL_FILE", "OPEN_OWN", "datasync", "journal_path", "refuse_planted",
           "require_own", "own_folder", "open_own_file", "take_writer_lock", "writer_active"]


JOURNAL_DIR = ENGINE_DIR


JOURNAL_FILE = "journal.sqlite"


OPEN_OWN = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
"""How sopctl opens its own files: never through a link, never blocking on a FIFO."""


def datasync(fd: int) -> None:
    """fdatasync where there is one (a WAL that grew has its new size flushed too), else fsync."""
    sync = getattr(os, "fdatasync", None) or os.fsync
    sync(fd)


def journal_path(workspace: str | Path) -> Path:
    """Where a run's journal lives inside its workspace."""
    return Path(workspace) / JOURNAL_DIR / JOURNAL_FILE


def _lock_file(path: Path) -> Path:
    return path.with_name("writer.lock")


def _own_files(path: Path) -> tuple[Path, ...]:
    """The files sopctl itself keeps beside the journal (SQLite makes the -wal and -shm)."""
    return (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm"),
            _lock_file(path))


def refuse_planted(path: Path, *, writing: bool) -> None:
    """Refuse a run folder whose own files were planted: links, or not what sopctl makes.

    A missing file is fine (sopctl creates it); a hard link is refused only for writing,
    since writing through it would change the other name's file too."""
    _require_kind(path.parent, stat.S_ISDIR, "a folder", writing=False)
    for own in _own_files(path):
        _require_kind(own, stat.S_ISREG, "a plain file", writing=writing)


def _require_kind(path: Path, is_kind: Callable[[int], bool], kind: str, *, writing: bool) -> None:
    hint = (f"sopctl never follows its own files ({JOURNAL_DIR}/) through a link; remove "
            f"{path} (a workspace from elsewhere must not bring its own {JOURNAL_DIR}/)")
    require_own(path, is_kind, kind, writing=writing, what="run folder", hint=hint)


def require_own(path: Path, is_kind: Callable[[int], bool], kind: str, *, writing: bool,
                what: str, hint: str) -> None:
    """Refuse `path` when it is a symlink, not of `kind`, or (for writing) a hard-linked file.

    A missing path is fine (sopctl creates it). `what` names the folder in the message (the
    run folder, the batch folder), `hint` says how to fix it."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise explain(exc, path, "check") from None
    if stat.S_ISLNK(info.st_mode):
        raise JournalError(f"{what} entry {path} is a symlink; refused", hint)
    if not is_kind(info.st_mode):
        raise JournalError(f"{what} entry {path} is not {kind}; refused", hint)
    if writing and stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        raise JournalError(f"{what} file {path} has {info.st_nlink} hard links; refused",
                           "writing it would change the other names' file too; copy the "
                           f"{what} instead of linking it")


def own_folder(path: Path, *, what: str, hint: str) -> Path:
    """`path` as a real folder of sopctl's, made if missing; a link or a file there is refused.

    `mkdir` never follows a link at the last name (it fails with EEXIST), and the check is
    repeated after it, so a link planted meanwhile is refused too."""
    require_own(path, stat.S_ISDIR, "a folder", writing=False, what=what, hint=hint)
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    except OSError as exc:
        raise JournalError(f"cannot create {what} folder {path}: {exc.strerror or exc}") from None
    require_own(path, stat.S_ISDIR, "a folder", writing=False, what=what, hint=hint)
    return path


def open_own_file(path: Path, flags: int, *, what: str, hint: str, mode: int = 0o644) -> int:
    """A descriptor of one of sopctl's own files, opened never through a link nor blocking
    on a FIFO; not a plain file, or (when opened for writing) one with another hard link, is
    refused. The check is on the opened descriptor, so nothing swapped in between counts."""
    try:
        handle = os.open(path, flags | OPEN_OWN, mode)
    except OSError as exc:
        if os.path.islink(path):
            raise JournalError(f"{what} entry {path} is a symlink; refused", hint) from None
        raise JournalError(f"cannot open {what} file {path}: {exc.strerror or exc}") from None
    info = os.fstat(handle)
    writing = bool(flags & (os.O_WRONLY | os.O_RDWR))
    if not stat.S_ISREG(info.st_mode) or (writing and info.st_nlink > 1):
        os.close(handle)
        kind = "not a plain file" if not stat.S_ISREG(info.st_mode) else f"has {info.st_nlink} hard links"
        raise JournalError(f"{what} file {path} {kind}; refused", hint)
    return handle


def take_writer_lock(path: Path) -> tuple[int, ...]:
    """An exclusive advisory lock held while a process writes the journal; its descriptors.

    The kernel drops it when the process dies, however it dies, so a crashed run never
    blocks its resume, while two live processes can never write one journal at once. It
    is taken on the `.sopctl` folder, not on a file in it: a file can be replaced by a new
    one (whose lock nobody holds), the folder of the journal being written cannot without
    moving the journal with it. `writer.lock` records the holder's pid; on a file system
    that cannot lock a folder (NFS emulates flock with write locks) the lock is on it.
    """
    if fcntl is None:            # no advisory locks on this platform: best effort
        return ()
    with guard(path, "lock"):
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | OPEN_OWN)
    held = [folder]
    try:
        folder_locked = _try_lock(folder, path)
        held.append(pid_file := _open_pid_file(_lock_file(path)))
        if not folder_locked and not _try_lock(pid_file, path):
            raise JournalError(f"cannot lock journal {path}: this file system has no flock",
                               "put the workspace on a local disk")
        with guard(path, "lock"):
            os.ftruncate(pid_file, 0)
            os.write(pid_file, str(os.getpid()).encode())
    except BaseException:
        for handle in held:
            os.close(handle)
        raise
    return tuple(held)


def _try_lock(handle: int, path: Path) -> bool:
    """Lock exclusively; False where the file system cannot, JournalError while another holds it."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = _read_pid(_lock_file(path))
        raise JournalError(f"journal {path} is being written by another process (pid {owner})",
                           "wait for that run to finish (or stop it) before resuming") from None
    except OSError:
        return False
    return True


def _open_pid_file(lock: Path) -> int:
    return open_own_file(lock, os.O_RDWR | os.O_CREAT, what="run folder",
                         hint=f"remove {lock}; sopctl makes it again")


def _read_pid(lock: Path) -> str:
    """The pid the lock's holder wrote, or `?` (the file is only informative)."""
    try:
        handle = os.open(lock, os.O_RDONLY | OPEN_OWN)
    except OSError:
        return "?"
    try:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            return "?"
        return os.read(handle, 32).decode("ascii", "replace").strip() or "?"
    finally:
        os.close(handle)


def writer_active(workspace: str | Path) -> bool:
    """True while some live process holds the journal's writer lock (the run is going on)."""
    path = journal_path(workspace)
    if fcntl is None:
        return False
    return (_held(path.parent, os.O_DIRECTORY)
            or _held(_lock_file(path), 0))          # where folders cannot be locked


def _held(path: Path, flags: int) -> bool:
    """Whether another process holds an exclusive flock on this folder or file."""
    try:
        handle = os.open(path, os.O_RDONLY | flags | OPEN_OWN)
    except OSError:
        return False
    try:
        if not (stat.S_ISDIR if flags else stat.S_ISREG)(os.fstat(handle).st_mode):
            return False
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(handle)         # closing drops the shared lock taken just to test
    return False
