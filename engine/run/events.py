"""Run events: what the interpreter reports, in order, to observers (display, journal, API).

The journal stores these append-only and can rebuild a run's whole state from them; the
live display and `engine.api.iter_run` consume the same stream. Every event is a frozen
dataclass with JSON-friendly fields (`to_json`) so it can be written as one row.

Resume works by re-executing the SOP deterministically from the start: an action whose
idempotency key the journal already holds as completed is not run again (its recorded
messages are re-published), and every model answer already journaled is reused.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

__all__ = ['RunStarted', 'RoundStarted', 'ActionStarted', 'LLMCalled', 'ActionCompleted', 'MessagePublished', 'RunEnded', 'RunLog', 'RunEvent', 'RunObserver', 'CompletedActions', 'event_type']


@dataclass(frozen=True)
class _Event:
    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunStarted(_Event):
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


@dataclass(frozen=True)
class RoundStarted(_Event):
    round: int
    active_roles: list[str]


@dataclass(frozen=True)
class ActionStarted(_Event):
    round: int
    role: str
    action: str
    key: str                       # idempotency key: run id, role, action, input message ids, run count


@dataclass(frozen=True)
class LLMCalled(_Event):
    round: int
    role: str
    action: str
    calls: int                     # model calls made (re-asks included)
    reused: int                    # answers taken from the journal
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float


@dataclass(frozen=True)
class ActionCompleted(_Event):
    round: int
    role: str
    action: str
    key: str
    messages: list[dict[str, Any]]                 # Message.to_json() of what the action made
    artifacts: list[dict[str, str]] = field(default_factory=list)  # {"path", "sha256"}


@dataclass(frozen=True)
class MessagePublished(_Event):
    message: dict[str, Any]        # Message.to_json(): id, round, content, out, cause_by, sent_from, send_to


@dataclass(frozen=True)
class RunEnded(_Event):
    status: str                    # idle | max_rounds | budget | failed | interrupted
    rounds: int
    error: str = ""


def event_type(event: "RunEvent") -> str:
    return type(event).__name__


class RunObserver(Protocol):
    """Receives every event in order; must not raise (a failing journal write is a JournalError)."""

    def on_event(self, event: "RunEvent") -> None: ...


class CompletedActions(Protocol):
    """The journal's memory of finished actions, consulted on resume before running one."""

    def completed(self, key: str) -> ActionCompleted | None: ...


@dataclass(frozen=True)
class RunLog(_Event):
    """A line for the run's log: a skipped action (max_runs), a plan warning, a reused action.

    Informational only: nothing in a run's state depends on it, so a journal may store it or
    not. `level` is `info` or `warning`.
    """

    round: int
    level: str
    message: str
    role: str = ""
    action: str = ""


RunEvent = (RunStarted | RoundStarted | ActionStarted | LLMCalled | ActionCompleted
            | MessagePublished | RunEnded | RunLog)
