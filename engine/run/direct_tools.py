"""A `kind: tool` action: the file calls one built-in command or MCP tool itself.

MetaGPT's roles call search, browse and OCR from code, with arguments the code chooses; a
tool loop would spend a model call on each and let the model choose them. The call goes
through the tool loop's own path (`engine.run.toolloop.journaled_call`): the same commands,
the same gates (the run refuses to start without --allow-exec, --allow-host or
--allow-network, from the plan's flags, which count this action's tool), the same journal
entry, reused on resume and taken from the journal on replay.
"""

from __future__ import annotations

import json
import time
from typing import Any

from engine.errors import ActionFailed
from engine.load.catalog import MCP_PREFIX
from engine.load.source import join_pointer
from engine.load.spec import ToolAction
from engine.models import answers
from engine.run.actions import RunContext, ToolEffects
from engine.run.events import ToolCalled
from engine.run.tools import Builtins, Outcome
from engine.run.toolloop import action_tools, call_key, journaled_call, shown_args
from engine.run.workspace import WrittenFile, sha256_text
from engine.templates.render import render_template
from engine.templates.sandbox import TemplateFailure

__all__ = ["run_direct_tool", "tool_name"]


def tool_name(item: str) -> str:
    """The name a run knows a command by: `mcp.notes.search` is the server's `notes.search`."""
    return item[len(MCP_PREFIX):] if item.startswith(MCP_PREFIX) else item


async def run_direct_tool(ctx: RunContext, role_id: str, action_id: str, variables: dict[str, Any],
                          round_: int, key: str, effects: ToolEffects) -> tuple[Any, str]:
    """The action's output (the result, parsed when it is JSON) and its message text."""
    action = ctx.compiled.spec.action_as(action_id, ToolAction)
    name = tool_name(action.tool)
    tool = action_tools(ctx, role_id, action_id).get(name)
    if tool is None:   # an MCP server that does not offer it (validate checks declared tools)
        raise ActionFailed(action_id, f"the tool {action.tool} is not offered by its server",
                           hint="name a tool the server lists (`sopctl validate` shows the server's tools "
                                "when it declares them)", code="SOP505",
                           pointer=join_pointer("/actions", action_id, "tool"))
    args = _arguments(action_id, action, variables, tool.args)
    started = time.monotonic()
    call = call_key(key, 0, 0, name, args)
    outcome, reused = await journaled_call(ctx, Builtins(ctx, role_id, action_id, round_), role_id, action_id,
                                           tool, args, call, "its call")
    _files(ctx, effects, outcome, reused)
    ctx.emit(ToolCalled(round=round_, role=role_id, action=action_id, step=0, tool=name,
                        args=shown_args(args), output=outcome.output, call=call, error=outcome.error,
                        reused=reused, seconds=round(time.monotonic() - started, 3)))
    if outcome.error:
        if action.on_error == "fail":
            raise ActionFailed(action_id, f"{action.tool} failed: {outcome.output}",
                               hint="fix its arguments, or set `on_error: continue` to go on with the error",
                               code="SOP505", pointer=join_pointer("/actions", action_id, "tool"))
        return {"error": outcome.output}, outcome.output
    return _parsed(outcome.output), outcome.output


def _arguments(action_id: str, action: ToolAction, variables: dict[str, Any],
               schema: dict[str, Any]) -> dict[str, Any]:
    """`args` rendered (strings are templates), made what the command's schema asks for, and
    checked against it before anything runs."""
    properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
    args: dict[str, Any] = {}
    for name, value in action.args.items():
        where = join_pointer("/actions", action_id, "args", name)
        if isinstance(value, str):
            try:
                value = render_template(value, variables)
            except TemplateFailure as exc:
                raise ActionFailed(action_id, f"args {name} template: {exc}", code="SOP501", pointer=where,
                                   template_line=exc.line) from None
            value = _typed(value, properties.get(name, {}))
        args[name] = value
    errors = answers.schema_errors(args, schema)
    if errors:
        raise ActionFailed(action_id, f"the args of {action.tool} do not match its schema: " + "; ".join(errors),
                           hint="see the command's arguments in docs/tools.md", code="SOP504",
                           pointer=join_pointer("/actions", action_id, "args"))
    return args


def _typed(text: str, schema: Any) -> Any:
    """A rendered argument as the schema's type: JSON for a number, boolean, list or object
    (left as text when it does not parse, for the schema check to name)."""
    wanted = schema.get("type") if isinstance(schema, dict) else None
    if wanted in (None, "string") or (isinstance(wanted, list) and "string" in wanted):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def _parsed(output: str) -> Any:
    """The result as `out`: a JSON object or list parsed, anything else the text."""
    if output.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(output)
        except ValueError:
            pass
    return output


def _files(ctx: RunContext, effects: ToolEffects, outcome: Outcome, reused: bool) -> None:
    """Files the command wrote: written back when reused from the journal (as a tool loop's)."""
    for path, content in outcome.files.items():
        effects.files.append(ctx.workspace.write(path, content) if reused
                             else WrittenFile(path, sha256_text(content), True))
