"""The `plan` tool's order: a task appended takes its place without the plan being sorted
again, and the order is still the one the whole plan sorted gives (engine/run/plans.py)."""

from __future__ import annotations

import random

import pytest

from engine.run.plans import order_plan
from engine.run.tools.base import ToolError
from engine.run.tools.plan import Plan


def _ids(plan: Plan) -> list[str]:
    return [t["task_id"] for t in plan.tasks]


def test_random_appends_keep_the_order_that_sorting_the_whole_plan_again_gives() -> None:
    chooser = random.Random(28)
    for _ in range(300):
        plan, sorted_again = Plan(), []   # `sorted_again`: the plan sorted whole at every append
        for _ in range(chooser.randint(1, 12)):
            known = _ids(plan)
            task_id = chooser.choice(known) if known and chooser.random() < 0.3 else str(chooser.randint(0, 30))
            deps = chooser.sample([k for k in known if k != task_id], k=min(len(known) - (task_id in known),
                                                                           chooser.randint(0, 3)))
            try:
                plan.append(task_id, f"do {task_id}", deps)
            except ToolError:   # a re-appended task may close a cycle: the plan stays as it was
                continue
            task = {"task_id": task_id, "instruction": f"do {task_id}", "dependent_task_ids": deps}
            sorted_again, _ = order_plan({"tasks": [t for t in sorted_again if t["task_id"] != task_id] + [task]})
            assert _ids(plan) == [t["task_id"] for t in sorted_again]


def test_a_task_appended_after_the_one_it_depends_on_is_current_once_that_one_is_finished() -> None:
    plan = Plan()
    plan.append("1", "write the game")
    plan.append("2", "test it", ["1"])
    plan.append("3", "write the docs")
    assert _ids(plan) == ["1", "2", "3"]
    assert plan.finish_current() == "task 1 finished; the current task is now 2"


def test_a_task_appended_again_moves_after_its_new_dependencies() -> None:
    plan = Plan()
    plan.append("1", "write the game")
    plan.append("2", "write the docs")
    plan.append("1", "write the game from the docs", ["2"])
    assert _ids(plan) == ["2", "1"]
    assert plan.tasks[1]["instruction"] == "write the game from the docs"


def test_a_dependency_on_a_task_not_in_the_plan_is_refused_and_nothing_changes() -> None:
    plan = Plan()
    plan.append("1", "write the game")
    with pytest.raises(ToolError, match="unknown task"):
        plan.append("2", "test it", ["7"])
    assert _ids(plan) == ["1"]
