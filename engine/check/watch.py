"""The watch-graph phase: loops are bounded, every role can be reached, every output is used."""

from __future__ import annotations

from collections.abc import Iterator

from engine.check.graph import (
    action_node,
    delivered,
    reachable_roles,
    runners,
    send_targets,
    unbounded_cycles,
)
from engine.check.rules import Context, error, rule, warning
from engine.check.template_rules import read_by_templates
from engine.errors import Diagnostic, Related
from engine.load.spec import USER_REQUIREMENT, ActionSpec, AnsweredAction, Sop

__all__ = ["RULES"]


@rule("SOP301")
def bounded_loops(ctx: Context) -> Iterator[Diagnostic]:
    """Every loop of activations must pass an action with `max_runs`, unless the file's own
    `team.max_rounds` bounds the run (graph.bounding_rounds)."""
    for cycle in unbounded_cycles(ctx.graph):
        actions = [n.split(":", 1)[1] for n in cycle.nodes if n.startswith("action:")]
        related = tuple(Related(message=f"action '{a}' is on the loop", pointer=f"/actions/{a}")
                        for a in actions[1:])
        yield error("SOP301", f"/actions/{actions[0]}", f"unbounded cycle: {cycle.label}",
                    f"add `max_runs: N` to an action on the loop (e.g. {actions[0]}), or bound the whole run "
                    "with `team.max_rounds: N`", related=related)


@rule("SOP302")
def reachable(ctx: Context) -> Iterator[Diagnostic]:
    """A role no message can reach never runs."""
    live = reachable_roles(ctx.graph)
    for rid in ctx.spec.roles:
        if rid not in live:
            yield warning("SOP302", f"/roles/{rid}", f"no message can ever reach role '{rid}'",
                          "let it watch UserRequirement or an action a reachable role runs, "
                          "or name it in an action's send_to")


@rule("SOP303")
def consumed(ctx: Context) -> Iterator[Diagnostic]:
    """An output nobody keeps, nobody reads and no artifact writes is wasted work, unless it
    is the last thing its role does: then it ends the run's flow and is the run's result."""
    ran_by = runners(ctx.spec)
    graph = ctx.graph
    assert graph is not None  # the graph phase builds it before its rules run
    read = _read_anywhere(ctx)
    for aid, action in ctx.spec.actions.items():
        writes = action.artifacts or (action.join is not None and action.join.path is not None)
        if not ran_by[aid] or writes or graph.out_degree(action_node(aid)):
            continue
        if action.kind == "reply":      # its output is a message to the person: that is its use
            continue
        if action.set_:                 # it changes the shared state: that is its use (docs/state.md)
            continue
        if read is None or aid in read or any(_read_later(ctx.spec, rid, aid) for rid in ran_by[aid]):
            continue
        if any(_ends_turn(ctx.spec, rid, aid) for rid in ran_by[aid]):
            continue
        yield warning("SOP303", f"/actions/{aid}", f"the output of '{aid}' is never used: no role keeps it, "
                      "no later action reads it and no artifact writes it",
                      "watch it from a role, address a role in its send_to, read it (context, msgs), "
                      "or add `artifacts`")


def _read_anywhere(ctx: Context) -> set[str] | None:
    """Actions some action reads by name: `context: [X]` or a template's `msgs.X` (None: any)."""
    read = read_by_templates(ctx)
    if read is None:
        return None
    for action in ctx.spec.actions.values():
        if isinstance(action, AnsweredAction) and isinstance(action.context, list):
            read.update(action.context)
    return read


def _ends_turn(spec: Sop, rid: str, aid: str) -> bool:
    """`aid` can be the last action of the role's turn: its `by_order` last, any of a `react`
    role's (the model picks the order). A plan's actions are read by its planner instead."""
    role = spec.roles[rid]
    if role.react_mode == "by_order":
        return bool(role.actions) and role.actions[-1] == aid
    return role.react_mode == "react" and aid in role.actions


def _sees_all(action: ActionSpec) -> bool:
    """Whether the action's context is the role's whole memory (exec and reply have none)."""
    return isinstance(action, AnsweredAction) and action.context == "all"


def _read_later(spec: Sop, rid: str, aid: str) -> bool:
    """Another action of the same role sees `aid` in its context (MetaGPT memory), or the
    role's planner consumes it (the plan, and each task's result recorded in the plan)."""
    role = spec.roles[rid]
    planned = [role.planner.action, *role.planner.task_action_ids()] if role.planner else []
    if role.react_mode == "plan_and_act" and aid in planned:
        return True
    own = role.runnable_actions()
    for other in own:
        if other in spec.actions and other != aid and _sees_all(spec.actions[other]):
            return True
    return False


@rule("SOP304")
def watched_but_not_sent(ctx: Context) -> Iterator[Diagnostic]:
    """A watch that the producer's `send_to` never delivers is a silent dead end."""
    ran_by = runners(ctx.spec)
    for rid, role in ctx.spec.roles.items():
        for i, aid in enumerate(role.watch):
            action = ctx.spec.actions.get(aid)
            idea = aid == USER_REQUIREMENT
            if idea:
                targets = list(ctx.spec.team.send_to)
            elif action is not None:
                targets = send_targets(ctx.spec, aid)
            else:
                continue
            reach, _ = delivered(targets, rid, ctx.spec.role_name(rid), rid in ran_by.get(aid, []))
            if not reach:
                field = "team.send_to" if idea else f"{aid}'s send_to"
                yield warning("SOP304", f"/roles/{rid}/watch/{i}", f"'{rid}' watches '{aid}', but '{aid}' is "
                              f"sent only to {', '.join(targets)}", f"add '{rid}' or <all> to {field}")


RULES = (bounded_loops, reachable, consumed, watched_but_not_sent)
"""This phase's rules, in the order they run."""
