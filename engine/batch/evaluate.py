"""A finished row judged: expectations (sandboxed jinja) and conformance to a golden run.

Expectations are jinja expressions, `{{ ... }}` optional, evaluated in the SOP sandbox
(`engine.templates.sandbox`: no attribute escapes, bounded CPU and memory) over the row:

- `run`: the row's results line (status, rounds, calls, tokens, cost_usd, artifacts, error,
  last_messages, ...) and `run.inputs`;
- `msgs`: every message of the run by the action that published it, as the SOP's own
  templates see them (`msgs.WriteCode | length`, `msgs.WritePRD[-1].content`).

An expectation passes when its value is true; one that cannot be evaluated fails with why.

Conformance compares the row's trajectory, the (role, action) of every completed action in
order, with a golden run's (ADK's trajectory match, applied to the SOP). Roles of one round
act concurrently, so the steps of a round are compared sorted. Scores are in [0, 1]:

- `exact`: 1 when the trajectories are equal, else 0;
- `in_order`: the share of the golden steps found in the row in the same order (extra steps
  allowed): the longest common subsequence over the golden length;
- `any_order`: the share of the golden steps found in the row, in any order (as multisets).

A row conforms when its score is 1; the batch's score is the mean over scored rows.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any
from collections.abc import Sequence

from jinja2 import Undefined

from engine.templates.sandbox import TemplateFailure, compile_expression
from engine.errors import UsageError
from engine.journal.history import RunState

__all__ = ["MATCH_MODES", "Step", "trajectory", "conformance", "check_expectations",
           "parse_expectation", "Golden"]

MATCH_MODES = ("exact", "in_order", "any_order")

Step = tuple[str, str]
"""(role, action)"""


def parse_expectation(source: str) -> str:
    """The bare expression of `{{ expr }}` (or `expr`); UsageError when it does not parse."""
    match = re.fullmatch(r"\{\{(.*)\}\}", source.strip(), re.S)
    expression = (match.group(1) if match else source).strip()
    try:
        compile_expression(expression)
    except Exception as exc:  # noqa: BLE001 - any jinja syntax error is the user's
        raise UsageError(f"expectation {source!r} does not parse: {exc}") from None
    return expression


def check_expectations(sources: Sequence[str], line: dict[str, Any], inputs: dict[str, Any],
                       msgs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each expectation with `passed` (and `error` when it could not be evaluated)."""
    variables = {"run": {**line, "inputs": inputs}, "msgs": msgs}
    return [_check(source, variables) for source in sources]


def _check(source: str, variables: dict[str, Any]) -> dict[str, Any]:
    try:
        value = compile_expression(parse_expectation(source))(**variables)
        if isinstance(value, Undefined):
            bool(value)            # StrictUndefined: using it raises and names what is missing
        return {"expect": source, "passed": bool(value)}
    except (TemplateFailure, UsageError) as exc:
        return {"expect": source, "passed": False, "error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - any jinja/sandbox failure fails the expectation
        return {"expect": source, "passed": False, "error": f"{type(exc).__name__}: {exc}"}


def trajectory(state: RunState) -> list[Step]:
    """The completed actions of a run in order, the steps of one round sorted."""
    done = [r for r in state.timeline if r.completed]
    return [(r.role, r.action) for r in sorted(done, key=lambda r: (r.round, r.role, r.action))]


@dataclass(frozen=True)
class Golden:
    """The golden trajectory rows are compared with, and how."""

    steps: tuple[Step, ...]
    mode: str = "in_order"


def conformance(golden: Golden, actual: Sequence[Step]) -> dict[str, Any]:
    """The row's score against the golden trajectory, and the first step that differs."""
    expected = list(golden.steps)
    if golden.mode == "exact":
        score = 1.0 if list(actual) == expected else 0.0
    elif golden.mode == "in_order":
        score = _lcs(expected, list(actual)) / len(expected) if expected else 1.0
    else:
        found = sum((Counter(expected) & Counter(actual)).values())
        score = found / len(expected) if expected else 1.0
    result: dict[str, Any] = {"mode": golden.mode, "score": round(score, 4), "conforms": score == 1.0}
    if score < 1.0:
        result["first_difference"] = _first_difference(expected, list(actual))
    return result


def _lcs(a: list[Step], b: list[Step]) -> int:
    """Length of the longest common subsequence (two rows of the table: O(len(b)) memory)."""
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b, start=1):
            current.append(previous[j - 1] + 1 if x == y else max(previous[j], current[j - 1]))
        previous = current
    return previous[-1]


def _first_difference(expected: list[Step], actual: list[Step]) -> str:
    for index, (want, got) in enumerate(zip(expected, actual, strict=False), start=1):
        if want != got:
            return f"step {index}: expected {'.'.join(want)}, got {'.'.join(got)}"
    if len(actual) < len(expected):
        return f"step {len(actual) + 1}: expected {'.'.join(expected[len(actual)])}, the run ended"
    return f"step {len(expected) + 1}: an extra step {'.'.join(actual[len(expected)])}"
