"""A person in the loop: `human` roles, review gates, `kind: ask` / `kind: reply`, and runs
that wait for a person (status `waiting`, exit 75) until `sopctl answer` and `sopctl resume`.

In-process tests use `engine.testing.ScriptedPerson` and `ScriptedModel`; the command-line
tests run the real `sopctl` without a terminal (the terminal prompts are in
tests/cli/test_people_terminal.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine import api
from engine.errors import JournalError, UsageError
from engine.journal.history import read_run
from engine.journal.store import Journal
from engine.run.people import AnswerRefused, PersonAnswer, Question
from engine.testing import ScriptedModel, ScriptedPerson, use_model

from run_helpers import ROOT, TESTS

EXAMPLE = ROOT / "examples" / "human_review.sop.yaml"

REVIEWED = """\
apiVersion: sop/v1
name: reviewed
inputs:
  idea: {type: str, required: true}
actions:
  Draft:
    prompt: "Draft a title for {{ inputs.idea }}."
    output:
      Title: {type: str, instruction: a title}
    review: human
    max_retries: 1
    artifacts: [{path: title.txt, content: "{{ out['Title'] }}"}]
roles:
  Writer:
    actions: [Draft]
    watch: [UserRequirement]
"""

ASK_AND_REPLY = """\
apiVersion: sop/v1
name: ask_and_reply
inputs:
  idea: {type: str, required: true}
actions:
  AskScope:
    kind: ask
    prompt: "How many pages should the report on {{ inputs.idea }} have?"
    output:
      Pages: {type: int, instruction: the number of pages}
      Tone: {type: "enum[formal|casual]", instruction: the tone}
  Report:
    prompt: "Write {{ msgs.AskScope[-1].out['Pages'] }} pages."
    context: none
    artifacts: [{path: report.md, content: "{{ out }}"}]
  Notify:
    kind: reply
    prompt: "The report on {{ inputs.idea }} is ready: {{ msgs.Report[-1].content }}"
roles:
  Lead:
    actions: [AskScope]
    watch: [UserRequirement]
  Writer:
    actions: [Report]
    watch: [AskScope]
  Herald:
    actions: [Notify]
    watch: [Report]
"""

HUMAN_TEXT = (TESTS / "sops" / "human_text.sop.yaml").read_text(encoding="utf-8")


def _sop(tmp_path: Path, text: str, name: str = "s.sop.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _run(path: Path, workspace: Path, model: Any = None, person: Any = None, **options: Any) -> Any:
    with use_model(model or ScriptedModel(lambda spec, attempt: '{"Title": "a title"}')):
        return api.run(api.load(path), {"idea": "tea"}, api.RunOptions(workspace=workspace, person=person,
                       **options))


# --- the language at run time ---------------------------------------------------------------


def test_a_human_role_is_answered_by_the_person_against_its_output_tree(tmp_path: Path) -> None:
    person = ScriptedPerson(["ship it on Monday"])
    model = ScriptedModel([])
    result = _run(_sop(tmp_path, HUMAN_TEXT), tmp_path / "ws", model, person)
    assert result.status == "idle", result.error
    assert model.calls == 0                        # a person, not a model, answered
    assert person.questions[0].prompt.startswith("Decide about tea.")
    assert result.messages[-1].content == "ship it on Monday"
    assert (tmp_path / "ws" / "decision.md").read_text() == "ship it on Monday"


def test_a_persons_invalid_answer_is_never_accepted(tmp_path: Path) -> None:
    result = _run(_sop(tmp_path, ASK_AND_REPLY), tmp_path / "ws", ScriptedModel(["x"]),
                  ScriptedPerson([{"Pages": "three", "Tone": "formal"}]))
    assert result.status == "failed"
    assert "Pages" in result.error and "refused" in result.error


def test_ask_and_reply_actions_reach_the_person_and_the_journal(tmp_path: Path) -> None:
    person = ScriptedPerson([{"Pages": 3, "Tone": "casual"}])
    model = ScriptedModel(["three pages of report"])
    result = _run(_sop(tmp_path, ASK_AND_REPLY), tmp_path / "ws", model, person)
    assert result.status == "idle", result.error
    assert model.prompts()[0].startswith("Write 3 pages.")
    assert person.told == [("Herald", "The report on tea is ready: three pages of report")]
    state = read_run(tmp_path / "ws")
    assert [r["text"] for r in state.replies] == ["The report on tea is ready: three pages of report"]
    assert state.person_answers == 1 and state.journaled_calls == 1   # a person's answer is not a model call


def test_review_approve_publishes_the_models_output(tmp_path: Path) -> None:
    person = ScriptedPerson([PersonAnswer("approve")])
    result = _run(_sop(tmp_path, REVIEWED), tmp_path / "ws", person=person)
    assert result.status == "idle" and result.messages[-1].out == {"Title": "a title"}
    assert person.questions[0].kind == "review" and person.questions[0].draft == {"Title": "a title"}


def test_review_edit_publishes_the_persons_version(tmp_path: Path) -> None:
    person = ScriptedPerson([PersonAnswer("edit", {"Title": "a better title"})])
    result = _run(_sop(tmp_path, REVIEWED), tmp_path / "ws", person=person)
    assert result.messages[-1].out == {"Title": "a better title"}
    assert (tmp_path / "ws" / "title.txt").read_text() == "a better title"


def test_review_reject_asks_the_model_again_with_the_comment(tmp_path: Path) -> None:
    model = ScriptedModel(['{"Title": "first"}', '{"Title": "second"}'])
    person = ScriptedPerson([PersonAnswer("reject", comment="mention green tea"),
                             PersonAnswer("approve")])
    result = _run(_sop(tmp_path, REVIEWED), tmp_path / "ws", model, person)
    assert result.status == "idle" and result.messages[-1].out == {"Title": "second"}
    assert "mention green tea" in model.prompts()[1]
    assert [q.draft for q in person.questions] == [{"Title": "first"}, {"Title": "second"}]


def test_review_rejected_past_the_retries_fails_the_action_at_its_review_key(tmp_path: Path) -> None:
    person = ScriptedPerson([PersonAnswer("reject", comment="no")] * 2)
    result = _run(_sop(tmp_path, REVIEWED), tmp_path / "ws", person=person)
    assert result.status == "failed"
    assert "rejected the output 2 time(s)" in result.error
    assert result.diagnostic is not None and result.diagnostic.pointer == "/actions/Draft/review"


# --- waiting, answering, resuming -------------------------------------------------------------


def test_without_a_person_the_run_waits_with_its_question_journaled(tmp_path: Path) -> None:
    result = _run(_sop(tmp_path, REVIEWED), tmp_path / "ws", max_rounds=5, budget_usd=2.0)
    assert result.status == "waiting"
    question = result.waiting_for
    assert question is not None and question.kind == "review" and question.action == "Draft"
    state = read_run(tmp_path / "ws")
    assert state.status == "waiting" and state.waiting_for["key"] == question.key


def test_answer_then_resume_continues_with_the_same_limits(tmp_path: Path) -> None:
    path = _sop(tmp_path, REVIEWED)
    ws = tmp_path / "ws"
    first = _run(path, ws, max_rounds=5, budget_usd=2.0)
    api.answer(ws, PersonAnswer("edit", {"Title": "edited"}), question_id=first.waiting_for.id)
    with use_model(ScriptedModel([])):            # the model's answer comes from the journal
        result = api.resume(ws)
    assert result.status == "idle" and result.messages[-1].out == {"Title": "edited"}
    assert result.llm_calls == 0 and result.reused_calls == 1
    with Journal.open(ws) as journal:
        starts = [e for e in journal.events() if e.type == "RunStarted"]
    assert [(s.data["max_rounds"], s.data["budget_usd"]) for s in starts] == [(5, 2.0), (5, 2.0)]


def test_resume_without_an_answer_asks_the_same_question_again(tmp_path: Path) -> None:
    path = _sop(tmp_path, REVIEWED)
    first = _run(path, tmp_path / "ws")
    with use_model(ScriptedModel([])):
        again = api.resume(tmp_path / "ws")
    assert again.status == "waiting" and again.waiting_for.key == first.waiting_for.key


@pytest.mark.parametrize("answer, error", [
    (PersonAnswer("answer", {"Title": 3}), "does not fit"),           # wrong type
    (PersonAnswer("answer", "no object here"), "does not fit"),
    (PersonAnswer("reject", comment=" "), "needs a comment"),
])
def test_an_invalid_answer_is_refused_and_the_run_still_waits(tmp_path: Path, answer: PersonAnswer,
                                                               error: str) -> None:
    _run(_sop(tmp_path, REVIEWED), tmp_path / "ws")
    with pytest.raises(AnswerRefused, match=error):
        api.answer(tmp_path / "ws", answer)
    state = read_run(tmp_path / "ws")
    assert state.status == "waiting" and state.waiting_for is not None and state.person_answers == 0


def test_an_answer_to_another_question_is_refused(tmp_path: Path) -> None:
    _run(_sop(tmp_path, REVIEWED), tmp_path / "ws")
    with pytest.raises(UsageError, match="waits for question"):
        api.answer(tmp_path / "ws", PersonAnswer("approve"), question_id="0000000000ff")
    assert read_run(tmp_path / "ws").waiting_for is not None


def test_a_second_answer_is_refused_the_first_is_kept(tmp_path: Path) -> None:
    _run(_sop(tmp_path, REVIEWED), tmp_path / "ws")
    api.answer(tmp_path / "ws", PersonAnswer("approve"))
    with pytest.raises(UsageError, match="answer already"):
        api.answer(tmp_path / "ws", PersonAnswer("reject", comment="late"))
    assert read_run(tmp_path / "ws").person_answers == 1


def test_an_answer_while_another_process_writes_the_journal_is_refused(tmp_path: Path) -> None:
    _run(_sop(tmp_path, REVIEWED), tmp_path / "ws")
    with Journal.open_to_answer(tmp_path / "ws"):     # another answer (or a resume) holds it
        with pytest.raises(JournalError, match="another process"):
            api.answer(tmp_path / "ws", PersonAnswer("approve"))
    assert read_run(tmp_path / "ws").person_answers == 0


def test_an_answer_to_a_run_that_is_not_waiting_is_refused(tmp_path: Path) -> None:
    _run(_sop(tmp_path, REVIEWED), tmp_path / "ws", person=ScriptedPerson([PersonAnswer("approve")]))
    with pytest.raises(UsageError, match="not waiting"):
        api.answer(tmp_path / "ws", PersonAnswer("approve"))


def test_replay_takes_the_persons_answers_from_the_journal(tmp_path: Path) -> None:
    path = _sop(tmp_path, ASK_AND_REPLY)
    _run(path, tmp_path / "ws", ScriptedModel(["report"]),
         ScriptedPerson([{"Pages": 2, "Tone": "formal"}]))
    replayed = api.replay(tmp_path / "ws", tmp_path / "again")   # nobody to ask: it would wait
    assert not replayed.diverged and replayed.result.status == "idle"
    assert read_run(tmp_path / "again").person_answers == 1


def test_a_question_key_does_not_depend_on_the_process(tmp_path: Path) -> None:
    keys = [_run(_sop(tmp_path, REVIEWED), tmp_path / f"ws{i}", run_id="20260101-000000-abcdef")
            .waiting_for.key for i in range(2)]
    assert keys[0] == keys[1]


# --- the command line, without a terminal -----------------------------------------------------


def _sopctl(*args: str, cwd: Path, stdin: Any = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, stdin=stdin, timeout=120)


def test_cli_waiting_answer_resume(tmp_path: Path) -> None:
    run = _sopctl("run", str(EXAMPLE), "--idea", "sort dates", "--model", "fake", "--out", "ws",
                  "--rounds", "7", "--format", "json", cwd=tmp_path)
    assert run.returncode == 75, run.stderr
    waiting = json.loads(run.stdout)
    assert waiting["status"] == "waiting" and waiting["waiting_for"]["action"] == "SimpleWriteCode"
    assert "sopctl answer" in run.stderr and waiting["waiting_for"]["question"] in run.stderr
    shown = json.loads(_sopctl("show", "ws", "--format", "json", cwd=tmp_path).stdout)
    assert shown["waiting_for"]["question"] == waiting["waiting_for"]["question"]
    listed = json.loads(_sopctl("runs", ".", "--format", "json", cwd=tmp_path).stdout)
    assert listed[0]["status"] == "waiting" and "SimpleWriteCode" in listed[0]["waiting_for"]
    assert listed[0]["question"]["question"] == waiting["waiting_for"]["question"]
    table = _sopctl("runs", ".", cwd=tmp_path).stdout
    assert "waiting" in table and "waits for SimpleCoder.SimpleWriteCode" in table
    assert "answer with: sopctl answer" in _sopctl("show", "ws", cwd=tmp_path).stdout

    approved = _sopctl("answer", "ws", "--approve", "--question", waiting["waiting_for"]["question"],
                       "--resume", "--format", "json", cwd=tmp_path)
    assert approved.returncode == 75, approved.stderr            # now it waits for Charlie
    review = json.loads(approved.stdout)["waiting_for"]
    assert review["action"] == "SimpleWriteReview" and review["kind"] == "answer"

    stale = _sopctl("answer", "ws", "--approve", "--question", waiting["waiting_for"]["question"],
                    cwd=tmp_path)                                # the question answered before
    assert stale.returncode == 2 and f"waits for question {review['question']}" in stale.stderr
    bad = _sopctl("answer", "ws", "--json", '{"Verdict": "maybe", "Comments": "x"}', cwd=tmp_path)
    assert bad.returncode == 2 and "'maybe' is not one of" in bad.stderr
    assert "Traceback" not in bad.stderr
    done = _sopctl("answer", "ws", "--json", '{"Verdict": "approve", "Comments": "ok"}', "--resume",
                   "--format", "json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "idle" and "review.md" in result["artifacts"]
    with Journal.open(tmp_path / "ws") as journal:
        rounds = {e.data["max_rounds"] for e in journal.events() if e.type == "RunStarted"}
    assert rounds == {7}                                         # --rounds held over two resumes


def test_cli_answer_flags_are_checked(tmp_path: Path) -> None:
    assert _sopctl("run", str(EXAMPLE), "--idea", "x", "--model", "fake", "--out", "ws",
                   cwd=tmp_path).returncode == 75
    both = _sopctl("answer", "ws", "--approve", "--text", "x", cwd=tmp_path)
    assert both.returncode == 2 and "exactly one answer" in both.stderr
    wrong = _sopctl("answer", "ws", "--approve", "--question", "ffffffff", cwd=tmp_path)
    assert wrong.returncode == 2 and "waits for question" in wrong.stderr
    no_comment = _sopctl("answer", "ws", "--reject", cwd=tmp_path)
    assert no_comment.returncode == 2 and "needs a comment" in no_comment.stderr
    missing = _sopctl("answer", "ws", "--file", "nope.py", cwd=tmp_path)
    assert missing.returncode == 2 and "cannot read --file nope.py" in missing.stderr
    assert read_run(tmp_path / "ws").waiting_for is not None
    (tmp_path / "edit.py").write_text("def sort_dates(d):\n    return sorted(d)\n")
    edited = _sopctl("answer", "ws", "--file", "edit.py", "--resume", cwd=tmp_path)
    assert edited.returncode == 75, edited.stderr                # now waiting for Charlie
    assert (tmp_path / "ws" / "code.py").read_text() == "def sort_dates(d):\n    return sorted(d)\n"


def test_cli_two_answers_at_once_exactly_one_is_taken(tmp_path: Path) -> None:
    assert _sopctl("run", str(EXAMPLE), "--idea", "x", "--model", "fake", "--out", "ws",
                   cwd=tmp_path).returncode == 75
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    answers = [["--approve"], ["--reject", "--comment", "use datetime"]]
    procs = [subprocess.Popen([sys.executable, "-m", "engine.cli", "answer", "ws", *a],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for a in answers]
    outcomes = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs]
    codes = sorted(code for code, _ in outcomes)
    assert codes == [0, 2], outcomes
    refused = next(err for code, err in outcomes if code == 2)
    assert "answered already" in refused or "answer already" in refused or "another process" in refused
    assert "Traceback" not in refused
    assert read_run(tmp_path / "ws").person_answers == 1


def test_cli_answer_journaled_before_use_survives_a_crash(tmp_path: Path) -> None:
    """The resume that uses the answer dies right after recording the next answer; the
    person's answer was already in the journal, so the next resume does not ask again."""
    assert _sopctl("run", str(EXAMPLE), "--idea", "x", "--model", "fake", "--out", "ws",
                   cwd=tmp_path).returncode == 75
    assert _sopctl("answer", "ws", "--approve", cwd=tmp_path).returncode == 0
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SOPCTL_CRASH_AFTER_ANSWER": "1"}
    crashed = subprocess.run([sys.executable, "-m", "engine.cli", "resume", "ws", "--no-input"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert crashed.returncode == 137
    again = _sopctl("resume", "ws", "--no-input", "--format", "json", cwd=tmp_path)
    assert again.returncode == 75
    assert json.loads(again.stdout)["waiting_for"]["action"] == "SimpleWriteReview"


def test_the_question_says_what_it_needs() -> None:
    question = Question(key="ab" * 32, kind="answer", role="R", action="A", round=1, prompt="p",
                        output="json", schema={"type": "object", "properties": {"X": {"type": "string"}},
                                               "required": ["X"]})
    assert question.id == "ab" * 6 and question.fields() == {"X": {"type": "string"}}
    assert Question.from_json(json.loads(json.dumps(question.to_json()))) == question


def test_a_refused_answer_hints_the_allowed_values_of_an_enum_field() -> None:
    from engine.run.people import accept

    schema = {"type": "object", "required": ["Priority"], "properties": {
        "Priority": {"type": "string", "enum": ["P0", "P1", "P2"]},
        "Tags": {"type": "array", "items": {"type": "string", "enum": ["ui", "api"]}},
        "Note": {"type": "string"}}}
    question = Question(key="cd" * 32, kind="answer", role="R", action="A", round=1, prompt="p",
                        output="json", schema=schema)
    with pytest.raises(AnswerRefused) as refused:
        accept(question, PersonAnswer("answer", {"Priority": "high"}))
    assert refused.value.hint == ('give a JSON object with the fields: Priority (one of "P0", "P1", "P2"), '
                                  'Tags (one of "ui", "api"), Note')


def test_plan_review_a_person_changes_the_plan_before_its_tasks_run(tmp_path: Path) -> None:
    text = (ROOT / "tests" / "sops" / "plan.sop.yaml").read_text(encoding="utf-8")
    text = text.replace('    prompt: "Plan the work for: {{ inputs.idea }}"\n',
                        '    prompt: "Plan the work for: {{ inputs.idea }}"\n    review: human\n')
    plan = {"tasks": [{"task_id": "1", "dependent_task_ids": [], "instruction": "model's task"}]}
    mine = {"tasks": [{"task_id": "a", "dependent_task_ids": ["b"], "instruction": "second"},
                      {"task_id": "b", "dependent_task_ids": [], "instruction": "first"}]}
    model = ScriptedModel([json.dumps(plan), "did b", "did a"])
    person = ScriptedPerson([PersonAnswer("edit", mine)])
    result = _run(_sop(tmp_path, text), tmp_path / "ws", model, person)
    assert result.status == "idle", result.error
    assert person.questions[0].draft == plan
    assert model.prompts()[1:] == ["Do task b: first", "Do task a: second"]


def test_the_api_tools_will_call_asks_and_replies_durably(tmp_path: Path) -> None:
    """`ask_human` / `reply_to_human`: what a tool-using role's human.ask / human.reply call."""
    import asyncio

    from engine.run.actions import ask_human, reply_to_human
    from engine.testing import MemoryAnswerStore

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    person = ScriptedPerson([{"ok": True}])
    team = api.prepare(api.load(_sop(tmp_path, HUMAN_TEXT)), {"idea": "tea"}, api.RunOptions(person=person,
                       workspace=tmp_path / "ws", store=MemoryAnswerStore()))
    ask = dict(role="Boss", action="Decide", round_=1, key="run/1/Boss/Decide/1/x",
               prompt="Go on?", schema=schema)
    assert asyncio.run(ask_human(team.ctx, **ask)) == {"ok": True}
    assert asyncio.run(ask_human(team.ctx, **ask)) == {"ok": True}   # from the store: not asked again
    assert len(person.questions) == 1 and person.questions[0].fields() == schema["properties"]
    reply_to_human(team.ctx, role="Boss", action="Decide", round_=1, text="done")
    assert person.told == [("Boss", "done")]
