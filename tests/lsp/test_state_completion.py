"""An editor completes the shared state's variables (`state.X`) and offers `state` and `out`
where the templates of the new forms read them (docs/state.md)."""

from __future__ import annotations

from engine.load.source import load_text
from engine.lsp.completion import complete
from engine.lsp.index import build_index

TEXT = """apiVersion: sop/v1
name: x
state:
  day: {type: int, description: the day}
actions:
  A:
    kind: compute
    content: "{{ state. }}"
  B:
    prompt: go
    content: "{{  }}"
roles:
  R: {actions: [A, B], watch: [UserRequirement], react_mode: by_order}
"""


def _labels(line: int, after: str) -> list[str]:
    col = TEXT.splitlines()[line].index(after) + len(after)
    return [item.label for item in complete(TEXT, line, col, build_index(load_text(TEXT, "x.sop.yaml")), "x.sop.yaml")]


def test_state_variables_are_completed_with_their_description() -> None:
    assert _labels(7, "{{ state.") == ["day"]


def test_content_offers_state_and_out_except_on_a_compute_action() -> None:
    labels = _labels(10, "{{ ")
    assert "state" in labels and "out" in labels
