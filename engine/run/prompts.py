"""What a role's calls say about the role: its prefix (MetaGPT's `_get_prefix`, in MetaGPT's
words), an action's own system prompt over it, and the role fields that are templates
(profile, goal, constraints, desc, human), rendered once when a run starts.

MetaGPT builds the prefix as "You are a {profile}, named {name}, your goal is {goal}. the
constraint is {constraints}. You are in {env.desc} with roles(...)."; a non-empty `desc`
replaces it, and an action's `system_msgs` replace it for that call (`role_prefix: false`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from engine.compile.compiler import CompiledSop
from engine.errors import RunError
from engine.load.spec import RoleSpec, is_template
from engine.templates.filters import reading_beside
from engine.templates.render import render_template
from engine.templates.sandbox import TemplateFailure

__all__ = ["ROLE_TEMPLATE_FIELDS", "role_prefix", "system_prompt", "with_role_fields", "role_field_variables"]


ROLE_TEMPLATE_FIELDS = ("profile", "goal", "constraints", "desc")
"""The role's text fields that are templates (with `human`, which gives true or false)."""


def role_prefix(compiled: CompiledSop, role_id: str) -> str:
    """The system prompt of every call of a role: its `desc` when given, else MetaGPT's
    PREFIX_TEMPLATE and CONSTRAINT_TEMPLATE, then the environment's description with the
    other roles' names (only when `team.env_desc` is set, as MetaGPT: a run without it, or a
    role alone, is told of no team)."""
    spec = compiled.spec
    role = spec.roles[role_id]
    if role.desc.strip():
        return role.desc.strip()
    name = spec.role_name(role_id)
    first = f"You are a {role.profile or role_id}, named {name}"
    parts = [f"{first}, your goal is {role.goal.strip()}." if role.goal.strip() else f"{first}."]
    if role.constraints.strip():
        parts.append(f"the constraint is {role.constraints.strip()}.")
    env_desc = spec.team.env_desc.strip()
    if env_desc:
        others = [spec.role_name(r) for r in spec.roles if r != role_id]
        parts.append(f"You are in {env_desc} with roles({', '.join(others)})." if others else f"You are in {env_desc}.")
    return " ".join(parts)


def system_prompt(compiled: CompiledSop, role_id: str, own: str | None, keep_prefix: bool) -> str:
    """The system prompt of one call: the role's prefix, then the action's own `system` text
    (already rendered) after a blank line; without the prefix when the action says so."""
    own = (own or "").strip()
    if not keep_prefix:
        return own
    prefix = role_prefix(compiled, role_id)
    return f"{prefix}\n\n{own}" if own else prefix


def role_field_variables(compiled: CompiledSop, role_id: str, inputs: dict[str, Any], run_id: str) -> dict[str, Any]:
    """What a role field's template reads: the inputs, the role's id, name and vars, the run's id
    (so that `shuffle` and `choice` give the run's own, journaled, order)."""
    spec = compiled.spec
    role = spec.roles[role_id]
    return {"inputs": dict(inputs), "role": {"id": role_id, "name": spec.role_name(role_id), "vars": dict(role.vars)},
            "run": {"id": run_id}}


def with_role_fields(compiled: CompiledSop, inputs: dict[str, Any], run_id: str) -> CompiledSop:
    """The compiled SOP with every role's templated fields rendered for this run (the same
    inputs and run id give the same text: a resume and a replay see what the run saw). A
    file without such templates is returned as it is."""
    roles = dict(compiled.spec.roles)
    changed = False
    for rid, role in compiled.spec.roles.items():
        with reading_beside(compiled.file):   # a desc may be file('persona.md')
            update = _rendered_fields(compiled, rid, role, inputs, run_id)
        if update:
            roles[rid] = role.model_copy(update=update)
            changed = True
    if not changed:
        return compiled
    return dataclasses.replace(compiled, spec=compiled.spec.model_copy(update={"roles": roles}))


def _rendered_fields(compiled: CompiledSop, rid: str, role: RoleSpec, inputs: dict[str, Any],
                     run_id: str) -> dict[str, Any]:
    update: dict[str, Any] = {}
    variables: dict[str, Any] | None = None
    for name in (*ROLE_TEMPLATE_FIELDS, "human"):
        value = getattr(role, name)
        if not isinstance(value, str) or not is_template(value):
            continue
        variables = variables or role_field_variables(compiled, rid, inputs, run_id)
        text = _render(rid, name, value, variables).strip()
        update[name] = _as_bool(rid, text) if name == "human" else text
    return update


def _render(rid: str, name: str, source: str, variables: dict[str, Any]) -> str:
    try:
        return render_template(source, variables, limit=100_000)
    except TemplateFailure as exc:
        raise RunError(f"/roles/{rid}/{name}: template: {exc}",
                       hint="a role's fields read only inputs, role.id, role.name, role.vars and run.id") from None


_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off", "", "none"}


def _as_bool(rid: str, text: str) -> bool:
    word = text.lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise RunError(f"/roles/{rid}/human: the template gave {text[:80]!r}, not true or false",
                   hint="make it give true or false, e.g. \"{{ inputs.interactive }}\" with a bool input")
