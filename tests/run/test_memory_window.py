"""Memory windows (`memory_window`, MetaGPT's `get(k)`), keyword recall (`try_remember`) and
long-term recall by relevance (BM25): what an action's `## Context` shows as a run grows."""

from __future__ import annotations

from pathlib import Path
import pytest

from engine import api
from engine.compile.compiler import check_text
from engine.load.spec import RecallSpec
from engine.run.longterm import visible_messages
from engine.run.memory import Memory
from engine.run.message import Message
from engine.testing import ScriptedModel, use_model


def _messages(*contents: str) -> list[Message]:
    return [Message(id=str(i), content=c, cause_by="Say", sent_from="A", round=i)
            for i, c in enumerate(contents)]


def test_get_k_is_the_last_k_and_try_remember_finds_a_keyword() -> None:
    memory = Memory()
    memory.add_batch(_messages("the budget is 5 dollars", "hello", "Budget approved", "bye"))
    assert [m.content for m in memory.get(2)] == ["Budget approved", "bye"]
    assert len(memory.get()) == 4 and len(memory.get(0)) == 4
    assert [m.content for m in memory.try_remember("BUDGET")] == ["the budget is 5 dollars", "Budget approved"]


def test_a_window_shows_the_last_messages_only() -> None:
    shown = visible_messages(_messages("a", "b", "c", "d"), 2, None, "")
    assert [m.content for m in shown] == ["c", "d"]


def test_recall_brings_back_keyword_hits_first_then_the_most_relevant() -> None:
    messages = _messages("the castle has a red roof", "lunch was soup", "the dragon sleeps in the cave",
                         "weather is fine", "a knight arrives", "the end")
    keyword = visible_messages(messages, 2, RecallSpec(keywords=["soup"], top_k=1), "")
    assert [m.content for m in keyword] == ["lunch was soup", "a knight arrives", "the end"]
    relevant = visible_messages(messages, 2, RecallSpec(top_k=1), "Where does the dragon sleep?")
    assert [m.content for m in relevant] == ["the dragon sleeps in the cave", "a knight arrives", "the end"]


def test_recall_never_brings_back_an_unrelated_message_and_keeps_to_top_k() -> None:
    messages = _messages(*(f"note {i} about tea" for i in range(20)), "x", "y")
    assert [m.content for m in visible_messages(messages, 2, RecallSpec(top_k=3), "coffee")] == ["x", "y"]
    assert len(visible_messages(messages, 2, RecallSpec(top_k=3), "tea")) == 5


PING_PONG = """\
apiVersion: sop/v1
name: ping_pong
actions:
  Ping:
    prompt: "Answer the last pong."
    max_runs: 6
  Pong:
    prompt: "Answer the last ping."
    max_runs: 6
roles:
  A:
    actions: [Ping]
    watch: [UserRequirement, Pong]
{memory}
  B:
    actions: [Pong]
    watch: [Ping]
"""


def _run(tmp_path: Path, memory: str) -> ScriptedModel:
    path = tmp_path / "s.sop.yaml"
    path.write_text(PING_PONG.format(memory=memory), encoding="utf-8")
    counter = iter(range(100))
    model = ScriptedModel(lambda spec, attempt: f"{spec.action} number {next(counter)}")
    with use_model(model):
        result = api.run(api.load(path), {"idea": "the secret word is marmalade"},
                         workspace=tmp_path / "ws")
    assert result.status == "idle", result.error
    return model


def _context_blocks(prompt: str) -> list[str]:
    return prompt.split("## Context", 1)[1].split("\n### ")[1:] if "## Context" in prompt else []


def test_without_a_window_the_context_grows_with_the_run(tmp_path: Path) -> None:
    model = _run(tmp_path, "")
    prompts = [p for r, p in zip(model.requests, model.prompts(), strict=False) if r.spec.action == "Ping"]
    assert len(_context_blocks(prompts[-1])) > 6


def test_a_roles_window_bounds_its_context(tmp_path: Path) -> None:
    model = _run(tmp_path, "    memory_window: 2")
    pings = [p for r, p in zip(model.requests, model.prompts(), strict=False) if r.spec.action == "Ping"]
    assert len(pings) == 6
    assert all(len(_context_blocks(p)) <= 2 for p in pings)
    assert "marmalade" not in pings[-1]


def test_recall_brings_the_idea_back_into_a_windowed_context(tmp_path: Path) -> None:
    model = _run(tmp_path, "    memory_window: 2\n    recall: {keywords: [marmalade], top_k: 1}")
    pings = [p for r, p in zip(model.requests, model.prompts(), strict=False) if r.spec.action == "Ping"]
    assert all(len(_context_blocks(p)) <= 3 for p in pings)
    assert "marmalade" in pings[-1]


@pytest.mark.parametrize("role_keys, pointer", [
    ("    recall: {top_k: 2}", "/roles/A/recall"),
    ("    memory_window: 0", "/roles/A/memory_window"),
    ("    recall: {top_k: 2, keyword: [x]}", "/roles/A/recall"),
])
def test_bad_memory_keys_are_located(role_keys: str, pointer: str) -> None:
    result = check_text(PING_PONG.format(memory=role_keys), "s.sop.yaml")
    errors = [d for d in result.diagnostics if d.is_error]
    assert errors and errors[0].pointer.startswith(pointer), errors


def test_an_actions_recall_on_a_role_with_a_window_is_accepted() -> None:
    text = PING_PONG.format(memory="    memory_window: 3").replace(
        '    max_runs: 6\n  Pong', '    max_runs: 6\n    recall: {keywords: [marmalade]}\n  Pong', 1)
    assert not [d for d in check_text(text, "s.sop.yaml").diagnostics if d.is_error]


def test_an_actions_window_overrides_its_roles(tmp_path: Path) -> None:
    path = tmp_path / "s.sop.yaml"
    path.write_text(PING_PONG.format(memory="    memory_window: 5").replace(
        '    max_runs: 6\n  Pong', '    max_runs: 6\n    memory_window: 1\n  Pong', 1), encoding="utf-8")
    model = ScriptedModel(lambda spec, attempt: f"{spec.action} answer")
    with use_model(model):
        assert api.run(api.load(path), {"idea": "x"}, workspace=tmp_path / "ws").status == "idle"
    pings = [p for r, p in zip(model.requests, model.prompts(), strict=False) if r.spec.action == "Ping"]
    assert all(len(_context_blocks(p)) <= 1 for p in pings)
