"""The run's shared state (the file's `state:`): typed variables that actions change with `set`.

MetaGPT's Environment keeps a game's state in code; here it is declared, and changed only by
an action's `set` after the action acted. Changes are deterministic whatever order the
concurrent roles of a round finish in: the role that sets a variable sees the new value at
once (its later actions in the same activation), the other roles from the next round, when
the round's changes are committed in the roles' file order, as the round's messages are
published. Each action's changes travel in its `ActionCompleted` event (`shared`), so a resume
that reuses the action applies them again, and a replay recomputes them from the same answers.
"""

from __future__ import annotations

import json
from typing import Any
from collections.abc import Iterable, Mapping

from engine.errors import ActionFailed
from engine.load.source import join_pointer
from engine.load.spec import Sop, state_value_fits

__all__ = ["MAX_STATE_CHARS", "SharedState", "checked_value"]


MAX_STATE_CHARS = 1_000_000
"""The most characters one variable's value may take as JSON: the state is in every
template's variables and in the journal of every action that sets it."""


class SharedState:
    """The committed values, and each role's changes of the current round."""

    def __init__(self, spec: Sop) -> None:
        self.types = {name: var.type for name, var in spec.state.items()}
        self.values: dict[str, Any] = {name: _copy(var.initial()) for name, var in spec.state.items()}
        self._pending: dict[str, dict[str, Any]] = {}

    def view(self, role_id: str) -> dict[str, Any]:
        """What the role's templates read as `state` (copies: a template cannot change it)."""
        return _copy({**self.values, **self._pending.get(role_id, {})})

    def apply(self, role_id: str, changes: Mapping[str, Any]) -> None:
        """A role's action set these (checked values): visible to the role now."""
        if changes:
            self._pending.setdefault(role_id, {}).update(_copy(dict(changes)))

    def commit(self, role_order: Iterable[str]) -> None:
        """The round's end: every role's changes, in the roles' file order (the last wins)."""
        for role_id in role_order:
            self.values.update(self._pending.pop(role_id, {}))
        self._pending.clear()


def checked_value(spec: Sop, action_id: str, name: str, value: Any) -> Any:
    """A `set` value as the state keeps it (plain JSON), or the action's failure (SOP504)
    when it is not of the variable's type or too big."""
    where = join_pointer("/actions", action_id, "set", name)
    if isinstance(value, tuple):
        value = list(value)
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        raise ActionFailed(action_id, f"set {name}: {type(value).__name__} is not a value the state can keep",
                           hint="give a string, number, boolean, list or mapping", code="SOP504",
                           pointer=where) from None
    declared = spec.state[name].type
    plain = json.loads(text)
    if not state_value_fits(declared, plain):
        raise ActionFailed(action_id, f"set {name}: state.{name} is of type {declared}, the expression gave "
                           f"{_type_name(plain)} {_short(text)}", hint=_convert_hint(declared),
                           code="SOP504", pointer=where)
    if len(text) > MAX_STATE_CHARS:
        raise ActionFailed(action_id, f"set {name}: the value takes {len(text)} characters; the limit is "
                           f"{MAX_STATE_CHARS}", code="SOP504", pointer=where)
    return plain


def _type_name(value: Any) -> str:
    names = {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict"}
    return names.get(type(value), type(value).__name__) if value is not None else "null"


def _short(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def _convert_hint(declared: str) -> str:
    filters = {"str": "| string", "int": "| int", "float": "| float", "bool": "| bool", "list": "| list"}
    return (f"convert it with `{filters[declared]}`" if declared in filters
            else "give a mapping, e.g. dict(state.x, key=value)")


def _copy(value: Any) -> Any:
    """A deep copy of plain JSON values (lists and mappings nest)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value
