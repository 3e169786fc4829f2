"""Reading a journal: its meta rows, events, answers and what was sent for each answer.

`JournalReader` is what `show`, `runs`, `report` and `show --prompts` open (read-only: the
file is left byte for byte as it was); `Journal` (engine/journal/store.py) is the same file
opened by a run to write, and reads it the same way, its own buffered events included.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any
from collections.abc import Callable

from typing_extensions import Self

from engine.errors import JournalError
from engine.journal.codec import AnswerRow, EventRow, unpack_exchange
from engine.journal.database import SCHEMA_VERSION, connect
from engine.journal.run_folder import JOURNAL_DIR, JOURNAL_FILE, journal_path, refuse_planted
from engine.journal.sqlite_errors import PROBLEMS, guard
from engine.models.types import StoredAnswer

__all__ = ["JournalReader"]


class JournalReader:
    """An existing journal, opened with `open`. Use it as a context manager or call `close()`."""

    def __init__(self, path: Path, conn: sqlite3.Connection, *, writable: bool = False) -> None:
        self.path = path
        self._conn = conn
        self._writable = writable

    @classmethod
    def open(cls, workspace: str | Path, *, writable: bool = False) -> Self:
        """Open an existing journal (read-only by default); a missing one is a JournalError."""
        path = journal_path(workspace)
        if not Path(workspace).is_dir():
            what = "is not a folder" if Path(workspace).exists() else "does not exist"
            raise JournalError(f"run folder {workspace} {what}",
                               "give the workspace of a run (`sopctl runs` lists them)")
        refuse_planted(path, writing=writable)
        if not path.is_file():
            raise JournalError(f"{workspace} has no journal ({JOURNAL_DIR}/{JOURNAL_FILE})",
                               "give the workspace of a run made by `sopctl run`")
        with guard(path, "open"):
            conn = connect(path, readonly=not writable)
        journal = cls(path, conn, writable=writable)
        try:
            journal._check_meta(sop_hash=None, force=False)
        except BaseException:
            journal.close()
            raise
        return journal

    def _check_meta(self, *, sop_hash: str | None, force: bool) -> None:
        meta = self.meta()
        version = int(meta.get("schema_version", SCHEMA_VERSION))
        if version > SCHEMA_VERSION:
            raise JournalError(f"journal {self.path} has schema version {version}; this sopctl "
                               f"reads up to {SCHEMA_VERSION}", "upgrade sopctl to read it")
        old_hash = meta.get("sop_hash")
        if sop_hash and old_hash and old_hash != sop_hash and not force:
            raise JournalError(
                f"journal {self.path} belongs to another SOP "
                f"({meta.get('sop_name', '?')}, sha256 {old_hash[:12]}) than this one "
                f"(sha256 {sop_hash[:12]})",
                "use a fresh workspace (--out), or --force to continue with the changed file")

    def close(self) -> None:
        """Close the database (idempotent)."""
        try:
            self._conn.close()
        except sqlite3.Error:
            pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _before_read(self) -> None:
        """Nothing to do here; a writer commits its buffered events first (`Journal`)."""

    def check_intact(self) -> None:
        """SQLite's structural check of every page: a resume or replay reads the answers
        table lazily, so damage there would otherwise surface mid-run, as a failed run."""
        with guard(self.path, "read"):
            verdict = self._conn.execute("PRAGMA quick_check(1)").fetchone()
        if verdict != ("ok",):
            what, hint = PROBLEMS["corrupt"]
            raise JournalError(f"cannot read journal {self.path}: {what} (SQLite's page check fails)", hint)

    def meta(self) -> dict[str, str]:
        """The meta rows; a file without them was never initialised (a JournalError)."""
        with guard(self.path, "read"):
            tables = {r[0] for r in self._conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()}
            if "meta" not in tables:
                raise JournalError(f"journal {self.path} is empty or not a sopctl journal",
                                   "the run died while creating it; start the run again")
            return dict(self._conn.execute("SELECT key, value FROM meta").fetchall())

    def events(self) -> list[EventRow]:
        """Every event in order, payloads decoded from JSON."""
        self._before_read()
        with guard(self.path, "read"):
            rows = self._conn.execute("SELECT seq, ts, type, json FROM events ORDER BY seq").fetchall()
        return [EventRow(seq, ts, typ, text) for seq, ts, typ, text in rows]

    def answers(self) -> list[AnswerRow]:
        """Every journaled model answer, in the order they were recorded."""
        with guard(self.path, "read"):
            rows = self._conn.execute(
                "SELECT request_hash, action, text, prompt_tokens, completion_tokens, cost_usd, "
                "model, seconds, origin, seq FROM answers ORDER BY rowid").fetchall()
        return [AnswerRow(h, a, StoredAnswer(t, pt, ct, c, model=m, seconds=sec), o, s)
                for h, a, t, pt, ct, c, m, sec, o, s in rows]

    def action_of(self, request_hash: str) -> str | None:
        """The action whose answer to this request the journal holds, if it holds one."""
        with guard(self.path, "read"):
            row = self._conn.execute("SELECT action FROM answers WHERE request_hash = ?",
                                     (request_hash,)).fetchone()
        return row[0] if row else None

    def exchanges(self) -> dict[str, dict[str, Any]]:
        """What was sent for each answer, by request hash (empty for a journal from before
        prompts were kept, which has no `exchanges` table)."""
        with guard(self.path, "read"):
            if not self._has_table("exchanges"):
                return {}
            rows = self._conn.execute("SELECT request_hash, data FROM exchanges").fetchall()
        stored = {key: unpack_exchange(key, data) for key, data in rows}
        memo: dict[str, dict[str, Any]] = {}
        return {key: resolve_exchange(key, stored.get, memo) or value for key, value in stored.items()}

    def exchanges_of_action(self, action: str) -> list[dict[str, Any]]:
        """What was sent for each of an action's answers, in the order they were recorded."""
        with guard(self.path, "read"):
            if not self._has_table("exchanges"):
                return []
            rows = self._conn.execute(
                "SELECT e.request_hash, e.data FROM answers a JOIN exchanges e ON e.request_hash = a.request_hash "
                "WHERE a.action = ? ORDER BY a.seq", (action,)).fetchall()
        own = {key: unpack_exchange(key, data) for key, data in rows}

        def lookup(key: str) -> dict[str, Any] | None:   # a base of another action's: its row
            return own[key] if key in own else self._stored(key)
        memo: dict[str, dict[str, Any]] = {}
        return [resolve_exchange(key, lookup, memo) or own[key] for key, _ in rows]

    def exchange(self, request_hash: str) -> dict[str, Any] | None:
        """What was sent for one answer, or None when the journal did not keep it."""
        with guard(self.path, "read"):
            if not self._has_table("exchanges"):
                return None
        return resolve_exchange(request_hash, self._stored, {})

    def _stored(self, request_hash: str) -> dict[str, Any] | None:
        """One exchange as its row holds it (a step's may hold only what it adds to another's)."""
        with guard(self.path, "read"):
            row = self._conn.execute("SELECT data FROM exchanges WHERE request_hash = ?",
                                     (request_hash,)).fetchone()
        return unpack_exchange(request_hash, row[0]) if row else None

    def _has_table(self, name: str) -> bool:
        return self._conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                  (name,)).fetchone() is not None


def resolve_exchange(key: str, lookup: Callable[[str], dict[str, Any] | None],
                     memo: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The exchange under `key` with all its messages. A tool loop's step is journaled as what
    it adds to the step before (`base`: that exchange's key, `keep`: how many of its messages
    this request begins with; `same_format`: its response_format is that exchange's;
    engine.journal.store); the chain is followed back, without recursion, and each exchange
    resolved is kept in `memo`. A base the journal lacks shows as one line saying how many
    messages are not there."""
    chain: list[tuple[str, dict[str, Any]]] = []
    seen: set[str] = set()
    current: str | None = key
    while current is not None and current not in memo and current not in seen:
        value = lookup(current)
        if value is None:
            break
        seen.add(current)
        chain.append((current, value))
        base = value.get("base")
        current = base if isinstance(base, str) else None
    for name, value in reversed(chain):
        base = value.get("base")
        if isinstance(base, str):
            keep = int(value.get("keep") or 0)
            found = memo.get(base)
            head = list(found["messages"][:keep]) if found is not None else \
                [{"role": "user", "content": f"[{keep} earlier message(s) not in the journal]"}]
            stored, value = value, {**{k: v for k, v in value.items() if k not in ("base", "keep", "same_format")},
                                    "messages": head + list(value["messages"])}
            if stored.get("same_format") and found is not None and "response_format" in found:
                value["response_format"] = found["response_format"]
        memo[name] = value
    return memo.get(key)
