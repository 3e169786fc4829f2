"""The run journal: an append-only SQLite record from which a run can be rebuilt.

Why SQLite: one file per run, atomic commits (WAL), and readable by `sopctl show` while
the run is still going or after its process was killed.

A journal lives at `<workspace>/.sopctl/journal.sqlite`; its four tables (meta, events,
answers, exchanges) are described in engine/journal/database.py.

`Journal` implements the three interfaces the interpreter talks to: `RunObserver`
(`on_event`), `CompletedActions` (`completed`) and the gateway's `AnswerStore`
(`lookup`/`record`).

Group commit: one commit per action step, not per event, and the fsync off the run's path.
Events are buffered in memory and written in one transaction at the step's commit points:

- a model answer (`record`; a person's answer, a tool's result too): the buffered events and
  the answer, committed before `record` returns, without an fsync (`synchronous=NORMAL`);
- `RunStarted`, `ActionCompleted` and `QuestionAsked`: committed without an fsync before
  `on_event` returns (`sopctl show` sees the run, each finished step, and the question it
  waits on; a finished step is not run again after a kill, which for an exec step would
  run its command twice);
- `ActionStarted`: with the next commit, most often the step's answer, and at the latest
  STEP_COMMIT_S (0.1 s) after it happened, by a timer on the run's event loop (`sopctl
  show` follows a live run step by step: a step that waits on a slow model or a command
  shows within that time; a fast one costs no commit of its own). Outside a running event
  loop it is committed before `on_event` returns;
- `RunEnded`: committed and fsynced (`synchronous=FULL`), as is everything at `close`.

A new journal's tables and meta rows are one transaction, fsynced. A writer (it holds the
writer lock) keeps the set of its answers' hashes, so a lookup of a request never answered,
every call of a new run, costs no query.

Durability (what survives a kill -9, a power cut, a failed fsync) and the fsync thread:
engine/journal/syncer.py. The run folder's own files and the writer lock:
engine/journal/run_folder.py. How rows are validated when read: engine/journal/codec.py.

Secrets never reach the file: the journal stores only what events and answers carry, and
redacts before writing the value of any secret-looking environment variable (`*_API_KEY`,
`*_KEY`, `*_PAT`, `*_TOKEN`, `*_AUTH`, ...) and the password of any `scheme://user:pass@host`
URL (engine/load/secrets.py: the one rule, shared with exec and the checker).

Testing aid: `SOPCTL_CRASH_AFTER_EVENT=N` makes the process die with `os._exit(137)` right
after the N-th event handed to the journal by this process (committed if it is a commit
point, still buffered otherwise: what a real kill at that moment leaves), and `SOPCTL_CRASH_AFTER_ANSWER=N`
does the same after the N-th recorded answer. The fault-injection tests use them to kill a
real `sopctl run` at every point of the journal and check that `sopctl resume` recovers.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine import __version__
from engine.errors import JournalError
from engine.journal.codec import EventRow, decode_event, loads, pack_exchange
from engine.journal.database import SCHEMA, SCHEMA_VERSION, connect, place_empty
from engine.journal.reader import JournalReader
from engine.journal.run_folder import journal_path, refuse_planted, take_writer_lock
from engine.journal.sqlite_errors import guard
from engine.journal.syncer import Syncer
from engine.load.secrets import scrub, secret_values
from engine.models.types import StoredAnswer, event_json
from engine.run.events import ActionCompleted, RunEvent, RunStarted, event_type
from engine.run.people import PERSON
from engine.run.toolloop import TOOL

if TYPE_CHECKING:
    from engine.compile.compiler import CompiledSop

__all__ = ["CRASH_AFTER_EVENT_ENV", "CRASH_AFTER_ANSWER_ENV", "SYNC_ENV", "STEP_COMMIT_S", "Journal"]


CRASH_AFTER_EVENT_ENV = "SOPCTL_CRASH_AFTER_EVENT"


CRASH_AFTER_ANSWER_ENV = "SOPCTL_CRASH_AFTER_ANSWER"


_CRASH_EXIT = 137


SYNC_ENV = "SOPCTL_JOURNAL_SYNC"


_FSYNCED_EVENTS = frozenset({"RunEnded"})
"""Events fsynced before `on_event` returns (answers: by the syncer, see the module docstring)."""


_STEP_EVENTS = frozenset({"RunStarted", "ActionCompleted", "QuestionAsked"})
"""Events committed (without an fsync) before `on_event` returns: the run's start, a step's
end (a finished step is never run again after a kill: an exec step's command would be),
and a question the run waits on a person for."""


_SOON_EVENTS = frozenset({"ActionStarted"})
"""Events committed with the next commit (most often the step's answer), and at the latest
STEP_COMMIT_S after they happened: a step that waits (a slow model, a command) shows in
`sopctl show` within that time, a fast one costs no commit of its own. Without a running
event loop (a worker thread, a synchronous caller) they are committed before `on_event`
returns."""


STEP_COMMIT_S = 0.1
"""How long a step's start may wait in memory for the next commit."""


_INSERT_EVENT = "INSERT INTO events (ts, type, key, json) VALUES (?, ?, ?, ?)"


def _crash_point(name: str) -> int:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw.isdigit() else 0



_THREADS = 256
"""The tool loops (first two messages) whose last exchange the journal remembers for _delta."""

class Journal(JournalReader):
    """A run's durable record: observer, completed-actions lookup and answer store in one.

    Open it with `Journal.for_run` or `Journal.create` (a run writes to it), or `Journal.open`
    (a resume or a replay reads it; a resume then `begin`s to write). Reading it is
    `JournalReader`'s, which `show` and `runs` open alone. Use it as a context manager or call
    `close()`.
    """

    def __init__(self, path: Path, conn: sqlite3.Connection, *, writable: bool) -> None:
        super().__init__(path, conn, writable=writable)
        self._secrets = secret_values()
        self._threads: dict[tuple[str, str], tuple[str, list[Any], Any]] = {}
        """The last exchange recorded per first two messages (see _delta), the newest last."""
        self._events_written = 0
        self._answers_written = 0
        self._crash_event = _crash_point(CRASH_AFTER_EVENT_ENV)
        self._crash_answer = _crash_point(CRASH_AFTER_ANSWER_ENV)
        self._completed: dict[str, ActionCompleted] | None = None
        self._final_hashes: dict[str, str] = {}
        self.workspace: Path | None = None
        """Set for a writable journal: `completed` then checks the action's artifacts there."""
        self._lock: tuple[int, ...] = ()        # the writer lock's descriptors
        self._mutex = threading.RLock()       # writers may be called from worker threads
        mode = os.environ.get(SYNC_ENV, "").strip().lower()
        self._fsync_all = mode == "full"
        self._answers_inline = mode == "answer"  # each answer fsynced before `record` returns
        self._full = True                     # _connect starts every connection at FULL
        self._syncer = Syncer(path)
        self._pending: list[tuple[float, str, str | None, str]] = []
        """Events handed over since the last commit (group commit: see the module docstring)."""
        self._known: set[str] | None = None
        """The request hashes of the answers table, while this process is its only writer
        (loaded at the first lookup): a miss, every call of a new run, then costs no query."""
        self._sole_writer = False
        self._timer: tuple[asyncio.AbstractEventLoop, asyncio.TimerHandle] | None = None
        """The pending commit of step events (`_SOON_EVENTS`), on the loop that set it."""

    # opening ---------------------------------------------------------------------------

    @classmethod
    def for_run(cls, workspace: str | Path, compiled: CompiledSop, *, force: bool = False) -> Journal:
        """The journal of a new run of a compiled SOP, in its workspace, ready to write.

        `engine.api` opens every run's journal here (a resume opens the existing one with
        `open`, reads it, and calls `begin` once every check has passed)."""
        journal = cls._writer(workspace)
        journal.begin(compiled, force=force)
        return journal

    def begin(self, compiled: CompiledSop, *, force: bool = False) -> None:
        """Make this journal the writer of a run of `compiled`: schema, the SOP check (same
        hash unless `force`), the writer lock, the meta rows. Closes the journal on failure.

        A journal opened read-only becomes writable here, so a resume refused by an earlier
        check leaves the file byte for byte as it was.

        Also remembers the SOP file's absolute path, so `resume` and `replay` find it from
        any folder."""
        file = compiled.file
        sop_path = str(Path(file).resolve()) if file and not file.startswith("<") else ""
        if not self._writable:  # opened to read (a resume's checks): write from here on
            self._conn.close()
            refuse_planted(self.path, writing=True)
            with guard(self.path, "open"):
                self._conn = connect(self.path, readonly=False)
            self._writable, self._full = True, True
        self._start(sop_name=compiled.spec.name, sop_hash=compiled.source_hash, force=force,
                    sop_path=sop_path, include_dirs=compiled.include_dirs)

    @classmethod
    def create(cls, workspace: str | Path, *, sop_name: str, sop_hash: str,
               force: bool = False, sop_path: str = "") -> Journal:
        """A journal for writing from bare meta values (tests and tools; runs use `for_run`).

        An existing journal must come from this schema version and this SOP (same hash);
        otherwise JournalError, unless `force` (then the new hash is recorded).
        """
        journal = cls._writer(workspace)
        journal._start(sop_name=sop_name, sop_hash=sop_hash, force=force, sop_path=sop_path)
        return journal

    @classmethod
    def _writer(cls, workspace: str | Path) -> Journal:
        path = journal_path(workspace)
        with guard(path, "create"):
            refuse_planted(path, writing=True)     # before mkdir: it would follow a link
            path.parent.mkdir(parents=True, exist_ok=True)
            refuse_planted(path, writing=True)     # ... and after, for one made meanwhile
            if not path.exists():
                place_empty(path)                  # else `connect` makes it (slower)
            conn = connect(path, readonly=False)
        return cls(path, conn, writable=True)

    def _start(self, *, sop_name: str, sop_hash: str, force: bool, sop_path: str,
               include_dirs: tuple[str, ...] = ()) -> None:
        self.workspace = self.path.parent.parent
        try:
            self._init_schema()      # opens the transaction the meta rows commit
            try:
                self._check_meta(sop_hash=sop_hash, force=force)
                self._lock = take_writer_lock(self.path)
                self._write_meta(sop_name=sop_name, sop_hash=sop_hash, sop_path=sop_path,
                                 include_dirs=include_dirs)
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
        except BaseException:
            self.close()
            raise
        self._sole_writer = True     # under the writer lock: no other process adds answers

    @classmethod
    def open_to_answer(cls, workspace: str | Path) -> Journal:
        """An existing journal opened to record a person's answer while its run waits: under
        the writer lock, so no live run (and no other answer) writes it meanwhile."""
        journal = cls.open(workspace, writable=True)
        try:
            journal._lock = take_writer_lock(journal.path)
        except BaseException:
            journal.close()
            raise
        return journal

    def record_person_answer(self, key: str, action: str, answer: StoredAnswer,
                             event: RunEvent) -> bool:
        """A person's answer and its event in one transaction, only if `key` has no answer
        yet (False when it had one: the other answer was taken)."""
        self._require_writable()
        self.flush()
        text = scrub(answer.text, self._secrets)
        payload = scrub(event_json(event), self._secrets)
        with self._mutex, guard(self.path, "write an answer to"):
            self._sync(full=True)     # the process exits next: on disk before it says so
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                taken = self._conn.execute("SELECT 1 FROM answers WHERE request_hash = ?",
                                           (key,)).fetchone()
                if taken is None:
                    self._conn.execute(_INSERT_EVENT, (time.time(), event_type(event), key, payload))
                    self._conn.execute(
                        "INSERT INTO answers VALUES (?, ?, ?, 0, 0, 0.0, ?, 0.0, ?, "
                        "(SELECT COALESCE(MAX(seq), 0) FROM events))",
                        (key, action, text, PERSON, PERSON))
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._syncer.committed(fsynced=True, answer=True)
            self._knows(key)
        return taken is None

    def _init_schema(self) -> None:
        """Begin the journal's first transaction with its tables: the checks read in it, and
        `_write_meta` commits it, fsynced (one commit for a new journal, not two)."""
        with guard(self.path, "initialise"):
            self._sync(full=True)
            self._conn.executescript("BEGIN IMMEDIATE;" + SCHEMA)   # left open

    def _write_meta(self, *, sop_name: str, sop_hash: str, sop_path: str,
                    include_dirs: tuple[str, ...] = ()) -> None:
        rows = {"sop_path": sop_path} if sop_path else {}
        if include_dirs:  # --include-path folders: a resume compiles the SOP with them again
            rows["include_dirs"] = json.dumps(list(include_dirs))
        rows |= {"schema_version": str(SCHEMA_VERSION), "sop_name": sop_name,
                "sop_hash": sop_hash, "engine_version": __version__}
        with guard(self.path, "write"):    # in `_init_schema`'s transaction
            self._conn.execute("INSERT OR IGNORE INTO meta VALUES ('created_at', ?)",
                               (repr(time.time()),))
            self._conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", rows.items())
            self._conn.execute("COMMIT")
            self._syncer.committed(fsynced=True, answer=False)

    def close(self) -> None:
        """Commit what is buffered, fsync every commit, close the database and drop the
        writer lock (idempotent)."""
        self._cancel_timer()
        try:
            self.flush()
        except (JournalError, sqlite3.Error):
            pass            # as if killed here: resume re-creates the buffered events
        self._syncer.close()   # its last fsync (a failure was raised at the last barrier)
        super().close()
        for handle in self._lock:
            os.close(handle)             # closing the descriptors releases the flock
        self._lock = ()

    def _before_read(self) -> None:
        """A writer reads its own buffered events too."""
        if self._writable:
            self.flush()

    # CompletedActions --------------------------------------------------------------------

    def completed(self, key: str) -> ActionCompleted | None:
        """The recorded completion of the action with this idempotency key, if any.

        An action whose artifacts are missing or changed in the workspace counts as not
        completed, so a resume runs it again (its answers come from the journal, at no
        cost) and the workspace rewrites exactly those files. "Changed" is measured against
        the last content the journal recorded for the path when it was opened (a later
        action may rewrite a file, as a review rewrites a draft), not this action's own.
        """
        if self._completed is None:
            self._completed = self._load_completed()
        record = self._completed.get(key)
        if record is None or self.workspace is None:
            return record
        final = self._final_hashes
        intact = all(_artifact_intact(self.workspace, {**a, "sha256": final.get(a["path"], a["sha256"])})
                     for a in record.artifacts)
        return record if intact else None

    def _load_completed(self) -> dict[str, ActionCompleted]:
        self._before_read()
        with guard(self.path, "read"):
            rows = self._conn.execute("SELECT seq, ts, type, json FROM events WHERE type = "
                                      "'ActionCompleted' ORDER BY seq").fetchall()
        done: dict[str, ActionCompleted] = {}
        for seq, ts, typ, text in rows:
            event = decode_event(EventRow(seq, ts, typ, text))
            assert isinstance(event, ActionCompleted)
            done.setdefault(event.key, event)
            # Frozen at load: what this resume writes must not move the target it checks against.
            self._final_hashes.update({a["path"]: a["sha256"] for a in event.artifacts})
        return done

    # RunObserver -------------------------------------------------------------------------

    def on_event(self, event: RunEvent) -> None:
        """Append one event, committed before returning (the crash hook fires after it)."""
        with self._mutex:
            self._append(event)

    def _append(self, event: RunEvent) -> None:
        self._require_writable()
        if isinstance(event, RunStarted):
            self._check_same_run(event.run_id)
        key = getattr(event, "key", None)
        text = scrub(event_json(event), self._secrets)
        kind = event_type(event)
        self._pending.append((time.time(), kind, key, text))
        if self._fsync_all or kind in _FSYNCED_EVENTS:
            self.require_durable()   # the run's end: a failed fsync is not hidden
            self._commit(full=True)
        elif kind in _STEP_EVENTS:
            self._commit(full=False)
        elif kind in _SOON_EVENTS:
            self._commit_soon()
        if isinstance(event, ActionCompleted) and self._completed is not None:
            self._completed.setdefault(event.key, event)
        self._events_written += 1
        if self._crash_event and self._events_written == self._crash_event:
            os._exit(_CRASH_EXIT)

    def _commit(self, *, full: bool, answer: tuple[Any, ...] | None = None,
                exchange: dict[str, Any] | None = None) -> None:
        """One transaction: the buffered events, then the answer if any (and what was sent for
        it); fsynced when `full`.

        The events stay buffered if it fails (a full disk), for the next commit to retry."""
        doing = "write an answer to" if answer else "write an event to"
        with guard(self.path, doing):
            self._sync(full=full)
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.executemany(_INSERT_EVENT, self._pending)
                if answer is not None:
                    self._conn.execute(
                        "INSERT OR IGNORE INTO answers VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, "
                        "(SELECT COALESCE(MAX(seq), 0) FROM events))", answer)
                    if exchange is not None:
                        self._insert_exchange(answer[0], exchange)
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            # (SOPCTL_JOURNAL_SYNC=answer: `record` fsyncs it itself, the thread need not)
            self._syncer.committed(fsynced=self._full,
                                   answer=answer is not None and not self._answers_inline)
        self._pending.clear()

    def _commit_soon(self) -> None:
        """Commit the buffered events within STEP_COMMIT_S, unless a commit comes first (at
        once without a running event loop in this thread)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._commit(full=False)
            return
        if self._timer is not None and self._timer[0] is loop:
            return                   # one timer at a time: it commits whatever is buffered then
        self._timer = (loop, loop.call_later(STEP_COMMIT_S, self._timed_flush))

    def _timed_flush(self) -> None:
        self._timer = None
        try:
            self.flush()
        except (JournalError, sqlite3.Error):
            pass        # still buffered: the next commit (an answer, the run's end) raises it

    def _cancel_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer[1].cancel()

    def flush(self) -> None:
        """Commit the buffered events now (without an fsync unless every write is fsynced)."""
        with self._mutex:
            if self._pending:
                self._commit(full=self._fsync_all)

    def _check_same_run(self, run_id: str) -> None:
        """One journal, one run: a new run into a used workspace would mix two runs' work."""
        with guard(self.path, "read"):
            row = self._conn.execute("SELECT json FROM events WHERE type = 'RunStarted' "
                                     "ORDER BY seq LIMIT 1").fetchone()
        other = loads(row[0], 0).get("run_id") if row else None
        if other and other != run_id:
            raise JournalError(f"workspace {self.path.parent.parent} already holds run {other}",
                               f"continue it with `sopctl resume {self.path.parent.parent}`, "
                               "or give the new run another --out")

    def durable(self) -> Awaitable[None] | None:
        """The durability barrier (`engine.models.types.durable`): None when every answer
        recorded so far is fsynced, else something to await in the event loop until the
        syncer's fsync covers them. A failed fsync is a JournalError naming the journal."""
        return self._syncer.wait() if self._writable else None

    def require_durable(self) -> None:
        """A JournalError naming the journal if one of its fsyncs failed (call it after
        `close`: a run's end reports an fsync that failed after its last barrier)."""
        self._syncer.raise_if_failed()

    def unsynced(self) -> int:
        """Answers' commits (and those before them) a power cut could still take back (0
        right after `durable`: the step events after the last answer may still be unsynced)."""
        return self._syncer.unsynced()

    def _sync(self, *, full: bool) -> None:
        """Set the connection's synchronous level for the next commit (only when it changes)."""
        full = full or self._fsync_all
        if full != self._full:
            self._conn.execute(f"PRAGMA synchronous = {'FULL' if full else 'NORMAL'}")
            self._full = full

    # AnswerStore -------------------------------------------------------------------------

    def lookup(self, request_hash: str) -> StoredAnswer | None:
        if not self._may_hold(request_hash):
            return None
        with guard(self.path, "read"):
            row = self._conn.execute(
                "SELECT text, prompt_tokens, completion_tokens, cost_usd, model, seconds "
                "FROM answers WHERE request_hash = ?", (request_hash,)).fetchone()
        if row is None:
            return None
        text, prompt_tokens, completion_tokens, cost, model, seconds = row
        return StoredAnswer(text, prompt_tokens, completion_tokens, cost, model=model, seconds=seconds)

    def holds(self, request_hash: str) -> bool:
        if not self._may_hold(request_hash):
            return False
        with guard(self.path, "read"):
            return self._conn.execute("SELECT 1 FROM answers WHERE request_hash = ?",
                                      (request_hash,)).fetchone() is not None

    def _may_hold(self, request_hash: str) -> bool:
        """False when the answers table certainly lacks this hash (the journal's writer knows
        every hash in it); True when a query must tell (a reader: another process may write)."""
        if not self._sole_writer:
            return True
        if self._known is None:
            with guard(self.path, "read"):
                self._known = {r[0] for r in self._conn.execute("SELECT request_hash FROM answers")}
        return request_hash in self._known

    def _knows(self, request_hash: str) -> None:
        if self._known is not None:
            self._known.add(request_hash)

    def record(self, request_hash: str, action: str, answer: StoredAnswer) -> None:
        """Store a model answer (the first answer for a request wins), committed before this
        returns (it survives kill -9); on disk once `durable()` says so (a power cut)."""
        self.record_as(request_hash, action, answer, origin="model")

    def record_as(self, request_hash: str, action: str, answer: StoredAnswer, *, origin: str) -> None:
        """Store an answer with its origin (`model`, or `replay` when copied from a journal);
        a person's answer (its model is `person`) keeps the origin `person` either way."""
        if answer.model in (PERSON, TOOL):   # a person's answer, a tool's result: never a model's
            origin = answer.model
        with self._mutex:
            self._store_answer(request_hash, action, answer, origin)

    def _store_answer(self, request_hash: str, action: str, answer: StoredAnswer, origin: str) -> None:
        self._require_writable()
        text = scrub(answer.text, self._secrets)
        self._commit(full=False, answer=(
            request_hash, action, text, int(answer.prompt_tokens), int(answer.completion_tokens),
            float(answer.cost_usd), str(getattr(answer, "model", "")),
            float(getattr(answer, "seconds", 0.0)), origin), exchange=getattr(answer, "exchange", None))
        self._knows(request_hash)
        if self._answers_inline:
            self._syncer.sync_now()
        self._answers_written += 1
        if self._crash_answer and self._answers_written == self._crash_answer:
            os._exit(_CRASH_EXIT)

    def _insert_exchange(self, request_hash: str, exchange: dict[str, Any]) -> None:
        """What was sent for an answer, secrets redacted, compressed when long (the first wins);
        a request that begins with the messages of one recorded before (a tool loop's next
        step) keeps only what it adds (`_delta`)."""
        text = scrub(json.dumps(self._delta(request_hash, exchange), ensure_ascii=False), self._secrets)
        self._conn.execute("INSERT OR IGNORE INTO exchanges VALUES (?, ?)",
                           (request_hash, pack_exchange(text)))

    def _delta(self, request_hash: str, exchange: dict[str, Any]) -> dict[str, Any]:
        """`exchange`, or what it adds to the last exchange recorded with the same two first
        messages (system prompt and first user message: the same tool loop): `base` (that
        one's key), `keep` (how many of its messages begin this one) and the new messages,
        and `same_format` instead of a `response_format` equal to that one's (a step's
        schema, sent again with every step to a model that takes it). A 40-step loop then
        stores its prompt and its schema once and each step's answer and results once, not
        the whole growing request 40 times (engine.journal.reader.resolve_exchange)."""
        messages = exchange.get("messages")
        if not isinstance(messages, list) or len(messages) < 2 or not all(isinstance(m, dict) for m in messages[:2]):
            return exchange
        head = (str(messages[0].get("content")), str(messages[1].get("content")))
        form = exchange.get("response_format")
        before = self._threads.pop(head, None)
        self._threads[head] = (request_hash, messages, form)
        if len(self._threads) > _THREADS:
            del self._threads[next(iter(self._threads))]
        if before is None or before[0] == request_hash:
            return exchange
        old = before[1]
        if len(old) <= len(messages) and messages[:len(old)] == old:   # a step: all of it, in one comparison
            keep = len(old)
        else:
            keep = 0
            while keep < min(len(old), len(messages)) and old[keep] == messages[keep]:
                keep += 1
        if keep < 2:
            return exchange
        delta = {**exchange, "messages": messages[keep:], "base": before[0], "keep": keep}
        if form is not None and form == before[2]:
            del delta["response_format"]
            delta["same_format"] = True
        return delta

    def _require_writable(self) -> None:
        if not self._writable:
            raise JournalError(f"journal {self.path} is open read-only")


def _artifact_intact(workspace: Path, artifact: dict[str, str]) -> bool:
    """True when the file is there with the recorded sha256 (unreadable counts as changed)."""
    path = workspace / str(artifact.get("path", ""))
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() == artifact.get("sha256")
    except OSError:
        return False
