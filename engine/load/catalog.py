"""The tools a tool-using action may list (`tools:`): the built-in toolsets, their commands,
and what each needs from the command line. Plain data, so that the checker (`sopctl
validate`) and the compiler read one catalog; the compiler expands a file's tools and works
out their flags once (engine.compile.plan), and the run reads that; the run's
implementations live in `engine.run.tools` and `engine.run.mcp`.

A `tools` item is a toolset (`editor`: all its commands), one command (`editor.write`), or
an MCP server declared under the file's `mcp:` (`mcp.notes`: every tool the server offers).
Every command the model sees is namespaced: `<toolset>.<command>`, `<server>.<tool>`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from engine.load.files import beside_refusal, read_beside
from engine.load.spec import Sop, tools_of

__all__ = ["Command", "BUILTIN", "END", "MCP_PREFIX", "EXEC_TOOLSETS", "NETWORK_TOOLSETS", "BROWSER_FLAGS",
           "SEARCH", "search_host", "uses_search", "expand_tools",
           "tool_problem", "flags_needed", "team_targets", "builtin_command", "mcp_hosts", "team_reach",
           "experience_refusal", "read_experience", "MAX_EXPERIENCE_BYTES", "MAX_WRITE_BYTES", "EXTRAS",
           "missing_modules", "missing_extras"]


END = "end"
"""The command that finishes a tool loop: its args are the action's output."""


MCP_PREFIX = "mcp."


MAX_WRITE_BYTES = 1_000_000
"""The largest file an editor command may leave (told to the model, here and in the error)."""


@dataclass(frozen=True)
class Command:
    """One built-in command: what the model is told, the JSON Schema of its args, and how the
    loop treats it (`exclusive`: an edit of the file named by its `path`, one per file per step,
    after RoleZero's `exclusive_tool_commands`; `readonly`: may run concurrently with its
    neighbours; `moves`: it moves a view an earlier command left, a window or a page, so the
    same command again is progress, never a repeat for stuck detection)."""

    name: str
    description: str
    args: dict[str, Any]
    exclusive: bool = False
    readonly: bool = False
    moves: bool = False


def _args(required: list[str], **props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "required": required, "properties": props}


_STR = {"type": "string"}
_PATH = {"type": "string", "description": "a path relative to the workspace", "pattern": r"^[^\s]+$"}
_IDS = {"type": "array", "items": {"type": "string"}}
_LINE = {"type": "integer", "minimum": 1}


BUILTIN: dict[str, tuple[Command, ...]] = {
    "editor": (
        Command("editor.write", f"Write a whole file (created or replaced; at most {MAX_WRITE_BYTES:,} bytes).",
                _args(["path", "content"], path=_PATH, content=_STR), exclusive=True),
        Command("editor.read", "Read a file, each line numbered `N|`: all of it, or lines `start` to "
                "`end`; the header says which lines of how many and what shows the rest.",
                _args(["path"], path=_PATH, start=_LINE, end=_LINE), readonly=True),
        Command("editor.replace", "Replace the one occurrence of `old` in a file by `new` "
                "(`old` must occur exactly once).",
                _args(["path", "old", "new"], path=_PATH, old=_STR, new=_STR), exclusive=True),
        Command("editor.list", "List the files under a folder of the workspace.",
                _args([], path={**_PATH, "default": "."}), readonly=True),
        Command("editor.search", "Find the lines that contain `term` in a file, or in the files under "
                "a folder.",
                _args(["term"], term=_STR, path={**_PATH, "default": "."}), readonly=True),
        # open and the scrolls move the editor's window (its state for the rest of the loop), so
        # they run in the order given, not beside other reads.
        Command("editor.open", "Show a window of `window` lines (default 100) of a file around "
                "`line`; the editor keeps each file's window for the rest of this loop.",
                _args(["path"], path=_PATH, line=_LINE, window={**_LINE, "maximum": 500})),
        Command("editor.scroll_down", "Move a file's window down by its size (default: the file "
                "opened last).", _args([], path=_PATH), moves=True),
        Command("editor.scroll_up", "Move a file's window up by its size (default: the file opened "
                "last).", _args([], path=_PATH), moves=True),
        Command("editor.insert", "Insert `content` before line `line` of a file (the line count "
                "plus 1 appends).",
                _args(["path", "line", "content"], path=_PATH, line=_LINE, content=_STR), exclusive=True),
        Command("editor.replace_lines", "Replace lines `start` to `end` of a file (both included) by "
                "`content` (empty: delete them).",
                _args(["path", "start", "end", "content"], path=_PATH, start=_LINE, end=_LINE,
                      content=_STR), exclusive=True),
        Command("editor.append", "Add `content` at the end of a file (created if missing).",
                _args(["path", "content"], path=_PATH, content=_STR), exclusive=True),
        Command("editor.find", "Find files by name: a glob such as `*.py` or `test_*` (with a `/`, "
                "matched against the path under `path`).",
                _args(["pattern"], pattern={"type": "string", "minLength": 1},
                      path={**_PATH, "default": "."}), readonly=True),
    ),
    "terminal": (
        Command("terminal.run", "Run a command in your shell (bash), which starts in the workspace "
                "and keeps its working folder, variables and background jobs from command to command "
                "(stdout, stderr and exit code come back; it is interrupted after `timeout_s`).",
                _args(["command"], command=_STR,
                      timeout_s={"type": "number", "exclusiveMinimum": 0, "maximum": 600})),
    ),
    "notebook": (
        Command("notebook.run", "Run a cell of Python code in your Jupyter kernel (IPython): variables, "
                "imports and functions stay from cell to cell. Printed text, the last expression's value, "
                "an error with its traceback's last lines, and images (saved as files in the workspace, "
                "their paths given) come back; it is interrupted after `timeout_s`.",
                _args(["code"], code=_STR,
                      timeout_s={"type": "number", "exclusiveMinimum": 0, "maximum": 600})),
    ),
    "plan": (
        Command("plan.append_task", "Add a task to the plan.",
                _args(["task_id", "instruction"], task_id=_STR, instruction=_STR,
                      dependent_task_ids=_IDS, assignee=_STR, task_type=_STR)),
        Command("plan.reset_task", "Mark a task (and the tasks depending on it) unfinished.",
                _args(["task_id"], task_id=_STR)),
        Command("plan.replace_task", "Replace a task's instruction, dependencies and assignee.",
                _args(["task_id", "instruction"], task_id=_STR, instruction=_STR,
                      dependent_task_ids=_IDS, assignee=_STR)),
        Command("plan.finish_current_task", "Mark the current task finished.", _args([])),
    ),
    "team": (
        Command("team.publish", "Send a message to a member of the team (MGX's "
                "publish_team_message): give them everything they need.",
                _args(["content", "send_to"], content=_STR, send_to=_STR)),
    ),
    "human": (
        Command("human.ask", "Ask the person a question and wait for the answer.",
                _args(["question"], question=_STR)),
        Command("human.reply", "Tell the person something (no answer expected).",
                _args(["text"], text=_STR)),
    ),
    "browser": (
        Command("browser.goto", "Open a web page (http or https); its title and text come back.",
                _args(["url"], url={"type": "string", "pattern": "^https?://"})),
        Command("browser.click", "Click an element, by its visible text (a link, a button) or a CSS "
                "`selector`; the page after the click comes back.",
                _args([], text=_STR, selector=_STR), moves=True),
        Command("browser.type", "Type `text` into a field found by its label, placeholder or name "
                "(`field`) or a CSS `selector`; `submit: true` presses Enter after.",
                _args(["text"], text=_STR, field=_STR, selector=_STR, submit={"type": "boolean"})),
        Command("browser.scroll", "Scroll the page one screen down (or up); the text now in view "
                "comes back.", _args([], direction={"type": "string", "enum": ["down", "up"]}),
                moves=True),
        Command("browser.read", "Read the page's text, from character `offset` (long pages come "
                "back in parts, each saying where the next starts).",
                _args([], offset={"type": "integer", "minimum": 0})),
        Command("browser.back", "Go back to the previous page.", _args([]), moves=True),
    ),
    "search": (
        Command("search.query", "Search the web (the file's search endpoint): the results' titles, "
                "urls and snippets come back, best first.",
                _args(["query"], query={"type": "string", "minLength": 1},
                      limit={"type": "integer", "minimum": 1, "maximum": 20})),
    ),
}


EXEC_TOOLSETS = ("terminal", "notebook")
"""Built-in toolsets that run commands: only with --allow-exec."""


EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {"notebook": ("notebook", ("jupyter_client", "ipykernel"))}
"""Toolsets that need an optional extra: toolset -> (the extra, the modules it installs)."""


def missing_modules(toolset: str) -> list[str]:
    """The modules of the toolset's extra that are not installed here (found, never imported:
    `sopctl validate` imports no extra)."""
    import importlib.util   # only here: the rest of the catalog is plain data

    _, modules = EXTRAS.get(toolset, ("", ()))
    return [m for m in modules if importlib.util.find_spec(m) is None]


def missing_extras(spec: Sop) -> dict[str, list[str]]:
    """extra -> the actions whose tools need it, for each extra not installed here."""
    found: dict[str, list[str]] = {}
    for aid in _used_actions(spec):
        commands, _ = expand_tools(spec, tools_of(spec.actions[aid]))
        for toolset in dict.fromkeys(c.name.split(".")[0] for c in commands):
            if toolset in EXTRAS and missing_modules(toolset):
                found.setdefault(EXTRAS[toolset][0], []).append(f"{toolset} ({aid})")
    return found


NETWORK_TOOLSETS = ("browser",)
"""Built-in toolsets that reach hosts no file names: only with --allow-network or --allow-host."""


SEARCH = "search"
"""The toolset that queries the file's `search:` endpoint (needs --allow-host for its host)."""


BROWSER_FLAGS = "--allow-network or --allow-host"
"""The `flags_needed` key of the browser: every host, or the hosts named."""


_COMMANDS: dict[str, Command] = {c.name: c for cmds in BUILTIN.values() for c in cmds}


def builtin_command(name: str) -> Command | None:
    return _COMMANDS.get(name)


def tool_problem(spec: Sop, item: str) -> tuple[str, str] | None:
    """Why a `tools` item is unknown (message, hint), or None when it names a tool."""
    if item.split(".")[0] == SEARCH and (item in BUILTIN or item in _COMMANDS) and spec.search is None:
        return ("the search tool needs a search endpoint", "declare one at the top of the file: "
                "`search: {url: http://HOST/search}` (see docs/tools.md)")
    if item in BUILTIN or item in _COMMANDS:
        return None
    if item.startswith(MCP_PREFIX):
        server, _, tool = item[len(MCP_PREFIX):].partition(".")
        if server not in spec.mcp:
            known = ", ".join(spec.mcp) or "none declared"
            return f"unknown MCP server '{server}'", f"declare it under `mcp:` (servers: {known})"
        offered = spec.mcp[server].tools
        if tool and offered is not None and tool not in offered:
            return (f"MCP server '{server}' declares no tool '{tool}'",
                    f"its tools: {', '.join(offered) or 'none'}")
        return None
    known = ", ".join([*BUILTIN, *(MCP_PREFIX + s for s in spec.mcp)])
    return f"unknown tool '{item}'", f"tools are toolsets ({known}) or one command, e.g. editor.write"


def expand_tools(spec: Sop, items: list[str]) -> tuple[list[Command], dict[str, list[str] | None]]:
    """The built-in commands and the MCP servers an action's `tools` name (each once, in
    order): server -> the tools named (`mcp.notes.search`), or None for all (`mcp.notes`)."""
    commands: dict[str, Command] = {}
    servers: dict[str, list[str] | None] = {}
    for item in items:
        if item in BUILTIN:
            commands.update((c.name, c) for c in BUILTIN[item])
        elif item in _COMMANDS:
            commands[item] = _COMMANDS[item]
        elif item.startswith(MCP_PREFIX):
            server, _, tool = item[len(MCP_PREFIX):].partition(".")
            if not tool:
                servers[server] = None
            elif servers.get(server, []) is not None:
                servers[server] = [*(servers.get(server) or []), tool]
    return list(commands.values()), servers


def team_reach(spec: Sop, action_id: str) -> list[str]:
    """The roles an action's `team` tool can address (every role that does not run it)."""
    commands, _ = expand_tools(spec, tools_of(spec.actions[action_id]))
    if not any(c.name == "team.publish" for c in commands):
        return []
    return [rid for rid, role in spec.roles.items() if action_id not in role.runnable_actions()]


def team_targets(spec: Sop, role_id: str) -> list[str]:
    """Whom `team.publish` may address from this role: every other role, by name."""
    return [spec.role_name(rid) for rid in spec.roles if rid != role_id]


def flags_needed(spec: Sop, *, replay: bool = False) -> dict[str, list[str]]:
    """What a file's actions and tools need from the command line: `--allow-exec` (exec actions,
    terminal, notebook, stdio MCP servers), `--allow-host` (streamable HTTP servers and the search endpoint, by host) and `--allow-network or
    --allow-host` (the browser), each with what needs it.
    A replay runs no tool (their results come from the journal) and starts no MCP server (the
    journal holds their tool lists; one recorded before it did is checked when the replay
    starts, engine.run.team)."""
    exec_users: list[str] = []
    hosts: list[str] = []
    browsing: list[str] = []
    for aid in _used_actions(spec):
        if spec.actions[aid].kind == "exec":   # run again by a replay too
            exec_users.append(f"exec ({aid})")
        commands, servers = expand_tools(spec, tools_of(spec.actions[aid]))
        if not replay:
            toolsets = dict.fromkeys(c.name.split(".")[0] for c in commands)
            exec_users += [f"{name} ({aid})" for name in toolsets if name in EXEC_TOOLSETS]
        if not replay and any(c.name.split(".")[0] in NETWORK_TOOLSETS for c in commands):
            browsing.append(f"browser ({aid})")
        if not replay and spec.search is not None and any(c.name.split(".")[0] == SEARCH for c in commands):
            hosts.append(f"{search_host(spec)} (search)")
        for name in servers if not replay else ():
            server = spec.mcp[name]
            if server.command:
                exec_users.append(f"mcp server {name}")
            elif server.url:
                hosts.append(f"{urlsplit(server.url).hostname or server.url} (mcp server {name})")
    found = {"--allow-exec": list(dict.fromkeys(exec_users)), "--allow-host": list(dict.fromkeys(hosts)),
             BROWSER_FLAGS: browsing}
    return {flag: users for flag, users in found.items() if users}


def mcp_hosts(spec: Sop) -> dict[str, str]:
    """server name -> the host of each HTTP MCP server some action uses."""
    used = {name for aid in _used_actions(spec) for name in expand_tools(spec, tools_of(spec.actions[aid]))[1]}
    return {name: (urlsplit(server.url).hostname or "") for name, server in spec.mcp.items()
            if server.url and name in used}


def search_host(spec: Sop) -> str:
    """The host of the file's search endpoint ('' when it declares none)."""
    return (urlsplit(spec.search.url).hostname or spec.search.url) if spec.search is not None else ""


def uses_search(spec: Sop) -> bool:
    """Whether some action some role runs lists the search tool."""
    return any(c.name.split(".")[0] == SEARCH for aid in _used_actions(spec)
               for c in expand_tools(spec, tools_of(spec.actions[aid]))[0])


def _used_actions(spec: Sop) -> list[str]:
    used = {aid for role in spec.roles.values() for aid in role.runnable_actions()}
    return [aid for aid in spec.actions if aid in used]


MAX_EXPERIENCE_BYTES = 100_000


def experience_refusal(rel: str) -> str:
    """Why an `experience` path is refused before any file is read ('' when it is not)."""
    return beside_refusal(rel, f"experience file '{rel}'")


def read_experience(sop_file: str, rel: str) -> str:
    """The text of an experience file beside the SOP; ValueError (FileRefused) saying why it
    cannot be read."""
    return read_beside(Path(sop_file).parent, rel, f"experience file '{rel}'", MAX_EXPERIENCE_BYTES)
