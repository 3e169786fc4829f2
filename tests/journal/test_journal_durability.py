"""Group commit's durability barrier: a paid answer is fsynced before anything depends on it.

The journal commits each answer without an fsync (it survives kill -9 at once) and a
background thread fsyncs the WAL; before a paid model request, a command, a tool that acts
outside, a question or a message to a person, the run awaits the barrier
(`engine.models.types.durable`). These tests slow the disk's fsync down so that a missing
barrier would let the next request out while the last answer is still unsynced.
"""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from engine import api
from engine.errors import JournalError
from engine.journal import syncer as journal_syncer
from engine.journal.store import SYNC_ENV, Journal
from engine.models.types import ModelAnswer, ModelRequest, StoredAnswer, durable
from engine.run.people import PersonAnswer, Question
from engine.testing import ScriptedModel, ScriptedPerson, use_model
from run_helpers import fenced

SOP = """\
apiVersion: sop/v1
name: durable
inputs:
  idea: {type: str, required: true}
team: {max_rounds: 6}
actions:
  ListFiles:
    prompt: "List the files for: {{ inputs.idea }}"
    context: none
    output:
      Task list: {type: "list[str]", instruction: file names}
    review: human
  WriteFile:
    for_each: "{{ msgs.ListFiles[-1].out['Task list'] }}"
    as: filename
    max_concurrency: 4
    prompt: "Write {{ filename }}."
    context: none
    output: {code: python}
    artifacts: [{path: "src/{{ filename }}", content: "{{ out }}"}]
  Notify:
    kind: reply
    prompt: "The files of {{ inputs.idea }} are written."
  Check:
    prompt: "Say whether the files of {{ inputs.idea }} are complete."
    context: none
    output: text
  RunCode:
    kind: exec
    command: ["python", "-c", "print('ran')"]
    command_timeout_s: 30
roles:
  Lead: {actions: [ListFiles], watch: [UserRequirement]}
  Coder: {actions: [WriteFile], watch: [ListFiles]}
  Herald: {actions: [Notify], watch: [WriteFile]}
  Checker: {actions: [Check], watch: [Notify]}
  Runner: {actions: [RunCode], watch: [Check]}
"""

FILES = ["a.py", "b.py", "c.py", "d.py"]


class Probe:
    """Watches the run's journal. At each barrier it notes, for the task that calls it, the
    last answer recorded so far; at each point where something then leaves the process it
    notes whether that answer was fsynced (a point without a barrier before it, in its own
    task, since its last one, counts as unsynced).

    Its disk fsyncs only on demand: an fsync waits until a barrier waits for it (or the
    journal closes), so an answer stays unsynced until something asks for it, and a
    missing barrier is caught every time, however fast or loaded the machine."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.syncers: list[Any] = []
        self.seen: list[tuple[str, bool]] = []
        self.required: dict[Any, list[tuple[Any, int]]] = {}
        self.fsyncs = 0
        self.in_barrier = 0
        real_init, real_sync = journal_syncer.Syncer.__init__, journal_syncer.datasync
        real_wait, real_after = journal_syncer.Syncer.wait, journal_syncer.Syncer._after_the_others

        def init(syncer: Any, path: Path) -> None:
            real_init(syncer, path)
            self.syncers.append(syncer)

        def on_demand_sync(fd: int) -> None:
            deadline = time.monotonic() + 10
            while not self._demanded() and time.monotonic() < deadline:
                time.sleep(0.001)
            real_sync(fd)
            self.fsyncs += 1

        def wait(syncer: Any) -> Any:
            self.required.setdefault(_task(), []).append((syncer, syncer._needed))
            self.in_barrier += 1
            try:
                return real_wait(syncer)
            finally:
                self.in_barrier -= 1

        async def after_the_others(syncer: Any, needed: int) -> None:
            self.in_barrier += 1          # a quick disk's barrier fsyncs in here, after a turn
            try:
                await real_after(syncer, needed)
            finally:
                self.in_barrier -= 1

        monkeypatch.setattr(journal_syncer.Syncer, "__init__", init)
        monkeypatch.setattr(journal_syncer.Syncer, "wait", wait)
        monkeypatch.setattr(journal_syncer.Syncer, "_after_the_others", after_the_others)
        monkeypatch.setattr(journal_syncer, "datasync", on_demand_sync)

    def _demanded(self) -> bool:
        return self.in_barrier > 0 or any(s._waiters or s._stopping for s in self.syncers)

    def note(self, where: str) -> None:
        """Something leaves the process: were the answers its barrier saw fsynced?"""
        required = self.required.pop(_task(), [])
        answered = any(s._needed for s in self.syncers)
        synced = bool(required) or not answered
        self.seen.append((where, synced and all(s._synced >= n for s, n in required)))


def _task() -> Any:
    """The running task (None outside an event loop)."""
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


def answer(spec: Any, attempt: int) -> Any:
    if spec.action == "ListFiles":
        return {"Task list": FILES}
    return fenced("print('hello')") if spec.kind == "code" else "complete"


class CheckedModel(ScriptedModel):
    """Notes the probe the moment a request goes out (before it yields to other calls)."""

    probe: Probe | None = None

    async def complete(self, request: ModelRequest) -> ModelAnswer:
        assert self.probe is not None
        self.probe.note(f"model request for {request.spec.action}")
        return await super().complete(request)


class CheckedPerson(ScriptedPerson):
    def __init__(self, probe: Probe, answers: list[Any]) -> None:
        super().__init__(answers)
        self.probe = probe

    def ask(self, question: Question) -> PersonAnswer:
        self.probe.note("question to a person")
        return super().ask(question)

    def tell(self, role: str, text: str) -> None:
        self.probe.note("message to a person")
        super().tell(role, text)


def run_durable_sop(tmp_path: Path, probe: Probe, monkeypatch: pytest.MonkeyPatch) -> Any:
    from engine.run import actions

    real_command = actions.run_command

    async def run_command(*args: Any, **kwargs: Any) -> Any:
        probe.note("command")
        return await real_command(*args, **kwargs)

    monkeypatch.setattr(actions, "run_command", run_command)
    path = tmp_path / "durable.sop.yaml"
    path.write_text(SOP, encoding="utf-8")
    person = CheckedPerson(probe, [PersonAnswer("approve")])
    model = CheckedModel(answer)
    model.probe = probe
    with use_model(model):
        return api.run(api.load(path), {"idea": "tea"}, api.RunOptions(workspace=tmp_path / "ws",
                       person=person, allow_exec=True))


def test_every_answer_is_fsynced_before_anything_depends_on_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe = Probe(monkeypatch)
    result = run_durable_sop(tmp_path, probe, monkeypatch)
    assert result.status == "idle", result.error
    where = [w for w, _ in probe.seen]
    assert where.count("model request for WriteFile") == len(FILES)
    assert where[-3:] == ["message to a person", "model request for Check", "command"]
    assert {"model request for ListFiles", "question to a person"} <= set(where)
    unsynced = [w for w, synced in probe.seen if not synced]
    assert unsynced == [], f"sent while an answer was not on disk: {unsynced}"
    assert probe.fsyncs >= 1
    assert all(s.unsynced() == 0 for s in probe.syncers)    # closed: everything fsynced


def test_a_fan_out_on_a_model_that_answers_at_once_shares_one_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each call of a wave waits at its barrier for the answers recorded before it, the
    list's; on a model that answers at once, the first call used to get its answer before the
    second one started, so each call fsynced its predecessor's answer: four calls, four
    fsyncs. The barrier lets the others reach it first: one fsync for the wave."""
    fsyncs_before_request: list[int] = []
    fsyncs = 0
    real_sync = journal_syncer.datasync

    def counted(fd: int) -> None:
        nonlocal fsyncs
        fsyncs += 1
        real_sync(fd)

    def script(spec: Any, attempt: int) -> Any:
        if spec.action == "WriteFile":
            fsyncs_before_request.append(fsyncs)
        return answer(spec, attempt)

    monkeypatch.setattr(journal_syncer, "datasync", counted)
    path = tmp_path / "durable.sop.yaml"
    path.write_text(SOP, encoding="utf-8")
    with use_model(ScriptedModel(script, instant=True)):
        result = api.run(api.load(path), {"idea": "tea"}, api.RunOptions(
            workspace=tmp_path / "ws", person=ScriptedPerson([PersonAnswer("approve")]), allow_exec=True))
    assert result.status == "idle", result.error
    assert len(fsyncs_before_request) == len(FILES)
    assert fsyncs_before_request[0] >= 1                       # the list's answer: on disk first
    assert fsyncs_before_request[-1] - fsyncs_before_request[0] == 0, fsyncs_before_request


def test_the_barrier_waits_only_for_answers_not_yet_synced(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    probe = Probe(monkeypatch)
    with Journal.create(tmp_path, sop_name="x", sop_hash="h") as journal:
        asyncio.run(durable(journal))             # the journal's creation: fsynced at once
        journal.record("h1", "Write", StoredAnswer("one", 1, 1, 0.0))
        journal.record("h2", "Write", StoredAnswer("two", 1, 1, 0.0))
        assert journal.unsynced() > 0             # committed, not fsynced yet (slow disk)
        asyncio.run(durable(journal))
        assert journal.unsynced() == 0
        assert journal.durable() is None          # nothing new: no wait at all
    assert probe.fsyncs >= 1


def test_answer_mode_fsyncs_each_answer_before_record_returns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SYNC_ENV, "answer")
    synced_on: list[str] = []
    real_sync = journal_syncer.datasync

    def sync(fd: int) -> None:
        synced_on.append(threading.current_thread().name)
        real_sync(fd)

    monkeypatch.setattr(journal_syncer, "datasync", sync)
    with Journal.create(tmp_path, sop_name="x", sop_hash="h") as journal:
        asyncio.run(durable(journal))
        before = len(synced_on)
        journal.record("h1", "Write", StoredAnswer("one", 1, 1, 0.0))
        assert synced_on[before:] == [threading.current_thread().name]   # here, before it returned
        assert journal._syncer._synced == journal._syncer._committed
        assert journal.durable() is None


def test_a_quick_disk_is_fsynced_at_the_barrier_and_a_slow_one_on_the_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Handing an fsync to a thread and back cost more CPU than a quick disk's fsync: while
    the last one took under INLINE_FSYNC_S the barrier fsyncs on its own thread (after one
    turn of the event loop), and no thread starts; once one is slow, each answer's commit
    wakes the thread, and the barrier waits for it without blocking the event loop."""
    synced_on: list[str] = []
    slow = False
    real_sync = journal_syncer.datasync

    def sync(fd: int) -> None:
        synced_on.append(threading.current_thread().name)
        if slow:
            time.sleep(journal_syncer.INLINE_FSYNC_S * 2)
        real_sync(fd)

    monkeypatch.setattr(journal_syncer, "datasync", sync)
    here = threading.current_thread().name
    with Journal.create(tmp_path, sop_name="x", sop_hash="h") as journal:
        journal.record("h1", "Write", StoredAnswer("one", 1, 1, 0.0))
        assert journal.unsynced() > 0 and synced_on == []        # committed; the barrier fsyncs
        asyncio.run(durable(journal))
        assert synced_on == [here] and journal.unsynced() == 0 and journal.durable() is None
        assert journal._syncer._thread is None

        slow = True
        journal.record("h2", "Write", StoredAnswer("two", 1, 1, 0.0))
        asyncio.run(durable(journal))
        assert synced_on == [here, here]            # measured slow here
        journal.record("h3", "Write", StoredAnswer("three", 1, 1, 0.0))

        async def barrier() -> None:
            await durable(journal)

        asyncio.run(barrier())
        assert journal.unsynced() == 0 and synced_on[2:] and here not in synced_on[2:]
        assert journal._syncer._thread is not None


@pytest.mark.parametrize("code, words", [(errno.EIO, "Input/output error"),
                                         (errno.ENOSPC, "the disk is full")])
def test_a_failed_fsync_is_a_journal_error_at_the_barrier(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, words: str) -> None:
    def broken(fd: int) -> None:
        raise OSError(code, "Input/output error" if code == errno.EIO else "No space left on device")

    monkeypatch.setattr(journal_syncer, "datasync", broken)
    journal = Journal.create(tmp_path, sop_name="x", sop_hash="h")
    try:
        journal.record("h1", "Write", StoredAnswer("one", 1, 1, 0.0))   # committed: survives kill -9
        for _ in range(2):                        # and every later barrier fails too
            with pytest.raises(JournalError) as failed:
                asyncio.run(durable(journal))
            assert str(journal.path) in failed.value.message and words in failed.value.message
    finally:
        journal.close()
    with Journal.open(tmp_path) as reread:        # the answer itself was committed
        assert reread.lookup("h1") is not None


def test_a_run_stops_before_paying_when_its_journal_cannot_be_fsynced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(journal_syncer, "datasync", broken)
    model = ScriptedModel(lambda spec, attempt: {"Task list": FILES})
    path = tmp_path / "durable.sop.yaml"
    path.write_text(SOP, encoding="utf-8")
    with use_model(model):
        result = api.run(api.load(path), {"idea": "tea"}, api.RunOptions(workspace=tmp_path / "ws",
                         person=ScriptedPerson([PersonAnswer("approve")]), allow_exec=True))
    assert result.status == "failed"
    assert "cannot fsync journal" in result.error and str(tmp_path / "ws") in result.error
    assert model.requests == []                   # nothing paid on a journal that is not durable


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_gets_its_own_syncer(tmp_path: Path) -> None:
    """The batch runner may fork with a journal's syncer running: the child has no such
    thread (and the lock may have been held), so it starts its own."""
    with Journal.create(tmp_path, sop_name="x", sop_hash="h") as journal:
        journal.record("h1", "Write", StoredAnswer("one", 1, 1, 0.0))
        asyncio.run(durable(journal))             # the parent's syncer thread is running
        pid = os.fork()
        if pid == 0:                              # the child: a new commit, then the barrier
            code = 1
            try:
                journal._syncer.committed(fsynced=False, answer=True)
                asyncio.run(asyncio.wait_for(durable(journal), timeout=20))
                code = 0 if journal.unsynced() == 0 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0


TERMINAL = """\
apiVersion: sop/v1
name: terminal
inputs:
  idea: {type: str, required: true}
actions:
  Build:
    prompt: "Build {{ inputs.idea }}"
    tools: [terminal]
roles:
  Engineer: {actions: [Build], watch: [UserRequirement]}
"""


def test_a_tool_that_acts_outside_waits_for_the_answer_that_asked_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.run.tools import terminal as toolsets

    probe = Probe(monkeypatch)
    real_run = toolsets.ShellSession.run

    async def run(*args: Any, **kwargs: Any) -> Any:
        probe.note("terminal command")
        return await real_run(*args, **kwargs)

    monkeypatch.setattr(toolsets.ShellSession, "run", run)
    model = CheckedModel([{"thought": "t", "commands": [{"command_name": "terminal.run",
                                                         "args": {"command": "echo hi"}}]},
                          {"thought": "t", "commands": [{"command_name": "end",
                                                         "args": {"answer": "built"}}]}])
    model.probe = probe
    path = tmp_path / "terminal.sop.yaml"
    path.write_text(TERMINAL, encoding="utf-8")
    with use_model(model):
        result = api.run(api.load(path), {"idea": "tea"}, api.RunOptions(workspace=tmp_path / "ws", allow_exec=True))
    assert result.status == "idle", result.error
    assert [w for w, _ in probe.seen] == ["model request for Build", "terminal command",
                                          "model request for Build"]
    assert all(synced for _, synced in probe.seen), probe.seen


ONE_CALL = """\
apiVersion: sop/v1
name: one_call
inputs:
  idea: {type: str, required: true}
actions:
  Write:
    prompt: "Write about {{ inputs.idea }}"
    output: text
roles:
  Writer: {actions: [Write], watch: [UserRequirement]}
"""


def test_an_fsync_that_fails_after_the_last_barrier_fails_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing waits for the last answer's fsync; the run's end still reports its failure (a
    slow disk's: its fsyncs run on the thread, after the answers' commits)."""
    monkeypatch.setattr(journal_syncer, "INLINE_FSYNC_S", 0.0)
    calls: list[int] = []
    real_sync = journal_syncer.datasync

    def fails_after_the_first(fd: int) -> None:
        calls.append(fd)
        if len(calls) > 1:
            raise OSError(errno.EIO, "Input/output error")
        real_sync(fd)

    monkeypatch.setattr(journal_syncer, "datasync", fails_after_the_first)
    path = tmp_path / "one.sop.yaml"
    path.write_text(ONE_CALL, encoding="utf-8")
    with use_model(ScriptedModel(["a text"])), pytest.raises(JournalError) as failed:
        api.run(api.load(path), {"idea": "tea"}, api.RunOptions(workspace=tmp_path / "ws"))
    assert "cannot fsync journal" in failed.value.message
    assert str(tmp_path / "ws") in failed.value.message


def test_the_fsync_follows_a_wal_made_anew(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite deletes the WAL when the last connection closes and makes a new file on the
    next write: the syncer's fsync must reach the new WAL, not the deleted one it held open."""
    synced: list[int] = []
    real_sync = journal_syncer.datasync

    def recording(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real_sync(fd)

    monkeypatch.setattr(journal_syncer, "datasync", recording)
    database = tmp_path / "db.sqlite"

    def commit_one(value: int) -> int:
        conn = sqlite3.connect(database, isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE IF NOT EXISTS t (v)")
        conn.execute("INSERT INTO t VALUES (?)", (value,))
        syncer.committed(fsynced=False, answer=True)
        syncer.sync_now()
        inode = os.stat(f"{database}-wal").st_ino
        conn.close()                          # the last connection: the WAL is deleted
        return inode

    syncer = journal_syncer.Syncer(database)
    try:
        first = commit_one(1)
        assert not Path(f"{database}-wal").exists()
        second = commit_one(2)
    finally:
        syncer.close()
    assert first != second            # the old one still open here: its inode not reused
    assert synced[0] == first and synced[-1] == second, (synced, first, second)
