"""A person in the loop (MetaGPT's `is_human`, `ask_human`, `reply_to_human`), as durable as a model.

A person is asked a `Question`: to answer an action against its output tree (a `human`
role's action, or a `kind: ask` action), or to review a model's output (`review: human`:
approve, edit, or reject with a comment). A question's `key` is deterministic (the action's
idempotency key, the fan-out item, the attempt, and what is asked), so a resumed run asks
the very same question again and finds its answer by that key.

`ask_person` treats a person's answer as the gateway treats a model's: looked up in the
run's answer store first (a resume or a replay reuses it; a replay never asks anybody), else
asked, checked against the output tree, and recorded in the store (the journal) *before*
anything uses it. The store keeps it as a `StoredAnswer` whose model is `PERSON`, so the
journal can tell a person's answer from a paid one.

`Person` is what asks: the CLI's terminal prompts, a test's scripted person, or `NoPerson`
(no terminal, `--no-input`), which raises `WaitingForPerson`: the run then ends with status
`waiting`, its question journaled, until `sopctl answer` records an answer and `sopctl
resume` goes on. `tell_person` sends a message to the person (`kind: reply`): shown live,
kept in the journal, listed by `sopctl show`.

`engine.run.actions.ask_human` / `reply_to_human` wrap these for tool-using roles'
`human.ask` / `human.reply` tools.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol
from collections.abc import Callable

from engine.errors import ActionFailed, ReplayDivergence, UsageError
from engine.models import answers
from engine.models.types import AnswerStore, CallSpec, StoredAnswer, durable
from engine.run.events import PersonAnswered, PersonTold, QuestionAsked, RunEvent
from engine.run.workspace import sha256_text

__all__ = ["PERSON", "Question", "PersonAnswer", "Person", "NoPerson", "WaitingForPerson",
           "AnswerRefused", "question_key", "accept", "ask_person", "tell_person",
           "REVIEW_DECISIONS", "waiting_summary"]


PERSON = "person"
"""The `model` of a person's answer in the answer store (the journal's `origin` of its row)."""


REVIEW_DECISIONS = ("approve", "edit", "reject")


Decision = Literal["answer", "approve", "edit", "reject"]


@dataclass(frozen=True)
class Question:
    """What a person is asked; everything needed to ask it again and to check an answer."""

    key: str                       # deterministic: the same question gets the same key
    kind: Literal["answer", "review"]
    role: str
    action: str
    round: int
    prompt: str                    # the question, with the action's declared context
    output: str                    # "text", "json" or "code": what an answer must be
    schema: dict[str, Any] | None = None   # kind json: the output tree's JSON Schema
    format: str = "json"
    code_lang: str | None = None
    draft: Any = None              # review: the model's output under review
    attempt: int = 0               # review: 0 = the model's first answer, 1.. after a rejection

    @property
    def id(self) -> str:
        """The short id people type (`sopctl answer --question ID`)."""
        return self.key[:12]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Question:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def fields(self) -> dict[str, dict[str, Any]]:
        """The output tree's top-level fields and their JSON Schemas (kind json)."""
        return dict((self.schema or {}).get("properties") or {})

    def required(self) -> list[str]:
        return list((self.schema or {}).get("required") or [])


@dataclass(frozen=True)
class PersonAnswer:
    """A person's answer: a value (`answer`, `edit`), `approve`, or `reject` with a comment."""

    decision: Decision
    value: Any = None
    comment: str = ""

    def to_text(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, sort_keys=True)

    @classmethod
    def from_text(cls, text: str) -> PersonAnswer:
        data = json.loads(text)
        return cls(data["decision"], data.get("value"), data.get("comment", ""))


class Person(Protocol):
    """Whoever answers questions and reads replies: a terminal, a script, or nobody."""

    def ask(self, question: Question) -> PersonAnswer:
        """The person's answer (checked again by `ask_person`), or WaitingForPerson."""
        ...

    def tell(self, role: str, text: str) -> None:
        """Show a message a role sends to the person."""
        ...


class WaitingForPerson(Exception):
    """Nobody can answer now: the run ends `waiting`, its question journaled."""

    def __init__(self, question: Question) -> None:
        super().__init__(f"waiting for a person to answer question {question.id} "
                         f"({question.role}.{question.action})")
        self.question = question


class AnswerRefused(UsageError):
    """An answer that does not fit its question (wrong decision, invalid for the output tree)."""


@dataclass
class NoPerson:
    """No terminal or `--no-input`: every question makes the run wait; replies are journaled only."""

    told: list[tuple[str, str]] = field(default_factory=list)

    def ask(self, question: Question) -> PersonAnswer:
        raise WaitingForPerson(question)

    def tell(self, role: str, text: str) -> None:
        self.told.append((role, text))


def waiting_summary(question: dict[str, Any]) -> dict[str, Any]:
    """What a waiting run waits for, as `run`, `show` and `runs` print it in JSON."""
    return {"question": str(question.get("key", ""))[:12], "kind": question.get("kind"),
            "role": question.get("role"), "action": question.get("action"),
            "output": question.get("output"), "prompt": question.get("prompt")}


def question_key(action_key: str, *parts: Any) -> str:
    """sha256 of the action's idempotency key and what is asked (item, kind, attempt, prompt,
    draft): deterministic, so a resume asks the same question under the same key."""
    return sha256_text(json.dumps([action_key, *parts], sort_keys=True, ensure_ascii=False, default=str))


# --- checking an answer -------------------------------------------------------------------


def accept(question: Question, answer: PersonAnswer) -> PersonAnswer:
    """The answer with its value parsed and checked against the output tree, or AnswerRefused."""
    allowed = REVIEW_DECISIONS if question.kind == "review" else ("answer",)
    if answer.decision not in allowed:
        what = "a review: approve, edit or reject" if question.kind == "review" else "an answer"
        raise AnswerRefused(f"question {question.id} needs {what}, not '{answer.decision}'")
    if answer.decision == "approve":
        return PersonAnswer("approve")
    if answer.decision == "reject":
        if not str(answer.comment or "").strip():
            raise AnswerRefused("a rejection needs a comment: what should the model change?")
        return PersonAnswer("reject", comment=str(answer.comment).strip())
    return PersonAnswer(answer.decision, value_of(question, answer.value))


def value_of(question: Question, raw: Any) -> Any:
    """A value for the question's output: text as the model's answers are read (the same
    `engine.models.answers` rules), an object checked against the output tree's schema."""
    try:
        if question.output == "json" and isinstance(raw, dict):
            errors = answers.schema_errors(raw, question.schema or {})
            if errors:
                raise answers.InvalidAnswer("the object does not match the output tree: "
                                            + "; ".join(errors))
            return raw
        if not isinstance(raw, str):
            raise answers.InvalidAnswer(f"expected {_expected(question)}, got a JSON {type(raw).__name__}")
        if question.output == "code" and "```" not in raw:
            return answers.extract_code(f"```\n{raw.rstrip()}\n```")   # a person types bare code
        return answers.read(_spec(question), raw)
    except answers.InvalidAnswer as exc:
        raise AnswerRefused(f"the answer does not fit {question.role}.{question.action}'s output: {exc}",
                            _hint(question)) from None


def _expected(question: Question) -> str:
    return "an object" if question.output == "json" else f"{question.output} (a string)"


def _hint(question: Question) -> str:
    if question.output != "json":
        return f"give the {question.output} as plain text"
    names = ", ".join(_field_hint(name, schema) for name, schema in question.fields().items()) or "none"
    return f"give a JSON object with the fields: {names}"


def _field_hint(name: str, schema: dict[str, Any]) -> str:
    """A field as the hint names it: with its allowed values when it has a few (an enum)."""
    options = schema.get("enum") if isinstance(schema, dict) else None
    if not options:
        items = schema.get("items") if isinstance(schema, dict) else None
        options = items.get("enum") if isinstance(items, dict) else None
    if not options:
        return name
    shown = ", ".join(json.dumps(o, ensure_ascii=False) for o in options[:12])
    return f"{name} (one of {shown}{', ...' if len(options) > 12 else ''})"


def _spec(question: Question) -> CallSpec:
    """The call spec the gateway would read a model's answer to this question with."""
    return CallSpec(action=question.action, role=question.role, system="", prompt=question.prompt,
                    kind=question.output, model=PERSON, schema=question.schema,  # type: ignore[arg-type]
                    code_lang=question.code_lang, format=question.format)  # type: ignore[arg-type]


# --- asking and telling ---------------------------------------------------------------------


async def ask_person(question: Question, *, person: Person, store: AnswerStore | None,
                     emit: Callable[[RunEvent], None], replay: bool = False) -> PersonAnswer:
    """The person's answer: from the store (resume, replay), else asked, checked, journaled."""
    stored = store.lookup(question.key) if store is not None else None
    if stored is not None:
        answer = PersonAnswer.from_text(stored.text)
        emit(_answered(question, answer, reused=True))
        return answer
    if replay:
        raise ReplayDivergence(
            f"replay diverged at action {question.action} (role {question.role}): the person's "
            f"answer to question {question.id} is not in the journal",
            hint="the SOP, its inputs or the engine changed since the run was recorded")
    emit(QuestionAsked(round=question.round, role=question.role, action=question.action,
                       question=question.to_json()))
    await durable(store)           # the run's answers are on disk before a person sees the question
    try:
        answer = accept(question, person.ask(question))
    except AnswerRefused as exc:   # a Person must check its answers; never accept a bad one
        raise ActionFailed(question.action, f"the person's answer was refused: {exc.message}") from None
    if store is not None:          # journaled before anything uses it
        store.record(question.key, question.action,
                     StoredAnswer(answer.to_text(), 0, 0, 0.0, model=PERSON))
    emit(_answered(question, answer, reused=False))
    return answer


def _answered(question: Question, answer: PersonAnswer, *, reused: bool) -> PersonAnswered:
    return PersonAnswered(round=question.round, role=question.role, action=question.action,
                          key=question.key, decision=answer.decision, reused=reused)


def tell_person(person: Person, emit: Callable[[RunEvent], None], *, round_: int, role: str,
                action: str, text: str) -> None:
    """Send a message to the person: journaled (and shown live) first, then told."""
    emit(PersonTold(round=round_, role=role, action=action, text=text))
    person.tell(role, text)
