"""What the journal commits when, inside a run's event loop: a step's start and end ride
with the step's answer (no commit of their own), or are committed on their own once
STEP_COMMIT_S passes without one; both survive kill -9 once committed. Also: an event's
journal text is exactly `json.dumps(event.to_json(), sort_keys=True)`, and a writer's
lookups of unknown hashes agree with the table."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.journal.store import STEP_COMMIT_S, Journal
from engine.models.types import Event, StoredAnswer, event_json
from engine.run.events import (
    ActionCompleted,
    ActionStarted,
    QuestionAsked,
    RoundStarted,
)
from test_journal import HASH, committed_events, full_run, new_journal

from run_helpers import ROOT



@dataclass(frozen=True)
class _Nested(Event):
    inner: Any
    pairs: tuple[tuple[str, int], ...]


def test_event_text_is_the_sorted_json_of_its_fields() -> None:
    """The journal's text of an event, written without building `to_json`'s copy, is the
    same text, nested dataclasses, tuples and all."""
    events = [*full_run(), QuestionAsked(round=1, role="W", action="A",
                                         question={"key": "q", "options": ("yes", "no"), "n": 1.5}),
              _Nested(inner=RoundStarted(round=1, active_roles=["é"]), pairs=(("a", 1),))]
    for event in events:
        assert event_json(event) == json.dumps(event.to_json(), ensure_ascii=False, sort_keys=True)


def test_step_events_ride_with_the_answer_in_a_run(tmp_path: Path) -> None:
    """Inside an event loop a step's start waits for the step's answer and is committed in
    its transaction, before `record` returns."""
    async def step() -> list[int]:
        with new_journal(tmp_path) as journal:
            seen = [committed_events(tmp_path)]
            journal.on_event(RoundStarted(round=1, active_roles=["W"]))
            journal.on_event(ActionStarted(round=1, role="W", action="A", key="k"))
            seen.append(committed_events(tmp_path))          # buffered
            journal.record("h", "A", StoredAnswer("t", 1, 1, 0.0))
            seen.append(committed_events(tmp_path))          # with the answer
            journal.on_event(ActionCompleted(round=1, role="W", action="A", key="k", messages=[]))
            seen.append(committed_events(tmp_path))
        seen.append(committed_events(tmp_path))              # close commits the rest
        return seen
    assert asyncio.run(step()) == [0, 0, 2, 3, 3]   # the step's end: at once


def test_step_events_committed_on_their_own_when_the_step_waits(tmp_path: Path) -> None:
    """A step that waits (a slow model, a command) shows in `sopctl show` within STEP_COMMIT_S."""
    async def step() -> tuple[int, int]:
        with new_journal(tmp_path) as journal:
            journal.on_event(ActionStarted(round=1, role="W", action="A", key="k"))
            before = committed_events(tmp_path)
            await asyncio.sleep(STEP_COMMIT_S * 3)
            return before, committed_events(tmp_path)
    assert asyncio.run(step()) == (0, 1)


def test_without_a_loop_step_events_are_committed_at_once(tmp_path: Path) -> None:
    with new_journal(tmp_path) as journal:
        journal.on_event(ActionStarted(round=1, role="W", action="A", key="k"))
        assert committed_events(tmp_path) == 1


def _killed(tmp_path: Path, body: str, **env: str) -> list[tuple[str, str | None]]:
    """Run `body` in a child process's event loop with a journal `j`; the child must be
    killed by a crash hook (as kill -9); the events that survived, as (type, key)."""
    code = ("import asyncio; from pathlib import Path; from engine.journal.store import Journal;"
            "from engine.models.types import StoredAnswer;"
            "from engine.run.events import ActionStarted, ActionCompleted, RoundStarted\n"
            "async def main():\n"
            f"    j = Journal.create(Path({str(tmp_path)!r}), sop_name='x', sop_hash='{HASH}')\n"
            f"    {body}\n"
            "asyncio.run(main())\n")
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, cwd=ROOT)
    assert proc.returncode == 137
    with Journal.open(tmp_path) as journal:
        assert journal.answers() == [] or journal.answers()[0].request_hash == "h"
        return [(e.type, e.data.get("key")) for e in journal.events()]


def test_a_buffered_step_start_survives_kill_after_the_next_answer(tmp_path: Path) -> None:
    """Killed right after the answer: the step's start, committed with it, is there."""
    events = _killed(tmp_path, "j.on_event(ActionStarted(round=1, role='W', action='A', key='k')); "
                               "j.record('h', 'A', StoredAnswer('t', 1, 1, 0.0))",
                     SOPCTL_CRASH_AFTER_ANSWER="1")
    assert events == [("ActionStarted", "k")]


def test_a_step_end_survives_kill_right_after_it(tmp_path: Path) -> None:
    """Killed right after a step's end: it was committed before `on_event` returned, so a
    resume does not run the step again (an exec step's command would run twice)."""
    events = _killed(tmp_path, "j.on_event(ActionStarted(round=1, role='W', action='A', key='k')); "
                               "j.on_event(ActionCompleted(round=1, role='W', action='A', key='k', messages=[]))",
                     SOPCTL_CRASH_AFTER_EVENT="2")
    assert events == [("ActionStarted", "k"), ("ActionCompleted", "k")]


def test_a_waiting_step_start_survives_kill(tmp_path: Path) -> None:
    """Killed while a step waits past STEP_COMMIT_S: its start was committed on its own."""
    events = _killed(tmp_path, "j.on_event(ActionStarted(round=1, role='W', action='A', key='k')); "
                               f"await asyncio.sleep({STEP_COMMIT_S * 3}); "
                               "j.on_event(RoundStarted(round=2, active_roles=[]))",
                     SOPCTL_CRASH_AFTER_EVENT="2")
    assert events == [("ActionStarted", "k")]


def test_writer_lookups_agree_with_the_table(tmp_path: Path) -> None:
    """The writer answers a miss without a query; a hash written by anyone (this journal, a
    person's answer, a journal reopened for a resume) is found."""
    with new_journal(tmp_path) as journal:
        assert journal.lookup("h") is None and not journal.holds("h")
        journal.record("h", "A", StoredAnswer("t", 1, 1, 0.0))
        assert journal.lookup("h") == StoredAnswer("t", 1, 1, 0.0) and journal.holds("h")
    with Journal.create(tmp_path, sop_name="x", sop_hash=HASH) as again:
        assert again.lookup("h") == StoredAnswer("t", 1, 1, 0.0)
        assert again.lookup("other") is None
