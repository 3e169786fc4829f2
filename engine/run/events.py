"""Run events: what the interpreter reports, in order, to observers (display, journal, API).

The journal stores these append-only and can rebuild a run's whole state from them; the
live display and `engine.api.iter_run` consume the same stream. Every event is a frozen
dataclass with JSON-friendly fields (`to_json`) so it can be written as one row.

Resume works by re-executing the SOP deterministically from the start: an action whose
idempotency key the journal already holds as completed is not run again (its recorded
messages are re-published), and every model answer already journaled is reused.

The gateway reports through the same stream (`Gateway.emit`; its events are defined with
the gateway's types in `engine.models.types`, below the run): `ModelAnswered` for every
answer read (each attempt; paid, or reused from the journal), `ModelRetried` for a request
sent again after a transient error (with its cause), `AnswerRejected` for an invalid answer
(with the error, and whether the model is asked again). A call accepted first time is one
row, as the old per-call `LLMCalled` summary was; only what happens rarely adds rows.
Each carries its own `usage`; every total is their sum.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from engine.models.types import (
    AnswerRejected,
    AnswerStore,
    Event,
    GatewayEvent,
    ModelAnswered,
    ModelRetried,
    Usage,
)

__all__ = ["RunStatus", "RunStarted", "RoundStarted", "ActionStarted", "ModelAnswered",
           "ModelRetried", "AnswerRejected", "LLMCalled", "ActionCompleted", "MessagePublished",
           "RunEnded", "RunLog", "QuestionAsked", "PersonAnswered", "PersonTold", "ToolCalled", "RunEvent", "GatewayEvent", "ModelEvent", "RunObserver",
           "CompletedActions", "RunJournal", "event_type"]


class RunStatus(str, Enum):
    """How a run ended, or that it is still going. A `str`: JSON and the journal hold the bare
    value (`"idle"`), exactly as before there was a type for it."""

    IDLE = "idle"                  # no role has anything left to do: the normal end
    MAX_ROUNDS = "max_rounds"
    BUDGET = "budget"
    FAILED = "failed"              # an action failed after its retries, or a bug
    INTERRUPTED = "interrupted"    # Ctrl-C or cancelled; in `show`, also killed (no RunEnded)
    RUNNING = "running"            # `show` only: no RunEnded yet and its writer is alive
    WAITING = "waiting"            # a question for a person is journaled, unanswered (no terminal)

    def __str__(self) -> str:      # f-strings print the value on every Python version
        return self.value


@dataclass(frozen=True)
class RunStarted(Event):
    run_id: str
    sop_file: str
    sop_name: str
    sop_hash: str
    inputs: dict[str, Any]
    model: str
    engine_version: str
    workspace: str
    max_rounds: int
    budget_usd: float
    send_to: list[str] = field(default_factory=list)
    """`--send-to`, the idea's addresses given on the command line (empty: the file's)."""
    reuse_identical: bool = False
    """`--reuse-identical`: identical requests answered once per run (resume and replay keep it)."""


@dataclass(frozen=True)
class RoundStarted(Event):
    round: int
    active_roles: list[str]


@dataclass(frozen=True)
class ActionStarted(Event):
    round: int
    role: str
    action: str
    key: str                       # idempotency key: run id, role, action, input message ids, run count


@dataclass(frozen=True)
class LLMCalled(Event):
    """One gateway call's totals, as sopctl journaled them before the gateway's own events.

    Never emitted now: kept so that `sopctl show` reads journals written by those versions.
    """

    round: int
    role: str
    action: str
    calls: int                     # model calls made (re-asks included)
    reused: int                    # answers taken from the journal
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float

    @property
    def usage(self) -> Usage:
        return Usage(llm_calls=self.calls, reused_calls=self.reused, prompt_tokens=self.prompt_tokens,
                     completion_tokens=self.completion_tokens, cost_usd=self.cost_usd)


@dataclass(frozen=True)
class ActionCompleted(Event):
    round: int
    role: str
    action: str
    key: str
    messages: list[dict[str, Any]]                 # Message.to_json() of what the action made
    artifacts: list[dict[str, str]] = field(default_factory=list)  # {"path", "sha256"}
    state: dict[str, Any] = field(default_factory=dict)
    """A tool-using role's plan and working memory after the action (engine/run/rolestate.py):
    a resume that reuses the action restores them from here; empty for other roles."""
    shared: dict[str, Any] = field(default_factory=dict)
    """The shared state the action's `set` changed (variable -> value, engine/run/state.py):
    a resume that reuses the action applies them again; empty when it sets none."""


@dataclass(frozen=True)
class MessagePublished(Event):
    message: dict[str, Any]        # Message.to_json(): id, round, content, out, cause_by, sent_from, send_to


@dataclass(frozen=True)
class RunEnded(Event):
    status: RunStatus              # never RUNNING
    rounds: int
    error: str = ""
    shared: dict[str, Any] = field(default_factory=dict)
    """The shared state (the file's `state:`) as the run ended: what `sopctl show` prints;
    empty when the file declares none (and in journals written before it was kept)."""


def event_type(event: RunEvent) -> str:
    return type(event).__name__


class RunObserver(Protocol):
    """Receives every event in order; must not raise (a failing journal write is a JournalError)."""

    def on_event(self, event: RunEvent) -> None: ...


class CompletedActions(Protocol):
    """The journal's memory of finished actions, consulted on resume before running one."""

    def completed(self, key: str) -> ActionCompleted | None: ...


class RunJournal(RunObserver, CompletedActions, AnswerStore, Protocol):
    """What `Team.attach` plugs in (the SQLite journal): it observes every event, remembers
    finished actions and stores every model answer."""


@dataclass(frozen=True)
class RunLog(Event):
    """A line for the run's log: a skipped action (max_runs), a plan warning, a reused action.

    Informational only: nothing in a run's state depends on it, so a journal may store it or
    not. `level` is `info`, `notice` (what a person should see next to the actions: an answer
    reused from the experience pool, a revise pass; shown live and by `show`) or `warning`.
    """

    round: int
    level: str
    message: str
    role: str = ""
    action: str = ""


@dataclass(frozen=True)
class QuestionAsked(Event):
    """A person is asked a question (`engine.run.people.Question.to_json()`): to answer an
    action, or to review a model's output. Journaled before the person is asked."""

    round: int
    role: str
    action: str
    question: dict[str, Any]


@dataclass(frozen=True)
class PersonAnswered(Event):
    """A person's answer to the question `key` was journaled (`reused`: taken from the journal;
    `by`: `sopctl answer` when recorded while the run waited)."""

    round: int
    role: str
    action: str
    key: str
    decision: str                  # answer, approve, edit or reject
    reused: bool = False
    by: str = ""


@dataclass(frozen=True)
class PersonTold(Event):
    """A message a role sends to the person (`kind: reply`)."""

    round: int
    role: str
    action: str
    text: str


@dataclass(frozen=True)
class ToolCalled(Event):
    """One command of a tool loop (engine/run/toolloop.py): what the model asked and what came
    back to it. `reused`: the result was taken from the journal (resume, replay), the tool did
    not run again. `call` is the result's key in the journal's answers table."""

    round: int
    role: str
    action: str
    step: int                      # the loop's step, 1 = the first
    tool: str                      # the namespaced command, e.g. editor.write
    args: dict[str, Any]
    output: str                    # as the model sees it (capped)
    call: str = ""
    error: bool = False            # the output is an error (bad args, a failure, a timeout)
    reused: bool = False
    seconds: float = 0.0


ModelEvent = GatewayEvent | LLMCalled
"""Every event that carries model usage (its `usage`): the gateway's, and old journals' summary."""


RunEvent = (RunStarted | RoundStarted | ActionStarted | ModelAnswered | ModelRetried
            | AnswerRejected | LLMCalled | ActionCompleted | MessagePublished | RunEnded | RunLog
            | QuestionAsked | PersonAnswered | PersonTold | ToolCalled)
