"""Journal rows read back: every event as it was written, a tampered one refused with its seq
and what is wrong (engine/journal/codec.py)."""

from __future__ import annotations

import json

import pytest

from engine.errors import JournalError
from engine.journal.codec import EventRow, decode_event
from engine.models.types import ModelAnswered, event_json
from engine.run.events import (
    ActionCompleted,
    MessagePublished,
    RunEnded,
    RunStarted,
    RunStatus,
    ToolCalled,
)

MESSAGE = {"id": "1-Writer-0", "round": 1, "content": "draft", "out": None, "cause_by": "Write",
           "sent_from": "Writer", "send_to": ["<all>"]}

EVENTS = [
    RunStarted(run_id="r1", sop_file="x.sop.yaml", sop_name="x", sop_hash="a" * 64,
               inputs={"idea": "a game", "n": 3}, model="fake", engine_version="0.1.0",
               workspace="ws", max_rounds=3, budget_usd=1.5, send_to=["Writer"]),
    ModelAnswered(round=1, role="Writer", action="Write", attempt=0, request_hash="h",
                  prompt_tokens=10, completion_tokens=5, cost_usd=0.01, seconds=0.5),
    ActionCompleted(round=1, role="Writer", action="Write", key="k", messages=[MESSAGE],
                    artifacts=[{"path": "docs/a.md", "sha256": "b" * 64}]),
    MessagePublished(message=MESSAGE),
    ToolCalled(round=1, role="Coder", action="Code", step=1, tool="editor.write",
               args={"path": "a.py"}, output="ok", error=False),
    RunEnded(status=RunStatus.IDLE, rounds=2),
]


def row(kind: str, data: object, seq: int = 7) -> EventRow:
    return EventRow(seq, 1.0, kind, data if isinstance(data, str) else json.dumps(data))


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_every_event_reads_back_as_written(event: object) -> None:
    assert decode_event(row(type(event).__name__, event_json(event))) == event


def test_a_status_reads_back_as_a_run_status_and_a_whole_number_as_a_number() -> None:
    ended = decode_event(row("RunEnded", {"status": "budget", "rounds": 2}))
    assert isinstance(ended, RunEnded) and ended.status is RunStatus.BUDGET
    answered = decode_event(row("ModelAnswered", {**event_json_of(EVENTS[1]), "cost_usd": 0}))
    assert isinstance(answered, ModelAnswered) and answered.cost_usd == 0


def event_json_of(event: object) -> dict:
    return json.loads(event_json(event))


_ENDED = {"status": "idle", "rounds": 2}
_DONE = event_json_of(EVENTS[2])

TAMPERED = {
    "true for a whole number": (row("RunEnded", {**_ENDED, "rounds": True}),
                                "journal event 7 (RunEnded) has rounds = true, which is not a whole number",
                                "damaged outside sopctl"),
    "a number as text": (row("ModelAnswered", {**event_json_of(EVENTS[1]), "cost_usd": "0.01"}),
                         'has cost_usd = "0.01", which is not a number', "damaged outside sopctl"),
    "an item of the wrong type": (row("RunStarted", {**event_json_of(EVENTS[0]), "send_to": ["a", 5]}),
                                  "has send_to[1] = 5, which is not a string", "damaged"),
    "a field missing": (row("RunEnded", {"status": "idle"}),
                        "journal event 7 (RunEnded) does not match this sopctl: it has no rounds",
                        "another sopctl version"),
    "a field unknown": (row("RunEnded", {**_ENDED, "colour": "red"}),
                        "does not match this sopctl: it has a field colour this sopctl does not know",
                        "another sopctl version"),
    "a status unknown": (row("RunEnded", {**_ENDED, "status": "paused"}),
                         'has status = "paused", which is none of', "newer sopctl"),
    "an unknown type": (row("Teleported", {}), "journal event 7 has an unknown type 'Teleported'",
                        "newer sopctl"),
    "not JSON": (row("RunEnded", '{"status": "idle", "rounds": 2'), "journal event 7 is not valid JSON",
                 "damaged outside sopctl"),
    "not an object": (row("RunEnded", "[1, 2]"), "journal event 7 is not a JSON object", ""),
    "a message without its id": (row("MessagePublished", {"message": {**MESSAGE, "id": None}}),
                                 "holds a message that has id = null, which is not a string", "damaged"),
    "a message missing its sender": (
        row("ActionCompleted", {**_DONE, "messages": [{k: v for k, v in MESSAGE.items() if k != "sent_from"}]}),
        "journal event 7 (ActionCompleted) holds a message that has no sent_from", "damaged"),
    "a message of the wrong shape": (row("ActionCompleted", {**_DONE, "messages": [{**MESSAGE, "round": "1"}]}),
                                     'holds a message that has round = "1", which is not a whole number',
                                     "damaged"),
}


@pytest.mark.parametrize("case", list(TAMPERED))
def test_a_tampered_row_is_refused_with_its_seq_and_what_is_wrong(case: str) -> None:
    bad, words, hint = TAMPERED[case]
    with pytest.raises(JournalError) as caught:
        decode_event(bad)
    assert words in caught.value.message and hint in caught.value.hint


def test_a_row_s_data_is_its_json() -> None:
    assert row("RunEnded", _ENDED).data == _ENDED
    with pytest.raises(JournalError, match="journal event 7 is not valid JSON"):
        _ = row("RunEnded", "{").data
