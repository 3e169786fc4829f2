"""The `fake` model: deterministic, schema-conforming, offline, through the real parse path."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import LLMError
from engine.load.outputs import output_schema
from engine.load.spec import OutputNode
from engine.models import answers
from engine.models.fake import FakeModel, answer_text, instance, latency_s
from engine.models.gateway import Gateway
from engine.models.types import CallSpec, ModelRequest
from engine.testing import block_real_models


@pytest.fixture(autouse=True)
def _no_real_models():
    with block_real_models():
        yield


def spec(kind: str = "json", **kw) -> CallSpec:
    base = dict(action="WriteDesign", role="Architect", system="You are Bob.", prompt="Design it.",
                kind=kind, model="fake")
    base.update(kw)
    return CallSpec(**base)


def call(call_spec: CallSpec):
    return asyncio.run(Gateway().call(call_spec))


# ----------------------------------------------------------------------------- type trees

_LEAF = st.sampled_from(["str", "int", "float", "bool", "enum[a|b|c]", "enum[1|x]"])
_TYPES = st.recursive(_LEAF, lambda inner: st.one_of(
    inner.map(lambda t: f"list[{t}]"),
    inner.map(lambda t: f"dict[str, {t}]"),
    inner.map(lambda t: f"optional[{t}]"),
), max_leaves=4)
_KEYS = st.sampled_from(["Project Name", "File list", "Task list", "Product Goals", "task_id",
                         "Language", "Anything UNCLEAR", "score", "Requirement Pool", "x"])


def _nodes(depth: int = 2):
    leaf = _TYPES.map(lambda t: OutputNode(type=t, instruction="do it"))
    if depth == 0:
        return leaf
    children = st.dictionaries(_KEYS, _nodes(depth - 1), min_size=1, max_size=4)
    return st.one_of(leaf, leaf, children.map(lambda c: OutputNode(children=c)),
                     children.map(lambda c: OutputNode(type="list", children=c)))


TREES = st.dictionaries(_KEYS, _nodes(), min_size=1, max_size=6)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TREES)
def test_fake_instances_validate_against_every_compiled_output_tree(tree):
    schema = output_schema(tree)
    assert answers.schema_errors(instance(schema), schema) == []


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TREES, st.sampled_from(["json", "markdown"]))
def test_fake_answers_pass_the_gateway_in_both_formats(tree, fmt):
    schema = output_schema(tree)
    result = call(spec(schema=schema, format=fmt))
    assert result.value == instance(schema) and result.attempts == 1


@pytest.mark.parametrize("schema", [
    {"type": "array", "items": {"type": "integer", "minimum": 3}, "minItems": 3, "uniqueItems": False},
    {"type": "integer", "exclusiveMinimum": 5, "maximum": 10},
    {"type": "number", "minimum": -2.5},
    {"type": "number", "maximum": -1},
    {"type": "string", "minLength": 40, "maxLength": 50},
    {"type": "string", "maxLength": 3},
    {"type": ["null", "string"]},
    {"const": "fixed"},
    {"type": "array", "items": {"type": "string"}, "maxItems": 0},
    {"oneOf": [{"type": "null"}, {"type": "boolean"}]},
    {"allOf": [{"type": "object"}, {"properties": {"a": {"type": "integer"}}, "required": ["a"]}]},
    {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "number"}}},
    {"properties": {"implicit": {"items": {"type": "boolean"}}}},
])
def test_fake_instances_respect_keywords(schema):
    assert answers.schema_errors(instance(schema), schema) == []


def test_fake_values_follow_the_contract_and_look_plausible():
    tree = {
        "Project Name": OutputNode(type="str"),
        "Product Goals": OutputNode(type="list[str]"),
        "File list": OutputNode(type="list[str]"),
        "Task list": OutputNode(type="list[str]"),
        "Priority": OutputNode(type="enum[P0|P1|P2]"),
        "Ready": OutputNode(type="bool"),
        "Count": OutputNode(type="int"),
        "Ratio": OutputNode(type="float"),
        "Summary": OutputNode(type="str"),
        "Tasks": OutputNode(type="list", children={"task_id": OutputNode(type="str")}),
    }
    value = call(spec(schema=output_schema(tree))).value
    assert value == {
        "Project Name": "project_name", "Product Goals": ["Product Goals item"],
        "File list": ["main.py"], "Task list": ["main.py"], "Priority": "P0", "Ready": False,
        "Count": 0, "Ratio": 0.0, "Summary": "Example summary", "Tasks": [{"task_id": "1"}],
    }


def test_a_table_whose_instruction_names_its_columns_gets_a_cell_per_column():
    """`[file, ...]` rows start with the fake's file, so a template picking rows by file finds them."""
    tree = {
        "Logic Analysis": OutputNode(type="list[list[str]]", instruction="one [file, contents] row per file"),
        "Interfaces": OutputNode(type="optional[list[list[str]]]", instruction="[file, interface, ...] rows"),
        "Pool": OutputNode(type="list[list[str]]", instruction="each as [priority, requirement]"),
        "Rows": OutputNode(type="list[list[str]]", instruction="rows of anything"),
    }
    value = call(spec(schema=output_schema(tree))).value
    assert value == {"Logic Analysis": [["main.py", "Example contents"]],
                     "Interfaces": [["main.py", "Example interface"]],
                     "Pool": [["Example priority", "Example requirement"]],
                     "Rows": [["Rows item"]]}


def test_same_request_same_answer():
    tree = output_schema({"A": OutputNode(type="list[dict[str, int]]")})
    first = asyncio.run(FakeModel().complete(ModelRequest(spec(schema=tree), (), None)))
    second = asyncio.run(FakeModel().complete(ModelRequest(spec(schema=tree), (), None)))
    assert first == second and first.cost_usd == 0
    assert first.completion_tokens == len(first.text) // 4


def test_markdown_format_answers_with_sections_that_the_gateway_parses():
    schema = output_schema({"Title": OutputNode(type="str"), "Items": OutputNode(type="list[int]")})
    text = answer_text(spec(schema=schema, format="markdown"))
    assert text.startswith("## Title\n") and "## Items\n[0]" in text


def test_text_answer_is_a_short_sentence():
    result = call(spec("text"))
    assert result.value.endswith(".") and "WriteDesign" in result.value and len(result.value) < 120


@pytest.mark.parametrize("lang", ["python", "go", "rust", "javascript", "java", "c", "sql", "brainfuck"])
def test_code_answer_is_a_fenced_minimal_program(lang):
    result = call(spec("code", code_lang=lang))
    assert result.value.strip()
    assert answer_text(spec("code", code_lang=lang)).startswith(f"```{lang}\n")
    if lang == "python":
        compile(result.value, "main.py", "exec")
        assert "def main() -> None:" in result.value


def test_choice_walks_the_states_in_order_then_stops():
    answers_ = [call(spec("choice", n_choices=3, previous_choice=p)).value for p in (-1, 0, 1, 2)]
    assert answers_ == [0, 1, 2, -1]


def test_latency_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("SOPCTL_FAKE_LATENCY_MS", raising=False)
    assert latency_s() == 0
    monkeypatch.setenv("SOPCTL_FAKE_LATENCY_MS", "5")
    assert latency_s() == 0.005
    assert call(spec("text")).value
    for bad in ("abc", "-1", "nan", "inf"):
        monkeypatch.setenv("SOPCTL_FAKE_LATENCY_MS", bad)
        with pytest.raises(LLMError, match="SOPCTL_FAKE_LATENCY_MS must be"):
            latency_s()


def test_fake_is_not_blocked_by_the_real_model_guard():
    assert call(spec("text")).usage.llm_calls == 1


def test_fake_json_is_plain_json_text():
    schema = output_schema({"A": OutputNode(type="str")})
    assert json.loads(answer_text(spec(schema=schema))) == {"A": "Example a"}


@pytest.mark.parametrize("pattern", [
    r"^v[0-9]+\.[0-9]+$", r"^[A-Z]{3}-\d{4}$", r"^(yes|no)$", r"^[^\s@]+@[^\s@]+\.[a-z]{2,}$",
    r"^\w+(,\s*\w+)*$", r"^P[0-2]$", r"^.{5,10}$", r"(?i)^ABC$",
])
def test_fake_strings_match_an_output_nodes_pattern(pattern):
    import re

    value = instance(output_schema({"Version": OutputNode(type="str", pattern=pattern),
                                    "Tags": OutputNode(type="list[str]", pattern=pattern)}))
    assert re.search(pattern, value["Version"])
    assert all(re.search(pattern, tag) for tag in value["Tags"])


def test_an_sop_with_a_pattern_runs_on_fake(tmp_path):
    from engine import api
    from engine.compile.compiler import compile_text

    sop = ("apiVersion: sop/v1\nname: p\nactions:\n  Tag:\n    prompt: tag it\n"
           "    output: {Version: {type: str, pattern: '^v[0-9]+\\.[0-9]+$'}}\n"
           "roles:\n  R: {actions: [Tag], watch: [UserRequirement]}\n")
    result = api.run(compile_text(sop), {"idea": "x"}, model="fake", workspace=tmp_path / "ws")
    assert result.status == "idle", result.error
    assert result.messages[-1].out == {"Version": "v0.0"}
