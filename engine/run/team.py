"""The team: rounds over the environment until the run ends (MetaGPT `Team.run`).

A round runs every non-idle role once, concurrently; what the roles publish is collected and
published at the end of the round in file order, so the history is the same for the same
answers however the calls interleave. The run ends `idle` (the normal end), at
`max_rounds`, on `budget`, `failed` (an action failed after its retries), or `interrupted`;
`RunEnded` is emitted in every case, so an observer (the journal) can always close.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Sequence

from engine import __version__
from engine.compile.compiler import CompiledSop, locate_failure
from engine.load.catalog import missing_extras
from engine.errors import BudgetExceeded, Diagnostic, RunError, SopError, UsageError, format_failure, install_hint
from engine.templates.filters import reading_beside
from engine.templates.render import stop_renders_on_cancel
from engine.models.gateway import Gateway
from engine.models.hosted import REQUEST_SENT
from engine.models.registry import default_model, is_hosted, resolve_llm
from engine.models.types import Usage
from engine.run.actions import RunContext, warm_up
from engine.run.environment import Environment
from engine.run.events import (
    ActionCompleted,
    RoundStarted,
    RunEnded,
    RunEvent,
    RunJournal,
    RunObserver,
    RunStarted,
    RunLog,
    RunStatus,
)
from engine.load.catalog import BROWSER_FLAGS, search_host, uses_search
from engine.run.isolation import find_sandbox
from engine.run.mcp import McpServers
from engine.run.options import RunOptions
from engine.run.message import Message, user_requirement
from engine.run.input_files import copy_input_files
from engine.run.prompts import with_role_fields
from engine.run.people import NoPerson, Question, WaitingForPerson, waiting_summary
from engine.run.role import Role
from engine.run.state import SharedState
from engine.run.direct_tools import run_direct_tool
from engine.run.toolloop import run_tool_loop
from engine.run.tools.browser import browser_problem
from engine.run.workspace import Workspace

__all__ = ["RunResult", "Team", "new_run_id", "exec_actions"]


def new_run_id() -> str:
    """`YYYYMMDD-HHMMSS-<6 hex>` in UTC: sortable, and unique without coordination."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


@dataclass
class RunResult:
    """How a run ended, what it cost, and what it made (contract §6, plus the messages)."""

    run_id: str
    status: RunStatus
    rounds: int
    usage: Usage                   # this invocation's: paid and reused answers, retries, re-asks
    workspace: str
    artifacts: list[str]
    messages: list[Message] = field(default_factory=list)
    error: str = ""
    diagnostic: Diagnostic | None = None
    """Where a failed run failed in the SOP file (`file:line:col`), when the failure names a place."""
    waiting_for: Question | None = None
    """Status `waiting`: the question a person must answer (`sopctl answer`) before a resume."""
    state: dict[str, Any] = field(default_factory=dict)
    """The shared state (the file's `state:`) at the run's end; empty when it declares none."""

    @property
    def history(self) -> list[dict[str, Any]]:
        return [m.summary() for m in self.messages]

    # the contract's names for the usage it reports
    @property
    def llm_calls(self) -> int:
        return self.usage.llm_calls

    @property
    def reused_calls(self) -> int:
        return self.usage.reused_calls

    @property
    def prompt_tokens(self) -> int:
        return self.usage.prompt_tokens

    @property
    def completion_tokens(self) -> int:
        return self.usage.completion_tokens

    @property
    def cost_usd(self) -> float:
        return self.usage.cost_usd

    def to_json(self) -> dict[str, Any]:
        """The one object `sopctl run --format json` prints."""
        data = {
            "status": self.status, "rounds": self.rounds, "llm_calls": self.llm_calls,
            "reused_calls": self.reused_calls, "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens, "cached_tokens": self.usage.cached_tokens,
            "cost_usd": round(self.cost_usd, 6), "workspace": self.workspace, "artifacts": self.artifacts, "history": self.history,
            "run_id": self.run_id, "retries": self.usage.retries, "reasks": self.usage.reasks,
        }
        if self.error:
            data["error"] = self.error
        if self.waiting_for is not None:
            data["waiting_for"] = waiting_summary(self.waiting_for.to_json())
        if self.state:
            data["state"] = self.state
        return data


def exec_actions(compiled: CompiledSop) -> list[str]:
    """Actions of kind exec that some role can run (what `--allow-exec` unlocks)."""
    return list(compiled.plan.exec_actions)


def idea_addresses(compiled: CompiledSop, override: Sequence[str]) -> list[str]:
    """Where the idea goes: `--send-to` when given (checked as the file's `team.send_to` is),
    else the file's `team.send_to` (default <all>)."""
    for address in override:
        problem = compiled.plan.idea_address_problem(address)
        if problem:
            message, hint = problem
            raise UsageError(f"--send-to: {message}", hint=hint)
    return list(override or compiled.spec.team.send_to)


class Team:
    """One run of a compiled SOP; `await Team(...).run()` returns its RunResult."""

    def __init__(self, compiled: CompiledSop, inputs: dict[str, Any], options: RunOptions) -> None:
        self.inputs = dict(inputs)
        self.options = options
        self.observers: list[RunObserver] = list(options.observers)   # the journal joins first
        self.run_id = options.run_id or new_run_id()
        compiled = with_role_fields(compiled, self.inputs, self.run_id)   # profile, goal... as this run says
        self.compiled = compiled
        self.max_rounds = options.max_rounds or compiled.spec.team.max_rounds
        budget = options.budget_usd
        self.budget = compiled.spec.team.budget_usd if budget is None else budget
        root = options.workspace or Path("runs") / self.run_id
        self.workspace = Workspace(root)
        self._artifacts: dict[str, str] = {}
        gateway = options.gateway or Gateway(store=options.store, replay=options.replay,
                                             api_base=options.api_base,
                                             response_format=options.response_format)
        gateway.budget_usd = self.budget  # the gateway is the one place the budget is checked
        if options.max_answer_chars is not None:
            gateway.max_answer_chars = options.max_answer_chars
        gateway.reuse_identical = gateway.reuse_identical or options.reuse_identical
        gateway.emit = self._emit         # its attempts, retries and re-asks are run events
        gateway.warn = lambda message, spec: self._emit(RunLog(
            round=spec.round, level="warning", role=spec.role, action=spec.action, message=message))
        self.ctx = RunContext(compiled=compiled, inputs=self.inputs, run_id=self.run_id,
                              workspace=self.workspace, gateway=gateway, emit=self._emit,
                              model_override=options.model, price=options.price,
                              allow_exec=options.allow_exec,
                              person=options.person or NoPerson(), pool=options.pool,
                              tool_loop=run_tool_loop, allow_hosts=tuple(options.allow_hosts),
                              allow_network=options.allow_network,
                              shared=SharedState(compiled.spec) if compiled.spec.state else None,
                              direct_tool=run_direct_tool)
        self.roles = [Role(rid, self.ctx) for rid in compiled.spec.roles]
        self.env = Environment(self.roles, self._emit, public_chat=compiled.spec.team.public_chat)
        self.idea_to = idea_addresses(compiled, options.send_to)
        self.rounds = 0
        self.failure: Diagnostic | None = None
        self.waiting_for: Question | None = None
        self._unisolated = ""
        """Why commands run outside a sandbox though none was refused (told when it starts)."""

    def check(self) -> None:
        """Refuse to start (before any model call, journal or file of the run): exec or a
        host not allowed, `--isolate` that cannot work here, a model that cannot work (e.g.
        `local` without its extra), a workspace that cannot be made. `engine.api.prepare`
        calls it once, so every front end fails fast; a Team made by hand calls it before
        `run` (which only starts: it refuses nothing)."""
        needing = exec_actions(self.compiled)
        if needing and not self.options.allow_exec:
            raise RunError(f"this SOP runs commands; actions of kind exec need --allow-exec: "
                           f"{', '.join(needing)}",
                           hint="read what they run first; then pass --allow-exec")
        self._check_tool_flags()
        runs_commands = self.options.allow_exec and bool(
            needing or "--allow-exec" in (self.compiled.plan.replay_flags if self.options.replay
                                          else self.compiled.plan.flags))
        self._check_network_flag(runs_commands)
        self._choose_sandbox(runs_commands)
        preflight = getattr(self.ctx.gateway, "preflight", None)
        if preflight is not None and not self.options.replay:
            for model in self.models():
                preflight(model)
        self.workspace.create()

    def _check_network_flag(self, runs_commands: bool) -> None:
        """`--allow-network` must mean something: isolated commands or the browser."""
        isolate = self.options.isolate
        if not self.options.allow_network or BROWSER_FLAGS in self.compiled.plan.flags:
            return
        if isolate is False:
            raise RunError("--allow-network only applies with --isolate or to the browser tool, "
                           "not with --no-isolate",
                           hint="with --no-isolate commands already have the network")
        if isolate is None and not runs_commands:
            raise RunError("--allow-network only applies with --isolate or to the browser tool: "
                           "this run starts no command and no browser",
                           hint="drop --allow-network")

    def _choose_sandbox(self, runs_commands: bool) -> None:
        """Where commands run: `--isolate` needs bubblewrap (refused without it); by default it
        is used wherever it works (else commands run as the user, with a warning when the run
        starts); `--no-isolate` never uses it. A run that starts no command probes nothing."""
        isolate = self.options.isolate
        if isolate:
            self.ctx.sandbox = find_sandbox(self.options.allow_network)
        elif isolate is None and runs_commands:
            try:
                self.ctx.sandbox = find_sandbox(self.options.allow_network)
            except RunError as exc:
                self._unisolated = exc.message.removeprefix("--isolate: ").replace(
                    "--isolate needs", "isolation needs")

    def _check_tool_flags(self) -> None:
        """Tools that run commands or reach a host need the user's flag, before anything runs."""
        plan = self.compiled.plan
        needs = plan.replay_flags if self.options.replay else plan.flags
        if "--allow-exec" in needs and not self.options.allow_exec:
            raise RunError("this SOP's tools run commands; they need --allow-exec: "
                           + ", ".join(needs["--allow-exec"]),
                           hint="read what they run first; then pass --allow-exec")
        missing = {} if self.options.replay else missing_extras(self.compiled.spec)   # a replay runs no tool
        for extra, users in missing.items():
            raise RunError(f"this SOP's tools need the `{extra}` extra, which is not installed: {', '.join(users)}",
                           hint=install_hint(extra))
        hosts = {} if self.options.replay else plan.mcp_hosts   # a replay's servers: _start_mcp
        refused = [f"{host} (mcp server {name})" for name, host in hosts.items()
                   if host not in self.options.allow_hosts]
        if refused:
            raise RunError("this SOP's MCP servers reach hosts; each needs --allow-host HOST: "
                           + ", ".join(refused), hint="pass --allow-host for each host you trust")
        spec = self.compiled.spec
        if not self.options.replay and uses_search(spec) and search_host(spec) not in self.options.allow_hosts:
            raise RunError(f"this SOP's search endpoint is at {search_host(spec)}; it needs --allow-host "
                           f"{search_host(spec)}", hint="pass --allow-host for each host you trust")
        if BROWSER_FLAGS in needs:
            self._check_browser(needs[BROWSER_FLAGS])

    def _check_browser(self, users: Sequence[str]) -> None:
        """The browser reaches hosts no file names: the user names them, and it must be able to start."""
        if not (self.options.allow_network or self.options.allow_hosts):
            raise RunError("this SOP's browser reaches the web; it needs --allow-network (every host) or "
                           "--allow-host HOST (those hosts): " + ", ".join(users),
                           hint="pass --allow-host for each host you trust")
        problem = browser_problem()
        if problem is not None:
            raise RunError(f"{problem[0]}: {', '.join(users)}", hint=problem[1])

    def attach(self, journal: RunJournal) -> None:
        """Plug a journal in: it observes every event and stores every model answer."""
        self.observers.insert(0, journal)
        if self.ctx.gateway.store is None:
            self.ctx.gateway.store = journal
        for role in self.roles:
            role.completed = journal

    def models(self) -> list[str]:
        """Every model this run may call, resolved (registry.choose_model: action > `--model` > env > role > file)."""
        spec = self.compiled.spec
        found = {resolve_llm(self.compiled, rid, aid, self.options.model)["model"]
                 for rid, role in spec.roles.items()
                 for aid in role.runnable_actions()
                 if not (role.human or spec.actions[aid].kind in ("ask", "reply", "compute", "tool"))}  # no model
        return sorted(found)

    async def run(self) -> RunResult:
        """Run until the end; every way of ending gives a result and emits RunEnded.
        The team is checked already (`check`): this starts it."""
        if self.options.isolate and self.ctx.sandbox is None:   # never run unisolated by mistake
            raise UsageError("--isolate: Team.check finds the sandbox; call it before run")
        self.inputs = copy_input_files(self.compiled, self.inputs, self.workspace)
        self.ctx.inputs = self.inputs
        self._warm_up()
        self._emit(self._started())
        if self._unisolated:
            self._emit(RunLog(round=0, level="warning", message=(
                f"commands run as you, outside a sandbox: {self._unisolated}; they can read your "
                "files and sopctl's environment (its keys), and write anywhere you can "
                "(--no-isolate says you mean it; --isolate refuses to run without a sandbox)")))
        # Anything that escapes below (KeyboardInterrupt, SystemExit) ends the run as interrupted.
        status, error = RunStatus.INTERRUPTED, "interrupted"
        try:
            await self._start_mcp()
            self.env.publish(user_requirement(str(self.inputs.get("idea", "")), self.idea_to))
            with stop_renders_on_cancel(), reading_beside(self.compiled.file):   # file() reads beside the SOP
                status, error = await self._loop(), ""
        except WaitingForPerson as exc:
            self.waiting_for = exc.question
            status, error = RunStatus.WAITING, str(exc)
        except BudgetExceeded as exc:
            status, error = RunStatus.BUDGET, str(exc)
        except SopError as exc:  # located like a checker diagnostic when it names its place
            self.failure = locate_failure(self.compiled, exc)
            status, error = RunStatus.FAILED, format_failure(self.failure) if self.failure else str(exc)
        except asyncio.CancelledError:
            status, error = RunStatus.INTERRUPTED, "interrupted"
        except Exception as exc:  # noqa: BLE001 - a bug must still end the run as failed
            status, error = RunStatus.FAILED, f"internal error: {type(exc).__name__}: {exc}"
        finally:
            await self.ctx.sessions.close()   # the roles' shells and kernels end with the run
            if self.ctx.mcp is not None:
                await self.ctx.mcp.close()
            if self.ctx.browsers is not None:
                await self.ctx.browsers.close()
            self._end(status, error)
        return self._result(status, error)

    def _warm_up(self) -> None:
        """The run's one-time costs, overlapping the first call; with a hosted model, after its
        first request is sent (the CPU is idle while its answer is waited for)."""
        own = getattr(self.ctx.gateway, "providers", {})
        hosted = not self.options.replay and any(is_hosted(m) and m not in own for m in self.models())
        warm_up(self.compiled, REQUEST_SENT if hosted else None)

    async def _start_mcp(self) -> None:
        """Start the MCP servers some action uses and learn their tools (before any model call)."""
        if self.compiled.plan.servers:
            self.ctx.mcp = McpServers(self.compiled, self.ctx.gateway.store, replay=self.options.replay)
            if self.options.replay:
                self._check_unjournaled_servers(self.ctx.mcp)
            await self.ctx.mcp.start()

    def _check_unjournaled_servers(self, servers: McpServers) -> None:
        """A replay starts no MCP server whose tool list the journal holds; one recorded before
        sopctl journaled them is started, and needs the flags a run needs."""
        spec = self.compiled.spec
        for name in self.compiled.plan.servers:
            server = spec.mcp[name]
            if servers.journaled(name) is not None:
                continue
            if server.command and not self.options.allow_exec:
                raise RunError(f"the journal has no tool list of MCP server {name} (recorded by an older "
                               "sopctl): the replay must start it, and that needs --allow-exec",
                               hint="read what it runs first; then pass --allow-exec")
            host = self.compiled.plan.mcp_hosts.get(name)
            if host and host not in self.options.allow_hosts:
                raise RunError(f"the journal has no tool list of MCP server {name} (recorded by an older "
                               f"sopctl): the replay must reach it, and that needs --allow-host {host}",
                               hint="pass --allow-host for each host you trust")

    async def _loop(self) -> RunStatus:
        while True:
            active = self.env.active_roles()
            if not active:
                self._explain_nothing_made()
                return RunStatus.IDLE
            if self.rounds >= self.max_rounds:
                return RunStatus.MAX_ROUNDS
            self.rounds += 1
            self._emit(RoundStarted(round=self.rounds, active_roles=[r.id for r in active]))
            await self._round(active)

    async def _round(self, active: list[Role]) -> None:
        """Run the active roles concurrently; publish in file order; the first failure wins."""
        tasks = [asyncio.ensure_future(role.run(self.rounds)) for role in active]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            pending = [t for t in tasks if not t.done()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for task in tasks:  # finished roles' work is published even if another failed
                if not task.cancelled() and task.exception() is None:
                    for message in task.result():
                        self.env.publish(message)
            if self.ctx.shared is not None:   # the round's state changes, in file order, as its messages
                self.ctx.shared.commit(r.id for r in self.roles)
        failure = next((t.exception() for t in tasks if not t.cancelled() and t.exception()), None)
        if failure is not None:
            raise failure
        if any(t.cancelled() for t in tasks):
            raise asyncio.CancelledError()

    def _explain_nothing_made(self) -> None:
        """A run that ends idle with no file written, though its actions were meant to write
        some, says why: which roles never ran (no message reached them)."""
        spec = self.compiled.spec
        writers = [aid for aid, action in spec.actions.items()
                   if getattr(action, "artifacts", None) or any(
                       t == "editor" or t.startswith("editor.") for t in getattr(action, "tools", []))]
        if self._artifacts or not writers or self.options.store is not None:   # a resume: said at the run
            return
        idle = [role.id for role in self.roles if not role.runs]
        why = (f"{', '.join(idle)} never ran: no message reached them" if idle else
               "every role ran, but none of them wrote one")
        leader = spec.role_at(spec.team.leader)
        if idle and leader is not None and leader not in idle:   # MGX: only the leader's tasks wake them
            why += f" (the team leader, {leader}, assigned no task)"
        self._emit(RunLog(round=self.rounds, level="notice", message=(
            f"the run ended with no files written, though {', '.join(writers)} can write them: {why}")))

    def _emit(self, event: RunEvent) -> None:
        if isinstance(event, ActionCompleted):
            for artifact in event.artifacts:
                self._artifacts[artifact["path"]] = artifact["sha256"]
        for observer in self.observers:
            observer.on_event(event)

    def _started(self) -> RunStarted:
        spec = self.compiled.spec
        model = default_model(self.compiled, self.options.model)
        return RunStarted(run_id=self.run_id, sop_file=self.compiled.file, sop_name=spec.name,
                          sop_hash=self.compiled.source_hash, inputs=dict(self.inputs),
                          model=model, engine_version=__version__,
                          workspace=str(self.workspace.root), max_rounds=self.max_rounds,
                          budget_usd=self.budget, send_to=list(self.options.send_to),
                          reuse_identical=self.ctx.gateway.reuse_identical)

    def _end(self, status: RunStatus, error: str) -> None:
        try:
            shared = dict(self.ctx.shared.values) if self.ctx.shared is not None else {}
            self._emit(RunEnded(status=status, rounds=self.rounds, error=error, shared=shared))
        except Exception:  # noqa: BLE001 - a broken observer must not hide how the run ended
            pass

    def _result(self, status: RunStatus, error: str) -> RunResult:
        # the gateway's usage counts failed attempts too: they were paid
        return RunResult(run_id=self.run_id, status=status, rounds=self.rounds,
                         usage=self.ctx.gateway.usage, workspace=str(self.workspace.root),
                         artifacts=sorted(self._artifacts),
                         messages=list(self.env.history), error=error, diagnostic=self.failure,
                         waiting_for=self.waiting_for,
                         state=dict(self.ctx.shared.values) if self.ctx.shared is not None else {})
