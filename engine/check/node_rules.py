"""Checks of the ActionNode keys: `fill: complex` and `revise` (engine/run/node.py).

Part of the references phase (`check.phases`): like its rules, these read only the spec.
`revise: human_review` without `review: human` (SOP218) is found while the deprecated
spelling is rewritten (engine/load/migrations.py): the models no longer have that value.
"""

from __future__ import annotations

from collections.abc import Iterator

from engine.check.rules import Context, error, rule
from engine.errors import Diagnostic
from engine.load.outputs import output_kind
from engine.load.spec import LlmAction

__all__ = ["RULES"]


@rule("SOP217")
def node_keys_need_a_tree(ctx: Context) -> Iterator[Diagnostic]:
    """A complex fill splits an output tree by its keys and a review comments on its keys, so
    both need a model filling a tree; on anything else they would silently do nothing."""
    human_actions = {aid: rid for rid, role in ctx.spec.roles.items() if role.human
                     for aid in role.actions}
    for aid, action in ctx.spec.actions.items():
        if not isinstance(action, LlmAction):   # the other kinds have no `fill` or `revise`
            continue
        used = [key for key in ("fill", "revise") if key in action.model_fields_set
                and not (key == "fill" and action.fill == "simple")]
        for key in used:
            where = f"/actions/{aid}/{key}"
            if output_kind(action.output) != "json":
                yield error("SOP217", where, f"`{key}` on an action whose output is not a tree filled "
                            f"by a model (kind {action.kind}, output {output_kind(action.output)})",
                            "give the action an output tree (`output: {Key: {type: str}}`), or remove the key")
            elif aid in human_actions:
                yield error("SOP217", where, f"`{key}` on an action of the human role "
                            f"{human_actions[aid]}: a person fills it, no model",
                            "remove the key, or let a model run the action (`revise: {review: human}` "
                            "lets a person review a model's output)")


RULES = (node_keys_need_a_tree,)
"""This module's rules, run with the references phase."""
