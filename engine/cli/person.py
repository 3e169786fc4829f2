"""The person at the terminal: a run's questions asked inline, and what a waiting run waits for.

`TerminalPerson` asks on the terminal (prompts on stderr, answers from stdin, so stdout keeps
the result): an answer of kind text or code is typed as lines ending with a line holding only
`.` (or written in `$VISUAL`/`$EDITOR` when one is set); an output tree is asked field by
field, each value checked against its field's schema (type, enum, pattern) and asked again
when wrong, and `:e` opens the editor for a long value. A review gate asks approve / edit /
reject (with a comment). End of input (the terminal closed) makes the run wait instead, as
with `--no-input`: nothing typed so far is lost, since nothing is used before it is complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from typing import IO, Any
from collections.abc import Iterator

from engine.cli.live import printable
from engine.models.answers import schema_errors
from engine.run.message import content_of
from engine.run.people import (
    AnswerRefused,
    PersonAnswer,
    Question,
    WaitingForPerson,
    accept,
)

__all__ = ["TerminalPerson", "format_question", "answer_hint"]


_EDIT_MARK = ":e"


class _EndOfInput(Exception):
    """stdin closed while a question was being answered."""


class TerminalPerson:
    """Asks a run's questions on a terminal; shows the messages roles send to the person."""

    def __init__(self, stdin: IO[str] | None = None, out: IO[str] | None = None,
                 editor: str | None = None) -> None:
        self.stdin = stdin or sys.stdin
        self.out = out or sys.stderr
        self.editor = editor if editor is not None else (os.environ.get("VISUAL") or
                                                         os.environ.get("EDITOR") or "")

    # Person ----------------------------------------------------------------------------

    def ask(self, question: Question) -> PersonAnswer:
        self._say("\n" + format_question(question))
        try:
            if question.kind == "review":
                return self._review(question)
            return self._until_accepted(question, lambda: PersonAnswer("answer", self._value(question)))
        except _EndOfInput:
            self._say("\n(no more input: the run waits for an answer)")
            raise WaitingForPerson(question) from None

    def tell(self, role: str, text: str) -> None:
        """Nothing more to do: the run's display shows every `PersonTold` event as it happens
        (the live table above itself, plain progress as a line), on a terminal or not."""

    # asking ----------------------------------------------------------------------------

    def _until_accepted(self, question: Question, make: Any) -> PersonAnswer:
        """Ask until the whole answer fits the question (each field is checked as typed)."""
        while True:
            try:
                return accept(question, make())
            except AnswerRefused as exc:
                self._say(f"  not accepted: {exc.message}; please answer again")

    def _review(self, question: Question) -> PersonAnswer:
        while True:
            choice = self._line("approve, edit or reject? [a/e/r]: ").strip().lower()
            if choice in ("a", "approve"):
                return PersonAnswer("approve")
            if choice in ("e", "edit"):
                return self._until_accepted(
                    question, lambda: PersonAnswer("edit", self._value(question, question.draft)))
            if choice in ("r", "reject"):
                comment = ""
                while not comment:
                    comment = self._line("comment for the model (what should change?): ").strip()
                return PersonAnswer("reject", comment=comment)
            self._say("  please type a (approve), e (edit) or r (reject)")

    def _value(self, question: Question, draft: Any = None) -> Any:
        if question.output != "json":
            return self._long_text(f"your {question.output}", draft)
        draft = draft if isinstance(draft, dict) else {}
        return {name: self._field(name, schema, name in question.required(), draft.get(name))
                for name, schema in question.fields().items()}

    def _field(self, name: str, schema: dict[str, Any], required: bool, draft: Any) -> Any:
        """One field, asked until its value fits the field's schema."""
        keep = f" [Enter keeps {_short(draft)}]" if draft is not None else ""
        while True:
            raw = self._line(f"{name} ({_describe(schema)}){keep}: ")
            if raw.strip() == "" and draft is not None:
                return draft
            if raw.strip() == _EDIT_MARK:
                raw = self._edit(draft if isinstance(draft, str) else "")
            value, problem = _coerce(raw.strip(), schema)
            problem = problem or "; ".join(e.removeprefix("at the top level: ")
                                           for e in schema_errors(value, schema))
            if not problem:
                return value
            self._say(f"  not valid: {problem}; try again")

    def _long_text(self, what: str, draft: Any) -> str:
        start = draft if isinstance(draft, str) else ""
        if self.editor:
            self._say(f"(opening {self.editor} for {what})")
            return self._edit(start)
        self._say(f"{what} (end with a line holding only '.'"
                  + (", or a lone '.' to keep the draft" if start else "") + "):")
        lines: list[str] = []
        while (line := self._line("")) != ".":
            lines.append(line)
        return "\n".join(lines) if lines or not start else start

    def _edit(self, start: str) -> str:
        """The text after the person edited it in $VISUAL/$EDITOR (typed inline without one)."""
        if not self.editor:
            return self._line("value: ")
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
            f.write(start)
        try:
            subprocess.run([*shlex.split(self.editor), f.name], check=False)
            with open(f.name, encoding="utf-8") as edited:
                return edited.read().rstrip("\n")
        finally:
            os.unlink(f.name)

    def _line(self, prompt: str) -> str:
        with _ctrl_c_stops_typing():   # before the prompt shows: a Ctrl-C at it must stop the read
            if prompt:
                self.out.write(printable(prompt))
                self.out.flush()
            line = self.stdin.readline()
        if not line:
            raise _EndOfInput()
        return line.rstrip("\n")

    def _say(self, text: str) -> None:
        print(printable(text), file=self.out, flush=True)   # a model's draft: shown, never acted on


@contextlib.contextmanager
def _ctrl_c_stops_typing() -> Iterator[None]:
    """Ctrl-C at a prompt stops the run at once (it ends `interrupted`, its question journaled).

    asyncio's own handler only cancels the run, which a blocking read would not notice until
    the person pressed Enter; Python's default raises KeyboardInterrupt inside the read."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if _run_cancelled():    # a Ctrl-C just before, which asyncio's handler took
            raise KeyboardInterrupt
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _run_cancelled() -> bool:
    """Whether the task asking (the run's, or one of its roles') is being cancelled."""

    try:
        task = asyncio.current_task()
    except RuntimeError:    # no event loop: a prompt outside a run
        return False
    cancelling = getattr(task, "cancelling", None)   # Python 3.11+
    return bool(cancelling()) if cancelling is not None else False


# --- values typed at a prompt -----------------------------------------------------------------


def _types(schema: dict[str, Any]) -> list[str]:
    declared = schema.get("type")
    if isinstance(declared, list):
        return [str(t) for t in declared]
    if declared:
        return [str(declared)]
    return [t for s in schema.get("anyOf", []) for t in _types(s)]


def _coerce(raw: str, schema: dict[str, Any]) -> tuple[Any, str]:
    """A typed line as the field's type: text, a number, yes/no, or JSON for lists and objects."""
    kinds = _types(schema)
    if raw == "" and "null" in kinds:
        return None, ""
    if "enum" in schema or kinds[:1] == ["string"]:
        return raw, ""
    if "integer" in kinds or "number" in kinds:
        try:
            return (int(raw) if "integer" in kinds else float(raw)), ""
        except ValueError:
            return raw, f"'{raw}' is not a number"
    if "boolean" in kinds:
        answers = {"y": True, "yes": True, "true": True, "n": False, "no": False, "false": False}
        return answers.get(raw.lower(), raw), "" if raw.lower() in answers else "answer yes or no"
    try:
        return json.loads(raw), ""
    except RecursionError:
        return raw, "type it as JSON nested less deeply"
    except json.JSONDecodeError:
        if "array" in kinds:   # a list of strings typed as `a; b; c`
            return [part.strip() for part in raw.split(";") if part.strip()], ""
        return raw, "type it as JSON"


def _describe(schema: dict[str, Any]) -> str:
    if schema.get("enum"):
        text = "one of: " + " | ".join(map(str, schema["enum"]))
    elif "array" in _types(schema):
        text = "a list: JSON, or items separated by ';'"
    else:
        text = " or ".join(_types(schema)) or "a value"
    if schema.get("pattern"):
        text += f", matching {schema['pattern']}"
    if schema.get("description"):
        text += f"; {schema['description']}"
    return text


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


# --- what a waiting run waits for -------------------------------------------------------------


def format_question(question: Question) -> str:
    """The question as a person reads it: who asks, what, and (a review) the output to judge."""
    what = "review the output of" if question.kind == "review" else "answer"
    lines = [f"── a question for you: {what} {question.role}.{question.action} "
             f"(round {question.round}, question {question.id}) ──", question.prompt.strip()]
    if question.kind == "review":
        lines += ["", "── the output to review ──",
                  content_of(question.output, question.draft)]
    elif question.output == "json":
        lines += ["", "(answer the fields: " + ", ".join(question.fields()) + ")"]
    return printable("\n".join(lines))


def answer_hint(question: Question, run_dir: str) -> str:
    """How to answer a waiting run's question from the command line."""
    where = f"sopctl answer {shlex.quote(run_dir)} --question {question.id}"
    if question.kind == "review":
        return f"{where} --approve | --reject --comment TEXT | --json/--text/--file (an edit)"
    if question.output == "json":
        return f"{where} --json '{{...}}' (fields: {', '.join(question.fields())})"
    return f"{where} --text TEXT | --file FILE"
