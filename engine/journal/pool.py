"""The experience pool's file: accepted answers across runs, in one SQLite database.

`Pool.open(path)` creates the file, or opens one this module made; anything else (a file
that is not SQLite, a torn database, another program's database, a newer format) is a
`PoolError` naming the file: a corrupt pool is reported, never trusted. Entries are keyed
by the request (`engine.run.experience.request_key`); `score` starts at 1 and grows with
each reuse (+1) and each time an entry is offered as an example (+0.25), so `prune` keeps
the answers that earned their place. Used by `sopctl run --pool` and `sopctl pool`.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from engine.errors import PoolError
from engine.load.secrets import scrub, secret_values
from engine.run.experience import Experience, similarity

__all__ = ["Pool", "POOL_ENV", "DEFAULT_THRESHOLD", "FORMAT"]


POOL_ENV = "SOPCTL_POOL"


FORMAT = "sopctl-experience-pool/1"


DEFAULT_THRESHOLD = 0.8


_NEAR_CANDIDATES = 500
"""A near hit is looked for among this many most recent entries of the same action."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS pool_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS experience (
  id INTEGER PRIMARY KEY, action TEXT NOT NULL, key TEXT NOT NULL UNIQUE,
  signature TEXT NOT NULL, prompt TEXT NOT NULL, answer TEXT NOT NULL,
  score REAL NOT NULL DEFAULT 1, uses INTEGER NOT NULL DEFAULT 0,
  created REAL NOT NULL, last_used REAL NOT NULL);
CREATE INDEX IF NOT EXISTS experience_action ON experience (action, signature, id);
"""


class Pool:
    """One pool file, opened and checked."""

    def __init__(self, path: Path, connection: sqlite3.Connection, threshold: float) -> None:
        self.path = path
        self.db = connection
        self.threshold = threshold

    @classmethod
    def open(cls, path: str | os.PathLike[str], threshold: float = DEFAULT_THRESHOLD) -> Pool:
        """Open (or create) the pool at `path`; PoolError when the file is not a sound pool."""
        where = Path(path)
        if not 0 < threshold <= 1:
            raise PoolError(f"experience pool threshold must be in (0, 1], got {threshold}")
        if where.is_dir():
            raise PoolError(f"experience pool {where} is a folder, not a file")
        fresh = not where.exists() or where.stat().st_size == 0
        try:
            db = sqlite3.connect(where, isolation_level=None)
            if not fresh:
                _check(db, where)
            db.executescript(_SCHEMA)
            db.execute("INSERT OR IGNORE INTO pool_meta VALUES ('format', ?)", (FORMAT,))
        except sqlite3.Error as exc:
            raise PoolError(f"experience pool {where} cannot be used: {exc}",
                            "it is not a pool sopctl wrote, or it is damaged: move it away "
                            "(a new pool starts empty)") from None
        return cls(where, db, threshold)

    def close(self) -> None:
        self.db.close()

    # -- what a run asks ----------------------------------------------------------------
    def exact(self, action: str, key: str) -> Experience | None:
        row = self.db.execute(f"SELECT {_COLUMNS} FROM experience WHERE action = ? AND key = ?",
                              (action, key)).fetchone()
        return _entry(row) if row else None

    def nearest(self, action: str, signature: str, prompt: str) -> Experience | None:
        """The most similar entry of the same action and signature, if >= the threshold."""
        rows = self.db.execute(f"SELECT {_COLUMNS} FROM experience WHERE action = ? AND signature = ? "
                               "ORDER BY id DESC LIMIT ?", (action, signature, _NEAR_CANDIDATES))
        best: Experience | None = None
        for row in rows:
            entry = _entry(row, similarity(prompt, row[3]))
            if entry.similarity >= self.threshold and (best is None or entry.similarity > best.similarity):
                best = entry
        return best

    def add(self, action: str, key: str, signature: str, prompt: str, answer: str) -> None:
        """Store an accepted answer, redacted as the journal redacts (a pool is shared across
        runs and people: a key in a prompt or an answer must not be kept in clear)."""
        now, secrets = time.time(), secret_values()
        self.db.execute("INSERT OR IGNORE INTO experience (action, key, signature, prompt, answer, "
                        "created, last_used) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (action, key, signature, scrub(prompt, secrets), scrub(answer, secrets),
                         now, now))

    def reused(self, entry: Experience) -> None:
        self.db.execute("UPDATE experience SET score = score + 1, uses = uses + 1, last_used = ? "
                        "WHERE id = ?", (time.time(), entry.id))

    def offered(self, entry: Experience) -> None:
        self.db.execute("UPDATE experience SET score = score + 0.25, last_used = ? WHERE id = ?",
                        (time.time(), entry.id))

    # -- `sopctl pool` ------------------------------------------------------------------
    def entries(self, action: str | None = None) -> list[Experience]:
        where, args = ("WHERE action = ?", (action,)) if action else ("", ())
        rows = self.db.execute(f"SELECT {_COLUMNS} FROM experience {where} "
                               "ORDER BY action, score DESC, id", args)
        return [_entry(row) for row in rows]

    def clear(self, action: str | None = None) -> int:
        where, args = ("WHERE action = ?", (action,)) if action else ("", ())
        return self.db.execute(f"DELETE FROM experience {where}", args).rowcount

    def prune(self, keep: int | None = None, min_score: float | None = None) -> int:
        """Drop entries scored below `min_score`, then all but the `keep` best per action
        (score, then most recently used). Returns how many were dropped."""
        dropped = 0
        if min_score is not None:
            dropped += self.db.execute("DELETE FROM experience WHERE score < ?", (min_score,)).rowcount
        if keep is not None:
            dropped += self.db.execute(
                "DELETE FROM experience WHERE id IN (SELECT id FROM (SELECT id, ROW_NUMBER() OVER "
                "(PARTITION BY action ORDER BY score DESC, last_used DESC, id DESC) AS n "
                "FROM experience) WHERE n > ?)", (keep,)).rowcount
        return dropped


_COLUMNS = "id, action, key, prompt, answer, score, uses"


def _entry(row: Any, similar: float = 1.0) -> Experience:
    return Experience(id=row[0], action=row[1], key=row[2], prompt=row[3], answer=row[4],
                      score=row[5], uses=row[6], similarity=similar)


def _check(db: sqlite3.Connection, where: Path) -> None:
    """A file sopctl made, of a format it reads, and sound (SQLite's quick check)."""
    verdict = db.execute("PRAGMA quick_check").fetchone()
    if not verdict or verdict[0] != "ok":
        raise PoolError(f"experience pool {where} is damaged: {verdict[0] if verdict else 'no answer'}",
                        "move it away (a new pool starts empty)")
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "pool_meta" not in tables:
        raise PoolError(f"experience pool {where} is a database, but not an experience pool",
                        "name another file with --pool (or $SOPCTL_POOL)")
    found = db.execute("SELECT value FROM pool_meta WHERE name = 'format'").fetchone()
    if not found or found[0] != FORMAT:
        raise PoolError(f"experience pool {where} has format {found[0] if found else 'none'!r}, "
                        f"not {FORMAT!r}", "a newer sopctl wrote it, or it is damaged")
