"""The watch graph: routing edges, loops and their bounds, reachability, renderings."""

from __future__ import annotations

import json

from engine.check import graph as g
from engine.compile.compiler import compile_path, compile_text

from run_helpers import TESTS

COMPANY = TESTS / "cases" / "valid" / "company.sop.yaml"


def _sop(actions: str, roles: str) -> str:
    return f"apiVersion: sop/v1\nname: t\nactions:\n{actions}roles:\n{roles}"


def test_edges_follow_watch_and_send_to() -> None:
    graph = compile_path(COMPANY).graph
    assert graph.edges["action:WritePRD", "role:Architect"]["kind"] == "watch"
    assert graph.edges["role:Engineer", "action:WriteCode"]["kind"] == "runs"
    assert graph.edges["action:RunTests", "role:Engineer"]["kind"] == "watch"
    # RunTests is sent only to Engineer: QA does not watch it and gets no edge.
    assert not graph.has_edge("action:RunTests", "role:QaEngineer")


def test_send_to_addressing_routes_without_watch() -> None:
    text = _sop("  A: {prompt: a, send_to: [Bob], artifacts: [{path: a, content: a}]}\n"
                "  B: {prompt: b, artifacts: [{path: b, content: b}]}\n",
                "  First: {actions: [A], watch: [UserRequirement]}\n"
                "  Second: {name: Bob, actions: [B]}\n")
    compiled = compile_text(text)
    assert compiled.graph.edges["action:A", "role:Second"]["kind"] == "send_to"
    assert compiled.warnings == ()


def test_the_graph_is_frozen() -> None:
    import networkx as nx

    assert nx.is_frozen(compile_path(COMPANY).graph)


def test_bounded_loops_are_listed_with_bounds() -> None:
    loops = g.cycles(compile_path(COMPANY).graph)
    assert loops and all(c.bounded for c in loops)
    labels = {c.label for c in loops}
    assert "WriteTest → QaEngineer → WriteTest" in labels


def test_unbounded_cycle_is_found_once_per_component() -> None:
    text = _sop("  A: {prompt: a, artifacts: [{path: a, content: a}]}\n"
                "  B: {prompt: b}\n  C: {prompt: c}\n",
                "  X: {actions: [A], watch: [UserRequirement, B, C]}\n"
                "  Y: {actions: [B, C], watch: [A], react_mode: by_order}\n")
    import pytest

    from engine.errors import CompileError

    with pytest.raises(CompileError) as caught:
        compile_text(text)
    cycles = [d for d in caught.value.diagnostics if d.code == "SOP301"]
    assert len(cycles) == 1
    assert cycles[0].message == "unbounded cycle: A → Y → B → X → A"


def test_max_runs_anywhere_on_the_loop_bounds_it() -> None:
    text = _sop("  A: {prompt: a, artifacts: [{path: a, content: a}]}\n"
                "  B: {prompt: b, max_runs: 2}\n",
                "  X: {actions: [A], watch: [UserRequirement, B]}\n"
                "  Y: {actions: [B], watch: [A]}\n")
    assert compile_text(text).warnings == ()


def test_reachability_through_chains() -> None:
    graph = compile_path(COMPANY).graph
    assert g.reachable_roles(graph) == {"ProductManager", "Architect", "ProjectManager", "Engineer", "QaEngineer"}


def test_renderings() -> None:
    graph = compile_path(COMPANY).graph
    mermaid = g.to_mermaid(graph)
    assert mermaid.startswith("flowchart LR")
    assert "A_WriteTest ==>" in mermaid and "max_runs=3" in mermaid
    dot = g.to_dot(graph)
    assert dot.startswith('digraph "mini_company"') and "color=orange" in dot
    data = json.loads(json.dumps(g.to_json(graph)))
    assert {e["kind"] for e in data["edges"]} == {"watch", "runs"}
    assert all(c["bounded"] for c in data["cycles"])
    assert any(e["on_cycle"] for e in data["edges"])
