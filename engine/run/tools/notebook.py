"""The `notebook` toolset: one Jupyter (IPython) kernel per role whose state lasts from cell to
cell (MetaGPT's Data Analyst's ExecuteNbCode); only with --allow-exec, and under --isolate
inside its sandbox. Needs the `notebook` extra (jupyter_client, ipykernel).

The kernel is started on the role's first cell, as a child of sopctl in a session of its own,
with the allowlisted environment of `kind: exec`, the workspace as its working folder, and
its sockets as Unix files in a private folder of sopctl's (so it needs no network, and works
inside bubblewrap's own network namespace). A cell's output is its printed text, the value
of its last expression, an error's name and message with a short traceback, and images
(`image/png`), each written into the workspace as `notebook/<cell>-<n>.png` with the path in
the output. A timeout interrupts the kernel (SIGINT, as Jupyter's "interrupt"): its state is
kept; a kernel that does not stop, or dies, is ended, and the next cell starts a new one and
says so. The registry on the RunContext (engine.run.sessions) ends every kernel with the run.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import queue
import re
import secrets
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import install_hint
from engine.load.catalog import missing_modules
from engine.run.actions import RunContext
from engine.run.exec import child_env, interrupt_group, kill_group
from engine.run.isolation import Sandbox
from engine.run.reaper import MARK_ENV, reap, subreaper
from engine.run.tools.base import Outcome, ToolError
from engine.run.workspace import Workspace, WorkspaceError

__all__ = ["Notebook", "KernelSession", "DEFAULT_CELL_TIMEOUT_S", "MAX_CELL_TEXT_CHARS"]


DEFAULT_CELL_TIMEOUT_S = 60.0
MAX_CELL_TIMEOUT_S = 600.0
START_TIMEOUT_S = 60.0
INTERRUPT_GRACE_S = 5.0
MAX_CELL_TEXT_CHARS = 6000
"""A cell's text as the model sees it: the first and last parts are kept, the cut is told."""
TRACEBACK_LINES = 12
"""The last lines of an error's traceback shown (the frame that failed is at the end)."""
MAX_IMAGE_BYTES = 10 * 1024 * 1024

TOOLSET = "notebook"

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class Notebook:
    """`notebook.*` for one role: its cells go to the role's kernel."""

    def __init__(self, ctx: RunContext, role_id: str) -> None:
        self.ctx = ctx
        self.role_id = role_id

    async def do_run(self, code: str, call_key: str, timeout_s: float = DEFAULT_CELL_TIMEOUT_S) -> Outcome:
        if not self.ctx.allow_exec:   # the run refuses to start before this; a second lock
            raise ToolError("the notebook needs --allow-exec")
        cell, notice = await self.ctx.sessions.run(
            TOOLSET, self.role_id, self._start,
            lambda kernel: kernel.run(code, min(float(timeout_s), MAX_CELL_TIMEOUT_S)), self._new_kernel_notice)
        paths = self._save_images(cell.images, call_key[:12])
        return Outcome(notice + cell.text(paths), error=cell.status != "ok")

    async def _start(self) -> KernelSession:
        missing = missing_modules(TOOLSET)
        if missing:
            raise ToolError(f"the notebook needs the `notebook` extra (no module {missing[0]} here): "
                            f"{install_hint('notebook')}")
        return await KernelSession.start(self.ctx.workspace, self.ctx.sandbox)

    def _new_kernel_notice(self) -> str:
        return self.ctx.sessions.restart_notice(
            self.ctx.gateway.store, TOOLSET, self.role_id, new="kernel", what="kernel", earlier="cells",
            reset="its variables, imports and functions are gone: run again what the next cells need")

    def _save_images(self, images: list[bytes], cell: str) -> list[str]:
        """Each image as a file in the workspace (confined there); the paths, or why not."""
        paths = []
        for index, data in enumerate(images, 1):
            rel = f"notebook/{cell}-{index}.png"
            try:
                self.ctx.workspace.write(rel, data)
                paths.append(f"{rel} ({len(data)} bytes)")
            except WorkspaceError as exc:
                paths.append(f"not saved: {exc}")
        return paths


@dataclass
class Cell:
    """What one cell gave back."""

    status: str = "ok"                 # ok, error, timeout
    texts: list[str] = field(default_factory=list)
    error: str = ""
    images: list[bytes] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def text(self, image_paths: list[str]) -> str:
        parts = [f"[cell: {self.status}]", "[output]", _bounded("".join(self.texts))]
        if self.error:
            parts += ["[error]", self.error]
        parts += [f"[image] {path}" for path in image_paths]
        parts += [f"[sopctl: {note}]" for note in self.notes]
        return "\n".join(parts)


def _bounded(text: str) -> str:
    if len(text) <= MAX_CELL_TEXT_CHARS:
        return text
    head, tail = MAX_CELL_TEXT_CHARS * 2 // 3, MAX_CELL_TEXT_CHARS // 3
    cut = len(text) - head - tail
    return (f"{text[:head]}\n[sopctl: {cut} characters cut here; print less, or write the output to a "
            f"file and read it in parts]\n{text[-tail:]}")


class KernelSession:
    """One IPython kernel and the client that talks to it; `run` one cell at a time."""

    def __init__(self, proc: asyncio.subprocess.Process, client: Any, folder: Path, mark: str,
                 sandboxed: bool, reaper: contextlib.ExitStack) -> None:
        self.proc, self.client, self.folder, self.mark = proc, client, folder, mark
        self.sandboxed = sandboxed
        self._reaper = reaper
        self._waiter = asyncio.ensure_future(proc.wait())
        self._closed = False

    @classmethod
    async def start(cls, workspace: Workspace, sandbox: Sandbox | None) -> KernelSession:
        from jupyter_client.asynchronous import AsyncKernelClient   # the extra: imported on first use
        from jupyter_client.connect import write_connection_file

        folder = Path(tempfile.mkdtemp(prefix="sopctl-kernel-"))
        connection = folder / "kernel.json"
        write_connection_file(str(connection), transport="ipc", ip=str(folder / "socket"),
                              key=secrets.token_hex(16).encode())
        mark = secrets.token_hex(8)
        argv, env = _kernel_command(connection, folder, mark, workspace, sandbox)
        reaper = contextlib.ExitStack()
        reaper.enter_context(subreaper())
        try:
            with open(folder / "kernel.log", "wb") as log:
                proc = await asyncio.create_subprocess_exec(
                    *argv, cwd=workspace.root, env=env, stdin=asyncio.subprocess.DEVNULL,
                    stdout=log, stderr=log, start_new_session=True)
        except BaseException:
            reaper.close()
            shutil.rmtree(folder, ignore_errors=True)
            raise
        client = AsyncKernelClient(connection_file=str(connection))
        client.load_connection_file()
        session = cls(proc, client, folder, mark, sandbox is not None, reaper)
        try:
            await session._ready()
        except BaseException:
            await session.close()
            raise
        return session

    async def _ready(self) -> None:
        """The kernel answers on iopub (where a cell's output comes: a subscription made too
        late would miss it, so kernel_info is asked again each second until one is heard there)
        and has replied on shell to every ask; or ToolError with the end of its log."""
        self.client.start_channels()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        asked: set[str] = set()
        while loop.time() < deadline and not self._waiter.done():
            asked.add(self.client.kernel_info())
            if await self._heard_on_iopub(asked):
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._replies(asked), max(deadline - loop.time(), 1.0))
                    return
                break
        log = (self.folder / "kernel.log").read_text(encoding="utf-8", errors="replace")[-1500:]
        why = "it exited" if self._waiter.done() else f"no answer after {START_TIMEOUT_S:g} s"
        raise ToolError(f"the Python kernel did not start ({why}): {log.strip() or 'no output'}")

    async def _heard_on_iopub(self, asked: set[str]) -> bool:
        """Whether a message for one of the asks comes on iopub within a second."""
        with contextlib.suppress(queue.Empty):
            while True:
                msg = await self.client.get_iopub_msg(timeout=1.0)
                if msg.get("parent_header", {}).get("msg_id") in asked:
                    return True
        return False

    async def _replies(self, waiting: set[str]) -> None:
        """The shell reply to each request in `waiting`. A request is sent only once the one
        before is wholly answered: ipykernel 7 can leave unread a request that arrives while it
        sends a reply (ipython/ipykernel#1554), and the cell would then wait for nothing."""
        while waiting:
            msg = await self.client.get_shell_msg()
            waiting.discard(msg.get("parent_header", {}).get("msg_id"))

    @property
    def alive(self) -> bool:
        return not self._closed and not self._waiter.done()

    async def run(self, code: str, timeout_s: float) -> Cell:
        """Run one cell (see the module docstring); on cancellation the kernel ends."""
        cell = Cell()
        msg_id = self.client.execute(code, store_history=True, allow_stdin=False, stop_on_error=True)
        reading = asyncio.ensure_future(self._read(msg_id, cell))
        try:
            if await self._done(reading, timeout_s):
                return cell
            if not self.alive:
                return await self._died(cell)
            self._interrupt()
            if await self._done(reading, INTERRUPT_GRACE_S):
                cell.status = "timeout"
                cell.notes.append(f"timed out after {timeout_s:g} s: the kernel was interrupted; it is kept, "
                                  f"with its variables")
                return cell
            await self.close()
            cell.status = "timeout"
            cell.notes.append(f"timed out after {timeout_s:g} s and did not stop when interrupted: the kernel "
                              f"was ended; the next cell starts a new one")
            return cell
        except BaseException:
            await self.close()
            raise
        finally:
            if not reading.done():
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)

    async def _done(self, reading: asyncio.Future[None], timeout_s: float) -> bool:
        waiting: list[asyncio.Future[Any]] = [reading, self._waiter]
        await asyncio.wait(waiting, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if reading.done():
            reading.result()   # a broken message is a failure of the tool, not a silent end
            return True
        return False

    async def _died(self, cell: Cell) -> Cell:
        code = self.proc.returncode
        await self.close()
        cell.status = "error"
        cell.notes.append(f"the kernel died (exit code {code}): the next cell starts a new one")
        return cell

    async def _read(self, msg_id: str, cell: Cell) -> None:
        """The cell's messages on iopub until the kernel is idle again, then its reply on shell."""
        while True:
            msg = await self.client.get_iopub_msg()
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status" and content.get("execution_state") == "idle":
                break
            _take(cell, kind, content)
        await self._replies({msg_id})

    def _interrupt(self) -> None:
        interrupt_group(self.proc.pid, sandboxed=self.sandboxed)

    async def close(self) -> None:
        """Kill the kernel with its group and whatever carries its mark; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            with contextlib.suppress(Exception):
                self.client.stop_channels()
            kill_group(self.proc.pid)
            reap(self.mark, self.proc.pid)
            await asyncio.wait([self._waiter], timeout=5.0)
        finally:
            self._reaper.close()
            shutil.rmtree(self.folder, ignore_errors=True)


def _kernel_command(connection: Path, folder: Path, mark: str, workspace: Workspace,
                    sandbox: Sandbox | None) -> tuple[list[str], dict[str, str]]:
    """The kernel's argv and environment: this Python's ipykernel, IPython's files in the
    private folder (the user's home may be read-only in the sandbox)."""
    env = {**child_env(), MARK_ENV: mark, "IPYTHONDIR": str(folder / "ipython"),
           "JUPYTER_RUNTIME_DIR": str(folder), "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", str(connection),
            "--HistoryManager.enabled=False", "--IPKernelApp.log_level=ERROR"]
    if sandbox is not None:
        env["TMPDIR"] = "/tmp"
        argv = sandbox.wrap(argv, workspace.root, binds=(folder,))
    return argv, env


def _take(cell: Cell, kind: str, content: dict[str, Any]) -> None:
    """One iopub message of the cell into what it gave back."""
    if kind == "stream":
        cell.texts.append(str(content.get("text", "")))
    elif kind in ("execute_result", "display_data"):
        data = content.get("data", {})
        png = data.get("image/png")
        if isinstance(png, str):
            image = base64.b64decode(png)
            if len(image) <= MAX_IMAGE_BYTES:
                cell.images.append(image)
            else:
                cell.notes.append(f"an image of {len(image)} bytes was not saved (at most {MAX_IMAGE_BYTES})")
        elif "text/plain" in data:
            text = str(data["text/plain"])
            cell.texts.append(text if text.endswith("\n") else text + "\n")
    elif kind == "error":
        cell.status = "error"
        lines = [_ANSI.sub("", line) for block in content.get("traceback", []) for line in block.split("\n")]
        shown = [line for line in lines if line.strip() and set(line.strip()) != {"-"}][-TRACEBACK_LINES:]
        cell.error = "\n".join([f"{content.get('ename', 'Error')}: {content.get('evalue', '')}",
                                "Traceback (last lines):", *shown])
