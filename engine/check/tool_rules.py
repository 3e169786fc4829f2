"""Checks of tool-using actions (`tools`, `max_steps`) and the file's MCP servers (`mcp`).

Part of the references phase (`check.phases`): like its rules, these read only the spec.
Which command-line flags the tools need (`--allow-exec`, `--allow-host`) is not a problem
of the file: `sopctl validate` says it after the diagnostics (the compiled RunPlan's `flags`).
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

from engine.check.rules import Context, error, rule, warning
from engine.errors import Diagnostic
from engine.load.catalog import BUILTIN, END, expand_tools, experience_refusal, tool_problem
from engine.load.secrets import is_secret_name
from engine.load.spec import LlmAction

__all__ = ["RULES"]


@rule("SOP221")
def known_tools(ctx: Context) -> Iterator[Diagnostic]:
    """Every `tools` item names a toolset, one of its commands, or a declared MCP server (and
    one of its tools, when the server declares them)."""
    for aid, action in ctx.spec.actions.items():
        for index, item in enumerate(action.tools if isinstance(action, LlmAction) else ()):
            problem = tool_problem(ctx.spec, item)
            if problem is not None:
                yield error("SOP221", f"/actions/{aid}/tools/{index}", *problem)


@rule("SOP222", "SOP224")
def tool_actions(ctx: Context) -> Iterator[Diagnostic]:
    """A tool loop is a model's (only kind llm has `tools`): not a person's role, not a review
    gate; `team` needs someone to address; `max_steps` only bounds a tool loop."""
    spec = ctx.spec
    for aid, action in spec.actions.items():
        if not isinstance(action, LlmAction):
            continue
        here = f"/actions/{aid}"
        for index, rel in enumerate(action.experience):
            if experience_refusal(rel):
                yield error("SOP224", f"{here}/experience/{index}", experience_refusal(rel),
                            "name a file beside the SOP, e.g. experience/write_code.md")
        if not action.tools:
            for key in ("max_steps", "experience", "quick_think", "tool_top_k", "working_memory"):
                if key in action.model_fields_set:
                    yield warning("SOP222", f"{here}/{key}", f"`{key}` is ignored: the action has no `tools`",
                                  f"list the tools the model may call, or drop `{key}`")
            continue
        if action.quick_think and action.output != "text":
            yield error("SOP222", f"{here}/quick_think", "`quick_think` needs `output: text`",
                        "a quick answer is text; drop quick_think or make the output text")
        elif action.review is not None:
            yield error("SOP222", f"{here}/review", "`review: human` on a tool-using action",
                        "review the work in a later action, or use the `human` tool inside the loop")
        humans = [rid for rid, role in spec.roles.items() if role.human and aid in role.runnable_actions()]
        if humans:
            yield error("SOP222", f"{here}/tools", f"role {humans[0]} is a person (`human: true`) and runs "
                        "this tool-using action", "a person answers without tools: drop `tools` or `human`")
        commands, _ = expand_tools(spec, action.tools)
        if any(c.name == "team.publish" for c in commands) and len(spec.roles) < 2:
            yield error("SOP222", f"{here}/tools", "the `team` tool needs another role to address",
                        "declare the team's members as roles")


@rule("SOP223")
def mcp_servers(ctx: Context) -> Iterator[Diagnostic]:
    """A server's name is the namespace of its tools: it must not hide a built-in toolset;
    a header's value is named by an environment variable (the header is usually a secret:
    that is what it is for); a stdio server's `env` naming a secret gets a warning, and so
    does a header of an HTTP server or of the search endpoint naming one (with its host)."""
    for name, server in ctx.spec.mcp.items():
        here = f"/mcp/{name}"
        if name in BUILTIN or name == END:
            yield error("SOP223", here, f"MCP server name '{name}' is a built-in toolset's",
                        "name the server after what it offers, e.g. notes")
        if server.url is not None and server.env:
            yield warning("SOP223", f"{here}/env", "`env` is ignored: an HTTP server runs elsewhere",
                          "pass a token with `headers` (header -> environment variable name)")
        if server.command is not None and server.headers:
            yield warning("SOP223", f"{here}/headers", "`headers` is ignored: a stdio server has no HTTP",
                          "give the server what it needs through `env`")
        for index, var in enumerate(server.env):
            if is_secret_name(var):
                yield warning("SOP223", f"{here}/env/{index}", f"`env` gives the MCP server the user's secret {var}",
                              "a server started from a shared file can copy it anywhere; keep it only if "
                              "the server needs that key")
        if server.url is not None:
            yield from _secret_headers(f"{here}/headers", server.headers, server.url, "SOP223")
    if ctx.spec.search is not None:
        yield from _secret_headers("/search/headers", ctx.spec.search.headers, ctx.spec.search.url, "SOP223")


def _secret_headers(where: str, headers: dict[str, str], url: str, code: str) -> Iterator[Diagnostic]:
    """A header whose value is a secret-named variable sends the user's key to the file's host:
    a warning naming both, as `env` gets one, so the user sees where each key goes."""
    host = urlsplit(url).hostname or url
    for header, var in headers.items():
        if is_secret_name(var):
            yield warning(code, f"{where}/{header}", f"header {header} sends the user's secret {var} to {host}",
                          f"it is sent only once you allow {host} with --allow-host: check that host "
                          "is the one the key is for")


RULES = (known_tools, tool_actions, mcp_servers)
"""This module's rules, run with the references phase."""
