"""What every check rule shares: its context, the `rule` marker, and how it reports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import Diagnostic, did_you_mean
from engine.load.spec import Sop

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["Context", "Rule", "rule", "run_rules", "error", "warning", "unknown"]


@dataclass
class Context:
    """What rules read: the spec, and the watch graph once the graph phase has built it."""

    spec: Sop
    graph: nx.DiGraph | None = None
    cache: dict[str, Any] = field(default_factory=dict)
    folder: Path | None = None
    """The SOP file's folder, when the checker knows it (not for an SOP given as text)."""


Rule = Callable[[Context], Iterator[Diagnostic]]


def rule(*codes: str) -> Callable[[Rule], Rule]:
    """Mark a function as a rule that may emit `codes` (each documented in docs/writing.md)."""

    def mark(func: Rule) -> Rule:
        func.codes = codes  # type: ignore[attr-defined]
        return func

    return mark


def run_rules(rules: tuple[Rule, ...], ctx: Context) -> list[Diagnostic]:
    """Every diagnostic of every rule (all problems of a phase together)."""
    return [diag for func in rules for diag in func(ctx)]


def error(code: str, pointer: str, message: str, hint: str = "", **extra: Any) -> Diagnostic:
    return Diagnostic(code=code, severity="error", message=message, pointer=pointer, hint=hint, **extra)


def warning(code: str, pointer: str, message: str, hint: str = "", **extra: Any) -> Diagnostic:
    return Diagnostic(code=code, severity="warning", message=message, pointer=pointer, hint=hint, **extra)


def unknown(kind: str, name: str, choices: list[str]) -> tuple[str, str]:
    plural = kind + ("es" if kind.endswith("s") else "s")
    listed = ", ".join(choices[:12]) + (f" and {len(choices) - 12} more" if len(choices) > 12 else "")
    hint = did_you_mean(name, choices) or (f"known {plural}: {listed}" if choices else f"declare it under `{plural}`")
    return f"unknown {kind} '{name}'", hint
