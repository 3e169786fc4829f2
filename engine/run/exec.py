"""`kind: exec`: run one command in the workspace, never through a shell.

The argv items are templates rendered in the template sandbox; `python` means the interpreter
running sopctl. The child gets an allowlisted environment (`child_env`), its own process group
(a timeout kills the whole group), no stdin, and bounded stdout and stderr; when it ends, what
it left running is killed (engine/run/reaper.py); with `--isolate` it runs under bubblewrap
(engine/run/isolation.py)."""

from __future__ import annotations

import asyncio
import errno
import os
import secrets
import shutil
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine.templates.render import render_template
from engine.templates.sandbox import TemplateFailure
from engine.errors import ActionFailed
from engine.load.outputs import with_absent_as_null
from engine.models import answers
from engine.load.source import join_pointer
from engine.load.spec import ExecAction
from engine.run.isolation import Sandbox
from engine.run.reaper import MARK_ENV, reap, session_leaders_below, subreaper
from engine.run.workspace import Workspace

__all__ = ["WORKSPACE_ENV", "stdout_answer", "sop_folder", "interrupt_group", "MAX_STREAM_BYTES", "CHILD_ENV_ALLOWED", "child_env", "run_command", "run_argv", "exec_content",
           "start_process", "program_path", "kill_group"]


WORKSPACE_ENV = "SOPCTL_WORKSPACE"
"""The workspace's path, in every command's environment (for a command run in the SOP's folder)."""


MAX_STREAM_BYTES = 64 * 1024
"""Bound on each of an exec action's stdout and stderr kept in `out`."""


async def run_command(action_id: str, action: ExecAction, variables: dict[str, Any], *,
                      workspace: Workspace, allow_exec: bool, sandbox: Sandbox | None = None,
                      sop_file: str = "<string>") -> dict[str, Any]:
    """`kind: exec`: no shell, cwd = workspace, timeout kills the process group, bounded output,
    and nothing the command started outlives it (engine/run/reaper.py)."""
    command = join_pointer("/actions", action_id, "command")
    if not allow_exec:  # the run refuses to start before this; a second lock, never a bypass
        raise ActionFailed(action_id, "kind exec needs --allow-exec", code="SOP503", pointer=command)
    argv = _argv(action_id, action, variables, command)
    cwd = sop_folder(action_id, sop_file, join_pointer("/actions", action_id, "workdir")) \
        if action.workdir == "sop" else None
    return await run_argv(action_id, argv, workspace=workspace, timeout_s=action.command_timeout_s,
                          env_names=action.env, sandbox=sandbox, pointer=command, cwd=cwd)


def sop_folder(action_id: str, sop_file: str, pointer: str) -> Path:
    """`workdir: sop`: the SOP file's folder (an SOP given as text has none)."""
    if sop_file.startswith("<"):
        raise ActionFailed(action_id, "workdir: sop needs an SOP file (this one was given as text)",
                           code="SOP503", pointer=pointer)
    return Path(sop_file).resolve().parent


async def run_argv(action_id: str, argv: list[str], *, workspace: Workspace, timeout_s: float,
                   env_names: list[str] | tuple[str, ...] = (), sandbox: Sandbox | None = None,
                   pointer: str = "", cwd: Path | None = None) -> dict[str, Any]:
    """Run `argv` as `kind: exec` runs its command (also the `terminal` tool's way): no shell
    unless argv names one, cwd = workspace (or `cwd`: the SOP's folder, read-only in the
    sandbox), bounded, the process group killed at the end. The caller has checked --allow-exec."""
    argv = list(argv)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable  # "python" means the interpreter running sopctl
    mark = secrets.token_hex(8)
    env = {**child_env(env_names), MARK_ENV: mark, WORKSPACE_ENV: str(workspace.root)}
    where = cwd or workspace.root
    if sandbox is not None:
        env["TMPDIR"] = "/tmp"  # the sandbox's own; the user's may be read-only in there
        program = program_path(argv[0], env, where)
        if program is None:
            raise _cannot_start(action_id, pointer, argv[0], os.strerror(errno.ENOENT))
        argv = sandbox.wrap([program, *argv[1:]], workspace.root, cwd=cwd)
    with subreaper():
        try:
            proc, exited = await start_process(argv, cwd=where, env=env)
        except OSError as exc:
            raise _cannot_start(action_id, pointer, argv[0], exc.strerror or str(exc)) from None
        return await _collect(proc, exited, timeout_s, mark)


class _ExitAware(asyncio.subprocess.SubprocessStreamProtocol):
    """Says when the command exits. asyncio's `wait()` also waits for the pipes to close, and
    a process the command left behind may hold them for as long as it lives."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


async def start_process(argv: list[str], *, cwd: Path, env: dict[str, str],
                        stdin: int = asyncio.subprocess.DEVNULL
                        ) -> tuple[asyncio.subprocess.Process, asyncio.Future[None]]:
    """`asyncio.create_subprocess_exec` in a session of its own (a group to kill), plus a
    future done when the command exits (also the terminal's and the notebook's way)."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.subprocess_exec(
        lambda: _ExitAware(limit=2 ** 16, loop=loop), *argv, cwd=cwd,  # asyncio's default limit
        stdin=stdin, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True)
    return asyncio.subprocess.Process(transport, protocol, loop), protocol.exited


def program_path(name: str, env: dict[str, str], cwd: Path) -> str | None:
    """The program as the child would find it (PATH, or a path from the workspace), looked up
    now: inside the sandbox a missing one would only be bwrap's exit code 1."""
    if os.sep in name:
        path = cwd / name
        return str(path) if path.is_file() and os.access(path, os.X_OK) else None
    return shutil.which(name, path=env.get("PATH", os.defpath))


def _cannot_start(action_id: str, command: str, program: str, why: str) -> ActionFailed:
    return ActionFailed(action_id, f"cannot start {program!r}: {why}", code="SOP503",
                        pointer=f"{command}/0")


def _argv(action_id: str, action: ExecAction, variables: dict[str, Any], command: str) -> list[str]:
    """The command's items rendered in the sandbox; a failure names the item that failed."""
    argv = []
    for index, part in enumerate(action.command):
        try:
            argv.append(render_template(part, variables, limit=64 * 1024))
        except TemplateFailure as exc:
            raise ActionFailed(action_id, f"command template: {exc}", code="SOP501",
                               pointer=f"{command}/{index}") from None
    return argv


CHILD_ENV_ALLOWED = ("PATH", "HOME", "LANG", "TMPDIR", "TERM")
"""What every exec child gets from the user's environment (plus `LC_*` and the names the action
declares in `env`)."""


def child_env(declared: list[str] | tuple[str, ...] = (),
              environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """An allowlist, not a denylist: a command from a shared file sees only what it needs to run
    and what its action names, never the user's keys under a name no rule foresaw (`OPENAI_KEY`,
    `DATABASE_URL` with a password...). The checker warns when a declared name looks secret."""
    env = os.environ if environ is None else environ
    allowed = set(CHILD_ENV_ALLOWED) | set(declared)
    return {k: v for k, v in env.items() if k in allowed or k.startswith("LC_")}


async def _collect(proc: asyncio.subprocess.Process, exited: asyncio.Future[None], timeout_s: float,
                   mark: str) -> dict[str, Any]:
    """Wait for the command (at most `timeout_s`), then end whatever it left running (its
    group, and what carries its mark), so the pipes close and the output is complete."""
    streams = asyncio.gather(_read_bounded(proc.stdout), _read_bounded(proc.stderr))
    try:
        try:
            await asyncio.wait_for(asyncio.shield(exited), timeout_s)
            code = proc.returncode
        except asyncio.TimeoutError:
            code = None
        finally:  # also when cancelled (Ctrl-C, SIGTERM, a failing sibling)
            kill_group(proc.pid)
            reap(mark, proc.pid)
        try:  # a process that escaped the mark may still hold the pipes: do not wait forever
            stdout, stderr = await asyncio.wait_for(asyncio.shield(streams), DRAIN_AFTER_KILL_S)
        except asyncio.TimeoutError:
            stdout, stderr = "", "[sopctl: output lost: a process outside the group kept the pipes open]"
            _close_pipes(proc)
        if code is None:
            await exited  # killed above: the exit status arrives at once
            return {"exit_code": 124, "stdout": stdout,
                    "stderr": stderr + f"\n[sopctl: killed after {timeout_s:g} s timeout]"}
        return {"exit_code": code, "stdout": stdout, "stderr": stderr}
    finally:
        if not streams.done():  # cancelled (Ctrl-C, a failing sibling) or abandoned above
            streams.cancel()
            await asyncio.gather(streams, return_exceptions=True)
            _close_pipes(proc)


def _close_pipes(proc: asyncio.subprocess.Process) -> None:
    """Close our ends of the pipes now, not when the event loop is gone (an escaped process
    may hold the other ends for as long as it lives)."""
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()


DRAIN_AFTER_KILL_S = 5.0


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def interrupt_group(pid: int, *, sandboxed: bool) -> None:
    """Ctrl-C: SIGINT to the process group of `pid`, a long-lived shell or kernel (under
    bubblewrap, to the sandbox's own session, which the signal would not cross otherwise)."""
    leaders = session_leaders_below(pid) if sandboxed else []
    try:
        os.killpg(leaders[0] if leaders else pid, signal.SIGINT)
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


def stdout_answer(action_id: str, out: dict[str, Any], schema: dict[str, Any]) -> Any:
    """An exec action's `output` tree: its stdout's one JSON object, validated like a model's
    answer (SOP505 at `output`, as an answer that never fits: a plan's task fails and is
    retried); a non-zero exit fails it the same way, stderr shown."""
    pointer = join_pointer("/actions", action_id, "output")
    if out["exit_code"] != 0:
        raise ActionFailed(action_id, f"the command exited with code {out['exit_code']}: "
                           f"{out['stderr'].strip()[-2000:]}", code="SOP505", pointer=pointer)
    try:
        value = answers.parse_json_object(out["stdout"])
        errors = answers.schema_errors(value, schema)
    except answers.InvalidAnswer as exc:
        errors = [str(exc)]
    if errors:
        raise ActionFailed(action_id, "its stdout is not the JSON object its output tree declares: "
                           + "; ".join(errors), hint="print one JSON object with the tree's keys",
                           code="SOP505", pointer=pointer)
    return with_absent_as_null(value, schema)


def exec_content(out: dict[str, Any]) -> str:
    return (f"exit code: {out['exit_code']}\n## stdout\n{out['stdout']}\n"
            f"## stderr\n{out['stderr']}")
