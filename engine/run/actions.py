"""Running one action: the prompt, the declared context, the model call, fan-out, exec, files.

An action is either one gateway call (kind `llm`) or one command (kind `exec`), possibly fanned
out over a list (`for_each`). Every failure here becomes an `ActionFailed` naming the action,
so a bad template, a bad answer or a refused path ends the run cleanly with status `failed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence

from jinja2 import Undefined

from engine.compile.compiler import CompiledSop
from engine.templates.code import expression_text, precompile_all, use_compiled
from engine.templates.render import compile_expression, render_template
from engine.templates.sandbox import MAX_RENDERED_CHARS, TemplateFailure
from engine.errors import ActionFailed, BudgetExceeded, LLMError
from engine.load.outputs import output_kind, with_absent_as_null
from engine.load.source import join_pointer
from engine.load.spec import (
    ActionBase,
    AnsweredAction,
    CodeOutput,
    ComputeAction,
    ExecAction,
    JoinSpec,
    LlmAction,
    PromptedAction,
    ReplyAction,
    ToolAction,
    USER_REQUIREMENT,
    output_of,
)
from engine.models.answers import prepare_validator
from engine.models.gateway import Gateway
from engine.models.openai_http import warm_up_wait_left
from engine.models.registry import resolve_llm
from engine.models.types import CallResult, CallSpec, Price, durable
from engine.run.events import RunEvent, RunLog
from engine.run.experience import ExperiencePool, pooled_call
from engine.run.exec import exec_content, run_command, stdout_answer
from engine.run.isolation import Sandbox
from engine.run.longterm import visible_messages
from engine.run.memory import Memory
from engine.run.message import Message, content_of
from engine.run.node import merge_parts, part_prompt, revise_output, split_schema
from engine.run.plans import plan_view
from engine.run.prompts import role_label, role_prefix, system_prompt
from engine.run.people import (
    NoPerson,
    Person,
    PersonAnswer,
    Question,
    ask_person,
    question_key,
    tell_person,
)
from engine.run.sessions import Sessions
from engine.run.state import SharedState, checked_value
from engine.run.workspace import Workspace, WorkspaceError, WrittenFile

if TYPE_CHECKING:   # rolestate imports the toolsets, which import this module
    from engine.run.rolestate import RoleState

__all__ = ["MAX_FOR_EACH_ITEMS", "RunContext", "ToolEffects", "ActionResult", "role_prefix", "role_label", "context_section",
           "template_variables", "execute_action", "action_applies", "gather_or_cancel",
           "call_gateway", "used_actions", "ask_human", "can_ask_human", "reply_to_human", "at_place",
           "NoOutput", "message_view"]


MAX_FOR_EACH_ITEMS = 1000


_PLACE: ContextVar[str] = ContextVar("sopctl_call_place", default="")
"""Where in the run the current model calls are made (`CallSpec.place`: the gateway journals
answers by place and occurrence). A context variable, set where the action's idempotency key
is known, because the calls are made far below (a tool loop's steps, a node's parts, a
review's drafts) and each for_each item runs in its own task, with its own copy."""


@contextlib.contextmanager
def at_place(place: str) -> Iterator[None]:
    """Make the model calls inside at `place` (deterministic: a resume makes them there too)."""
    token = _PLACE.set(place)
    try:
        yield
    finally:
        _PLACE.reset(token)


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
    person: Person = field(default_factory=NoPerson)
    """Who answers `human` roles, `kind: ask` and review gates (NoPerson: the run waits)."""
    pool: ExperiencePool | None = None
    """`--pool`: accepted answers across runs (engine.run.experience); None: no pool."""
    tool_loop: Callable[..., Awaitable[Any]] | None = None
    """Runs a tool-using action (engine/run/toolloop.py; the Team plugs it in)."""
    mcp: Any = None
    """The run's MCP servers, started before the first round (engine/run/mcp.py)."""
    allow_hosts: tuple[str, ...] = ()
    """`--allow-host`: the hosts HTTP MCP servers (and the browser, and search) may be reached at."""
    sessions: Sessions = field(default_factory=Sessions)
    """Each role's shell and notebook kernel, kept for the run (engine.run.sessions.py)."""
    allow_network: bool = False
    """`--allow-network`: the browser may reach every host."""
    browsers: Any = None
    """The run's browser, one page per role, started at the first browser command (tools/browser.py)."""
    role_states: dict[str, RoleState] = field(default_factory=dict)
    """Each role's plan and working memory across activations (engine/run/rolestate.py)."""
    shared: SharedState | None = None
    """The file's `state:` (engine/run/state.py; the Team makes it); None: no state declared."""
    direct_tool: Callable[..., Awaitable[tuple[Any, str]]] | None = None
    """Runs a `kind: tool` action's call (engine/run/direct_tools.py; the Team plugs it in)."""


@dataclass
class ToolEffects:
    """What a tool loop did besides its output: team messages (content, role id) and files."""

    messages: list[tuple[str, str]] = field(default_factory=list)
    files: list[WrittenFile] = field(default_factory=list)
    unfinished: str = ""
    """Why the loop ended without output (NoOutput); empty when it gave one."""


@dataclass(frozen=True)
class NoOutput:
    """What a tool loop gives when it ends without a final answer (out of steps, stuck with
    nobody to ask, a person's stop): the action's message says why, its `out` is empty (a
    tree's keys null, or ""), and it writes no artifacts, so the run goes on."""

    reason: str


@dataclass
class ActionResult:
    """What one action made: the message's content and `out`, and the files written."""

    content: str
    out: Any
    artifacts: list[WrittenFile] = field(default_factory=list)
    messages: list[tuple[str, str]] = field(default_factory=list)
    """Sent with the `team` tool: (content, role id), published before the action's message."""
    shared: dict[str, Any] = field(default_factory=dict)
    """The action's `set`: state variable -> its new value (checked), applied after it acted."""


def used_actions(compiled: CompiledSop) -> set[str]:
    """Every action some role can run: its `actions` and its planner's."""
    return {aid for role in compiled.spec.roles.values() for aid in role.runnable_actions()}


def context_section(compiled: CompiledSop, action: AnsweredAction, memory: Memory,
                    role_id: str | None = None, query: str = "") -> str:
    """The declared context only (`none`, `all` or action ids), as a `## Context` section;
    within the role's or action's `memory_window`, with `recall`ed older messages (longterm)."""
    if action.context == "none":
        return ""
    picked = memory.get() if action.context == "all" else memory.get_by_actions(action.context)
    if role_id is not None:
        role = compiled.spec.roles[role_id]
        window = action.memory_window or role.memory_window
        picked = visible_messages(picked, window, action.recall or role.recall, query)
    picked = [m for m in picked if m.content or m.cause_by != USER_REQUIREMENT]   # a run started without an idea
    if not picked:
        return ""
    blocks = [f"### {m.cause_by} from {role_label(compiled, m.sent_from)}\n{m.quoted}" for m in picked]
    return "\n\n## Context\n\n" + "\n\n".join(blocks)


def template_variables(ctx: RunContext, role_id: str, memory: Memory, news: Sequence[Message],
                       round_: int) -> dict[str, Any]:
    """The variables every template of a role's action sees (contract §3)."""
    spec = ctx.compiled.spec
    msgs: dict[str, list[dict[str, Any]]] = {aid: [] for aid in spec.actions}
    msgs.setdefault("UserRequirement", [])
    for message in memory.get():
        msgs.setdefault(message.cause_by, []).append(message_view(ctx.compiled, message))
    state = ctx.role_states.get(role_id)
    return {
        "inputs": dict(ctx.inputs),
        "role": spec.role_view(role_id),
        "msgs": msgs,
        "news": [message_view(ctx.compiled, m) for m in news],
        "run": {"id": ctx.run_id, "round": round_},
        "plan": plan_view(state.plan.tasks if state is not None else []),
        "state": ctx.shared.view(role_id) if ctx.shared is not None else {},
    }


def message_view(compiled: CompiledSop, message: Message) -> dict[str, Any]:
    """A message as templates read it: its own fields, and who sent it by name and profile
    (MetaGPT's `sent_from` is the sender's name; ours is the id, so both are given)."""
    spec = compiled.spec
    sender = spec.role_at(message.sent_from)
    name = spec.role_name(sender) if sender is not None else message.sent_from
    profile = spec.roles[sender].profile if sender is not None else ""
    return {**message.template_view(), "sent_from_name": name, "sent_from_profile": profile,
            "send_to": sorted(message.send_to)}


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
                         variables: dict[str, Any], round_: int, note: str = "",
                         key: str = "") -> ActionResult:
    """Run an action once (or once per `for_each` item) and write its artifacts.

    `key` is the action's idempotency key: a person's questions are keyed by it."""
    action = ctx.compiled.spec.actions[action_id]
    effects = ToolEffects()
    if action.for_each is None:
        with at_place(key):
            out, content = await _run_once(ctx, role_id, action_id, memory, variables, round_, note,
                                           key, effects)
        written = [] if effects.unfinished else _write_artifacts(action_id, action, ctx.workspace,
                                                                 {**variables, "out": out})
        return ActionResult(content, out, effects.files + written, effects.messages,
                            _shared_changes(ctx, action_id, action, {**variables, "out": out}))
    items = _for_each_items(action_id, action, variables)
    if not items:
        ctx.emit(RunLog(round=round_, level="warning", role=role_id, action=action_id,
                        message=f"for_each gave no items ({action.for_each}): nothing ran, and the output is "
                                f"an empty list"))
    limit = asyncio.Semaphore(action.max_concurrency)

    per_item = [ToolEffects() for _ in items]   # merged in item order: the history is stable

    async def one(index: int, item: Any) -> tuple[Any, str]:
        async with limit:
            item_vars = {**variables, action.as_: item, "index": index}
            with at_place(f"{key}/{index}"):   # items run at once: each its own place
                return await _run_once(ctx, role_id, action_id, memory, item_vars, round_, note,
                                       f"{key}/{index}", per_item[index])

    results = await gather_or_cancel([one(i, it) for i, it in enumerate(items)])
    for item_effects in per_item:
        effects.messages += item_effects.messages
        effects.files += item_effects.files
    files: list[WrittenFile] = []
    for index, (item, (out, _)) in enumerate(zip(items, results, strict=True)):
        if per_item[index].unfinished:   # no output: nothing to write
            continue
        files += _write_artifacts(action_id, action, ctx.workspace,
                                  {**variables, action.as_: item, "index": index, "out": out})
    outs = [o for o, _ in results]
    files = effects.files + files
    shared = _shared_changes(ctx, action_id, action, {**variables, "out": outs})
    if action.join is None:
        return ActionResult("\n\n".join(c for _, c in results), outs, files, effects.messages, shared)
    content, joined = _join(ctx, action_id, action.join, variables, outs, [c for _, c in results])
    return ActionResult(content, outs, files + joined, effects.messages, shared)


def _shared_changes(ctx: RunContext, action_id: str, action: ActionBase,
                    variables: dict[str, Any]) -> dict[str, Any]:
    """The action's `set`: each expression evaluated against the state before the action (so
    their order does not matter), each value checked against its variable's type."""
    return {name: checked_value(ctx.compiled.spec, action_id, name,
                                _evaluate(action_id, f"set/{name}", source, variables))
            for name, source in action.set_.items()}


def _message_content(action_id: str, action: ActionBase, variables: dict[str, Any], out: Any,
                     content: str) -> str:
    """The message's text: the action's `content` template rendered with `out`, else `content`."""
    if action.content is None:
        return content
    where = join_pointer("/actions", action_id, "content")
    return _render(action_id, action.content, {**variables, "out": out}, where, "content").strip()


def _join(ctx: RunContext, action_id: str, join: JoinSpec, variables: dict[str, Any], outs: list[Any],
          contents: list[str]) -> tuple[str, list[WrittenFile]]:
    """`join`: the items' outputs as one text, in item order, and the one file it is written to."""
    at = join_pointer("/actions", action_id, "join")
    join_vars = {**variables, "outs": outs, "contents": contents}
    content = join.separator.join(contents)
    if join.content is not None:
        content = _render(action_id, join.content, join_vars, f"{at}/content", "join content")
    if join.path is None:
        return content, []
    path = _render(action_id, join.path, join_vars, f"{at}/path", "join path", limit=1024).strip()
    try:
        return content, [ctx.workspace.write(path, content)]
    except WorkspaceError as exc:
        raise ActionFailed(action_id, exc.message, code="SOP502", pointer=f"{at}/path") from None


def _render(action_id: str, source: str, variables: dict[str, Any], pointer: str, what: str,
            limit: int = MAX_RENDERED_CHARS) -> str:
    """A template of the action rendered in the sandbox; a failure names its place (SOP501)."""
    try:
        return render_template(source, variables, limit=limit)
    except TemplateFailure as exc:
        raise ActionFailed(action_id, f"{what} template: {exc}", code="SOP501", pointer=pointer,
                           template_line=exc.line) from None


def _for_each_items(action_id: str, action: ActionBase, variables: dict[str, Any]) -> list[Any]:
    """Evaluate the `for_each` expression in the sandbox; the value must be a list, or pairs:
    a mapping gives one `{key, value}` item per entry (in order), and the pairs `zip` or
    `enumerate` make (tuples, an iterator) are lists, so `item[0]` reads them."""
    value = _evaluate(action_id, "for_each", action.for_each or "", variables)
    if isinstance(value, Mapping):
        value = [{"key": k, "value": v} for k, v in value.items()]
    elif isinstance(value, Iterable) and not isinstance(value, (str, bytes, list)):   # pairs, .items()
        value = list(itertools.islice(value, MAX_FOR_EACH_ITEMS + 1))
    where = join_pointer("/actions", action_id, "for_each")
    if not isinstance(value, list):
        raise ActionFailed(action_id, f"for_each must give a list, got {type(value).__name__}",
                           hint="point it at a list (or a mapping: one {key, value} item per entry), e.g. "
                                "msgs.X[-1].out['Task list']",
                           code="SOP504", pointer=where)
    value = [list(v) if isinstance(v, tuple) else v for v in value]
    if len(value) > MAX_FOR_EACH_ITEMS:
        raise ActionFailed(action_id, f"for_each gave {len(value)} items; the limit is {MAX_FOR_EACH_ITEMS}",
                           code="SOP504", pointer=where)
    return value


def action_applies(action_id: str, action: ActionBase, variables: dict[str, Any]) -> bool:
    """The action's `when` condition (true when it has none)."""
    if action.when is None:
        return True
    value = _evaluate(action_id, "when", action.when, variables)
    if isinstance(value, str):
        return value.strip().lower() not in {"", "false", "no", "none", "0"}
    return bool(value)


def _evaluate(action_id: str, field: str, source: str, variables: dict[str, Any]) -> Any:
    """A `{{ expression }}` (braces optional) evaluated in the sandbox."""
    try:
        value = compile_expression(expression_text(source))(**variables)
        if isinstance(value, Undefined):
            bool(value)   # a refused attribute comes back as a StrictUndefined: its use raises
        return value
    except Exception as exc:  # noqa: BLE001 - any jinja/sandbox failure is the action's
        raise ActionFailed(action_id, f"{field} expression failed: {type(exc).__name__}: {exc}",
                           code="SOP504", pointer=join_pointer("/actions", action_id, field)) from None


async def _run_once(ctx: RunContext, role_id: str, action_id: str, memory: Memory,
                    variables: dict[str, Any], round_: int, note: str, key: str,
                    effects: ToolEffects) -> tuple[Any, str]:
    action = ctx.compiled.spec.actions[action_id]
    if isinstance(action, ComputeAction):   # no model, no person: the content is the output
        text = _message_content(action_id, action, variables, None, "")
        return text, text
    out, content = await _acted(ctx, role_id, action_id, memory, variables, round_, note, key, effects)
    if effects.unfinished:   # a tool loop without output: its message says why
        return out, content
    return out, _message_content(action_id, action, variables, out, content)


async def _acted(ctx: RunContext, role_id: str, action_id: str, memory: Memory,
                 variables: dict[str, Any], round_: int, note: str, key: str,
                 effects: ToolEffects) -> tuple[Any, str]:
    """The action's output and its default message text (the whole output)."""
    action = ctx.compiled.spec.actions[action_id]
    if isinstance(action, ToolAction):
        if ctx.direct_tool is None:  # the Team always plugs it in
            raise ActionFailed(action_id, "tool actions need the run's tool caller")
        return await ctx.direct_tool(ctx, role_id, action_id, variables, round_, key, effects)
    if isinstance(action, ExecAction):
        await durable(ctx.gateway.store)   # the answers it acts on are on disk first
        out = await run_command(action_id, action, variables, workspace=ctx.workspace,
                                allow_exec=ctx.allow_exec, sandbox=ctx.sandbox, sop_file=ctx.compiled.file)
        schema = ctx.compiled.output_schemas.get(action_id)
        if schema is None:
            return out, exec_content(out)
        value = stdout_answer(action_id, out, schema)   # `output:` the stdout's JSON, validated
        return value, content_of("json", value)
    here = join_pointer("/actions", action_id)
    assert isinstance(action, PromptedAction)   # exec, tool and compute are handled above
    prompt = _render(action_id, action.prompt, variables, f"{here}/prompt", "prompt")
    if isinstance(action, ReplyAction):   # MetaGPT's reply_to_human: a message, no answer
        text = prompt.strip()
        await durable(ctx.gateway.store)   # what the person is told rests on journaled answers
        tell_person(ctx.person, ctx.emit, round_=round_, role=role_id, action=action_id, text=text)
        return text, text
    context = context_section(ctx.compiled, action, memory, role_id, prompt)
    if note:
        context += f"\n\n## Note\n{note}"
    system = _system_prompt(ctx, role_id, action_id, variables)
    value = await _answer(ctx, role_id, action_id, prompt.rstrip(), context, system, round_, key, effects)
    schema = ctx.compiled.output_schemas.get(action_id)
    if isinstance(value, NoOutput):   # a tree with every key null, so templates reading it still render
        effects.unfinished = value.reason
        return with_absent_as_null({}, schema) if schema is not None else "", value.reason
    value = with_absent_as_null(value, schema)
    return value, content_of(output_kind(action.output), value)


def _system_prompt(ctx: RunContext, role_id: str, action_id: str, variables: dict[str, Any]) -> str:
    """The role's prefix, then the action's own `system` text (rendered) after a blank line;
    the action's text alone when it sets `role_prefix: false` (MetaGPT's system_msgs)."""
    action = ctx.compiled.spec.actions[action_id]
    if not isinstance(action, LlmAction):
        return role_prefix(ctx.compiled, role_id)
    own = None
    if action.system is not None:
        here = join_pointer("/actions", action_id, "system")
        own = _render(action_id, action.system, variables, here, "system")
    return system_prompt(ctx.compiled, role_id, own, action.role_prefix)


def _code_lang(action: ActionBase) -> str | None:
    output = output_of(action)
    return output.code if isinstance(output, CodeOutput) else None


async def _answer(ctx: RunContext, role_id: str, action_id: str, prompt: str, context: str, system: str,
                  round_: int, key: str, effects: ToolEffects) -> Any:
    """The action's output: a person's (a `human` role, `kind: ask`), a model's reviewed by a
    person (`review: human`), a tool loop's (`tools`), or a model's; `context`: the `## Context`
    section (and a note) that follows the prompt (a tool loop puts the role's earlier work
    between them)."""
    action = ctx.compiled.spec.actions[action_id]
    if isinstance(action, LlmAction) and action.tools and not ctx.compiled.spec.roles[role_id].human:
        if ctx.tool_loop is None:  # the Team always plugs it in
            raise ActionFailed(action_id, "tool-using actions need the run's tool loop")
        return await ctx.tool_loop(ctx, role_id, action_id, prompt, system, round_, key, effects, context=context)
    prompt += context
    if not isinstance(action, LlmAction) or ctx.compiled.spec.roles[role_id].human:
        question = _question(ctx, role_id, action_id, prompt, round_, key, "answer")
        return (await _ask(ctx, question)).value
    if action.review == "human":
        return await _reviewed(ctx, role_id, action_id, prompt, system, round_, key)
    return await _filled(ctx, role_id, action_id, prompt, system, round_, key)


async def _filled(ctx: RunContext, role_id: str, action_id: str, prompt: str, system: str,
                  round_: int, key: str) -> Any:
    """The model's output tree, filled as the action's `fill` says (one call, or one per
    top-level key, concurrently) and then reviewed and revised as its `revise` says
    (`engine.run.node`); every call goes through the gateway, every person's part is a question."""
    action = ctx.compiled.spec.action_as(action_id, LlmAction)
    schema = ctx.compiled.output_schemas.get(action_id)
    if schema is None or (action.fill == "simple" and action.revise is None):
        return await _model_value(ctx, role_id, action_id, prompt, system, round_)
    if action.fill == "complex":
        parts = await gather_or_cancel([
            _model_value(ctx, role_id, action_id, part_prompt(prompt, name), system, round_, part)
            for name, part in split_schema(schema)])
        value = merge_parts(schema, parts)
    else:
        value = await _model_value(ctx, role_id, action_id, prompt, system, round_)
    if action.revise is None:
        return value

    async def model(asked: str, asked_schema: dict[str, Any], step: str) -> Any:
        return await _model_value(ctx, role_id, action_id, asked, system, round_, asked_schema)

    async def person(asked: str, asked_schema: dict[str, Any], step: str) -> Any:
        return await ask_human(ctx, role=role_id, action=action_id, round_=round_,
                               key=f"{key}/{step}", prompt=asked, schema=asked_schema)

    def log(level: str, message: str) -> None:
        ctx.emit(RunLog(round=round_, level=level, role=role_id, action=action_id, message=message))

    value, _ = await revise_output(action.revise, prompt=prompt, value=value, schema=schema,
                                   model=model, person=person, log=log)
    return value


def model_call(ctx: RunContext, role_id: str, action_id: str, round_: int, **request: Any) -> CallSpec:
    """One of the action's model calls: its model and settings as resolved for the role
    (an action's own model > `--model` > env > role > file, `--model fake` over all:
    registry.choose_model; `--price` for an unpriced model), plus `request`
    (system, prompt, kind, schema...)."""
    llm = resolve_llm(ctx.compiled, role_id, action_id, ctx.model_override, ctx.price)
    return CallSpec(action=action_id, role=role_id, model=llm["model"], temperature=llm["temperature"],
                    max_tokens=llm["max_tokens"], timeout_s=llm["timeout_s"],
                    response_format=llm["response_format"], fallback_price=llm["price"], round=round_, place=_PLACE.get(), **request)


async def _model_value(ctx: RunContext, role_id: str, action_id: str, prompt: str,
                       system: str, round_: int, schema: dict[str, Any] | None = None) -> Any:
    """The model's accepted answer to the action's prompt (one gateway call); `schema`: an
    object to fill instead of the action's output (a part of it, a review, a revision)."""
    action = ctx.compiled.spec.action_as(action_id, LlmAction)
    kind = "json" if schema is not None else output_kind(action.output)
    spec = model_call(ctx, role_id, action_id, round_, system=system, prompt=prompt, kind=kind,
                      schema=schema or ctx.compiled.output_schemas.get(action_id),
                      code_lang=_code_lang(action), format=action.format, retries=action.max_retries)
    try:
        result = await call_gateway(ctx, spec)
    except ActionFailed as exc:  # the answers never fitted what the action declares
        raise exc.at("SOP505", join_pointer("/actions", action_id, "output")) from None  # the same exception, now located
    return result.value


_REJECTED_NOTE = ("A person reviewed your previous answer and rejected it with this comment:\n"
                  "{comment}\nWrite the answer again, taking the comment into account.")


async def _reviewed(ctx: RunContext, role_id: str, action_id: str, prompt: str, system: str,
                    round_: int, key: str) -> Any:
    """`review: human`: the model answers, a person approves, edits or rejects; a rejection
    asks the model again with the comment, up to the action's `max_retries`."""
    attempts = ctx.compiled.spec.action_as(action_id, LlmAction).max_retries + 1
    comment = ""
    for attempt in range(attempts):
        asked = prompt + ("\n\n## Note\n" + _REJECTED_NOTE.format(comment=comment) if comment else "")
        draft = await _filled(ctx, role_id, action_id, asked, system, round_, f"{key}/{attempt}")
        question = _question(ctx, role_id, action_id, asked, round_, key, "review", draft, attempt)
        decision = await _ask(ctx, question)
        if decision.decision == "approve":
            return draft
        if decision.decision == "edit":
            return decision.value
        comment = decision.comment
        ctx.emit(RunLog(round=round_, level="warning", role=role_id, action=action_id,
                        message=f"a person rejected the output (attempt {attempt + 1}): {comment}"))
    raise ActionFailed(action_id, f"a person rejected the output {attempts} time(s); last comment: "
                       f"{comment}", hint="raise the action's `max_retries` to allow more attempts",
                       code="SOP505", pointer=join_pointer("/actions", action_id, "review"))


def _question(ctx: RunContext, role_id: str, action_id: str, prompt: str, round_: int, key: str,
              kind: str, draft: Any = None, attempt: int = 0) -> Question:
    action = ctx.compiled.spec.action_as(action_id, AnsweredAction)
    return Question(key=question_key(key, kind, attempt, prompt, draft), kind=kind,  # type: ignore[arg-type]
                    role=role_id, action=action_id, round=round_, prompt=prompt,
                    output=output_kind(action.output),
                    schema=ctx.compiled.output_schemas.get(action_id), format=action.format,
                    code_lang=_code_lang(action), draft=draft, attempt=attempt)


async def ask_human(ctx: RunContext, *, role: str, action: str, round_: int, key: str, prompt: str,
                    schema: dict[str, Any] | None = None) -> Any:
    """MetaGPT's `ask_human`, for a tool-using role's `human.ask`: the person's answer to
    `prompt` (text, or with `schema` an object checked against it), journaled before it is
    returned and reused on resume. `key` is the calling step's own deterministic key."""
    question = Question(key=question_key(key, "ask", prompt, schema), kind="answer", role=role,
                        action=action, round=round_, prompt=prompt,
                        output="json" if schema else "text", schema=schema)
    return (await _ask(ctx, question)).value


def can_ask_human(ctx: RunContext, *, key: str, prompt: str) -> bool:
    """Whether `ask_human` with this key and prompt gets an answer now: a person can answer
    (not NoPerson), or the journal holds the answer (a resume, a replay). Else it would make
    the run wait, which a question the loop asks of itself (go on? stuck?) must not."""
    if not isinstance(ctx.person, NoPerson):
        return True
    store = ctx.gateway.store
    return store is not None and store.holds(question_key(key, "ask", prompt, None))


def reply_to_human(ctx: RunContext, *, role: str, action: str, round_: int, text: str) -> None:
    """MetaGPT's `reply_to_human`, for `human.reply`: a message to the person, journaled and shown."""
    tell_person(ctx.person, ctx.emit, round_=round_, role=role, action=action, text=text)


async def _ask(ctx: RunContext, question: Question) -> PersonAnswer:
    return await ask_person(question, person=ctx.person, store=ctx.gateway.store, emit=ctx.emit,
                            replay=ctx.gateway.replay)


async def call_gateway(ctx: RunContext, spec: CallSpec) -> CallResult:
    """One gateway call; a model error fails the action (a react choice's fails the run).

    The gateway checks the budget before every model call (not before an answer reused from
    the journal), keeps the totals, and reports each attempt, retry and re-ask as run events
    (stamped with `spec.round`) through the stream the Team gave it.
    """
    try:
        if ctx.pool is None or spec.kind == "choice" or ctx.gateway.replay:
            return await ctx.gateway.call(spec)

        def log(level: str, message: str) -> None:
            ctx.emit(RunLog(round=spec.round, level=level, role=spec.role, action=spec.action,
                            message=message))
        return await pooled_call(ctx.gateway.call, spec, pool=ctx.pool, store=ctx.gateway.store,
                                 journal_key=ctx.gateway.first_key, log=log,
                                 scope=ctx.compiled.source_hash)
    except (ActionFailed, BudgetExceeded):
        raise
    except LLMError as exc:
        if spec.kind == "choice":
            raise
        raise ActionFailed(spec.action, exc.message, exc.hint) from None


def _write_artifacts(action_id: str, action: ActionBase, workspace: Workspace,
                     variables: dict[str, Any]) -> list[WrittenFile]:
    files = []
    for index, artifact in enumerate(action.artifacts):
        at = join_pointer("/actions", action_id, "artifacts", index)
        path = _render(action_id, artifact.path, variables, f"{at}/path", f"artifact path '{artifact.path}'",
                       limit=1024).strip()
        content = _render(action_id, artifact.content, variables, f"{at}/content", f"artifact '{path}'")
        try:
            files.append(workspace.write(path, content))
        except WorkspaceError as exc:
            raise ActionFailed(action_id, exc.message, code="SOP502", pointer=f"{at}/path") from None
    return files


WARM_UP_WAIT_S = 2.0
"""The longest a hosted run's warm-up waits for the first request to be sent."""


def warm_up(compiled: CompiledSop, after: threading.Event | None = None) -> threading.Thread:
    """Render with the code the SOP was compiled to (CompiledSop.templates), and pay a run's
    other one-time costs in a daemon thread: the template objects of every template and
    expression of the plan made from that code (a SOP only checked, without code: compiled,
    from one bundle entry of the on-disk cache), then the JSON Schema validator of every output
    (the first one imports jsonschema). Started before the run, it overlaps the run's start
    and its first model call instead of delaying the first step that needs them; whatever it
    has not done yet is done on first use, as without it. With `after` (a run on a hosted model: the event
    engine.models.hosted.REQUEST_SENT) it starts once the first request is sent, at most
    WARM_UP_WAIT_S later: its CPU would otherwise slow the way to that request (threads
    share one interpreter lock), while the wait for the answer leaves the CPU idle."""
    if compiled.templates is not None:   # the code compiled with the SOP (a fraction of a ms)
        use_compiled(compiled.templates)
    thread = threading.Thread(target=_warm, args=(compiled, after), name="sopctl-warm-up",
                              daemon=True)
    thread.start()
    return thread


def _warm(compiled: CompiledSop, after: threading.Event | None = None) -> None:
    if after is not None:
        after.wait(WARM_UP_WAIT_S)
        while not after.is_set() and (left := warm_up_wait_left(WARM_UP_WAIT_S)) > 0:
            after.wait(left)   # the direct client is still getting its first request ready
    precompile_all(compiled.plan.templates, compiled.plan.expressions)   # first: the first call needs its prompt
    for schema in compiled.output_schemas.values():
        if schema is not None:
            prepare_validator(json.dumps(schema, sort_keys=True))

