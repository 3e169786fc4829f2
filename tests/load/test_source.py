"""Safe loading: plain data out, positions for every pointer, every hostile input refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import LoadError
from engine.load.source import (
    MAX_ALIASES,
    MAX_FILE_BYTES,
    iter_pointers,
    load_path,
    load_text,
)

from run_helpers import ROOT


def _codes(text: str) -> list[str]:
    with pytest.raises(LoadError) as caught:
        load_text(text, "t.yaml")
    return [d.code for d in caught.value.diagnostics]


def test_plain_data_types() -> None:
    data = load_text("a: 1\nb: 2.5\nc: true\nd: ~\ne: [x, {f: g}]\nh: 2001-12-14\ni: yes\nj: 0x1f\n").data
    assert data == {"a": 1, "b": 2.5, "c": True, "d": None, "e": ["x", {"f": "g"}],
                    "h": "2001-12-14", "i": "yes", "j": 31}
    assert all(type(v) in (int, float, bool, str, list, type(None)) for v in data.values())


def test_every_pointer_has_a_position() -> None:
    source = load_text("top:\n  list:\n    - one\n    - {key: value}\n")
    for pointer in iter_pointers(source.data):
        assert pointer in source.map.values
    assert source.map.values["/top/list/1/key"] == (4, 13)
    assert source.map.keys["/top/list"] == (2, 3)


def test_pointer_escaping_and_nearest_ancestor() -> None:
    source = load_text("a/b:\n  c~d: 1\n")
    assert source.map.values["/a~1b/c~0d"] == (2, 8)
    assert source.map.locate("/a~1b/c~0d/missing/deeper") == (2, 8)


def test_python_tag_is_refused_and_never_constructed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    text = f'x: !!python/object/apply:os.system ["touch {marker}"]\n'
    assert _codes(text) == ["SOP006"]
    assert not marker.exists()


def test_custom_and_explicit_non_core_tags_are_refused() -> None:
    assert _codes("x: !custom 1\ny: !!set {a: null}\n") == ["SOP006", "SOP006"]


def test_explicit_core_tags_are_honoured() -> None:
    assert load_text("a: !!str 12\nb: !!int '7'\n").data == {"a": "12", "b": 7}
    assert _codes("a: !!int seven\n") == ["SOP006"]


def test_duplicate_keys_are_reported_with_the_first_place() -> None:
    with pytest.raises(LoadError) as caught:
        load_text("a: 1\nb: 2\na: 3\n")
    (diag,) = caught.value.diagnostics
    assert (diag.code, diag.line, diag.related[0].line) == ("SOP007", 3, 1)


def test_all_problems_of_the_load_phase_together() -> None:
    assert _codes("a: !x 1\na: 2\n<<: {b: 1}\n") == ["SOP006", "SOP007", "SOP011"]


def test_alias_bomb_by_expansion() -> None:
    levels = ["l0: &l0 [" + ", ".join(["x"] * 50) + "]"]
    for i in range(1, 5):
        levels.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
    assert _codes("\n".join(levels) + "\n") == ["SOP008"]


def test_alias_count_limit() -> None:
    text = "a: &a x\nb: [" + ", ".join(["*a"] * (MAX_ALIASES + 1)) + "]\n"
    assert _codes(text) == ["SOP008"]


def test_a_few_aliases_are_fine() -> None:
    assert load_text("a: &a [1, 2]\nb: *a\n").data == {"a": [1, 2], "b": [1, 2]}


def test_recursive_alias() -> None:
    assert _codes("a: &a [1, *a]\n") == ["SOP008"]


def test_deep_nesting_both_within_and_beyond_the_parser() -> None:
    assert _codes("a: " + "[" * 70 + "]" * 70 + "\n") == ["SOP009"]
    assert _codes("a: " + "[" * 5000 + "]" * 5000 + "\n") == ["SOP009"]


def test_syntax_error_is_located() -> None:
    with pytest.raises(LoadError) as caught:
        load_text("a: 1\nb: [1, 2\n")
    diag = caught.value.diagnostics[0]
    assert diag.code == "SOP005" and diag.line >= 2


@pytest.mark.parametrize("text,code", [
    ("", "SOP004"), ("   \n# only comments\n", "SOP004"), ("---\n", "SOP004"),
    ("- a\n", "SOP010"), ("just a string\n", "SOP010"), ("a: 1\n---\nb: 2\n", "SOP005"),
    ("? [a, b]\n: 1\n", "SOP011"),
])
def test_unusable_documents(text: str, code: str) -> None:
    assert _codes(text) == [code]


def test_files_that_are_not_sop_text(tmp_path: Path) -> None:
    cases = {
        "missing.sop.yaml": None,
        "binary.sop.yaml": b"\x00\x01\x02",
        "latin1.sop.yaml": "name: caf\xe9\n".encode("latin-1"),
        "big.sop.yaml": b"a: " + b"x" * (MAX_FILE_BYTES + 10) + b"\n",
    }
    expected = {"missing.sop.yaml": "SOP001", "binary.sop.yaml": "SOP003",
                "latin1.sop.yaml": "SOP003", "big.sop.yaml": "SOP002"}
    for name, content in cases.items():
        if content is not None:
            (tmp_path / name).write_bytes(content)
        with pytest.raises(LoadError) as caught:
            load_path(tmp_path / name)
        assert [d.code for d in caught.value.diagnostics] == [expected[name]], name
    with pytest.raises(LoadError) as caught:
        load_path(tmp_path)
    assert caught.value.diagnostics[0].code == "SOP001"


def test_utf8_bom_is_accepted() -> None:
    assert load_text("\ufeffa: 1\n").data == {"a": 1}


def test_crlf_line_endings_keep_positions() -> None:
    source = load_text("a: 1\r\nb:\r\n  c: [x, y]\r\n")
    assert source.data == {"a": 1, "b": {"c": ["x", "y"]}}
    assert source.map.values["/b/c/1"] == (3, 10)


def test_escaped_surrogates_pair_up_or_are_refused() -> None:
    assert load_text('a: "\\ud83d\\ude00"\n').data == {"a": "\U0001F600"}   # JSON's emoji escape
    with pytest.raises(LoadError) as caught:
        load_text('a: "x\\ud800"\n"k\\udc00": 1\nb: ["\\ude00\\ud83d"]\n')
    found = [(d.code, d.line, d.col, d.pointer) for d in caught.value.diagnostics]
    assert found == [("SOP003", 1, 4, "/a"), ("SOP003", 2, 1, ""), ("SOP003", 3, 5, "/b/0")]


_TRICKY_SCALARS = ("a: yes\nb: on\nc: 0o17\nd: 012\ne: 1_000\nf: 1:20\ng: ~\nh: .inf\ni: .NaN\n"
                   "j: 2001-12-14t21:59:43.10-05:00\nk: 0x1F\nl: +12\nm: -.5\nn: 1e3\no: 'yes'\n"
                   "p: !!str 3\nq: &x {a: 1}\nr: *x\ns:\n  <<: *x\nt: !custom x\nu: NULL\nv: é\n"
                   "w: \"\\u00e9 x\"\nx: |\n  block\n   text\ny: >-\n  folded\n   more\n")


def _nodes(node: object, seen: frozenset[int] = frozenset()) -> list[tuple[object, ...]]:
    """A node tree as rows: kind, tag, position and scalar value (an alias as a back-reference)."""
    if id(node) in seen:
        return [("alias", node.tag)]  # type: ignore[attr-defined]
    row = (type(node).__name__, node.tag, node.start_mark.line, node.start_mark.column,  # type: ignore[attr-defined]
           node.value if isinstance(node.value, str) else None)  # type: ignore[attr-defined]
    children = node.value if isinstance(node.value, list) else []  # type: ignore[attr-defined]
    rows = [row]
    for child in children:
        for part in (child if isinstance(child, tuple) else (child,)):
            rows += _nodes(part, seen | {id(node)})
    return rows


def test_libyaml_and_the_pure_parser_give_the_same_nodes() -> None:
    """SOP files are parsed by libyaml for speed; they must mean exactly what ruamel's
    pure-Python YAML 1.2 parser reads (the same tags, values, positions and aliases)."""
    from engine.load.source import _composer

    texts = [_TRICKY_SCALARS] + [p.read_text("utf-8") for folder in ("sops", "examples")
                                 for p in sorted((ROOT / folder).rglob("*.yaml"))]
    assert len(texts) > 10
    assert _composer(pure=False).Parser.__name__ == "CParser"   # ruamel.yaml.clib, a dependency
    for text in texts:
        fast, pure = _composer(pure=False).compose(text), _composer(pure=True).compose(text)
        assert _nodes(fast) == _nodes(pure)


def test_a_file_libyaml_refuses_gets_the_located_diagnostic_of_the_pure_parser() -> None:
    with pytest.raises(LoadError) as caught:
        load_text("a: 1\nb: {c: \"unclosed\n", "t.yaml")
    diag = caught.value.diagnostics[0]
    assert (diag.code, diag.line, diag.related[0].line) == ("SOP005", 3, 2)
    assert "while scanning a quoted scalar" in diag.message


@pytest.mark.parametrize(("text", "hint"), [
    ("a:\n  b: 1\n c: 2\n", "indentation matches no key above it"),
    ("a: {b: 1\nc: 2\n", "is not closed, or misses a comma"),
    ("a: [1, 2\n", "is not closed, or misses a comma"),
    ("a: 1\nb\nc: 2\n", "a key needs ': ' after it"),
    ("a:\n\tb: 1\n", "indent with spaces"),
    ("a: b: c\n", "quote a value that contains ': '"),
])
def test_a_yaml_mistake_gets_a_hint_that_says_how_to_fix_it(text: str, hint: str) -> None:
    with pytest.raises(LoadError) as caught:
        load_text(text, "t.yaml")
    (diag,) = caught.value.diagnostics
    assert diag.code == "SOP005" and hint in diag.hint, diag.message
