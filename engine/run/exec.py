"""`kind: exec`: run one command in the workspace, never through a shell.

The argv items are templates rendered in the sandbox; `python` means the interpreter running
sopctl. The child gets the environment minus secret-looking variables, its own process
group (a timeout kills the whole group), no stdin, and bounded stdout and stderr."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from engine.check.sandbox import TemplateFailure, render_template
from engine.errors import ActionFailed
from engine.load.source import join_pointer
from engine.load.spec import ActionSpec
from engine.models.types import is_secret_name
from engine.run.workspace import Workspace

__all__ = ["MAX_STREAM_BYTES", "run_command", "exec_content"]


MAX_STREAM_BYTES = 64 * 1024
"""Bound on each of an exec action's stdout and stderr kept in `out`."""


async def run_command(action_id: str, action: ActionSpec, variables: dict[str, Any], *,
                      workspace: Workspace, allow_exec: bool) -> dict[str, Any]:
    """`kind: exec`: no shell, cwd = workspace, timeout kills the process group, bounded output."""
    command = join_pointer("/actions", action_id, "command")
    if not allow_exec:  # the run refuses to start before this; a second lock, never a bypass
        raise ActionFailed(action_id, "kind exec needs --allow-exec", code="SOP503", pointer=command)
    argv = _argv(action_id, action, variables, command)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable  # "python" means the interpreter running sopctl
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=workspace.root, stdin=asyncio.subprocess.DEVNULL, env=_child_env(),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        raise ActionFailed(action_id, f"cannot start {argv[0]!r}: {exc.strerror or exc}",
                           code="SOP503", pointer=f"{command}/0") from None
    return await _collect(proc, action.timeout_s)


def _argv(action_id: str, action: ActionSpec, variables: dict[str, Any], command: str) -> list[str]:
    """The command's items rendered in the sandbox; a failure names the item that failed."""
    argv = []
    for index, part in enumerate(action.command or []):
        try:
            argv.append(render_template(part, variables, limit=64 * 1024))
        except TemplateFailure as exc:
            raise ActionFailed(action_id, f"command template: {exc}", code="SOP501",
                               pointer=f"{command}/{index}") from None
    return argv


def _child_env() -> dict[str, str]:
    """The environment minus secret-looking variables: a command from a shared file never
    sees the user's API keys (so it cannot copy them into the workspace or its output)."""
    return {k: v for k, v in os.environ.items() if not is_secret_name(k)}


async def _collect(proc: asyncio.subprocess.Process, timeout_s: float) -> dict[str, Any]:
    readers = asyncio.gather(_read_bounded(proc.stdout), _read_bounded(proc.stderr), proc.wait())
    try:
        try:
            stdout, stderr, code = await asyncio.wait_for(asyncio.shield(readers), timeout_s)
            return {"exit_code": code, "stdout": stdout, "stderr": stderr}
        except asyncio.TimeoutError:
            pass
        finally:
            if proc.returncode is None:
                _kill_group(proc.pid)
        note = f"\n[sopctl: killed after {timeout_s:g} s timeout]"
        try:  # a process that left the group may still hold the pipes: do not wait forever
            stdout, stderr, _ = await asyncio.wait_for(asyncio.shield(readers), DRAIN_AFTER_KILL_S)
        except asyncio.TimeoutError:
            stdout, stderr = "", "[sopctl: output lost: a process outside the group kept the pipes open]"
            transport = getattr(proc, "_transport", None)  # close our ends of the pipes now
            if transport is not None:
                transport.close()
        return {"exit_code": 124, "stdout": stdout, "stderr": stderr + note}
    finally:
        if not readers.done():  # cancelled (Ctrl-C, a failing sibling) or abandoned above
            readers.cancel()
            await asyncio.gather(readers, return_exceptions=True)


DRAIN_AFTER_KILL_S = 5.0


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def _read_bounded(stream: asyncio.StreamReader | None) -> str:
    """Keep the first MAX_STREAM_BYTES, drain the rest (so the child never blocks on a pipe)."""
    if stream is None:
        return ""
    kept = bytearray()
    dropped = 0
    while chunk := await stream.read(65536):
        room = MAX_STREAM_BYTES - len(kept)
        kept += chunk[:room]
        dropped += max(0, len(chunk) - room)
    text = kept.decode("utf-8", errors="replace")
    return text + (f"\n[sopctl: {dropped} more bytes truncated]" if dropped else "")


def exec_content(out: dict[str, Any]) -> str:
    return (f"exit code: {out['exit_code']}\n## stdout\n{out['stdout']}\n"
            f"## stderr\n{out['stderr']}")
