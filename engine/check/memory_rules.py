"""Checks of the memory keys: `memory_window` and `recall` (engine/run/longterm.py).

Part of the references phase (`check.phases`): like its rules, these read only the spec.
"""

from __future__ import annotations

from collections.abc import Iterator

from engine.check.rules import Context, error, rule
from engine.errors import Diagnostic
from engine.load.spec import AnsweredAction

__all__ = ["RULES"]


@rule("SOP219")
def recall_needs_a_window(ctx: Context) -> Iterator[Diagnostic]:
    """Recall brings back messages older than the memory window; without a window every
    message is already shown, so `recall` would silently do nothing."""
    for rid, role in ctx.spec.roles.items():
        if role.recall is not None and role.memory_window is None:
            yield error("SOP219", f"/roles/{rid}/recall", "`recall` without a `memory_window`: "
                        "every message is already in the context", _HINT)
    for aid, action in ctx.spec.actions.items():
        if not isinstance(action, AnsweredAction) or action.recall is None \
                or action.memory_window is not None:
            continue
        unbounded = [rid for rid, role in ctx.spec.roles.items()
                     if aid in role.runnable_actions() and role.memory_window is None]
        if unbounded:
            yield error("SOP219", f"/actions/{aid}/recall", "`recall` without a `memory_window` "
                        f"(on the action, or on role {', '.join(unbounded)} that runs it)", _HINT)
        elif action.context == "none":
            yield error("SOP219", f"/actions/{aid}/recall", "`recall` on an action with `context: none`",
                        "recall adds to the context: give the action a context, or remove `recall`")


_HINT = "add `memory_window: N` (the last N messages), or remove `recall`"


RULES = (recall_needs_a_window,)
"""This module's rules, run with the references phase."""
