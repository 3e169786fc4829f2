"""Checks of the keys by which a person takes part: `human` roles (a `review: human` gate is
a key of kind llm actions only: the models refuse it on any other kind).

Part of the references phase (`check.phases`): like its rules, these read only the spec.
"""

from __future__ import annotations

from collections.abc import Iterator

from engine.check.rules import Context, error, rule
from engine.errors import Diagnostic

__all__ = ["RULES"]


@rule("SOP216")
def human_roles(ctx: Context) -> Iterator[Diagnostic]:
    """A person's role never asks a model which step comes next, so it runs its actions in
    order (or has one); plan_and_act would need a model to write the plan."""
    for rid, role in ctx.spec.roles.items():
        if not role.human:
            continue
        if role.react_mode == "plan_and_act":
            yield error("SOP216", f"/roles/{rid}/react_mode",
                        "a role with `human: true` cannot use react_mode plan_and_act",
                        "use react_mode by_order, or put `review: human` on the planner's action "
                        "to let a person review a model's plan")
        elif role.react_mode == "react" and len(role.actions) > 1:
            yield error("SOP216", f"/roles/{rid}/actions",
                        f"a role with `human: true` in react mode has {len(role.actions)} actions; "
                        "a model would have to choose the next one",
                        "use react_mode: by_order (the person answers each action in turn)")


RULES = (human_roles,)
"""This module's rules, run with the references phase."""
