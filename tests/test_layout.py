"""The package layout is the pipeline: each layer imports only the layers before it, and no
module imports another that imports it back (lazily or not). docs/contributing.md, "Project layout"."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ENGINE = Path(__file__).resolve().parent.parent / "engine"
LAYERS = ["errors", "diskcache", "load", "templates", "check", "compile", "lsp", "models", "run", "journal", "api",
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
    assert strays == [], "add new modules under a layer (or add the layer to LAYERS and docs/contributing.md)"


def test_layers_import_only_the_layers_before_them() -> None:
    upward = [(a, b) for a, b in _graph().edges if _layer(b) > _layer(a)]
    assert upward == []


def test_no_import_cycle() -> None:
    assert list(nx.simple_cycles(_graph())) == []


_LOAD_FOR_RUN = {"engine.load.spec", "engine.load.catalog", "engine.load.outputs", "engine.load.source",
                 "engine.load.files", "engine.load.secrets"}
"""What run/ may take from load/: spec types and constants (engine.load.catalog's `END`, the
built-in command table), pointer/value helpers, the bounded file read and the one redaction
rule (tracing's captured content is redacted as the journal is); never the facts the
compiler works out."""

_COMPILED_FACTS = {"flags_needed", "mcp_hosts", "expand_tools", "read_experience", "team_targets", "team_reach"}


def test_the_run_reads_the_compiled_plan_not_the_checker() -> None:
    """The compiler decides once (engine/compile/plan.py): run/ imports no check/ module, and
    calls none of load/'s fact-finding functions again."""
    run = [p for p in ENGINE.rglob("*.py") if _module(p).startswith("engine.run.")]
    checker = sorted((_module(p), m) for p in run for m in _imports(p) if m.startswith("engine.check"))
    assert checker == []
    loaded = sorted((_module(p), m) for p in run for m in _imports(p)
                    if m.startswith("engine.load") and m not in _LOAD_FOR_RUN)
    assert loaded == []
    refound = sorted((_module(p), alias.name) for p in run
                     for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
                     if isinstance(node, ast.ImportFrom) for alias in node.names
                     if alias.name in _COMPILED_FACTS)
    assert refound == []


def _unexplained_inline_imports(path: Path) -> list[str]:
    """Imports inside functions with no comment on their line, or on the first line of the
    block of imports they stand in (why they are not at the top: an optional extra, a heavy
    package a light command must not load)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    found = []
    for func in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(func):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                row = node.lineno - 1
                while row > 0 and "#" not in lines[row] and lines[row - 1].strip().startswith(("import ", "from ", "#")):
                    row -= 1
                if "#" not in lines[row]:
                    found.append(f"{path.relative_to(ENGINE.parent)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


def test_every_import_inside_a_function_says_why() -> None:
    unexplained = [line for path in sorted(ENGINE.rglob("*.py")) for line in _unexplained_inline_imports(path)]
    assert unexplained == [], "move these to the top, or say on the line why they stay inside"
