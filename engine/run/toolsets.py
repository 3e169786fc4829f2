"""The built-in toolsets at run time: editor, terminal, plan, team, human (MetaGPT's Editor,
Terminal, Plan, TeamLeader.publish_team_message and RoleZero.ask_human/reply_to_human).

What the model may call and the schema of each command's args are in engine/load/catalog.py;
the tool loop (engine/run/toolloop.py) checks the args against that schema before a command
runs here. Every failure a model can cause is a `ToolError`, whose message goes back to the
model as the command's output; nothing here ends a run except what must (a person the run
waits for, the budget).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from engine.load.spec import ENGINE_DIR
from engine.run.actions import RunContext, ask_human, reply_to_human
from engine.run.exec import run_argv
from engine.run.plans import PlanError, order_plan
from engine.run.workspace import WorkspaceError, WrittenFile

__all__ = ["ToolError", "Outcome", "Tool", "Plan", "Builtins", "MAX_LIST_ENTRIES", "MAX_SEARCH_HITS"]


MAX_LIST_ENTRIES = 500


MAX_SEARCH_HITS = 200


MAX_READ_BYTES = 2_000_000
"""A file larger than this is not read, listed for search, or replaced into."""


DEFAULT_TERMINAL_TIMEOUT_S = 60.0


class ToolError(Exception):
    """A command that cannot do what was asked; the message is the model's to read."""


@dataclass
class Outcome:
    """What one command gave back: its output (for the model), whether it is an error, and
    the files it wrote (path -> content), which a resume reconciles like artifacts."""

    output: str
    error: bool = False
    files: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"output": self.output, "error": self.error, "files": self.files}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        return cls(str(data.get("output", "")), bool(data.get("error")), dict(data.get("files") or {}))


@dataclass(frozen=True)
class Tool:
    """A command the model may give: its JSON Schema of args, and how the loop treats it."""

    name: str
    description: str
    args: dict[str, Any]
    exclusive: bool = False
    readonly: bool = False
    journaled: bool = True
    """Its result is journaled and reused (it acts outside the loop); else it runs again."""
    server: str | None = None
    """An MCP server's tool (its name on the server is `name` after `<server>.`)."""


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
        self._set([t for t in self.tasks if t["task_id"] != str(task_id)] + [task])
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
        if not self.tasks:
            return "No plan yet."
        lines = []
        for task in self.tasks:
            done = "(finished) " if task["is_finished"] else ""
            deps = f" Depends on tasks {task['dependent_task_ids']}." if task["dependent_task_ids"] else ""
            who = f" [Assigned to {task['assignee']}]" if task["assignee"] else ""
            lines.append(f"[TASK_ID {task['task_id']}] {done}{task['instruction']}{deps}{who}")
        current = self.current()
        lines.append(f"Current task: {current['task_id']}: {current['instruction']}" if current
                     else "Current task: none (every task is finished)")
        return "\n".join(lines)

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


class Builtins:
    """The built-in commands of one tool loop: its plan and the team messages it sends."""

    def __init__(self, ctx: RunContext, role_id: str, action_id: str, round_: int) -> None:
        self.ctx = ctx
        self.role_id = role_id
        self.action_id = action_id
        self.round = round_
        self.plan = Plan()
        self.messages: list[tuple[str, str]] = []
        """team.publish: (content, role id), in the order they were sent."""
        spec = ctx.compiled.spec
        self.targets = {name: rid for rid in spec.roles if rid != role_id
                        for name in (rid, spec.role_name(rid))}

    async def run(self, name: str, args: dict[str, Any], call_key: str) -> Outcome:
        handler = getattr(self, "_" + name.replace(".", "_"), None)
        if handler is None:
            raise ToolError(f"command {name} not found")
        result = await handler(call_key=call_key, **args)
        return result if isinstance(result, Outcome) else Outcome(str(result))

    # -- editor ---------------------------------------------------------------------------
    def _path(self, rel: str, *, folder: bool = False) -> Path:
        if folder and rel.strip() in (".", "./", ""):
            return self.ctx.workspace.root
        try:
            return self.ctx.workspace.confine(rel.rstrip("/") if folder else rel)
        except WorkspaceError as exc:
            raise ToolError(exc.message) from None

    def _write(self, rel: str, content: str) -> WrittenFile:
        try:
            return self.ctx.workspace.write(rel, content)
        except WorkspaceError as exc:
            raise ToolError(exc.message) from None

    def _text(self, rel: str) -> str:
        path = self._path(rel)
        if not path.is_file():
            raise ToolError(f"no file {rel} in the workspace")
        if path.stat().st_size > MAX_READ_BYTES:
            raise ToolError(f"{rel} is larger than {MAX_READ_BYTES} bytes")
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ToolError(f"cannot read {rel}: {exc}") from None

    async def _editor_write(self, call_key: str, path: str, content: str) -> Outcome:
        written = self._write(path, content)
        return Outcome(f"wrote {written.path} ({len(content.splitlines())} lines)",
                       files={written.path: content})

    async def _editor_read(self, call_key: str, path: str) -> str:
        text = self._text(path)
        return "\n".join(f"{n}|{line}" for n, line in enumerate(text.splitlines(), 1)) or "(empty file)"

    async def _editor_replace(self, call_key: str, path: str, old: str, new: str) -> Outcome:
        text = self._text(path)
        count = text.count(old) if old else 0
        if count != 1:
            raise ToolError(f"`old` occurs {count} times in {path}; it must occur exactly once "
                            "(give more of the surrounding text)")
        content = text.replace(old, new, 1)
        written = self._write(path, content)
        return Outcome(f"replaced 1 occurrence in {written.path}", files={written.path: content})

    async def _editor_list(self, call_key: str, path: str = ".") -> str:
        files = self._files(path)
        shown = files[:MAX_LIST_ENTRIES]
        more = f"\n[{len(files) - len(shown)} more not shown]" if len(files) > len(shown) else ""
        return ("\n".join(shown) or "(no files)") + more

    async def _editor_search(self, call_key: str, term: str, path: str = ".") -> str:
        if not term:
            raise ToolError("`term` is empty")
        hits: list[str] = []
        for rel in self._files(path):
            try:
                text = (self.ctx.workspace.root / rel).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            hits += [f"{rel}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1) if term in line]
            if len(hits) > MAX_SEARCH_HITS:
                return "\n".join(hits[:MAX_SEARCH_HITS]) + f"\n[more than {MAX_SEARCH_HITS} matches; narrow the search]"
        return "\n".join(hits) or f"no line contains {term!r}"

    def _files(self, rel: str) -> list[str]:
        """Files under a workspace folder (never sopctl's own, never through a symlink)."""
        root = self.ctx.workspace.root
        base = self._path(rel, folder=True)
        if not base.is_dir():
            raise ToolError(f"no folder {rel} in the workspace")
        found: list[str] = []
        for folder, dirs, names in os.walk(base, followlinks=False):
            dirs[:] = sorted(d for d in dirs if not (Path(folder) == root and d == ENGINE_DIR))
            for name in sorted(names):
                path = Path(folder) / name
                if path.is_file() and not path.is_symlink() and path.stat().st_size <= MAX_READ_BYTES:
                    found.append(PurePosixPath(path.relative_to(root).as_posix()).as_posix())
            if len(found) > MAX_LIST_ENTRIES * 4:
                break
        return found

    # -- terminal -------------------------------------------------------------------------
    async def _terminal_run(self, call_key: str, command: str,
                            timeout_s: float = DEFAULT_TERMINAL_TIMEOUT_S) -> Outcome:
        if not self.ctx.allow_exec:   # the run refuses to start before this; a second lock
            raise ToolError("the terminal needs --allow-exec")
        out = await run_argv(self.action_id, ["/bin/sh", "-c", command], workspace=self.ctx.workspace,
                             timeout_s=min(float(timeout_s), 600.0), sandbox=self.ctx.sandbox)
        return Outcome(f"[exit code {out['exit_code']}]\n[stdout]\n{out['stdout']}\n[stderr]\n{out['stderr']}")

    # -- plan -----------------------------------------------------------------------------
    async def _plan_append_task(self, call_key: str, task_id: str, instruction: str,
                                dependent_task_ids: list[str] | None = None, assignee: str = "",
                                task_type: str = "") -> str:
        return self.plan.append(task_id, instruction, dependent_task_ids, assignee, task_type)

    async def _plan_reset_task(self, call_key: str, task_id: str) -> str:
        return self.plan.reset(task_id)

    async def _plan_replace_task(self, call_key: str, task_id: str, instruction: str,
                                 dependent_task_ids: list[str] | None = None, assignee: str = "") -> str:
        return self.plan.replace(task_id, instruction, dependent_task_ids, assignee)

    async def _plan_finish_current_task(self, call_key: str) -> str:
        return self.plan.finish_current()

    # -- team -----------------------------------------------------------------------------
    async def _team_publish(self, call_key: str, content: str, send_to: str) -> str:
        target = self.targets.get(send_to.strip())
        if target is None:
            raise ToolError(f"no team member '{send_to}'; the members are: "
                            f"{', '.join(dict.fromkeys(self.targets)) or 'none'}")
        if not content.strip():
            raise ToolError("the message is empty")
        self.messages.append((content, target))
        return f"message sent to {self.ctx.compiled.spec.role_name(target)}"

    # -- human ----------------------------------------------------------------------------
    async def _human_ask(self, call_key: str, question: str) -> str:
        answer = await ask_human(self.ctx, role=self.role_id, action=self.action_id, round_=self.round,
                                 key=call_key, prompt=question)
        return f"the person answered: {answer}"

    async def _human_reply(self, call_key: str, text: str) -> str:
        reply_to_human(self.ctx, role=self.role_id, action=self.action_id, round_=self.round, text=text)
        return "the person has your message; do not repeat it"
