"""The watch graph: who can hear whom, which loops exist and what bounds them.

Nodes are roles (`role:<id>`) and message types, i.e. actions (`action:<id>`, including the
built-in `UserRequirement`, the idea, whose `send_to` is the file's `team.send_to`). Edges:

- role -> action (`runs`): the role runs the action (its `actions`, or its planner's two);
- action -> role (`watch`): the role watches the action and the action's `send_to` delivers
  to it (`<all>`, one of its addresses, or `<self>` when the role runs the action);
- action -> role (`send_to`): the action addresses the role directly (its id or name, or
  `<self>`), so the role keeps the message even without watching it (MetaGPT's name rule).

A cycle is a loop of activations; it is *bounded* when an action on it declares `max_runs`.
Cycle detection works per strongly connected component of the graph without bounded actions,
so it stays linear in the size of the file however many simple cycles there are.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jinja2 import meta

from engine.load.catalog import team_reach
from engine.load.spec import USER_REQUIREMENT, Sop, is_template
from engine.templates.render import render_template
from engine.templates.sandbox import TemplateFailure, parse

if TYPE_CHECKING:
    import networkx as nx  # ~0.3 s to import: paid only by a file whose checks reach its graph

__all__ = ["Cycle", "action_node", "build", "cycles", "delivered", "reachable_roles", "role_node", "runners",
           "reads_state", "render_address", "send_to_for", "send_targets", "to_dot", "to_json", "to_mermaid", "unbounded_cycles", "format_graph", "cycle_edges", "bound_text"]


def action_node(action_id: str) -> str:
    return f"action:{action_id}"


def role_node(role_id: str) -> str:
    return f"role:{role_id}"


@dataclass(frozen=True)
class Cycle:
    """A loop through the graph, as node names starting at an action, with its bounds."""

    nodes: tuple[str, ...]
    bounds: tuple[tuple[str, int], ...]
    led_by: str = ""
    """The `team.leader`'s action on the loop, which ends it by sending no task (see `build`)."""
    rounds: int = 0
    """The file's own `team.max_rounds`, which bounds every loop (0: the file sets none)."""

    @property
    def bounded(self) -> bool:
        return bool(self.bounds or self.led_by or self.rounds)

    @property
    def label(self) -> str:
        names = [n.split(":", 1)[1] for n in self.nodes]
        return " → ".join(names + names[:1])


def runners(spec: Sop) -> dict[str, list[str]]:
    """action id -> ids of the roles that run it (in file order)."""
    table: dict[str, list[str]] = {aid: [] for aid in spec.actions}
    for rid, role in spec.roles.items():
        for aid in role.runnable_actions():
            if aid in table and rid not in table[aid]:
                table[aid].append(rid)
    return table


def send_to_for(spec: Sop, action_id: str, role_id: str, state: dict[str, Any] | None = None) -> list[str]:
    """The action's `send_to` as role `role_id` sends it: each template item rendered with the
    role's `role` variable (its vars). An item that reads `state` is rendered only when the
    state is given (at run time, when the action publishes); without it, it stays as written.
    Raises the sandbox's TemplateFailure; the checker renders every (action, role) pair of the
    items that read only `role` first, so at run time those do not fail."""
    return [item if not is_template(item) or (state is None and reads_state(item))
            else render_address(spec, item, role_id, state)
            for item in spec.actions[action_id].send_to]


def render_address(spec: Sop, item: str, role_id: str, state: dict[str, Any] | None = None) -> str:
    """One template `send_to` item as role `role_id` sends it (raises TemplateFailure)."""
    return render_template(item, {"role": spec.role_view(role_id), "state": state or {}}, limit=1024).strip()


def reads_state(item: str) -> bool:
    """Whether a template `send_to` item reads `state` (so its address is known only at run
    time); an item that does not parse reads nothing (the checker reports it, SOP401)."""
    try:
        return is_template(item) and "state" in meta.find_undeclared_variables(parse(item))
    except TemplateFailure:
        return False


def send_targets(spec: Sop, action_id: str) -> list[str]:
    """Every address the action may send to, whichever of its roles runs it (file order)."""
    items = spec.actions[action_id].send_to
    if not any(is_template(item) for item in items):
        return list(items)
    found: list[str] = [item for item in items if not is_template(item)]
    if any(reads_state(item) for item in items):   # its address is the state's: it may be anyone
        found.append("<all>")
    for rid in runners(spec).get(action_id, []):
        try:
            found += [a for a in send_to_for(spec, action_id, rid) if not reads_state(a)]
        except TemplateFailure:  # the checker reports it (templates.send_to_templates)
            continue
    return list(dict.fromkeys(found))


def delivered(send_to: list[str], role_id: str, role_name: str, runs_it: bool) -> tuple[bool, bool]:
    """(reaches the role's inbox, addresses the role by name/id/<self>)."""
    addressed = bool({role_id, role_name} & set(send_to)) or ("<self>" in send_to and runs_it)
    return ("<all>" in send_to or addressed, addressed)


def build(spec: Sop) -> Any:
    """The watch graph of a spec whose references are all valid (a frozen networkx DiGraph)."""
    import networkx as nx  # ~0.3 s to import: paid only by a file whose checks reach its graph

    graph = nx.DiGraph(name=spec.name, max_rounds=bounding_rounds(spec))
    ran_by = runners(spec)
    order = {rid: i for i, rid in enumerate(spec.roles)}
    graph.add_node(action_node(USER_REQUIREMENT), kind="action", id=USER_REQUIREMENT,
                   max_runs=None, builtin=True)
    leads = _leader_actions(spec)
    for aid, action in spec.actions.items():
        graph.add_node(action_node(aid), kind="action", id=aid, max_runs=action.max_runs, builtin=False,
                       leads=aid in leads)
    for rid, role in spec.roles.items():
        graph.add_node(role_node(rid), kind="role", id=rid, name=spec.role_name(rid))
        for aid in role.runnable_actions():
            if aid in spec.actions:
                graph.add_edge(role_node(rid), action_node(aid), kind="runs")
    watchers, by_address = _indexes(spec)
    for aid, send_to in _senders(spec):
        # only a role that watches the action, or is addressed by it, can keep its message
        candidates = set(watchers.get(aid, ()))
        candidates.update(rid for address in send_to for rid in by_address.get(address, ()))
        if "<self>" in send_to:
            candidates.update(ran_by.get(aid, ()))
        for rid in sorted(candidates, key=order.__getitem__):
            reach, addressed = delivered(send_to, rid, spec.role_name(rid), rid in ran_by.get(aid, []))
            watched = aid in spec.roles[rid].watch
            if reach and (watched or addressed):
                graph.add_edge(action_node(aid), role_node(rid), kind="watch" if watched else "send_to")
    return nx.freeze(graph)


def bounding_rounds(spec: Sop) -> int:
    """`team.max_rounds` when the file writes it: a game or a debate that goes round until
    its rounds are spent (MetaGPT's n_round) is bounded by them, and needs no `max_runs`. The
    default (12) bounds no loop: a file that never said how long it runs gets SOP301."""
    return spec.team.max_rounds if "max_rounds" in spec.team.model_fields_set else 0


def _leader_actions(spec: Sop) -> set[str]:
    """The `team.leader`'s actions that route work with the `team` tool. A loop through one is
    the leader's to end (MGX's TeamLeader: each turn it sends one task or none), bounded by the
    run's max_rounds and budget, so it needs no `max_runs`."""
    leader = spec.role_at(spec.team.leader)
    if leader is None:
        return set()
    return {aid for aid in spec.roles[leader].runnable_actions() if aid in spec.actions and team_reach(spec, aid)}


def _indexes(spec: Sop) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """action id -> roles watching it; address (id or name) -> roles: linear, not roles x actions."""
    watchers: dict[str, list[str]] = {}
    by_address: dict[str, list[str]] = {}
    for rid, role in spec.roles.items():
        for aid in role.watch:
            watchers.setdefault(aid, []).append(rid)
        for address in {rid, spec.role_name(rid)}:
            by_address.setdefault(address, []).append(rid)
    return watchers, by_address


def _senders(spec: Sop) -> Iterator[tuple[str, list[str]]]:
    yield USER_REQUIREMENT, list(spec.team.send_to)  # the idea: to everyone unless the file addresses it
    for aid in spec.actions:
        yield aid, send_targets(spec, aid) + team_reach(spec, aid)  # and whom its `team` tool may address


def unbounded_cycles(graph: nx.DiGraph) -> list[Cycle]:
    """One named cycle per group of loops that no `max_runs` bounds."""
    import networkx as nx  # ~0.3 s to import: paid only by a file whose checks reach its graph

    if graph.graph.get("max_rounds"):   # the file's team.max_rounds bounds every loop
        return []
    free = graph.subgraph(n for n, d in graph.nodes(data=True) if not (d.get("max_runs") or d.get("leads")))
    found = []
    for component in nx.strongly_connected_components(free):
        if len(component) < 2:
            continue
        edges = nx.find_cycle(free.subgraph(component), source=min(component))
        found.append(Cycle(nodes=_rotate([u for u, _ in edges]), bounds=()))
    return sorted(found, key=lambda c: c.nodes)


def _rotate(nodes: list[str]) -> tuple[str, ...]:
    """Start a cycle at its first action in name order, so the same loop reads the same."""
    actions = [i for i, n in enumerate(nodes) if n.startswith("action:")]
    start = min(actions, key=lambda i: nodes[i]) if actions else 0
    return tuple(nodes[start:] + nodes[:start])


def cycles(graph: nx.DiGraph, limit: int = 50) -> list[Cycle]:
    """Simple cycles (at most `limit`) with the max_runs of the actions that bound them."""
    import networkx as nx  # ~0.3 s to import: paid only by a file whose checks reach its graph

    result = []
    for loop in itertools.islice(nx.simple_cycles(graph), limit):
        bounds = tuple((graph.nodes[n]["id"], graph.nodes[n]["max_runs"])
                       for n in loop if graph.nodes[n].get("max_runs"))
        led_by = next((graph.nodes[n]["id"] for n in loop if graph.nodes[n].get("leads")), "")
        result.append(Cycle(nodes=_rotate(list(loop)), bounds=bounds, led_by=led_by,
                            rounds=graph.graph.get("max_rounds", 0)))
    return sorted(result, key=lambda c: c.nodes)


def reachable_roles(graph: nx.DiGraph) -> set[str]:
    """Role ids some chain of messages starting at UserRequirement can activate."""
    import networkx as nx  # ~0.3 s to import: paid only by a file whose checks reach its graph

    start = action_node(USER_REQUIREMENT)
    seen = nx.descendants(graph, start) | {start}
    return {graph.nodes[n]["id"] for n in seen if graph.nodes[n]["kind"] == "role"}


def cycle_edges(found: list[Cycle]) -> dict[tuple[str, str], Cycle]:
    """Edge -> a cycle through it; an unbounded cycle wins, so the danger is what is shown."""
    table: dict[tuple[str, str], Cycle] = {}
    for cycle in sorted(found, key=lambda c: c.bounded):
        for edge in itertools.pairwise([*cycle.nodes, cycle.nodes[0]]):
            table.setdefault(edge, cycle)
    return table


def bound_text(cycle: Cycle) -> str:
    if not cycle.bounded:
        return "unbounded loop"
    bounds = [f"{aid} max_runs={n}" for aid, n in cycle.bounds]
    if cycle.led_by:
        bounds.append(f"{cycle.led_by} (team.leader) ends it")
    if cycle.rounds and not bounds:
        bounds.append(f"team.max_rounds={cycle.rounds}")
    return "loop, " + ", ".join(bounds)


def _mermaid_id(node: str) -> str:
    kind, name = node.split(":", 1)
    return ("A_" if kind == "action" else "R_") + name


def to_mermaid(graph: nx.DiGraph) -> str:
    """A mermaid flowchart: roles as boxes, actions as stadiums, loops as thick edges."""
    on_cycle = cycle_edges(cycles(graph))
    lines = ["flowchart LR"]
    for node, data in graph.nodes(data=True):
        label = data["id"] if data["kind"] == "action" or data["name"] == data["id"] else f"{data['id']} ({data['name']})"
        if data.get("max_runs"):
            label += f" ≤{data['max_runs']}"
        shape = f'(["{label}"])' if data["kind"] == "action" else f'["{label}"]'
        lines.append(f"  {_mermaid_id(node)}{shape}")
    for u, v, data in graph.edges(data=True):
        cycle = on_cycle.get((u, v))
        arrow = f'==>|"{data["kind"]}; {bound_text(cycle)}"|' if cycle else f"-->|{data['kind']}|"
        lines.append(f"  {_mermaid_id(u)} {arrow} {_mermaid_id(v)}")
    lines.append("  classDef role fill:#eef,stroke:#447")
    roles = [_mermaid_id(n) for n, d in graph.nodes(data=True) if d["kind"] == "role"]
    if roles:
        lines.append(f"  class {','.join(roles)} role")
    return "\n".join(lines) + "\n"


def to_dot(graph: nx.DiGraph) -> str:
    """Graphviz dot: loops in red (unbounded) or orange (bounded), labelled with their bounds."""
    on_cycle = cycle_edges(cycles(graph))
    lines = [f"digraph {json.dumps(graph.graph.get('name', 'sop'))} {{", "  rankdir=LR;"]
    for node, data in graph.nodes(data=True):
        shape = "box" if data["kind"] == "role" else "ellipse"
        label = data["id"] + (f"\\nmax_runs={data['max_runs']}" if data.get("max_runs") else "")
        lines.append(f"  {json.dumps(node)} [shape={shape}, label={json.dumps(label)}];")
    for u, v, data in graph.edges(data=True):
        attrs = [f"label={json.dumps(data['kind'])}"]
        cycle = on_cycle.get((u, v))
        if cycle:
            colour = "orange" if cycle.bounded else "red"
            attrs = [f"label={json.dumps(data['kind'] + '; ' + bound_text(cycle))}",
                     f"color={colour}", "penwidth=2"]
        lines.append(f"  {json.dumps(u)} -> {json.dumps(v)} [{', '.join(attrs)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_json(graph: nx.DiGraph) -> dict[str, Any]:
    """Nodes, edges (each marked when on a loop) and the loops with their bounds."""
    found = cycles(graph)
    on_cycle = cycle_edges(found)
    return {
        "nodes": [{"id": n, **dict(d)} for n, d in graph.nodes(data=True)],
        "edges": [{"source": u, "target": v, "kind": d["kind"], "on_cycle": (u, v) in on_cycle}
                  for u, v, d in graph.edges(data=True)],
        "cycles": [{"nodes": list(c.nodes), "label": c.label, "bounded": c.bounded,
                    "bounds": dict(c.bounds)} for c in found],
    }


def format_graph(graph: nx.DiGraph, fmt: str) -> str:
    """The watch graph as mermaid, dot or JSON text."""
    if fmt == "json":
        return json.dumps(to_json(graph), indent=2, ensure_ascii=False) + "\n"
    return to_dot(graph) if fmt == "dot" else to_mermaid(graph)
