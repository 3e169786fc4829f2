"""A tool-using action (`tools:`): MetaGPT's RoleZero loop, declared.

Each step is one gateway call whose answer is RoleZero's command list, as one JSON object:
`{"thought": "...", "commands": [{"command_name": "editor.write", "args": {...}}, ...]}`.
The engine runs the commands, shows their outputs to the model in the next step's prompt
(with the plan's status when the action has the `plan` tool), and calls again, until the
model gives `end`, whose args are the action's output, checked exactly as a direct answer
is (`engine.models.answers.read`).

What a role keeps across activations (engine/run/rolestate.py): its plan, one per role, and
its working memory (earlier steps, received messages), the newest `working_memory` entries
of which the prompt shows under "## Your earlier work". A `for_each` item works on a copy
of the plan and adds nothing (items run concurrently).

Limits as MetaGPT has them, soft: the last of `max_steps` steps offers only `end` (its schema
is the output's, so a model bound by a grammar, `local`, finishes); a model that still does
not end ends the action without output (`NoOutput`: a warning names the role and the action,
the run goes on). With `max_steps` of 10 or more and a person who can be asked, the person
is first asked whether to go on ("yes": as many steps again). A person's `stop` (to
`human.ask` or to a question of the loop) ends the action the same way, and the role takes
no more turns. Stuck detection (RoleZero's duplicate check): commands equal to those of one
of the last few steps, when nothing new came back since (the last step's outputs are that
step's) and none moves a view (a scroll, `browser.back`), are asked for again with a note to try something else, twice; a third
time, the person is asked what the role should do (their answer is that step's output), or,
when nobody can be asked, the action ends without output.

Within one step: at most MAX_COMMANDS commands run (the step's output names the rest, not
run); they run in the order given; neighbouring read-only commands (editor reads, lists and
searches, MCP tools) run concurrently; editing commands may change several files in one step,
but a second edit of one file (RoleZero's `exclusive_tool_commands`, per file here) is not
run, nor anything after it: its line numbers would be a guess. Bad arguments (checked
against the command's JSON Schema), a command that fails or times out: the error is that
command's output, the rest of the step does not run, and the model sees why. Every output is
capped (MAX_OUTPUT_CHARS), and the cut says so and how to see the rest.

Durability: every command is reported as a `ToolCalled` event. The result of a command with
effects outside the loop (editor, terminal, human.reply, MCP tools) is journaled in the
answers table under a key derived from the action's idempotency key, the step, the command's
place and its args (model `tool`), before the model sees it; resume and replay take it from
there instead of running the command again, and write back the files it wrote (as
artifacts are reconciled). The plan and team commands only change the loop's own state and
are simply run again; `human.ask` and the loop's own questions (go on? stuck?) are journaled
by the person's answer itself. Model answers are journaled by the gateway, so a resumed loop
replays to the same end for free; a re-ask for a repeat differs from the first request (its
note), so it is a request of its own.
"""

from __future__ import annotations

import asyncio
import collections
import json
import posixpath
import re
import time
from dataclasses import dataclass, field, replace
from typing import Any
from collections.abc import Iterable

from engine.errors import ActionFailed, BudgetExceeded, JournalError, ReplayDivergence
from engine.load.outputs import output_kind
from engine.load.source import join_pointer
from engine.load.catalog import END
from engine.load.spec import CodeOutput, LlmAction
from engine.models import answers
from engine.models.types import CallSpec, StoredAnswer, durable
from engine.run.actions import (
    NoOutput,
    RunContext,
    ToolEffects,
    ask_human,
    call_gateway,
    can_ask_human,
    gather_or_cancel,
    model_call,
    reply_to_human,
    role_label,
)
from engine.run.events import RunLog, ToolCalled
from engine.run.people import WaitingForPerson
from engine.run.mcp import McpServerFailed
from engine.run.rolestate import OLD_OUTPUT_CHARS, RoleState, cut, earlier_text, working_memory
from engine.run.tools import Builtins, Outcome, Tool, ToolError
from engine.run.tools.base import MAX_OUTPUT_CHARS
from engine.run.tools.human import says_stop
from engine.run.workspace import WrittenFile, sha256_text

__all__ = ["TOOL", "MAX_OUTPUT_CHARS", "MAX_COMMANDS", "loop_tools", "run_tool_loop", "step_schema",
           "journaled_call", "call_key", "shown_args", "action_tools"]


TOOL = "tool"
"""The `model` of a tool result journaled in the answers table (its origin there too)."""


_FULL_STEPS = 5
"""When the history is cut, the newest steps stay in full (RoleZero keeps 5)."""


_HISTORY_CHARS = 48_000
"""What the steps so far may take before the outputs of all but the newest _FULL_STEPS
steps are cut, all at once: a history cut at every step would differ from the last
request's at every step, and a provider's prompt cache needs the same beginning."""


MAX_COMMANDS = 20
"""The most commands run in one step; the rest are not run, and the step's output says so."""


MAX_STEP_OUTPUT_CHARS = 5 * MAX_OUTPUT_CHARS
"""What all of one step's outputs together show the model (each is cut at MAX_OUTPUT_CHARS
first): twenty full reads would put 160,000 characters into every later prompt. The outputs
past it are replaced by a line saying so; the commands did run."""


_ALWAYS_SHOWN_CHARS = 300
"""An output this short (an error, a `not run` line) is shown even past the step's limit."""


_REPEAT_LOOKBACK = 5
"""A step's commands equal to those of one of this many steps before, with nothing new come
back since, are a repeat (RoleZero compares with its last 10 memories: about 5 answers and
their outputs)."""


_REASKS = 2
"""Re-asks of a repeat, each with a note, before the person is asked (RoleZero: twice)."""


_ASK_TO_GO_ON = 10
"""From this `max_steps` on, a person who can be asked is asked at the limit whether to go on
(RoleZero asks from max_react_loop 10; below, it stops quietly)."""


_FATAL = (WaitingForPerson, BudgetExceeded, ReplayDivergence, JournalError, McpServerFailed)
"""What a command may raise that is not the model's to read: the run handles it."""


_LOOP_STATE = ("plan.", "team.", "human.ask")


def loop_tools(ctx: RunContext, role_id: str, action_id: str) -> dict[str, Tool]:
    """Every command the action offers, by name, `end` last."""
    tools = action_tools(ctx, role_id, action_id)
    tools[END] = Tool(END, "Finish: the args are your final answer, the action's output.",
                      end_schema(ctx, action_id), journaled=False)
    return tools


def action_tools(ctx: RunContext, role_id: str, action_id: str) -> dict[str, Tool]:
    """Every command the action's `tools` (or a `kind: tool` action's `tool`) names, by name."""
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
                                   command.readonly, not command.name.startswith(_LOOP_STATE),
                                   moves=command.moves)
    for server, named in expanded.servers.items():
        for tool in ctx.mcp.tools(server) if ctx.mcp is not None else ():
            if named is None or tool.name[len(server) + 1:] in named:
                tools[tool.name] = tool
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


def _tally(names: Iterable[str], most: int = 8) -> str:
    """Command names with their counts, most frequent first (`editor.write ×2,980`): a list
    of thousands of names would push the limit's own words past the step's output bound."""
    counts = collections.Counter(names).most_common()
    shown = [name if n == 1 else f"{name} ×{n:,}" for name, n in counts[:most]]
    return ", ".join(shown + ([f"{len(counts) - most} more kinds"] if len(counts) > most else []))


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
               "several steps.\nThis time answer with no commands, only one JSON object and nothing else: "
               '`intent` (one of TASK, QUICK, AMBIGUOUS, SEARCH), optionally `thought`, and for QUICK and '
               "AMBIGUOUS also `answer`, your reply (for AMBIGUOUS: your question back). Your commands, if "
               "any, come at the next step.")
"""Quick think's question, after the loop's first message and answer format (so the loop's
first step begins as this request does, up to here) with its own answer format: the
provider's schema or grammar is QUICK_SCHEMA's."""


async def run_tool_loop(ctx: RunContext, role_id: str, action_id: str, prompt: str, system: str,
                        round_: int, key: str, effects: ToolEffects, context: str = "") -> Any:
    """The action's output, from the model's `end` (see the module docstring); `context`: the
    action's `## Context` section, shown after the role's earlier work."""
    return await ToolLoop(ctx, role_id, action_id, round_, key, effects).run(prompt, system, context)


@dataclass
class _Step:
    thought: str
    commands: list[dict[str, Any]]
    outputs: list[str] = field(default_factory=list)
    done: bool = False
    """Its commands are not run: its outputs are already what the model is shown (stuck)."""
    asked: str = ""
    """The step's own message as sent, without the results of the step before (see _turns)."""
    same_as: dict[int, int] = field(default_factory=dict)
    """Output index -> the earlier step whose output was the same text (`_same_outputs`)."""
    _canonical: str = field(default="", init=False, repr=False, compare=False)
    _shown: str = field(default="", init=False, repr=False, compare=False)
    """Worked out once each: its commands as compared for a repeat, its answer as the history shows it."""

    def canonical(self) -> str:
        """Its commands as compared for a repeat, worked out once (every later step compares
        against every earlier one)."""
        if not self._canonical:
            self._canonical = _canonical(self.commands)
        return self._canonical


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
        self.state = ctx.role_states.get(role_id) or RoleState.for_role(ctx.compiled.spec, role_id)
        self.keeps = self.action.for_each is None   # fan-out items run concurrently: each on a copy
        plan = self.state.plan if self.keeps else self.state.plan.copy()
        self.builtins = Builtins(ctx, role_id, action_id, round_, plan)
        self.earlier = self.state.earlier(working_memory(ctx.compiled.spec, role_id, action_id))
        self.steps: list[_Step] = []
        self.turns: list[dict[str, str]] = []
        """The steps so far as messages (each step's message, then its answer), never
        rewritten but all at once when they pass _HISTORY_CHARS (`cut_through`)."""
        self.turn_chars = 0
        """The characters of `turns`' contents, kept as they join (summing them at every step
        grew with the loop)."""
        self.cut_through = 0
        """Steps up to this number are shown with their outputs cut."""
        self.first = ""
        self.limit = self.action.max_steps
        """The last step's number: max_steps, and as many again each time a person says go on."""
        self.commands_run = 0
        self.commands_failed = 0
        self.plan_shown: tuple[str, int] | None = None
        """The plan's status as a step's message last showed it whole, and that step's number."""
        self.outputs_shown: dict[str, int] = {}
        """A long output -> the first step that showed it (`_same_outputs`)."""

    async def run(self, prompt: str, system: str, context: str = "") -> Any:
        if self.action.tool_top_k is not None:
            self._recommend(prompt, self.action.tool_top_k)
        # the system prompt and first message of every request of the loop, quick think's too
        # (the loop's answer format, then its question): each request begins as the
        # one before it did, up to what it adds
        system = "\n\n".join(filter(None, [system, self._experience_text(), self._commands_text()]))
        first = self._first_message(prompt, context)
        if self.action.quick_think and self.state.from_user:   # RoleZero: only the user's requests
            quick = await self._quick_answer(first, system)
            if quick is not None:   # RoleZero publishes it to the user, whatever the action's send_to
                reply_to_human(self.ctx, role=self.role_id, action=self.action_id, round_=self.round, text=quick)
                return quick
        value = await self._steps(first, system)
        if self.commands_run and self.commands_failed == self.commands_run:
            self.ctx.emit(RunLog(round=self.round, level="warning", role=self.role_id, action=self.action_id,
                                 message=f"every command it ran failed ({self.commands_failed} of "
                                         f"{self.commands_run}): its output rests on no tool result"))
        if self.keeps:
            self.state.record(self.action_id, self.round, [(s.commands, s.outputs) for s in self.steps])
        self.effects.messages.extend(self.builtins.messages)
        return value

    async def _steps(self, prompt: str, system: str) -> Any:
        """Step after step until an accepted `end` (its value), or a NoOutput saying why not."""
        step = 0
        while True:
            step += 1
            if step == self.limit and await self._go_on(step):
                self.limit += self.action.max_steps
            if self.builtins.human.stopped:
                return self._stopped()
            current = await self._next(prompt, system, step)
            if isinstance(current, NoOutput):
                return current
            value = _NOT_DONE if current.done else await self._run_step(step, current)
            self.steps.append(current)
            self._add_turns(current)
            if value is not _NOT_DONE:
                return value
            if self.builtins.human.stopped:
                return self._stopped()
            if step >= self.limit:
                return self._unfinished(f"it reached max_steps ({self.action.max_steps}) without a valid `end`")

    def _unfinished(self, why: str) -> NoOutput:
        """The action ends without output: a warning now, and a message that says why."""
        self.ctx.emit(RunLog(round=self.round, level="warning", role=self.role_id, action=self.action_id,
                             message=f"{self.action_id} ended without output: {why}; the run goes on"))
        return NoOutput(f"{self.action_id} ended without a final answer: {why}.")

    def _stopped(self) -> NoOutput:
        self.state.stopped = "a person answered stop"
        return self._unfinished("a person answered `stop`; the role takes no more turns")

    async def _next(self, prompt: str, system: str, step: int) -> _Step | NoOutput:
        """The step's commands from the model: a repeat is asked again with a note (twice),
        then the person is asked; an invalid last answer ends the loop."""
        last = step == self.limit
        note = ""
        for reask in range(_REASKS + 1):
            try:
                asked = self._step_message(step, note)
                answer = await self._ask(prompt, system, step, last, asked)
            except ActionFailed as exc:
                if not last:
                    raise
                return self._unfinished(f"it reached max_steps ({self.action.max_steps}) and its answer to "
                                        f"the last step was still invalid: {exc.message}")
            current = _Step(str(answer.get("thought", "")),
                            [c for c in answer["commands"] if isinstance(c, dict)], asked=asked)
            if last or not self._repeats(current.commands):
                return current
            note = (f"Your commands are the same as at one of your last steps (asked again: {reask + 1} "
                    f"of {_REASKS}). Giving them again will not change what they give back: think about "
                    f"why they did not get you further, then give different commands, or `{END}` if the "
                    "work is done.")
        return await self._stuck(step, current)

    def _repeats(self, commands: list[dict[str, Any]]) -> bool:
        """The same commands as a recent step, when nothing new came back since: each step
        after it repeated an earlier one, outputs and all (X, X; and X, Y, X, Y at its second
        Y). A command that moves a view (a scroll, `back`) is progress."""
        if any(c.get("command_name") == END or self._moves(c.get("command_name")) for c in commands):
            return False
        given = _canonical(commands)
        first = max(len(self.steps) - _REPEAT_LOOKBACK, 0)
        if all(s.canonical() != given for s in self.steps[first:]):
            return False     # the common case: no recent step gave them (the whole history not walked)
        done = [(s.canonical(), tuple(s.outputs)) for s in self.steps]
        return any(done[i][0] == given and _nothing_new_since(done, i) for i in range(first, len(done)))

    def _moves(self, name: Any) -> bool:
        tool = self.tools.get(str(name))
        return tool is not None and tool.moves

    async def _stuck(self, step: int, current: _Step) -> _Step | NoOutput:
        """RoleZero's stuck role: the person is asked what it should do (their answer is the
        step's output, its commands not run); nobody to ask: the loop ends."""
        given = json.dumps(current.commands, ensure_ascii=False)
        given = cut(given, OLD_OUTPUT_CHARS)
        question = (f"{role_label(self.ctx.compiled, self.role_id)} is stuck in {self.action_id}: at step "
                    f"{step} it gave the same commands as at an earlier step, {_REASKS + 1} times in a row: "
                    f"{given}. What should it do instead? (Answer `stop` to end its work.)")
        answer = await self._ask_person(question, f"stuck/{step}")
        if answer is None:
            return self._unfinished(f"it was stuck, giving the same commands {_REASKS + 1} times at step "
                                    f"{step}, and nobody can be asked")
        if says_stop(answer):
            self.builtins.human.stopped = True
            return self._stopped()
        return _Step(current.thought, current.commands, [
            "Not run: these commands repeat an earlier step's. A person was asked what you should do "
            f"instead, and answered: {answer}"], done=True, asked=current.asked)

    async def _go_on(self, step: int) -> bool:
        """At the limit (max_steps of 10 or more): whether the person says go on."""
        if self.action.max_steps < _ASK_TO_GO_ON:
            return False
        question = (f"{role_label(self.ctx.compiled, self.role_id)} has taken {step - 1} steps in "
                    f"{self.action_id} without finishing (max_steps: {self.action.max_steps}). Go on for "
                    f"another {self.action.max_steps} steps? (yes or no; `stop` ends its work)")
        answer = await self._ask_person(question, f"go-on/{step}")
        if answer is not None and says_stop(answer):
            self.builtins.human.stopped = True
        return answer is not None and re.match(r"\s*(y|yes|ok|okay|sure|continue|go on)\b", answer, re.I) is not None

    async def _ask_person(self, question: str, part: str) -> str | None:
        """The person's answer to a question of the loop's own, or None when nobody can be
        asked (a question must not make the run wait: the loop ends instead)."""
        key = f"{self.key}/{part}"
        if not can_ask_human(self.ctx, key=key, prompt=question):
            return None
        return str(await ask_human(self.ctx, role=self.role_id, action=self.action_id, round_=self.round,
                                   key=key, prompt=question))

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
        spec = model_call(self.ctx, self.role_id, self.action_id, self.round, system=system, prompt=prompt,
                          kind="json", schema=QUICK_SCHEMA, prompt_schema=self.schema,
                          turns=({"role": "user", "content": _QUICK_NOTE},), format="json",
                          retries=self.action.max_retries)
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
        lines = [f"- {t.name}: {t.description} Args: {answers.args_text(t.args)}" for t in self.tools.values()]
        exclusive = ", ".join(t.name for t in self.tools.values() if t.exclusive)
        rule = (f" Editing commands ({exclusive}) may change several files in one step, but only one "
                "edit per file: a second edit of the same file, and every command after it, is not "
                "run (give it in the next step, once you have seen the file).") if exclusive else ""
        return ("## Commands\nYou work by giving commands. The engine runs them in order and shows you "
                "their output in the next step. The commands you can give:\n" + "\n".join(lines) +
                f"\nGive independent commands together in one step (at most {MAX_COMMANDS})." + rule +
                (" The plan's status comes with a step's output when the plan changed." if self._plans() else "") +
                f" When the work is done, give `{END}` with your final answer as its args.")

    def _first_message(self, prompt: str, context: str = "") -> str:
        """What every step's request begins with after the system prompt: the action's prompt,
        the role's earlier work, then the action's context (the same at every step: a provider
        caches it). The earlier work before the context: a role's next activation keeps its
        earlier work as it was and adds to its end, so that activation's requests begin with
        all the last one's up to there (the context, the memory as the action picks it, grows
        too, and could keep only itself)."""
        parts = [prompt.rstrip()]
        if self.earlier:
            parts.append("## Your earlier work\nWhat you did and were sent before this, oldest first:\n\n" +
                         earlier_text(self.earlier))
        return "\n\n".join(parts) + context

    def _step_message(self, step: int, note: str = "") -> str:
        """The step's own message, the last of its request: what the step before gave back
        (`_results`, added by _turns), the plan's status, which step this is, a re-ask's note."""
        parts = []
        status = self._plan_status(step) if self._plans() else None
        if status is not None:
            parts.append("## Plan status\n" + status)
        if step < self.limit:
            parts.append(f"## Step {step} of at most {self.limit}: your next commands")
        else:
            parts.append(f"## Step {step} of at most {self.limit}\nThis is your last step: "
                         f"give `{END}` with your final answer.")
        if note:
            parts.append(f"## Note\n{note}")
        return "\n\n".join(parts)

    def _plans(self) -> bool:
        return any(name.startswith("plan.") for name in self.tools)

    def _plan_status(self, step: int) -> str | None:
        """The plan's status, whole, at the first step and whenever it changed; None while it
        stays as an earlier step's message showed it (the commands say so): every step's
        message stays in the history, so a plan shown at each of forty steps would weigh on
        every later request, and even a pointer to it was a tenth of what a short step adds.
        A plan that only gained tasks at its end is shown as those tasks and its current one:
        one appended per step would otherwise be shown whole at every step, the requests
        growing with the square of the steps."""
        status = self.builtins.plan.status()
        shown = self.plan_shown
        if shown is not None and shown[0] == status and shown[1] < step:
            return None
        self.plan_shown = (status, step)
        return _grown_plan(shown[0], status) if shown is not None else status

    def _turns(self, asked: str) -> tuple[dict[str, str], ...]:
        """The steps so far as messages, then this step's (`asked`, after the last step's results)."""
        results = self._results(len(self.steps), self.steps[-1], full=True) if self.steps else ""
        return (*self.turns, {"role": "user", "content": "\n\n".join(filter(None, [results, asked]))})

    def _add_turns(self, done: _Step) -> None:
        """The finished step's message and answer join the history; past _HISTORY_CHARS, the
        history is rebuilt once with every step but the newest _FULL_STEPS cut."""
        number = len(self.steps)
        before = self._results(number - 1, self.steps[-2], full=number - 1 > self.cut_through) \
            if number > 1 else ""
        self._add_turn(before, done)
        if self.turn_chars <= _HISTORY_CHARS or number <= _FULL_STEPS:
            return
        self.cut_through = number - _FULL_STEPS
        self.turns, self.turn_chars = [], 0
        for index, step in enumerate(self.steps, 1):
            before = self._results(index - 1, self.steps[index - 2], full=index - 1 > self.cut_through) \
                if index > 1 else ""
            self._add_turn(before, step)

    def _add_turn(self, before: str, step: _Step) -> None:
        """A step's message (the results `before` it, then what it asked) and its answer."""
        asked, answer = "\n\n".join(filter(None, [before, step.asked])), self._answer_text(step)
        self.turns += [{"role": "user", "content": asked}, {"role": "assistant", "content": answer}]
        self.turn_chars += len(asked) + len(answer)

    def _results(self, number: int, step: _Step, *, full: bool) -> str:
        shown = [_same_output(o, step.same_as[i]) if step.same_as.get(i, 0) > self.cut_through else
                 o if full else cut(o, OLD_OUTPUT_CHARS) for i, o in enumerate(step.outputs)]
        return f"## Step {number}: what came back\n" + "\n".join(shown)

    @staticmethod
    def _answer_text(step: _Step) -> str:
        """The step's answer as the history shows it: a whole file written is cut (it is in
        the workspace), so it is not repeated in every later request; commands past
        MAX_COMMANDS (never run, and told so in the step's results) are left out, and the
        text is bounded like a step's output, so one huge answer cannot swell every later
        request. Worked out once per step (a rebuilt history shows every step again)."""
        if not step._shown:
            commands = [{**c, "args": shown_args(c["args"])} if isinstance(c.get("args"), dict) else c
                        for c in step.commands[:MAX_COMMANDS]]
            text = json.dumps({"thought": step.thought, "commands": commands}, ensure_ascii=False, separators=(",", ":"))
            step._shown = cut(text, MAX_STEP_OUTPUT_CHARS)
        return step._shown

    async def _ask(self, first: str, system: str, step: int, last: bool, asked: str) -> dict[str, Any]:
        """One step's answer; on the last step only `end` is offered (a grammar-bound model must
        finish), its first message still that of every step (so the prefix stays the same)."""
        offered = [self.tools[END]] if last else list(self.tools.values())
        spec = model_call(self.ctx, self.role_id, self.action_id, self.round, system=system,
                          prompt=first, kind="json", schema=self.last_schema if last else self.schema,
                          prompt_schema=self.schema if last else None, turns=self._turns(asked),
                          format="json", retries=self.action.max_retries, tool_step=step - 1,
                          commands=tuple((t.name, t.args) for t in offered))
        result = await call_gateway(self.ctx, spec)
        return dict(result.value)

    # -- one step -------------------------------------------------------------------------
    async def _run_step(self, step: int, current: _Step) -> Any:
        """Run the step's commands; the output value if an `end` was accepted."""
        calls = [(str(c.get("command_name", "")), c.get("args") if isinstance(c.get("args"), dict) else {})
                 for c in current.commands]
        calls, over = calls[:MAX_COMMANDS], calls[MAX_COMMANDS:]
        calls, dropped = self._exclusive_cut(calls)
        failed = False
        for group in self._groups(calls):
            if failed or self.builtins.human.stopped:
                why = "the person answered stop" if self.builtins.human.stopped else \
                    "an earlier command of this step failed"
                current.outputs += [f"{name} not run: {why}." for _, name, _ in group]
                continue
            if group[0][1] == END:
                value, problem = self._final(group[0][2])
                if not problem:
                    return value
                current.outputs.append(f"{END} refused: {problem}")
                failed = True
                continue
            outcomes = await gather_or_cancel([self._call(step, i, n, a) for i, n, a in group])
            for (_, name, _), outcome in zip(group, outcomes, strict=True):
                current.outputs.append(f"{name} failed: {outcome.output}" if outcome.error else
                                       f"{name}: {outcome.output}")
                failed = failed or outcome.error
                self.commands_run += 1
                self.commands_failed += bool(outcome.error)
        if dropped:
            current.outputs.append(dropped)
        if over:
            current.outputs.append(f"Not run, at most {MAX_COMMANDS} commands run per step: the other "
                                   f"{len(over):,} ({_tally(name for name, _ in over)}); give them again "
                                   "in a later step if they are still needed.")
        current.outputs = _within_step_limit(current.outputs)
        self._same_outputs(step, current)
        return _NOT_DONE

    def _same_outputs(self, step: int, current: _Step) -> None:
        """Note each long output that is, word for word, one an earlier step showed whole (a
        file read again, unchanged): the history shows it as a pointer to that step, not the
        text again in every later request. A model rereads files often; a 40-line file is
        about a thousand characters. `outputs` keep the text (stuck detection, the role's
        memory), and a pointer whose step is cut later shows the text again (`_results`)."""
        for index, output in enumerate(current.outputs):
            if len(output) < _SAME_OUTPUT_CHARS:
                continue
            earlier = self.outputs_shown.get(output)
            if earlier is not None and earlier > self.cut_through:
                current.same_as[index] = earlier
            else:
                self.outputs_shown[output] = step

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
        call = call_key(self.key, step, index, name, args)
        tool = self.tools.get(name)
        reused = False
        if tool is None:
            outcome = Outcome(f"command {name} not found; the commands are: {', '.join(self.tools)}", True)
        elif errors := answers.schema_errors(args, tool.args):
            outcome = Outcome("the arguments do not match the command's schema: " + "; ".join(errors), True)
        else:
            outcome, reused = await journaled_call(self.ctx, self.builtins, self.role_id, self.action_id, tool,
                                                   args, call, f"step {step}")
            if reused:
                self._reconcile(outcome)
            else:
                self._keep_files(outcome)
        self.ctx.emit(ToolCalled(round=self.round, role=self.role_id, action=self.action_id, step=step,
                                 tool=name, args=shown_args(args), output=outcome.output, call=call,
                                 error=outcome.error, reused=reused,
                                 seconds=round(time.monotonic() - started, 3)))
        return outcome

    def _reconcile(self, outcome: Outcome) -> None:
        """A journaled editor write: the file is written back if it is missing or changed."""
        for path, content in outcome.files.items():
            self.effects.files.append(self.ctx.workspace.write(path, content))

    def _keep_files(self, outcome: Outcome) -> None:
        self.effects.files += [WrittenFile(path, sha256_text(content), True)
                               for path, content in outcome.files.items()]


async def journaled_call(ctx: RunContext, builtins: Builtins, role_id: str, action_id: str, tool: Tool,
                         args: dict[str, Any], call: str, where: str) -> tuple[Outcome, bool]:
    """One command's outcome, and whether it came from the journal: a command that acts
    outside (journaled) is reused on resume, taken from the journal on replay (a missing one
    is a divergence), and journaled before anything uses it. A tool loop's step and a `kind:
    tool` action (engine/run/direct_tools.py) both call tools through here."""
    if tool.journaled and (stored := _stored(ctx, call)) is not None:
        builtins.restore(tool.name, stored)
        return stored, True
    if tool.journaled and ctx.gateway.replay:
        raise ReplayDivergence(
            f"replay diverged at action {action_id} (role {role_id}): the result of "
            f"{tool.name} ({where}) is not in the journal",
            hint="the SOP, its inputs or the engine changed since the run was recorded")
    if tool.journaled:   # it acts outside: the answers that asked for it are on disk first
        await durable(ctx.gateway.store)
    outcome = _capped(await _execute(ctx, builtins, tool, args, call))
    if tool.journaled:
        _record(ctx, action_id, call, outcome)
    return outcome, False


async def _execute(ctx: RunContext, builtins: Builtins, tool: Tool, args: dict[str, Any], call: str) -> Outcome:
    try:
        if tool.server is not None:
            return await ctx.mcp.call(tool, args)
        return await builtins.run(tool.name, args, call)
    except ToolError as exc:
        return Outcome(str(exc), error=True)
    except _FATAL:
        raise
    except asyncio.TimeoutError:
        return Outcome(f"{tool.name} timed out", error=True)
    except Exception as exc:  # noqa: BLE001 - any failure of a tool is the model's to read
        return Outcome(f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}", error=True)


def _stored(ctx: RunContext, call: str) -> Outcome | None:
    store = ctx.gateway.store
    stored = store.lookup(call) if store is not None else None
    if stored is None:
        return None
    try:
        return Outcome.from_json(json.loads(stored.text))
    except (ValueError, TypeError, AttributeError, RecursionError):
        return None


def _record(ctx: RunContext, action_id: str, call: str, outcome: Outcome) -> None:
    store = ctx.gateway.store
    if store is not None:   # journaled before the model sees it (or anything uses it)
        store.record(call, action_id, StoredAnswer(json.dumps(outcome.to_json(), ensure_ascii=False),
                                                   0, 0, 0.0, model=TOOL))


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower().replace("_", " "))


def call_key(action_key: str, step: int, index: int, name: str, args: dict[str, Any]) -> str:
    return sha256_text(json.dumps([TOOL, action_key, step, index, name, args], sort_keys=True,
                                  ensure_ascii=False, default=str))


def _nothing_new_since(done: list[tuple[str, tuple[str, ...]]], index: int) -> bool:
    """Every step after step `index` gave the commands of a step at or before it, and got the
    same back (a write of other content, or a changed output, is new)."""
    before = set(done[:index + 1])
    return all(step in before for step in done[index + 1:])


def _canonical(commands: list[dict[str, Any]]) -> str:
    """Commands as compared for a repeat: names and args, whatever their order of keys."""
    return json.dumps(commands, sort_keys=True, ensure_ascii=False, default=str)


def _within_step_limit(outputs: list[str]) -> list[str]:
    """The step's outputs, in order, until together they pass MAX_STEP_OUTPUT_CHARS; each one
    after is a line naming its command (its first words) and why it is not shown."""
    kept, used = [], 0
    for output in outputs:
        used += len(output)
        if used <= MAX_STEP_OUTPUT_CHARS or len(output) <= _ALWAYS_SHOWN_CHARS:
            kept.append(output)
            continue
        head = " ".join(output.split(":", 1)[0].split()[:3])
        kept.append(f"{head}: [output not shown: this step's outputs passed {MAX_STEP_OUTPUT_CHARS:,} "
                    "characters; ask for fewer or smaller results in one step]")
    return kept


_SAME_OUTPUT_CHARS = 200
"""An output this long, the same as one an earlier step showed whole, is a pointer to it."""


def _same_output(output: str, step: int) -> str:
    """`editor.read: the same output as at step 3, word for word (shown there)`."""
    name = output.split(":", 1)[0]
    return f"{name}: the same output as at step {step}, word for word (shown there)"


def _grown_plan(before: str, now: str) -> str:
    """`now` (a plan status: a line per task, then the current task's) as what it adds to
    `before` when its tasks are `before`'s, unchanged and in order, and then more; else whole."""
    old, new = before.splitlines()[:-1], now.splitlines()
    if not old or len(new) - 1 <= len(old) or new[:len(old)] != old:
        return now
    count = f"{len(old)} task{'s' * (len(old) > 1)}"
    return "\n".join([f"The {count} shown before, unchanged, then:", *new[len(old):]])


def shown_args(args: dict[str, Any]) -> dict[str, Any]:
    """A command's arguments as its ToolCalled event keeps them: a long text (a whole file
    given to editor.write) cut at MAX_OUTPUT_CHARS, so the journal does not hold the answer's
    text a second time; the answer itself, in full, is in the answers table."""
    if not any(isinstance(v, str) and len(v) > MAX_OUTPUT_CHARS for v in args.values()):
        return args
    return {k: (v[:MAX_OUTPUT_CHARS] + f" [... {len(v) - MAX_OUTPUT_CHARS} characters cut]"
                if isinstance(v, str) and len(v) > MAX_OUTPUT_CHARS else v) for k, v in args.items()}


def _capped(outcome: Outcome) -> Outcome:
    text = outcome.output
    if len(text) <= MAX_OUTPUT_CHARS:
        return outcome
    cut = (f"\n[output cut: {len(text) - MAX_OUTPUT_CHARS} more characters not shown (every output is cut "
           f"at {MAX_OUTPUT_CHARS}); to see the rest, ask for less at a time, e.g. a range of lines]")
    return replace(outcome, output=text[:MAX_OUTPUT_CHARS] + cut)
