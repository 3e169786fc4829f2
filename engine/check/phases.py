"""The checker's phases, in the order they run; each is an explicit tuple of rules.

The compiler stops after the first phase with an error: references first (every later
phase assumes names resolve), then the watch graph, then templates (they read the graph to
tell which messages can reach a role).
"""

from __future__ import annotations

from engine.check import (
    memory_rules,
    node_rules,
    person_rules,
    references,
    state_rules,
    template_rules,
    tool_rules,
    watch,
)
from engine.check.rules import Rule

__all__ = ["PHASES", "registered_codes"]

PHASES: tuple[tuple[str, tuple[Rule, ...]], ...] = (
    ("references", (*references.RULES, *template_rules.REFERENCE_RULES, *person_rules.RULES,
                    *node_rules.RULES, *memory_rules.RULES, *tool_rules.RULES,
                    *state_rules.RULES)),
    ("graph", watch.RULES),
    ("templates", template_rules.RULES),
)


def registered_codes() -> set[str]:
    """Every code some rule may emit (each must be catalogued in `check.diagnostics.CODES`)."""
    return {code for _, rules in PHASES for func in rules for code in getattr(func, "codes", ())}
