"""What a role's calls say about the role: its prefix (MetaGPT's `_get_prefix`), an action's
own system prompt over it, and the role fields that are templates (profile, goal,
constraints, desc, human), rendered once when a run starts.

MetaGPT builds the prefix from profile, name, goal, constraints and the environment; a
non-empty `desc` replaces it (here too), and an action's `system_msgs` replace it for that
call (here `role_prefix: false`).
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

__all__ = ["ROLE_TEMPLATE_FIELDS", "role_prefix", "role_label", "system_prompt", "with_role_fields", "role_field_variables"]


ROLE_TEMPLATE_FIELDS = ("profile", "goal", "constraints", "desc")
"""The role's text fields that are templates (with `human`, which gives true or false)."""


def role_prefix(compiled: CompiledSop, role_id: str) -> str:
    """The system prompt of every call of a role: its `desc` when given (MetaGPT's), else
    sopctl's wording of MetaGPT's PREFIX_TEMPLATE, CONSTRAINT_TEMPLATE and environment line:
    the teammates are named with their profiles, as the context sections name senders, even
    without `team.env_desc`; a role alone is told of no team. (The embedded local model's runs
    are tuned to this wording: MetaGPT's exact words, "You are a {profile}, named {name}, your
    goal is {goal}. the constraint is {constraints}. You are in {env_desc} with roles(...)",
    are a `desc` away: desc reads role.profile, role.goal and role.constraints.)"""
    spec = compiled.spec
    role = spec.roles[role_id]
    if role.desc.strip():
        return role.desc.strip()
    name = spec.role_name(role_id)
    others = [role_label(compiled, r) for r in spec.roles if r != role_id]
    parts = [f"You are {name}, the {role.profile or role_id}" + (" of a team." if others else ".")]
    if role.goal:
        parts.append(f"Your goal: {role.goal}.")
    if role.constraints:
        parts.append(f"Keep to these constraints: {role.constraints}.")
    where = spec.team.env_desc
    if others:
        parts.append(f"You work in {where or 'a team'} with {', '.join(others)}.")
    elif where:
        parts.append(f"You work in {where}.")
    return " ".join(parts)


def role_label(compiled: CompiledSop, role_id: str) -> str:
    """How prompts name a role (given by id or name): `Alice (Product Manager)`, as MetaGPT
    names a speaker by name and profile (never by the file's id); the sender of the idea
    stays `Human`, and `<all>` and `<none>` stay as they are."""
    spec = compiled.spec
    role_id = spec.role_at(role_id) or role_id
    if role_id not in spec.roles:
        return role_id
    return f"{spec.role_name(role_id)} ({spec.roles[role_id].profile or role_id})"


def system_prompt(compiled: CompiledSop, role_id: str, own: str | None, keep_prefix: bool) -> str:
    """The system prompt of one call: the role's prefix, then the action's own `system` text
    (already rendered) after a blank line; without the prefix when the action says so."""
    own = (own or "").strip()
    if not keep_prefix:
        return own
    prefix = role_prefix(compiled, role_id)
    return f"{prefix}\n\n{own}" if own else prefix


def role_field_variables(compiled: CompiledSop, role_id: str, inputs: dict[str, Any], run_id: str) -> dict[str, Any]:
    """What a role field's template reads: the inputs, the role's id, name and vars (and, in
    `desc`, its rendered profile, goal and constraints), the run's id (so that `shuffle` and
    `choice` give the run's own order)."""
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
    variables = role_field_variables(compiled, rid, inputs, run_id)
    for name in (*ROLE_TEMPLATE_FIELDS, "human"):   # desc after the others: it may read them
        value = getattr(role, name)
        if isinstance(value, str) and is_template(value):
            text = _render(rid, name, value, variables).strip()
            update[name] = _as_bool(rid, text) if name == "human" else text
        if name in ("profile", "goal", "constraints"):
            variables["role"][name] = update.get(name, value)
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
