"""Folders for a benchmark's runs, kept until the benchmark ends, outside /tmp.

Why: when ext4 makes a file it skips the inodes freed in the last minute or more, reading
each one it passes. A harness that deletes every run's workspace as soon as the run ends
(and a test suite that did the same minutes before, in the same /tmp) makes the next runs'
file creations pay for those deletions: on this project's machines, making a small file in
/tmp cost 0.1-0.7 ms of CPU against 15 us in a folder where nothing was deleted (the
figures vary with what was deleted before). Both engines' runs make their files in folders
under one work folder in bench/.cache that nothing deletes until the benchmark ends, as
files are made in a user's project; the kernel time a run spends is then its own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["WORK_ENV", "scratch", "work_root"]

WORK_ENV = "SOPCTL_BENCH_WORK"
"""The work folder of the benchmark in progress (children of the bench read it too)."""

_CACHE = Path(__file__).resolve().parent / ".cache"


@contextlib.contextmanager
def work_root() -> Iterator[Path]:
    """A new work folder under bench/.cache for the runs inside the block (nested blocks use
    the outer one); removed, with every run's folder, when the block ends."""
    if os.environ.get(WORK_ENV):
        yield Path(os.environ[WORK_ENV])
        return
    _CACHE.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="work-", dir=_CACHE))
    os.environ[WORK_ENV] = str(root)
    try:
        yield root
    finally:
        os.environ.pop(WORK_ENV, None)
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[str]:
    """A new folder for one run: in the work folder while there is one (left there until the
    work folder goes), else a temporary folder removed after the block."""
    root = os.environ.get(WORK_ENV)
    if root and Path(root).is_dir():
        yield tempfile.mkdtemp(prefix=prefix, dir=root)
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        yield folder
