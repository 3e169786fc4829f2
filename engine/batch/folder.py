"""A batch folder's own entries, never followed through a link.

A batch folder is often someone else's (a shared or unpacked one rerun to finish it, as the
README invites), so everything a batch writes there gets the run folder's treatment
(`engine.journal.run_folder`): `rows/`, each row's `rows/NNNNNN/` (its workspace, journal,
lock and artifacts), `results.jsonl` and its temporary twin. A symlink planted at any of
them, or a file where a folder belongs, is refused with a message naming it, before
anything is written; a hard-linked `results.jsonl` is refused for writing. Only the batch
folder itself (`--out`, the user's own choice) may be reached through a link.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from engine.errors import JournalError
from engine.journal.run_folder import open_own_file, own_folder, require_own

__all__ = ["ROWS_DIR", "rows_folder", "row_folder", "check_row_folder", "open_batch_file",
           "check_batch_file", "remove_batch_file"]

ROWS_DIR = "rows"
_WHAT = "batch folder"


def _hint(path: Path) -> str:
    return (f"sopctl never follows a batch folder's own entries (rows/, rows/NNNNNN/, "
            f"results.jsonl) through a link; remove {path}, or give another --out")


def rows_folder(out: Path) -> Path:
    """`out/rows`, a real folder (made if missing)."""
    path = out / ROWS_DIR
    return own_folder(path, what=_WHAT, hint=_hint(path))


def row_folder(out: Path, name: str) -> Path:
    """`out/rows/<name>`, a real folder in a real `rows/` (both made if missing)."""
    path = rows_folder(out) / name
    return own_folder(path, what=_WHAT, hint=_hint(path))


def check_row_folder(out: Path, name: str) -> Path:
    """`out/rows/<name>` when neither it nor `rows/` is a link or a file (it may be missing)."""
    path = out / ROWS_DIR / name
    for entry in (path.parent, path):
        require_own(entry, stat.S_ISDIR, "a folder", writing=False, what=_WHAT, hint=_hint(entry))
    return path


def check_batch_file(path: Path, *, writing: bool) -> bool:
    """Whether the batch's own file `path` is there; a link or not a plain file is refused."""
    require_own(path, stat.S_ISREG, "a plain file", writing=writing, what=_WHAT, hint=_hint(path))
    return os.path.lexists(path)


def open_batch_file(path: Path, flags: int) -> int:
    """A descriptor of the batch's own file, opened without following a link (see
    `open_own_file`: a link, a FIFO, a hard-linked file for writing are refused)."""
    return open_own_file(path, flags, what=_WHAT, hint=_hint(path))


def remove_batch_file(path: Path) -> None:
    """Remove a leftover of the batch's own (unlinking removes a link, never its target)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        check_batch_file(path, writing=True)      # a folder there: say so
        raise JournalError(f"cannot remove {path}: {exc.strerror or exc}", _hint(path)) from None
