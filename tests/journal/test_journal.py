"""The journal on its own: durable append-only events, answers, meta checks, errors, secrets."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli.report import result_object
from engine.errors import JournalError
from engine.journal.history import read_run, rebuild
from engine.journal.store import Journal, ReplayStore, journal_path
from engine.models.types import StoredAnswer
from engine.run.events import (
    ActionCompleted,
    ActionStarted,
    MessagePublished,
    ModelAnswered,
    RoundStarted,
    RunEnded,
    RunStarted,
)

from run_helpers import ROOT

HASH = "a" * 64
SAME = hashlib.sha256(b"same").hexdigest()


def started(run_id: str = "r1", workspace: str = "ws") -> RunStarted:
    return RunStarted(run_id=run_id, sop_file="x.sop.yaml", sop_name="x", sop_hash=HASH,
                      inputs={"idea": "a game"}, model="fake", engine_version="0.1.0",
                      workspace=workspace, max_rounds=3, budget_usd=0.0)


def message(mid: str, rnd: int, cause: str, sender: str, content: str = "hello") -> dict:
    return {"id": mid, "round": rnd, "content": content, "out": None, "cause_by": cause,
            "sent_from": sender, "send_to": ["<all>"]}


def answered(rnd: int, role: str, action: str, *, reused: bool = False) -> ModelAnswered:
    """The answer of an action, journaled as `h-<action>` (as the gateway reports it)."""
    return ModelAnswered(round=rnd, role=role, action=action, attempt=0, request_hash=f"h-{action}",
                         prompt_tokens=10, completion_tokens=5, cost_usd=0.01, seconds=0.5,
                         reused=reused)


def action_events(rnd: int, role: str, action: str, msg: dict, key: str) -> list:
    return [
        ActionStarted(round=rnd, role=role, action=action, key=key),
        answered(rnd, role, action),
        ActionCompleted(round=rnd, role=role, action=action, key=key, messages=[msg],
                        artifacts=[{"path": f"docs/{action}.md", "sha256": SAME}]),
    ]


def full_run() -> list:
    """A two-round run: Writer then Reviewer, ending idle."""
    m0 = message("0-Human-0", 0, "UserRequirement", "Human")
    m1 = message("1-Writer-0", 1, "Write", "Writer", "draft")
    m2 = message("2-Reviewer-0", 2, "Review", "Reviewer", "looks good")
    return [started(), MessagePublished(message=m0), RoundStarted(round=1, active_roles=["Writer"]),
            *action_events(1, "Writer", "Write", m1, "k1"), MessagePublished(message=m1),
            RoundStarted(round=2, active_roles=["Reviewer"]),
            *action_events(2, "Reviewer", "Review", m2, "k2"), MessagePublished(message=m2),
            RunEnded(status="idle", rounds=2)]


def new_journal(ws: Path, sop_hash: str = HASH) -> Journal:
    return Journal.create(ws, sop_name="x", sop_hash=sop_hash)


def test_events_roundtrip_and_state(tmp_path: Path) -> None:
    with new_journal(tmp_path) as journal:
        for event in full_run():
            journal.on_event(event)
        journal.record("h-Write", "Write", StoredAnswer("draft", 10, 5, 0.01))
        journal.record("h-Review", "Review", StoredAnswer("ok", 10, 5, 0.01))
    state = read_run(tmp_path)
    assert state.status == "idle" and state.rounds == 2 and state.run_id == "r1"
    assert [m["id"] for m in state.history] == ["0-Human-0", "1-Writer-0", "2-Reviewer-0"]
    assert state.usage.llm_calls == 2 and state.journaled_calls == 2
    assert state.usage.prompt_tokens == 20 and state.usage.completion_tokens == 10
    assert state.actions["Write"].usage.llm_calls == 1 and state.actions["Review"].roles == ["Reviewer"]
    assert sorted(state.artifacts) == ["docs/Review.md", "docs/Write.md"]
    obj = result_object(state)
    assert obj["history"][1] == {"id": "1-Writer-0", "round": 1, "cause_by": "Write",
                                 "sent_from": "Writer", "send_to": ["<all>"], "chars": 5}
    assert obj["cost_usd"] == pytest.approx(0.02)


def test_journal_settings_are_durable(tmp_path: Path) -> None:
    with new_journal(tmp_path) as journal:
        mode = journal._conn.execute("PRAGMA journal_mode").fetchone()[0]
        sync = journal._conn.execute("PRAGMA synchronous").fetchone()[0]
    assert mode == "wal" and sync == 2          # 2 = FULL


def test_durability_tiers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`full` fsyncs every event; by default only the run's end (and every answer) is."""
    events = full_run()
    with new_journal(tmp_path) as grouped:
        tiers = {type(e).__name__: grouped.is_fsynced(e) for e in events}
    assert tiers == {"RunStarted": False, "MessagePublished": False, "RoundStarted": False,
                     "ActionStarted": False, "ModelAnswered": False, "ActionCompleted": False,
                     "RunEnded": True}
    monkeypatch.setenv("SOPCTL_JOURNAL_SYNC", "full")
    with new_journal(tmp_path / "full") as strict:
        assert all(strict.is_fsynced(e) for e in events)
        for event in events:
            strict.on_event(event)
            assert committed_events(tmp_path / "full") == events.index(event) + 1


def committed_events(ws: Path) -> int:
    """What another process reading the journal sees now."""
    other = sqlite3.connect(journal_path(ws))
    try:
        return other.execute("SELECT count(*) FROM events").fetchone()[0]
    finally:
        other.close()


def test_group_commit_at_step_ends_and_answers(tmp_path: Path) -> None:
    """Events are committed where a step starts or ends, and with each answer before
    `record` returns (the answer is on disk before the gateway parses it)."""
    events = full_run()
    with new_journal(tmp_path) as journal:
        seen = []
        for event in events:
            journal.on_event(event)
            seen.append((type(event).__name__, committed_events(tmp_path)))
        assert seen[:5] == [("RunStarted", 1), ("MessagePublished", 1), ("RoundStarted", 1),
                            ("ActionStarted", 4), ("ModelAnswered", 4)]
        assert seen[-1] == ("RunEnded", len(events))
        journal.on_event(RoundStarted(round=3, active_roles=[]))
        journal.record("h", "A", StoredAnswer("t", 1, 1, 0.0))
        assert committed_events(tmp_path) == len(events) + 1
        assert [r.seq for r in journal.answers()] == [len(events) + 1]
        journal.on_event(RoundStarted(round=4, active_roles=[]))
    assert committed_events(tmp_path) == len(events) + 2       # close commits what is left


def test_events_are_append_only(tmp_path: Path) -> None:
    with new_journal(tmp_path) as journal:
        journal.on_event(started())
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            journal._conn.execute("UPDATE events SET type = 'x'")
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            journal._conn.execute("DELETE FROM events")


def test_answer_store_first_answer_wins(tmp_path: Path) -> None:
    with new_journal(tmp_path) as journal:
        assert journal.lookup("h") is None
        journal.record("h", "A", StoredAnswer("first", 1, 2, 0.5))
        journal.record("h", "A", StoredAnswer("second", 9, 9, 9.0))
        assert journal.lookup("h") == StoredAnswer("first", 1, 2, 0.5)


def test_completed_actions_lookup(tmp_path: Path) -> None:
    for name in ("Write", "Review"):
        (tmp_path / "docs").mkdir(exist_ok=True)
        (tmp_path / "docs" / f"{name}.md").write_text("same")
    with new_journal(tmp_path) as journal:
        for event in full_run()[:6]:
            journal.on_event(event)
        assert journal.completed("k1") is not None and journal.completed("k2") is None
        journal.on_event(full_run()[10])           # k2's ActionCompleted, after the cache is warm
        done = journal.completed("k2")
    assert done is not None and done.messages[0]["id"] == "2-Reviewer-0"


def test_action_with_missing_or_changed_artifact_is_not_completed(tmp_path: Path) -> None:
    """So a resume re-runs it (answers from the journal) and rewrites just that file."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "Write.md").write_text("same")
    with new_journal(tmp_path) as journal:
        for event in full_run()[:6]:
            journal.on_event(event)
        assert journal.completed("k1") is not None
        (tmp_path / "docs" / "Write.md").write_text("edited by hand")
        assert journal.completed("k1") is None
        (tmp_path / "docs" / "Write.md").unlink()
        assert journal.completed("k1") is None
    with Journal.open(tmp_path) as reader:          # show/replay readers do not check files
        assert reader.completed("k1") is not None


def test_another_sop_is_refused_unless_forced(tmp_path: Path) -> None:
    new_journal(tmp_path).close()
    with pytest.raises(JournalError, match="belongs to another SOP") as err:
        new_journal(tmp_path, sop_hash="b" * 64)
    assert "--force" in err.value.hint
    Journal.create(tmp_path, sop_name="x", sop_hash="b" * 64, force=True).close()
    assert Journal.open(tmp_path).meta()["sop_hash"] == "b" * 64


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    new_journal(tmp_path).close()
    conn = sqlite3.connect(journal_path(tmp_path))
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(JournalError, match="schema version 99"):
        Journal.open(tmp_path)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_torn_journal_is_a_clear_error(tmp_path: Path, damage: str) -> None:
    with new_journal(tmp_path) as journal:
        for event in full_run():
            journal.on_event(event)
    path = journal_path(tmp_path)
    data = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(b"this is not sqlite" * 100)
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 3] if len(data) > 4096 else data[:100])
    else:
        path.write_bytes(b"")
    for wal in path.parent.glob("journal.sqlite-*"):
        wal.unlink()
    with pytest.raises(JournalError) as err:
        read_run(tmp_path)
    assert "journal" in err.value.message


def test_missing_run_and_missing_journal(tmp_path: Path) -> None:
    with pytest.raises(JournalError, match="does not exist"):
        Journal.open(tmp_path / "nope")
    with pytest.raises(JournalError, match="has no journal"):
        Journal.open(tmp_path)


def test_read_only_journal_cannot_be_written(tmp_path: Path) -> None:
    new_journal(tmp_path).close()
    with Journal.open(tmp_path) as journal, pytest.raises(JournalError, match="read-only"):
        journal.on_event(started())


def test_disk_full_is_a_clear_error_and_keeps_what_was_written(tmp_path: Path) -> None:
    journal = new_journal(tmp_path)
    journal.on_event(started())
    pages = journal._conn.execute("PRAGMA page_count").fetchone()[0]
    journal._conn.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(JournalError, match="disk is full") as err:
        for i in range(200):
            journal.record(f"h{i}", "A", StoredAnswer("x" * 4000, 1, 1, 0.0))
    assert "sopctl resume" in err.value.hint
    journal.close()
    assert read_run(tmp_path).run_id == "r1"


def test_secrets_never_reach_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sentinel = "sk-SENTINEL-0123456789abcdef"
    monkeypatch.setenv("OPENAI_API_KEY", sentinel)
    with new_journal(tmp_path) as journal:
        journal.on_event(RunStarted(**{**started().to_json(), "inputs": {"idea": f"use {sentinel}"}}))
        journal.record("h", "A", StoredAnswer(f"the key is {sentinel}", 1, 1, 0.0))
        journal.on_event(MessagePublished(message=message("m", 1, "A", "R", sentinel)))
    blobs = b"".join(p.read_bytes() for p in journal_path(tmp_path).parent.iterdir())
    assert sentinel.encode() not in blobs
    assert b"[REDACTED]" in blobs


def test_secrets_with_json_escapes_never_reach_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sentinel = 'tok"en\\SENTINEL-0123456789'
    monkeypatch.setenv("SERVICE_TOKEN", sentinel)
    with new_journal(tmp_path) as journal:
        journal.on_event(MessagePublished(message=message("m", 1, "A", "R", f"key {sentinel}")))
    blobs = b"".join(p.read_bytes() for p in journal_path(tmp_path).parent.iterdir())
    assert b"SENTINEL-0123456789" not in blobs


def test_resumed_journal_state(tmp_path: Path) -> None:
    """A crash in round 2, then a resume: final history is the resumed invocation's."""
    events = full_run()
    first = events[:10]                              # dies after k2's ModelAnswered
    m2 = events[11].message
    resumed = [started(), events[1], events[2], events[6], events[7],
               ActionStarted(round=2, role="Reviewer", action="Review", key="k2"),
               answered(2, "Reviewer", "Review", reused=True),
               ActionCompleted(round=2, role="Reviewer", action="Review", key="k2",
                               messages=[m2], artifacts=[]),
               MessagePublished(message=m2), RunEnded(status="idle", rounds=2)]
    with new_journal(tmp_path) as journal:
        for event in first:
            journal.on_event(event)
        assert read_run(tmp_path).status == "running"    # its writer holds the lock
    crashed = read_run(tmp_path)
    with new_journal(tmp_path) as journal:
        for event in resumed:
            journal.on_event(event)
    assert crashed.status == "interrupted" and crashed.rounds == 2
    assert [m["id"] for m in crashed.history] == ["0-Human-0", "1-Writer-0"]
    state = read_run(tmp_path)
    assert state.status == "idle" and state.invocations == 2
    assert [m["id"] for m in state.history] == ["0-Human-0", "1-Writer-0", "2-Reviewer-0"]
    assert state.completions == {"k1": 1, "k2": 1} and state.usage.reused_calls == 1


def test_a_second_run_into_a_used_workspace_is_refused(tmp_path: Path) -> None:
    with new_journal(tmp_path) as journal:
        journal.on_event(started("r1"))
        journal.on_event(started("r1"))             # a resume of the same run: fine
        with pytest.raises(JournalError, match="already holds run r1") as err:
            journal.on_event(started("r2"))
    assert "sopctl resume" in err.value.hint
    assert [e.data["run_id"] for e in Journal.open(tmp_path).events()] == ["r1", "r1"]


def test_one_writer_at_a_time(tmp_path: Path) -> None:
    """A second live writer is refused; a closed (or dead) one leaves no stale lock."""
    first = new_journal(tmp_path)
    with pytest.raises(JournalError, match="being written by another process") as err:
        new_journal(tmp_path)
    assert str(os.getpid()) in err.value.message
    first.close()
    new_journal(tmp_path).close()


def test_replay_store_copies_answers(tmp_path: Path) -> None:
    with new_journal(tmp_path / "old") as old:
        old.record("h", "Write", StoredAnswer("draft", 3, 4, 0.2))
    with Journal.open(tmp_path / "old") as source, new_journal(tmp_path / "new") as target:
        store = ReplayStore(source, target)
        assert store.lookup("missing") is None
        assert store.lookup("h") == StoredAnswer("draft", 3, 4, 0.2)
        rows = target.answers()
    assert [(r.request_hash, r.action, r.origin) for r in rows] == [("h", "Write", "replay")]


def test_crash_hook_exits_right_after_the_commit(tmp_path: Path) -> None:
    """Killed after the 4th event: the committed ones survive, the buffered 4th is lost."""
    code = ("import sys; from pathlib import Path; from engine.journal.store import Journal;"
            "from engine.run.events import RoundStarted, ActionStarted;"
            f"j = Journal.create(Path({str(tmp_path)!r}), sop_name='x', sop_hash='{HASH}');"
            "[j.on_event(RoundStarted(round=i, active_roles=[])) for i in range(2)];"
            "j.on_event(ActionStarted(round=1, role='W', action='A', key='k'));"
            "[j.on_event(RoundStarted(round=i, active_roles=[])) for i in range(2, 10)]")
    env = {**os.environ, "SOPCTL_CRASH_AFTER_EVENT": "4"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT)
    assert proc.returncode == 137
    with Journal.open(tmp_path) as journal:
        assert [(e.type, e.data["round"]) for e in journal.events()] == [
            ("RoundStarted", 0), ("RoundStarted", 1), ("ActionStarted", 1)]


def test_rebuild_of_empty_journal() -> None:
    state = rebuild([])
    assert state.status == "interrupted" and state.history == [] and state.invocations == 0


def test_read_only_workspace_is_a_clear_error(tmp_path: Path) -> None:
    """A workspace sqlite cannot write to (simulated with query_only: root ignores chmod)."""
    journal = new_journal(tmp_path)
    journal._conn.execute("PRAGMA query_only = ON")
    with pytest.raises(JournalError, match="read-only") as err:
        journal.on_event(started())
    assert "writable" in err.value.hint
    journal.close()


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores chmod")
def test_read_only_folder_is_a_clear_error(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    ws.chmod(0o555)
    try:
        with pytest.raises(JournalError, match="read-only|cannot"):
            new_journal(ws)
    finally:
        ws.chmod(0o755)


def test_writes_from_worker_threads(tmp_path: Path) -> None:
    """An observer or store called off the event loop's thread still journals, in order."""
    from concurrent.futures import ThreadPoolExecutor

    with new_journal(tmp_path) as journal:
        journal.on_event(started())
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda i: journal.record(f"h{i}", "A", StoredAnswer(str(i), 1, 1, 0.0)),
                          range(20)))
        assert len(journal.answers()) == 20


def test_journal_bench_smoke() -> None:
    """The bench runs and reports its figures (no timing assertion: ratios are machine facts)."""
    sys.path.insert(0, str(ROOT))
    from bench.journal_bench import main

    figures = main(size_factor=0.05, latencies_ms=(0, 10))
    assert [row["latency_ms"] for row in figures["rows"]] == [0, 10]
    for row in figures["rows"]:
        assert row["events"] > 20 and all(v > 0 for v in row["ratio"].values())
    assert "| latency |" in figures["markdown"] and figures["ratio"] > 0
