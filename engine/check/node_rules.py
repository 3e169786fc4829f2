"""Checks of the ActionNode keys: `fill: complex` and `revise` (engine/run/node.py).

Part of the references phase (`check.phases`): like its rules, these read only the spec.
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


@rule("SOP218")
def human_review_needs_a_person(ctx: Context) -> Iterator[Diagnostic]:
    """MetaGPT's HUMAN_REVIEW revise mode is a person's comments revised by the model."""
    for aid, action in ctx.spec.actions.items():
        if isinstance(action, LlmAction) and action.revise is not None and action.revise.revise == "human_review" \
                and action.revise.review != "human":
            yield error("SOP218", f"/actions/{aid}/revise/revise",
                        "`revise: human_review` means a person writes the review, but `review` is "
                        f"'{action.revise.review}'",
                        "set `review: human`, or use `revise: auto` for a model's review and revision")


RULES = (node_keys_need_a_tree, human_review_needs_a_person)
"""This module's rules, run with the references phase."""
