"""Geometry of the HTML report's two drawings: the watch graph and the run's timeline.

Both are computed here, in Python, and drawn by the report's template as inline SVG: the
report needs no JavaScript library and nothing from the network, and what it draws can be
tested without a browser. The graph is laid out in layers (Sugiyama style, simplified):
each node's layer is its distance from the idea (`UserRequirement`), the order within a
layer is refined by a few barycentre sweeps, and an edge that goes back up a layer (a
loop) is drawn as an arc on the right; a long chain is wrapped into columns side by side, so
it uses the page's width. The timeline puts each role on a row and each action try on it as
a bar from its start to its end, labelled with its action, over the run's active time: the
idle gaps between invocations (a resume hours later) are cut out and marked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from engine.check.graph import action_node, cycle_edges, cycles
from engine.journal.history import ActionRecord, RunState
from engine.load.spec import USER_REQUIREMENT
from engine.run.events import RunStatus


__all__ = ["GraphNode", "GraphEdge", "GraphDrawing", "layout_graph", "TimelineBar", "TimelineGap",
           "TimelineDrawing", "layout_timeline", "duration_text"]

CHAR_W, NODE_H, LAYER_GAP, NODE_GAP, MARGIN = 7.2, 30, 48, 26, 20
SWEEPS = 4


@dataclass(frozen=True)
class GraphNode:
    node: str                      # `role:<id>` or `action:<id>`, as engine.check.graph names it
    kind: str                      # role | action
    label: str
    title: str                     # the hover text
    x: float
    y: float
    w: float
    h: float
    ran: bool                      # an action that ran (or a role that acted) in this run


@dataclass(frozen=True)
class GraphEdge:
    source: str
    target: str
    kind: str                      # runs | watch | send_to
    path: str                      # SVG path data
    loop: str                      # "" | bounded | unbounded
    title: str


@dataclass(frozen=True)
class GraphDrawing:
    width: float
    height: float
    nodes: list[GraphNode]
    edges: list[GraphEdge]
    loops: list[dict[str, Any]]    # label, bounded, bounds text


PAGE_W = 1100.0
"""The width of the report's page content: a tall, narrow graph is wrapped to use it."""
COL_GAP = 96.0                     # between wrapped columns: room for their loop arcs


def layout_graph(graph: nx.DiGraph, runs: dict[str, int], acted: set[str]) -> GraphDrawing:
    """The watch graph in layers, top to bottom; a long chain of layers wrapped into columns
    side by side (see `_columns`). `runs`: action id -> times run, `acted`: role ids that
    ran an action."""
    layers = _order_layers(graph, _layers(graph))
    sizes = {n: (_label_width(_label(graph, n, runs)), float(NODE_H)) for n in graph.nodes}
    row_widths = [sum(sizes[n][0] for n in layer) + NODE_GAP * (len(layer) - 1) for layer in layers]
    columns = _columns(row_widths)
    positions: dict[str, tuple[float, float]] = {}
    layer_of: dict[str, int] = {}
    column_right: list[float] = []
    x0 = float(MARGIN)
    for first, last in columns:
        width = max(row_widths[first:last])
        for depth in range(first, last):
            x = x0 + (width - row_widths[depth]) / 2
            for node in layers[depth]:
                positions[node] = (x, MARGIN + (depth - first) * (NODE_H + LAYER_GAP))
                layer_of[node] = depth
                x += sizes[node][0] + NODE_GAP
        column_right.append(x0 + width)
        x0 += width + COL_GAP
    column_of = {n: next(i for i, (a, b) in enumerate(columns) if a <= d < b) for n, d in layer_of.items()}
    found = cycles(graph)
    nodes = [_node(graph, n, positions[n], sizes[n], runs, acted) for n in graph.nodes]
    wrapped = len(columns) > 1
    edges = _edges(graph, positions, sizes, cycle_edges(found), layer_of,
                   lambda u, v: column_right[max(column_of[u], column_of[v])], spread=6 if wrapped else 12)
    back_room = min(40 + 14 * len(graph.edges), COL_GAP if wrapped else 240)
    tallest = max(b - a for a, b in columns)
    return GraphDrawing(width=MARGIN + column_right[-1] + back_room,
                        height=2 * MARGIN + tallest * (NODE_H + LAYER_GAP) - LAYER_GAP,
                        nodes=nodes, edges=edges,
                        loops=[{"label": c.label, "bounded": c.bounded,
                                "bounds": ", ".join(f"{a} max_runs={n}" for a, n in c.bounds)}
                               for c in found])


def _columns(row_widths: list[float]) -> list[tuple[int, int]]:
    """The layers in columns, as (first, end) ranges: one column, unless the drawing would be
    a tall narrow strip (six layers or more, taller than wide) on a wide page; then as many
    columns of consecutive layers (three at least each) as fit in PAGE_W side by side."""
    count = len(row_widths)
    height = count * (NODE_H + LAYER_GAP)
    if count < 6 or height < 1.5 * max(row_widths):
        return [(0, count)]
    for columns in range(-(-count // 3), 1, -1):
        per = -(-count // columns)
        ranges = [(a, min(a + per, count)) for a in range(0, count, per)]
        width = sum(max(row_widths[a:b]) for a, b in ranges) + COL_GAP * len(ranges)
        if width + 2 * MARGIN <= PAGE_W:
            return ranges
    return [(0, count)]


def _layers(graph: nx.DiGraph) -> dict[str, int]:
    """Each node's distance from the idea; nodes it cannot reach go below their predecessors."""
    start = action_node(USER_REQUIREMENT)
    depth = dict(nx.single_source_shortest_path_length(graph, start)) if start in graph else {}
    pending = [n for n in graph.nodes if n not in depth]
    while pending:  # each pass places every node with a placed predecessor (or gives up: 0)
        placed = False
        for node in list(pending):
            known = [depth[p] for p in graph.predecessors(node) if p in depth]
            if known:
                depth[node] = max(known) + 1
                pending.remove(node)
                placed = True
        if not placed:
            depth[pending.pop(0)] = 0
    return depth


def _order_layers(graph: nx.DiGraph, depth: dict[str, int]) -> list[list[str]]:
    """Layers, each ordered to shorten edges: barycentre sweeps down and up."""
    layers: list[list[str]] = [[] for _ in range(max(depth.values(), default=0) + 1)]
    for node in graph.nodes:                       # file order first: stable and readable
        layers[depth[node]].append(node)
    layers = [layer for layer in layers if layer]
    for sweep in range(SWEEPS):
        down = sweep % 2 == 0
        indexes = range(1, len(layers)) if down else range(len(layers) - 2, -1, -1)
        for i in indexes:
            ref = layers[i - 1] if down else layers[i + 1]
            where = {n: k for k, n in enumerate(ref)}
            neighbours = graph.predecessors if down else graph.successors
            layers[i] = sorted(layers[i], key=lambda n: _barycentre(
                [where[m] for m in neighbours(n) if m in where], layers[i].index(n)))
    return layers


def _barycentre(positions: list[int], current: int) -> float:
    return sum(positions) / len(positions) if positions else float(current)


def _label(graph: nx.DiGraph, node: str, runs: dict[str, int]) -> str:
    data = graph.nodes[node]
    if data["kind"] == "role":
        return data["id"] if data["name"] == data["id"] else f"{data['id']} ({data['name']})"
    bound = f" ≤{data['max_runs']}" if data.get("max_runs") else ""
    ran = runs.get(data["id"], 0)
    return f"{data['id']}{bound}" + (f" ×{ran}" if ran else "")


def _label_width(label: str) -> float:
    return max(60.0, len(label) * CHAR_W + 24)


def _node(graph: nx.DiGraph, node: str, at: tuple[float, float], size: tuple[float, float],
          runs: dict[str, int], acted: set[str]) -> GraphNode:
    data = graph.nodes[node]
    kind = data["kind"]
    if kind == "role":
        ran = data["id"] in acted
        title = f"role {data['id']} ({data['name']})" + ("" if ran else ": did not act in this run")
    else:
        count = runs.get(data["id"], 0)
        ran = count > 0 or data.get("builtin", False)
        bound = f", max_runs {data['max_runs']}" if data.get("max_runs") else ""
        title = f"action {data['id']}{bound}: ran {count} time(s)"
    return GraphNode(node=node, kind=kind, label=_label(graph, node, runs), title=title,
                     x=at[0], y=at[1], w=size[0], h=size[1], ran=bool(ran))


def _edges(graph: nx.DiGraph, at: dict[str, tuple[float, float]], sizes: dict[str, tuple[float, float]],
           on_cycle: dict[tuple[str, str], Any], layer_of: dict[str, int],
           right_of: Any, *, spread: int) -> list[GraphEdge]:
    """Each edge's path: down to a later layer (into a later column of a wrapped graph: down,
    along the gutter beside its column and in from above), or back up (a loop) as an arc
    right of the columns it joins."""
    edges: list[GraphEdge] = []
    for k, (u, v, data) in enumerate(graph.edges(data=True)):
        cycle = on_cycle.get((u, v))
        loop = "" if cycle is None else ("bounded" if cycle.bounded else "unbounded")
        (ux, uy), (vx, vy) = at[u], at[v]
        (uw, uh), (vw, _) = sizes[u], sizes[v]
        if layer_of[v] > layer_of[u]:                 # downwards: bottom centre to top centre
            x1, y1, x2, y2 = ux + uw / 2, uy + uh, vx + vw / 2, vy
            if y2 > y1:
                mid = (y1 + y2) / 2
                path = f"M{x1:.1f},{y1:.1f} C{x1:.1f},{mid:.1f} {x2:.1f},{mid:.1f} {x2:.1f},{y2:.1f}"
            else:                                     # into a later column: up its gutter
                gutter = right_of(u, u) + COL_GAP / 2
                path = (f"M{x1:.1f},{y1:.1f} L{x1:.1f},{y1 + 12:.1f} L{gutter:.1f},{y1 + 12:.1f} "
                        f"L{gutter:.1f},{y2 - 12:.1f} L{x2:.1f},{y2 - 12:.1f} L{x2:.1f},{y2:.1f}")
        else:                                         # back up (a loop): an arc on the right
            x1, y1, x2, y2 = ux + uw, uy + uh / 2, vx + vw, vy + NODE_H / 2
            reach = right_of(u, v) + 20 + 14 * (k % spread)
            path = f"M{x1:.1f},{y1:.1f} C{reach:.1f},{y1:.1f} {reach:.1f},{y2:.1f} {x2:.1f},{y2:.1f}"
        title = f"{graph.nodes[u]['id']} → {graph.nodes[v]['id']} ({data['kind']})"
        if cycle is not None:
            title += "; " + ("unbounded loop" if not cycle.bounded else "loop bounded by " + ", ".join(
                f"{a} max_runs={n}" for a, n in cycle.bounds))
        edges.append(GraphEdge(source=u, target=v, kind=data["kind"], path=path, loop=loop, title=title))
    return edges


# --- the timeline -------------------------------------------------------------------------

LABEL_W, PLOT_W, ROW_H, BAR_H, FLIGHT_H = 150, 900, 26, 16, 44
GAP_W = 36
"""The width a gap between two invocations is drawn at, however long it was (cut out)."""
_NARROW, _WIDE = frozenset("fijlrtI.,:;'!|()[] "), frozenset("mwMW@%…")


def label_width(text: str) -> float:
    """A bar label's width in pixels at 11px, estimated on the wide side from each character's
    class (no fonts here to measure with): an `m` is half again an `a`, so counting
    characters alone let `Summar…` overflow its bar."""
    return sum(4.5 if c in _NARROW else 11.0 if c in _WIDE else 8.5 if c.isupper() or c.isdigit() else 7.0
               for c in text)


@dataclass(frozen=True)
class TimelineBar:
    index: int                     # the action run's place in RunState.timeline
    role: str
    action: str
    round: int
    x: float
    y: float
    w: float
    completed: bool
    troubled: bool                 # a retry or a rejected answer happened in it
    title: str
    calls: list[tuple[float, float]] = field(default_factory=list)   # (x, w) of each call
    label: str = ""                # the action's name, cut to the bar's width ("" if none fits)
    tools: list[tuple[float, float, bool, str]] = field(default_factory=list)
    """(x, w, failed, title) of each tool command it ran."""


@dataclass(frozen=True)
class TimelineGap:
    """Idle time between two invocations, cut out of the time axis and drawn GAP_W wide."""

    x: float
    w: float
    seconds: float
    label: str


@dataclass(frozen=True)
class TimelineDrawing:
    width: float
    height: float
    plot_x: float
    plot_w: float
    rows: list[tuple[str, float]]                   # role, y
    bands: list[tuple[float, float, int, bool]]     # x, w, round, label it
    bars: list[TimelineBar]
    flight_y: float
    flight_path: str                                # the calls in flight as a step area
    flight_max: int
    ticks: list[tuple[float, str]]
    resumes: list[float]
    stop_x: float | None
    span_s: float                                   # the time drawn (gaps cut out)
    gaps: list[TimelineGap] = field(default_factory=list)


class _TimeAxis:
    """Wall time to x: the invocations' active time share the plot; each idle gap between
    two invocations (a run resumed hours later) is cut out and drawn GAP_W wide, so neither
    invocation shrinks to a sliver."""

    def __init__(self, spans: list[tuple[float, float]]) -> None:
        merged: list[list[float]] = []
        for a, b in sorted(spans):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self.spans = [(a, b) for a, b in merged]
        self.start, self.end = self.spans[0][0], self.spans[-1][1]
        self.active = max(sum(b - a for a, b in self.spans), 1e-6)
        self.gap_count = len(self.spans) - 1
        self.scale = (PLOT_W - GAP_W * self.gap_count) / self.active

    def x_of(self, ts: float) -> float:
        ts = min(max(ts, self.start), self.end)
        x = float(LABEL_W)
        for i, (a, b) in enumerate(self.spans):
            if ts <= b:
                return x + (max(ts, a) - a) * self.scale
            x += (b - a) * self.scale
            following = self.spans[i + 1][0]
            if ts < following:                     # inside the gap: across its GAP_W
                return x + (ts - b) / max(following - b, 1e-9) * GAP_W
            x += GAP_W
        return x

    def x_of_active(self, t: float) -> float:
        """x of `t` seconds of active time after the start (the ticks' scale)."""
        for a, b in self.spans:
            if t <= b - a:
                return self.x_of(a + t)
            t -= b - a
        return self.x_of(self.end)

    def gaps(self) -> list[TimelineGap]:
        found = []
        for (_, b), (a, _) in zip(self.spans, self.spans[1:], strict=False):
            x = self.x_of(b)
            found.append(TimelineGap(x=x, w=GAP_W, seconds=a - b, label=duration_text(a - b)))
        return found


def layout_timeline(state: RunState, role_order: list[str]) -> TimelineDrawing:
    """Rows of roles, bars of action runs over the run's active time, rounds as bands, calls
    in flight; the idle time between invocations is cut out (and marked)."""
    axis = _TimeAxis(_active_spans(state))
    end = axis.end
    x_of = axis.x_of
    roles = _row_roles(state, role_order)
    rows = [(role, float(24 + i * ROW_H)) for i, role in enumerate(roles)]
    row_y = dict(rows)
    bars = [_bar(i, r, x_of, row_y[r.role], end) for i, r in enumerate(state.timeline)]
    flight_y = 24 + len(rows) * ROW_H + 12
    path, peak = _in_flight(state.timeline, x_of, flight_y + FLIGHT_H)
    stopped = state.status not in (RunStatus.IDLE, RunStatus.MAX_ROUNDS)
    return TimelineDrawing(
        width=LABEL_W + PLOT_W + 20, height=flight_y + FLIGHT_H + 28, plot_x=LABEL_W, plot_w=PLOT_W,
        rows=rows, bands=_bands(state, x_of, end), bars=bars, flight_y=flight_y, flight_path=path,
        flight_max=peak, ticks=_ticks(axis), resumes=[x_of(t) for t in state.invocation_starts[1:]],
        stop_x=x_of(end) if stopped else None, span_s=axis.active, gaps=axis.gaps())


def _active_spans(state: RunState) -> list[tuple[float, float]]:
    """When the run was running: each invocation from its start to its end (or last event),
    and every action try (a state built by hand may have no invocations)."""
    spans = [(i.started_at, max(i.ended_at or 0.0, i.last_at, i.started_at)) for i in state.invocation_list]
    for record in state.timeline:
        until = record.ended_at if record.ended_at is not None else (record.stopped_at or record.started_at)
        if record.started_at:
            spans.append((record.started_at, max(until, record.started_at)))
    if not spans:
        first = state.started_at or 0.0
        spans = [(first, max(state.ended_at or 0.0, state.last_event_at, first))]
    elif not state.invocation_list:                # one span from the first start to the end
        ends = [state.ended_at or 0.0, state.last_event_at, *(b for _, b in spans)]
        spans = [(min(a for a, _ in spans), max(ends))]
    return spans


def _row_roles(state: RunState, role_order: list[str]) -> list[str]:
    seen = [r.role for r in state.timeline]
    for roles in state.round_roles.values():
        seen += roles
    present = set(seen)
    ordered = [r for r in role_order if r in present]
    return ordered + [r for r in dict.fromkeys(seen) if r not in ordered]


def _bar(index: int, record: ActionRecord, x_of: Any, y: float, end: float) -> TimelineBar:
    stop = record.ended_at if record.ended_at is not None else (record.stopped_at or end)
    x1, x2 = x_of(record.started_at), x_of(stop)
    usage = record.usage
    state_text = "done" if record.completed else "NOT COMPLETED"
    if record.error:
        state_text += f" (invocation {record.invocation} stopped: {record.error.splitlines()[0]})"
    models = f" · {', '.join(record.models)}" if record.models else ""
    title = (f"round {record.round} · {record.role}.{record.action} · {state_text} · "
             f"{duration_text(stop - record.started_at)} · calls {usage.llm_calls} "
             f"(reused {usage.reused_calls}) · tokens {usage.prompt_tokens}+{usage.completion_tokens} "
             f"· ${usage.cost_usd:.4f}{models}")
    calls = [(x_of(a), max(x_of(b) - x_of(a), 1.0)) for a, b in record.calls]
    tools = [(x_of(t.ended_at - t.seconds), max(x_of(t.ended_at) - x_of(t.ended_at - t.seconds), 1.5),
              t.error, f"step {t.step}: {t.tool}" + (" (failed)" if t.error else "")
              + (" (reused)" if t.reused else "")) for t in record.tools]
    width = max(x2 - x1, 3.0)
    return TimelineBar(index=index, role=record.role, action=record.action, round=record.round,
                       x=x1, y=y + (ROW_H - BAR_H) / 2, w=width, completed=record.completed,
                       troubled=bool(record.problems), title=title, calls=calls,
                       label=_fit(record.action, width - 6), tools=tools)


def _fit(text: str, room: float) -> str:
    """`text` as it fits in `room` pixels (label_width): whole, cut with an ellipsis (three
    characters at least), or nothing."""
    if label_width(text) <= room:
        return text
    chars = len(text) - 1
    while chars >= 3 and label_width(text[:chars] + "…") > room:
        chars -= 1
    return text[:chars] + "…" if chars >= 3 else ""


def _bands(state: RunState, x_of: Any, end: float) -> list[tuple[float, float, int, bool]]:
    """Each round from its start to the next round's; labelled where there is room."""
    starts = sorted(state.round_started.items(), key=lambda item: item[1])
    bands = []
    for i, (rnd, ts) in enumerate(starts):
        until = starts[i + 1][1] if i + 1 < len(starts) else end
        x, x2 = x_of(ts), x_of(until)
        bands.append((x, max(x2 - x, 0.5), rnd, x2 - x >= 22))
    return bands


def _in_flight(records: list[ActionRecord], x_of: Any, base: float) -> tuple[str, int]:
    """The number of model calls in flight over time, as a step area above `base`. A call
    counts from its start to its end inclusive (starts before ends at the same instant), so
    even an instant answer (a reused or fake one) shows."""
    changes = sorted((x_of(when), order, delta) for record in records for a, b in record.calls
                     for when, order, delta in ((a, 0, 1), (b, 1, -1)))
    if not changes:
        return "", 0
    level, peak, steps = 0, 0, []
    for x, _, delta in changes:
        level += delta
        peak = max(peak, level)
        steps.append((x, level))
    scale = (FLIGHT_H - 4) / max(peak, 1)
    path = [f"M{steps[0][0]:.1f},{base:.1f}"]
    previous = 0
    for x, level in steps:
        path.append(f"L{x:.1f},{base - previous * scale:.1f} L{x:.1f},{base - level * scale:.1f}")
        previous = level
    path.append(f"L{steps[-1][0]:.1f},{base:.1f} Z")
    return " ".join(path), peak


def _ticks(axis: _TimeAxis) -> list[tuple[float, str]]:
    """About six marks of active time at round numbers of seconds (or milliseconds)."""
    span = axis.active
    raw = span / 6
    step = next((s for s in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15,
                             30, 60, 120, 300, 600, 1800, 3600, 7200) if s >= raw), raw)
    marks, t = [], 0.0
    while t <= span + 1e-9:
        marks.append((axis.x_of_active(t), duration_text(t)))
        t += step
    return marks


def duration_text(seconds: float) -> str:
    """`0 ms`, `850 ms`, `2.4 s`, `3 min 05 s`, `1 h 02 min`."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"
