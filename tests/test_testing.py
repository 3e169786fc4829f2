"""engine.testing: what users get for their own SOP tests."""

from __future__ import annotations

import asyncio
import json

import pytest

from engine import testing
from engine.errors import ActionFailed, LLMError
from engine.models.gateway import Gateway
from engine.models.registry import real_models_blocked
from engine.models.types import CallSpec, StoredAnswer
from engine.testing import (
    MemoryAnswerStore,
    ScriptedModel,
    allow_real_models,
    block_real_models,
    use_model,
)

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}


@pytest.fixture(autouse=True)
def _no_real_models():
    with block_real_models():
        yield


def spec(model: str = "scripted", **kw) -> CallSpec:
    base = dict(action="Check", role="QA", system="", prompt="Is it ok?", kind="json", model=model,
                schema=SCHEMA)
    base.update(kw)
    return CallSpec(**base)


def call(gateway: Gateway, call_spec: CallSpec):
    return asyncio.run(gateway.call(call_spec))


def test_scripted_answers_come_in_order_and_run_out_clearly():
    model = ScriptedModel(['{"ok": true}', '{"ok": false}'])
    with use_model(model, name="scripted"):
        gateway = Gateway()
        assert call(gateway, spec()).value == {"ok": True}
        assert call(gateway, spec()).value == {"ok": False}
        with pytest.raises(LLMError, match="ran out of answers: request 3 .*only 2 scripted"):
            call(gateway, spec())
    assert model.calls == 3


def test_a_function_script_sees_the_spec_and_the_attempt():
    seen = []

    def answer(call_spec: CallSpec, attempt: int) -> str:
        seen.append((call_spec.action, attempt))
        return "nonsense" if attempt == 0 else json.dumps({"ok": True})

    model = ScriptedModel(answer)
    with use_model(model, name="scripted"):
        assert call(Gateway(), spec()).value == {"ok": True}
    assert seen == [("Check", 0), ("Check", 1)]
    assert "could not be accepted" in model.prompts()[1]


def test_scripted_invalid_answers_fail_the_action():
    with use_model(ScriptedModel(["[]", "{}", '{"ok": "yes"}']), name="scripted"):
        with pytest.raises(ActionFailed, match="Check"):
            call(Gateway(), spec(retries=2))


def test_use_model_by_name_restores_what_was_there():
    outer, inner = ScriptedModel(['{"ok": true}']), ScriptedModel(['{"ok": false}'])
    with use_model(outer, name="mine"):
        with use_model(inner, name="mine"):
            assert call(Gateway(), spec("mine")).value == {"ok": False}
        assert call(Gateway(), spec("mine")).value == {"ok": True}
    with pytest.raises(LLMError, match="blocked in tests"):      # unregistered: litellm, blocked
        call(Gateway(), spec("mine"))


def test_use_model_without_a_name_answers_every_model():
    model = ScriptedModel(['{"ok": true}'] * 3)
    with use_model(model):
        for name in ("local", "openai/gpt-4o-mini", "fake"):
            call(Gateway(), spec(name))
    assert model.calls == 3


def test_the_guard_blocks_real_models_and_can_be_lifted_for_one_block():
    assert real_models_blocked()
    with allow_real_models():
        assert not real_models_blocked()
        with block_real_models():
            assert real_models_blocked()
        assert not real_models_blocked()
    assert real_models_blocked()


def test_the_guard_works_as_a_decorator():
    @allow_real_models()
    def inside() -> bool:
        return real_models_blocked()

    assert inside() is False and real_models_blocked()


def test_pytest_plugin_hooks_turn_the_guard_on_for_a_session():
    with allow_real_models():
        testing.pytest_configure(None)
        assert real_models_blocked()
        testing.pytest_unconfigure(None)
        assert not real_models_blocked()


def test_memory_store_round_trips_answers():
    store = MemoryAnswerStore()
    answer = StoredAnswer("text", 1, 2, 0.5, model="m", seconds=0.1)
    store.record("h", "Check", answer)
    assert store.lookup("h") == answer and store.lookup("other") is None
    assert store.actions == {"h": "Check"}


def test_scripted_model_with_schema_support_and_a_price():
    model = ScriptedModel(['{"ok": true}'], schema_support=True, cost_per_call=0.25)
    gateway = Gateway(providers={"scripted": model})
    result = call(gateway, spec())
    assert model.requests[0].response_format is not None
    assert result.usage.cost_usd == 0.25 and gateway.usage.cost_usd == 0.25


def test_answers_that_are_not_text_are_sent_as_json_and_exceptions_are_raised():
    model = ScriptedModel([{"ok": True}, 2, LLMError("the model is down")])
    gateway = Gateway(providers={"scripted": model})
    assert call(gateway, spec()).value == {"ok": True}
    assert call(gateway, spec(kind="choice", n_choices=3)).value == 2
    with pytest.raises(LLMError, match="the model is down"):
        call(gateway, spec())
    assert model.asked() == ["Check"] * 3 and model.asked("choice") == ["Check"]


def test_concurrent_calls_are_counted_and_a_gate_holds_them_in_flight():
    async def scenario():
        gate = asyncio.Event()
        model = ScriptedModel(lambda call_spec, attempt: {"ok": True}, gate=gate)
        gateway = Gateway(providers={"scripted": model})
        calls = [asyncio.ensure_future(gateway.call(spec())) for _ in range(3)]
        while len(model.requests) < 3:
            await asyncio.sleep(0)
        held = model.in_flight, [c.done() for c in calls]
        gate.set()
        return model, held, await asyncio.gather(*calls)

    model, held, results = asyncio.run(scenario())
    assert held == (3, [False, False, False])
    assert [r.value for r in results] == [{"ok": True}] * 3
    assert model.max_in_flight == 3 and model.in_flight == 0
