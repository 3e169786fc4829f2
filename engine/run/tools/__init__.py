"""The built-in toolsets at run time, one module each: editor, terminal, notebook, plan, team,
human, browser, search (MetaGPT's Editor, Terminal, ExecuteNbCode, Plan,
TeamLeader.publish_team_message, RoleZero.ask_human/reply_to_human, Browser and
SearchEnhancedQA's search engine).

What the model may call and the schema of each command's args are in engine/load/catalog.py;
the tool loop (engine/run/toolloop.py) checks the args against that schema before a command
runs here. A command `<toolset>.<name>` runs the method `do_<name>` of that toolset's object
(as `cmd.Cmd` does).
Every failure a model can cause is a `ToolError`, whose message goes back to the model as the
command's output; nothing here ends a run except what must (a person the run waits for, the
budget).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from engine.run.actions import RunContext
from engine.run.tools.base import Outcome, Tool, ToolError
from engine.run.tools.browser import Browser
from engine.run.tools.editor import Editor
from engine.run.tools.human import Human
from engine.run.tools.notebook import Notebook
from engine.run.tools.plan import Plan
from engine.run.tools.search import Search
from engine.run.tools.team import Team
from engine.run.tools.terminal import Terminal

__all__ = ["ToolError", "Outcome", "Tool", "Plan", "Builtins"]


class Builtins:
    """The built-in commands of one tool loop: its plan and the team messages it sends."""

    def __init__(self, ctx: RunContext, role_id: str, action_id: str, round_: int,
                 plan: Plan | None = None) -> None:
        self.plan = plan if plan is not None else Plan()   # the role's, kept across activations
        self.team = Team(ctx.compiled.spec, role_id)
        self.human = Human(ctx, role_id, action_id, round_)
        self.toolsets: dict[str, Any] = {
            "editor": Editor(ctx.workspace), "terminal": Terminal(ctx, role_id, action_id), "plan": self.plan,
            "team": self.team, "human": self.human,
            "notebook": Notebook(ctx, role_id),
            "browser": Browser(ctx, role_id), "search": Search(ctx.compiled.spec.search, ctx.allow_hosts)}

    @property
    def messages(self) -> list[tuple[str, str]]:
        """team.publish: (content, role id), in the order they were sent."""
        return self.team.messages

    def restore(self, name: str, outcome: Outcome) -> None:
        """An outcome taken from the journal: the state it left in its toolset is set again
        (the editor's window), as running the command did."""
        restore = getattr(self.toolsets.get(name.partition(".")[0]), "restore", None)
        if outcome.state and restore is not None:
            restore(outcome.state)

    async def run(self, name: str, args: dict[str, Any], call_key: str) -> Outcome:
        toolset, _, command = name.partition(".")
        handler = getattr(self.toolsets.get(toolset), "do_" + command, None)
        if handler is None or not inspect.iscoroutinefunction(handler):
            raise ToolError(f"command {name} not found")
        if _takes_call_key(getattr(handler, "__func__", handler)):   # journaled by its own key (human.ask)
            args = {**args, "call_key": call_key}
        result = await handler(**args)
        return result if isinstance(result, Outcome) else Outcome(str(result))


@functools.cache
def _takes_call_key(function: Any) -> bool:
    """Whether a command's handler takes the call's journal key (looked up once per handler:
    a tool loop runs the same commands step after step)."""
    return "call_key" in inspect.signature(function).parameters
