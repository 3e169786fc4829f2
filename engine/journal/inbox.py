"""A person's answer recorded into a waiting run's journal (`sopctl answer`).

A run that waits (status `waiting`) has journaled its question; the answer is checked against
that question's output tree (`engine.run.people.accept`: the same rules as a model's answer)
and written, with its `PersonAnswered` event, in one SQLite transaction that first checks the
question is still unanswered. The journal's writer lock is held meanwhile, so an answer never
lands in a run that is going on, and of two answers at once exactly one is taken: the other
gets a clear error. `sopctl resume` then finds the answer under the question's key.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from engine.errors import UsageError
from engine.journal.history import rebuild
from engine.journal.store import Journal, naming
from engine.models.types import StoredAnswer
from engine.run.events import PersonAnswered, RunStatus
from engine.run.people import PERSON, PersonAnswer, Question, accept

__all__ = ["answer_question", "ANSWERED_BY"]


ANSWERED_BY = "sopctl answer"


def answer_question(run_dir: str | Path, answer: PersonAnswer, *,
                    question_id: str | None = None) -> Question:
    """Record `answer` to the question the run at `run_dir` waits for; the question answered.

    UsageError (the run still waits, nothing written): the run is not waiting, `question_id`
    names another question, or the answer does not fit the question's output tree."""
    with Journal.open_to_answer(run_dir) as journal:
        with naming(journal.path):
            state = rebuild(journal.events(), run_dir=str(run_dir))
        question = _waiting_question(run_dir, state.status, state.waiting_for, state.ended)
        _check_id(question, question_id)
        if question.kind == "review" and answer.decision == "answer":
            answer = replace(answer, decision="edit")    # a value for a review replaces the output
        accepted = accept(question, answer)
        event = PersonAnswered(round=question.round, role=question.role, action=question.action,
                               key=question.key, decision=accepted.decision, by=ANSWERED_BY)
        stored = StoredAnswer(accepted.to_text(), 0, 0, 0.0, model=PERSON)
        if not journal.record_person_answer(question.key, question.action, stored, event):
            raise UsageError(f"question {question.id} was answered already",
                             f"continue the run with `sopctl resume {run_dir}`")
    return question


def _waiting_question(run_dir: str | Path, status: RunStatus, pending: dict | None,
                      ended: bool) -> Question:
    if not ended or status != RunStatus.WAITING:
        hint = ("it was stopped while asking; `sopctl resume RUN_DIR --no-input` asks again and "
                "waits for an answer" if pending is not None and status == RunStatus.INTERRUPTED
                else "`sopctl show` says what a run is doing; only a waiting run takes an answer")
        raise UsageError(f"run {run_dir} is not waiting for a person (status {status})",
                         hint.replace("RUN_DIR", str(run_dir)))
    if pending is None:
        raise UsageError(f"run {run_dir} has its answer already",
                         f"continue it with `sopctl resume {run_dir}`")
    return Question.from_json(pending)


def _check_id(question: Question, question_id: str | None) -> None:
    """`--question ID`: the answer is meant for this question, not one asked before or after."""
    wanted = (question_id or "").strip().lower()
    if wanted and (len(wanted) < 4 or not question.key.startswith(wanted)):
        raise UsageError(f"the run waits for question {question.id} "
                         f"({question.role}.{question.action}), not {question_id}",
                         "see the question with `sopctl show`; answer it, or leave --question out")
