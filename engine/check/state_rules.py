"""Checks of the forms that shape state and messages without a model (docs/state.md): `set`
names declared state variables with values of their types, and a `kind: tool` action names
one command the file may call, with arguments that command takes.

Part of the references phase (`check.phases`); `state.X` inside templates is checked with
the other template references (template_rules).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jinja2 import nodes

from engine.check.rules import Context, error, rule
from engine.errors import Diagnostic, did_you_mean
from engine.load.catalog import BUILTIN, MCP_PREFIX, builtin_command, tool_problem
from engine.load.spec import Sop, ToolAction, state_value_fits
from engine.templates.code import expression_text
from engine.templates.sandbox import TemplateFailure, parse

__all__ = ["RULES", "LOOP_ONLY"]


LOOP_ONLY = ("plan.", "team.", "human.")
"""Commands that act on a tool loop's own state (its plan, its team messages, its person):
a file's direct call has no loop for them (it publishes with `content`, asks with `kind: ask`)."""


@rule("SOP411", "SOP412")
def state_changes(ctx: Context) -> Iterator[Diagnostic]:
    """Every `set` names a declared state variable; a default, and a value whose type can be
    seen (a constant, another state variable), is of the variable's type."""
    spec = ctx.spec
    for name, var in spec.state.items():
        if var.default is not None and not state_value_fits(var.type, var.default):
            yield error("SOP412", f"/state/{name}/default", f"the default of state.{name} is not of its type "
                        f"{var.type}: {var.default!r}", f"give a value of type {var.type}, or leave the default out "
                        f"(the type's empty value)")
    for aid, action in spec.actions.items():
        for name, source in action.set_.items():
            where = f"/actions/{aid}/set/{name}"
            if name not in spec.state:
                known = list(spec.state)
                yield error("SOP411", where, f"`set` names undeclared state variable '{name}'",
                            did_you_mean(name, known) or
                            f"declare it under `state:` (declared: {', '.join(known) or 'none'})")
                continue
            seen = _seen_type(spec, source)
            declared = spec.state[name].type
            if seen is not None and not _fits(declared, seen):
                yield error("SOP412", where, f"state.{name} is of type {declared}, but this gives {seen}",
                            f"give a value of type {declared}")


def _seen_type(spec: Sop, source: str) -> str | None:
    """The type of an expression that is a constant or reads one state variable; None when
    it can only be known at run time."""
    try:
        body = parse("{{ " + expression_text(source) + " }}").body
    except TemplateFailure:
        return None   # the template phase reports it
    node: Any = body[0].nodes[0] if body and isinstance(body[0], nodes.Output) and len(body[0].nodes) == 1 else None
    if isinstance(node, (nodes.List, nodes.Tuple)):
        return "list"
    if isinstance(node, nodes.Dict):
        return "dict"
    if isinstance(node, nodes.Const):
        return _const_type(node.value)
    if isinstance(node, nodes.Getattr) and isinstance(node.node, nodes.Name) and node.node.name == "state":
        var = spec.state.get(node.attr)
        return var.type if var is not None else None
    return None


def _const_type(value: Any) -> str | None:
    for name in ("bool", "int", "float", "str"):
        if state_value_fits(name, value) and not (name == "float" and isinstance(value, int)):
            return name
    return "null" if value is None else None


def _fits(declared: str, seen: str) -> bool:
    return declared == seen or (declared == "float" and seen == "int")


@rule("SOP225")
def direct_tools(ctx: Context) -> Iterator[Diagnostic]:
    """A `kind: tool` action names one command (not a toolset, not a loop's own command)
    that exists, and only arguments that command takes, with every required one."""
    for aid, action in ctx.spec.actions.items():
        if isinstance(action, ToolAction):
            yield from _tool_problems(ctx.spec, aid, action)


def _tool_problems(spec: Sop, aid: str, action: ToolAction) -> Iterator[Diagnostic]:
    here = f"/actions/{aid}"
    item = action.tool
    problem = tool_problem(spec, item)
    if problem is not None:
        message, hint = problem
        commands = [c.name for cmds in BUILTIN.values() for c in cmds if not c.name.startswith(LOOP_ONLY)]
        guess = did_you_mean(item, commands) if message.startswith("unknown tool") else ""
        yield error("SOP225", f"{here}/tool", message, guess or hint)
        return
    if item in BUILTIN:
        names = ", ".join(c.name for c in BUILTIN[item])
        yield error("SOP225", f"{here}/tool", f"`tool` names the toolset '{item}', not one command",
                    f"name one of its commands: {names}")
        return
    if item.startswith(LOOP_ONLY):
        yield error("SOP225", f"{here}/tool", f"{item} acts on a tool loop's own state; a file cannot call it",
                    "publish with `content`, ask a person with `kind: ask`, or call it from a tool loop")
        return
    if item.startswith(MCP_PREFIX):
        server, _, tool = item[len(MCP_PREFIX):].partition(".")
        if not tool:
            yield error("SOP225", f"{here}/tool", f"`tool` names the MCP server '{server}', not one of its tools",
                        f"write mcp.{server}.TOOL")
        return   # the server's argument schema is known only when it runs
    command = builtin_command(item)
    if command is None:
        return
    yield from _argument_problems(here, item, action, command.args)


def _argument_problems(here: str, item: str, action: ToolAction, schema: dict[str, Any]) -> Iterator[Diagnostic]:
    properties = schema.get("properties", {})
    for name in action.args:
        if name not in properties:
            yield error("SOP225", f"{here}/args/{name}", f"{item} takes no argument '{name}'",
                        did_you_mean(name, list(properties)) or f"its arguments: {', '.join(properties) or 'none'}")
    for name in schema.get("required", []):
        if name not in action.args:
            yield error("SOP225", f"{here}/args", f"{item} needs the argument '{name}'",
                        f"add `{name}:` under args")


RULES = (state_changes, direct_tools)
"""This module's rules, in the order they run (in the references phase)."""
