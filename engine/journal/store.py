"""The run journal: an append-only SQLite record from which a run can be rebuilt.

Why SQLite: one file per run, atomic commits (WAL), and readable by `sopctl show` while
the run is still going or after its process was killed.

A journal lives at `<workspace>/.sopctl/journal.sqlite` and has four tables:

- `meta`: schema version, the SOP's name and hash, engine version, creation time;
- `events`: every run event of `engine.run.events`, in order (seq, ts, type, key, json);
  append-only (triggers refuse UPDATE and DELETE);
- `answers`: every model answer by the hash of its canonical request, so that `resume`
  never pays for the same request twice and `replay` never calls a model at all;
- `exchanges`: what was sent for each model answer (the rendered messages, system and user,
  every re-ask's conversation), by the same hash, written in the answer's transaction;
  JSON, zlib-compressed when longer than EXCHANGE_COMPRESS_AT characters. Journals from
  before it have no such table and read as having no prompts (`Journal.exchanges`).

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

What survives what:

- kill -9 (a crash, Ctrl-C, `os._exit`): every commit. A commit in WAL mode has written its
  frames to the WAL file before it returns, and the operating system keeps them whatever
  happens to the process. A process killed between two commit points loses only the events
  buffered since the last one (a step's start, a round start, a reused answer's
  event, a published message); `resume` re-creates them by re-executing with the journaled answers, at no cost,
  so the kill -9 sweep of tests/journal/test_faults.py still repeats at most the one call that was
  in flight.
- a power cut (the OS dies too): what an fsync covered. `_Syncer`, a thread per writable
  journal, fsyncs the WAL (and the `.sopctl` folder, once) whenever an answer was committed
  since its last fsync, so every commit that lands during one fsync shares the next one
  (the answers of a fan-out, the step events). The durability barrier, `durable()` (through
  `engine.models.types.durable`, which the models and run layers call without knowing the
  journal), is awaited right before something leaves the process that may have been built
  from the answers: a paid model request (engine.models.gateway), a command (`kind:
  exec`), a tool that acts outside (engine.run.toolloop), a question or a message to a
  person (engine.run.actions, engine.run.people). "Depends" is precise: the barrier waits
  for every answer recorded before it was called (the thing about to leave was built by
  then), not for answers recorded while it waits (a fan-out's other calls: nothing this
  call sends was built from them, and waiting for them would cost an fsync per answer
  instead of one per wave). It returns at once when the last fsync covers them, else it
  waits, without blocking the event loop, for the thread's next fsync. So a power cut
  loses only answers nothing has acted on yet (`resume` asks for them again: at most
  about as many calls as were running at once) and events after the last fsync, never an
  answer that something outside was told about or paid on.
- a failed fsync (EIO, ENOSPC): kept, and raised as a JournalError naming the journal at the
  next barrier and every one after (after a failed fsync the kernel may have dropped the
  pages: nothing written since can be called durable); the run stops there. One that fails
  after the run's last barrier is raised at its end (`require_durable`, engine.api).

The syncer starts with the first commit it must cover, stops at `close` after a last fsync,
and starts afresh in a forked child. `SOPCTL_JOURNAL_SYNC=answer` fsyncs each answer before
`record` returns, on the calling thread (the default before the syncer: one fsync per answer
on the run's path); `full` commits and fsyncs every event on its own before the run goes on
(about three fsyncs per model call). bench/journal_bench.py measures them all; `tiered`, an
older name of the default, is accepted.

Secrets never reach the file: the journal stores only what events and answers carry, and
redacts before writing the value of any secret-looking environment variable (`*_API_KEY`,
`*_KEY`, `*_PAT`, `*_TOKEN`, `*_AUTH`, ...) and the password of any `scheme://user:pass@host`
URL (engine/load/secrets.py: the one rule, shared with exec and the checker).

The run folder's own files (`.sopctl/`, the journal and its `-wal`/`-shm`, `writer.lock`)
are never followed through a symlink: a workspace can come from someone else (a shared or
unpacked folder), and a planted link would make a run write where it points. A `.sopctl`
that is a link or not a folder, or an own file that is a link, not a plain file, or has
another hard link, is a JournalError naming it. The writer lock is an flock on the
`.sopctl` folder itself, so replacing `writer.lock` (which only tells the holder's pid)
cannot let a second writer in.

Testing aid: `SOPCTL_CRASH_AFTER_EVENT=N` makes the process die with `os._exit(137)` right
after the N-th event handed to the journal by this process (committed if it is a commit
point, still buffered otherwise: what a real kill at that moment leaves), and `SOPCTL_CRASH_AFTER_ANSWER=N`
does the same after the N-th recorded answer. The fault-injection tests use them to kill a
real `sopctl run` at every point of the journal and check that `sopctl resume` recovers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import hashlib
import json
import os
import sqlite3
import stat
import threading
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from functools import cache
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)
from collections.abc import Callable, Iterator

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]
from engine import __version__
from engine.errors import JournalError
from engine.load.secrets import scrub, secret_values
from engine.load.spec import ENGINE_DIR
from engine.models.types import StoredAnswer, event_json
from engine.run.people import PERSON
from engine.run.toolloop import TOOL
from engine.run import events as _events
from engine.run.events import ActionCompleted, RunEvent, RunStarted, event_type

if TYPE_CHECKING:
    from engine.compile.compiler import CompiledSop

__all__ = ["SCHEMA_VERSION", "JOURNAL_DIR", "JOURNAL_FILE", "CRASH_AFTER_EVENT_ENV",
           "CRASH_AFTER_ANSWER_ENV", "SYNC_ENV", "EventRow", "AnswerRow", "Journal", "ReplayStore",
           "journal_path", "writer_active", "decode_event", "naming", "EXCHANGE_COMPRESS_AT",
           "never_started"]


SCHEMA_VERSION = 1


JOURNAL_DIR = ENGINE_DIR


JOURNAL_FILE = "journal.sqlite"


CRASH_AFTER_EVENT_ENV = "SOPCTL_CRASH_AFTER_EVENT"


CRASH_AFTER_ANSWER_ENV = "SOPCTL_CRASH_AFTER_ANSWER"


_CRASH_EXIT = 137


SYNC_ENV = "SOPCTL_JOURNAL_SYNC"


EXCHANGE_COMPRESS_AT = 1024
"""An exchange's JSON longer than this many characters is stored zlib-compressed (a BLOB)."""


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


_EVENT_TYPES: dict[str, type] = {
    name: obj for name in _events.__all__
    if isinstance(obj := getattr(_events, name), type) and dataclasses.is_dataclass(obj)
}


_SCHEMA = """
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


def journal_path(workspace: str | Path) -> Path:
    """Where a run's journal lives inside its workspace."""
    return Path(workspace) / JOURNAL_DIR / JOURNAL_FILE


@dataclass(frozen=True)
class EventRow:
    """One stored event: its position, wall time, type name and JSON payload."""

    seq: int
    ts: float
    type: str
    data: dict[str, Any]


@dataclass(frozen=True)
class AnswerRow:
    """One stored answer; `origin` is `model` (paid for) or `replay` (copied from a journal)."""

    request_hash: str
    action: str
    answer: StoredAnswer
    origin: str
    seq: int


def decode_event(row: EventRow) -> RunEvent:
    """Turn a stored row back into its event dataclass (unknown fields are a JournalError)."""
    cls = _EVENT_TYPES.get(row.type)
    if cls is None:
        raise JournalError(f"journal event {row.seq} has an unknown type {row.type!r}",
                           "the journal was written by a newer sopctl; upgrade sopctl")
    _check_shape(row, cls)
    try:
        event: RunEvent = cls(**row.data)
    except TypeError as exc:
        raise JournalError(f"journal event {row.seq} ({row.type}) does not match this sopctl: {exc}",
                           "the journal was written by another sopctl version") from None
    return event


_DAMAGED = "the journal was damaged outside sopctl; start a new run, or restore the file from a backup"


_MESSAGE_FIELDS: dict[str, Any] = {"id": str, "cause_by": str, "sent_from": str, "round": int,
                                   "content": str, "send_to": list[str]}
"""What `Message.from_json` reads from a recorded message (`id`, `cause_by`, `sent_from` required)."""


def _check_shape(row: EventRow, cls: type) -> None:
    """Every recorded field has its declared type, so a hand-edited or damaged row is a
    JournalError here, not an AttributeError deep in `show` or `resume`."""
    hints = _field_types(cls)
    for name, value in row.data.items():
        if name in hints and not _fits(value, hints[name]):
            raise JournalError(f"journal event {row.seq} ({row.type}) has {name} = {_short(value)}, "
                               f"which is not {_describe(hints[name])}", _DAMAGED)
    messages = [row.data.get("message")] if row.type == "MessagePublished" else \
        row.data.get("messages", []) if row.type == "ActionCompleted" else []
    for message in messages:
        problem = _message_problem(message)
        if problem:
            raise JournalError(f"journal event {row.seq} ({row.type}) holds a message that {problem}",
                               _DAMAGED)


@cache
def _field_types(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _fits(value: Any, hint: Any) -> bool:
    """A shallow structural check of JSON data against a dataclass field's type."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Union:
        return any(_fits(value, a) for a in args)
    if origin is list:
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value) if args else isinstance(value, list)
    if origin is dict:
        return isinstance(value, dict) and (not args or all(_fits(v, args[1]) for v in value.values()))
    if hint is bool or hint is str or hint is list or hint is dict:
        return isinstance(value, hint)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return isinstance(value, str)   # an unknown value gets its own message where it is read
    return hint is Any or hint is type(None) and value is None


def _message_problem(message: Any) -> str:
    if not isinstance(message, dict):
        return f"is {_short(message)}, not an object"
    missing = [k for k in ("id", "cause_by", "sent_from") if k not in message]
    if missing:
        return f"has no {missing[0]}"
    wrong = next((k for k, hint in _MESSAGE_FIELDS.items() if k in message and not _fits(message[k], hint)), None)
    return f"has {wrong} = {_short(message[wrong])}, which is not {_describe(_MESSAGE_FIELDS[wrong])}" if wrong else ""


def _describe(hint: Any) -> str:
    names = {str: "a string", int: "a whole number", float: "a number", bool: "true or false"}
    origin, args = get_origin(hint) or hint, get_args(hint)
    if origin is list and args and args[0] is not Any:
        return f"a list of which each item is {_describe(args[0])}"
    return names.get(hint) or {list: "a list", dict: "an object"}.get(origin, "a string")


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


# --- sqlite errors -> JournalError ------------------------------------------------------


_PROBLEMS: dict[str, tuple[str, str]] = {
    "full": ("the disk is full", "free some space, then continue with `sopctl resume`; "
             "nothing already journaled is lost"),
    "readonly": ("the workspace is read-only",
                 "choose a writable workspace (--out) or fix its permissions"),
    "corrupt": ("the file is torn or corrupted", _DAMAGED),
    "cantopen": ("the file cannot be opened", "check that the folder exists and is writable"),
    "busy": ("another process holds it", "wait for the other sopctl process to finish"),
}


_SQLITE_KINDS = {"SQLITE_FULL": "full", "SQLITE_READONLY": "readonly", "SQLITE_PERM": "readonly",
                 "SQLITE_NOTADB": "corrupt", "SQLITE_CORRUPT": "corrupt",
                 "SQLITE_CANTOPEN": "cantopen", "SQLITE_BUSY": "busy", "SQLITE_LOCKED": "busy"}


_ERRNO_KINDS = {errno.ENOSPC: "full", errno.EDQUOT: "full", errno.EROFS: "readonly",
                errno.EACCES: "readonly", errno.EPERM: "readonly"}


_TEXT_KINDS = (("full", "full"), ("readonly", "readonly"), ("not a database", "corrupt"),
               ("malformed", "corrupt"), ("unable to open", "cantopen"), ("locked", "busy"))


def _kind(exc: BaseException) -> str:
    """What went wrong, from the errno, SQLite's error name, or (older Pythons) the text."""
    if isinstance(exc, OSError):
        return _ERRNO_KINDS.get(exc.errno or 0, "")
    name = str(getattr(exc, "sqlite_errorname", ""))
    for prefix, kind in _SQLITE_KINDS.items():
        if name.startswith(prefix):
            return kind
    text = str(exc).lower()
    return next((kind for needle, kind in _TEXT_KINDS if needle in text), "")


def _explain(exc: BaseException, path: Path, doing: str) -> JournalError:
    """One place that turns sqlite/OS failures into a message a user can act on."""
    kind = _kind(exc)
    if kind not in _PROBLEMS:
        return JournalError(f"cannot {doing} journal {path}: {exc}")
    what, hint = _PROBLEMS[kind]
    detail = f" ({exc})" if kind in ("corrupt", "cantopen", "busy") else ""
    return JournalError(f"cannot {doing} journal {path}: {what}{detail}", hint)


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


@contextmanager
def _guard(path: Path, doing: str) -> Iterator[None]:
    try:
        yield
    except JournalError:
        raise
    except (sqlite3.Error, OSError) as exc:
        raise _explain(exc, path, doing) from None


def _crash_point(name: str) -> int:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw.isdigit() else 0


# --- group commit's fsync ---------------------------------------------------------------


def _datasync(fd: int) -> None:
    """fdatasync where there is one (a WAL that grew has its new size flushed too), else fsync."""
    sync = getattr(os, "fdatasync", None) or os.fsync
    sync(fd)


class _Syncer:
    """The second half of group commit: a thread that fsyncs the journal's WAL after commits.

    Every commit adds one to a generation count, and an answer's commit marks its generation
    as needed; the thread fsyncs whenever a needed generation is not covered yet, so all the
    commits that land during one fsync (the answers of a fan-out, the step events around
    them) share the next one. The step events alone never wake it: they ride along with the
    next answer's fsync (a power cut losing them costs nothing, `resume` re-creates them).
    `wait` is the event loop's side: nothing while every answer committed so far is
    covered, else a future the thread resolves once they are (answers committed later are
    the next `wait`'s business). An fsync that fails (EIO, ENOSPC) is kept and raised at every later
    `wait`: after a failed fsync the kernel may have dropped the pages, so nothing written
    since can be called durable.

    One per writable `Journal`; the thread starts with the first commit it must cover and
    stops in `close`, after a last fsync. A forked child starts afresh with its own lock and
    thread (the parent's thread does not exist there; its lock may have been held).
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._wal = path.with_name(path.name + "-wal")
        self._fd = -1                   # the WAL, opened by the thread
        self._dir_synced = False        # the folder's entries for the journal and its WAL
        self._committed = 0             # commits so far
        self._needed = 0                # the generation of the last answer's commit
        self._synced = 0                # commits an fsync covered
        self._error: tuple[str, str] | None = None
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._io = threading.Lock()     # one fsync at a time: the thread's, or `sync_now`'s
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def _same_process(self) -> None:
        if self._pid != os.getpid():    # forked: checked before the (maybe held) lock is taken
            self._reset()

    def committed(self, *, fsynced: bool, answer: bool) -> None:
        """A commit landed; `answer`: it holds an answer (the barrier waits for it);
        `fsynced`: SQLite fsynced the WAL in it, which covers every earlier commit too (the
        folder still needs its one fsync)."""
        self._same_process()
        with self._cond:
            self._committed += 1
            if fsynced and self._dir_synced:
                self._advance(self._committed)
                return
            if not (answer or fsynced) or self._error is not None or self._stopping:
                return
            self._needed = self._committed
            self._start()
            self._cond.notify()
        # No hand-over of the GIL here (time.sleep(0)): it starts the fsync a little sooner
        # after a lone answer, but splits a fan-out's burst of answers over two fsyncs, and
        # measured no better on a chain of single calls (bench/journal_bench.py --fsync-ms).

    def sync_now(self) -> None:
        """fsync every commit so far on this thread (SOPCTL_JOURNAL_SYNC=answer); a failure
        is a JournalError here and at every later barrier."""
        self._same_process()
        with self._cond:
            self._raise_if_failed()
            target = self._committed
        self._sync_up_to(target)
        self._raise_if_failed()

    def unsynced(self) -> int:
        """Answers' commits (and those before them) not yet covered by an fsync."""
        with self._cond:
            return max(self._needed - self._synced, 0)

    def wait(self) -> asyncio.Future[None] | None:
        """None when every answer committed so far is on disk, else a future done when it
        is (call it from a coroutine); a failed fsync is a JournalError, here or from it."""
        self._same_process()
        with self._cond:
            self._raise_if_failed()
            if self._synced >= self._needed:
                return None
            loop = asyncio.get_running_loop()
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.append((self._needed, loop, future))
            return future

    def close(self) -> None:
        """A last fsync of every commit not covered yet, then the thread ends (idempotent)."""
        self._same_process()
        with self._cond:
            if self._synced < self._committed and self._error is None and not self._stopping:
                self._start()             # step events alone never started it
            self._stopping = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise JournalError(*self._error)

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"sopctl-fsync {self._path}",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._synced >= self._needed and not self._stopping:
                    self._cond.wait()
                if self._synced >= self._committed:   # stopping, everything covered
                    return
                target = self._committed
            if not self._sync_up_to(target):
                return

    def _sync_up_to(self, target: int) -> bool:
        """fsync, then count the commits up to `target` as covered (True), or keep the
        failure for every later barrier (False)."""
        failure = self._fsync()
        with self._cond:
            if failure is None:
                self._advance(target)
                return True
            self._fail(failure)
            return False

    def _fsync(self) -> Exception | None:
        """fsync the WAL (the database file where there is none), then, once, the folder.
        Any failure is returned, never raised: a dead thread would leave its waiters hanging."""
        with self._io:
            return self._fsync_once()

    def _fsync_once(self) -> Exception | None:
        try:
            if self._fd < 0 or not _same_file(self._fd, self._wal):
                self._reopen()
            _datasync(self._fd)
            if not self._dir_synced:
                _fsync_folder(self._path.parent)
                self._dir_synced = True
        except Exception as exc:  # noqa: BLE001 - every failure reaches the next barrier
            return exc
        return None

    def _reopen(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            self._fd = os.open(self._wal, os.O_RDONLY | _OPEN_OWN)
        except FileNotFoundError:     # no WAL (checkpointed away): the commits are in the file
            self._fd = os.open(self._path, os.O_RDONLY | _OPEN_OWN)

    def _advance(self, generation: int) -> None:
        """Commits up to `generation` are on disk: wake whoever waits for them (lock held)."""
        self._synced = max(self._synced, generation)
        ready = [w for w in self._waiters if w[0] <= self._synced]
        self._waiters = [w for w in self._waiters if w[0] > self._synced]
        for _, loop, future in ready:
            _settle(loop, future, None)

    def _fail(self, exc: Exception) -> None:
        error = _explain(exc, self._path, "fsync")
        self._error = (error.message, error.hint or "the journal's last answers may not be on "
                       "disk; check the disk, then continue with `sopctl resume`")
        for _, loop, future in self._waiters:
            _settle(loop, future, self._error)
        self._waiters = []


def _settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None],
            error: tuple[str, str] | None) -> None:
    """Resolve a waiter's future on its own loop's thread (a closed loop has nobody waiting)."""
    def done() -> None:
        if not future.done():
            future.set_exception(JournalError(*error)) if error else future.set_result(None)
    try:
        loop.call_soon_threadsafe(done)
    except RuntimeError:
        pass


def _same_file(fd: int, path: Path) -> bool:
    """Whether `fd` is still the file at `path` (SQLite deletes the WAL when the last
    connection closes, and makes a new one on the next write)."""
    try:
        here, there = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _fsync_folder(folder: Path) -> None:
    """fsync a folder, so that the files made in it survive a power cut."""
    if not hasattr(os, "O_DIRECTORY"):   # Windows: a folder cannot be opened to fsync it
        return
    handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | _OPEN_OWN)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


# --- the journal ----------------------------------------------------------------------


class Journal:
    """A run's durable record: observer, completed-actions lookup and answer store in one.

    Open it with `Journal.create` (a run or a resume writes to it) or `Journal.open`
    (`show`, `runs`, `replay` read it). Use it as a context manager or call `close()`.
    """

    def __init__(self, path: Path, conn: sqlite3.Connection, *, writable: bool) -> None:
        self.path = path
        self._conn = conn
        self._writable = writable
        self._secrets = secret_values()
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
        self._syncer = _Syncer(path)
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
            _refuse_planted(self.path, writing=True)
            with _guard(self.path, "open"):
                self._conn = _connect(self.path, readonly=False)
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
        with _guard(path, "create"):
            _refuse_planted(path, writing=True)     # before mkdir: it would follow a link
            path.parent.mkdir(parents=True, exist_ok=True)
            _refuse_planted(path, writing=True)     # ... and after, for one made meanwhile
            conn = _connect(path, readonly=False)
        return cls(path, conn, writable=True)

    def _start(self, *, sop_name: str, sop_hash: str, force: bool, sop_path: str,
               include_dirs: tuple[str, ...] = ()) -> None:
        self.workspace = self.path.parent.parent
        try:
            self._init_schema()      # opens the transaction the meta rows commit
            try:
                self._check_meta(sop_hash=sop_hash, force=force)
                self._lock = _take_writer_lock(self.path)
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
            journal._lock = _take_writer_lock(journal.path)
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
        with self._mutex, _guard(self.path, "write an answer to"):
            self._sync(full=True)     # the process exits next: on disk before it says so
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                taken = self._conn.execute("SELECT 1 FROM answers WHERE request_hash = ?",
                                           (key,)).fetchone()
                if taken is None:
                    self._conn.execute(
                        "INSERT INTO events (ts, type, key, json) VALUES (?, ?, ?, ?)",
                        (time.time(), event_type(event), key, payload))
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

    @classmethod
    def open(cls, workspace: str | Path, *, writable: bool = False) -> Journal:
        """Open an existing journal (read-only by default); a missing one is a JournalError."""
        path = journal_path(workspace)
        if not Path(workspace).is_dir():
            what = "is not a folder" if Path(workspace).exists() else "does not exist"
            raise JournalError(f"run folder {workspace} {what}",
                               "give the workspace of a run (`sopctl runs` lists them)")
        _refuse_planted(path, writing=writable)
        if not path.is_file():
            raise JournalError(f"{workspace} has no journal ({JOURNAL_DIR}/{JOURNAL_FILE})",
                               "give the workspace of a run made by `sopctl run`")
        with _guard(path, "open"):
            conn = _connect(path, readonly=not writable)
        journal = cls(path, conn, writable=writable)
        try:
            journal._check_meta(sop_hash=None, force=False)
        except BaseException:
            journal.close()
            raise
        return journal

    def _init_schema(self) -> None:
        """Begin the journal's first transaction with its tables: the checks read in it, and
        `_write_meta` commits it, fsynced (one commit for a new journal, not two)."""
        with _guard(self.path, "initialise"):
            self._sync(full=True)
            self._conn.executescript("BEGIN IMMEDIATE;" + _SCHEMA)   # left open

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

    def _write_meta(self, *, sop_name: str, sop_hash: str, sop_path: str,
                    include_dirs: tuple[str, ...] = ()) -> None:
        rows = {"sop_path": sop_path} if sop_path else {}
        if include_dirs:  # --include-path folders: a resume compiles the SOP with them again
            rows["include_dirs"] = json.dumps(list(include_dirs))
        rows |= {"schema_version": str(SCHEMA_VERSION), "sop_name": sop_name,
                "sop_hash": sop_hash, "engine_version": __version__}
        with _guard(self.path, "write"):    # in `_init_schema`'s transaction
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
        try:
            self._conn.close()
        except sqlite3.Error:
            pass
        for handle in self._lock:
            os.close(handle)             # closing the descriptors releases the flock
        self._lock = ()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # reading ---------------------------------------------------------------------------

    def _flush_if_writing(self) -> None:
        """A writer reads its own buffered events too."""
        if self._writable:
            self.flush()

    def check_intact(self) -> None:
        """SQLite's structural check of every page: a resume or replay reads the answers
        table lazily, so damage there would otherwise surface mid-run, as a failed run."""
        with _guard(self.path, "read"):
            verdict = self._conn.execute("PRAGMA quick_check(1)").fetchone()
        if verdict != ("ok",):
            what, hint = _PROBLEMS["corrupt"]
            raise JournalError(f"cannot read journal {self.path}: {what} (SQLite's page check fails)", hint)

    def meta(self) -> dict[str, str]:
        """The meta rows; a file without them was never initialised (a JournalError)."""
        with _guard(self.path, "read"):
            tables = {r[0] for r in self._conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()}
            if "meta" not in tables:
                raise JournalError(f"journal {self.path} is empty or not a sopctl journal",
                                   "the run died while creating it; start the run again")
            return dict(self._conn.execute("SELECT key, value FROM meta").fetchall())

    def events(self) -> list[EventRow]:
        """Every event in order, payloads decoded from JSON."""
        self._flush_if_writing()
        with _guard(self.path, "read"):
            rows = self._conn.execute("SELECT seq, ts, type, json FROM events ORDER BY seq").fetchall()
        return [EventRow(seq, ts, typ, _loads(data, seq)) for seq, ts, typ, data in rows]

    def answers(self) -> list[AnswerRow]:
        """Every journaled model answer, in the order they were recorded."""
        with _guard(self.path, "read"):
            rows = self._conn.execute(
                "SELECT request_hash, action, text, prompt_tokens, completion_tokens, cost_usd, "
                "model, seconds, origin, seq FROM answers ORDER BY rowid").fetchall()
        return [AnswerRow(h, a, StoredAnswer(t, pt, ct, c, model=m, seconds=sec), o, s)
                for h, a, t, pt, ct, c, m, sec, o, s in rows]

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
        self._flush_if_writing()
        with _guard(self.path, "read"):
            rows = self._conn.execute("SELECT seq, ts, type, json FROM events WHERE type = "
                                      "'ActionCompleted' ORDER BY seq").fetchall()
        done: dict[str, ActionCompleted] = {}
        for seq, ts, typ, data in rows:
            event = decode_event(EventRow(seq, ts, typ, _loads(data, seq)))
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
        with _guard(self.path, doing):
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
        with _guard(self.path, "read"):
            row = self._conn.execute("SELECT json FROM events WHERE type = 'RunStarted' "
                                     "ORDER BY seq LIMIT 1").fetchone()
        other = _loads(row[0], 0).get("run_id") if row else None
        if other and other != run_id:
            raise JournalError(f"workspace {self.path.parent.parent} already holds run {other}",
                               f"continue it with `sopctl resume {self.path.parent.parent}`, "
                               "or give the new run another --out")

    def is_fsynced(self, event: RunEvent) -> bool:
        """Whether `on_event` fsyncs this event before returning (the durability tier)."""
        return self._fsync_all or event_type(event) in _FSYNCED_EVENTS

    def durable(self) -> asyncio.Future[None] | None:
        """The durability barrier (`engine.models.types.durable`): None when every answer
        recorded so far is fsynced, else a future done when the syncer's fsync covers them
        (await it in the event loop). A failed fsync is a JournalError naming the journal."""
        return self._syncer.wait() if self._writable else None

    def require_durable(self) -> None:
        """A JournalError naming the journal if one of its fsyncs failed (call it after
        `close`: a run's end reports an fsync that failed after its last barrier)."""
        self._syncer._raise_if_failed()

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
        with _guard(self.path, "read"):
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
        with _guard(self.path, "read"):
            return self._conn.execute("SELECT 1 FROM answers WHERE request_hash = ?",
                                      (request_hash,)).fetchone() is not None

    def _may_hold(self, request_hash: str) -> bool:
        """False when the answers table certainly lacks this hash (the journal's writer knows
        every hash in it); True when a query must tell (a reader: another process may write)."""
        if not self._sole_writer:
            return True
        if self._known is None:
            with _guard(self.path, "read"):
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
        """What was sent for an answer, secrets redacted, compressed when long (the first wins)."""
        text = scrub(json.dumps(exchange, ensure_ascii=False), self._secrets)
        data: str | bytes = text
        if len(text) > EXCHANGE_COMPRESS_AT:
            data = _compress(text.encode("utf-8"))
        self._conn.execute("INSERT OR IGNORE INTO exchanges VALUES (?, ?)", (request_hash, data))

    def exchanges(self) -> dict[str, dict[str, Any]]:
        """What was sent for each answer, by request hash (empty for a journal from before
        prompts were kept, which has no `exchanges` table)."""
        with _guard(self.path, "read"):
            if not self._has_table("exchanges"):
                return {}
            rows = self._conn.execute("SELECT request_hash, data FROM exchanges").fetchall()
        return {key: _exchange_of(key, data) for key, data in rows}

    def exchange(self, request_hash: str) -> dict[str, Any] | None:
        """What was sent for one answer, or None when the journal did not keep it."""
        with _guard(self.path, "read"):
            if not self._has_table("exchanges"):
                return None
            row = self._conn.execute("SELECT data FROM exchanges WHERE request_hash = ?",
                                     (request_hash,)).fetchone()
        return _exchange_of(request_hash, row[0]) if row else None

    def _has_table(self, name: str) -> bool:
        return self._conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                  (name,)).fetchone() is not None

    def _require_writable(self) -> None:
        if not self._writable:
            raise JournalError(f"journal {self.path} is open read-only")


class ReplayStore:
    """The answer store of a replay: answers come from the old journal, never from a model.

    Every answer used is also copied into the replay's own journal (origin `replay`), so
    that the replay's workspace is itself a complete, replayable run. `record` only happens
    if the gateway called a model, which it must not do in replay mode; it is kept for the
    protocol and stores into the new journal.
    """

    def __init__(self, source: Journal, target: Journal) -> None:
        self.source = source
        self.target = target
        self.misses: list[str] = []
        """Request hashes the run asked for that the old journal lacks (a divergence)."""

    def lookup(self, request_hash: str) -> StoredAnswer | None:
        answer = self.source.lookup(request_hash)
        if answer is None:
            self.misses.append(request_hash)
        else:
            action = self._action_of(request_hash)
            answer = dataclasses.replace(answer, exchange=self._exchange_of(request_hash))
            self.target.record_as(request_hash, action, answer, origin="replay")
        return answer

    def holds(self, request_hash: str) -> bool:
        return self.source.holds(request_hash)

    def record(self, request_hash: str, action: str, answer: StoredAnswer) -> None:
        self.target.record(request_hash, action, answer)

    def durable(self) -> asyncio.Future[None] | None:
        return self.target.durable()

    def _exchange_of(self, request_hash: str) -> dict[str, Any] | None:
        """The prompt to copy with the answer; a damaged one is left out (the answer is what
        a replay needs, the prompt is only for people to read)."""
        try:
            return self.source.exchange(request_hash)
        except JournalError:
            return None

    def _action_of(self, request_hash: str) -> str:
        with _guard(self.source.path, "read"):
            row = self.source._conn.execute("SELECT action FROM answers WHERE request_hash = ?",
                                            (request_hash,)).fetchone()
        return row[0] if row else "?"


def _artifact_intact(workspace: Path, artifact: dict[str, str]) -> bool:
    """True when the file is there with the recorded sha256 (unreadable counts as changed)."""
    path = workspace / str(artifact.get("path", ""))
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() == artifact.get("sha256")
    except OSError:
        return False


def _lock_file(path: Path) -> Path:
    return path.with_name("writer.lock")


def _own_files(path: Path) -> tuple[Path, ...]:
    """The files sopctl itself keeps beside the journal (SQLite makes the -wal and -shm)."""
    return (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm"),
            _lock_file(path))


def _refuse_planted(path: Path, *, writing: bool) -> None:
    """Refuse a run folder whose own files were planted: links, or not what sopctl makes.

    A missing file is fine (sopctl creates it); a hard link is refused only for writing,
    since writing through it would change the other name's file too."""
    _require_kind(path.parent, stat.S_ISDIR, "a folder", writing=False)
    for own in _own_files(path):
        _require_kind(own, stat.S_ISREG, "a plain file", writing=writing)


def _require_kind(path: Path, is_kind: Callable[[int], bool], kind: str, *, writing: bool) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _explain(exc, path, "check") from None
    hint = (f"sopctl never follows its own files ({JOURNAL_DIR}/) through a link; remove "
            f"{path} (a workspace from elsewhere must not bring its own {JOURNAL_DIR}/)")
    if stat.S_ISLNK(info.st_mode):
        raise JournalError(f"run folder entry {path} is a symlink; refused", hint)
    if not is_kind(info.st_mode):
        raise JournalError(f"run folder entry {path} is not {kind}; refused", hint)
    if writing and stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        raise JournalError(f"run folder file {path} has {info.st_nlink} hard links; refused",
                           "writing it would change the other names' file too; copy the run "
                           "folder instead of linking it")


_OPEN_OWN = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
"""How sopctl opens its own files: never through a link, never blocking on a FIFO."""


def _take_writer_lock(path: Path) -> tuple[int, ...]:
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
    with _guard(path, "lock"):
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | _OPEN_OWN)
    held = [folder]
    try:
        folder_locked = _try_lock(folder, path)
        held.append(pid_file := _open_pid_file(_lock_file(path)))
        if not folder_locked and not _try_lock(pid_file, path):
            raise JournalError(f"cannot lock journal {path}: this file system has no flock",
                               "put the workspace on a local disk")
        with _guard(path, "lock"):
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
    with _guard(lock, "lock"):
        handle = os.open(lock, os.O_RDWR | os.O_CREAT | _OPEN_OWN, 0o644)
    info = os.fstat(handle)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(handle)
        raise JournalError(f"run folder file {lock} is not a plain file of its own; refused",
                           f"remove {lock}; sopctl makes it again")
    return handle


def _read_pid(lock: Path) -> str:
    """The pid the lock's holder wrote, or `?` (the file is only informative)."""
    try:
        handle = os.open(lock, os.O_RDONLY | _OPEN_OWN)
    except OSError:
        return "?"
    try:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            return "?"
        return os.read(handle, 32).decode("ascii", "replace").strip() or "?"
    finally:
        os.close(handle)


def never_started(workspace: str | Path) -> bool:
    """True when the journal in `workspace` holds no run yet: a process killed while creating
    it left a file without its tables (they are made in one transaction), or one without a
    single event or answer. Nothing was paid, so the run can be started afresh. A journal
    that cannot be read is not 'never started' (resume and show explain what is wrong)."""
    path = journal_path(workspace)
    if writer_active(workspace):
        return False
    try:
        conn = _connect_readonly(path)
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
        handle = os.open(path, os.O_RDONLY | flags | _OPEN_OWN)
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


def _connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    """A connection in autocommit mode: each statement is its own committed transaction."""
    if readonly:
        return _connect_readonly(path)
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=10, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("SELECT count(*) FROM sqlite_master").fetchone()   # fails fast on a torn file
    return conn


def _connect_readonly(path: Path) -> sqlite3.Connection:
    """Read-only; on a read-only medium (no -shm can be made) fall back to `immutable`."""
    uri = path.resolve().as_uri()
    try:
        return _open_uri(f"{uri}?mode=ro")
    except sqlite3.OperationalError as exc:
        if _kind(exc) not in ("cantopen", "readonly"):
            raise
        return _open_uri(f"{uri}?immutable=1")


def _open_uri(uri: str) -> sqlite3.Connection:
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=10, check_same_thread=False)
    conn.execute("PRAGMA query_only = ON")
    conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    return conn


def _compress(data: bytes) -> bytes:
    """A zlib stream (`zlib.decompress` reads it) at level 1: most of level 6's saving for a
    third of its CPU. Its window and hash table are sized to the text (a 4 KiB exchange gets a
    4 KiB window, not 32): setting up a full-size stream, memory cleared for every exchange,
    cost more than compressing a few KiB, and a window larger than the text finds nothing
    more to repeat."""
    window = min(15, max(9, len(data).bit_length()))
    packer = zlib.compressobj(1, zlib.DEFLATED, window, max(1, min(9, window - 7)))
    return packer.compress(data) + packer.flush()


def _exchange_of(request_hash: str, data: str | bytes) -> dict[str, Any]:
    """A stored exchange back as JSON (a BLOB is zlib-compressed); damage is a JournalError."""
    try:
        text = zlib.decompress(data).decode("utf-8") if isinstance(data, bytes) else str(data)
        value = json.loads(text)
    except (zlib.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise JournalError(f"journal exchange {request_hash[:12]} cannot be read ({exc})", _DAMAGED) from None
    if not isinstance(value, dict) or not isinstance(value.get("messages"), list):
        raise JournalError(f"journal exchange {request_hash[:12]} has no list of messages", _DAMAGED)
    return value


def _loads(text: str, seq: int) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise JournalError(f"journal event {seq} is not valid JSON ({exc})",
                           "the journal was damaged outside sopctl") from None
    if not isinstance(data, dict):
        raise JournalError(f"journal event {seq} is not a JSON object")
    return data
