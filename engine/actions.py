"""Running one action: the prompt, the declared context, the model call, fan-out, exec, files.

An action is either one gateway call (kind `llm`) or one command (kind `exec`), possibly fanned
out over a list (`for_each`). Every failure here becomes an `ActionFailed` naming the action,
so a bad template, a bad answer or a refused path ends the run cleanly with status `failed`.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence


from .compiler import CompiledSop
from .errors import ActionFailed, BudgetExceeded, LLMError
from .events import LLMCalled, RunEvent
from .llm import CallResult, CallSpec, Gateway, is_secret_name
from .memory import Memory
from .message import Message, render_content
from .outputs import output_kind
from .prompts import TemplateFailure, compile_expression, render
from .spec import ActionSpec, CodeOutput
from .workspace import Workspace, WorkspaceError, WrittenFile

__all__ = [
    "MAX_STREAM_BYTES",
    "MAX_FOR_EACH_ITEMS",
    "RunContext",
    "ActionResult",
    "resolve_llm",
    "role_prefix",
    "context_section",
    "template_variables",
    "execute_action",
    "action_applies",
    "gather_or_cancel",
    "call_gateway",
    "default_model",
    "used_actions",
]

MAX_STREAM_BYTES = 64 * 1024
"""Bound on each of an exec action's stdout and stderr kept in `out`."""
MAX_FOR_EACH_ITEMS = 1000
DEFAULT_MODEL = "local"


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
    allow_exec: bool = False


@dataclass
class ActionResult:
    """What one action made: the message's content and `out`, and the files written."""

    content: str
    out: Any
    artifacts: list[WrittenFile] = field(default_factory=list)


def resolve_llm(compiled: CompiledSop, role_id: str, action_id: str,
                override: str | None) -> dict[str, Any]:
    """Model and sampling settings: `--model` > $SOPCTL_MODEL > action > role > file > local."""
    spec = compiled.spec
    layers = [spec.actions[action_id].llm, spec.roles[role_id].llm, spec.llm]
    picked: dict[str, Any] = {}
    for key in ("model", "temperature", "max_tokens", "timeout_s"):
        picked[key] = next((getattr(layer, key) for layer in layers
                            if layer and getattr(layer, key) is not None), None)
    picked["model"] = override or os.environ.get("SOPCTL_MODEL") or picked["model"] or DEFAULT_MODEL
    return picked


def default_model(compiled: CompiledSop) -> str:
    """The run's model where no role or action names one: $SOPCTL_MODEL > file > local."""
    return os.environ.get("SOPCTL_MODEL") or compiled.spec.llm.model or DEFAULT_MODEL


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
    if not isinstance(value, list):
        raise ActionFailed(action_id, f"for_each must give a list, got {type(value).__name__}",
                           hint="point it at a list, e.g. msgs.X[-1].out['Task list']")
    if len(value) > MAX_FOR_EACH_ITEMS:
        raise ActionFailed(action_id, f"for_each gave {len(value)} items; the limit is {MAX_FOR_EACH_ITEMS}")
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
        return compile_expression(expression)(**variables)
    except Exception as exc:  # noqa: BLE001 - any jinja/sandbox failure is the action's
        raise ActionFailed(action_id, f"{field} expression failed: {type(exc).__name__}: {exc}") from None


async def _run_once(ctx: RunContext, role_id: str, action_id: str, memory: Memory,
                    variables: dict[str, Any], round_: int, note: str) -> tuple[Any, str]:
    action = ctx.compiled.spec.actions[action_id]
    if action.kind == "exec":
        out = await _run_command(ctx, action_id, action, variables)
        return out, _exec_content(out)
    try:
        prompt = render(action.prompt, variables)
    except TemplateFailure as exc:
        raise ActionFailed(action_id, f"prompt template: {exc}") from None
    prompt = prompt.rstrip() + context_section(action, memory)
    if note:
        prompt += f"\n\n## Note\n{note}"
    kind = output_kind(action.output)
    lang = action.output.code if isinstance(action.output, CodeOutput) else None
    llm = resolve_llm(ctx.compiled, role_id, action_id, ctx.model_override)
    spec = CallSpec(action=action_id, role=role_id, system=role_prefix(ctx.compiled, role_id),
                    prompt=prompt, kind=kind, model=llm["model"],  # type: ignore[arg-type]
                    schema=ctx.compiled.output_schemas.get(action_id), code_lang=lang,
                    format=action.format, retries=action.retries, temperature=llm["temperature"],
                    max_tokens=llm["max_tokens"], timeout_s=llm["timeout_s"])
    result = await call_gateway(ctx, spec, round_)
    return result.value, render_content(kind, result.value, lang)


async def call_gateway(ctx: RunContext, spec: CallSpec, round_: int) -> CallResult:
    """One gateway call and its LLMCalled event. The gateway checks the budget before every
    model call (not before an answer reused from the journal) and keeps the totals."""
    try:
        result = await ctx.gateway.call(spec)
    except (ActionFailed, BudgetExceeded):
        raise
    except LLMError as exc:
        if spec.kind == "choice":
            raise
        raise ActionFailed(spec.action, exc.message, exc.hint) from None
    ctx.emit(LLMCalled(round=round_, role=spec.role, action=spec.action, calls=result.calls,
                       reused=result.reused, prompt_tokens=result.prompt_tokens,
                       completion_tokens=result.completion_tokens, cost_usd=result.cost_usd))
    return result


def _write_artifacts(action_id: str, action: ActionSpec, workspace: Workspace,
                     variables: dict[str, Any]) -> list[WrittenFile]:
    files = []
    for artifact in action.artifacts:
        try:
            path = render(artifact.path, variables, limit=1024).strip()
        except TemplateFailure as exc:
            raise ActionFailed(action_id, f"artifact path template '{artifact.path}': {exc}") from None
        try:
            content = render(artifact.content, variables)
        except TemplateFailure as exc:
            raise ActionFailed(action_id, f"artifact '{path}': {exc}") from None
        try:
            files.append(workspace.write(path, content))
        except WorkspaceError as exc:
            raise ActionFailed(action_id, exc.message) from None
    return files


async def _run_command(ctx: RunContext, action_id: str, action: ActionSpec,
                       variables: dict[str, Any]) -> dict[str, Any]:
    """`kind: exec`: no shell, cwd = workspace, timeout kills the process group, bounded output."""
    if not ctx.allow_exec:  # the run refuses to start before this; a second lock, never a bypass
        raise ActionFailed(action_id, "kind exec needs --allow-exec")
    try:
        argv = [render(part, variables, limit=64 * 1024) for part in action.command or []]
    except TemplateFailure as exc:
        raise ActionFailed(action_id, f"command template: {exc}") from None
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable  # "python" means the interpreter running sopctl
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=ctx.workspace.root, stdin=asyncio.subprocess.DEVNULL, env=_child_env(),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        raise ActionFailed(action_id, f"cannot start {argv[0]!r}: {exc.strerror or exc}") from None
    return await _collect(proc, action.timeout_s)


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
            stdout, stderr, _ = await asyncio.wait_for(asyncio.shield(readers), _DRAIN_AFTER_KILL_S)
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


_DRAIN_AFTER_KILL_S = 5.0


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


def _exec_content(out: dict[str, Any]) -> str:
    return (f"exit code: {out['exit_code']}\n## stdout\n{out['stdout']}\n"
            f"## stderr\n{out['stderr']}")
