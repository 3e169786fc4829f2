"""Property: whatever bytes or documents the checker is given, it answers with diagnostics.

No exception may escape `check_text` (a shared SOP file is untrusted input), and every
diagnostic it returns is complete: a known code, a severity, a message and a position.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.compile.compiler import check_text
from engine.check.diagnostics import CODES
from engine.load import schema as sop_schema
from engine.load.source import load_path

from run_helpers import TESTS

BASE = load_path(TESTS / "cases" / "valid" / "company.sop.yaml").data
WORDS = ["WritePRD", "WriteCode", "Engineer", "UserRequirement", "<all>", "<self>", "text", "str",
         "list[str]", "{{ out['X'] }}", "{{ nope }}", "{% for %}", "../x", "/abs", "plan_and_act",
         "max_runs", "react", "", "sop/v1", "enum[a|b]", "kind", "exec"]
# examples a property: the suite's profile (tests/conftest.py; SOPCTL_FUZZ_EXAMPLES for a long session)
SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 100), st.floats(allow_nan=False),
                    st.sampled_from(WORDS), st.text(max_size=12))
documents = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.one_of(st.sampled_from(WORDS), st.text(max_size=8)), inner, max_size=4)),
    max_leaves=30)


def _models_accept(data: Any) -> bool:
    from pydantic import ValidationError

    from engine.load.spec import Sop

    try:
        Sop.model_validate(data)
    except ValidationError:
        return False
    return True


def _assert_only_diagnostics(text: str) -> None:
    result = check_text(text, "fuzz.sop.yaml")
    for diag in result.diagnostics:
        assert diag.code in CODES, diag
        assert diag.severity in ("error", "warning") and diag.message
        assert diag.line >= 1 and diag.col >= 1, diag
    assert (result.compiled is not None) == result.ok


@SETTINGS
@given(st.text(max_size=300))
def test_random_text(text: str) -> None:
    _assert_only_diagnostics(text)


@SETTINGS
@given(documents)
def test_random_documents(doc: Any) -> None:
    _assert_only_diagnostics(json.dumps(doc))


def _paths(node: Any, path: tuple = ()) -> list[tuple]:
    found = [path]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, path + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, path + (index,))
    return found


ALL_PATHS = _paths(BASE)[1:]


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(ALL_PATHS), st.sampled_from(["set", "delete", "rename"]), documents),
                min_size=1, max_size=4))
def test_mutated_valid_document(mutations: list) -> None:
    doc = copy.deepcopy(BASE)
    for path, how, value in mutations:
        _mutate(doc, path, how, value)
    _assert_only_diagnostics(json.dumps(doc))
    # the fast path of the compiler relies on this: the schema and the models agree
    assert (not sop_schema.validate(doc)) == _models_accept(doc)


def _mutate(doc: Any, path: tuple, how: str, value: Any) -> None:
    parent = doc
    for step in path[:-1]:
        try:
            parent = parent[step]
        except (KeyError, IndexError, TypeError):
            return
    last = path[-1]
    if isinstance(parent, dict) and last in parent:
        if how == "delete":
            del parent[last]
        elif how == "rename":
            parent[str(value)[:12] or "x"] = parent.pop(last)
        else:
            parent[last] = value
    elif isinstance(parent, list) and isinstance(last, int) and last < len(parent):
        if how == "delete":
            parent.pop(last)
        else:
            parent[last] = value


@SETTINGS
@given(st.integers(0, 2000), st.integers(0, 40), st.text(max_size=10))
def test_edited_yaml_text(at: int, cut: int, insert: str) -> None:
    text = (TESTS / "cases" / "valid" / "company.sop.yaml").read_text(encoding="utf-8")
    at = min(at, len(text))
    _assert_only_diagnostics(text[:at] + insert + text[at + cut:])


@SETTINGS
@given(st.binary(max_size=300))
def test_random_bytes_only_give_load_errors(raw: bytes) -> None:
    from engine.errors import LoadError
    from engine.load.source import load_bytes

    try:
        load_bytes(raw, "fuzz.sop.yaml")
    except LoadError as exc:
        assert exc.diagnostics and all(d.code in CODES for d in exc.diagnostics)


TEMPLATE_BITS = ["{{", "}}", "{%", "%}", "{#", "#}", " for x in ", " endfor ", " if ", " endif ", "out", "msgs",
                 ".WritePRD", "[-1]", ".out", "['Project Name']", "['Nope']", "inputs", ".idea", ".nope", "|",
                 " tojson ", " upper ", " shout ", "(", ")", "'", '"', "\\", "..", "/", " is defined ", "item",
                 " set y = ", " macro ", " include ", "x", " ", "\n"]


@SETTINGS
@given(st.sampled_from(["prompt", "for_each", "path", "content"]),
       st.lists(st.sampled_from(TEMPLATE_BITS), max_size=20).map("".join))
def test_random_templates(where: str, template: str) -> None:
    doc = copy.deepcopy(BASE)
    action = doc["actions"]["WriteDesign"]
    if where in ("path", "content"):
        action["artifacts"] = [{"path": "x.md", "content": "x", where: template}]
    else:
        action[where] = template
    _assert_only_diagnostics(json.dumps(doc))
