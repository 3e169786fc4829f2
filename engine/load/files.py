"""Reading a file sopctl is pointed at, bounded: a regular file only, at most N bytes.

A FIFO or a device named as an input, an answer or an experience file could block forever
(a FIFO with no writer) or never end (`/dev/zero`), and a huge file would go whole into a
prompt or a journal. So the file is opened without blocking, refused unless `fstat` says it
is a regular file, and read up to its limit plus one byte, which tells "too large" apart
without reading the rest.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

__all__ = ["FileRefused", "beside_refusal", "open_regular", "read_beside", "read_bounded"]


class FileRefused(ValueError):
    """Why a file was not read, said for a person (the caller adds which flag or key named it)."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message, self.hint = message, hint


def read_bounded(path: str | os.PathLike[str], limit: int, *, follow_links: bool = True,
                 single_link: bool = False) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them; FileRefused otherwise.
    With `follow_links=False` a symlink at the last name is refused too; with `single_link`
    a file with another hard link (a name elsewhere, maybe outside a shared folder) is."""
    fd = open_regular(path, follow_links=follow_links, single_link=single_link)
    try:
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise FileRefused(f"cannot read the file: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise FileRefused(f"the file is larger than {limit:,} bytes",
                          "pass a smaller file, or the part that is needed")
    return data


def open_regular(path: str | os.PathLike[str], *, follow_links: bool = True,
                 single_link: bool = False) -> int:
    """A descriptor of the regular file at `path` (see `read_bounded`), for a caller that
    streams it; FileRefused for anything else, without ever waiting on a FIFO."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise FileRefused(f"cannot open the file: {exc.strerror or exc}") from None
    try:
        _require_plain(os.fstat(fd), single_link)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _require_plain(info: os.stat_result, single_link: bool) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise FileRefused("not a regular file", "name a file (not a folder, FIFO or device)")
    if single_link and info.st_nlink > 1:
        raise FileRefused(f"it has {info.st_nlink} hard links, so it may be a file from "
                          "outside the folder; refused", "copy the file instead of linking it")


def beside_refusal(rel: str, what: str) -> str:
    """Why `rel`, a file beside the SOP that `what` names (`file('x.md')`, `experience file
    'x.md'`), is refused before anything is read ('' when it is not): a shared file may name
    only files inside its own folder."""
    if not rel or rel.startswith("/") or "\\" in rel or "://" in rel or rel[1:2] == ":":
        return f"{what} must be a relative path with / separators"
    if ".." in PurePosixPath(rel).parts:
        return f"{what} leaves the SOP's folder (..)"
    return ""


def read_beside(folder: Path, rel: str, what: str, limit: int) -> str:
    """The UTF-8 text of `rel` inside `folder`, at most `limit` bytes: no symlink out, no
    second hard link (a name planted in a shared folder could show an outside file), a
    regular file only; FileRefused saying why otherwise."""
    problem = beside_refusal(rel, what)
    if problem:
        raise FileRefused(problem)
    folder = folder.resolve()
    path = (folder / rel).resolve()
    if not path.is_relative_to(folder):
        raise FileRefused(f"{what} leaves the SOP's folder through a symlink")
    try:
        data = read_bounded(path, limit, single_link=True)
    except FileRefused as exc:
        raise FileRefused(f"cannot read {what}: {exc.message}", exc.hint) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise FileRefused(f"{what} is not UTF-8 text") from None
