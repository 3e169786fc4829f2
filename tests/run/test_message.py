"""Messages: fields, addresses, deterministic ids, JSON round trip, readable content."""

from __future__ import annotations

import json

from engine.run.memory import Memory
from engine.run.message import (
    ALL,
    HUMAN,
    NONE,
    SELF,
    Message,
    content_of,
    message_id,
    resolve_send_to,
    user_requirement,
)


def _msg(i: int = 0, cause_by: str = "A", send_to: frozenset[str] = frozenset({ALL})) -> Message:
    return Message(id=f"m{i}", content=f"c{i}", cause_by=cause_by, sent_from="R", send_to=send_to)


def test_first_message_is_the_idea_from_the_human_to_everyone_in_round_0() -> None:
    first = user_requirement("a 2048 game")
    assert (first.content, first.cause_by, first.sent_from, first.round) == \
        ("a 2048 game", "UserRequirement", HUMAN, 0)
    assert first.send_to == {ALL}
    assert first.out is None


def test_ids_are_deterministic_not_random() -> None:
    assert message_id(3, "Architect", 1) == message_id(3, "Architect", 1) == "3-Architect-1"
    assert user_requirement("x").id == user_requirement("y").id


def test_json_round_trip_keeps_every_field() -> None:
    msg = Message(id="2-A-0", content="hi", cause_by="WritePRD", sent_from="A",
                  send_to=frozenset({"Bob", "<all>"}), round=2, out={"k": [1, 2]})
    data = msg.to_json()
    assert data["send_to"] == ["<all>", "Bob"]  # sorted: stable bytes in the journal
    assert Message.from_json(json.loads(json.dumps(data))) == msg


def test_summary_is_the_contract_history_entry() -> None:
    msg = Message(id="1-A-0", content="hello", cause_by="X", sent_from="A", round=1)
    assert msg.summary() == {"id": "1-A-0", "round": 1, "cause_by": "X", "sent_from": "A",
                             "send_to": ["<all>"], "chars": 5}


def test_template_view_never_shows_the_id() -> None:
    view = _msg(7).template_view()
    assert "id" not in view
    assert set(view) >= {"content", "out", "sent_from"}


def test_self_becomes_the_sender_and_empty_means_all() -> None:
    assert resolve_send_to([SELF, "Bob"], "Engineer") == {"Engineer", "Bob"}
    assert resolve_send_to([], "Engineer") == {ALL}
    assert resolve_send_to([NONE], "Engineer") == {NONE}


def test_render_content_per_output_kind() -> None:
    assert json.loads(content_of("json", {"A": [1]})) == {"A": [1]}
    assert content_of("text", "plain words") == "plain words"
    assert content_of("code", "print(1)\n") == "print(1)\n"  # no fence: what the artifact holds


def test_memory_dedups_by_id_and_indexes_by_cause_by() -> None:
    memory = Memory()
    assert memory.add(_msg(1, "A"))
    assert not memory.add(_msg(1, "A"))
    memory.add_batch([_msg(2, "B"), _msg(3, "A")])
    assert len(memory) == 3
    assert [m.id for m in memory.get_by_action("A")] == ["m1", "m3"]
    assert [m.id for m in memory.get_by_actions(["B", "A"])] == ["m1", "m2", "m3"]
    assert memory.get_by_action("missing") == []
    assert _msg(2, "B") in memory and _msg(9) not in memory
