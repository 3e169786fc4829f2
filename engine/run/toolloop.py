"""A tool-using action (`tools:`): MetaGPT's RoleZero loop, declared.

Each step is one gateway call whose answer is RoleZero's command list, as one JSON object:
`{"thought": "...", "commands": [{"command_name": "editor.write", "args": {...}}, ...]}`.
The engine runs the commands, shows their outputs to the model in the next step's prompt
(with the plan's status when the action has the `plan` tool), and calls again, until the
model gives `end`, whose args are the action's output, checked exactly as a direct answer
is (`engine.models.answers.read`). `max_steps` steps without an accepted `end` fail the
action (SOP505), naming `max_steps`. The last step offers only `end` (its schema is the
output's), so a model bound by a grammar (`local`) always finishes.

Within one step: commands run in the order given; neighbouring read-only commands (editor
reads, lists and searches, MCP tools) run concurrently; editing commands may change several
files in one step, but a second edit of one file (RoleZero's `exclusive_tool_commands`, per
file here) is not run, nor anything after it: its line numbers would be a guess. Bad
arguments (checked against the command's JSON Schema), a command that fails or times out:
the error is that command's output, the rest of the step does not run, and the model sees
why. Every output is capped (MAX_OUTPUT_CHARS).

Durability: every command is reported as a `ToolCalled` event. The result of a command with
effects outside the loop (editor, terminal, human.reply, MCP tools) is journaled in the
answers table under a key derived from the action's idempotency key, the step, the command's
place and its args (model `tool`), before the model sees it; resume and replay take it from
there instead of running the command again, and write back the files it wrote (as
artifacts are reconciled). The plan and team commands only change the loop's own state and
are simply run again; `human.ask` is journaled by the person's answer itself. Model answers
are journaled by the gateway, so a resumed loop replays to the same end for free.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import re
import time
from dataclasses import dataclass, field, replace
from typing import Any

from engine.errors import ActionFailed, BudgetExceeded, JournalError, ReplayDivergence
from engine.load.outputs import output_kind
from engine.load.source import join_pointer
from engine.load.catalog import END
from engine.load.spec import CodeOutput, LlmAction
from engine.models import answers
from engine.models.types import CallSpec, StoredAnswer, durable
from engine.run.actions import RunContext, ToolEffects, call_gateway, gather_or_cancel, model_call
from engine.run.events import ToolCalled
from engine.run.people import WaitingForPerson
from engine.run.mcp import McpServerFailed
from engine.run.tools import Builtins, Outcome, Tool, ToolError
from engine.run.tools.base import MAX_OUTPUT_CHARS
from engine.run.workspace import WrittenFile, sha256_text

__all__ = ["TOOL", "MAX_OUTPUT_CHARS", "loop_tools", "run_tool_loop", "step_schema"]


TOOL = "tool"
"""The `model` of a tool result journaled in the answers table (its origin there too)."""


_FULL_STEPS = 5
"""The newest steps are shown in full; older steps' outputs are cut (RoleZero keeps 5)."""


_OLD_OUTPUT_CHARS = 300


_FATAL = (WaitingForPerson, BudgetExceeded, ReplayDivergence, JournalError, McpServerFailed)
"""What a command may raise that is not the model's to read: the run handles it."""


_LOOP_STATE = ("plan.", "team.", "human.ask")


def loop_tools(ctx: RunContext, role_id: str, action_id: str) -> dict[str, Tool]:
    """Every command the action offers, by name, `end` last."""
    plan = ctx.compiled.plan
    expanded = plan.tools[action_id]
    tools: dict[str, Tool] = {}
    for command in expanded.commands:
        args = command.args
        if command.name == "team.publish":  # the members, by name: the model cannot miss one
            targets = list(plan.team_targets[role_id])
            args = {**args, "properties": {**args["properties"],
                                           "send_to": {"type": "string", "enum": targets}}}
        tools[command.name] = Tool(command.name, command.description, args, command.exclusive,
                                   command.readonly, not command.name.startswith(_LOOP_STATE))
    for server, named in expanded.servers.items():
        for tool in ctx.mcp.tools(server) if ctx.mcp is not None else ():
            if named is None or tool.name[len(server) + 1:] in named:
                tools[tool.name] = tool
    tools[END] = Tool(END, "Finish: the args are your final answer, the action's output.",
                      end_schema(ctx, action_id), journaled=False)
    return tools


def end_schema(ctx: RunContext, action_id: str) -> dict[str, Any]:
    """`end`'s args: the output tree's schema; for text or code, one field holding it."""
    action = ctx.compiled.spec.action_as(action_id, LlmAction)
    schema = ctx.compiled.output_schemas.get(action_id)
    if schema is not None:
        return schema
    if isinstance(action.output, CodeOutput):
        field_ = {"code": {"type": "string", "description": f"the complete {action.output.code} code"}}
    else:
        field_ = {"answer": {"type": "string", "description": "your final answer"}}
    return {"type": "object", "additionalProperties": False, "required": list(field_), "properties": field_}


def step_schema(names: list[str]) -> dict[str, Any]:
    """What one step's answer must be: a thought and at least one command (RoleZero's list)."""
    command = {"type": "object", "required": ["command_name"],
               "properties": {"command_name": {"type": "string", "enum": names},
                              "args": {"type": "object"}}}
    return {"type": "object", "required": ["commands"],
            "properties": {"thought": {"type": "string"},
                           "commands": {"type": "array", "minItems": 1, "items": command}}}


def last_step_schema(end_args: dict[str, Any]) -> dict[str, Any]:
    """The last step's answer: `end` only, its args the output (a grammar makes it fit)."""
    command = {"type": "object", "required": ["command_name", "args"],
               "properties": {"command_name": {"type": "string", "enum": [END]}, "args": end_args}}
    return {"type": "object", "required": ["commands"],
            "properties": {"thought": {"type": "string"},
                           "commands": {"type": "array", "minItems": 1, "maxItems": 1, "items": command}}}


QUICK_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["intent"],
    "properties": {"thought": {"type": "string"},
                   "intent": {"type": "string", "enum": ["TASK", "QUICK", "AMBIGUOUS", "SEARCH"]},
                   "answer": {"type": "string"}}}
"""Quick think's answer (TASK first: `fake` runs the loop)."""


_QUICK_NOTE = ("## First, classify the request\nQUICK: a fact, a small calculation, a greeting, a short "
               "piece of code or a how-to you can answer now. AMBIGUOUS: too vague to act on (ask what is "
               "missing). SEARCH: needs fresh information from outside. TASK: needs your commands or "
               "several steps. For QUICK and AMBIGUOUS also give `answer`, your reply (for AMBIGUOUS: "
               "your question back).")


async def run_tool_loop(ctx: RunContext, role_id: str, action_id: str, prompt: str, system: str,
                        round_: int, key: str, effects: ToolEffects) -> Any:
    """The action's output, from the model's `end` (see the module docstring)."""
    return await ToolLoop(ctx, role_id, action_id, round_, key, effects).run(prompt, system)


@dataclass
class _Step:
    thought: str
    commands: list[dict[str, Any]]
    outputs: list[str] = field(default_factory=list)


_NOT_DONE = object()


class ToolLoop:
    """One run of a tool-using action (one `for_each` item)."""

    def __init__(self, ctx: RunContext, role_id: str, action_id: str, round_: int, key: str,
                 effects: ToolEffects) -> None:
        self.ctx, self.role_id, self.action_id, self.round, self.key = ctx, role_id, action_id, round_, key
        self.action = ctx.compiled.spec.action_as(action_id, LlmAction)
        self.effects = effects
        self.tools = loop_tools(ctx, role_id, action_id)
        self.schema = step_schema(list(self.tools))
        self.last_schema = last_step_schema(self.tools[END].args)
        self.builtins = Builtins(ctx, role_id, action_id, round_)
        self.steps: list[_Step] = []

    async def run(self, prompt: str, system: str) -> Any:
        if self.action.tool_top_k is not None:
            self._recommend(prompt, self.action.tool_top_k)
        if self.action.quick_think:
            quick = await self._quick_answer(prompt, system)
            if quick is not None:
                return quick
        system = "\n\n".join(filter(None, [system, self._experience_text(), self._commands_text()]))
        for step in range(1, self.action.max_steps + 1):
            try:
                answer = await self._ask(self._prompt(prompt, step), system, step)
            except ActionFailed as exc:
                if step < self.action.max_steps:
                    raise
                raise self._out_of_steps(f"; its last answer: {exc.message}") from None
            commands = [c for c in answer["commands"] if isinstance(c, dict)]
            current = _Step(str(answer.get("thought", "")), commands)
            value = await self._run_step(step, current)
            self.steps.append(current)
            if value is not _NOT_DONE:
                self.effects.messages.extend(self.builtins.messages)
                return value
        raise self._out_of_steps("")

    def _out_of_steps(self, detail: str) -> ActionFailed:
        return ActionFailed(self.action_id, f"no final answer after {self.action.max_steps} step(s): the "
                            f"model never ended with a valid `end`{detail}",
                            hint="raise `max_steps`, or make the prompt say when the work is done",
                            code="SOP505", pointer=join_pointer("/actions", self.action_id, "max_steps"))

    def _recommend(self, prompt: str, k: int) -> None:
        """RoleZero's tool recommendation: the k commands whose name and description rank best
        by BM25 against the prompt (ties in declared order), plus `end`."""
        candidates = [t for t in self.tools.values() if t.name != END]
        if len(candidates) <= k:
            return
        from rank_bm25 import BM25Okapi   # a dependency of sopctl; imported only when used

        index = BM25Okapi([_words(f"{t.name} {t.description}") for t in candidates])
        scores = index.get_scores(_words(prompt))
        ranked = sorted(range(len(candidates)), key=lambda i: (-scores[i], i))[:k]
        kept = {candidates[i].name for i in ranked}
        self.tools = {name: t for name, t in self.tools.items() if name in kept or name == END}
        self.schema = step_schema(list(self.tools))

    # -- asking ---------------------------------------------------------------------------
    async def _quick_answer(self, prompt: str, system: str) -> str | None:
        """RoleZero's quick think: the answer to a QUICK or AMBIGUOUS request, else None."""
        spec = model_call(self.ctx, self.role_id, self.action_id, self.round, system=system,
                          prompt=f"{prompt.rstrip()}\n\n{_QUICK_NOTE}", kind="json",
                          schema=QUICK_SCHEMA, format="json", retries=self.action.max_retries)
        value = (await call_gateway(self.ctx, spec)).value
        answer = str(value.get("answer") or "").strip()
        if value.get("intent") in ("QUICK", "AMBIGUOUS") and answer:
            return answer
        return None

    def _experience_text(self) -> str:
        """`experience` files (read when the SOP compiled): shown as RoleZero shows retrieved
        experience; one that could not be read fails the action, as it did when read here."""
        texts = []
        for index, found in enumerate(self.ctx.compiled.plan.tools[self.action_id].experience):
            if found.error:
                raise ActionFailed(self.action_id, found.error, code="SOP502",
                                   pointer=join_pointer("/actions", self.action_id, "experience", index))
            texts.append(found.text)
        if not texts:
            return ""
        return "## Past experience\nHow similar work was done before (examples, not instructions):\n\n" + \
            "\n\n".join(texts)

    def _commands_text(self) -> str:
        lines = [f"- {t.name}: {t.description} Args (JSON Schema): "
                 f"{json.dumps(t.args, ensure_ascii=False, separators=(',', ':'))}" for t in self.tools.values()]
        exclusive = ", ".join(t.name for t in self.tools.values() if t.exclusive)
        rule = (f" Editing commands ({exclusive}) may change several files in one step, but only one "
                "edit per file: a second edit of the same file, and every command after it, is not "
                "run (give it in the next step, once you have seen the file).") if exclusive else ""
        return ("## Commands\nYou work by giving commands. The engine runs them in order and shows you "
                "their output in the next step. The commands you can give:\n" + "\n".join(lines) +
                "\nGive independent commands together in one step." + rule +
                f" When the work is done, give `{END}` with your final answer as its args.")

    def _prompt(self, prompt: str, step: int) -> str:
        parts = [prompt.rstrip()]
        if any(name.startswith("plan.") for name in self.tools):
            parts.append("## Plan status\n" + self.builtins.plan.status())
        if self.steps:
            parts.append("## Your steps so far\n" + "\n\n".join(
                self._step_text(n, s, full=len(self.steps) - n < _FULL_STEPS)
                for n, s in enumerate(self.steps, 1)))
        if step < self.action.max_steps:
            parts.append(f"## Step {step} of at most {self.action.max_steps}\nGive your next commands.")
        else:
            parts.append(f"## Step {step} of at most {self.action.max_steps}\nThis is your last step: "
                         f"give `{END}` with your final answer.")
        return "\n\n".join(parts)

    def _step_text(self, number: int, step: _Step, *, full: bool) -> str:
        shown = [o if full or len(o) <= _OLD_OUTPUT_CHARS else o[:_OLD_OUTPUT_CHARS] + " [...]"
                 for o in step.outputs]
        given = json.dumps(step.commands, ensure_ascii=False)
        if len(given) > MAX_OUTPUT_CHARS:   # a whole file written is not repeated at every step
            given = given[:MAX_OUTPUT_CHARS] + f" [... {len(given) - MAX_OUTPUT_CHARS} characters cut]"
        return f"### Step {number}\nCommands: {given}\n" + "\n".join(shown)

    async def _ask(self, prompt: str, system: str, step: int) -> dict[str, Any]:
        last = step == self.action.max_steps   # only `end` is offered: a grammar-bound model must finish
        offered = [self.tools[END]] if last else list(self.tools.values())
        spec = model_call(self.ctx, self.role_id, self.action_id, self.round, system=system,
                          prompt=prompt, kind="json", schema=self.last_schema if last else self.schema,
                          format="json", retries=self.action.max_retries, tool_step=step - 1,
                          commands=tuple((t.name, t.args) for t in offered))
        result = await call_gateway(self.ctx, spec)
        return dict(result.value)

    # -- one step -------------------------------------------------------------------------
    async def _run_step(self, step: int, current: _Step) -> Any:
        """Run the step's commands; the output value if an `end` was accepted."""
        calls = [(str(c.get("command_name", "")), c.get("args") if isinstance(c.get("args"), dict) else {})
                 for c in current.commands]
        calls, dropped = self._exclusive_cut(calls)
        failed = False
        for group in self._groups(calls):
            if failed:
                current.outputs += [f"Command {name} not run: an earlier command of this step failed."
                                    for _, name, _ in group]
                continue
            if group[0][1] == END:
                value, problem = self._final(group[0][2])
                if not problem:
                    return value
                current.outputs.append(f"Command end refused: {problem}")
                failed = True
                continue
            outcomes = await gather_or_cancel([self._call(step, i, n, a) for i, n, a in group])
            for (_, name, _), outcome in zip(group, outcomes, strict=True):
                verb = "failed" if outcome.error else "executed"
                current.outputs.append(f"Command {name} {verb}: {outcome.output}")
                failed = failed or outcome.error
        if dropped:
            current.outputs.append(dropped)
        return _NOT_DONE

    def _exclusive_cut(self, calls: list[tuple[str, Any]]) -> tuple[list[tuple[str, Any]], str]:
        """RoleZero's exclusive commands, per file: the list is cut before a second edit of a
        file this step already edits (its line numbers would be the model's guess); what was
        cut and why, for the model."""
        edited: set[str] = set()
        for index, (name, args) in enumerate(calls):
            tool = self.tools.get(name)
            if tool is None or not tool.exclusive:
                continue
            path = args.get("path")
            target = posixpath.normpath(path) if isinstance(path, str) else name
            if target in edited:
                cut = ", ".join(n for n, _ in calls[index:])
                return calls[:index], (f"Not run, a second edit of {target} in one step: {cut}. "
                                       "Give it in the next step, once you have seen the first edit's result.")
            edited.add(target)
        return calls, ""

    def _groups(self, calls: list[tuple[str, Any]]) -> list[list[tuple[int, str, Any]]]:
        """Consecutive read-only commands together (run concurrently); every other alone."""
        groups: list[list[tuple[int, str, Any]]] = []
        for index, (name, args) in enumerate(calls):
            if self._readonly(name) and groups and self._readonly(groups[-1][-1][1]):
                groups[-1].append((index, name, args))
            else:
                groups.append([(index, name, args)])
        return groups

    def _readonly(self, name: str) -> bool:
        tool = self.tools.get(name)
        return tool is not None and tool.readonly

    def _final(self, args: dict[str, Any]) -> tuple[Any, str]:
        """`end`'s args read as the action's output (as a direct answer is), or why not."""
        kind = output_kind(self.action.output)
        lang = self.action.output.code if isinstance(self.action.output, CodeOutput) else None
        spec = CallSpec(action=self.action_id, role=self.role_id, system="", prompt="", kind=kind,  # type: ignore[arg-type]
                        model=TOOL, schema=self.ctx.compiled.output_schemas.get(self.action_id),
                        code_lang=lang)
        if kind == "json":
            text = json.dumps(args, ensure_ascii=False)
        else:
            raw = args.get("code" if kind == "code" else "answer")
            if not isinstance(raw, str):
                return None, f"its args need `{'code' if kind == 'code' else 'answer'}`, a string"
            text = raw if kind != "code" or "```" in raw else f"```{lang or ''}\n{raw.rstrip()}\n```"
        try:
            return answers.read(spec, text), ""
        except answers.InvalidAnswer as exc:
            return None, str(exc)

    # -- one command ----------------------------------------------------------------------
    async def _call(self, step: int, index: int, name: str, args: dict[str, Any]) -> Outcome:
        started = time.monotonic()
        call = _call_key(self.key, step, index, name, args)
        tool = self.tools.get(name)
        reused = False
        if tool is None:
            outcome = Outcome(f"command {name} not found; the commands are: {', '.join(self.tools)}", True)
        elif errors := answers.schema_errors(args, tool.args):
            outcome = Outcome("the arguments do not match the command's schema: " + "; ".join(errors), True)
        elif tool.journaled and (stored := self._stored(call)) is not None:
            outcome, reused = stored, True
            self._reconcile(outcome)
            self.builtins.restore(name, outcome)
        else:
            if tool.journaled and self.ctx.gateway.replay:
                raise ReplayDivergence(
                    f"replay diverged at action {self.action_id} (role {self.role_id}): the result of "
                    f"{name} (step {step}) is not in the journal",
                    hint="the SOP, its inputs or the engine changed since the run was recorded")
            if tool.journaled:   # it acts outside: the answers that asked for it are on disk first
                await durable(self.ctx.gateway.store)
            outcome = _capped(await self._execute(tool, args, call))
            if tool.journaled:
                self._record(call, outcome)
            self._keep_files(outcome)
        self.ctx.emit(ToolCalled(round=self.round, role=self.role_id, action=self.action_id, step=step,
                                 tool=name, args=args, output=outcome.output, call=call,
                                 error=outcome.error, reused=reused,
                                 seconds=round(time.monotonic() - started, 3)))
        return outcome

    async def _execute(self, tool: Tool, args: dict[str, Any], call: str) -> Outcome:
        try:
            if tool.server is not None:
                return await self.ctx.mcp.call(tool, args)
            return await self.builtins.run(tool.name, args, call)
        except ToolError as exc:
            return Outcome(str(exc), error=True)
        except _FATAL:
            raise
        except asyncio.TimeoutError:
            return Outcome(f"{tool.name} timed out", error=True)
        except Exception as exc:  # noqa: BLE001 - any failure of a tool is the model's to read
            return Outcome(f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}", error=True)

    def _stored(self, call: str) -> Outcome | None:
        store = self.ctx.gateway.store
        stored = store.lookup(call) if store is not None else None
        if stored is None:
            return None
        try:
            return Outcome.from_json(json.loads(stored.text))
        except (ValueError, TypeError, AttributeError):
            return None

    def _record(self, call: str, outcome: Outcome) -> None:
        store = self.ctx.gateway.store
        if store is not None:   # journaled before the model sees it (or anything uses it)
            store.record(call, self.action_id, StoredAnswer(json.dumps(outcome.to_json(), ensure_ascii=False),
                                                            0, 0, 0.0, model=TOOL))

    def _reconcile(self, outcome: Outcome) -> None:
        """A journaled editor write: the file is written back if it is missing or changed."""
        for path, content in outcome.files.items():
            self.effects.files.append(self.ctx.workspace.write(path, content))

    def _keep_files(self, outcome: Outcome) -> None:
        self.effects.files += [WrittenFile(path, sha256_text(content), True)
                               for path, content in outcome.files.items()]


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower().replace("_", " "))


def _call_key(action_key: str, step: int, index: int, name: str, args: dict[str, Any]) -> str:
    return sha256_text(json.dumps([TOOL, action_key, step, index, name, args], sort_keys=True,
                                  ensure_ascii=False, default=str))


def _capped(outcome: Outcome) -> Outcome:
    text = outcome.output
    if len(text) <= MAX_OUTPUT_CHARS:
        return outcome
    cut = f"\n[output cut: {len(text) - MAX_OUTPUT_CHARS} more characters not shown]"
    return replace(outcome, output=text[:MAX_OUTPUT_CHARS] + cut)
