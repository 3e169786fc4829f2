"""React modes: the model's state choice (react), and plan_and_act with dependency order."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from run_helpers import TESTS, default_answer, logs, run_sop, sop, sop_text

from engine.models.types import CallSpec
from engine.run.role import PlanError, order_plan, parse_choice
from engine.testing import ScriptedModel


def _choices(answers: list[Any]) -> Callable[[CallSpec, int], Any]:
    """Answer state choices from a list (then -1); everything else as the default."""
    queue = list(answers)

    def answer(spec: CallSpec, attempt: int) -> Any:
        if spec.kind == "choice":
            return queue.pop(0) if queue else -1
        return default_answer(spec)
    return answer


# --- react with several actions ----------------------------------------------------------

def test_react_follows_the_models_choices_then_stops_at_minus_one(tmp_path: Path) -> None:
    model = ScriptedModel(_choices([0, 1, 0, 2, -1]))
    result = run_sop(sop("react_multi"), model, tmp_path)
    assert model.asked("text") == ["Draft", "Review", "Draft", "Polish"]
    assert len(model.asked("choice")) == 5
    assert result.status == "idle"
    # only the activation's last message is published
    assert [h["cause_by"] for h in result.history] == ["UserRequirement", "Polish"]


@pytest.mark.parametrize("answer", ["I think so", 7, 3, "no idea", -5, True])
def test_garbage_or_out_of_range_choice_ends_the_cycle_cleanly(tmp_path: Path, answer: Any) -> None:
    model = ScriptedModel(_choices([0, answer]))
    result = run_sop(sop("react_multi"), model, tmp_path)
    assert result.status == "idle"
    assert model.asked("text") == ["Draft"]
    assert [h["cause_by"] for h in result.history] == ["UserRequirement", "Draft"]
    assert any("ends the cycle" in line for line in logs(result))


def test_choice_given_as_text_is_parsed(tmp_path: Path) -> None:
    model = ScriptedModel(_choices(["Next: 1", "-1"]))
    run_sop(sop("react_multi"), model, tmp_path)
    assert model.asked("text") == ["Review"]


def test_react_stops_after_max_react_loop_steps(tmp_path: Path) -> None:
    model = ScriptedModel(_choices([0] * 20))
    run_sop(sop("react_multi"), model, tmp_path)
    assert model.asked("text") == ["Draft"] * 5  # max_react_loop: 5


def test_choice_prompt_is_a_numbered_menu_with_the_previous_state(tmp_path: Path) -> None:
    model = ScriptedModel(_choices([0, -1]))
    run_sop(sop("react_multi"), model, tmp_path)
    first, second = [r.spec for r in model.requests if r.spec.kind == "choice"]
    assert "0. Draft: write a first draft" in first.prompt
    assert "2. Polish: polish the final text" in first.prompt
    assert (first.n_choices, first.previous_choice, second.previous_choice) == (3, -1, 0)
    assert "-1 (none yet)" in first.prompt and "0 (Draft)" in second.prompt
    assert "0-Human-0" not in first.prompt  # ids never reach a prompt


def test_parse_choice_never_raises() -> None:
    assert parse_choice(1, "1", 3) == 1
    assert parse_choice(None, "state 2 please", 3) == 2
    assert parse_choice(None, "", 3) == -1
    assert parse_choice(3, "3", 3) == -1
    assert parse_choice("x", "-1", 3) == -1
    assert parse_choice(False, "", 3) == -1


# --- plan_and_act --------------------------------------------------------------------------

def _task(tid: str, deps: list[str], text: str = "") -> dict[str, Any]:
    return {"task_id": tid, "dependent_task_ids": deps, "instruction": text or f"do {tid}"}


def _plans(*plans: list[dict[str, Any]]) -> Callable[[CallSpec, int], Any]:
    queue = list(plans)

    def answer(spec: CallSpec, attempt: int) -> Any:
        if spec.action == "WritePlan":
            return {"tasks": queue.pop(0) if len(queue) > 1 else queue[0]}
        return default_answer(spec)
    return answer


def _task_order(model: ScriptedModel) -> list[str]:
    return [r.spec.prompt.split(":")[0].removeprefix("Do task ") for r in model.requests
            if r.spec.action == "ExecuteTask"]


def test_tasks_run_in_dependency_order_ties_in_plan_order(tmp_path: Path) -> None:
    plan = [_task("c", ["a", "b"]), _task("a", []), _task("d", []), _task("b", ["a"])]
    model = ScriptedModel(_plans(plan))
    result = run_sop(sop("plan"), model, tmp_path)
    assert result.status == "idle"
    assert _task_order(model) == ["a", "d", "b", "c"]
    # the last task's result is published; the plan and earlier results stay in memory
    assert [h["cause_by"] for h in result.history] == ["UserRequirement", "ExecuteTask"]


def test_task_action_sees_the_current_task(tmp_path: Path) -> None:
    model = ScriptedModel(_plans([_task("t1", [], "write the parser")]))
    run_sop(sop("plan"), model, tmp_path)
    assert "Do task t1: write the parser" in model.requests[-1].spec.prompt


def test_unknown_dependency_is_ignored_with_a_warning(tmp_path: Path) -> None:
    model = ScriptedModel(_plans([_task("a", ["ghost"]), _task("b", ["a"])]))
    result = run_sop(sop("plan"), model, tmp_path)
    assert result.status == "idle"
    assert _task_order(model) == ["a", "b"]
    assert any("unknown task ghost" in w for w in logs(result, "warning"))


@pytest.mark.parametrize("bad, why", [
    ([_task("a", []), _task("a", [])], "duplicate task ids: a"),
    ([_task("a", ["b"]), _task("b", ["a"])], "cycle"),
])
def test_invalid_plan_is_asked_for_again(tmp_path: Path, bad: list, why: str) -> None:
    good = [_task("x", []), _task("y", ["x"])]
    model = ScriptedModel(_plans(bad, good))
    result = run_sop(sop("plan"), model, tmp_path)
    assert result.status == "idle"
    plans = [r.spec for r in model.requests if r.spec.action == "WritePlan"]
    assert len(plans) == 2
    assert why in plans[1].prompt  # the re-ask shows the model its error
    assert _task_order(model) == ["x", "y"]


def test_plan_still_invalid_after_retries_fails_the_action(tmp_path: Path) -> None:
    cyclic = [_task("a", ["a"])]
    model = ScriptedModel(_plans(cyclic))
    result = run_sop(sop("plan"), model, tmp_path)
    assert result.status == "failed"
    assert "action WritePlan failed" in result.error and "cycle" in result.error
    assert model.asked().count("WritePlan") == 3  # max_retries: 2 (the default)
    assert _task_order(model) == []


def test_at_most_max_tasks_run(tmp_path: Path) -> None:
    plan = [_task(f"t{i}", []) for i in range(8)]
    model = ScriptedModel(_plans(plan))
    result = run_sop(sop("plan"), model, tmp_path)
    assert _task_order(model) == ["t0", "t1", "t2", "t3", "t4"]  # max_tasks: 5
    assert any("max_tasks" in w for w in logs(result, "warning"))


def test_publish_each_publishes_every_task_result(tmp_path: Path) -> None:
    text = (TESTS / "sops/plan.sop.yaml").read_text()
    text = text.replace('    send_to: ["<none>"]\n', '    send_to: ["<none>"]\n    publish: each\n')
    model = ScriptedModel(_plans([_task("a", []), _task("b", [])]))
    result = run_sop(sop_text(text), model, tmp_path)
    assert [h["cause_by"] for h in result.history] == ["UserRequirement", "ExecuteTask", "ExecuteTask"]


def test_order_plan_rejects_what_is_not_a_plan() -> None:
    with pytest.raises(PlanError):
        order_plan({"tasks": "nope"})
    with pytest.raises(PlanError):
        order_plan(["a"])
    assert order_plan({"tasks": []}) == ([], [])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(0, 11), max_size=4), min_size=1, max_size=12))
def test_a_plan_runs_each_task_once_its_dependencies_are_done_earliest_first(deps: list[list[int]]) -> None:
    """The order is: at each turn, the first task in plan order whose dependencies are done
    (the slow reading of it beside the plan's), or a cycle named; ids are shuffled names."""
    ids = [f"t{(7 * i) % 13}" for i in range(len(deps))]
    tasks = [{"task_id": tid, "dependent_task_ids": [ids[d] for d in ds if d < len(ids)]}
             for tid, ds in zip(ids, deps, strict=True)]
    done: list[str] = []
    pending = list(tasks)
    while pending:
        ready = next((t for t in pending if all(d in done for d in t["dependent_task_ids"])), None)
        if ready is None:
            break
        pending.remove(ready)
        done.append(ready["task_id"])
    if pending:
        with pytest.raises(PlanError, match="cycle: " + ", ".join(t["task_id"] for t in pending) + "$"):
            order_plan({"tasks": tasks})
    else:
        assert [t["task_id"] for t in order_plan({"tasks": tasks})[0]] == done


def test_a_model_error_during_the_choice_fails_the_run(tmp_path: Path) -> None:
    """Garbage ends the cycle; an unreachable model is a failure, not a quiet idle end."""
    from engine.errors import LLMError

    def answer(spec: CallSpec, attempt: int) -> Any:
        return LLMError("model 'x' failed for action Draft: connection refused") \
            if spec.kind == "choice" else default_answer(spec)
    result = run_sop(sop("react_multi"), ScriptedModel(answer), tmp_path)
    assert result.status == "failed" and "connection refused" in result.error
