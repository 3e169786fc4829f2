"""Group commit's second half: the thread that fsyncs a writable journal's WAL.

What survives what:

- kill -9 (a crash, Ctrl-C, `os._exit`): every commit. A commit in WAL mode has written its
  frames to the WAL file before it returns, and the operating system keeps them whatever
  happens to the process. A process killed between two commit points loses only the events
  buffered since the last one (a step's start, a round start, a reused answer's
  event, a published message); `resume` re-creates them by re-executing with the journaled answers, at no cost,
  so the kill -9 sweep of tests/journal/test_faults.py still repeats at most the one call that was
  in flight.
- a power cut (the OS dies too): what an fsync covered. `Syncer` fsyncs the WAL (and the
  `.sopctl` folder, once) at the durability barrier, covering every commit so far (the
  answers of a fan-out, the step events), so one fsync serves every answer committed
  before it. Where: at the barrier itself, on the calling thread, after one turn of the
  event loop (a fan-out's other calls reach their barriers first and share it), while this
  disk's last fsync took under INLINE_FSYNC_S (the common case: handing the fsync to a thread
  and its result back to the event loop cost more CPU than the fsync, about a quarter of a
  tool step); on a slower disk, a thread of the journal's fsyncs whenever an answer was
  committed, off the event loop, and the barrier waits for it. The durability barrier, `durable()` (through
  `engine.models.types.durable`, which the models and run layers call without knowing the
  journal), is awaited right before something leaves the process that may have been built
  from the answers: a paid model request (engine.models.gateway), a command (`kind:
  exec`), a tool that acts outside (engine.run.toolloop), a question or a message to a
  person (engine.run.actions, engine.run.people). "Depends" is precise: the barrier waits
  for every answer recorded before it was called (the thing about to leave was built by
  then), not for answers recorded while it waits (a fan-out's other calls: nothing this
  call sends was built from them, and waiting for them would cost an fsync per answer
  instead of one per wave). It returns at once when the last fsync covers them, else it
  fsyncs (a quick disk) or waits, without blocking the event loop, for the thread's next
  fsync (a slow one). So a power cut
  loses only answers nothing has acted on yet (`resume` asks for them again: at most
  about as many calls as were running at once) and events after the last fsync, never an
  answer that something outside was told about or paid on.
- a failed fsync (EIO, ENOSPC): kept, and raised as a JournalError naming the journal at the
  next barrier and every one after (after a failed fsync the kernel may have dropped the
  pages: nothing written since can be called durable); the run stops there. One that fails
  after the run's last barrier is raised at its end (`require_durable`, engine.api).

The thread starts with the first commit it must cover on a slow disk, stops at `close`
after a last fsync, and starts afresh in a forked child. `SOPCTL_JOURNAL_SYNC=answer` fsyncs each answer before
`record` returns, on the calling thread (the default before the syncer: one fsync per answer
on the run's path); `full` commits and fsyncs every event on its own before the run goes on
(about three fsyncs per model call). bench/journal_bench.py measures them all; `tiered`, an
older name of the default, is accepted.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Awaitable
from pathlib import Path

from engine.errors import JournalError
from engine.journal.run_folder import OPEN_OWN, datasync
from engine.journal.sqlite_errors import explain

__all__ = ["INLINE_FSYNC_S", "Syncer", "datasync"]


INLINE_FSYNC_S = 0.002
"""An fsync this quick (the last one measured) is done at the barrier, on the calling thread;
a slower one on the journal's thread, so the event loop never stops for long."""


class Syncer:
    """The second half of group commit: fsyncs of the journal's WAL after commits.

    Every commit adds one to a generation count, and an answer's commit marks its generation
    as needed; an fsync covers every commit before it, so all the commits that land before
    one (the answers of a fan-out, the step events around them) share it. The step events
    alone never need one: they ride along with the next answer's fsync (a power cut losing
    them costs nothing, `resume` re-creates them). `wait` is the barrier: nothing while
    every answer committed so far is covered; else, while the disk is quick (its last fsync
    under INLINE_FSYNC_S), an fsync right there; on a slow disk a future that the thread,
    woken by each answer's commit, resolves once they are covered (answers committed later
    are the next `wait`'s business). An fsync that fails (EIO, ENOSPC) is kept and raised at every later
    `wait`: after a failed fsync the kernel may have dropped the pages, so nothing written
    since can be called durable.

    One per writable `Journal`; the thread starts with the first commit it must cover on a
    slow disk and stops in `close`, after a last fsync. A forked child starts afresh with its own lock and
    thread (the parent's thread does not exist there; its lock may have been held).
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._wal = str(path.with_name(path.name + "-wal"))
        self._fd = -1                   # the WAL, opened by the thread
        self._fd_id = (-1, -1)          # its device and inode, as opened
        self._dir_synced = False        # the folder's entries for the journal and its WAL
        self._committed = 0             # commits so far
        self._needed = 0                # the generation of the last answer's commit
        self._synced = 0                # commits an fsync covered
        self._last_fsync_s = 0.0        # how long the last fsync took (quick: at the barrier)
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
            if self._inline():
                return              # the barrier fsyncs it
            self._start()
            self._cond.notify()
        # No hand-over of the GIL here (time.sleep(0)): it starts the fsync a little sooner
        # after a lone answer, but splits a fan-out's burst of answers over two fsyncs, and
        # measured no better on a chain of single calls (bench/journal_bench.py --fsync-ms).

    def sync_now(self) -> None:
        """fsync every commit so far on this thread (SOPCTL_JOURNAL_SYNC=answer, and a quick
        disk's barrier); a failure is a JournalError here and at every later barrier."""
        self._same_process()
        with self._cond:
            self.raise_if_failed()
            target = self._committed
        self._sync_up_to(target)
        self.raise_if_failed()

    def unsynced(self) -> int:
        """Answers' commits (and those before them) not yet covered by an fsync."""
        with self._cond:
            return max(self._needed - self._synced, 0)

    def wait(self) -> Awaitable[None] | None:
        """None when every answer committed so far is on disk, else something to await (from a
        coroutine) until it is: on a quick disk an fsync here after one turn of the event
        loop (`_after_the_others`), on a slow one the thread's. A failed fsync is a
        JournalError, here or from what is awaited."""
        self._same_process()
        with self._cond:
            self.raise_if_failed()
            if self._synced >= self._needed:
                return None
            if self._inline():
                return self._after_the_others(self._needed)
        with self._cond:
            if self._synced >= self._needed:
                return None
            self._start()             # the disk turned slow after the commit: the thread's now
            self._cond.notify()
            loop = asyncio.get_running_loop()
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.append((self._needed, loop, future))
            return future

    async def _after_the_others(self, needed: int) -> None:
        """The barrier's own fsync, once every other task ready to run has had its turn: the
        other calls of a fan-out reach their barriers first, wanting the same answers on disk,
        and this one fsync covers them all. Without the turn, on a model that answers at once,
        each call of a fan-out ran to its answer before the next one started, and each of them
        paid an fsync for its predecessor's answer (a turn costs a few microseconds, an fsync
        a hundred or more)."""
        await asyncio.sleep(0)
        with self._cond:
            self.raise_if_failed()
            covered = self._synced >= needed    # by another barrier's fsync meanwhile
        if not covered:
            self.sync_now()

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

    def _inline(self) -> bool:
        """Whether the barrier fsyncs itself: the disk's last fsync was quick (a thread started
        while it was slow sleeps until an answer's commit finds it slow again)."""
        return self._last_fsync_s < INLINE_FSYNC_S

    def raise_if_failed(self) -> None:
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
            if self._fd < 0 or not _still_at(self._fd_id, self._wal):
                self._reopen()
            started = time.perf_counter()
            datasync(self._fd)
            self._last_fsync_s = time.perf_counter() - started
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
            self._fd = os.open(self._wal, os.O_RDONLY | OPEN_OWN)
        except FileNotFoundError:     # no WAL (checkpointed away): the commits are in the file
            self._fd = os.open(self._path, os.O_RDONLY | OPEN_OWN)
        opened = os.fstat(self._fd)
        self._fd_id = (opened.st_dev, opened.st_ino)

    def _advance(self, generation: int) -> None:
        """Commits up to `generation` are on disk: wake whoever waits for them (lock held)."""
        self._synced = max(self._synced, generation)
        ready = [w for w in self._waiters if w[0] <= self._synced]
        self._waiters = [w for w in self._waiters if w[0] > self._synced]
        for _, loop, future in ready:
            _settle(loop, future, None)

    def _fail(self, exc: Exception) -> None:
        error = explain(exc, self._path, "fsync")
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


def _still_at(opened: tuple[int, int], path: str) -> bool:
    """Whether the file opened as `opened` (device, inode) is still the one at `path` (SQLite
    deletes the WAL when the last connection closes, and makes a new one on the next write):
    one stat a fsync, the open file's identity kept from when it was opened."""
    try:
        there = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return opened == (there.st_dev, there.st_ino)


def _fsync_folder(folder: Path) -> None:
    """fsync a folder, so that the files made in it survive a power cut."""
    if not hasattr(os, "O_DIRECTORY"):   # Windows: a folder cannot be opened to fsync it
        return
    handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | OPEN_OWN)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
