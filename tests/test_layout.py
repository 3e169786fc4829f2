"""The package layout is the pipeline: each layer imports only the layers before it, and no
module imports another that imports it back (lazily or not). README, "Project layout"."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ENGINE = Path(__file__).resolve().parent.parent / "engine"
LAYERS = ["errors", "diskcache", "load", "templates", "check", "compile", "models", "run", "journal", "api",
          "batch", "cli", "testing"]
"""In pipeline order; `engine/__init__.py` (the version) is below them all."""


def _module(path: Path) -> str:
    parts = path.relative_to(ENGINE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every engine module `path` imports: at the top, inside functions, or for type checking."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: relative import (imports are absolute here)")
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "engine":
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                is_module = (ENGINE.parent / Path(*candidate.split("."))).with_suffix(".py").exists()
                found.add(candidate if is_module else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "engine"}
    return found


def _graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    for path in ENGINE.rglob("*.py"):
        module = _module(path)
        graph.add_node(module)
        graph.add_edges_from((module, other) for other in _imports(path) if other != module)
    return graph


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 else -1


def test_every_module_belongs_to_a_layer() -> None:
    strays = [m for m in _graph() if m != "engine" and m.split(".")[1] not in LAYERS]
    assert strays == [], "add new modules under a layer (or add the layer to LAYERS and the README)"


def test_layers_import_only_the_layers_before_them() -> None:
    upward = [(a, b) for a, b in _graph().edges if _layer(b) > _layer(a)]
    assert upward == []


def test_no_import_cycle() -> None:
    assert list(nx.simple_cycles(_graph())) == []
