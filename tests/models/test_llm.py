"""The gateway: validation and re-asks, parsing, retries, budget, journal reuse, replay, keys."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from engine.errors import (
    ActionFailed,
    BudgetExceeded,
    LLMError,
    ReplayDivergence,
    RunError,
    UsageError,
)
from engine.models import answers
from engine.models.gateway import Gateway
from engine.models.hosted import LiteLLMProvider
from engine.models.types import (
    CallSpec,
    ModelRequest,
    Price,
    TransientModelError,
    Usage,
    request_hash,
)
from engine.run.events import ModelAnswered, ModelRetried
from engine.testing import (
    MemoryAnswerStore,
    ScriptedModel,
    allow_real_models,
    block_real_models,
    use_model,
)

from run_helpers import TESTS

SCHEMA = {
    "type": "object",
    "properties": {
        "Project Name": {"type": "string", "description": "snake_case name"},
        "Product Goals": {"type": "array", "items": {"type": "string"}},
        "Priority": {"type": "string", "enum": ["P0", "P1"]},
        "Done": {"type": "boolean"},
        "Notes": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["Project Name", "Product Goals", "Priority", "Done"],
    "additionalProperties": False,
}
VALID = {"Project Name": "game_2048", "Product Goals": ["fun", "fast"], "Priority": "P0", "Done": False}


@pytest.fixture(autouse=True)
def _no_real_models():
    with block_real_models():
        yield


def spec(kind: str = "json", **kw) -> CallSpec:
    base = dict(action="WritePRD", role="PM", system="You are a PM.", prompt="Write the PRD.",
                kind=kind, model="scripted", schema=SCHEMA if kind == "json" else None)
    base.update(kw)
    return CallSpec(**base)


def run(gateway: Gateway, call_spec: CallSpec):
    return asyncio.run(gateway.call(call_spec))


def scripted(*answers_, **kw) -> tuple[Gateway, ScriptedModel]:
    model = ScriptedModel(list(answers_), **kw)
    return Gateway(providers={"scripted": model}, sleep=_no_sleep), model


async def _no_sleep(seconds: float) -> None:
    return None


# ----------------------------------------------------------------------------- structured output


def test_valid_json_is_accepted_first_time():
    gateway, model = scripted(json.dumps(VALID))
    result = run(gateway, spec())
    assert result.value == VALID
    assert (result.usage.llm_calls, result.attempts, model.calls) == (1, 1, 1)
    assert gateway.usage.llm_calls == 1 and gateway.usage.reasks == 0


def test_invalid_answer_is_reasked_with_the_error_then_accepted():
    bad = json.dumps({**VALID, "Priority": "urgent"})
    gateway, model = scripted(bad, json.dumps(VALID))
    result = run(gateway, spec())
    assert result.value == VALID and result.usage.llm_calls == 2
    second = model.requests[1]
    assert second.attempt == 1
    assert second.messages[-2] == {"role": "assistant", "content": bad}
    assert "'urgent' is not one of ['P0', 'P1']" in second.messages[-1]["content"]
    assert "at /Priority" in second.messages[-1]["content"]
    assert gateway.usage.reasks == 1


def test_invalid_after_retries_fails_the_action_with_the_last_error():
    gateway, model = scripted("no json here", "{}", '{"Project Name": 3}')
    with pytest.raises(ActionFailed) as info:
        run(gateway, spec(retries=2))
    assert info.value.action == "WritePRD"
    assert "WritePRD" in str(info.value) and "3 attempt(s)" in str(info.value)
    assert "3 is not of type 'string'" in str(info.value)
    assert model.calls == 3


@pytest.mark.parametrize("answer", [
    json.dumps({**VALID, "Extra": 1}),                    # unknown key
    json.dumps({k: v for k, v in VALID.items() if k != "Done"}),  # missing key
    json.dumps({**VALID, "Product Goals": "fun"}),        # wrong type
    json.dumps({**VALID, "Done": "false"}),               # string for bool
    json.dumps([VALID]),                                   # array, not object
    '{"Project Name": "x", ',                              # torn JSON
    "Sure! Here is the PRD you asked for.",               # prose only
    "",
])
def test_an_invalid_answer_is_never_accepted(answer):
    gateway, _ = scripted(answer)
    with pytest.raises(ActionFailed):
        run(gateway, spec(retries=0))


@pytest.mark.parametrize("wrapped", [
    "```json\n{doc}\n```",
    "Here is the document:\n{doc}\nHope this helps!",
    "[CONTENT]\n{doc}\n[/CONTENT]",
    "Thoughts {{not json}} then\n```\n{doc}\n```",
])
def test_json_is_found_behind_fences_prose_and_content_tags(wrapped):
    gateway, _ = scripted(wrapped.format(doc=json.dumps(VALID, indent=2)))
    assert run(gateway, spec()).value == VALID


@pytest.mark.parametrize("wrapped", ["{doc}", "Here it is:\n{doc}"])
def test_a_raw_newline_or_tab_inside_a_json_string_is_read_as_itself(wrapped):
    """Small models write a multi-line value as is; JSON wants it escaped, but what it means
    is not in doubt (the embedded model's tool steps failed three tries on it)."""
    raw = json.dumps({**VALID, "Project Name": "game\u00a7"}).replace("\\u00a7", "\n\t2048")
    assert "\n\t2048" in raw
    gateway, _ = scripted(wrapped.format(doc=raw))
    assert run(gateway, spec()).value == {**VALID, "Project Name": "game\n\t2048"}


def test_markdown_sections_are_parsed_by_the_schema_of_each_key():
    text = ("Here you go.\n\n## Project Name\ngame_2048\n\n## Product Goals\n- fun\n- fast\n\n"
            "## priority\nP0\n\n## Done\nfalse\n\n## Notes\nnone\n")
    gateway, model = scripted(text)
    result = run(gateway, spec(format="markdown"))
    assert result.value == {**VALID, "Notes": None}
    prompt = model.prompts()[0]
    assert "## <field name>" in prompt and '- "Project Name" (string): snake_case name' in prompt


def test_markdown_json_values_and_missing_sections():
    text = '## Project Name\n"game"\n## Product Goals\n["a"]\n## Priority\nP1\n## Done\ntrue\n'
    assert answers.parse_markdown(text, SCHEMA) == {"Project Name": "game", "Product Goals": ["a"],
                                                    "Priority": "P1", "Done": True}
    with pytest.raises(answers.InvalidAnswer, match="no `## <field>` sections"):
        answers.parse_markdown("just prose", SCHEMA)
    gateway, _ = scripted("## Project Name\ngame\n")
    with pytest.raises(ActionFailed, match="'Product Goals' is a required property"):
        run(gateway, spec(format="markdown", retries=0))


def test_json_prompt_lists_the_fields_and_not_a_schema_they_say_all_of():
    gateway, model = scripted(json.dumps(VALID))
    run(gateway, spec())
    prompt = model.prompts()[0]
    assert prompt.startswith("Write the PRD.")
    assert "exactly the fields below (no others)" in prompt and '{"type"' not in prompt
    assert '- "Priority" (one of P0|P1)' in prompt and '- "Notes" (string or null, optional)' in prompt
    assert model.requests[0].response_format is None


@pytest.mark.parametrize("rule", [{"pattern": "^[a-z0-9_]+$"}, {"minLength": 3}, {"format": "uri"}])
def test_json_prompt_shows_the_schema_compactly_when_the_fields_cannot_say_it(rule):
    """A rule the field list has no words for (a pattern, a bound, a format) is not left
    unsaid: the prompt shows the JSON Schema, without descriptions, then the fields."""
    schema = {**SCHEMA, "properties": {**SCHEMA["properties"],
                                       "Project Name": {**SCHEMA["properties"]["Project Name"], **rule}}}
    gateway, model = scripted(json.dumps(VALID))
    run(gateway, spec(schema=schema))
    prompt = model.prompts()[0]
    assert json.dumps(rule, separators=(",", ":"))[1:-1] in prompt and "description" not in prompt
    assert '"enum":["P0","P1"]' in prompt and '- "Notes" (string or null, optional)' in prompt


def test_json_prompt_shows_the_schema_of_an_open_object():
    """An object that allows other keys: "no others" would be wrong, so the schema says it."""
    gateway, model = scripted(json.dumps(VALID))
    run(gateway, spec(schema={**SCHEMA, "additionalProperties": True}))
    assert '"additionalProperties":true' in model.prompts()[0]


def test_schema_mode_sends_response_format_and_still_validates():
    gateway, model = scripted(json.dumps({**VALID, "Done": 1}), json.dumps(VALID), schema_support=True)
    assert run(gateway, spec()).value == VALID
    rf = model.requests[0].response_format
    assert rf["type"] == "json_schema" and rf["json_schema"]["schema"] == SCHEMA
    assert rf["json_schema"]["strict"] is False      # "Notes" is optional: not strict-compatible


# ----------------------------------------------------------------------------- text, code, choice


def test_code_is_the_first_fenced_block_and_missing_block_is_reasked():
    good = "Plan first.\n```python\nprint('a')\n```\nand\n```python\nprint('b')\n```"
    gateway, model = scripted("I would write print('a').", good)
    result = run(gateway, spec("code", code_lang="python"))
    assert result.value == "print('a')\n"
    assert "no fenced code block" in model.prompts()[1]
    assert "```python" in model.prompts()[0]


def test_code_block_cut_off_at_the_end_is_taken_as_is():
    assert answers.extract_code("Here:\n```python\ndef f():\n    return 1") == "def f():\n    return 1\n"
    with pytest.raises(answers.InvalidAnswer, match="empty"):
        answers.extract_code("```python\n   \n```")


def test_text_kind_returns_the_answer_and_rejects_an_empty_one():
    gateway, _ = scripted("   ", "  A fine answer.\n")
    assert run(gateway, spec("text")).value == "A fine answer."


@pytest.mark.parametrize("answer,expected", [
    ("1", 1), ("0", 0), ("-1", -1), ("Stage 2 comes next", 2), ("garbage", -1), ("", -1),
    ("3", -1), ("99", -1), ("-5", -1), ("1.5", 1),
])
def test_choice_never_fails_and_maps_everything_invalid_to_minus_one(answer, expected):
    gateway, model = scripted(answer)
    result = run(gateway, spec("choice", n_choices=3, prompt="0. A\n1. B\n2. C"))
    assert result.value == expected and model.calls == 1
    assert "from 0 to 2, or -1" in model.prompts()[0]


# ----------------------------------------------------------------------------- transport retries


def test_transient_errors_are_retried_with_growing_backoff():
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    model = ScriptedModel([TransientModelError("rate limited"), TransientModelError("503"), json.dumps(VALID)])
    gateway = Gateway(providers={"scripted": model}, sleep=record, backoff_s=1.0)
    assert run(gateway, spec()).value == VALID
    assert len(waits) == 2 and 0.5 <= waits[0] <= 1.0 and 1.0 <= waits[1] <= 2.0
    assert gateway.usage.retries == 2 and gateway.usage.llm_calls == 1


def test_transient_errors_give_up_with_an_llm_error():
    model = ScriptedModel([TransientModelError("rate limited")] * 4)
    gateway = Gateway(providers={"scripted": model}, sleep=_no_sleep, transient_retries=3)
    with pytest.raises(LLMError, match="gave up after 4 attempts"):
        run(gateway, spec())


def test_litellm_rate_limit_is_retried_through_litellm_mock_response():
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    provider = LiteLLMProvider(completion_kwargs={"mock_response": "litellm.RateLimitError"})
    gateway = Gateway(providers={"openai/gpt-4o-mini": provider}, sleep=record, transient_retries=2)
    with pytest.raises(LLMError, match="RateLimitError"):
        run(gateway, spec(model="openai/gpt-4o-mini"))
    assert len(waits) == 2


def test_litellm_path_answers_counts_tokens_and_cost():
    provider = LiteLLMProvider(completion_kwargs={"mock_response": json.dumps(VALID)})
    gateway = Gateway(providers={"openai/gpt-4o-mini": provider})
    result = run(gateway, spec(model="openai/gpt-4o-mini", temperature=0, max_tokens=100))
    assert result.value == VALID
    assert result.usage.prompt_tokens > 0 and result.usage.completion_tokens > 0
    assert result.usage.cost_usd > 0 and gateway.usage == result.usage


def test_a_real_litellm_call_is_blocked_in_tests():
    with pytest.raises(LLMError, match="blocked in tests"):
        run(Gateway(), spec(model="openai/gpt-4o-mini"))


# ----------------------------------------------------------------------------- keys


SECRET = "sk-test-9f8e7d6c5b4a39281706"


def test_missing_key_names_the_variable_without_retrying(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    with allow_real_models():
        with pytest.raises(LLMError) as info:
            run(Gateway(sleep=record), spec(model="openai/gpt-4o-mini"))
    assert "OPENAI_API_KEY" in info.value.hint and waits == []
    with pytest.raises(RunError, match="OPENAI_API_KEY"):
        Gateway().preflight("openai/gpt-4o-mini")
    with pytest.raises(UsageError, match="unknown model"):
        Gateway().preflight("no-such-provider-model")


def test_api_key_never_appears_in_errors(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)

    class Leaky(LiteLLMProvider):
        async def complete(self, request: ModelRequest):
            exc = RuntimeError(f"upstream said: bad request for key {SECRET} (status 400)")
            raise self._convert(exc, request.spec)

    with pytest.raises(LLMError) as info:
        run(Gateway(providers={"openai/x": Leaky()}), spec(model="openai/x"))
    assert SECRET not in str(info.value) and "***" in str(info.value)


def test_redact_hides_key_values_and_key_shapes_but_not_words(monkeypatch):
    from engine.models.hosted import redact

    monkeypatch.setenv("MY_SERVICE_TOKEN", "plain-secret-value")
    text = redact("token plain-secret-value, key sk-proj-abcdefghijklmnop, skateboard_championship_words")
    assert "plain-secret-value" not in text and "sk-proj" not in text
    assert "skateboard_championship_words" in text


def test_request_hash_covers_the_request_and_never_the_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    request = ModelRequest(spec(), ({"role": "user", "content": "x"},), None)
    canonical = json.dumps(request.canonical())
    assert SECRET not in canonical
    assert request.hash() == request_hash(json.loads(canonical))
    assert request_hash({"a": 1, "b": 2}) == request_hash({"b": 2, "a": 1})
    warmer = ModelRequest(spec(temperature=0.7), request.messages, None)
    assert warmer.hash() != request.hash()
    assert ModelRequest(spec(), request.messages, None, attempt=3).hash() == request.hash()


# ----------------------------------------------------------------------------- budget


def test_budget_is_checked_before_every_call():
    gateway, model = scripted(*[json.dumps(VALID)] * 5, cost_per_call=0.6)
    gateway.budget_usd = 1.0
    run(gateway, spec())
    run(gateway, spec())                       # 0.6 spent < 1.0: allowed, overspends by one call
    with pytest.raises(BudgetExceeded, match="stopped before calling"):
        run(gateway, spec())
    assert model.calls == 2 and gateway.usage.cost_usd == pytest.approx(1.2)


def test_concurrent_calls_overspend_by_at_most_about_one_call():
    model = ScriptedModel(lambda s, a: json.dumps(VALID), cost_per_call=0.3)
    gateway = Gateway(providers={"scripted": model}, budget_usd=1.0)

    async def fan_out():
        return await asyncio.gather(*(gateway.call(spec(prompt=f"item {i}")) for i in range(12)),
                                    return_exceptions=True)

    outcomes = asyncio.run(fan_out())
    assert any(isinstance(o, BudgetExceeded) for o in outcomes)
    assert gateway.usage.cost_usd < 1.0 + 0.3 + 1e-9


def test_the_budget_holds_when_later_calls_cost_more():
    # The first answer is cheap, every later one dear: admission by the dearest call seen so
    # far let the whole fan-out start at once. A reservation of each call's worst case does not.
    dear = 0.2                                       # 200 completion tokens at $0.001
    model = ScriptedModel(lambda s, a: "ok" if s.prompt == "item 0" else "y" * 800,
                          token_price=Price(0.0, 0.001))
    gateway = Gateway(providers={"scripted": model}, budget_usd=1.0)

    async def fan_out():
        calls = (gateway.call(spec("text", prompt=f"item {i}", max_tokens=200)) for i in range(12))
        return await asyncio.gather(*calls, return_exceptions=True)

    outcomes = asyncio.run(fan_out())
    assert any(isinstance(o, BudgetExceeded) for o in outcomes)
    assert gateway.usage.cost_usd <= 1.0 + dear + 1e-9
    assert model.max_in_flight > 1                   # still concurrent within the budget


def test_a_call_without_max_tokens_reserves_the_models_output_limit():
    # No max_tokens: the reservation is the model's most output tokens (here 1000 x $0.001 =
    # $1), so with $0.5 of a $1 budget left no second call starts beside the first.
    model = ScriptedModel(lambda s, a: "y" * 400, token_price=Price(0.0, 0.001, max_output_tokens=1000))
    gateway = Gateway(providers={"scripted": model}, budget_usd=1.0)

    async def fan_out():
        calls = (gateway.call(spec("text", prompt=f"item {i}")) for i in range(6))
        return await asyncio.gather(*calls, return_exceptions=True)

    outcomes = asyncio.run(fan_out())
    assert model.max_in_flight == 1
    assert [o for o in outcomes if not isinstance(o, BudgetExceeded)] and gateway.usage.cost_usd <= 1.1


def test_a_run_whose_fan_out_costs_more_than_its_first_call_stops_within_one_call(tmp_path):
    # The shape of the software company: a cheap task list, then a fan-out of dear files.

    from engine.api import RunOptions, run as run_sop
    from engine.compile.compiler import compile_path

    files = [f"f{i}.py" for i in range(12)]

    def answer(call_spec, attempt):
        if call_spec.action == "ListFiles":
            return json.dumps({"Task list": files})
        return "```python\n" + "x = 1\n" * 160 + "```"      # about 240 tokens

    price = Price(0.0, 0.001, max_output_tokens=300)       # at most $0.30 a call
    compiled = compile_path(TESTS / "sops" / "fanout.sop.yaml")
    with use_model(ScriptedModel(answer, token_price=price)) as model:
        result = run_sop(compiled, {"idea": "files"}, RunOptions(budget_usd=0.6, workspace=tmp_path / "ws"), journal=False)
    assert result.status == "budget"
    assert result.usage.cost_usd <= 0.6 + 0.3
    assert model.calls < 1 + len(files)


class _PricedAfter(ScriptedModel):
    """A model whose price is unknown before the call (no `price`) and told in each answer:
    the first answer cheap, every later one dear."""

    async def complete(self, request):
        self.cost_per_call = 0.01 if self.calls == 0 else 1.0
        return await super().complete(request)


def test_prices_known_only_after_the_answer_cannot_overspend_a_fan_out(tmp_path):
    """A cheap first call ($0.01), then ten $1 calls at once on a $1.50 budget: once spent ran
    to $10.01 and the run ended idle. An unknown price cannot be reserved, so such calls run
    one at a time under a budget: at most one call past the budget, and the run ends budget."""
    from engine.api import RunOptions, run as run_sop
    from engine.compile.compiler import compile_path

    files = [f"f{i}.py" for i in range(10)]

    def answer(call_spec, attempt):
        if call_spec.action == "ListFiles":
            return json.dumps({"Task list": files})
        return "```python\nx = 1\n```"

    compiled = compile_path(TESTS / "sops" / "fanout.sop.yaml")
    with use_model(_PricedAfter(answer)) as model:
        result = run_sop(compiled, {"idea": "files"}, RunOptions(budget_usd=1.5, workspace=tmp_path / "ws"),
                         journal=False)
    assert result.status == "budget" and "budget of $1.5000 spent" in (result.error or "")
    assert result.usage.cost_usd <= 1.5 + 1.0 + 1e-9          # at most one call past it
    assert model.calls == 3 and model.max_in_flight == 1


def test_a_run_says_once_why_its_unpriced_calls_wait_for_each_other(tmp_path):
    """The one-at-a-time rule above makes a fan-out as slow as a loop: the run's log says so
    once per model, with the way out (--price, --budget 0), where the user sees warnings."""
    from engine.api import RunOptions, run as run_sop
    from engine.compile.compiler import compile_path
    from engine.run.events import RunLog

    files = [f"f{i}.py" for i in range(4)]

    def answer(call_spec, attempt):
        if call_spec.action == "ListFiles":
            return json.dumps({"Task list": files})
        return "```python\nx = 1\n```"

    logs: list[RunLog] = []

    class Logs:
        def on_event(self, event):
            if isinstance(event, RunLog):
                logs.append(event)

    compiled = compile_path(TESTS / "sops" / "fanout.sop.yaml")
    with use_model(ScriptedModel(answer)) as model:
        result = run_sop(compiled, {"idea": "files"}, RunOptions(budget_usd=100.0, workspace=tmp_path / "ws",
                                                                 observers=[Logs()]), journal=False)
    assert result.status == "idle" and model.max_in_flight == 1
    said = [log for log in logs if "is unknown" in log.message]
    assert len(said) == 1 and said[0].level == "warning"
    assert "--price IN,OUT" in said[0].message and "--budget 0" in said[0].message
    assert "model 'local'" in said[0].message and said[0].action == "WriteFile"   # use_model's name


def test_prices_known_before_the_call_still_run_concurrently_under_a_budget():
    model = ScriptedModel(lambda s, a: "ok", token_price=Price(0.0, 0.0001))
    gateway = Gateway(providers={"scripted": model}, budget_usd=10.0)

    async def fan_out():
        calls = (gateway.call(spec("text", prompt=f"item {i}", max_tokens=10)) for i in range(8))
        return await asyncio.gather(*calls)

    asyncio.run(fan_out())
    assert model.max_in_flight > 1


def test_fan_out_without_budget_runs_concurrently():
    started, peak = [0], [0]

    class Slow(ScriptedModel):
        async def complete(self, request):
            started[0] += 1
            peak[0] = max(peak[0], started[0])
            await asyncio.sleep(0.01)
            started[0] -= 1
            return await super().complete(request)

    gateway = Gateway(providers={"scripted": Slow(lambda s, a: json.dumps(VALID))})

    async def fan_out():
        return await asyncio.gather(*(gateway.call(spec(prompt=f"item {i}")) for i in range(20)))

    results = asyncio.run(fan_out())
    assert [r.value for r in results] == [VALID] * 20
    assert peak[0] == 20


# ----------------------------------------------------------------------------- journal


def test_answers_are_journaled_before_parsing_and_reused_without_calls():
    store = MemoryAnswerStore()
    first, model = scripted("not json", json.dumps(VALID))
    first.store = store
    assert run(first, spec()).value == VALID
    assert len(store.answers) == 2 and set(store.actions.values()) == {"WritePRD"}

    second, silent = scripted()                  # any model call would raise "ran out"
    second.store = store
    result = run(second, spec())
    assert result.value == VALID and silent.calls == 0
    assert (result.usage.reused_calls, result.usage.llm_calls, result.usage.cost_usd) == (2, 0, 0.0)
    assert second.usage.reused_calls == 2 and second.usage.llm_calls == 0


def test_a_failed_action_still_journals_its_paid_answers():
    store = MemoryAnswerStore()
    gateway, _ = scripted("bad", "worse", cost_per_call=0.01)
    gateway.store = store
    with pytest.raises(ActionFailed):
        run(gateway, spec(retries=1))
    assert [a.text for a in store.answers.values()] == ["bad", "worse"]
    assert all(a.cost_usd == 0.01 and a.model == "scripted" for a in store.answers.values())


def test_reused_cost_counts_toward_the_budget_but_is_not_paid_again():
    store = MemoryAnswerStore()
    first, _ = scripted(json.dumps(VALID), cost_per_call=0.8)
    first.store = store
    run(first, spec())
    resumed, model = scripted(json.dumps(VALID), cost_per_call=0.8)
    resumed.store, resumed.budget_usd = store, 1.0
    run(resumed, spec())                          # reused: free now, 0.8 of the budget used
    assert resumed.usage.cost_usd == 0 and resumed.usage.reused_cost_usd == 0.8
    run(resumed, spec(prompt="another"))          # 0.8 < 1.0: one more call allowed
    with pytest.raises(BudgetExceeded):
        run(resumed, spec(prompt="a third"))
    assert model.calls == 1


def test_replay_diverges_on_a_request_missing_from_the_journal():
    gateway, model = scripted(json.dumps(VALID))
    gateway.store, gateway.replay = MemoryAnswerStore(), True
    with pytest.raises(ReplayDivergence, match="action WritePRD .*not in the journal"):
        run(gateway, spec())
    assert model.calls == 0


def test_events_tell_the_story_of_a_call():
    events = []
    gateway, _ = scripted("oops", json.dumps(VALID))
    gateway.emit, gateway.store = events.append, MemoryAnswerStore()
    run(gateway, spec(round=3))
    assert [(type(e).__name__, e.attempt) for e in events] == [
        ("ModelAnswered", 0), ("AnswerRejected", 0), ("ModelAnswered", 1)]
    assert "no JSON object" in events[1].error and events[1].reask
    assert {(e.round, e.role, e.action) for e in events} == {(3, "PM", "WritePRD")}
    assert sum((e.usage for e in events), Usage()) == gateway.usage
    again = Gateway(store=gateway.store, emit=events.append, providers={"scripted": ScriptedModel([])})
    events.clear()
    run(again, spec(round=3))
    assert [type(e).__name__ for e in events] == ["ModelAnswered", "AnswerRejected", "ModelAnswered"]
    assert events[0].reused and events[2].reused
    assert again.usage == Usage(reused_calls=2, reasks=1)


def test_a_transient_error_is_reported_with_its_cause_before_the_retry():
    events = []
    model = ScriptedModel([TransientModelError("rate limited (429)"), json.dumps(VALID)])
    gateway = Gateway(providers={"scripted": model}, sleep=_no_sleep, emit=events.append)
    run(gateway, spec())
    retried, answered = events
    assert isinstance(retried, ModelRetried) and retried.cause == "rate limited (429)"
    assert (retried.attempt, retried.retry) == (0, 1) and retried.delay_s > 0
    assert isinstance(answered, ModelAnswered) and not answered.reused
    assert gateway.usage.retries == 1 and gateway.usage.llm_calls == 1


def test_a_provider_crash_becomes_an_llm_error():
    def broken(call_spec, attempt):
        raise KeyError("boom")

    gateway = Gateway(providers={"scripted": ScriptedModel(broken)})
    with pytest.raises(LLMError, match="model 'scripted' failed for action WritePRD: KeyError"):
        run(gateway, spec())


def test_bad_specs_are_clear_errors():
    with pytest.raises(LLMError, match="needs its output schema"):
        run(Gateway(), spec(schema=None))
    with pytest.raises(LLMError, match="no model"):
        run(Gateway(), spec(model=""))


def test_override_model_routes_every_model_name():
    model = ScriptedModel([json.dumps(VALID)])
    with use_model(model):
        assert run(Gateway(), spec(model="anthropic/claude-whatever")).value == VALID
    assert model.calls == 1


def test_importing_the_engine_and_gateway_never_imports_litellm():
    code = ("import sys, engine, engine.models.gateway, engine.models.hosted, engine.models.answers, engine.models.fake, engine.models.local, engine.testing;"
            "assert 'litellm' not in sys.modules, 'litellm imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def _fan_out_of_identical_requests(gateway: Gateway, n: int) -> list:
    async def fan_out():
        return await asyncio.gather(*(gateway.call(spec()) for _ in range(n)), return_exceptions=True)
    return asyncio.run(fan_out())


def test_with_reuse_identical_requests_in_flight_at_once_pay_for_one_answer():
    model = ScriptedModel(lambda s, a: json.dumps(VALID))   # it yields before answering: all overlap
    gateway = Gateway(providers={"scripted": model}, store=MemoryAnswerStore(), sleep=_no_sleep,
                      reuse_identical=True)
    results = _fan_out_of_identical_requests(gateway, 5)
    assert [r.value for r in results] == [VALID] * 5
    assert model.calls == 1
    assert (gateway.usage.llm_calls, gateway.usage.reused_calls) == (1, 4)


def test_when_the_shared_ask_fails_the_waiting_requests_ask_themselves():
    model = ScriptedModel([TransientModelError("overloaded")] + [json.dumps(VALID)] * 5)
    gateway = Gateway(providers={"scripted": model}, store=MemoryAnswerStore(), sleep=_no_sleep,
                      transient_retries=0, reuse_identical=True)
    results = _fan_out_of_identical_requests(gateway, 3)
    assert isinstance(results[0], LLMError)
    assert [r.value for r in results[1:]] == [VALID, VALID]
    assert model.calls == 2          # the failed ask, then one for both waiters


def test_without_a_store_identical_requests_are_not_held_back():
    model = ScriptedModel(lambda s, a: json.dumps(VALID))
    gateway = Gateway(providers={"scripted": model}, sleep=_no_sleep)
    assert [r.value for r in _fan_out_of_identical_requests(gateway, 3)] == [VALID] * 3
    assert model.calls == 3


def test_post_priced_calls_of_two_roles_at_once_stay_one_call_past_the_budget(tmp_path):
    """More of the class (issue 26): two roles of one round, each a fan-out of calls priced
    only by their answers, on one budget: still one call at a time, at most one past it."""
    from engine.api import RunOptions, run as run_sop
    from engine.compile.compiler import compile_text

    text = """
apiVersion: sop/v1
name: two_fanouts
inputs:
  idea: {type: str, required: true}
team: {max_rounds: 2}
actions:
  A:
    for_each: "{{ range(6) | list }}"
    as: n
    prompt: "A {{ n }}"
    send_to: ["<none>"]
  B:
    for_each: "{{ range(6) | list }}"
    as: n
    prompt: "B {{ n }}"
    send_to: ["<none>"]
roles:
  Ra: {actions: [A], watch: [UserRequirement]}
  Rb: {actions: [B], watch: [UserRequirement]}
"""
    with use_model(_PricedAfter(lambda s, a: "done")) as model:
        result = run_sop(compile_text(text), {"idea": "x"}, RunOptions(budget_usd=2.5, workspace=tmp_path / "ws"),
                         journal=False)
    assert result.status == "budget"
    assert result.usage.cost_usd <= 2.5 + 1.0 + 1e-9 and model.max_in_flight == 1
