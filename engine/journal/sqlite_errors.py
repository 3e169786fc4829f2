"""SQLite and OS failures on a journal, as a JournalError a user can act on.

One place decides what a failure means (a full disk, a read-only workspace, a torn file,
another process holding it) from its errno, SQLite's error name, or (older Pythons) its
text, and what to do about it. `guard` wraps every database and file operation of the
journal; `naming` makes a damaged row's message say which journal it is in.
"""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.errors import JournalError

__all__ = ["DAMAGED", "NEWER", "OTHER_VERSION", "PROBLEMS", "failure_kind", "explain", "guard",
           "naming"]


DAMAGED = "the journal was damaged outside sopctl; start a new run, or restore the file from a backup"
NEWER = "the journal was written by a newer sopctl; upgrade sopctl"
OTHER_VERSION = "the journal was written by another sopctl version"


PROBLEMS: dict[str, tuple[str, str]] = {
    "full": ("the disk is full", "free some space, then continue with `sopctl resume`; "
             "nothing already journaled is lost"),
    "readonly": ("the workspace is read-only",
                 "choose a writable workspace (--out) or fix its permissions"),
    "corrupt": ("the file is torn or corrupted", DAMAGED),
    "cantopen": ("the file cannot be opened", "check that the folder exists and is writable"),
    "busy": ("another process holds it", "wait for the other sopctl process to finish"),
}
"""Each kind of failure: what it is, and what to do about it."""


_SQLITE_KINDS = {"SQLITE_FULL": "full", "SQLITE_READONLY": "readonly", "SQLITE_PERM": "readonly",
                 "SQLITE_NOTADB": "corrupt", "SQLITE_CORRUPT": "corrupt",
                 "SQLITE_CANTOPEN": "cantopen", "SQLITE_BUSY": "busy", "SQLITE_LOCKED": "busy"}


_ERRNO_KINDS = {errno.ENOSPC: "full", errno.EDQUOT: "full", errno.EROFS: "readonly",
                errno.EACCES: "readonly", errno.EPERM: "readonly"}


_TEXT_KINDS = (("full", "full"), ("readonly", "readonly"), ("not a database", "corrupt"),
               ("malformed", "corrupt"), ("unable to open", "cantopen"), ("locked", "busy"))


def failure_kind(exc: BaseException) -> str:
    """What went wrong, from the errno, SQLite's error name, or (older Pythons) the text."""
    if isinstance(exc, OSError):
        return _ERRNO_KINDS.get(exc.errno or 0, "")
    name = str(getattr(exc, "sqlite_errorname", ""))
    for prefix, kind in _SQLITE_KINDS.items():
        if name.startswith(prefix):
            return kind
    text = str(exc).lower()
    return next((kind for needle, kind in _TEXT_KINDS if needle in text), "")


def explain(exc: BaseException, path: Path, doing: str) -> JournalError:
    """One place that turns sqlite/OS failures into a message a user can act on."""
    kind = failure_kind(exc)
    if kind not in PROBLEMS:
        return JournalError(f"cannot {doing} journal {path}: {exc}")
    what, hint = PROBLEMS[kind]
    detail = f" ({exc})" if kind in ("corrupt", "cantopen", "busy") else ""
    return JournalError(f"cannot {doing} journal {path}: {what}{detail}", hint)


@contextmanager
def guard(path: Path, doing: str) -> Iterator[None]:
    """A sqlite or OS failure inside is raised as the JournalError `explain` makes of it."""
    try:
        yield
    except JournalError:
        raise
    except (sqlite3.Error, OSError) as exc:
        raise explain(exc, path, doing) from None


@contextmanager
def naming(path: Path) -> Iterator[None]:
    """A JournalError raised while reading the journal at `path` names the file (a damaged
    row's message alone does not say which run's journal it is in)."""
    try:
        yield
    except JournalError as exc:
        if str(path) in exc.message:
            raise
        newer = "newer sopctl" in exc.hint or "another sopctl version" in exc.hint
        state = "cannot be read by this sopctl" if newer else "is damaged"
        raise JournalError(f"journal {path} {state}: {exc.message}", exc.hint) from None
