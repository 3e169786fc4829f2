"""The `terminal` toolset: one persistent shell per role (MetaGPT's Terminal); only with
--allow-exec, and under --isolate inside its sandbox.

The shell is a long-lived `bash` on pipes, not on a pseudo-terminal: the model reads the
output, not a screen, and pipes keep stdout and stderr apart with no echo, no prompt and no
escape codes to strip. Each command is sent as `eval -- '<command>' </dev/null` followed by a
line that prints a marker of the session's own with `$?`, on stdout and on stderr; the output
is what came before the markers. So `cd`, `export`, functions and background jobs persist,
and a command that reads stdin reads nothing instead of the next command.

A timeout interrupts the command as Ctrl-C would (SIGINT to the shell's process group; the
shell traps it and carries on, background jobs ignore it): the session is kept. A command
that does not stop then (or a shell loop, which SIGINT does not break here) ends the session
with its whole process group; the next command starts a new one, and says so. The shell runs
with the allowlisted environment of `kind: exec` (engine.run.exec.child_env), in the
workspace, in a session of its own, with sopctl as subreaper; the registry on the RunContext
(engine.run.sessions) ends it with the run."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shlex
from dataclasses import dataclass, field
from typing import Any

from engine.run.actions import RunContext
from engine.run.exec import child_env, interrupt_group, kill_group, program_path, start_process
from engine.run.isolation import Sandbox
from engine.run.reaper import MARK_ENV, reap, subreaper
from engine.run.tools.base import Outcome, ToolError
from engine.run.workspace import Workspace

__all__ = ["Terminal", "ShellSession", "DEFAULT_TERMINAL_TIMEOUT_S", "HEAD_BYTES", "TAIL_BYTES"]


DEFAULT_TERMINAL_TIMEOUT_S = 60.0
MAX_TERMINAL_TIMEOUT_S = 600.0
INTERRUPT_GRACE_S = 3.0
"""After the interrupt, how long the command has to stop before the session is ended."""
EXIT_DRAIN_S = 1.0
"""After the shell exited, how long its last output may take (a background job holds the pipes)."""

HEAD_BYTES = 2500
TAIL_BYTES = 1500
"""Of each of stdout and stderr, the first and last bytes shown; what lies between is counted
and the model told how to see it. Both streams together stay under the loop's output cap."""

TOOLSET = "terminal"

_Markers = asyncio.Future[tuple[bytes | None, bytes | None]]
"""What follows the marker on stdout (the exit code) and on stderr; None: the pipe closed."""


class Terminal:
    """`terminal.*` for one role: its commands go to the role's shell session."""

    def __init__(self, ctx: RunContext, role_id: str, action_id: str) -> None:
        self.ctx = ctx
        self.role_id = role_id
        self.action_id = action_id

    async def do_run(self, command: str, timeout_s: float = DEFAULT_TERMINAL_TIMEOUT_S) -> Outcome:
        if not self.ctx.allow_exec:   # the run refuses to start before this; a second lock
            raise ToolError("the terminal needs --allow-exec")
        if "\0" in command:
            raise ToolError("the command holds a NUL character, which a shell cannot take")
        result, notice = await self.ctx.sessions.run(
            TOOLSET, self.role_id, self._start,
            lambda session: session.run(command, min(float(timeout_s), MAX_TERMINAL_TIMEOUT_S)),
            self._new_session_notice)
        return Outcome(notice + result.text())

    async def _start(self) -> ShellSession:
        try:
            return await ShellSession.start(self.ctx.workspace, self.ctx.sandbox)
        except OSError as exc:
            raise ToolError(f"cannot start the shell: {exc.strerror or exc}") from None

    def _new_session_notice(self) -> str:
        """What the model must know when a new shell replaces one it used."""
        return self.ctx.sessions.restart_notice(
            self.ctx.gateway.store, TOOLSET, self.role_id, new="shell session", what="shell",
            earlier="commands",
            reset="the working folder is the workspace again; variables, functions and background jobs are gone")


@dataclass
class _Capture:
    """One stream of one command: its first HEAD_BYTES and last TAIL_BYTES, the rest counted."""

    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    dropped: int = 0

    def add(self, data: bytes) -> None:
        room = HEAD_BYTES - len(self.head)
        self.head += data[:room]
        self.tail += data[room:] if room > 0 else data
        extra = len(self.tail) - TAIL_BYTES
        if extra > 0:
            del self.tail[:extra]
            self.dropped += extra

    def text(self, name: str) -> str:
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        if not self.dropped:
            return head + tail
        return (f"{head}\n[sopctl: {self.dropped} bytes of {name} cut here; to see them all, send the output "
                f"to a file and read it in parts]\n{tail}")


class _Reader:
    """Reads one of the shell's pipes up to the next marker line, keeping what follows it
    (a background job's output) for the next command."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.stream = stream
        self.rest = b""

    async def until(self, marker: bytes, capture: _Capture) -> bytes | None:
        """Feed `capture` up to the marker; what follows the marker on its line, or None when
        the pipe closed first."""
        buf, self.rest = self.rest, b""
        while True:
            at = buf.find(marker)
            end = buf.find(b"\n", at + len(marker)) if at >= 0 else -1
            if end >= 0:
                capture.add(buf[:at])
                self.rest = buf[end + 1:]
                return buf[at + len(marker):end]
            if at < 0 and len(buf) > len(marker):   # what cannot be part of a marker is kept now
                capture.add(buf[:len(buf) - len(marker)])
                buf = buf[len(buf) - len(marker):]
            chunk = await self.stream.read(65536)
            if not chunk:
                capture.add(buf)
                return None
            buf += chunk


@dataclass
class ShellResult:
    """One command's exit code, its output, and what the model must know besides."""

    exit_code: int
    stdout: _Capture
    stderr: _Capture
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        notes = "".join(f"\n[sopctl: {note}]" for note in self.notes)
        return (f"[exit code {self.exit_code}]\n[stdout]\n{self.stdout.text('stdout')}\n"
                f"[stderr]\n{self.stderr.text('stderr')}{notes}")


class ShellSession:
    """One long-lived shell (see the module docstring). `run` one command at a time."""

    def __init__(self, proc: asyncio.subprocess.Process, exited: asyncio.Future[None], mark: str,
                 sandboxed: bool, reaper: contextlib.ExitStack) -> None:
        self.proc, self.exited, self.mark, self.sandboxed = proc, exited, mark, sandboxed
        self._reaper = reaper
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self._stdin = proc.stdin
        self._out, self._err = _Reader(proc.stdout), _Reader(proc.stderr)
        self._token = "__sopctl_done_" + secrets.token_hex(8) + "__"
        self._closed = False

    @classmethod
    async def start(cls, workspace: Workspace, sandbox: Sandbox | None) -> ShellSession:
        mark = secrets.token_hex(8)
        env = {**child_env(), MARK_ENV: mark}
        if sandbox is not None:
            env["TMPDIR"] = "/tmp"   # the sandbox's own
        bash = program_path("bash", env, workspace.root)
        if bash is None:
            raise ToolError("the terminal needs bash, which is not on the PATH")
        argv = [bash, "--noprofile", "--norc"]
        if sandbox is not None:
            argv = sandbox.wrap(argv, workspace.root)
        reaper = contextlib.ExitStack()
        reaper.enter_context(subreaper())   # orphans of the shell's commands stay ours to end
        try:
            proc, exited = await start_process(argv, cwd=workspace.root, env=env,
                                               stdin=asyncio.subprocess.PIPE)
        except BaseException:
            reaper.close()
            raise
        session = cls(proc, exited, mark, sandbox is not None, reaper)
        session._send("trap ':' INT\n")   # Ctrl-C stops the command, not the shell
        return session

    @property
    def alive(self) -> bool:
        return not self._closed and not self.exited.done()

    def _send(self, text: str) -> None:
        self._stdin.write(text.encode("utf-8"))

    async def run(self, command: str, timeout_s: float) -> ShellResult:
        """Run one command; on cancellation the session ends (its command would still run)."""
        out, err = _Capture(), _Capture()
        marker = ("\n" + self._token).encode()
        self._send(f"eval -- {shlex.quote(command)} </dev/null\n"
                   f"printf '\\n%s %s\\n' {self._token} \"$?\"; printf '\\n%s\\n' {self._token} >&2\n")
        both: _Markers = asyncio.ensure_future(asyncio.gather(self._out.until(marker, out), self._err.until(marker, err)))
        try:
            return await self._outcome(both, out, err, timeout_s)
        except BaseException:
            await self.close()
            raise
        finally:
            if not both.done():
                both.cancel()
                await asyncio.gather(both, return_exceptions=True)

    async def _outcome(self, both: _Markers, out: _Capture, err: _Capture,
                       timeout_s: float) -> ShellResult:
        if await self._ended(both, timeout_s):
            return self._finished(both, out, err, [])
        if self.exited.done():
            return await self._shell_exited(both, out, err)
        self._interrupt()
        if await self._ended(both, INTERRUPT_GRACE_S) and not self.exited.done():
            note = (f"timed out after {timeout_s:g} s: the command was interrupted (as by Ctrl-C); "
                    f"the shell session is kept (working folder and variables as they were)")
            return ShellResult(124, out, err, [note])
        await self.close()
        note = (f"timed out after {timeout_s:g} s and did not stop when interrupted: the shell session was "
                f"ended; the next command starts a new one in the workspace")
        return ShellResult(124, out, err, [note])

    async def _ended(self, both: _Markers, timeout_s: float) -> bool:
        """Wait until the markers came, the shell exited, or the time is up; True for the markers."""
        waiting: list[asyncio.Future[Any]] = [both, self.exited]
        await asyncio.wait(waiting, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if both.done() and None in both.result() and not self.exited.done():
            # Both streams closed without a marker: the shell is exiting, and its exit may be
            # seen a moment after its pipes close; wait for it, or it reads as a stuck command.
            await asyncio.wait([self.exited], timeout=INTERRUPT_GRACE_S)
        return both.done() and None not in both.result()

    def _finished(self, both: _Markers, out: _Capture, err: _Capture,
                  notes: list[str]) -> ShellResult:
        status = (both.result()[0] or b"").strip()
        return ShellResult(int(status) if status.isdigit() else 1, out, err, notes)

    async def _shell_exited(self, both: _Markers, out: _Capture,
                            err: _Capture) -> ShellResult:
        """The command ended the shell itself (`exit`, `set -e`): its last output, then the end."""
        await asyncio.wait([both], timeout=EXIT_DRAIN_S)
        code = self.proc.returncode if self.proc.returncode is not None else 1
        await self.close()
        note = (f"the shell exited (exit code {code}): the session ended; the next command starts a new "
                f"one in the workspace")
        return ShellResult(code, out, err, [note])

    def _interrupt(self) -> None:
        interrupt_group(self.proc.pid, sandboxed=self.sandboxed)

    async def close(self) -> None:
        """Kill the shell with its whole group and whatever carries its mark; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            kill_group(self.proc.pid)
            reap(self.mark, self.proc.pid)
            with contextlib.suppress(Exception):
                self._stdin.close()
            await asyncio.wait([self.exited], timeout=5.0)   # SIGKILLed: at once
            transport = getattr(self.proc, "_transport", None)
            if transport is not None:
                transport.close()
        finally:
            self._reaper.close()
