"""Roles: by_order, react with one action, what an activation publishes, max_runs."""

from __future__ import annotations

from pathlib import Path

from run_helpers import TESTS, default_answer, logs, run_sop, sop, sop_text

from engine.run.events import ActionCompleted, ActionStarted
from engine.testing import ScriptedModel


def test_by_order_runs_every_action_once_in_order_in_one_activation(tmp_path: Path) -> None:
    model = ScriptedModel(default_answer)
    result = run_sop(sop("by_order"), model, tmp_path)
    assert model.asked() == ["Prepare", "WriteSpec", "Read"]
    manager = [h for h in result.history if h["sent_from"] == "Manager"]
    assert [(h["round"], h["cause_by"]) for h in manager] == [(1, "Prepare"), (1, "WriteSpec")]


def test_later_actions_see_earlier_outputs_of_the_same_activation(tmp_path: Path) -> None:
    model = ScriptedModel(lambda s, _: {"Requirement": "REQ-42"} if s.action == "Prepare"
                          else default_answer(s))
    run_sop(sop("by_order"), model, tmp_path)
    write_spec = next(r.spec for r in model.requests if r.spec.action == "WriteSpec")
    assert "Write the spec for REQ-42." in write_spec.prompt


def test_only_the_last_message_is_published_without_publish_each(tmp_path: Path) -> None:
    text = (TESTS / "sops/by_order.sop.yaml").read_text()
    model = ScriptedModel(default_answer)
    result = run_sop(sop_text(text.replace("    publish: each\n", "")), model, tmp_path)
    assert [h["cause_by"] for h in result.history] == ["UserRequirement", "WriteSpec", "Read"]
    completed = [e.action for e in result.events if isinstance(e, ActionCompleted)]
    assert completed == ["Prepare", "WriteSpec", "Read"]  # Prepare ran, stayed in memory


def test_single_action_react_runs_up_to_max_react_loop(tmp_path: Path) -> None:
    text = """
apiVersion: sop/v1
name: single
inputs: {idea: {type: str}}
actions:
  Think: {prompt: "think", output: text, context: none}
roles:
  Solo: {actions: [Think], watch: [UserRequirement], max_react_loop: 3}
"""
    model = ScriptedModel(default_answer)
    result = run_sop(sop_text(text), model, tmp_path)
    assert model.asked() == ["Think", "Think", "Think"]
    assert model.asked("choice") == []  # one action: no state choice, as MetaGPT
    assert [h["id"] for h in result.history] == ["0-Human-0", "1-Solo-2"]


def test_max_runs_bounds_a_self_loop(tmp_path: Path) -> None:
    model = ScriptedModel(default_answer)
    result = run_sop(sop("loop"), model, tmp_path)
    assert result.status == "idle"
    assert model.asked() == ["Iterate"] * 3
    assert [h["round"] for h in result.history] == [0, 1, 2, 3]
    assert result.rounds == 3  # idle at once when max_runs is spent: no wasted round


def test_max_runs_skips_an_action_and_logs_it(tmp_path: Path) -> None:
    text = """
apiVersion: sop/v1
name: skip
inputs: {idea: {type: str}}
actions:
  Once: {prompt: "once", output: text, context: none, max_runs: 1}
  Again: {prompt: "again", output: text, context: none, max_runs: 5}
roles:
  Solo: {actions: [Once, Again], react_mode: by_order, watch: [UserRequirement, Again], memory: false}
"""
    model = ScriptedModel(default_answer)
    result = run_sop(sop_text(text), model, tmp_path, max_rounds=3)
    assert model.asked() == ["Once", "Again", "Again", "Again"]
    assert result.status == "max_rounds"
    assert any("Once reached max_runs" in line for line in logs(result))


def test_action_started_carries_a_stable_idempotency_key(tmp_path: Path) -> None:
    first = run_sop(sop("pipeline"), ScriptedModel(default_answer), tmp_path / "a", run_id="R1")
    second = run_sop(sop("pipeline"), ScriptedModel(default_answer), tmp_path / "b", run_id="R1")
    keys = [e.key for e in first.events if isinstance(e, ActionStarted)]
    assert keys == [e.key for e in second.events if isinstance(e, ActionStarted)]
    assert len(set(keys)) == len(keys) == 3
    assert all(k.startswith("R1/") for k in keys)


def test_memory_on_does_not_reprocess_the_roles_own_message(tmp_path: Path) -> None:
    """MetaGPT: what a role made is in its memory, so its own echo is not news (memory on)."""
    text = (TESTS / "sops/loop.sop.yaml").read_text()
    model = ScriptedModel(default_answer)
    result = run_sop(sop_text(text.replace("memory: false", "memory: true")), model, tmp_path)
    assert model.asked() == ["Iterate"]
    assert result.status == "idle" and result.rounds == 1


def test_roles_of_a_round_run_concurrently_and_publish_in_file_order(tmp_path: Path) -> None:
    """The second role finishes first; the history still lists the first role's message first,
    and neither saw the other's message in the same round (observed from the next round)."""
    import asyncio

    text = """
apiVersion: sop/v1
name: parallel
inputs: {idea: {type: str}}
actions:
  Slow: {prompt: "slow", output: text, context: all}
  Fast: {prompt: "fast", output: text, context: all}
  Join: {prompt: "join", output: text, context: all, send_to: ["<none>"]}
roles:
  First: {actions: [Slow], watch: [UserRequirement]}
  Second: {actions: [Fast], watch: [UserRequirement]}
  Third: {actions: [Join], watch: [Slow, Fast]}
"""

    class Ordered(ScriptedModel):
        finished: list[str] = []

        async def complete(self, request):  # type: ignore[no-untyped-def]
            if request.spec.action == "Slow":
                while "Fast" not in self.finished:
                    await asyncio.sleep(0)
            answer = await super().complete(request)
            self.finished.append(request.spec.action)
            return answer

    model = Ordered(default_answer)
    result = run_sop(sop_text(text), model, tmp_path)
    assert model.finished == ["Fast", "Slow", "Join"]
    assert [(h["round"], h["sent_from"]) for h in result.history] == \
        [(0, "Human"), (1, "First"), (1, "Second"), (2, "Third")]
    slow, fast = (next(r.spec for r in model.requests if r.spec.action == a) for a in ("Slow", "Fast"))
    assert "### Slow" not in fast.prompt and "### Fast" not in slow.prompt
    join = next(r.spec for r in model.requests if r.spec.action == "Join")
    assert join.prompt.index("### Slow") < join.prompt.index("### Fast")
