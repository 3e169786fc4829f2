"""The references phase: every name an SOP uses (actions, roles, addresses, inputs) resolves.

Each rule is a small generator (listed in `RULES`, run by `check.phases`); it yields unlocated diagnostics
(a JSON pointer, a code, a message saying what was expected, a hint) and never computes a
position — the compiler resolves pointers in one place. A template check may set `line` to
the line *inside the template*; the compiler turns it into a file line.

The compiler stops after a phase with an error, so a later phase's rules may assume that
every reference checked here is valid.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from engine.check.rules import Context, error, rule, unknown, warning
from engine.errors import Diagnostic, did_you_mean
from engine.load import patterns
from engine.load.outputs import TypeSyntaxError, parse_type
from engine.load.secrets import is_secret_name
from engine.load.source import escape_pointer, join_pointer
from engine.load.spec import (
    SPECIAL_ADDRESSES,
    USER_REQUIREMENT,
    AnsweredAction,
    ExecAction,
    OutputNode,
    Sop,
    is_template,
    output_of,
)

# ---------------------------------------------------------------- references

__all__ = ["RULES", "address_problem", "idea_address_problem", "idea_addresses", "known_addresses"]


@rule("SOP107", "SOP109")
def node_types(ctx: Context) -> Iterator[Diagnostic]:
    """Every output node's `type` must parse (and `children` only go with no type or `list`)."""
    for aid, action in ctx.spec.actions.items():
        output = output_of(action)
        if not isinstance(output, dict):
            continue
        for pointer, node in _nodes(output, f"/actions/{aid}/output"):
            kind = (node.type or "").strip()
            if node.children is not None:
                if kind not in ("", "list"):
                    yield error("SOP107", pointer + "/type", f"a node with children has type '{kind}'",
                                "leave `type` out for an object, or write `type: list` for a list of objects")
                continue
            try:
                parse_type(node.type or "str")
            except TypeSyntaxError as exc:
                yield error("SOP107", pointer + "/type", str(exc), did_you_mean(kind, _TYPE_WORDS))
            if node.pattern is not None:
                yield from _pattern_problem(pointer + "/pattern", node.pattern)


def _pattern_problem(pointer: str, pattern: str) -> Iterator[Diagnostic]:
    """A pattern must compile with RE2, the linear-time engine every answer is matched with."""
    problem = patterns.problem(pattern)
    if problem is not None:
        yield error("SOP109", pointer, str(problem), problem.hint)


_TYPE_WORDS = ["str", "int", "float", "bool", "list[str]", "dict[str, str]", "optional[str]"]


def _nodes(tree: dict[str, OutputNode], pointer: str) -> Iterator[tuple[str, OutputNode]]:
    for key, node in tree.items():
        here = join_pointer(pointer, key)
        yield here, node
        if node.children:
            yield from _nodes(node.children, here + "/children")


@rule("SOP201", "SOP211")
def role_actions(ctx: Context) -> Iterator[Diagnostic]:
    """Role `actions` name defined actions; an action no role runs is dead weight."""
    known = list(ctx.spec.actions)
    used: set[str] = set()
    for rid, role in ctx.spec.roles.items():
        for i, aid in enumerate(role.actions):
            used.add(aid)
            if aid not in ctx.spec.actions:
                yield error("SOP201", f"/roles/{rid}/actions/{i}", *unknown("action", aid, known))
        used.update(role.runnable_actions())
    for aid in known:
        if aid not in used and aid != USER_REQUIREMENT:
            yield warning("SOP211", f"/actions/{aid}", f"action '{aid}' is run by no role",
                          "add it to a role's `actions`, or delete it")


@rule("SOP202")
def watches(ctx: Context) -> Iterator[Diagnostic]:
    """`watch` names actions (message types) or UserRequirement."""
    known = dict.fromkeys([USER_REQUIREMENT, *ctx.spec.actions])  # ordered, O(1) lookups
    for rid, role in ctx.spec.roles.items():
        for i, aid in enumerate(role.watch):
            if aid not in known:
                message, hint = unknown("action", aid, list(known))
                if aid in ctx.spec.roles:
                    hint = f"'{aid}' is a role; watch one of the actions it runs"
                yield error("SOP202", f"/roles/{rid}/watch/{i}", f"watches {message}", hint)


def _addresses(spec: Sop) -> list[str]:
    names = [spec.role_name(rid) for rid in spec.roles]
    return list(dict.fromkeys([*spec.roles, *names]))


def known_addresses(spec: Sop) -> dict[str, None]:
    """Every address a `send_to` item may name, in order: role ids and names, then the specials."""
    return dict.fromkeys([*_addresses(spec), *SPECIAL_ADDRESSES])


@rule("SOP203")
def send_to(ctx: Context) -> Iterator[Diagnostic]:
    """`send_to` names roles (id or name) or one of <all>, <self>, <none> (a template item is
    checked per role by `templates.send_to_templates`)."""
    known = known_addresses(ctx.spec)
    for aid, action in ctx.spec.actions.items():
        for i, address in enumerate(action.send_to):
            if address not in known and not is_template(address):
                message, hint = unknown("address", address, list(known))
                yield error("SOP203", f"/actions/{aid}/send_to/{i}", message,
                            hint if "did you mean" in hint else
                            f"a role id or name, or <all>, <self>, <none>; {hint}")
        if "<none>" in action.send_to and len(action.send_to) > 1:
            yield error("SOP203", f"/actions/{aid}/send_to", "<none> cannot be combined with other addresses")


IDEA_ADDRESSES = ("<all>",)
"""The special address the idea may have besides role ids and names (no sender: no <self>)."""


def idea_addresses(spec: Sop) -> list[str]:
    """Every address the idea may be sent to: role ids and names, then <all>."""
    return [*_addresses(spec), *IDEA_ADDRESSES]


def idea_address_problem(spec: Sop, address: str) -> tuple[str, str] | None:
    """(message, hint) when `address` is not one the idea can be sent to: a role id or name,
    or <all>; one rule for the file's `team.send_to` and `sopctl run --send-to` (which the
    compiled RunPlan checks with `address_problem` over the same list)."""
    return address_problem(idea_addresses(spec), address)


def address_problem(known: list[str], address: str) -> tuple[str, str] | None:
    """(message, hint) when `address` is none of the idea's `known` addresses."""
    if address in known:
        return None
    message, hint = unknown("address", address, known)
    return message, hint if "did you mean" in hint else f"a role id or name, or <all>; {hint}"


@rule("SOP203")
def idea_send_to(ctx: Context) -> Iterator[Diagnostic]:
    """`team.send_to` (the idea's addresses) names roles (id or name) or <all>."""
    for i, address in enumerate(ctx.spec.team.send_to):
        problem = idea_address_problem(ctx.spec, address)
        if problem:
            yield error("SOP203", f"/team/send_to/{i}", *problem)


@rule("SOP203")
def team_leader(ctx: Context) -> Iterator[Diagnostic]:
    """`team.leader` names a role (id or name)."""
    leader = ctx.spec.team.leader
    if leader is not None and ctx.spec.role_at(leader) is None:
        message, hint = unknown("role", leader, _addresses(ctx.spec))
        yield error("SOP203", "/team/leader", f"team.leader: {message}",
                    hint if "did you mean" in hint else f"a role id or name; {hint}")


@rule("SOP204")
def contexts(ctx: Context) -> Iterator[Diagnostic]:
    """A list `context` names actions or UserRequirement."""
    known = dict.fromkeys([USER_REQUIREMENT, *ctx.spec.actions])
    for aid, action in ctx.spec.actions.items():
        if not isinstance(action, AnsweredAction) or isinstance(action.context, str):
            continue
        for i, name in enumerate(action.context):
            if name not in known:
                message, hint = unknown("action", name, list(known))
                yield error("SOP204", f"/actions/{aid}/context/{i}", f"context names {message}", hint)


@rule("SOP205", "SOP206", "SOP208")
def planners(ctx: Context) -> Iterator[Diagnostic]:
    """plan_and_act needs a planner whose two actions exist; a planner elsewhere is ignored."""
    known = list(ctx.spec.actions)
    for rid, role in ctx.spec.roles.items():
        pointer = f"/roles/{rid}"
        if role.react_mode == "plan_and_act" and role.planner is None:
            yield error("SOP206", pointer + "/react_mode", "react_mode plan_and_act needs a `planner`",
                        "add `planner: {action: WritePlan, task_action: ExecuteTask}`")
        if role.planner is None:
            continue
        if role.react_mode != "plan_and_act":
            yield warning("SOP208", pointer + "/planner",
                          f"`planner` is ignored: react_mode is {role.react_mode}",
                          "set `react_mode: plan_and_act`, or remove the planner")
        if role.planner.task_action is None and not role.planner.task_actions:
            yield error("SOP206", pointer + "/planner", "the planner names no action to run its tasks",
                        "add `task_action: ExecuteTask`, or `task_actions: {TYPE: ACTION}` by task type")
        for key, aid in _planner_references(role.planner):
            if aid not in ctx.spec.actions:
                yield error("SOP205", f"{pointer}/planner/{key}", *unknown("action", aid, known))


def _planner_references(planner: Any) -> Iterator[tuple[str, str]]:
    """(pointer below the planner, action id) of every action a planner names."""
    yield "action", planner.action
    if planner.task_action:
        yield "task_action", planner.task_action
    for task_type, mapped in planner.task_actions.items():
        where = f"task_actions/{escape_pointer(task_type)}"
        if isinstance(mapped, str):
            yield where, mapped
        else:
            yield from ((f"{where}/{i}", aid) for i, aid in enumerate(mapped))


@rule("SOP207")
def plan_shape(ctx: Context) -> Iterator[Diagnostic]:
    """A planner action's output must be a plan: `tasks`, a list of task objects."""
    for role in ctx.spec.roles.values():
        aid = role.planner.action if role.planner else None
        if aid is None or role.planner is None or aid not in ctx.spec.actions:
            continue
        seen = (aid, role.planner.task_action, *role.planner.task_actions)  # report a shared plan once
        if seen in ctx.cache.setdefault("plans", set()):
            continue
        ctx.cache["plans"].add(seen)
        problem = _plan_problem(output_of(ctx.spec.actions[aid]), role.planner)
        if problem:
            typed = ", task_type: {type: str}" if role.planner.task_actions else ""
            yield error("SOP207", f"/actions/{aid}/output", f"planner action '{aid}' does not output a plan: {problem}",
                        "give it `tasks: {type: list, children: {task_id: {type: str}, "
                        f"dependent_task_ids: {{type: list[str]}}, instruction: {{type: str}}{typed}}}}}`")


_TASK_FIELDS = {"task_id": "str", "dependent_task_ids": "list[str]", "instruction": "str"}


def _plan_problem(output: Any, planner: Any) -> str:
    """What keeps `output` from being a plan for `planner` ('' if nothing)."""
    if not isinstance(output, dict):
        return "its output is not a tree of nodes"
    tasks = output.get("tasks")
    if tasks is None:
        return "its output tree has no key `tasks`"
    if tasks.children is None or (tasks.type or "").strip() != "list":
        return "`tasks` must be `type: list` with `children`"
    for key, kind in _TASK_FIELDS.items():
        node = tasks.children.get(key)
        if node is None:
            return f"a task has no `{key}`"
        if node.children is not None or re.sub(r"\s", "", node.type or "str") != kind:
            return f"a task's `{key}` must be of type {kind}"
    return _task_type_problem(tasks.children.get("task_type"), planner) if planner.task_actions else ""


def _task_type_problem(node: OutputNode | None, planner: Any) -> str:
    """`task_actions` needs a task_type on every task; an enum of it may offer only the
    planner's types (unless `task_action` runs the others)."""
    if node is None or node.children is not None:
        return ("a task has no `task_type` (a value such as "
                f"`{{type: 'enum[{'|'.join(planner.task_actions)}]'}}`), which `task_actions` needs")
    try:
        offered = parse_type(node.type or "str").get("enum", [])
    except TypeSyntaxError:
        return ""  # SOP107 reports it
    unknown_types = [t for t in offered if t not in planner.task_actions]
    if unknown_types and planner.task_action is None:
        return (f"its task_type offers {', '.join(repr(t) for t in unknown_types)}, which no "
                f"entry of `task_actions` runs (types: {', '.join(planner.task_actions)})")
    return ""


@rule("SOP214")
def exec_actions(ctx: Context) -> Iterator[Diagnostic]:
    """An exec action's `env` name that looks like a key hands the user's secret to the command
    (`command` and `env` are keys of kind exec only: the models refuse them elsewhere)."""
    for aid, action in ctx.spec.actions.items():
        if not isinstance(action, ExecAction):
            continue
        for index, name in enumerate(action.env):
            if is_secret_name(name):
                yield warning("SOP214", f"/actions/{aid}/env/{index}",
                              f"`env` gives the command the user's secret {name}",
                              "a command from a shared file can copy it anywhere; "
                              "drop the name unless the command truly needs that key")


@rule("SOP210")
def addresses_unique(ctx: Context) -> Iterator[Diagnostic]:
    """Two roles with one address would make `send_to` ambiguous."""
    owner: dict[str, str] = {rid: f"the id of role '{rid}'" for rid in ctx.spec.roles}
    for rid in ctx.spec.roles:
        name = ctx.spec.role_name(rid)
        if name == rid:
            continue
        if name in owner:
            yield error("SOP210", f"/roles/{rid}/name", f"role name '{name}' is already {owner[name]}",
                        "give each role a distinct name")
        owner.setdefault(name, f"the name of role '{rid}'")


@rule("SOP212")
def builtin_ids(ctx: Context) -> Iterator[Diagnostic]:
    """UserRequirement is the built-in first message; a file may not redefine it."""
    if USER_REQUIREMENT in ctx.spec.actions:
        yield error("SOP212", f"/actions/{USER_REQUIREMENT}", f"'{USER_REQUIREMENT}' is built in",
                    "choose another action id")


@rule("SOP213")
def input_defaults(ctx: Context) -> Iterator[Diagnostic]:
    """An input's default must have the input's type."""
    kinds = {"str": (str,), "file": (str,), "int": (int,), "float": (int, float), "bool": (bool,)}
    for name, spec in ctx.spec.inputs.items():
        default = spec.default
        if default is None:
            continue
        wrong_bool = isinstance(default, bool) and spec.type != "bool"
        if wrong_bool or not isinstance(default, kinds[spec.type]):
            yield error("SOP213", f"/inputs/{name}/default",
                        f"default {default!r} is not of the input's type {spec.type}",
                        "quote it to make it a string" if spec.type == "str" else "")


RULES = (node_types, role_actions, watches, send_to, idea_send_to, team_leader, contexts, planners, plan_shape, exec_actions, addresses_unique, builtin_ids, input_defaults)
"""This phase's rules, in the order they run."""
