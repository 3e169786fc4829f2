"""The index of names (engine/lsp/index.py): every reference lands on the name as written,
whatever the scalar's style."""

from __future__ import annotations

import os

from engine.load.source import load_text
from engine.lsp.index import build_index

TEXT = """\
apiVersion: sop/v1
name: styles
inputs:
  idea: {type: str}
actions:
  Draft:
    prompt: 'It''s {{ inputs.idea }} and {{ inputs["idea"] }}'
    output:
      Title: {type: str, children: {Sub: {type: str}}}
  Quoted:
    prompt: "Say \\"{{ msgs.Draft[-1].out['Title'] }}\\" then {{ msgs.Draft[-1].out['Title'] }}"
  Block:
    prompt: |
      First {{ msgs['Draft'][-1].content }}
        {{ msgs.Draft[-1].out['Title']['Sub'] }}
    artifacts:
      - {path: a.md, content: "{{ out }}"}
roles:
  Alice: {name: Al, actions: [Draft, Quoted, Block], watch: [UserRequirement, Draft]}
team: {send_to: [Al]}
"""


def _written(index, symbol) -> list[str]:
    return [TEXT.splitlines()[s.line][s.start:s.end] for s in index.references.get(symbol, [])]


def test_references_land_on_the_names_as_written() -> None:
    index = build_index(load_text(TEXT, os.path.abspath("styles.sop.yaml")))
    assert _written(index, ("input", "idea")) == ["idea", "idea"]
    assert _written(index, ("action", "Draft")) == ["Draft"] * 6
    assert _written(index, ("output", "Draft/Title")) == ["Title"] * 3
    assert _written(index, ("output", "Draft/Title/Sub")) == ["Sub"]
    assert _written(index, ("role", "Alice")) == ["Al"]


def test_definitions_and_the_symbol_under_a_position() -> None:
    index = build_index(load_text(TEXT, os.path.abspath("styles.sop.yaml")))
    lines = TEXT.splitlines()
    span = index.definitions[("output", "Draft/Title/Sub")]
    assert lines[span.line][span.start:span.end] == "Sub"
    line = next(i for i, text in enumerate(lines) if text.startswith("      First"))
    col = lines[line].index("Draft")
    assert index.symbol_at(index.file, line, col + 2) == ("action", "Draft")
    assert index.symbol_at(index.file, line, 0) is None
