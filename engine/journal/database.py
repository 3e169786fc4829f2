"""The journal's SQLite file: its tables, and how a connection to it is opened.

A journal (`<workspace>/.sopctl/journal.sqlite`) has four tables:

- `meta`: schema version, the SOP's name and hash, engine version, creation time;
- `events`: every run event of `engine.run.events`, in order (seq, ts, type, key, json);
  append-only (triggers refuse UPDATE and DELETE);
- `answers`: every model answer by its position (`engine.models.types.answer_key`: the hash
  of its canonical request, where in the run it was asked and its occurrence there; a
  journal from before positions holds bare hashes), so that `resume` never pays for an
  answered request twice and `replay` never calls a model at all; a tool's result and a
  person's answer under keys of their own;
- `exchanges`: what was sent for each model answer (the rendered messages, system and user,
  every re-ask's conversation), by the same hash, written in the answer's transaction;
  JSON, zlib-compressed when longer than EXCHANGE_COMPRESS_AT characters (codec.py).
  Journals from before it have no such table and read as having no prompts
  (`JournalReader.exchanges`).

Every connection is in autocommit mode; a writer's is in WAL mode and starts at
`synchronous=FULL`; a reader's is read-only, or `immutable` on a read-only medium.
"""

from __future__ import annotations

import os
import sqlite3
from functools import cache
from pathlib import Path

from engine import diskcache
from engine.journal.run_folder import OPEN_OWN, datasync, journal_path, writer_active
from engine.journal.sqlite_errors import failure_kind

__all__ = ["SCHEMA_VERSION", "SCHEMA", "connect", "connect_readonly", "never_started", "place_empty"]


SCHEMA_VERSION = 1


SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    seq  INTEGER PRIMARY KEY AUTOINCREMENT,
    ts   REAL NOT NULL,
    type TEXT NOT NULL,
    key  TEXT,
    json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_key ON events(key) WHERE key IS NOT NULL;
CREATE TRIGGER IF NOT EXISTS events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'journal events are append-only'); END;
CREATE TRIGGER IF NOT EXISTS events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'journal events are append-only'); END;
CREATE TABLE IF NOT EXISTS answers (
    request_hash      TEXT PRIMARY KEY,
    action            TEXT NOT NULL,
    text              TEXT NOT NULL,
    prompt_tokens     INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cost_usd          REAL NOT NULL,
    model             TEXT NOT NULL,
    seconds           REAL NOT NULL,
    origin            TEXT NOT NULL,
    seq               INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS exchanges (
    request_hash TEXT PRIMARY KEY,
    data         BLOB NOT NULL
);
"""


def place_empty(path: Path) -> bool:
    """Put a new journal at `path`, its tables made and in WAL mode, in one step: an unnamed
    file (O_TMPFILE) written with the image of an empty journal, fsynced, then linked in
    under `path` (never over a file there: a journal made meanwhile is kept). True when
    `path` holds a journal now; False where this system cannot do it (no O_TMPFILE, no
    /proc, Python 3.10 without `serialize`), and `connect` then makes it itself.

    Why: SQLite making a new file switches it to WAL through a rollback journal of its own
    (a fifth file, made and deleted, and four fsyncs) and writes every table's pages into
    the first commit, about a millisecond of CPU of every run. The image is SQLite's own (an
    in-memory database with the tables, `serialize`d) with the header's two format bytes
    set to 2, as `journal_mode = WAL` sets them (sqlite.org/fileformat2.html, offsets 18-19);
    its directory entry is fsynced with the WAL's, which SQLite makes next."""
    image, tmpfile = _empty_image(), getattr(os, "O_TMPFILE", 0)
    if image is None or not tmpfile or not os.path.isdir("/proc/self/fd"):
        return False
    try:
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | OPEN_OWN)
    except OSError:
        return False
    try:
        handle = os.open(path.parent, os.O_WRONLY | tmpfile | os.O_CLOEXEC, 0o644)
    except OSError:                      # a file system without unnamed files
        os.close(folder)
        return False
    try:
        with open(handle, "wb", closefd=False) as out:
            out.write(image)
        datasync(handle)
        os.link(f"/proc/self/fd/{handle}", path.name, dst_dir_fd=folder, follow_symlinks=True)
    except FileExistsError:              # another run made it first: that one is the journal
        return True
    except OSError:
        return False
    finally:
        os.close(handle)
        os.close(folder)
    return True


@cache
def _empty_image() -> bytes | None:
    """The bytes of an empty journal in WAL mode (see `place_empty`), from the on-disk cache
    when it holds them; None before Python 3.11 (no `serialize`)."""
    key = diskcache.entry_key("journal", sqlite3.sqlite_version, SCHEMA) if diskcache.cache_dir() else ""
    stored = diskcache.read("journal", key) if key else None
    if stored is not None and stored[:16] == b"SQLite format 3\x00" and stored[18:20] == b"\x02\x02":
        return stored
    memory = sqlite3.connect(":memory:")
    try:
        serialize = getattr(memory, "serialize", None)
        if serialize is None:
            return None
        memory.executescript(SCHEMA)
        image = bytearray(serialize())
    finally:
        memory.close()
    image[18:20] = b"\x02\x02"       # file format write and read versions: WAL
    if key:
        diskcache.write("journal", key, bytes(image))
    return bytes(image)


def connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    """A connection in autocommit mode: each statement is its own committed transaction."""
    if readonly:
        return connect_readonly(path)
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=10, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("SELECT count(*) FROM sqlite_master").fetchone()   # fails fast on a torn file
    return conn


def connect_readonly(path: Path) -> sqlite3.Connection:
    """Read-only; on a read-only medium (no -shm can be made) fall back to `immutable`."""
    uri = path.resolve().as_uri()
    try:
        return _open_uri(f"{uri}?mode=ro")
    except sqlite3.OperationalError as exc:
        if failure_kind(exc) not in ("cantopen", "readonly"):
            raise
        return _open_uri(f"{uri}?immutable=1")


def _open_uri(uri: str) -> sqlite3.Connection:
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=10, check_same_thread=False)
    conn.execute("PRAGMA query_only = ON")
    conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    return conn


def never_started(workspace: str | Path) -> bool:
    """True when the journal in `workspace` holds no run yet: a process killed while creating
    it left a file without its tables (they are made in one transaction), or one without a
    single event or answer. Nothing was paid, so the run can be started afresh. A journal
    that cannot be read is not 'never started' (resume and show explain what is wrong)."""
    path = journal_path(workspace)
    if writer_active(workspace):
        return False
    try:
        conn = connect_readonly(path)
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "meta" not in tables:
                return True
            used = conn.execute("SELECT (SELECT count(*) FROM events) + (SELECT count(*) FROM answers)")
            return int(used.fetchone()[0]) == 0
        finally:
            conn.close()
    except sqlite3.Error:
        return False
