"""Where the cursor is, read from the text of a half-typed SOP file (engine/lsp/cursor.py)."""

from __future__ import annotations

import pytest

from engine.lsp.cursor import ITEM, from_client, place_at, template_before, to_client, use_encoding

DOC = """\
apiVersion: sop/v1
actions:
  WritePRD:
    kind: llm
    prompt: |
      Hello {{ inputs.idea }}
    output:
      Title: {type: str, ins
    artifacts:
      - path: a.md
        con
  Other:
    context: [WritePRD, Wr
roles:
  Alice:
    watch:
      - Wri
    actions: [WritePRD]
    \n"""


def _place(marker: str, line_text: str | None = None):
    lines = DOC.split("\n")
    line = next(i for i, text in enumerate(lines) if text.startswith(marker))
    return place_at(lines, line, len(line_text if line_text is not None else lines[line]))


def test_a_key_being_typed_in_a_flow_mapping() -> None:
    place = _place("      Title:")
    assert place.path == ("actions", "WritePRD", "output", "Title") and place.in_key
    assert place.word == "ins" and set(place.siblings) == {"type"}


def test_a_key_of_a_list_items_mapping() -> None:
    place = _place("        con")
    assert place.path == ("actions", "WritePRD", "artifacts", ITEM) and place.in_key
    assert place.siblings == {"path": "a.md"}


@pytest.mark.parametrize(("marker", "path", "key"), [
    ("    context: [", ("actions", "Other"), "context"),
    ("      - Wri", ("roles", "Alice"), "watch"),
])
def test_an_item_of_a_list(marker: str, path: tuple[str, ...], key: str) -> None:
    place = _place(marker)
    assert (place.path, place.key, place.in_list) == (path, key, True)
    assert place.word in ("Wr", "Wri")


def test_inside_a_block_scalar() -> None:
    place = _place("      Hello")
    assert place.in_block and place.path == ("actions", "WritePRD") and place.key == "prompt"


def test_a_value_and_the_keys_beside_it() -> None:
    place = _place("    kind: llm")
    assert (place.path, place.key, place.word) == (("actions", "WritePRD"), "kind", "llm")
    assert set(place.siblings) == {"kind", "prompt", "output", "artifacts"}


def test_an_empty_line_under_a_role() -> None:
    lines = DOC.split("\n")
    place = place_at(lines, len(lines) - 2, 4)
    assert place.path == ("roles", "Alice") and place.in_key
    assert set(place.siblings) == {"watch", "actions"}


def test_template_before_the_cursor() -> None:
    text = "prompt: 'a {{ msgs.Write'"
    assert template_before(text, len(text) - 1) == " msgs.Write"
    assert template_before("{{ a }} b", 9) is None
    assert template_before("{% for x in msgs.", 17) == " for x in msgs."


def test_columns_in_utf16_units() -> None:
    text = "a: '😀 {{ inputs.x }}'"
    col = text.index("inputs")
    assert to_client(text, col) == col + 1
    assert from_client(text, to_client(text, col)) == col


def test_columns_in_utf8_or_utf32_when_the_client_counts_so() -> None:
    text = "a: 'é😀 {{ inputs.x }}'"
    col = text.index("inputs")
    try:
        use_encoding("utf-8")
        assert to_client(text, col) == len(text[:col].encode("utf-8"))
        assert from_client(text, to_client(text, col)) == col
        use_encoding("utf-32")
        assert to_client(text, col) == col
    finally:
        use_encoding("utf-16")


def test_nested_flow_collections() -> None:
    line = "  Writer: {actions: [Draft], watch: [UserReq"
    place = place_at(["roles:", line], 1, len(line))
    assert (place.path, place.key, place.in_list, place.word) == (("roles", "Writer"), "watch", True, "UserReq")
    line = "  idea: {type: str, desc"
    place = place_at(["inputs:", line], 1, len(line))
    assert place.path == ("inputs", "idea") and place.in_key and place.word == "desc"
    line = "    artifacts: [{path: a.md, con"
    place = place_at(["actions:", "  A:", line], 2, len(line))
    assert place.path == ("actions", "A", "artifacts", ITEM) and place.in_key
