"""A new journal placed from the image of an empty one (`database.place_empty`), against the
one SQLite makes itself: the same tables, WAL mode, never over a journal that is there."""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

import pytest

from engine.journal import database
from engine.journal.database import SCHEMA, connect, place_empty
from engine.journal.store import Journal
from engine.models.types import StoredAnswer

needs_tmpfile = pytest.mark.skipif(
    sys.version_info < (3, 11) or not hasattr(os, "O_TMPFILE") or not os.path.isdir("/proc/self/fd"),
    reason="the image needs sqlite3's serialize (3.11), O_TMPFILE and /proc (Linux)")


def _tables(path: Path) -> list[tuple[str, str, str]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
    finally:
        conn.close()


def _made_by_sqlite(path: Path) -> Path:
    """A journal file as `connect` makes one where no image can be placed."""
    conn = connect(path, readonly=False)
    conn.executescript(SCHEMA)
    conn.close()
    return path


@needs_tmpfile
def test_a_placed_journal_is_the_one_sqlite_makes_in_wal_mode(tmp_path: Path) -> None:
    placed = tmp_path / "placed.sqlite"
    assert place_empty(placed)
    assert _tables(placed) == _tables(_made_by_sqlite(tmp_path / "made.sqlite"))
    assert placed.stat().st_nlink == 1                       # an unnamed file linked once
    conn = sqlite3.connect(placed)                           # as it is: no mode set on opening
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        conn.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["made.sqlite", "placed.sqlite"]


@needs_tmpfile
def test_a_journal_already_there_is_never_replaced(tmp_path: Path) -> None:
    with Journal.create(tmp_path, sop_name="x", sop_hash="h") as journal:
        journal.record("k", "Write", StoredAnswer("kept", 1, 1, 0.0))
        path = journal.path
    before = path.read_bytes()
    assert place_empty(path)                                 # it holds a journal: that one
    assert path.read_bytes() == before
    with Journal.open(tmp_path) as reread:
        assert reread.lookup("k") is not None


def test_without_unnamed_files_sqlite_makes_the_journal_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "O_TMPFILE", raising=False)
    assert not place_empty(tmp_path / "j.sqlite")
    assert not (tmp_path / "j.sqlite").exists()
    with Journal.create(tmp_path, sop_name="x", sop_hash="h") as journal:
        journal.record("k", "Write", StoredAnswer("made", 1, 1, 0.0))
    with Journal.open(tmp_path) as reread:
        assert reread.lookup("k") is not None


@needs_tmpfile
def test_a_corrupt_image_in_the_disk_cache_is_made_again(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOPCTL_CACHE_DIR", str(tmp_path / "cache"))
    database._empty_image.cache_clear()
    try:
        image = database._empty_image()
        assert image is not None
        key = database.diskcache.entry_key("journal", sqlite3.sqlite_version, SCHEMA)
        database.diskcache.write("journal", key, b"not a database")
        database._empty_image.cache_clear()
        assert database._empty_image() == image
    finally:
        database._empty_image.cache_clear()
