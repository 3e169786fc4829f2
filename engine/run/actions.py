"""Running one action: the prompt, the declared context, the model call, fan-out, exec, files.

An action is either one gateway call (kind `llm`) or one command (kind `exec`), possibly fanned
out over a list (`for_each`). Every failure here becomes an `ActionFailed` naming the action,
so a bad template, a bad answer or a refused path ends the run cleanly with status `failed`.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from jinja2 import Undefined

from engine.check.compiler import CompiledSop
from engine.check.sandbox import TemplateFailure, compile_expression, render_template
from engine.errors import ActionFailed, BudgetExceeded, LLMError
from engine.load.outputs import output_kind
from engine.load.source import join_pointer
from engine.load.spec import ActionSpec, CodeOutput
from engine.models.gateway import Gateway
from engine.models.registry import resolve_llm
from engine.models.types import CallResult, CallSpec, Price
from engine.run.events import RunEvent
from engine.run.exec import exec_content, run_command
from engine.run.isolation import Sandbox
from engine.run.memory import Memory
from engine.run.message import Message, content_of
from engine.run.workspace import Workspace, WorkspaceError, WrittenFile

__all__ = ["MAX_FOR_EACH_ITEMS", "RunContext", "ActionResult", "role_prefix", "context_section",
           "template_variables", "execute_action", "action_applies", "gather_or_cancel",
           "call_gateway", "used_actions"]


MAX_FOR_EACH_ITEMS = 1000


@dataclass
class RunContext:
    """Everything an action needs from the run; trusted switches live here, never in the file."""

    compiled: CompiledSop
    inputs: dict[str, Any]
    run_id: str
    workspace: Workspace
    gateway: Gateway
    emit: Callable[[RunEvent], None]
    model_override: str | None = None
    price: Price | None = None
    """`--price`: for every model whose price litellm does not know (over the file's)."""
    allow_exec: bool = False
    sandbox: Sandbox | None = None
    """`--isolate`: exec commands run in it (set by the team's checks before the run starts)."""


@dataclass
class ActionResult:
    """What one action made: the message's content and `out`, and the files written."""

    content: str
    out: Any
    artifacts: list[WrittenFile] = field(default_factory=list)


def used_actions(compiled: CompiledSop) -> set[str]:
    """Every action some role can run: its `actions` and its planner's two."""
    used: set[str] = set()
    for role in compiled.spec.roles.values():
        used.update(role.actions)
        if role.planner:
            used.update((role.planner.action, role.planner.task_action))
    return used


def role_prefix(compiled: CompiledSop, role_id: str) -> str:
    """The system prompt of every call of a role (MetaGPT `_get_prefix`, our wording)."""
    spec = compiled.spec
    role = spec.roles[role_id]
    name = spec.role_name(role_id)
    parts = [f"You are {name}, the {role.profile or role_id} of a team."]
    if role.goal:
        parts.append(f"Your goal: {role.goal}.")
    if role.constraints:
        parts.append(f"Keep to these constraints: {role.constraints}.")
    others = [f"{spec.role_name(r)} ({spec.roles[r].profile or r})" for r in spec.roles if r != role_id]
    where = spec.team.env_desc or "a team"
    parts.append(f"You work in {where}" + (f" with {', '.join(others)}." if others else "."))
    return " ".join(parts)


def context_section(action: ActionSpec, memory: Memory) -> str:
    """The declared context only (`none`, `all` or action ids), as a `## Context` section."""
    if action.context == "none":
        return ""
    picked = memory.get() if action.context == "all" else memory.get_by_actions(action.context)
    if not picked:
        return ""
    blocks = [f"### {m.cause_by} (from {m.sent_from})\n{m.content}" for m in picked]
    return "\n\n## Context\n\n" + "\n\n".join(blocks)


def template_variables(ctx: RunContext, role_id: str, memory: Memory, news: Sequence[Message],
                       round_: int) -> dict[str, Any]:
    """The variables every template of a role's action sees (contract §3)."""
    spec = ctx.compiled.spec
    msgs: dict[str, list[dict[str, Any]]] = {aid: [] for aid in spec.actions}
    msgs.setdefault("UserRequirement", [])
    for message in memory.get():
        msgs.setdefault(message.cause_by, []).append(message.template_view())
    role = spec.roles[role_id]
    return {
        "inputs": dict(ctx.inputs),
        "role": {"id": role_id, "name": spec.role_name(role_id), "profile": role.profile},
        "msgs": msgs,
        "news": [m.template_view() for m in news],
        "run": {"id": ctx.run_id, "round": round_},
    }


async def gather_or_cancel(coros: Sequence[Awaitable[Any]]) -> list[Any]:
    """Like gather, but the first failure cancels the others (no orphan calls keep spending)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def execute_action(ctx: RunContext, role_id: str, action_id: str, memory: Memory,
                         variables: dict[str, Any], round_: int, note: str = "") -> ActionResult:
    """Run an action once (or once per `for_each` item) and write its artifacts."""
    action = ctx.compiled.spec.actions[action_id]
    if action.for_each is None:
        out, content = await _run_once(ctx, role_id, action_id, memory, variables, round_, note)
        written = _write_artifacts(action_id, action, ctx.workspace, {**variables, "out": out})
        return ActionResult(content, out, written)
    items = _for_each_items(action_id, action, variables)
    limit = asyncio.Semaphore(action.max_concurrency)

    async def one(index: int, item: Any) -> tuple[Any, str]:
        async with limit:
            item_vars = {**variables, action.as_: item, "index": index}
            return await _run_once(ctx, role_id, action_id, memory, item_vars, round_, note)

    results = await gather_or_cancel([one(i, it) for i, it in enumerate(items)])
    files: list[WrittenFile] = []
    for index, (item, (out, _)) in enumerate(zip(items, results, strict=True)):
        files += _write_artifacts(action_id, action, ctx.workspace,
                                  {**variables, action.as_: item, "index": index, "out": out})
    content = "\n\n".join(c for _, c in results)
    return ActionResult(content, [o for o, _ in results], files)


def _for_each_items(action_id: str, action: ActionSpec, variables: dict[str, Any]) -> list[Any]:
    """Evaluate the `for_each` expression in the sandbox; the value must be a list."""
    value = _evaluate(action_id, "for_each", action.for_each or "", variables)
    if isinstance(value, tuple):
        value = list(value)
    where = join_pointer("/actions", action_id, "for_each")
    if not isinstance(value, list):
        raise ActionFailed(action_id, f"for_each must give a list, got {type(value).__name__}",
                           hint="point it at a list, e.g. msgs.X[-1].out['Task list']",
                           code="SOP504", pointer=where)
    if len(value) > MAX_FOR_EACH_ITEMS:
        raise ActionFailed(action_id, f"for_each gave {len(value)} items; the limit is {MAX_FOR_EACH_ITEMS}",
                           code="SOP504", pointer=where)
    return value


def action_applies(action_id: str, action: ActionSpec, variables: dict[str, Any]) -> bool:
    """The action's `when` condition (true when it has none)."""
    if action.when is None:
        return True
    value = _evaluate(action_id, "when", action.when, variables)
    if isinstance(value, str):
        return value.strip().lower() not in {"", "false", "no", "none", "0"}
    return bool(value)


def _evaluate(action_id: str, field: str, source: str, variables: dict[str, Any]) -> Any:
    """A `{{ expression }}` (braces optional) evaluated in the sandbox."""
    match = re.fullmatch(r"\{\{(.*)\}\}", source.strip(), re.S)
    expression = match.group(1) if match else source
    try:
        value = compile_expression(expression)(**variables)
        if isinstance(value, Undefined):
            bool(value)   # a refused attribute comes back as a StrictUndefined: its use raises
        return value
    except Exception as exc:  # noqa: BLE001 - any jinja/sandbox failure is the action's
        raise ActionFailed(action_id, f"{field} expression failed: {type(exc).__name__}: {exc}",
                           code="SOP504", pointer=join_pointer("/actions", action_id, field)) from None


async def _run_once(ctx: RunContext, role_id: str, action_id: str, memory: Memory,
                    variables: dict[str, Any], round_: int, note: str) -> tuple[Any, str]:
    action = ctx.compiled.spec.actions[action_id]
    if action.kind == "exec":
        out = await run_command(action_id, action, variables, workspace=ctx.workspace,
                                allow_exec=ctx.allow_exec, sandbox=ctx.sandbox)
        return out, exec_content(out)
    try:
        prompt = render_template(action.prompt, variables)
    except TemplateFailure as exc:
        raise ActionFailed(action_id, f"prompt template: {exc}", code="SOP501",
                           pointer=join_pointer("/actions", action_id, "prompt"),
                           template_line=exc.line) from None
    prompt = prompt.rstrip() + context_section(action, memory)
    if note:
        prompt += f"\n\n## Note\n{note}"
    kind = output_kind(action.output)
    lang = action.output.code if isinstance(action.output, CodeOutput) else None
    llm = resolve_llm(ctx.compiled, role_id, action_id, ctx.model_override, ctx.price)
    spec = CallSpec(action=action_id, role=role_id, system=role_prefix(ctx.compiled, role_id),
                    prompt=prompt, kind=kind, model=llm["model"],  # type: ignore[arg-type]
                    schema=ctx.compiled.output_schemas.get(action_id), code_lang=lang,
                    format=action.format, retries=action.retries, temperature=llm["temperature"],
                    max_tokens=llm["max_tokens"], timeout_s=llm["timeout_s"], round=round_,
                    fallback_price=llm["price"])
    try:
        result = await call_gateway(ctx, spec)
    except ActionFailed as exc:  # the answers never fitted what the action declares
        raise exc.at("SOP505", join_pointer("/actions", action_id, "output"))
    return result.value, content_of(kind, result.value, lang)


async def call_gateway(ctx: RunContext, spec: CallSpec) -> CallResult:
    """One gateway call; a model error fails the action (a react choice's fails the run).

    The gateway checks the budget before every model call (not before an answer reused from
    the journal), keeps the totals, and reports each attempt, retry and re-ask as run events
    (stamped with `spec.round`) through the stream the Team gave it.
    """
    try:
        return await ctx.gateway.call(spec)
    except (ActionFailed, BudgetExceeded):
        raise
    except LLMError as exc:
        if spec.kind == "choice":
            raise
        raise ActionFailed(spec.action, exc.message, exc.hint) from None


def _write_artifacts(action_id: str, action: ActionSpec, workspace: Workspace,
                     variables: dict[str, Any]) -> list[WrittenFile]:
    files = []
    for index, artifact in enumerate(action.artifacts):
        at = join_pointer("/actions", action_id, "artifacts", index)
        try:
            path = render_template(artifact.path, variables, limit=1024).strip()
        except TemplateFailure as exc:
            raise ActionFailed(action_id, f"artifact path template '{artifact.path}': {exc}",
                               code="SOP501", pointer=f"{at}/path") from None
        try:
            content = render_template(artifact.content, variables)
        except TemplateFailure as exc:
            raise ActionFailed(action_id, f"artifact '{path}': {exc}", code="SOP501",
                               pointer=f"{at}/content", template_line=exc.line) from None
        try:
            files.append(workspace.write(path, content))
        except WorkspaceError as exc:
            raise ActionFailed(action_id, exc.message, code="SOP502", pointer=f"{at}/path") from None
    return files
