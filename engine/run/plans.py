"""Plans as MetaGPT's Planner and RoleZero's `Plan` keep them: tasks with ids and
dependencies, in dependency order (ties in plan order); used by `plan_and_act` (role.py) and
by the `plan` tool (tools/plan.py)."""

from __future__ import annotations

import heapq
from collections import Counter
from typing import Any

from engine.load.spec import PlannerSpec

__all__ = ["PlanError", "order_plan", "plan_status", "plan_view"]


class PlanError(ValueError):
    """A plan that cannot be run (duplicate task ids, a cycle, not a list of tasks)."""


def order_plan(out: Any, planner: PlannerSpec | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Tasks in dependency order (ties in plan order) and warnings; PlanError if unusable
    (also when `planner` has no action for a task's type)."""
    tasks = out.get("tasks") if isinstance(out, dict) else None
    if not isinstance(tasks, list) or not all(isinstance(t, dict) and "task_id" in t for t in tasks):
        raise PlanError("the plan needs `tasks`: a list of objects with a task_id")
    untyped = [t for t in tasks if planner is not None and not planner.steps_for(t.get("task_type"))]
    if untyped and planner is not None:
        raise PlanError(f"task {untyped[0]['task_id']} has task_type {untyped[0].get('task_type')!r}; "
                        f"the task types are {', '.join(planner.task_actions)}")
    ids = [str(t["task_id"]) for t in tasks]
    duplicates = sorted(i for i, n in Counter(ids).items() if n > 1)
    if duplicates:
        raise PlanError(f"duplicate task ids: {', '.join(duplicates)}")
    known, warnings = set(ids), []
    deps: dict[str, list[str]] = {}
    for task, tid in zip(tasks, ids, strict=True):
        declared = [str(d) for d in task.get("dependent_task_ids") or []]
        for missing in [d for d in declared if d not in known]:
            warnings.append(f"task {tid} depends on unknown task {missing}; dependency ignored")
        deps[tid] = [d for d in declared if d in known]
    return _topological(tasks, ids, deps), warnings


def _topological(tasks: list[dict[str, Any]], ids: list[str],
                 deps: dict[str, list[str]]) -> list[dict[str, Any]]:
    """At each turn the first task in plan order whose dependencies are done (a heap of the
    ready tasks' places): n log n, as a plan is ordered again at every command that changes it."""
    place = {tid: index for index, tid in enumerate(ids)}
    waiting = {tid: len(set(deps[tid])) for tid in ids}
    dependents: dict[str, list[str]] = {}
    for tid in ids:
        for dep in set(deps[tid]):
            dependents.setdefault(dep, []).append(tid)
    ready = [place[tid] for tid in ids if not waiting[tid]]
    heapq.heapify(ready)
    ordered: list[dict[str, Any]] = []
    while ready:
        index = heapq.heappop(ready)
        ordered.append(tasks[index])
        for later in dependents.get(ids[index], ()):
            waiting[later] -= 1
            if not waiting[later]:
                heapq.heappush(ready, place[later])
    if len(ordered) < len(tasks):
        cycle = [tid for tid in ids if waiting[tid]]
        raise PlanError(f"the tasks depend on each other in a cycle: {', '.join(cycle)}")
    return ordered


def plan_status(tasks: list[dict[str, Any]]) -> str:
    """A `plan` tool's tasks as the model sees them each step (RoleZero's plan status, our
    wording); the current task is the first unfinished one."""
    if not tasks:
        return "No plan yet."
    lines = []
    for task in tasks:
        done = "(finished) " if task["is_finished"] else ""
        deps = f" Depends on tasks {task['dependent_task_ids']}." if task["dependent_task_ids"] else ""
        who = f" [Assigned to {task['assignee']}]" if task["assignee"] else ""
        lines.append(f"[TASK_ID {task['task_id']}] {done}{task['instruction']}{deps}{who}")
    current = _current(tasks)
    lines.append(f"Current task: {current['task_id']}: {current['instruction']}" if current
                 else "Current task: none (every task is finished)")
    return "\n".join(lines)


def plan_view(tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """The role's plan as templates read it (`plan.status`, `plan.tasks`, `plan.current`):
    copies, so a template cannot change the plan."""
    current = _current(tasks)
    return {"status": plan_status(tasks), "tasks": [dict(t) for t in tasks],
            "current": dict(current) if current is not None else None}


def _current(tasks: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((t for t in tasks if not t["is_finished"]), None)
