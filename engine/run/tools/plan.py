"""The `plan` toolset: RoleZero's Plan, tasks in dependency order; the current task is the
first unfinished one. Its status is shown to the model at every step. One plan per role,
kept from one activation to the next (engine/run/rolestate.py); its commands change only
it, so running them again in order rebuilds it (resume)."""

from __future__ import annotations

from typing import Any

from engine.run.plans import PlanError, order_plan, plan_status, plan_view
from engine.run.tools.base import ToolError

__all__ = ["Plan"]


class Plan:
    """RoleZero's Plan: tasks in dependency order; the current task is the first unfinished."""

    def __init__(self) -> None:
        self.tasks: list[dict[str, Any]] = []

    def append(self, task_id: str, instruction: str, dependent_task_ids: list[str] | None = None,
               assignee: str = "", task_type: str = "") -> str:
        deps = [str(d) for d in dependent_task_ids or []]
        known = {t["task_id"] for t in self.tasks}
        missing = [d for d in deps if d not in known]
        if missing:
            raise ToolError(f"task {task_id} depends on unknown task(s) {', '.join(missing)}; "
                            "append those first")
        task = {"task_id": str(task_id), "instruction": instruction, "dependent_task_ids": deps,
                "assignee": assignee, "task_type": task_type, "is_finished": False}
        if str(task_id) in known:
            self._set([t for t in self.tasks if t["task_id"] != str(task_id)] + [task])
        else:   # the tasks are in order and it depends on some of them only: its place is last
            self.tasks = [*self.tasks, task]
        return f"task {task_id} added"

    def replace(self, task_id: str, instruction: str, dependent_task_ids: list[str] | None = None,
                assignee: str = "") -> str:
        self._task(task_id)
        tasks = [dict(t) for t in self.tasks]
        for task in tasks:
            if task["task_id"] == str(task_id):
                task.update(instruction=instruction, assignee=assignee, is_finished=False,
                            dependent_task_ids=[str(d) for d in dependent_task_ids or []])
        self._set(tasks)
        self._reset_dependents(str(task_id))
        return f"task {task_id} replaced"

    def reset(self, task_id: str) -> str:
        if any(t["task_id"] == str(task_id) for t in self.tasks):
            self._task(task_id)["is_finished"] = False
            self._reset_dependents(str(task_id))
        return f"task {task_id} reset"

    def finish_current(self) -> str:
        current = self.current()
        if current is None:
            return "no task is left to finish; use `end` if you are done"
        current["is_finished"] = True
        nxt = self.current()
        return (f"task {current['task_id']} finished" +
                (f"; the current task is now {nxt['task_id']}" if nxt else "; every task is finished: use `end`"))

    def current(self) -> dict[str, Any] | None:
        return next((t for t in self.tasks if not t["is_finished"]), None)

    def status(self) -> str:
        """The plan as the model sees it each step (RoleZero's plan status, our wording)."""
        return plan_status(self.tasks)

    def view(self) -> dict[str, Any]:
        """What templates read as `plan` (status, tasks, current)."""
        return plan_view(self.tasks)

    def copy(self) -> Plan:
        """A copy to work on (a `for_each` item's: items run concurrently)."""
        plan = Plan()
        plan.tasks = [{**t, "dependent_task_ids": list(t["dependent_task_ids"])} for t in self.tasks]
        return plan

    def _task(self, task_id: str) -> dict[str, Any]:
        for task in self.tasks:
            if task["task_id"] == str(task_id):
                return task
        raise ToolError(f"no task {task_id} in the plan")

    def _set(self, tasks: list[dict[str, Any]]) -> None:
        try:
            self.tasks, _ = order_plan({"tasks": tasks})
        except PlanError as exc:
            raise ToolError(str(exc)) from None

    def _reset_dependents(self, task_id: str) -> None:
        for task in self.tasks:
            if task_id in task["dependent_task_ids"] and task["is_finished"]:
                task["is_finished"] = False
                self._reset_dependents(task["task_id"])

    # -- the commands (`plan.append_task` -> `do_append_task`) ---------------------------
    async def do_append_task(self, task_id: str, instruction: str, dependent_task_ids: list[str] | None = None,
                          assignee: str = "", task_type: str = "") -> str:
        return self.append(task_id, instruction, dependent_task_ids, assignee, task_type)

    async def do_reset_task(self, task_id: str) -> str:
        return self.reset(task_id)

    async def do_replace_task(self, task_id: str, instruction: str, dependent_task_ids: list[str] | None = None,
                           assignee: str = "") -> str:
        return self.replace(task_id, instruction, dependent_task_ids, assignee)

    async def do_finish_current_task(self) -> str:
        return self.finish_current()
