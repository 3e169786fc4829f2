"""MCP servers of a run, through the official `mcp` Python SDK (the `mcp` extra).

A file declares servers under `mcp:`; an action lists `mcp.<server>` (every tool it offers)
or `mcp.<server>.<tool>` in its `tools`. At run start (before the first round) every server
some action uses is started (stdio: `command`, run in the SOP file's folder with an
allowlisted environment plus the names in `env`; HTTP: `url`, with `headers` whose values
come from the environment variables the file names) and asked for its tools. Their input
schemas must be valid JSON Schemas, and every tool the file names must be offered: else the
run fails before any model call, naming the server. The model sees each tool as
`<server>.<tool>`.

A tool's error result (`is_error`) and a call that times out (`call_timeout_s`) go back to the
model as that command's output. A server that dies mid-run ends the run `failed`, naming
the server (`McpServerFailed`); the journal keeps every finished tool call, so a resume
starts the server again and goes on. The SDK is imported only here and only when a run
uses a server: `sopctl validate` never imports it.

No process a stdio server starts outlives the run: while servers run, sopctl is a child
subreaper and each server carries a mark in its environment (engine/run/reaper.py, as exec
commands do), so what a server started and left (`setsid`, a double fork) is killed and
reaped when the servers close.

A stdio server that writes lines that are not JSON-RPC to its stdout (a print left in, a
banner) has them ignored; the SDK logs a traceback for each, which `_OneNoiseLine` turns into
one line for the run (400 garbage lines were 400 tracebacks on stderr).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import sys
from pathlib import Path
from typing import Any
from collections.abc import Iterator

from engine.compile.compiler import CompiledSop
from engine.errors import RunError, install_hint
from engine.load.spec import McpServerSpec
from engine.models.types import AnswerStore, StoredAnswer
from engine.run.exec import child_env
from engine.run.reaper import MARK_ENV, reap, subreaper
from engine.run.tools import Outcome, Tool
from engine.run.workspace import sha256_text

__all__ = ["McpServerFailed", "McpServers", "MAX_SERVER_TOOLS", "MAX_TOOL_DESCRIPTION_CHARS",
           "MAX_TOOL_SCHEMA_CHARS"]


MAX_SERVER_TOOLS = 100
"""The most tools a server may offer an action: each is described in every step's prompt, so
a server (an HTTP one is another party's) offering thousands would make each prompt huge.
More: the run fails before any model call, with a hint to name the ones used (`tools:`)."""


MAX_TOOL_DESCRIPTION_CHARS = 2000
"""A tool's description as the model is shown it: longer is cut, with a mark."""


MAX_TOOL_SCHEMA_CHARS = 20_000
"""A tool's input schema, as JSON: a larger one fails the run's start, naming the tool."""


_SDK_PARSE_FAILURE = "Failed to parse JSONRPC message from server"
"""What the SDK's stdio client logs, with a traceback, for each line it cannot parse."""


class _OneNoiseLine(logging.Filter):
    """Drops the SDK's traceback for each unparsable line a server writes; the first becomes
    one line without a traceback, saying they are ignored."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() != _SDK_PARSE_FAILURE:
            return True
        self.seen += 1
        if self.seen > 1:
            return False
        record.msg, record.args = ("sopctl: warning: an MCP server wrote a line that is not JSON-RPC to "
                                   "its stdout; it is ignored, and so are any more (say nothing but "
                                   "JSON-RPC on stdout: log to stderr)"), ()
        record.exc_info = record.exc_text = None
        return True


@contextlib.contextmanager
def _reaping(mark: str) -> Iterator[None]:
    """A child subreaper while the servers run; on the way out every process still carrying
    their mark (a `setsid` child a server left) is killed and reaped."""
    with subreaper():
        try:
            yield
        finally:
            reap(mark, leader=-1)      # no leader: the servers themselves the SDK has closed


class McpServerFailed(RunError):
    """An MCP server could not start, offered bad tools, or died mid-run."""


_TOOL = "tool"
"""A tool's result in the journal (engine.run.toolloop.TOOL, which imports this module)."""


def tools_key(server: str) -> str:
    """The journal key of a server's tool list as the run saw it (answers table, origin tool)."""
    return sha256_text(json.dumps(["mcp-tools", server], ensure_ascii=False))


class McpServers:
    """The run's connected servers and their tools; `start` and `close` in the same task.

    Each server's tool list (names, descriptions, input schemas, annotations) is journaled
    when it is first listed (`tools_key`), so a replay (`replay=True`), whose tool results
    all come from the journal, offers the same tools without starting any server; a server
    whose list the journal lacks (a run recorded before this) is started as in a run."""

    def __init__(self, compiled: CompiledSop, store: AnswerStore | None = None, *, replay: bool = False) -> None:
        self.compiled = compiled
        self.store = store
        self.replay = replay
        self._stack = contextlib.AsyncExitStack()
        self._sessions: dict[str, Any] = {}
        self._tools: dict[str, list[Any]] = {}
        self._mark = secrets.token_hex(8)
        """In every stdio server's environment: what they leave behind is found by it."""
        self._reaping = False

    async def start(self) -> None:
        sdk = logging.getLogger("mcp.client.stdio")
        if not any(isinstance(f, _OneNoiseLine) for f in sdk.filters):   # once per process
            sdk.addFilter(_OneNoiseLine())
        for name, wanted in self.compiled.plan.servers.items():   # decided when it compiled
            spec = self.compiled.spec.mcp[name]
            journaled = self.journaled(name) if self.replay else None
            if journaled is not None:   # a replay: the run's own list, no server started
                self._tools[name] = self._checked(name, spec, journaled, wanted)
                continue
            listed = await self._listed(name, spec)
            self._record(name, listed)
            self._tools[name] = self._checked(name, spec, listed, wanted)

    def journaled(self, server: str) -> list[dict[str, Any]] | None:
        """The tool list of `server` the journal holds (None: none, or not readable)."""
        key = tools_key(server)
        if self.store is None or not self.store.holds(key):   # a replay's lookup of a miss is a divergence
            return None
        stored = self.store.lookup(key)
        try:
            listing = json.loads(stored.text) if stored is not None else None
        except ValueError:
            return None
        return listing if isinstance(listing, list) and all(isinstance(t, dict) for t in listing) else None

    def _record(self, server: str, listing: list[dict[str, Any]]) -> None:
        if self.store is not None:   # the first list wins: what the run's first prompts showed
            self.store.record(tools_key(server), f"mcp.{server}", StoredAnswer(
                json.dumps(listing, ensure_ascii=False), 0, 0, 0.0, model=_TOOL))   # key order kept: the prompt shows it

    async def _listed(self, name: str, spec: McpServerSpec) -> list[dict[str, Any]]:
        """Start the server and list its tools (as plain JSON, what the journal keeps)."""
        try:   # start_timeout_s bounds starting, initialize and the tool list; call_timeout_s each call
            session = await self._connect(name, spec)
            listed = (await asyncio.wait_for(session.list_tools(), spec.start_timeout_s)).tools
        except McpServerFailed:
            raise
        except asyncio.TimeoutError:
            raise McpServerFailed(f"MCP server {name} did not start and answer within {spec.start_timeout_s:g} s "
                                  f"(start_timeout_s)", hint=_start_hint(spec)) from None
        except BaseException as exc:  # noqa: BLE001 - the SDK's own errors, a refused spawn
            if isinstance(exc, (KeyboardInterrupt, SystemExit, asyncio.CancelledError)):
                raise
            raise McpServerFailed(f"MCP server {name} could not start: {_why(exc)}",
                                  hint=_start_hint(spec)) from None
        self._sessions[name] = session
        return [_listing(tool) for tool in listed]

    async def _connect(self, name: str, spec: McpServerSpec) -> Any:
        from mcp import ClientSession  # the optional `mcp` extra: a missing one is a clear error at start

        if spec.command is not None:
            read, write = await self._stack.enter_async_context(self._stdio(spec))
        else:
            read, write = await self._stack.enter_async_context(self._http(name, spec))
        session = await self._stack.enter_async_context(ClientSession(read, write))
        await asyncio.wait_for(session.initialize(), spec.start_timeout_s)
        return session

    def _stdio(self, spec: McpServerSpec) -> Any:
        from mcp import StdioServerParameters, stdio_client  # the optional extra, as above

        argv = list(spec.command or [])
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable   # as exec actions: the interpreter running sopctl
        folder = Path(self.compiled.file).parent if Path(self.compiled.file).is_file() else Path.cwd()
        if not self._reaping:      # entered before the first server: left after the last closed
            self._stack.enter_context(_reaping(self._mark))
            self._reaping = True
        params = StdioServerParameters(command=argv[0], args=argv[1:],
                                       env={**child_env(spec.env), MARK_ENV: self._mark},
                                       cwd=str(folder.resolve()))
        errlog = self._stack.enter_context(open(os.devnull, "w", encoding="utf-8"))
        return stdio_client(params, errlog=errlog)

    def _http(self, name: str, spec: McpServerSpec) -> Any:
        # the optional extra, as above
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        headers = {}
        for header, var in spec.headers.items():
            if var not in os.environ:
                raise McpServerFailed(f"MCP server {name}: header {header} needs the environment "
                                      f"variable {var}, which is not set", hint=f"export {var}=...")
            headers[header] = os.environ[var]
        client = create_mcp_http_client(headers=headers)
        return streamable_http_client(spec.url or "", http_client=client)

    def _checked(self, name: str, spec: McpServerSpec, listed: list[dict[str, Any]],
                 wanted: frozenset[str] | None) -> list[Any]:
        # not at the top: every run imports this module, and its first request goes out before jsonschema
        from jsonschema import Draft202012Validator, SchemaError

        offered = {tool["name"]: tool for tool in listed}
        missing = sorted(t for t in (wanted or set()) | set(spec.tools or ()) if t not in offered)
        if missing:
            raise McpServerFailed(f"MCP server {name} does not offer {', '.join(missing)}; it offers "
                                  f"{', '.join(offered) or 'no tool'}")
        chosen = [tool for tool in listed if wanted is None or tool["name"] in wanted]
        if len(chosen) > MAX_SERVER_TOOLS:
            raise McpServerFailed(f"MCP server {name} offers {len(chosen):,} tools, more than the "
                                  f"{MAX_SERVER_TOOLS} an action may be shown",
                                  hint=f"list the ones the roles use in the server's `tools:` (/mcp/{name}/tools)")
        tools = []
        for tool in chosen:
            schema = dict(tool.get("inputSchema") or {"type": "object"})
            if len(json.dumps(schema, ensure_ascii=False, default=str)) > MAX_TOOL_SCHEMA_CHARS:
                raise McpServerFailed(f"MCP server {name}: tool {tool['name']}'s input schema is larger "
                                      f"than {MAX_TOOL_SCHEMA_CHARS:,} characters")
            try:
                Draft202012Validator.check_schema(schema)
            except SchemaError as exc:
                raise McpServerFailed(f"MCP server {name}: tool {tool['name']} has an invalid input "
                                      f"schema: {exc.message}") from None
            hints = tool.get("annotations")
            # MCP's default is a tool that may change things: only one that says it reads runs beside
            # its neighbours; the rest run one at a time, in the order given
            readonly = bool(hints is not None and hints.get("readOnlyHint"))
            destructive = not readonly and (hints is None or hints.get("destructiveHint") is not False)
            about = _cut(tool.get("description") or "") + (" [may delete or overwrite]" if destructive and hints else "")
            tools.append(Tool(f"{name}.{tool['name']}", about, schema, readonly=readonly, server=name))
        return tools

    def tools(self, server: str) -> list[Any]:
        return self._tools.get(server, [])

    async def call(self, tool: Any, args: dict[str, Any]) -> Outcome:
        """One tool call; its error result is the model's, a dead server ends the run."""
        server = tool.server
        spec = self.compiled.spec.mcp[server]
        name = tool.name[len(server) + 1:]
        try:
            result = await asyncio.wait_for(self._sessions[server].call_tool(name, args), spec.call_timeout_s)
        except asyncio.TimeoutError:
            return Outcome(f"{tool.name} timed out after {spec.call_timeout_s:g} s", error=True)
        except Exception as exc:  # noqa: BLE001 - the transport broke: the server is gone
            raise McpServerFailed(f"MCP server {server} failed during {tool.name}: {_why(exc)}",
                                  hint="fix or restart the server, then `sopctl resume` the run") from None
        return Outcome(_text(result), error=bool(getattr(result, "is_error", False)))

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._stack.aclose()


def _cut(description: str) -> str:
    if len(description) <= MAX_TOOL_DESCRIPTION_CHARS:
        return description
    return description[:MAX_TOOL_DESCRIPTION_CHARS] + f" [description cut at {MAX_TOOL_DESCRIPTION_CHARS:,} characters]"


def _listing(tool: Any) -> dict[str, Any]:
    """What the run needs to know of an SDK tool, as JSON (MCP's own field names)."""
    hints = tool.annotations
    entry: dict[str, Any] = {"name": tool.name, "description": tool.description or "",
                             "inputSchema": tool.input_schema}
    if hints is not None:
        entry["annotations"] = {"readOnlyHint": hints.read_only_hint, "destructiveHint": hints.destructive_hint}
    return entry


def _text(result: Any) -> str:
    parts = []
    for block in getattr(result, "content", None) or []:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(block, 'type', 'content')}]")
    if not parts and getattr(result, "structured_content", None) is not None:

        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts) or "(no output)"


def _why(exc: BaseException) -> str:
    """The first real cause, through the task groups' exception groups."""
    # by its `exceptions`, not by class: the class is a builtin from Python 3.11 only (on 3.10
    # anyio raises the exceptiongroup backport's)
    causes = getattr(exc, "exceptions", None)
    while isinstance(causes, tuple) and causes and isinstance(causes[0], BaseException):
        exc = causes[0]
        causes = getattr(exc, "exceptions", None)
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _start_hint(spec: McpServerSpec) -> str:
    if spec.command is not None:
        return f"check that the command starts an MCP stdio server (the `mcp` extra: {install_hint('mcp')})"
    return "check the URL, and that the server speaks streamable HTTP"
