"""The `terminal` toolset: shell commands in the workspace (MetaGPT's Terminal); only with
--allow-exec, and under --isolate in its sandbox."""

from __future__ import annotations

from engine.run.actions import RunContext
from engine.run.exec import run_argv
from engine.run.tools.base import Outcome, ToolError

__all__ = ["Terminal", "DEFAULT_TERMINAL_TIMEOUT_S"]


DEFAULT_TERMINAL_TIMEOUT_S = 60.0


class Terminal:
    """`terminal.*` for one role."""

    def __init__(self, ctx: RunContext, action_id: str) -> None:
        self.ctx = ctx
        self.action_id = action_id

    async def do_run(self, command: str, timeout_s: float = DEFAULT_TERMINAL_TIMEOUT_S) -> Outcome:
        if not self.ctx.allow_exec:   # the run refuses to start before this; a second lock
            raise ToolError("the terminal needs --allow-exec")
        out = await run_argv(self.action_id, ["/bin/sh", "-c", command], workspace=self.ctx.workspace,
                             timeout_s=min(float(timeout_s), 600.0), sandbox=self.ctx.sandbox)
        return Outcome(f"[exit code {out['exit_code']}]\n[stdout]\n{out['stdout']}\n[stderr]\n{out['stderr']}")
