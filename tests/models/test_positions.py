"""Answers journaled by position: within one invocation every request is asked; a resume or a
replay takes the Nth journaled answer for the Nth identical request at the same place; a
journal from before positions (one row per hash) still answers; `reuse_identical` opts back
into one answer per identical request."""

from __future__ import annotations

import asyncio
import json

import pytest

from engine.errors import ActionFailed, ReplayDivergence
from engine.models.gateway import Gateway
from engine.models.types import CallSpec, StoredAnswer, answer_key
from engine.testing import MemoryAnswerStore, ScriptedModel, block_real_models

VALID = {"answer": "x"}
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


@pytest.fixture(autouse=True)
def _no_real_models():
    with block_real_models():
        yield


def spec(place: str = "run/1/Alice/Write/0/abc", **kw) -> CallSpec:
    base = dict(action="Write", role="Alice", system="You are Alice.", prompt="Write the PRD.",
                kind="json", model="scripted", schema=SCHEMA, place=place)
    base.update(kw)
    return CallSpec(**base)


async def _no_sleep(seconds: float) -> None:
    return None


def numbered() -> ScriptedModel:
    """A model whose Nth answer says N: which answer a call got shows which ask it was."""
    count = iter(range(1, 1000))
    return ScriptedModel(lambda s, a: json.dumps({"answer": f"v{next(count)}"}))


def gateway(model: ScriptedModel, store: MemoryAnswerStore | None = None, **kw) -> Gateway:
    return Gateway(providers={"scripted": model}, store=store if store is not None else MemoryAnswerStore(),
                   sleep=_no_sleep, **kw)


def answers_of(g: Gateway, specs: list[CallSpec]) -> list[str]:
    async def go() -> list[str]:
        return [(await g.call(s)).value["answer"] for s in specs]
    return asyncio.run(go())


def test_an_identical_request_made_again_at_the_same_place_is_asked_again():
    model = numbered()
    g = gateway(model)
    assert answers_of(g, [spec(), spec()]) == ["v1", "v2"]
    assert model.calls == 2 and (g.usage.llm_calls, g.usage.reused_calls) == (2, 0)


def test_an_identical_request_at_another_place_is_asked_too():
    model = numbered()      # a task re-sent by the leader: the member's action runs again
    assert answers_of(gateway(model), [spec(place="r/1/Alice/Write/0/a"),
                                       spec(place="r/2/Alice/Write/1/b")]) == ["v1", "v2"]
    assert model.calls == 2


def test_a_retry_after_a_failure_asks_again():
    model = ScriptedModel(["not json", json.dumps(VALID)])
    g = gateway(model)

    async def go() -> str:
        with pytest.raises(ActionFailed):
            await g.call(spec(retries=0))
        return (await g.call(spec(retries=0))).value["answer"]   # the action retried
    assert asyncio.run(go()) == "x"     # a fresh answer, not the journaled bad one
    assert model.calls == 2


def test_a_resume_takes_the_nth_answer_for_the_nth_identical_request():
    store = MemoryAnswerStore()
    first = numbered()
    assert answers_of(gateway(first, store), [spec(), spec()]) == ["v1", "v2"]
    later = numbered()   # the resumed invocation: the two journaled, the third asked
    assert answers_of(gateway(later, store), [spec(), spec(), spec()]) == ["v1", "v2", "v1"]
    assert later.calls == 1


def test_a_replay_takes_them_in_order_and_diverges_past_the_last():
    store = MemoryAnswerStore()
    answers_of(gateway(numbered(), store), [spec(), spec()])
    replayed = gateway(numbered(), store, replay=True)
    assert answers_of(replayed, [spec(), spec()]) == ["v1", "v2"]
    with pytest.raises(ReplayDivergence):
        answers_of(replayed, [spec()])


def test_concurrent_identical_requests_at_two_places_are_each_asked_and_keep_their_places():
    store = MemoryAnswerStore()
    model = ScriptedModel(lambda s, a: json.dumps({"answer": s.place}))

    async def both(g: Gateway) -> list[str]:
        results = await asyncio.gather(g.call(spec(place="r/1/Alice/Write/0/a")),
                                       g.call(spec(place="r/1/Bob/Write/0/b")))
        return [r.value["answer"] for r in results]
    assert asyncio.run(both(gateway(model, store))) == ["r/1/Alice/Write/0/a", "r/1/Bob/Write/0/b"]
    assert model.calls == 2
    # in a replay the other order of issue changes nothing: each place has its own answer
    replayed = gateway(ScriptedModel([]), store, replay=True)

    async def reversed_(g: Gateway) -> list[str]:
        results = await asyncio.gather(g.call(spec(place="r/1/Bob/Write/0/b")),
                                       g.call(spec(place="r/1/Alice/Write/0/a")))
        return [r.value["answer"] for r in results]
    assert asyncio.run(reversed_(replayed)) == ["r/1/Bob/Write/0/b", "r/1/Alice/Write/0/a"]


def test_concurrent_identical_requests_without_a_place_are_numbered_in_the_order_issued():
    store = MemoryAnswerStore()

    async def fan_out(g: Gateway) -> list[str]:
        results = await asyncio.gather(*(g.call(spec(place="")) for _ in range(3)))
        return [r.value["answer"] for r in results]
    assert asyncio.run(fan_out(gateway(numbered(), store))) == ["v1", "v2", "v3"]
    assert asyncio.run(fan_out(gateway(ScriptedModel([]), store, replay=True))) == ["v1", "v2", "v3"]


def test_a_journal_from_before_positions_answers_the_first_occurrence_at_every_place():
    store = MemoryAnswerStore()   # an older sopctl: one row per request hash, the bare hash
    old = gateway(numbered(), store)
    digest = old.first_request(spec()).hash()
    store.record(digest, "Write", StoredAnswer(json.dumps({"answer": "old"}), 1, 1, 0.0))
    model = numbered()
    assert answers_of(gateway(model, store), [spec(place="p/a"), spec(place="p/b"), spec(place="p/a")]) \
        == ["old", "old", "v1"]
    assert model.calls == 1            # only the second occurrence at p/a is new
    replayed = gateway(ScriptedModel([]), store, replay=True)
    assert answers_of(replayed, [spec(place="p/a"), spec(place="p/a")]) == ["old", "v1"]


def test_reuse_identical_answers_identical_requests_once_per_run():
    model = numbered()
    g = gateway(model, reuse_identical=True)
    assert answers_of(g, [spec(place="p/a"), spec(place="p/b"), spec(place="p/a")]) == ["v1"] * 3
    assert model.calls == 1 and g.usage.reused_calls == 2


def test_answer_keys_are_distinct_per_place_and_occurrence():
    keys = {answer_key("h", place, n) for place in ("", "a", "b") for n in (1, 2)}
    assert len(keys) == 6 and answer_key("h", "", 1) == "h"


def test_first_key_is_where_the_next_call_looks_its_answer_up():
    store = MemoryAnswerStore()
    g = gateway(numbered(), store)
    before = g.first_key(spec())
    answers_of(g, [spec()])
    assert before in store.answers and g.first_key(spec()) != before
