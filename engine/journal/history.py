"""A run's state rebuilt from its journal alone: `sopctl show` and `sopctl runs`.

Why from the journal only: the process that made a run may have been killed at any point,
so nothing but the journal is trusted. The journal of a resumed run holds several
*invocations* (each starting with a RunStarted); every invocation re-executes the SOP from
the start with the same answers, so the final state is:

- status and rounds: the last invocation's RunEnded; none yet -> `interrupted` (or `running`
  while the process that writes it is still alive on this host);
- history: the last invocation's messages if it ended, else the union of every
  invocation's messages by id (ids are deterministic), in round order;
- artifacts: every path an ActionCompleted wrote, with its latest hash;
- model usage (a `Usage` per action and in total): paid answers from the `answers` table
  (each was paid for exactly once, even if its event was lost to a crash), and reuses,
  retries and re-asks from the gateway's events; the timeline's action lines fold every
  gateway event of that action. Journals of older versions hold one `LLMCalled` summary
  per call instead: read the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import JournalError, UsageError
from engine.journal.store import (
    JOURNAL_DIR,
    JOURNAL_FILE,
    EventRow,
    Journal,
    decode_event,
    naming,
    writer_active,
)
from engine.models.types import Usage
from engine.run.people import PERSON
from engine.run.toolloop import TOOL
from engine.run.events import (
    ActionCompleted,
    ActionStarted,
    LLMCalled,
    MessagePublished,
    ModelAnswered,
    ModelEvent,
    PersonAnswered,
    PersonTold,
    QuestionAsked,
    RoundStarted,
    RunEnded,
    RunStarted,
    RunStatus,
)

__all__ = ["ActionStats", "ActionRecord", "RunState", "read_run", "rebuild", "find_runs",
           "list_runs"]


@dataclass
class ActionStats:
    """Model usage of one action id over the whole run: paid answers, reuses, retries, re-asks."""

    action: str
    roles: list[str] = field(default_factory=list)
    runs: int = 0                  # times started, over all invocations
    completed: int = 0             # distinct idempotency keys completed
    usage: Usage = Usage()


@dataclass
class ActionRecord:
    """One action execution in the timeline, identified by its idempotency key."""

    round: int
    role: str
    action: str
    key: str
    completed: bool = False
    usage: Usage = Usage()         # what its gateway events report


@dataclass
class RunState:
    """Everything `show` prints, rebuilt from events and answers."""

    run_dir: str
    run_id: str = ""
    sop_file: str = ""
    sop_name: str = ""
    sop_hash: str = ""
    model: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)
    workspace: str = ""
    started_at: float = 0.0
    ended_at: float | None = None
    status: RunStatus = RunStatus.INTERRUPTED
    error: str = ""
    invocations: int = 0
    rounds: int = 0
    round_roles: dict[int, list[str]] = field(default_factory=dict)
    timeline: list[ActionRecord] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)
    actions: dict[str, ActionStats] = field(default_factory=dict)
    completions: dict[str, int] = field(default_factory=dict)   # key -> ActionCompleted count
    logs: list[dict[str, Any]] = field(default_factory=list)    # RunLog payloads (warnings etc.)
    usage: Usage = Usage()         # the whole run's, counted as ActionStats are
    journaled_calls: int = 0       # rows of the answers table (replayed answers included)
    unpriced_calls: int = 0        # paid answers of a model whose price is unknown (cost 0)
    questions: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The last invocation's questions to a person, by key (`Question.to_json()`)."""
    answered: dict[str, dict[str, Any]] = field(default_factory=dict)
    """A person's answers by question key: the first PersonAnswered payload of each."""
    person_answers: int = 0        # rows of the answers table that a person gave
    replies: list[dict[str, Any]] = field(default_factory=list)   # PersonTold payloads

    @property
    def waiting_for(self) -> dict[str, Any] | None:
        """The question the run stopped at that nobody has answered yet (None: none)."""
        if self.status not in (RunStatus.WAITING, RunStatus.INTERRUPTED, RunStatus.RUNNING):
            return None
        pending = [q for key, q in self.questions.items() if key not in self.answered]
        return pending[-1] if pending else None

    @property
    def ended(self) -> bool:
        return self.ended_at is not None


def read_run(run_dir: str | Path) -> RunState:
    """Open a run folder's journal read-only and rebuild its state (JournalError if unusable)."""
    with Journal.open(run_dir) as journal, naming(journal.path):
        state = rebuild(journal.events(), run_dir=str(run_dir))
        _add_answers(state, journal)
        _mark_live(state, run_dir)
    return state


def rebuild(rows: list[EventRow], *, run_dir: str = "") -> RunState:
    """The run's final state from its events in order (see the module docstring)."""
    state = RunState(run_dir=run_dir)
    segments = _segments(rows)
    seen_messages: dict[str, dict[str, Any]] = {}
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        _apply_segment(state, segment, seen_messages, last=last)
    if not state.ended:
        state.history = sorted(seen_messages.values(), key=lambda m: int(m.get("round", 0)))
    return state


def _segments(rows: list[EventRow]) -> list[list[EventRow]]:
    """Split the event list at every RunStarted: one segment per invocation."""
    segments: list[list[EventRow]] = []
    for row in rows:
        if row.type == "RunStarted" or not segments:
            segments.append([])
        segments[-1].append(row)
    return segments


def _apply_segment(state: RunState, segment: list[EventRow],
                   seen: dict[str, dict[str, Any]], *, last: bool) -> None:
    open_actions: dict[tuple[int, str, str], ActionRecord] = {}
    messages: list[dict[str, Any]] = []
    state.ended_at = None
    state.questions = {}
    for row in segment:
        if row.type == "RunLog":
            _on_log(state, row.data)
            continue
        event = decode_event(row)
        if isinstance(event, RunStarted):
            _on_started(state, event, row.ts)
        elif isinstance(event, RoundStarted):
            roles = state.round_roles.setdefault(event.round, [])
            roles.extend(r for r in event.active_roles if r not in roles)
            state.rounds = max(state.rounds, event.round)
        elif isinstance(event, ActionStarted):
            open_actions[(event.round, event.role, event.action)] = _on_action_started(state, event)
        elif isinstance(event, ModelEvent):
            _on_model_event(state, event, open_actions.get((event.round, event.role, event.action)))
        elif isinstance(event, ActionCompleted):
            _on_completed(state, event, open_actions.pop((event.round, event.role, event.action), None))
        elif isinstance(event, MessagePublished):
            messages.append(event.message)
            seen.setdefault(str(event.message.get("id")), event.message)
        elif isinstance(event, (QuestionAsked, PersonAnswered, PersonTold)):
            _on_person_event(state, event)
        elif isinstance(event, RunEnded):
            state.status, state.rounds, state.error = _status(event, row), event.rounds, event.error
            state.ended_at = row.ts
    if last and state.ended:
        state.history = messages
    elif last:
        state.status, state.error = RunStatus.INTERRUPTED, ""


def _status(event: RunEnded, row: EventRow) -> RunStatus:
    try:
        return RunStatus(event.status)
    except ValueError:
        raise JournalError(f"journal event {row.seq} ends the run with an unknown status "
                           f"{event.status!r}", "the journal was written by a newer sopctl; "
                           "upgrade sopctl") from None


def _on_started(state: RunState, event: RunStarted, ts: float) -> None:
    state.invocations += 1
    if state.invocations == 1:
        state.run_id, state.sop_file, state.sop_name = event.run_id, event.sop_file, event.sop_name
        state.inputs, state.workspace, state.started_at = dict(event.inputs), event.workspace, ts
    state.sop_hash, state.model = event.sop_hash, event.model


def _on_log(state: RunState, data: dict[str, Any]) -> None:
    """Keep warnings for the timeline (info lines such as reuse notes repeat on every resume)."""
    if data.get("level") == "warning" and data not in state.logs:
        state.logs.append(data)


def _on_action_started(state: RunState, event: ActionStarted) -> ActionRecord:
    stats = state.actions.setdefault(event.action, ActionStats(event.action))
    stats.runs += 1
    if event.role not in stats.roles:
        stats.roles.append(event.role)
    record = next((r for r in state.timeline if r.key == event.key), None)
    if record is None:
        record = ActionRecord(event.round, event.role, event.action, event.key)
        state.timeline.append(record)
    return record


def _on_model_event(state: RunState, event: ModelEvent, record: ActionRecord | None) -> None:
    usage = event.usage
    if record is not None:
        record.usage += usage
    # Paid answers are counted from the answers table (see the module docstring), not here.
    if isinstance(event, LLMCalled):
        usage = Usage(reused_calls=event.reused)
    elif isinstance(event, ModelAnswered) and not event.reused:
        state.unpriced_calls += event.unpriced
        return
    stats = state.actions.setdefault(event.action, ActionStats(event.action))
    stats.usage += usage
    state.usage += usage


def _on_person_event(state: RunState, event: QuestionAsked | PersonAnswered | PersonTold) -> None:
    if isinstance(event, QuestionAsked):
        state.questions[str(event.question.get("key", ""))] = event.question
    elif isinstance(event, PersonAnswered):
        state.answered.setdefault(event.key, event.to_json())
    elif event.to_json() not in state.replies:     # a resume may tell it again
        state.replies.append(event.to_json())


def _on_completed(state: RunState, event: ActionCompleted, record: ActionRecord | None) -> None:
    state.completions[event.key] = state.completions.get(event.key, 0) + 1
    stats = state.actions.setdefault(event.action, ActionStats(event.action))
    if state.completions[event.key] == 1:
        stats.completed += 1
    if record is not None:
        record.completed = True
    for artifact in event.artifacts:
        state.artifacts[str(artifact.get("path"))] = str(artifact.get("sha256", ""))


def _add_answers(state: RunState, journal: Journal) -> None:
    """Totals from the answers table: every paid answer counted exactly once."""
    for row in journal.answers():
        if row.origin == PERSON:       # not a model's: neither paid nor a journaled call
            state.person_answers += 1
            continue
        if row.origin == TOOL:         # a tool's result (a ToolCalled event tells of it)
            continue
        state.journaled_calls += 1
        if row.origin != "model":
            continue
        answer = row.answer
        usage = Usage.of_answer(answer.prompt_tokens, answer.completion_tokens, answer.cost_usd)
        stats = state.actions.setdefault(row.action, ActionStats(row.action))
        stats.usage += usage
        state.usage += usage


def _mark_live(state: RunState, run_dir: str | Path) -> None:
    """An unended run whose writer still holds the journal lock is `running`, not `interrupted`."""
    if not state.ended and writer_active(run_dir):
        state.status = RunStatus.RUNNING


# --- listing ----------------------------------------------------------------------------


def list_runs(folder: str | Path) -> list[tuple[Path, RunState | JournalError]]:
    """Every run under `folder` with its state (or the error that makes it unreadable), oldest first."""
    rows: list[tuple[Path, RunState | JournalError]] = []
    for path in find_runs(folder):
        try:
            rows.append((path, read_run(path)))
        except JournalError as exc:
            rows.append((path, exc))
    return sorted(rows, key=lambda r: (isinstance(r[1], JournalError),
                                       getattr(r[1], "started_at", 0.0), str(r[0])))


def find_runs(folder: str | Path) -> list[Path]:
    """Run folders under `folder` (itself included when it is a run), sorted by name."""
    root = Path(folder)
    if not root.exists():
        raise UsageError(f"folder {folder} does not exist",
                         "runs are kept under ./runs by default; give the folder that holds them")
    if not root.is_dir():
        raise UsageError(f"{folder} is not a folder")
    marker = Path(JOURNAL_DIR) / JOURNAL_FILE
    found = [root] if (root / marker).is_file() else []
    found += sorted(p for p in root.iterdir() if p.is_dir() and (p / marker).is_file())
    return found
