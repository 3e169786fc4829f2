"""What a run needs to know about a file, decided once when it compiles: the `RunPlan`.

The checker and the run used to work these facts out each on its own (the run calling back
into `load/` and `check/`); now the compiler works them out once, from the checked spec, and
both read them here: `sopctl validate` prints `flags` after the diagnostics, `Team.check`
refuses on them, the run routes, offers tools and shows experience from them. Plain frozen
values (tuples, dicts, strings), so that a CompiledSop pickles into the on-disk cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.check.graph import reads_state, runners, send_to_for
from engine.check.references import address_problem, idea_addresses, known_addresses
from engine.load.catalog import (
    Command,
    expand_tools,
    flags_needed,
    mcp_hosts,
    read_experience,
    team_targets,
)
from engine.load.spec import (
    ActionSpec,
    ExecAction,
    LLMSpec,
    LlmAction,
    PromptedAction,
    Sop,
    ToolAction,
    tools_of,
)
from engine.templates.code import expression_text
from engine.templates.sandbox import TemplateFailure

__all__ = ["Experience", "Route", "RunPlan", "ToolPlan", "build_plan", "experience_unchanged"]


@dataclass(frozen=True)
class Experience:
    """One `experience` file of a tool-using action, read at compile time (confined to the
    SOP's folder, as always): its text, or why it cannot be read (the action fails with it)."""

    path: str
    text: str = ""
    error: str = ""


@dataclass(frozen=True)
class ToolPlan:
    """A tool-using action's `tools`, expanded: the built-in commands, and each MCP server
    with the tools it names (None: all the server offers), both in order."""

    commands: tuple[Command, ...] = ()
    servers: Mapping[str, tuple[str, ...] | None] = field(default_factory=dict)
    experience: tuple[Experience, ...] = ()


@dataclass(frozen=True)
class Route:
    """An action's `send_to` as one role sends it (its template items rendered with the role's
    vars), or the render's failure (never, for a file that compiled: the checker renders
    every pair; kept so the run still fails located if it did)."""

    send_to: tuple[str, ...] = ()
    error: str = ""
    by_state: tuple[int, ...] = ()
    """The items that read `state`: they stay templates here, rendered when the action publishes."""
    addresses: tuple[str, ...] = ()
    """Every address an item may give (when some item reads `state`): what the run checks it against."""


@dataclass(frozen=True)
class RunPlan:
    """The facts of a compiled file a run needs, each worked out once."""

    exec_actions: tuple[str, ...] = ()
    """Actions of kind exec some role runs (what `--allow-exec` unlocks), in file order."""
    flags: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """What the tools need from the command line: `--allow-exec` / `--allow-host` -> what
    needs it (what `sopctl validate` prints)."""
    replay_flags: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """The same for a replay (no tool runs, but the MCP servers start to list their tools)."""
    mcp_hosts: Mapping[str, str] = field(default_factory=dict)
    """HTTP MCP server some action uses -> its host (each needs `--allow-host HOST`)."""
    servers: Mapping[str, frozenset[str] | None] = field(default_factory=dict)
    """MCP server some role uses -> the tools actions name (None: all of them)."""
    tools: Mapping[str, ToolPlan] = field(default_factory=dict)
    """Tool-using action -> its expanded tools and experience."""
    team_targets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Role running a `team` tool -> whom `team.publish` may address (every other role, by name)."""
    routes: Mapping[tuple[str, str], Route] = field(default_factory=dict)
    """(action, role running it) -> the action's `send_to` as that role sends it."""
    idea_addresses: tuple[str, ...] = ()
    """What the idea may be sent to (`team.send_to`, `--send-to`): role ids, names, <all>."""
    templates: tuple[str, ...] = ()
    """Every template a run renders (prompts, systems, joins, artifacts, exec commands), each
    once: what `compile_path` compiles (CompiledSop.templates)."""
    expressions: tuple[str, ...] = ()
    """Every `for_each` and `when` expression (inside its braces), each once."""
    llm: Mapping[tuple[str, str], LLMSpec] = field(default_factory=dict)
    """(role, action it runs) -> the LLM settings the file declares for it, key by key from the
    action, else the role, else the file; `--model` and $SOPCTL_MODEL apply over it at run time
    (engine.models.registry.resolve_llm, the one model-choice rule)."""

    def idea_address_problem(self, address: str) -> tuple[str, str] | None:
        """(message, hint) when `--send-to` names no address the idea can go to."""
        return address_problem(list(self.idea_addresses), address)


def build_plan(spec: Sop, file: str) -> RunPlan:
    """The RunPlan of a checked spec; `file` (the SOP's path) locates its experience files."""
    run_by = runners(spec)
    tools = {aid: _tool_plan(spec, action, file) for aid, action in spec.actions.items()
             if tools_of(action)}
    return RunPlan(
        exec_actions=tuple(aid for aid, rids in run_by.items() if rids and spec.actions[aid].kind == "exec"),
        flags=_frozen_flags(flags_needed(spec)),
        replay_flags=_frozen_flags(flags_needed(spec, replay=True)),
        mcp_hosts=mcp_hosts(spec),
        servers=_servers(spec),
        tools=tools,
        team_targets=_team_targets(spec, tools, run_by),
        routes=_routes(spec, run_by),
        idea_addresses=tuple(idea_addresses(spec)),
        templates=_templates(spec),
        llm=_llm_settings(spec),
        expressions=tuple(dict.fromkeys(expression_text(e) for a in spec.actions.values()
                                        for e in (a.for_each, a.when, *a.set_.values()) if e)),
    )


def _templates(spec: Sop) -> tuple[str, ...]:
    """The texts of the file that are templates (plain text renders as itself: not these)."""
    found: list[str] = []
    for action in spec.actions.values():
        joined = [action.join.path or "", action.join.content or ""] if action.join else []
        command = action.command if isinstance(action, ExecAction) else []
        prompt = action.prompt if isinstance(action, PromptedAction) else ""
        system = (action.system or "") if isinstance(action, LlmAction) else ""
        args = [v for v in action.args.values() if isinstance(v, str)] if isinstance(action, ToolAction) else []
        found += [prompt, system, *joined, *command, action.content or "", *args,
                  *(text for a in action.artifacts for text in (a.path, a.content))]
    return tuple(dict.fromkeys(text for text in found if "{" in text or "\r" in text))


def _llm_settings(spec: Sop) -> dict[tuple[str, str], LLMSpec]:
    """Every (role, action) a role may run: its declared LLM settings, nearest layer first."""
    table: dict[tuple[str, str], LLMSpec] = {}
    for rid, role in spec.roles.items():
        for aid in role.runnable_actions():
            action = spec.actions[aid]
            layers = [layer for layer in (action.llm if isinstance(action, LlmAction) else None, role.llm, spec.llm)
                      if layer is not None]
            nearest = {key: next((value for layer in layers if (value := getattr(layer, key)) is not None), None)
                       for key in LLMSpec.model_fields}
            table[(rid, aid)] = LLMSpec(**{key: value for key, value in nearest.items() if value is not None})
    return table


def _frozen_flags(needs: dict[str, list[str]]) -> dict[str, tuple[str, ...]]:
    return {flag: tuple(users) for flag, users in needs.items()}


def _servers(spec: Sop) -> dict[str, frozenset[str] | None]:
    """Server -> the tools the actions some role runs name (None once one names them all)."""
    used: dict[str, frozenset[str] | None] = {}
    for role in spec.roles.values():
        for aid in role.runnable_actions():
            for server, tools in expand_tools(spec, tools_of(spec.actions[aid]))[1].items():
                known = used.get(server, frozenset())
                used[server] = None if tools is None or known is None else known | frozenset(tools)
    return used


def _tool_plan(spec: Sop, action: ActionSpec, file: str) -> ToolPlan:
    commands, servers = expand_tools(spec, tools_of(action))
    named = {server: None if tools is None else tuple(tools) for server, tools in servers.items()}
    experience = action.experience if isinstance(action, LlmAction) else []
    return ToolPlan(commands=tuple(commands), servers=named,
                    experience=tuple(_experience(file, rel) for rel in experience))


def _experience(file: str, rel: str) -> Experience:
    try:
        return Experience(rel, text=read_experience(file, rel).strip())
    except ValueError as exc:
        return Experience(rel, error=str(exc))


def experience_unchanged(plan: RunPlan, file: str) -> bool:
    """Whether every experience file still reads as it did at compile time: a compiled SOP
    kept across runs (in this process, or on disk) is reused only while this holds."""
    return all(_experience(file, e.path) == e for tool in plan.tools.values() for e in tool.experience)


def _team_targets(spec: Sop, tools: dict[str, ToolPlan], run_by: dict[str, list[str]]
                  ) -> dict[str, tuple[str, ...]]:
    """Role running a `team` tool -> whom it may address (only those: the list is every
    other role, quadratic in a big file)."""
    publishing = [aid for aid, tool in tools.items() if any(c.name == "team.publish" for c in tool.commands)]
    roles = dict.fromkeys(rid for aid in publishing for rid in run_by.get(aid, []))
    return {rid: tuple(team_targets(spec, rid)) for rid in spec.roles if rid in roles}


def _routes(spec: Sop, run_by: dict[str, list[str]]) -> dict[tuple[str, str], Route]:
    routes: dict[tuple[str, str], Route] = {}
    for aid, roles in run_by.items():
        for rid in roles:
            try:
                items = tuple(send_to_for(spec, aid, rid))
                by_state = tuple(i for i, item in enumerate(items) if reads_state(item))
                routes[(aid, rid)] = Route(items, by_state=by_state,
                                           addresses=tuple(known_addresses(spec)) if by_state else ())
            except TemplateFailure as exc:
                routes[(aid, rid)] = Route(error=str(exc))
    return routes
